//! `[http_tools.NAME]`: a platform team's internal HTTP API as a tool, declared, no code.
//! The URL is a template whose `{name}`s are path parameters; the other parameters go into
//! the query, headers or a JSON body. Secrets stay in the environment: `auth_value` and the
//! static `headers` may hold `${NAME}`, expanded when the tool is called.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use crate::error::{ConfigError, invalid, is_identifier};
use crate::raw::{RawHttpParam, RawHttpTool};
use crate::units::{duration, size};

/// The built-in tools' names (besides `fetch_<query>`): an HTTP tool may not take one.
pub const BUILTIN_TOOL_NAMES: [&str; 19] = [
    "query",
    "describe_data",
    "list_artifacts",
    "lineage",
    "render_chart",
    "render_table",
    "run_sql",
    "run_python",
    "load_file",
    "read_file",
    "list_files",
    "copy_file",
    "export_data",
    "call_tool",
    "view_rows",
    "view_chart",
    "view_artifacts",
    "view_files",
    "view_download",
];

/// One `[http_tools.NAME]`, resolved. The tool's name is `name`.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpToolConfig {
    pub name: String,
    /// What the model reads to choose the tool.
    pub description: String,
    pub method: HttpMethod,
    /// The URL as written, `{name}`s included.
    pub url: String,
    /// `url`, taken apart: the `{name}`s are in the path only.
    pub template: UrlTemplate,
    /// Sent on every request; values not expanded (`${NAME}` is expanded at call time).
    pub headers: BTreeMap<String, String>,
    /// `auth_header` + `auth_value`: the value not expanded, never logged.
    pub auth: Option<HttpAuth>,
    /// One call's deadline, the response read included. Default 30 s.
    pub timeout: Duration,
    /// A larger response is refused. Default 10 MiB.
    pub max_response_bytes: u64,
    /// The tool's read-only annotation. Default true for GET, false otherwise.
    pub read_only: bool,
    /// A header that carries the calling principal's name.
    pub principal_header: Option<String>,
    /// By name.
    pub params: Vec<HttpParam>,
}

/// The request methods an HTTP tool may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpMethod {
    Get,
    Post,
    Put,
    Patch,
    Delete,
}

impl HttpMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Get => "GET",
            Self::Post => "POST",
            Self::Put => "PUT",
            Self::Patch => "PATCH",
            Self::Delete => "DELETE",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s.to_ascii_uppercase().as_str() {
            "GET" => Self::Get,
            "POST" => Self::Post,
            "PUT" => Self::Put,
            "PATCH" => Self::Patch,
            "DELETE" => Self::Delete,
            _ => return None,
        })
    }
}

/// The credential header of an HTTP tool.
#[derive(Clone, PartialEq, Eq)]
pub struct HttpAuth {
    pub header: String,
    /// E.g. `Bearer ${CRM_TOKEN}`; expanded at call time.
    pub value: String,
}

impl std::fmt::Debug for HttpAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The value is a reference to a secret as written, but it may be a literal one.
        f.debug_struct("HttpAuth")
            .field("header", &self.header)
            .field("value", &"<redacted>")
            .finish()
    }
}

/// A URL template: `origin` and static `query` hold no `{..}`; the path does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlTemplate {
    /// `https://crm.internal:8443`: scheme and authority.
    pub origin: String,
    /// The path's segments after the first `/`, each literal text and parameters.
    pub segments: Vec<Vec<PathPiece>>,
    /// The query as written (without `?`), or `None`.
    pub query: Option<String>,
}

/// A piece of one path segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathPiece {
    /// Text as written in the template (already valid in a URL path).
    Literal(String),
    /// `{name}`: the value of the path parameter `name`, percent-encoded.
    Param(String),
}

/// Where a parameter goes in the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamLocation {
    /// A `{name}` in the URL's path, one segment's worth, percent-encoded.
    Path,
    /// `?name=value`; an array is the key repeated.
    Query,
    /// The header named after the parameter with `_` as `-` (`x_tenant` → `x-tenant`).
    Header,
    /// A field of the JSON object body.
    Body,
}

impl ParamLocation {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Path => "path",
            Self::Query => "query",
            Self::Header => "header",
            Self::Body => "body",
        }
    }
}

/// A JSON Schema type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonType {
    String,
    Integer,
    Number,
    Boolean,
    Array,
    Object,
}

impl JsonType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::String => "string",
            Self::Integer => "integer",
            Self::Number => "number",
            Self::Boolean => "boolean",
            Self::Array => "array",
            Self::Object => "object",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "string" => Self::String,
            "integer" => Self::Integer,
            "number" => Self::Number,
            "boolean" => Self::Boolean,
            "array" => Self::Array,
            "object" => Self::Object,
            _ => return None,
        })
    }

    fn is_scalar(self) -> bool {
        !matches!(self, Self::Array | Self::Object)
    }

    /// Whether `v` is of this type (as JSON Schema says: an integer is also a number).
    pub fn admits(self, v: &Value) -> bool {
        match self {
            Self::String => v.is_string(),
            Self::Integer => v.is_i64() || v.is_u64(),
            Self::Number => v.is_number(),
            Self::Boolean => v.is_boolean(),
            Self::Array => v.is_array(),
            Self::Object => v.is_object(),
        }
    }
}

/// `[http_tools.NAME.params.P]`.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpParam {
    /// The argument's name (and the query key, the body field, the header name with `_` as
    /// `-`).
    pub name: String,
    pub location: ParamLocation,
    pub ty: JsonType,
    pub description: Option<String>,
    /// Default: true for path parameters, false for the others.
    pub required: bool,
    /// Already checked against `ty` (and `enum`).
    pub default: Option<Value>,
    /// The values allowed, each of `ty`.
    pub values: Option<Vec<Value>>,
}

impl HttpParam {
    /// The header a `header` parameter is sent as.
    pub fn header_name(&self) -> String {
        self.name.replace('_', "-")
    }
}

pub(crate) fn resolve_http_tools(
    raw: BTreeMap<String, RawHttpTool>,
    query_tools: &[String],
) -> Result<BTreeMap<String, HttpToolConfig>, ConfigError> {
    let mut out = BTreeMap::new();
    for (name, t) in raw {
        let tool = resolve_http_tool(&name, t, query_tools)?;
        out.insert(name, tool);
    }
    Ok(out)
}

/// An HTTP header name (RFC 9110 token).
pub(crate) fn is_header_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// A header value as written or expanded: no control characters but tab (so no CR/LF).
pub fn is_header_value(s: &str) -> bool {
    s.bytes().all(|b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

fn is_param_name(s: &str) -> bool {
    s.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && s.len() <= 64
}

fn resolve_http_tool(
    name: &str,
    t: RawHttpTool,
    query_tools: &[String],
) -> Result<HttpToolConfig, ConfigError> {
    let what = format!("http_tools.{name}");
    let key = |k: &str| format!("{what}.{k}");
    if !is_identifier(name) {
        return Err(invalid(
            &what,
            "HTTP tool names must be lower-case identifiers (letters, digits, `_`, at most 48): the name is the tool's",
            "e.g. `[http_tools.crm_orders]`",
        ));
    }
    if BUILTIN_TOOL_NAMES.contains(&name) || query_tools.iter().any(|q| q == name) {
        return Err(invalid(
            &what,
            format!("`{name}` is already the name of a built-in tool or a named query's"),
            "give the HTTP tool a name of its own, e.g. with the service's name in front",
        ));
    }
    if t.description.trim().is_empty() {
        return Err(invalid(
            key("description"),
            "is empty",
            "say what the API answers and when to call it: the model chooses tools by it",
        ));
    }
    let method = match &t.method {
        None => HttpMethod::Get,
        Some(m) => HttpMethod::parse(m).ok_or_else(|| {
            invalid(
                key("method"),
                format!("`{m}` is not a supported method"),
                "use `GET` (the default), `POST`, `PUT`, `PATCH` or `DELETE`",
            )
        })?,
    };
    let template = parse_template(&key("url"), &t.url)?;

    for (h, v) in &t.headers {
        let k = format!("{what}.headers.{h}");
        if !is_header_name(h) {
            return Err(invalid(
                &k,
                format!("`{h}` is not a header name"),
                "e.g. `headers = { Accept = \"application/json\" }`",
            ));
        }
        if !is_header_value(v) {
            return Err(invalid(
                &k,
                "holds a line break or another control character",
                "write the value on one line",
            ));
        }
    }
    let auth = match (t.auth_header, t.auth_value) {
        (None, None) => None,
        (Some(header), Some(value)) => {
            if !is_header_name(&header) {
                return Err(invalid(
                    key("auth_header"),
                    format!("`{header}` is not a header name"),
                    "e.g. `auth_header = \"Authorization\"`",
                ));
            }
            if !is_header_value(&value) || value.trim().is_empty() {
                return Err(invalid(
                    key("auth_value"),
                    "is empty or holds a line break",
                    "e.g. `auth_value = \"Bearer ${CRM_TOKEN}\"` (expanded from the environment at call time)",
                ));
            }
            Some(HttpAuth { header, value })
        }
        _ => {
            return Err(invalid(
                &what,
                "`auth_header` and `auth_value` go together",
                "e.g. `auth_header = \"Authorization\"` and `auth_value = \"Bearer ${CRM_TOKEN}\"`",
            ));
        }
    };
    if let Some(h) = &t.principal_header
        && !is_header_name(h)
    {
        return Err(invalid(
            key("principal_header"),
            format!("`{h}` is not a header name"),
            "e.g. `principal_header = \"X-Dataref-Principal\"`",
        ));
    }
    // Headers only dataref sets: the model's header parameters and the static ones must not
    // replace the credential or the caller's name.
    let reserved: Vec<(&str, String)> = auth
        .iter()
        .map(|a| (a.header.as_str(), key("auth_header")))
        .chain(
            t.principal_header
                .iter()
                .map(|h| (h.as_str(), key("principal_header"))),
        )
        .collect();
    let clash = |h: &str| {
        reserved
            .iter()
            .find(|(r, _)| r.eq_ignore_ascii_case(h))
            .map(|(_, k)| k.clone())
    };
    for h in t.headers.keys() {
        if let Some(k) = clash(h) {
            return Err(invalid(
                format!("{what}.headers.{h}"),
                format!("is the header of `{k}`"),
                "set that header in one place only",
            ));
        }
    }
    if let (Some(a), Some(p)) = (&auth, &t.principal_header)
        && a.header.eq_ignore_ascii_case(p)
    {
        return Err(invalid(
            key("principal_header"),
            "is the same header as `auth_header`",
            "carry the principal in a header of its own, e.g. `X-Dataref-Principal`",
        ));
    }

    let timeout = duration(&key("timeout"), &t.timeout, Duration::from_secs(30))?;
    if timeout.is_zero() {
        return Err(invalid(
            key("timeout"),
            "must be longer than zero",
            "the default is `30s`",
        ));
    }
    let max_response_bytes = size(&key("max_response_bytes"), &t.max_response_bytes, 10 << 20)?;
    if max_response_bytes == 0 || max_response_bytes > 1 << 30 {
        return Err(invalid(
            key("max_response_bytes"),
            "must be above zero and at most 1GiB",
            "the default is `10MiB`",
        ));
    }

    let mut params = Vec::with_capacity(t.params.len());
    for (pname, p) in t.params {
        let param = resolve_param(&format!("{what}.params.{pname}"), &pname, p)?;
        if param.location == ParamLocation::Header {
            let header = param.header_name();
            if let Some(k) = clash(&header)
                .or_else(|| (header.eq_ignore_ascii_case("host")).then(|| "Host".to_owned()))
            {
                return Err(invalid(
                    format!("{what}.params.{pname}"),
                    format!("is sent as the header `{header}`, which is `{k}`'s"),
                    "name the parameter after another header",
                ));
            }
        }
        if param.location == ParamLocation::Body && method == HttpMethod::Get {
            return Err(invalid(
                format!("{what}.params.{pname}.in"),
                "a GET request has no body",
                "send it `in = \"query\"`, or set `method = \"POST\"`",
            ));
        }
        params.push(param);
    }
    let in_url: Vec<&str> = template
        .segments
        .iter()
        .flatten()
        .filter_map(|p| match p {
            PathPiece::Param(n) => Some(n.as_str()),
            PathPiece::Literal(_) => None,
        })
        .collect();
    for n in &in_url {
        if !params
            .iter()
            .any(|p| p.name == *n && p.location == ParamLocation::Path)
        {
            return Err(invalid(
                key("url"),
                format!("`{{{n}}}` is not a declared path parameter"),
                format!("declare it: `[{what}.params.{n}]` with `in = \"path\"`"),
            ));
        }
    }
    for p in &params {
        if p.location == ParamLocation::Path && !in_url.contains(&p.name.as_str()) {
            return Err(invalid(
                format!("{what}.params.{}", p.name),
                format!("the path parameter does not appear in `{what}.url`"),
                format!(
                    "put `{{{}}}` in the URL's path, or send it `in = \"query\"`",
                    p.name
                ),
            ));
        }
    }
    Ok(HttpToolConfig {
        name: name.to_owned(),
        description: t.description,
        read_only: t.read_only.unwrap_or(method == HttpMethod::Get),
        method,
        url: t.url,
        template,
        headers: t.headers,
        auth,
        timeout,
        max_response_bytes,
        principal_header: t.principal_header,
        params,
    })
}

fn resolve_param(what: &str, name: &str, p: RawHttpParam) -> Result<HttpParam, ConfigError> {
    if !is_param_name(name) {
        return Err(invalid(
            what,
            "parameter names are letters, digits and `_` (at most 64), not starting with a digit",
            "e.g. `params.customer_id`",
        ));
    }
    let location = match p.location.as_str() {
        "path" => ParamLocation::Path,
        "query" => ParamLocation::Query,
        "header" => ParamLocation::Header,
        "body" => ParamLocation::Body,
        other => {
            return Err(invalid(
                format!("{what}.in"),
                format!("`{other}` is not a place in a request"),
                "use `path`, `query`, `header` or `body`",
            ));
        }
    };
    let ty = match &p.ty {
        None => JsonType::String,
        Some(t) => JsonType::parse(t).ok_or_else(|| {
            invalid(
                format!("{what}.type"),
                format!("unknown type `{t}`"),
                "use `string` (the default), `integer`, `number`, `boolean`, `array` or `object`",
            )
        })?,
    };
    let fits = match location {
        ParamLocation::Path | ParamLocation::Header => ty.is_scalar(),
        ParamLocation::Query => ty != JsonType::Object,
        ParamLocation::Body => true,
    };
    if !fits {
        return Err(invalid(
            format!("{what}.type"),
            format!(
                "a {} parameter cannot be an {}",
                location.as_str(),
                ty.as_str()
            ),
            "path and header parameters are strings, numbers or booleans; a query one may also be an array (the key repeated); objects go in the body",
        ));
    }
    let required = p.required.unwrap_or(location == ParamLocation::Path);
    if location == ParamLocation::Path && !required {
        return Err(invalid(
            format!("{what}.required"),
            "a path parameter is always required",
            "drop `required = false`, or send it `in = \"query\"`",
        ));
    }
    let values = match p.values {
        None => None,
        Some(vs) => {
            if vs.is_empty() {
                return Err(invalid(
                    format!("{what}.enum"),
                    "is empty",
                    "list the allowed values, or drop `enum`",
                ));
            }
            let mut out = Vec::with_capacity(vs.len());
            for v in vs {
                let json = to_json(v);
                if !ty.admits(&json) {
                    return Err(invalid(
                        format!("{what}.enum"),
                        format!("`{json}` is not a {}", ty.as_str()),
                        "every allowed value must be of the parameter's `type`",
                    ));
                }
                out.push(json);
            }
            Some(out)
        }
    };
    let default = match p.default {
        None => None,
        Some(v) => {
            let json = to_json(v);
            if !ty.admits(&json) {
                return Err(invalid(
                    format!("{what}.default"),
                    format!("`{json}` is not a {}", ty.as_str()),
                    "give a default of the parameter's `type`",
                ));
            }
            if values.as_ref().is_some_and(|vs| !vs.contains(&json)) {
                return Err(invalid(
                    format!("{what}.default"),
                    format!("`{json}` is not one of `enum`"),
                    "give one of the allowed values as the default",
                ));
            }
            Some(json)
        }
    };
    if required && default.is_some() {
        return Err(invalid(
            what,
            "a required parameter cannot have a default",
            "drop `required` or `default`",
        ));
    }
    Ok(HttpParam {
        name: name.to_owned(),
        location,
        ty,
        description: p.description,
        required,
        default,
        values,
    })
}

fn to_json(v: toml::Value) -> Value {
    match v {
        toml::Value::String(s) => Value::String(s),
        toml::Value::Integer(i) => Value::from(i),
        toml::Value::Float(f) => Value::from(f),
        toml::Value::Boolean(b) => Value::Bool(b),
        toml::Value::Datetime(d) => Value::String(d.to_string()),
        toml::Value::Array(a) => Value::Array(a.into_iter().map(to_json).collect()),
        toml::Value::Table(t) => {
            Value::Object(t.into_iter().map(|(k, v)| (k, to_json(v))).collect())
        }
    }
}

/// `scheme://authority/path?query`: `{name}` only in the path, whole names only.
fn parse_template(what: &str, url: &str) -> Result<UrlTemplate, ConfigError> {
    let bad = |message: String| {
        invalid(
            what,
            message,
            "e.g. `url = \"https://crm.internal/api/customers/{customer_id}/orders\"`: `{name}` only in the path, each a declared path parameter",
        )
    };
    let (scheme, rest) = if let Some(r) = url.strip_prefix("https://") {
        ("https", r)
    } else if let Some(r) = url.strip_prefix("http://") {
        ("http", r)
    } else {
        return Err(bad(format!("`{url}` is not an http:// or https:// URL")));
    };
    if url.contains(|c: char| c.is_whitespace() || c.is_control()) {
        return Err(bad("holds a space or a control character".into()));
    }
    if url.contains('#') {
        return Err(bad("a URL sent to a server has no `#fragment`".into()));
    }
    let path_at = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, rest) = rest.split_at(path_at);
    if authority.is_empty() || authority.contains('@') {
        return Err(bad(
            "needs a host (and no `user@`: credentials go in `auth_header`/`auth_value`)".into(),
        ));
    }
    if authority.contains(['{', '}']) {
        return Err(bad(
            "`{..}` in the host or port: parameters go in the path only".into(),
        ));
    }
    let (path, query) = match rest.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (rest, None),
    };
    if let Some(q) = query
        && q.contains(['{', '}'])
    {
        return Err(bad(
            "`{..}` in the query: declare the parameter `in = \"query\"` instead".into(),
        ));
    }
    let mut segments = Vec::new();
    if let Some(path) = path.strip_prefix('/') {
        for seg in path.split('/') {
            segments.push(parse_segment(seg).map_err(bad)?);
        }
    }
    Ok(UrlTemplate {
        origin: format!("{scheme}://{authority}"),
        segments,
        query: query.filter(|q| !q.is_empty()).map(str::to_owned),
    })
}

fn parse_segment(seg: &str) -> Result<Vec<PathPiece>, String> {
    let mut pieces = Vec::new();
    let mut rest = seg;
    while let Some(open) = rest.find(['{', '}']) {
        if rest[open..].starts_with('}') {
            return Err(format!("`}}` without its `{{` in the path segment `{seg}`"));
        }
        if open > 0 {
            pieces.push(PathPiece::Literal(rest[..open].to_owned()));
        }
        let after = &rest[open + 1..];
        let close = after
            .find('}')
            .ok_or_else(|| format!("`{{` without its `}}` in the path segment `{seg}`"))?;
        let name = &after[..close];
        if !is_param_name(name) {
            return Err(format!(
                "`{{{name}}}` is not a parameter name (letters, digits and `_`)"
            ));
        }
        if matches!(pieces.last(), Some(PathPiece::Param(_))) {
            return Err(format!(
                "two parameters side by side in `{seg}`: put text between them"
            ));
        }
        pieces.push(PathPiece::Param(name.to_owned()));
        rest = &after[close + 1..];
    }
    if !rest.is_empty() || pieces.is_empty() {
        pieces.push(PathPiece::Literal(rest.to_owned()));
    }
    Ok(pieces)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::from_toml_str_with_env(
            text,
            "/etc/dataref".as_ref(),
            "/var/lib/dataref".into(),
            &|_| None,
        )
    }

    const CRM: &str = r#"
[http_tools.crm_orders]
description = "A customer's orders from the CRM."
url = "https://crm.internal:8443/api/customers/{customer_id}/orders?v=2"
headers = { Accept = "application/json", "X-Client" = "dataref ${HOSTNAME}" }
auth_header = "Authorization"
auth_value = "Bearer ${CRM_TOKEN}"
timeout = "10s"
max_response_bytes = "2MiB"
principal_header = "X-Dataref-Principal"
[http_tools.crm_orders.params.customer_id]
in = "path"
type = "integer"
description = "The customer's number."
[http_tools.crm_orders.params.status]
in = "query"
enum = ["open", "shipped"]
default = "open"
[http_tools.crm_orders.params.x_tenant]
in = "header"
[http_tools.crm_orders.params.ids]
in = "query"
type = "array"

[http_tools.crm_note]
description = "Adds a note to a customer."
method = "post"
url = "http://crm.internal/api/customers/{id}/notes"
[http_tools.crm_note.params.id]
in = "path"
[http_tools.crm_note.params.note]
in = "body"
required = true
[http_tools.crm_note.params.tags]
in = "body"
type = "array"
"#;

    #[test]
    fn a_full_declaration() {
        let c = parse(CRM).unwrap();
        let t = &c.http_tools["crm_orders"];
        assert_eq!(t.method, HttpMethod::Get);
        assert!(t.read_only);
        assert_eq!(t.timeout, Duration::from_secs(10));
        assert_eq!(t.max_response_bytes, 2 << 20);
        assert_eq!(t.template.origin, "https://crm.internal:8443");
        assert_eq!(t.template.query.as_deref(), Some("v=2"));
        assert_eq!(
            t.template.segments,
            vec![
                vec![PathPiece::Literal("api".into())],
                vec![PathPiece::Literal("customers".into())],
                vec![PathPiece::Param("customer_id".into())],
                vec![PathPiece::Literal("orders".into())],
            ]
        );
        assert_eq!(t.headers["X-Client"], "dataref ${HOSTNAME}");
        let auth = t.auth.as_ref().unwrap();
        assert_eq!(auth.value, "Bearer ${CRM_TOKEN}");
        assert!(!format!("{t:?}").contains("CRM_TOKEN"));
        assert_eq!(t.principal_header.as_deref(), Some("X-Dataref-Principal"));
        let names: Vec<_> = t.params.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["customer_id", "ids", "status", "x_tenant"]);
        let id = &t.params[0];
        assert_eq!(
            (id.location, id.ty, id.required),
            (ParamLocation::Path, JsonType::Integer, true)
        );
        let status = &t.params[2];
        assert_eq!(status.default, Some(Value::from("open")));
        assert_eq!(status.values.as_ref().map(Vec::len), Some(2));
        assert!(!status.required);
        assert_eq!(t.params[3].header_name(), "x-tenant");

        let n = &c.http_tools["crm_note"];
        assert_eq!(n.method, HttpMethod::Post);
        assert!(!n.read_only);
        assert_eq!(n.timeout, Duration::from_secs(30));
        assert_eq!(n.max_response_bytes, 10 << 20);
        assert!(n.params.iter().any(|p| p.name == "note" && p.required));
        assert!(parse("").unwrap().http_tools.is_empty());
    }

    #[test]
    fn segments_may_mix_text_and_parameters() {
        let t = parse_template("u", "https://h/v1/{id}.json/").unwrap();
        assert_eq!(
            t.segments,
            vec![
                vec![PathPiece::Literal("v1".into())],
                vec![
                    PathPiece::Param("id".into()),
                    PathPiece::Literal(".json".into())
                ],
                vec![PathPiece::Literal(String::new())],
            ]
        );
        assert!(
            parse_template("u", "https://h")
                .unwrap()
                .segments
                .is_empty()
        );
    }

    #[test]
    fn bad_declarations_name_the_key() {
        let tool = |extra: &str| {
            format!(
                "[http_tools.t]\ndescription = \"d\"\nurl = \"https://h/a/{{id}}\"\n{extra}\n[http_tools.t.params.id]\nin = \"path\"\n"
            )
        };
        for (text, key) in [
            (tool("colour = 1"), "unknown field `colour`"),
            (tool("method = \"TRACE\""), "http_tools.t.method"),
            (tool("timeout = 0"), "http_tools.t.timeout"),
            (
                tool("max_response_bytes = 0"),
                "http_tools.t.max_response_bytes",
            ),
            (tool("auth_header = \"Authorization\""), "go together"),
            (
                tool("auth_header = \"Bad Header\"\nauth_value = \"x\""),
                "http_tools.t.auth_header",
            ),
            (
                tool("headers = { \"X-A\" = \"a\\r\\nX-B: b\" }"),
                "http_tools.t.headers.X-A",
            ),
            (
                tool("principal_header = \"X-P\"\nheaders = { \"x-p\" = \"me\" }"),
                "http_tools.t.headers.x-p",
            ),
            (
                "[http_tools.t]\ndescription = \"d\"\nurl = \"https://{host}/a\"\n[http_tools.t.params.host]\nin = \"path\"\n".into(),
                "host or port",
            ),
            (
                "[http_tools.t]\ndescription = \"d\"\nurl = \"https://h:{port}/a\"\n".into(),
                "host or port",
            ),
            (
                "[http_tools.t]\ndescription = \"d\"\nurl = \"https://h/a?q={q}\"\n".into(),
                "in the query",
            ),
            (
                "[http_tools.t]\ndescription = \"d\"\nurl = \"https://h/a/{id}\"\n".into(),
                "`{id}` is not a declared path parameter",
            ),
            (
                "[http_tools.t]\ndescription = \"d\"\nurl = \"https://h/a/{id}\"\n[http_tools.t.params.id]\nin = \"query\"\n".into(),
                "`{id}` is not a declared path parameter",
            ),
            (
                "[http_tools.t]\ndescription = \"d\"\nurl = \"https://h/a\"\n[http_tools.t.params.id]\nin = \"path\"\n".into(),
                "http_tools.t.params.id",
            ),
            (
                "[http_tools.t]\ndescription = \"d\"\nurl = \"ftp://h/a\"\n".into(),
                "http_tools.t.url",
            ),
            (
                "[http_tools.t]\ndescription = \"d\"\nurl = \"https://u:p@h/a\"\n".into(),
                "http_tools.t.url",
            ),
            (
                "[http_tools.t]\ndescription = \"d\"\nurl = \"https://h/a/{id\"\n".into(),
                "without its",
            ),
            (
                "[http_tools.t]\ndescription = \" \"\nurl = \"https://h/a\"\n".into(),
                "http_tools.t.description",
            ),
            (
                "[http_tools.t]\nurl = \"https://h/a\"\n".into(),
                "missing field `description`",
            ),
            (
                "[http_tools.query]\ndescription = \"d\"\nurl = \"https://h/a\"\n".into(),
                "http_tools.query",
            ),
            (
                "[http_tools.\"Bad-Name\"]\ndescription = \"d\"\nurl = \"https://h/a\"\n".into(),
                "http_tools.Bad-Name",
            ),
            (
                tool("[http_tools.t.params.q]\nin = \"cookie\""),
                "http_tools.t.params.q.in",
            ),
            (
                tool("[http_tools.t.params.q]\nin = \"query\"\ntype = \"date\""),
                "http_tools.t.params.q.type",
            ),
            (
                tool("[http_tools.t.params.q]\nin = \"header\"\ntype = \"object\""),
                "http_tools.t.params.q.type",
            ),
            (
                tool("[http_tools.t.params.q]\nin = \"query\"\ntype = \"integer\"\ndefault = \"x\""),
                "http_tools.t.params.q.default",
            ),
            (
                tool("[http_tools.t.params.q]\nin = \"query\"\nenum = [\"a\", 2]"),
                "http_tools.t.params.q.enum",
            ),
            (
                tool("[http_tools.t.params.q]\nin = \"query\"\nenum = [\"a\"]\ndefault = \"b\""),
                "http_tools.t.params.q.default",
            ),
            (
                tool("[http_tools.t.params.q]\nin = \"query\"\nrequired = true\ndefault = \"b\""),
                "cannot have a default",
            ),
            (
                tool("[http_tools.t.params.q]\nin = \"body\""),
                "http_tools.t.params.q.in",
            ),
            (
                tool("auth_header = \"X-Key\"\nauth_value = \"${K}\"\n[http_tools.t.params.x_key]\nin = \"header\""),
                "http_tools.t.params.x_key",
            ),
            (
                tool("[http_tools.t.params.q]\nin = \"query\"\nbogus = 1"),
                "unknown field `bogus`",
            ),
        ] {
            let e = parse(&text).unwrap_err().to_string();
            assert!(e.contains(key), "{text}: {e}");
        }
        // The path parameter is required by nature.
        let e = parse(&tool("").replace("in = \"path\"", "in = \"path\"\nrequired = false"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("http_tools.t.params.id.required"), "{e}");
        assert!(parse(&tool("")).is_ok());
    }

    #[test]
    fn a_named_querys_tool_name_is_taken() {
        let text = "[sources.s]\nkind = \"sqlite\"\npath = \"x\"\n[queries.orders]\nsource = \"s\"\ndescription = \"d\"\nsql = \"select 1\"\n[http_tools.fetch_orders]\ndescription = \"d\"\nurl = \"https://h/a\"\n";
        let e = parse(text).unwrap_err().to_string();
        assert!(e.contains("http_tools.fetch_orders"), "{e}");
    }
}
