//! Routing by path, then method, to the stacks [`crate::pipeline::build`] made; the MCP
//! endpoint; the RFC 9728 metadata; 404 and 405.
//!
//! - `/.well-known/oauth-protected-resource` (and `…/mcp`): GET and HEAD, no token;
//! - `/mcp`: every method (rmcp answers), through [`mcp`];
//! - `/files/sign`: POST, through [`crate::files::sign`];
//! - `/files/{path}`: GET, through [`crate::files::download`];
//! - `/agent/…` and `/v1/chat/completions`, `/v1/models`: the agent
//!   ([`crate::agent_api`], [`crate::openai_facade`]); a request that starts a run takes an
//!   in-flight slot like a tool call, the others do not (an approval must get through
//!   while its run holds the slot);
//! - `/ready`: GET and HEAD, no token: 200 while this replica reaches what it shares
//!   ([`crate::Readiness`]), else 503;
//! - `/`: GET and HEAD, the page ([`crate::page`]): static, so no token; what it shows
//!   it asks `/mcp` and `/agent/…` for with the person's token;
//! - anything else: 404 naming the MCP endpoint.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use dataref_protocol::percent_decode;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::json;
use tower_layer::Layer;
use tower_service::Service;

use crate::body::{Body, Deadline};
use crate::pipeline::{BoxFuture, NotAwaited, PipelineService, answer};
use crate::server::State;
use crate::{MCP_PATH, METADATA_PATH, READY_PATH, json_response};

/// The workspace path of `GET /files/{path}`, percent-decoded, in the request's
/// extensions for the download stack.
#[derive(Clone)]
pub(crate) struct FilePath(pub(crate) String);

/// The routes past the guard and the open-request count.
#[derive(Clone)]
pub(crate) struct Routes<M, S, D, A, R> {
    pub(crate) mcp: M,
    pub(crate) sign: S,
    pub(crate) download: D,
    /// The agent routes that start no run.
    pub(crate) agent: A,
    /// The agent routes that start a run (a slot is held for it).
    pub(crate) agent_run: R,
}

impl<M, S, D, A, R> Service<Request<Incoming>> for Routes<M, S, D, A, R>
where
    M: PipelineService<Incoming>,
    S: PipelineService<Incoming>,
    D: PipelineService<Incoming>,
    A: PipelineService<Incoming>,
    R: PipelineService<Incoming>,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<Incoming>) -> BoxFuture {
        let path = request.uri().path().to_owned();
        if path == "/" {
            return answer(crate::page::respond(&request));
        }
        if path == MCP_PATH {
            return self.mcp.call(request);
        }
        if path == "/files/sign" {
            return match *request.method() {
                Method::POST => self.sign.call(request),
                _ => answer(method_not_allowed("POST")),
            };
        }
        if let Some(route) = crate::agent_api::Route::parse(&path) {
            if !route.allows_method(request.method()) {
                return answer(method_not_allowed(route.allows()));
            }
            let run = route.starts_run(request.method());
            request.extensions_mut().insert(route);
            return if run {
                self.agent_run.call(request)
            } else {
                self.agent.call(request)
            };
        }
        if let Some(rest) = path.strip_prefix("/files/") {
            if request.method() != Method::GET {
                return answer(method_not_allowed("GET"));
            }
            let Some(decoded) = percent_decode(rest).and_then(|b| String::from_utf8(b).ok()) else {
                return answer(crate::files::not_found());
            };
            request.extensions_mut().insert(FilePath(decoded));
            return self.download.call(request);
        }
        answer(json_response(
            StatusCode::NOT_FOUND,
            json!({
                "error": "not_found",
                "message": format!("nothing is served at `{}`", dataref_protocol::truncate_echo(&path)),
                "hint": format!("the MCP endpoint is `{MCP_PATH}`"),
            }),
        ))
    }
}

/// `/.well-known/oauth-protected-resource` (and `…/mcp`), answered before anything is
/// counted or authenticated; every other path goes on.
#[derive(Clone)]
pub(crate) struct WellKnownLayer(pub(crate) Arc<State>);

impl<S> Layer<S> for WellKnownLayer {
    type Service = WellKnown<S>;

    fn layer(&self, inner: S) -> Self::Service {
        WellKnown {
            state: self.0.clone(),
            inner,
        }
    }
}

#[derive(Clone)]
pub(crate) struct WellKnown<S> {
    state: Arc<State>,
    inner: S,
}

impl<S: PipelineService<Incoming>> Service<Request<Incoming>> for WellKnown<S> {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Incoming>) -> BoxFuture {
        let path = request.uri().path();
        if path == READY_PATH {
            return match *request.method() {
                Method::GET | Method::HEAD => ready(self.state.clone()),
                _ => answer(method_not_allowed("GET")),
            };
        }
        if path == METADATA_PATH || path == format!("{METADATA_PATH}{MCP_PATH}") {
            return answer(match *request.method() {
                Method::GET | Method::HEAD => metadata(&self.state, path),
                _ => method_not_allowed("GET"),
            });
        }
        self.inner.call(request)
    }
}

/// `/mcp`, past authentication, limits and the session check: rmcp, through the
/// JSON-RPC body check of [`dataref_mcp::StreamableHttp`].
pub(crate) fn mcp(state: Arc<State>, request: Request<Deadline>) -> BoxFuture {
    Box::pin(async move {
        let method = request.method().clone();
        let response = state.mcp.handle(request).await;
        let (parts, inner) = response.into_parts();
        let mut response = Response::from_parts(
            parts,
            inner.map_err(|never: Infallible| match never {}).boxed(),
        );
        // A GET is the session's notification stream, open as long as the session: not a
        // request a shutdown should wait for.
        if method == Method::GET {
            response.extensions_mut().insert(NotAwaited);
        }
        Ok(response)
    })
}

/// How long one answer of the readiness check serves every `/ready` after it.
const READY_FOR: std::time::Duration = std::time::Duration::from_secs(1);

/// `GET /ready`: 200 while this replica reaches what it shares, else 503 saying what it
/// cannot reach (no token: a balancer's health check has none). Anyone who reaches the
/// port may ask, so the check runs at most once a second, whoever asks how often (those
/// who ask meanwhile wait for it and share its answer), and the answer names what is out
/// of reach, never how (the details are in the log).
fn ready(state: Arc<State>) -> BoxFuture {
    Box::pin(async move {
        let checked = match &state.readiness {
            None => Ok(()),
            Some(readiness) => {
                let mut last = state.last_ready.lock().await;
                match &*last {
                    Some((at, answer)) if at.elapsed() < READY_FOR => answer.clone(),
                    _ => {
                        let answer = readiness.check().await;
                        *last = Some((std::time::Instant::now(), answer.clone()));
                        answer
                    }
                }
            }
        };
        Ok(match checked {
            Ok(()) => json_response(StatusCode::OK, json!({"ready": true})),
            Err(reason) => {
                let mut r = json_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    json!({
                        "ready": false,
                        "error": "not_ready",
                        "message": reason,
                        "hint": "this replica cannot reach the shared store now; a balancer \
                                 should send requests to another until it can",
                    }),
                );
                r.headers_mut()
                    .insert(header::RETRY_AFTER, header::HeaderValue::from(5));
                r
            }
        })
    })
}

/// RFC 9728 protected-resource metadata. `resource` is the URL this document describes:
/// the server for the bare path, the MCP endpoint for the `/mcp`-suffixed one.
fn metadata(state: &State, path: &str) -> Response<Body> {
    let resource = if path.ends_with(MCP_PATH) {
        format!("{}{MCP_PATH}", state.public_url)
    } else {
        state.public_url.clone()
    };
    let mut doc = json!({
        "resource": resource,
        "bearer_methods_supported": ["header"],
        "resource_name": "dataref",
    });
    if let Some(issuer) = state.auth.issuer() {
        doc["authorization_servers"] = json!([issuer]);
    }
    json_response(StatusCode::OK, doc)
}

fn method_not_allowed(allowed: &'static str) -> Response<Body> {
    let mut r = json_response(
        StatusCode::METHOD_NOT_ALLOWED,
        json!({
            "error": "method_not_allowed",
            "message": format!("this path answers {allowed} only"),
        }),
    );
    r.headers_mut()
        .insert(header::ALLOW, header::HeaderValue::from_static(allowed));
    r
}
