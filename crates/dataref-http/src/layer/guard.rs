//! `Host` and `Origin` checks on every route, against DNS rebinding: a page on another
//! site must not reach a server on this machine (or on an internal network) through a
//! name that resolves here.
//!
//! Hosts: `[http] allowed_hosts` when given, else the loopback names and the host of the
//! public URL; an entry without a port matches any port. Origins: `allowed_origins` when
//! given, else the origin of the public URL; `host:*` matches any port, `null` the
//! browser's `Origin: null`. A request without `Origin` (not from a browser) passes.
//!
//! Each header is judged once: a request with two `Host` or two `Origin` headers is refused
//! (400) rather than served by whichever copy a check happens to read. A request target in
//! absolute form (`GET http://name/…`) names the host itself (RFC 9112 §3.2.2 puts it above
//! `Host`), so it must name the same host as `Host`, which is then checked as usual.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use dataref_config::HttpConfig;
use dataref_protocol::truncate_echo as truncate;
use http::{HeaderMap, StatusCode, Uri, header};

use crate::response::{error, refused_unread};

/// The layer, on every route: a request the guard refuses is answered here.
pub(crate) async fn check(
    State(guard): State<Arc<Guard>>,
    request: Request,
    next: Next,
) -> Response {
    match guard.check(request.uri(), request.headers()) {
        Ok(()) => next.run(request).await,
        Err(refused) => refused_unread(request.headers(), refused.response()),
    }
}

pub(crate) struct Guard {
    hosts: Vec<(String, Option<u16>)>,
    origins: Vec<Origin>,
}

#[derive(Debug, PartialEq)]
enum Origin {
    Null,
    Site {
        scheme: String,
        host: String,
        /// `None`: any port.
        port: Option<u16>,
    },
}

pub(crate) enum Refused {
    Host(String),
    Origin(String),
    /// The header, sent more than once.
    Repeated(header::HeaderName),
    /// The authority of an absolute-form target and the `Host` header, which differ.
    TargetNotHost {
        target: String,
        host: String,
    },
}

impl Guard {
    pub(crate) fn new(http: &HttpConfig, public_url: &str) -> Self {
        let public = parse_origin(public_url);
        let hosts = if http.allowed_hosts.is_empty() {
            let mut hosts: Vec<(String, Option<u16>)> = ["localhost", "127.0.0.1", "::1"]
                .iter()
                .map(|h| ((*h).to_owned(), None))
                .collect();
            if let Some(Origin::Site { host, .. }) = &public {
                hosts.push((host.clone(), None));
            }
            hosts
        } else {
            http.allowed_hosts
                .iter()
                .filter_map(|h| split_authority(h))
                .collect()
        };
        let origins = if http.allowed_origins.is_empty() {
            public.into_iter().collect()
        } else {
            http.allowed_origins
                .iter()
                .filter_map(|o| parse_origin(o))
                .collect()
        };
        Self { hosts, origins }
    }

    pub(crate) fn check(&self, uri: &Uri, headers: &HeaderMap) -> Result<(), Refused> {
        for name in [header::HOST, header::ORIGIN] {
            if headers.get_all(&name).iter().nth(1).is_some() {
                return Err(Refused::Repeated(name));
            }
        }
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or_default();
        if let Some(target) = uri.authority() {
            let same = split_authority(target.as_str())
                .is_some_and(|t| split_authority(host).is_some_and(|h| h == t));
            if !same {
                return Err(Refused::TargetNotHost {
                    target: target.as_str().to_owned(),
                    host: host.to_owned(),
                });
            }
        }
        let allowed = split_authority(host).is_some_and(|(name, port)| {
            self.hosts
                .iter()
                .any(|(h, p)| *h == name && (p.is_none() || *p == port))
        });
        if !allowed {
            return Err(Refused::Host(host.to_owned()));
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            let text = origin.to_str().unwrap_or_default();
            let allowed =
                parse_origin(text).is_some_and(|o| self.origins.iter().any(|a| matches(a, &o)));
            if !allowed {
                return Err(Refused::Origin(text.to_owned()));
            }
        }
        Ok(())
    }
}

impl Refused {
    fn response(&self) -> Response {
        let (message, hint) = match self {
            Self::Repeated(name) => {
                return bad_request(
                    format!("the request has more than one `{name}` header"),
                    &format!("send `{name}` once (a proxy in between may be adding a second one)"),
                );
            }
            Self::TargetNotHost { target, host } => {
                return bad_request(
                    format!(
                        "the request target names the host `{}` but `Host` is `{}`",
                        truncate(target),
                        truncate(host)
                    ),
                    "send the path only (`GET /mcp`), or name the same host in both",
                );
            }
            Self::Host(h) => (
                format!("the `Host` `{}` is not served here", truncate(h)),
                "reach the server by one of its names, or add this one to `[http] allowed_hosts` (set `public_url` for a public name)",
            ),
            Self::Origin(o) => (
                format!("requests from the origin `{}` are not allowed", truncate(o)),
                "add the web app's origin to `[http] allowed_origins` (e.g. `https://app.example.com`)",
            ),
        };
        tracing::warn!(%message, "refused a request (possible DNS rebinding)");
        error(StatusCode::FORBIDDEN, "forbidden", message, hint)
    }
}

/// A malformed request (not a rebinding attempt): `400` with the message and a hint.
fn bad_request(message: String, hint: &str) -> Response {
    tracing::warn!(%message, "refused a request");
    error(StatusCode::BAD_REQUEST, "bad_request", message, hint)
}

fn matches(allowed: &Origin, origin: &Origin) -> bool {
    match (allowed, origin) {
        (Origin::Null, Origin::Null) => true,
        (
            Origin::Site { scheme, host, port },
            Origin::Site {
                scheme: s,
                host: h,
                port: p,
            },
        ) => scheme == s && host == h && (port.is_none() || port == p),
        (Origin::Null, Origin::Site { .. }) | (Origin::Site { .. }, Origin::Null) => false,
    }
}

/// `scheme://host[:port]` (a path is ignored), lower-cased, the default port filled in;
/// `:*` is any port.
fn parse_origin(text: &str) -> Option<Origin> {
    if text == "null" {
        return Some(Origin::Null);
    }
    let (scheme, rest) = text.split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    let authority = rest.split('/').next()?;
    let (host, port) = if let Some(h) = authority.strip_suffix(":*") {
        (split_authority(h)?.0, None)
    } else {
        let (host, port) = split_authority(authority)?;
        let default = match scheme.as_str() {
            "https" => Some(443),
            "http" => Some(80),
            _ => None,
        };
        (host, port.or(default))
    };
    Some(Origin::Site { scheme, host, port })
}

/// `host[:port]` or `[v6][:port]`: the host lower-cased without brackets, and the port.
fn split_authority(text: &str) -> Option<(String, Option<u16>)> {
    if text.is_empty() {
        return None;
    }
    if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p.parse().ok()?),
            None if after.is_empty() => None,
            None => return None,
        };
        return Some((host.to_ascii_lowercase(), port));
    }
    match text.rsplit_once(':') {
        // More than one `:` without brackets: a bare IPv6 address (config entries).
        Some((host, _)) if host.contains(':') => Some((text.to_ascii_lowercase(), None)),
        Some((host, port)) => Some((host.to_ascii_lowercase(), Some(port.parse().ok()?))),
        None => Some((text.to_ascii_lowercase(), None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(hosts: &[&str], origins: &[&str], public: &str) -> Guard {
        let http = HttpConfig {
            allowed_hosts: hosts.iter().map(|s| (*s).to_owned()).collect(),
            allowed_origins: origins.iter().map(|s| (*s).to_owned()).collect(),
            ..HttpConfig::default()
        };
        Guard::new(&http, public)
    }

    fn check(g: &Guard, host: &str, origin: Option<&str>) -> bool {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, host.parse().unwrap());
        if let Some(o) = origin {
            h.insert(header::ORIGIN, o.parse().unwrap());
        }
        g.check(&Uri::from_static("/mcp"), &h).is_ok()
    }

    #[test]
    fn repeated_headers_and_foreign_targets_are_refused() {
        let g = guard(&[], &[], "http://127.0.0.1:8750");
        let mut h = HeaderMap::new();
        h.append(header::HOST, "127.0.0.1:8750".parse().unwrap());
        let path = Uri::from_static("/files/a.csv");
        assert!(g.check(&path, &h).is_ok());
        h.append(header::ORIGIN, "http://127.0.0.1:8750".parse().unwrap());
        h.append(header::ORIGIN, "https://evil.example.com".parse().unwrap());
        assert!(matches!(g.check(&path, &h), Err(Refused::Repeated(n)) if n == header::ORIGIN));
        h.remove(header::ORIGIN);
        h.append(header::HOST, "evil.example.com".parse().unwrap());
        assert!(matches!(g.check(&path, &h), Err(Refused::Repeated(n)) if n == header::HOST));
        h.remove(header::HOST);
        h.append(header::HOST, "127.0.0.1:8750".parse().unwrap());
        let foreign = Uri::from_static("http://evil.example.com/files/a.csv");
        assert!(matches!(
            g.check(&foreign, &h),
            Err(Refused::TargetNotHost { .. })
        ));
        let same = Uri::from_static("http://127.0.0.1:8750/files/a.csv");
        assert!(g.check(&same, &h).is_ok());
    }

    #[test]
    fn defaults_are_loopback_and_the_public_url() {
        let g = guard(&[], &[], "https://dataref.example.com");
        assert!(check(&g, "127.0.0.1:8750", None));
        assert!(check(&g, "localhost", None));
        assert!(check(&g, "[::1]:8750", None));
        assert!(check(&g, "DataRef.example.com", None));
        assert!(!check(&g, "evil.example.com", None));
        assert!(!check(&g, "", None));
        assert!(check(
            &g,
            "dataref.example.com",
            Some("https://dataref.example.com")
        ));
        assert!(check(
            &g,
            "dataref.example.com",
            Some("https://dataref.example.com:443")
        ));
        assert!(!check(
            &g,
            "dataref.example.com",
            Some("http://dataref.example.com")
        ));
        assert!(!check(
            &g,
            "dataref.example.com",
            Some("https://evil.example.com")
        ));
        assert!(!check(&g, "dataref.example.com", Some("null")));
    }

    #[test]
    fn configured_lists_replace_the_defaults() {
        let g = guard(
            &["mcp.internal:9000", "10.0.0.5"],
            &["http://localhost:*", "null"],
            "http://127.0.0.1:9000",
        );
        assert!(check(&g, "mcp.internal:9000", None));
        assert!(!check(&g, "mcp.internal:9001", None));
        assert!(check(&g, "10.0.0.5:1", None));
        assert!(!check(&g, "127.0.0.1:9000", None));
        assert!(check(&g, "10.0.0.5", Some("http://localhost:3000")));
        assert!(check(&g, "10.0.0.5", Some("null")));
        assert!(!check(&g, "10.0.0.5", Some("https://localhost:3000")));
    }
}
