//! `[metrics]`: the Prometheus endpoint, on a port of its own, served by `dataref serve`
//! (stdio and `--http`) when `listen` is set.

use std::net::SocketAddr;

use schemars::JsonSchema;
use serde::Deserialize;

use crate::error::{ConfigError, invalid};

/// `[metrics]`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMetrics {
    /// The address and port the metrics endpoint listens on, apart from MCP (e.g.
    /// `"127.0.0.1:9750"`). Without it there is no metrics endpoint. An address that is
    /// not loopback needs a `token`.
    pub listen: Option<String>,
    /// The path Prometheus scrapes. Default `/metrics`.
    pub path: Option<String>,
    /// A bearer token Prometheus must send (`Authorization: Bearer <token>`; in
    /// Prometheus's scrape config, `authorization.credentials`). Write `${NAME}` to read it
    /// from the environment at start. Default: none, allowed on loopback only.
    pub token: Option<String>,
}

/// The metrics endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsConfig {
    /// Where it listens (port 0: any free port).
    pub listen: SocketAddr,
    /// The path it answers on, starting with `/`. Default `/metrics`.
    pub path: String,
    /// The bearer token a scrape must carry, `${NAME}` not yet expanded (that happens
    /// when the endpoint starts). None: no token (loopback only).
    pub token: Option<String>,
}

/// The default path.
pub const METRICS_PATH: &str = "/metrics";

/// `None` when `[metrics]` has no `listen`.
pub(crate) fn resolve_metrics(raw: RawMetrics) -> Result<Option<MetricsConfig>, ConfigError> {
    let Some(listen) = raw.listen else {
        if raw.path.is_some() || raw.token.is_some() {
            return Err(invalid(
                "metrics",
                "`path` and `token` are set but `listen` is not, so nothing would serve them",
                "add `listen = \"127.0.0.1:9750\"` (or remove the `[metrics]` table)",
            ));
        }
        return Ok(None);
    };
    let listen: SocketAddr = listen.parse().map_err(|_| {
        invalid(
            "metrics.listen",
            format!("`{listen}` is not an address and port"),
            "e.g. `listen = \"127.0.0.1:9750\"` or `\"0.0.0.0:9750\"` with a `token`",
        )
    })?;
    let path = raw.path.unwrap_or_else(|| METRICS_PATH.to_owned());
    if !path.starts_with('/')
        || path.len() < 2
        || path
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '?' || c == '#')
    {
        return Err(invalid(
            "metrics.path",
            format!("`{path}` is not a path"),
            "e.g. `path = \"/metrics\"` (the default)",
        ));
    }
    if let Some(token) = &raw.token
        && token.trim().is_empty()
    {
        return Err(invalid(
            "metrics.token",
            "is empty",
            "write `token = \"${DATAREF_METRICS_TOKEN}\"` and set that variable, or remove `token` on a loopback `listen`",
        ));
    }
    if raw.token.is_none() && !listen.ip().is_loopback() {
        return Err(invalid(
            "metrics.listen",
            format!(
                "`{listen}` is not a loopback address and `[metrics]` has no `token`, so anyone who reaches it could read the metrics"
            ),
            "set `token = \"${DATAREF_METRICS_TOKEN}\"` (and the same as `authorization.credentials` in Prometheus's scrape config), or listen on `127.0.0.1`",
        ));
    }
    Ok(Some(MetricsConfig {
        listen,
        path,
        token: raw.token,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(
        listen: Option<&str>,
        path: Option<&str>,
        token: Option<&str>,
    ) -> Result<Option<MetricsConfig>, ConfigError> {
        resolve_metrics(RawMetrics {
            listen: listen.map(Into::into),
            path: path.map(Into::into),
            token: token.map(Into::into),
        })
    }

    #[test]
    fn loopback_needs_no_token_and_other_addresses_do() {
        let m = resolve(Some("127.0.0.1:0"), None, None).unwrap().unwrap();
        assert_eq!(m.path, "/metrics");
        assert_eq!(m.token, None);
        assert!(resolve(Some("[::1]:9750"), None, None).unwrap().is_some());
        let e = resolve(Some("0.0.0.0:9750"), None, None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("not a loopback address") && e.contains("hint: set `token"),
            "{e}"
        );
        let m = resolve(Some("0.0.0.0:9750"), Some("/m"), Some("${T}"))
            .unwrap()
            .unwrap();
        assert_eq!((m.path.as_str(), m.token.as_deref()), ("/m", Some("${T}")));
    }

    #[test]
    fn bad_settings_are_errors_with_hints() {
        assert!(resolve(None, None, None).unwrap().is_none());
        for (listen, path, token, says) in [
            (None, Some("/m"), None, "`listen` is not"),
            (Some("localhost"), None, None, "not an address"),
            (Some("127.0.0.1:1"), Some("metrics"), None, "not a path"),
            (Some("127.0.0.1:1"), Some("/"), None, "not a path"),
            (Some("127.0.0.1:1"), None, Some(" "), "is empty"),
        ] {
            let e = resolve(listen, path, token).unwrap_err().to_string();
            assert!(e.contains(says) && e.contains("hint:"), "{e}");
        }
    }
}
