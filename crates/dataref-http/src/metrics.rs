//! The metrics: [`measure`], the layer that counts every request of `serve --http` by
//! route and status, and [`MetricsEndpoint`], the Prometheus endpoint on a port of its own
//! (`[metrics]`), which `dataref serve` starts over stdio and over HTTP alike.
//!
//! The endpoint answers `GET` (and `HEAD`) on its one path with
//! [`dataref_ops::metrics::render`]; with a `token` configured, a scrape without
//! `Authorization: Bearer <token>` gets 401 before anything else is looked at.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use dataref_config::metrics::MetricsConfig;
use dataref_ops::metrics;
use http::{HeaderValue, Method, StatusCode, header};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use ring::digest;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::error::{HttpError, expand_setting};

/// A scrape's headers must arrive within this.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// The layer over every route: the request counted by its route template (never the raw
/// path; `unmatched` for the 404 fallback) and status, and the time to its response's head.
pub(crate) async fn measure(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let route = request.extensions().get::<MatchedPath>().cloned();
    let response = next.run(request).await;
    metrics::http_request(
        route.as_ref().map_or("unmatched", MatchedPath::as_str),
        response.status().as_u16(),
        started.elapsed().as_secs_f64(),
    );
    response
}

/// What a scrape must match.
#[derive(Debug)]
struct Scrape {
    path: String,
    /// SHA-256 of the token (compared as digests, so the comparison's time says nothing of
    /// the token).
    token_sha256: Option<digest::Digest>,
    /// The address bound: without a token, a scrape must name it or a loopback name as
    /// its `Host` (a web page the person opened cannot read the metrics through a name
    /// it made resolve to 127.0.0.1).
    listen: std::net::IpAddr,
}

/// The Prometheus endpoint, bound; [`Self::serve`] runs it.
#[derive(Debug)]
pub struct MetricsEndpoint {
    listener: std::net::TcpListener,
    local: SocketAddr,
    scrape: Arc<Scrape>,
}

/// Everything [`MetricsEndpoint::bind`] refuses short of binding: a `token` whose
/// `${NAME}` is unset or malformed. `dataref doctor` calls it.
pub fn validate_metrics(config: &MetricsConfig) -> Result<(), HttpError> {
    scrape_of(config, &dataref_config::env::process).map(drop)
}

fn scrape_of(
    config: &MetricsConfig,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Scrape, HttpError> {
    let token_sha256 = match &config.token {
        None => None,
        Some(t) => {
            let t = expand_setting("metrics.token", t, lookup)?;
            if t.trim().is_empty() {
                return Err(HttpError::Setting {
                    key: "metrics.token",
                    message: "is empty once expanded".into(),
                    hint: "set the variable it names to a long random string".into(),
                });
            }
            Some(digest::digest(&digest::SHA256, t.as_bytes()))
        }
    };
    Ok(Scrape {
        path: config.path.clone(),
        token_sha256,
        listen: config.listen.ip(),
    })
}

impl MetricsEndpoint {
    /// Expands the token (`${NAME}` from the environment) and binds `config.listen`. Needs
    /// no runtime: a server binds it before anything else starts, so a port in use stops
    /// the start with nothing to take down.
    pub fn bind(config: &MetricsConfig) -> Result<Self, HttpError> {
        let scrape = scrape_of(config, &dataref_config::env::process)?;
        let bind_error = |source| HttpError::Bind {
            addr: config.listen,
            source,
        };
        let listener = std::net::TcpListener::bind(config.listen).map_err(bind_error)?;
        listener.set_nonblocking(true).map_err(bind_error)?;
        let local = listener.local_addr().map_err(bind_error)?;
        Ok(Self {
            listener,
            local,
            scrape: Arc::new(scrape),
        })
    }

    /// The address bound (the port of `:0` filled in).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// `http://<addr><path>`.
    pub fn url(&self) -> String {
        format!("http://{}{}", self.local, self.scrape.path)
    }

    /// Serves scrapes until `shutdown` is cancelled. A scrape in progress is dropped then:
    /// there is nothing to finish.
    pub async fn serve(self, shutdown: CancellationToken) {
        let listener = match TcpListener::from_std(self.listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!("metrics: cannot serve on {}: {e}", self.local);
                return;
            }
        };
        let service = TowerToHyperService::new(
            axum::Router::new()
                .fallback(scrape)
                .with_state(self.scrape.clone()),
        );
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let stream = match accepted {
                        Ok((stream, _)) => stream,
                        Err(e) => {
                            tracing::warn!("metrics: accepting a connection failed: {e}");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    let connection = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(HEADER_TIMEOUT)
                        .serve_connection(TokioIo::new(stream), service.clone());
                    let stop = shutdown.clone();
                    tokio::spawn(async move {
                        tokio::select! {
                            r = connection => if let Err(e) = r {
                                tracing::debug!("metrics: a connection ended with an error: {e}");
                            },
                            () = stop.cancelled() => {}
                        }
                    });
                }
                () = shutdown.cancelled() => return,
            }
        }
    }
}

/// One request to the endpoint: the token first, then the path and the method.
async fn scrape(State(scrape): State<Arc<Scrape>>, request: Request) -> Response {
    if let Some(expected) = &scrape.token_sha256 {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| digest::digest(&digest::SHA256, token.trim().as_bytes()));
        if given.as_ref().map(digest::Digest::as_ref) != Some(expected.as_ref()) {
            let mut r = text(
                StatusCode::UNAUTHORIZED,
                "this metrics endpoint needs a bearer token\n\
                 hint: set `authorization.credentials` in Prometheus's scrape config to `[metrics] token`\n",
            );
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"dataref metrics\""),
            );
            return r;
        }
    }
    if scrape.token_sha256.is_none() && !host_is_ours(&request, scrape.listen) {
        return text(
            StatusCode::MISDIRECTED_REQUEST,
            "this metrics endpoint answers only requests that name it by its address or \
             `localhost`\nhint: scrape it at its address, or set `[metrics] token`\n",
        );
    }
    if request.uri().path() != scrape.path {
        return text(
            StatusCode::NOT_FOUND,
            &format!("not found\nhint: the metrics are at `{}`\n", scrape.path),
        );
    }
    let head = request.method() == Method::HEAD;
    if request.method() != Method::GET && !head {
        let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n");
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    // The collectors may query the index: off the async workers.
    let body = match tokio::task::spawn_blocking(metrics::render).await {
        Ok(body) => body,
        Err(e) => {
            tracing::error!("metrics: rendering failed: {e}");
            return text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the metrics could not be rendered; the details are in the server log\n",
            );
        }
    };
    let mut r = Response::new(if head {
        Body::empty()
    } else {
        Body::from(body)
    });
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(metrics::CONTENT_TYPE),
    );
    r
}

/// The request's `Host` is a loopback name or address, or the address bound.
fn host_is_ours(request: &Request, listen: std::net::IpAddr) -> bool {
    let Some(host) = request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    // `name:port`, `[v6]:port`, or either without the port.
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split_once(']').map_or(rest, |(ip, _)| ip),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    if name.eq_ignore_ascii_case("localhost") {
        return true;
    }
    name.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback() || ip == listen)
}

fn text(status: StatusCode, body: &str) -> Response {
    let mut r = Response::new(Body::from(body.to_owned()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(token: Option<&str>) -> MetricsConfig {
        MetricsConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            path: "/metrics".into(),
            token: token.map(Into::into),
        }
    }

    #[test]
    fn without_a_token_only_our_own_names_are_answered() {
        let local: std::net::IpAddr = [127, 0, 0, 1].into();
        let with_host = |host: Option<&str>| {
            let mut b = http::Request::builder().uri("/metrics");
            if let Some(h) = host {
                b = b.header(header::HOST, h);
            }
            b.body(Body::empty()).unwrap()
        };
        for ours in [
            "127.0.0.1:9464",
            "localhost:9464",
            "LOCALHOST",
            "[::1]:9464",
            "127.0.0.1",
        ] {
            assert!(host_is_ours(&with_host(Some(ours)), local), "{ours}");
        }
        for theirs in [
            "rebound.example:9464",
            "10.0.0.5:9464",
            "127.0.0.1.nip.io:9464",
            "",
        ] {
            assert!(!host_is_ours(&with_host(Some(theirs)), local), "{theirs}");
        }
        assert!(!host_is_ours(&with_host(None), local));
        // Bound to a private address (with a token, which config requires): that address.
        let private: std::net::IpAddr = [10, 0, 0, 5].into();
        assert!(host_is_ours(&with_host(Some("10.0.0.5:9464")), private));
    }

    #[test]
    fn the_token_is_expanded_and_an_unset_variable_is_named() {
        let lookup = |n: &str| (n == "T").then(|| "s3cret".to_owned());
        let s = scrape_of(&config(Some("${T}")), &lookup).unwrap();
        assert_eq!(
            s.token_sha256.unwrap().as_ref(),
            digest::digest(&digest::SHA256, b"s3cret").as_ref()
        );
        let e = scrape_of(&config(Some("${NOPE}")), &lookup).unwrap_err();
        assert!(e.to_string().contains("`${NOPE}`"), "{e}");
        assert!(e.hint().contains("set `NOPE`"), "{}", e.hint());
    }
}
