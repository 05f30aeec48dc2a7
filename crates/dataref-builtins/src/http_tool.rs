//! `[http_tools.NAME]`: an internal HTTP API as a tool. The input schema comes from the
//! declared parameters; a call fills the URL template (each path value percent-encoded as
//! one segment, `.`/`..`/empty refused), appends the query, sends header parameters, a JSON
//! body, the static headers and the credential (expanded from the environment at call
//! time, never logged), with redirects off, a deadline and a cap on the answer, which is
//! read as it streams in. A JSON list of flat records becomes a table artifact of the
//! caller's, described like a producer's; other JSON comes back as structured output, text
//! as text; an error status becomes a message for the model with the API's own words and a
//! hint.

use dataref_protocol::truncate_chars;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use dataref_config::env::{ExpandError, expand};
use dataref_config::http_tool::is_header_value;
use dataref_config::{HttpParam, HttpToolConfig, ParamLocation, PathPiece};
use dataref_protocol::{Description, ToolAnnotations, ToolSpec};
use dataref_store::{Lineage, SampleOptions, describe};
use dataref_tool::records::{find_records, records_to_batch};
use dataref_tool::{RunContext, Tool, ToolError, ToolOutput};
use serde_json::{Map, Value, json};

use crate::support::{blocking, output};

/// How the tool reads the environment (`${NAME}` in `auth_value` and `headers`).
pub type EnvLookup = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// Characters of the API's own error message the model is shown.
const EXCERPT_CHARS: usize = 300;

/// One `[http_tools.NAME]` as a tool.
pub struct HttpTool {
    spec: ToolSpec,
    config: HttpToolConfig,
    env: EnvLookup,
    /// Made at the first call (building a TLS client can fail; the registry cannot), then
    /// kept for the tool's life.
    client: OnceLock<Result<reqwest::Client, String>>,
}

impl std::fmt::Debug for HttpTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpTool")
            .field("name", &self.config.name)
            .finish_non_exhaustive()
    }
}

impl HttpTool {
    /// The tool for `config`, reading secrets from the process environment.
    pub fn new(config: HttpToolConfig) -> Self {
        Self::with_env(config, Arc::new(dataref_config::env::process))
    }

    /// The tool for `config`, reading `${NAME}`s through `env`.
    pub fn with_env(config: HttpToolConfig, env: EnvLookup) -> Self {
        let spec = spec_for(&config);
        Self {
            spec,
            config,
            env,
            client: OnceLock::new(),
        }
    }

    fn client(&self) -> Result<&reqwest::Client, ToolError> {
        let made = self.client.get_or_init(|| {
            dataref_config::tls::install_provider();
            reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .timeout(self.config.timeout)
                .connect_timeout(self.config.timeout.min(Duration::from_secs(10)))
                .user_agent(concat!("dataref/", env!("CARGO_PKG_VERSION")))
                .build()
                .map_err(|e| error_chain(&e))
        });
        made.as_ref().map_err(|e| {
            ToolError::Fatal(format!(
                "the HTTP client of `{}` could not be made: {e}",
                self.config.name
            ))
        })
    }

    /// A `${NAME}` value of the config, expanded; an unset variable is the operator's to
    /// fix, named (never its value).
    fn expand(&self, key: &str, value: &str) -> Result<String, ToolError> {
        let name = &self.config.name;
        let lookup = |n: &str| (self.env)(n);
        let expanded = expand(value, &lookup).map_err(|e| {
            let (problem, hint) = match e {
                ExpandError::Unset(var) => (
                    format!(
                        "the environment variable `{var}` (in `http_tools.{name}.{key}`) is not set"
                    ),
                    format!(
                        "tell the person; an operator must set `{var}` in dataref's environment"
                    ),
                ),
                ExpandError::Malformed(m) => (
                    format!("`http_tools.{name}.{key}` is malformed: {m}"),
                    "tell the person; an operator must fix the configuration".to_owned(),
                ),
            };
            tracing::error!(tool = %name, "{problem}");
            ToolError::respond(
                format!("the tool `{name}` is not configured completely on this server: {problem}"),
                Some(hint),
            )
        })?;
        if !is_header_value(&expanded) {
            tracing::error!(tool = %name, key, "an expanded header value holds a line break");
            return Err(ToolError::respond(
                format!(
                    "the tool `{name}` is not configured correctly on this server: the value of `http_tools.{name}.{key}` holds a line break once expanded"
                ),
                Some("tell the person; an operator must fix the variable's value".into()),
            ));
        }
        Ok(expanded)
    }

    /// Everything the request is made of, checked, before anything is sent.
    fn request(
        &self,
        args: &Map<String, Value>,
        ctx: &RunContext,
    ) -> Result<(reqwest::Request, String), ToolError> {
        let c = &self.config;
        fn value<'a>(args: &'a Map<String, Value>, p: &'a HttpParam) -> Option<&'a Value> {
            args.get(&p.name).or(p.default.as_ref())
        }
        let by_name = |n: &str| c.params.iter().find(|p| p.name == n);

        // The path, one segment at a time.
        let mut path = String::new();
        for segment in &c.template.segments {
            let mut built = String::new();
            for piece in segment {
                match piece {
                    PathPiece::Literal(text) => built.push_str(text),
                    PathPiece::Param(n) => {
                        let v = by_name(n).and_then(|p| value(args, p)).ok_or_else(|| {
                            ToolError::respond(
                                format!("`{n}` is required: it is part of the path"),
                                Some(format!("give `{n}`")),
                            )
                        })?;
                        let text = scalar_text(v);
                        if text.is_empty() || text == "." || text == ".." {
                            return Err(ToolError::respond(
                                format!(
                                    "`{n}` may not be {}: it is one segment of the path",
                                    if text.is_empty() {
                                        "empty".to_owned()
                                    } else {
                                        format!("`{text}`")
                                    }
                                ),
                                Some(format!("give the {n} itself")),
                            ));
                        }
                        built.push_str(&encode_segment(&text));
                    }
                }
            }
            // `.`/`..` segments are resolved away by the URL parser: into another endpoint.
            if built == "." || built == ".." {
                return Err(ToolError::respond(
                    "the path values make a `.` or `..` segment",
                    Some("give the values themselves".into()),
                ));
            }
            path.push('/');
            path.push_str(&built);
        }
        let mut text = format!("{}{path}", c.template.origin);
        if let Some(q) = &c.template.query {
            text.push('?');
            text.push_str(q);
        }
        let mut url = reqwest::Url::parse(&text)
            .map_err(|e| ToolError::Fatal(format!("the URL of `{}` is not valid: {e}", c.name)))?;
        let want = if path.is_empty() { "/" } else { path.as_str() };
        if url.path() != want {
            // Defence in depth: the parser must not have rewritten our path.
            return Err(ToolError::respond(
                "the path values make a path the server would not read as given",
                Some("give the values themselves, without `.` segments".into()),
            ));
        }
        let shown = format!("{} {}", c.method.as_str(), url.path());

        // The query.
        let query: Vec<(&str, String)> = c
            .params
            .iter()
            .filter(|p| p.location == ParamLocation::Query)
            .filter_map(|p| value(args, p).map(|v| (p.name.as_str(), v)))
            .flat_map(|(n, v)| match v {
                Value::Array(items) => items.iter().map(|i| (n, scalar_text(i))).collect(),
                Value::Null => Vec::new(),
                other => vec![(n, scalar_text(other))],
            })
            .collect();
        if !query.is_empty() {
            let mut pairs = url.query_pairs_mut();
            for (n, v) in &query {
                pairs.append_pair(n, v);
            }
        }

        let method = match c.method {
            dataref_config::HttpMethod::Get => reqwest::Method::GET,
            dataref_config::HttpMethod::Post => reqwest::Method::POST,
            dataref_config::HttpMethod::Put => reqwest::Method::PUT,
            dataref_config::HttpMethod::Patch => reqwest::Method::PATCH,
            dataref_config::HttpMethod::Delete => reqwest::Method::DELETE,
        };
        let mut request = reqwest::Request::new(method, url);
        let headers = request.headers_mut();
        let mut put = |name: &str, value: &str, what: &str| -> Result<(), ToolError> {
            let n = reqwest::header::HeaderName::from_bytes(name.as_bytes())
                .map_err(|e| ToolError::Fatal(format!("header `{name}` of `{}`: {e}", c.name)))?;
            let mut v = reqwest::header::HeaderValue::from_str(value).map_err(|_| {
                ToolError::respond(
                    format!("{what} is not a valid header value"),
                    Some("give it without line breaks or control characters".into()),
                )
            })?;
            v.set_sensitive(what.starts_with("the credential"));
            headers.insert(n, v);
            Ok(())
        };
        if c.params.iter().any(|p| p.location == ParamLocation::Body) {
            put("content-type", "application/json", "content-type")?;
        }
        put(
            "accept",
            "application/json, text/*;q=0.9, */*;q=0.1",
            "accept",
        )?;
        for (name, raw) in &c.headers {
            let v = self.expand(&format!("headers.{name}"), raw)?;
            put(name, &v, &format!("the header `{name}`"))?;
        }
        for p in c
            .params
            .iter()
            .filter(|p| p.location == ParamLocation::Header)
        {
            if let Some(v) = value(args, p) {
                let text = scalar_text(v);
                if !is_header_value(&text) {
                    return Err(ToolError::respond(
                        format!("`{}` holds a line break or a control character", p.name),
                        Some("give it on one line: it is sent as a header".into()),
                    ));
                }
                put(&p.header_name(), &text, &format!("`{}`", p.name))?;
            }
        }
        if let Some(h) = &c.principal_header {
            put(h, ctx.principal.as_str(), "the principal")?;
        }
        if let Some(auth) = &c.auth {
            let v = self.expand("auth_value", &auth.value)?;
            put(&auth.header, &v, "the credential")?;
        }
        let body: Map<String, Value> = c
            .params
            .iter()
            .filter(|p| p.location == ParamLocation::Body)
            .filter_map(|p| value(args, p).map(|v| (p.name.clone(), v.clone())))
            .collect();
        if c.params.iter().any(|p| p.location == ParamLocation::Body) {
            let bytes = serde_json::to_vec(&Value::Object(body))
                .map_err(|e| ToolError::Fatal(format!("serialising the body: {e}")))?;
            *request.body_mut() = Some(bytes.into());
        }
        Ok((request, shown))
    }

    async fn exchange(
        &self,
        args: Map<String, Value>,
        ctx: &RunContext,
    ) -> Result<ToolOutput, ToolError> {
        let c = &self.config;
        let (request, shown) = self.request(&args, ctx)?;
        let client = self.client()?;
        tracing::debug!(tool = %c.name, request = %shown, "calling the HTTP API");
        let mut response = client
            .execute(request)
            .await
            .map_err(|e| self.transport_error(&e))?;
        let status = response.status();
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();
        let cap = c.max_response_bytes;
        let too_big = |n: u64| {
            ToolError::respond(
                format!(
                    "the API's answer is larger than this tool takes ({} of at most {cap} bytes)",
                    if n > cap {
                        format!("{n} bytes")
                    } else {
                        "more".to_owned()
                    }
                ),
                Some(format!(
                    "ask for less (a filter, a shorter period or a page, if the tool has such parameters); an operator can raise `http_tools.{}.max_response_bytes`",
                    c.name
                )),
            )
        };
        if let Some(n) = response.content_length()
            && n > cap
        {
            return Err(too_big(n));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| self.transport_error(&e))?
        {
            if (body.len() + chunk.len()) as u64 > cap {
                return Err(too_big((body.len() + chunk.len()) as u64));
            }
            body.extend_from_slice(&chunk);
        }
        if !status.is_success() {
            return Err(self.status_error(status, &body, &args, &shown));
        }
        self.answer(&body, &content_type, args, &shown, ctx).await
    }

    fn transport_error(&self, e: &reqwest::Error) -> ToolError {
        let c = &self.config;
        tracing::warn!(tool = %c.name, error = %error_chain(e), "HTTP API call failed");
        if e.is_timeout() {
            ToolError::respond(
                format!("the API did not answer within {}", seconds(c.timeout)),
                Some(format!(
                    "try again later, or ask for less; an operator can raise `http_tools.{}.timeout`",
                    c.name
                )),
            )
        } else if e.is_connect() {
            ToolError::respond(
                format!("the API behind `{}` cannot be reached right now", c.name),
                Some("try again later; if it persists, tell the person: an operator must check the service".into()),
            )
        } else {
            ToolError::respond(
                format!("the call to the API failed: {}", error_chain(e)),
                Some("try again later; if it persists, tell the person".into()),
            )
        }
    }

    fn status_error(
        &self,
        status: reqwest::StatusCode,
        body: &[u8],
        args: &Map<String, Value>,
        shown: &str,
    ) -> ToolError {
        let c = &self.config;
        let code = status.as_u16();
        let excerpt = api_message(body);
        let mut said = match &excerpt {
            Some(m) => format!(": {m}"),
            None => String::new(),
        };
        // An API that echoes the credential must not hand it to the model.
        if let Some(auth) = &c.auth
            && let Ok(secret) = self.expand("auth_value", &auth.value)
        {
            for part in std::iter::once(secret.as_str()).chain(secret.split_whitespace()) {
                if part.len() >= 8 {
                    said = said.replace(part, "***");
                }
            }
        }
        tracing::info!(tool = %c.name, status = code, request = %shown, "the HTTP API refused the call");
        let path_values: Vec<String> = c
            .params
            .iter()
            .filter(|p| p.location == ParamLocation::Path)
            .filter_map(|p| args.get(&p.name).map(|v| format!("`{}` = {v}", p.name)))
            .collect();
        let hint = match code {
            300..=399 => format!(
                "the API sends this call elsewhere, which dataref does not follow; tell the person: an operator must check `http_tools.{}.url`",
                c.name
            ),
            404 => {
                if path_values.is_empty() {
                    "check the arguments: the API knows no such thing".to_owned()
                } else {
                    format!(
                        "check the path values ({}): the API knows no such thing",
                        path_values.join(", ")
                    )
                }
            }
            401 | 403 => "the service refused dataref's credentials; tell the person: an operator must check the tool's credential".to_owned(),
            408 | 429 | 500..=599 => "the service is busy or failing; try again later".to_owned(),
            _ => "check the arguments against the API's message".to_owned(),
        };
        ToolError::respond(
            format!(
                "the API answered {code} {}{said}",
                status.canonical_reason().unwrap_or("")
            )
            .replace("  ", " "),
            Some(hint),
        )
    }

    /// A successful answer: records → a table artifact, other JSON → structured, text →
    /// text.
    async fn answer(
        &self,
        body: &[u8],
        content_type: &str,
        args: Map<String, Value>,
        shown: &str,
        ctx: &RunContext,
    ) -> Result<ToolOutput, ToolError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(ToolOutput::new(json!({"ok": true, "body": null})));
        }
        let looks_json = content_type.contains("json")
            || matches!(
                body.iter().find(|b| !b.is_ascii_whitespace()),
                Some(b'{' | b'[')
            );
        let parsed = looks_json
            .then(|| serde_json::from_slice::<Value>(body).ok())
            .flatten();
        let Some(value) = parsed else {
            return match std::str::from_utf8(body) {
                Ok(text) => Ok(ToolOutput {
                    structured: Value::Null,
                    attachments: Vec::new(),
                    text: Some(text.to_owned()),
                }),
                Err(_) => Err(ToolError::respond(
                    format!(
                        "the API answered {} bytes of `{}`, which is neither JSON nor text",
                        body.len(),
                        if content_type.is_empty() {
                            "an unnamed type"
                        } else {
                            content_type
                        }
                    ),
                    Some("this tool reads JSON and text only; tell the person".into()),
                )),
            };
        };
        if let Some(batch) = find_records(&value).and_then(records_to_batch) {
            let mut notes = vec![format!(
                "the rows of the API's answer to {shown}, stored as a table"
            )];
            if let Value::Object(fields) = &value {
                // The wrapper's other fields (a cursor, a total) are worth a look.
                let rest: Map<String, Value> = fields
                    .iter()
                    .filter(|(_, v)| !(v.is_array() || v.is_object()))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                if !rest.is_empty() {
                    let text = Value::Object(rest).to_string();
                    notes.push(format!(
                        "the answer also said: {}",
                        truncate_chars(&text, EXCERPT_CHARS)
                    ));
                }
            }
            let store = ctx.store.clone();
            let owner = ctx.principal.clone();
            // When it ran and with what: the request itself (its URL may carry secrets)
            // is not kept.
            let lineage = Lineage::new(self.config.name.clone(), Value::Object(args))
                .with_receipt(crate::receipt::started(ctx));
            let mut d: Description = blocking("http tool", move || {
                let mut writer = store.create_table(&owner, batch.schema(), lineage)?;
                writer.write(&batch)?;
                let meta = writer.finish()?;
                let opts = SampleOptions {
                    rows: 2,
                    max_value_chars: 80,
                };
                let table = store.map_table(&owner, &meta.data_ref)?.head(opts.rows)?;
                Ok(describe(&table, opts))
            })
            .await?;
            d.notes.extend(notes);
            return output(d);
        }
        Ok(ToolOutput::new(match value {
            Value::Object(_) => value,
            // Structured content is an object: anything else is wrapped.
            other => json!({ "response": other }),
        }))
    }
}

#[async_trait]
impl Tool for HttpTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(
        &self,
        args: Map<String, Value>,
        ctx: &RunContext,
    ) -> Result<ToolOutput, ToolError> {
        tokio::select! {
            biased;
            () = ctx.cancel.cancelled() => Err(ToolError::respond(
                "the call was cancelled",
                None,
            )),
            out = self.exchange(args, ctx) => out,
        }
    }
}

fn spec_for(c: &HttpToolConfig) -> ToolSpec {
    let mut properties = Map::new();
    let mut required = Vec::new();
    for p in &c.params {
        let mut s = Map::new();
        s.insert("type".into(), Value::String(p.ty.as_str().into()));
        if let Some(d) = &p.description {
            s.insert("description".into(), Value::String(d.clone()));
        }
        if let Some(vs) = &p.values {
            s.insert("enum".into(), Value::Array(vs.clone()));
        }
        if let Some(d) = &p.default {
            s.insert("default".into(), d.clone());
        }
        if p.required {
            required.push(Value::String(p.name.clone()));
        }
        properties.insert(p.name.clone(), Value::Object(s));
    }
    let description = format!(
        "{} A JSON list of records comes back stored as a table: you get a dataRef, the \
         schema, row count and a small sample; pass the dataRef on. Other answers come back \
         as they are.",
        c.description.trim()
    );
    ToolSpec {
        name: c.name.clone(),
        title: None,
        description,
        input_schema: json!({
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": false,
        }),
        output_schema: None,
        annotations: ToolAnnotations {
            read_only: c.read_only,
            open_world: true,
        },
        ui: dataref_protocol::ToolUi::default(),
    }
}

/// A value as it goes into a path, a query or a header: strings as they are, other
/// values as their JSON text.
fn scalar_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Every byte outside RFC 3986's unreserved set (`A-Z a-z 0-9 - . _ ~`) as `%XX`, so a
/// value is exactly one path segment (`/`, `?`, `#`, `%` and spaces included).
fn encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The API's own words from an error body: `message`, `error`, `detail`, `title` or
/// `error_description` of a JSON object (nested one level for `error`), else the text;
/// cut.
fn api_message(body: &[u8]) -> Option<String> {
    if let Ok(Value::Object(o)) = serde_json::from_slice::<Value>(body) {
        for k in ["message", "error", "detail", "title", "error_description"] {
            match o.get(k) {
                Some(Value::String(s)) if !s.trim().is_empty() => {
                    return Some(truncate_chars(s.trim(), EXCERPT_CHARS));
                }
                Some(Value::Object(inner)) => {
                    if let Some(Value::String(s)) = inner.get("message") {
                        return Some(truncate_chars(s.trim(), EXCERPT_CHARS));
                    }
                }
                _ => {}
            }
        }
    }
    let text = String::from_utf8_lossy(body);
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    (!text.is_empty()).then(|| truncate_chars(&text, EXCERPT_CHARS))
}

fn seconds(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{} ms", d.as_millis())
    }
}

/// An error and its sources, each once, joined with `: ` (without the URL).
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(e);
    while let Some(err) = next {
        let text = match err.downcast_ref::<reqwest::Error>() {
            Some(r) if r.url().is_some() => {
                // Only the kind: reqwest's own text would name the URL.
                if r.is_timeout() {
                    "timed out".to_owned()
                } else if r.is_connect() {
                    "connection failed".to_owned()
                } else if r.is_body() || r.is_decode() {
                    "reading the answer failed".to_owned()
                } else {
                    "request failed".to_owned()
                }
            }
            _ => err.to_string(),
        };
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = err.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_encoded_outside_the_unreserved_set() {
        assert_eq!(encode_segment("a/b?c#d e"), "a%2Fb%3Fc%23d%20e");
        assert_eq!(encode_segment("%2e%2e"), "%252e%252e");
        assert_eq!(encode_segment("Zü-._~"), "Z%C3%BC-._~");
    }

    #[test]
    fn api_messages_are_found_and_cut() {
        assert_eq!(
            api_message(br#"{"error": {"message": "no such customer"}}"#).as_deref(),
            Some("no such customer")
        );
        assert_eq!(
            api_message(b"<h1>Not\n  Found</h1>").as_deref(),
            Some("<h1>Not Found</h1>")
        );
        assert_eq!(api_message(b"").as_deref(), None);
        let long = "x".repeat(1000);
        assert_eq!(
            api_message(long.as_bytes()).map(|m| m.chars().count()),
            Some(EXCERPT_CHARS + 1)
        );
    }
}
