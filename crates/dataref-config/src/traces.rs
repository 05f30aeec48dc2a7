//! `[traces]`: spans exported as OpenTelemetry traces over OTLP/HTTP to a collector, when
//! `endpoint` is set.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::Deserialize;

use crate::env::{ExpandError, expand};
use crate::error::{ConfigError, invalid};

/// `[traces]`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTraces {
    /// The OTLP/HTTP collector's base URL (e.g. `"http://127.0.0.1:4318"`, the
    /// OpenTelemetry Collector's, Jaeger's or Tempo's OTLP/HTTP port); spans are posted as
    /// protobuf to `/v1/traces` under it. Without it no traces are exported.
    pub endpoint: Option<String>,
    /// The `service.name` the spans are exported under. Default `dataref`.
    pub service_name: Option<String>,
    /// HTTP headers sent with every export, e.g. a vendor's API key: `headers =
    /// { "x-api-key" = "${TRACES_API_KEY}" }` (`${NAME}` is read from the environment at
    /// start).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Put the text people and models wrote in spans: SQL, prompts and error messages.
    /// Default false: spans carry names, sizes, counts, durations and outcomes, never a
    /// query's text, a prompt or a row.
    pub include_text: Option<bool>,
    /// The share of traces exported, from 0.0 to 1.0, decided at each trace's root (an MCP
    /// request, an agent run). Default 1.0: all.
    pub sample: Option<f64>,
}

/// Where spans are exported.
#[derive(Debug, Clone, PartialEq)]
pub struct TracesConfig {
    /// The collector's base URL, without a trailing `/`.
    pub endpoint: String,
    /// Default `dataref`.
    pub service_name: String,
    /// Header names and values, `${NAME}` not yet expanded ([`TracesConfig::headers`]
    /// expands them).
    pub headers: BTreeMap<String, String>,
    /// Default false.
    pub include_text: bool,
    /// 0.0–1.0; default 1.0.
    pub sample: f64,
}

impl TracesConfig {
    /// The headers with `${NAME}` expanded by `lookup`.
    pub fn headers(
        &self,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Vec<(String, String)>, ConfigError> {
        self.headers
            .iter()
            .map(|(name, value)| {
                let expanded = expand(value, lookup).map_err(|e| match e {
                    ExpandError::Unset(var) => invalid(
                        format!("traces.headers.{name}"),
                        format!("`${{{var}}}` is not set in the environment"),
                        format!("set `{var}` before starting dataref, or remove the header"),
                    ),
                    ExpandError::Malformed(why) => invalid(
                        format!("traces.headers.{name}"),
                        why,
                        "write `${NAME}` for a variable, `$$` for a literal `$`",
                    ),
                })?;
                Ok((name.clone(), expanded))
            })
            .collect()
    }
}

/// The default `service_name`.
pub const SERVICE_NAME: &str = "dataref";

/// `None` when `[traces]` has no `endpoint`.
pub(crate) fn resolve_traces(raw: RawTraces) -> Result<Option<TracesConfig>, ConfigError> {
    let Some(endpoint) = raw.endpoint else {
        if raw.service_name.is_some()
            || !raw.headers.is_empty()
            || raw.include_text.is_some()
            || raw.sample.is_some()
        {
            return Err(invalid(
                "traces",
                "settings are given but `endpoint` is not, so no traces would be exported",
                "add `endpoint = \"http://127.0.0.1:4318\"` (an OTLP/HTTP collector), or remove the `[traces]` table",
            ));
        }
        return Ok(None);
    };
    let endpoint = endpoint.trim_end_matches('/').to_owned();
    let host = endpoint
        .strip_prefix("http://")
        .or_else(|| endpoint.strip_prefix("https://"));
    if host.is_none_or(|h| h.is_empty() || h.chars().any(char::is_whitespace)) {
        return Err(invalid(
            "traces.endpoint",
            format!("`{endpoint}` is not an http:// or https:// URL"),
            "e.g. `endpoint = \"http://127.0.0.1:4318\"` (the collector's OTLP/HTTP port; spans go to `/v1/traces` under it)",
        ));
    }
    if endpoint.ends_with("/v1/traces") {
        return Err(invalid(
            "traces.endpoint",
            "is the base URL; `/v1/traces` is added to it",
            format!(
                "write `endpoint = \"{}\"`",
                endpoint.trim_end_matches("/v1/traces")
            ),
        ));
    }
    let service_name = raw.service_name.unwrap_or_else(|| SERVICE_NAME.to_owned());
    if service_name.trim().is_empty() {
        return Err(invalid(
            "traces.service_name",
            "is empty",
            "leave it out for `dataref`, or name the deployment",
        ));
    }
    for (name, value) in &raw.headers {
        let valid_name = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !valid_name {
            return Err(invalid(
                format!("traces.headers.{name}"),
                "is not an HTTP header name",
                "header names are letters, digits, `-` and `_`, e.g. `x-api-key`",
            ));
        }
        // Catch a malformed `${…}` now; an unset variable is an error at start.
        if let Err(ExpandError::Malformed(why)) = expand(value, &|_| Some(String::new())) {
            return Err(invalid(
                format!("traces.headers.{name}"),
                why,
                "write `${NAME}` for a variable, `$$` for a literal `$`",
            ));
        }
    }
    let sample = raw.sample.unwrap_or(1.0);
    if !(0.0..=1.0).contains(&sample) {
        return Err(invalid(
            "traces.sample",
            format!("{sample} is not between 0.0 and 1.0"),
            "e.g. `sample = 0.1` to export one trace in ten; the default 1.0 exports all",
        ));
    }
    Ok(Some(TracesConfig {
        endpoint,
        service_name,
        headers: raw.headers,
        include_text: raw.include_text.unwrap_or(false),
        sample,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Option<TracesConfig>, ConfigError> {
        resolve_traces(toml::from_str(text).unwrap())
    }

    #[test]
    fn off_without_an_endpoint_and_defaults_with_one() {
        assert_eq!(parse("").unwrap(), None);
        let t = parse("endpoint = \"http://127.0.0.1:4318/\"")
            .unwrap()
            .unwrap();
        assert_eq!(t.endpoint, "http://127.0.0.1:4318");
        assert_eq!(t.service_name, "dataref");
        assert!(!t.include_text);
        assert!((t.sample - 1.0).abs() < f64::EPSILON);
    }

    #[test]
    fn headers_expand_from_the_environment() {
        let t =
            parse("endpoint = \"https://otlp.example\"\nheaders = { \"x-api-key\" = \"${KEY}\" }")
                .unwrap()
                .unwrap();
        let env = |n: &str| (n == "KEY").then(|| "s3cret".to_owned());
        assert_eq!(
            t.headers(&env).unwrap(),
            [("x-api-key".to_owned(), "s3cret".to_owned())]
        );
        let err = t.headers(&|_| None).unwrap_err().to_string();
        assert!(err.contains("`${KEY}` is not set"), "{err}");
    }

    #[test]
    fn bad_settings_are_errors_with_a_hint() {
        for (text, needle) in [
            ("sample = 0.5", "`endpoint` is not"),
            ("endpoint = \"127.0.0.1:4318\"", "not an http"),
            (
                "endpoint = \"http://c:4318/v1/traces\"",
                "`/v1/traces` is added",
            ),
            ("endpoint = \"http://c\"\nsample = 1.5", "not between"),
            (
                "endpoint = \"http://c\"\nheaders = { \"a b\" = \"x\" }",
                "header name",
            ),
            (
                "endpoint = \"http://c\"\nheaders = { a = \"${A\" }",
                "closing",
            ),
            ("endpoint = \"http://c\"\nservice_name = \" \"", "is empty"),
        ] {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.contains(needle), "{text}: {err}");
            assert!(err.contains("hint:"), "{text}: {err}");
        }
    }
}
