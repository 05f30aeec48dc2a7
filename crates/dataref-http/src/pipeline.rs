//! The request pipeline as tower layers ([`tower_layer::Layer`] over
//! [`tower_service::Service`]), composed once in [`build`]:
//!
//! ```text
//! guard (Host, Origin)                          every route
//! └─ well-known metadata                         GET/HEAD, no token
//!    └─ counted (a shutdown waits for it)
//!       └─ routes: by path, then the method
//!          ├─ /mcp          body deadline → auth → rate → tool-call slot → session → rmcp
//!          ├─ /files/sign   body deadline → auth → rate → sign
//!          ├─ /files/{path} auth (signed link or token) → rate → download slot → file
//!          ├─ agent runs    body deadline → auth → rate → tool-call slot → agent API
//!          ├─ agent, other  body deadline → auth → rate → agent API
//!          └─ anything else 404 (the page to come gets its own stack here)
//! ```
//!
//! Most layers are a [`Stage`]: a check before the inner service (which may answer in its
//! place) and a step on its response (holding a permit in the body, binding a session).
//! The limits are a [`Check`], a stage whose check is awaited: a shared limiter asks the
//! index.
//! The body deadline changes the request's body type, so it is a layer of its own. Every
//! service here is always ready.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use dataref_mcp::Caller;
use dataref_protocol::Principal;
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::json;
use tower_layer::Layer;
use tower_service::Service;

use crate::body::{self, Body, Deadline};
use crate::conn::OpenRequest;
use crate::limits::{Permit, SlotKind};
use crate::server::State;
use crate::{agent_api, files, json_response, routes, sessions};

/// What every service of the pipeline returns.
pub(crate) type BoxFuture =
    Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

/// The whole pipeline for one server: the service each connection calls.
pub(crate) fn build(state: &Arc<State>) -> impl PipelineService<Incoming> {
    let mcp = (
        BodyDeadlineLayer(state.body_timeout),
        StageLayer(Authenticate::bearer(state)),
        CheckLayer(RateLimit(state.clone())),
        CheckLayer(Slot::tool_calls(state)),
        StageLayer(SessionBinding(state.clone())),
    )
        .layer(Endpoint::new(state, routes::mcp));
    let sign = (
        BodyDeadlineLayer(state.body_timeout),
        StageLayer(Authenticate::bearer(state)),
        CheckLayer(RateLimit(state.clone())),
    )
        .layer(Endpoint::new(state, files::sign));
    let download = (
        StageLayer(Authenticate::signed_link_or_bearer(state)),
        CheckLayer(RateLimit(state.clone())),
        CheckLayer(Slot::downloads(state)),
    )
        .layer(Endpoint::new(state, files::download));
    // A run holds one of the caller's in-flight slots for as long as it streams, as a tool
    // call does; listing, history and approvals take none.
    let agent_run = (
        BodyDeadlineLayer(state.body_timeout),
        StageLayer(Authenticate::bearer(state)),
        CheckLayer(RateLimit(state.clone())),
        CheckLayer(Slot::tool_calls(state)),
    )
        .layer(Endpoint::new(state, agent_api::handle));
    let agent = (
        BodyDeadlineLayer(state.body_timeout),
        StageLayer(Authenticate::bearer(state)),
        CheckLayer(RateLimit(state.clone())),
    )
        .layer(Endpoint::new(state, agent_api::handle));
    let routes = routes::Routes {
        mcp,
        sign,
        download,
        agent,
        agent_run,
    };
    (
        StageLayer(Guard(state.clone())),
        routes::WellKnownLayer(state.clone()),
        StageLayer(Counted(state.clone())),
    )
        .layer(routes)
}

/// A service of the pipeline over requests with bodies of type `B`.
pub(crate) trait PipelineService<B>:
    Service<Request<B>, Response = Response<Body>, Error = Infallible, Future = BoxFuture>
    + Clone
    + Send
    + 'static
{
}

impl<B, S> PipelineService<B> for S where
    S: Service<Request<B>, Response = Response<Body>, Error = Infallible, Future = BoxFuture>
        + Clone
        + Send
        + 'static
{
}

pub(crate) fn answer(response: Response<Body>) -> BoxFuture {
    Box::pin(std::future::ready(Ok(response)))
}

/// One step of the pipeline: [`Stage::before`] the inner service (an `Err` is the answer,
/// and the inner service is not called), [`Stage::after`] on its response.
pub(crate) trait Stage: Clone + Send + Sync + 'static {
    /// What `before` hands to `after`.
    type Carry: Send + 'static;
    #[expect(
        clippy::result_large_err,
        reason = "the refusal is the response itself, made once per refused request"
    )]
    fn before<B>(&self, request: &mut Request<B>) -> Result<Self::Carry, Response<Body>>;
    fn after(&self, carry: Self::Carry, response: Response<Body>) -> Response<Body>;
}

/// The [`Layer`] of a [`Stage`].
#[derive(Clone)]
pub(crate) struct StageLayer<T>(pub(crate) T);

impl<T: Stage, S> Layer<S> for StageLayer<T> {
    type Service = Staged<T, S>;

    fn layer(&self, inner: S) -> Self::Service {
        Staged {
            stage: self.0.clone(),
            inner,
        }
    }
}

#[derive(Clone)]
pub(crate) struct Staged<T, S> {
    stage: T,
    inner: S,
}

impl<T, S, B> Service<Request<B>> for Staged<T, S>
where
    T: Stage,
    S: PipelineService<B>,
    B: Send + 'static,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<B>) -> BoxFuture {
        let carry = match self.stage.before(&mut request) {
            Ok(carry) => carry,
            Err(refused) => return answer(unread_body_closes(request.headers(), refused)),
        };
        let stage = self.stage.clone();
        let mut inner = self.inner.clone();
        Box::pin(async move {
            let response = inner.call(request).await?;
            Ok(stage.after(carry, response))
        })
    }
}

/// A refusal answered before the request's body was read: the connection cannot carry
/// another request (the unread body is in the way) and is closed after the answer, so it
/// says `Connection: close` rather than leaving a keep-alive client to find out by a
/// broken pipe on its next request.
fn unread_body_closes(request: &http::HeaderMap, mut refused: Response<Body>) -> Response<Body> {
    let declares_body = request.contains_key(http::header::TRANSFER_ENCODING)
        || request
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim() != "0");
    if declares_body {
        refused.headers_mut().insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("close"),
        );
    }
    refused
}

/// What a [`Check`] answers, later.
pub(crate) type CheckFuture<C> = Pin<Box<dyn Future<Output = Result<C, Response<Body>>> + Send>>;

/// A [`Stage`] whose check must wait (the limits may ask the shared index):
/// [`Check::check`] takes what it needs from the request and answers later (an `Err` is
/// the answer, and the inner service is not called); [`Check::after`] as for a stage.
pub(crate) trait Check: Clone + Send + Sync + 'static {
    /// What `check` hands to `after`.
    type Carry: Send + 'static;
    fn check<B>(&self, request: &Request<B>) -> CheckFuture<Self::Carry>;
    fn after(&self, carry: Self::Carry, response: Response<Body>) -> Response<Body>;
}

/// The [`Layer`] of a [`Check`].
#[derive(Clone)]
pub(crate) struct CheckLayer<T>(pub(crate) T);

impl<T: Check, S> Layer<S> for CheckLayer<T> {
    type Service = Checking<T, S>;

    fn layer(&self, inner: S) -> Self::Service {
        Checking {
            check: self.0.clone(),
            inner,
        }
    }
}

#[derive(Clone)]
pub(crate) struct Checking<T, S> {
    check: T,
    inner: S,
}

impl<T, S, B> Service<Request<B>> for Checking<T, S>
where
    T: Check,
    S: PipelineService<B>,
    B: Send + 'static,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> BoxFuture {
        let checked = self.check.check(&request);
        let check = self.check.clone();
        let mut inner = self.inner.clone();
        Box::pin(async move {
            let carry = match checked.await {
                Ok(carry) => carry,
                Err(refused) => return Ok(unread_body_closes(request.headers(), refused)),
            };
            let response = inner.call(request).await?;
            Ok(check.after(carry, response))
        })
    }
}

/// A handler at the end of a stack.
pub(crate) struct Endpoint<B> {
    state: Arc<State>,
    handle: fn(Arc<State>, Request<B>) -> BoxFuture,
}

impl<B> Clone for Endpoint<B> {
    fn clone(&self) -> Self {
        Self {
            state: self.state.clone(),
            handle: self.handle,
        }
    }
}

impl<B> Endpoint<B> {
    fn new(state: &Arc<State>, handle: fn(Arc<State>, Request<B>) -> BoxFuture) -> Self {
        Self {
            state: state.clone(),
            handle,
        }
    }
}

impl<B: Send + 'static> Service<Request<B>> for Endpoint<B> {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> BoxFuture {
        (self.handle)(self.state.clone(), request)
    }
}

// ---------------------------------------------------------------------------------------
// The stages.

/// `Host` and `Origin`, on every route ([`crate::guard`]).
#[derive(Clone)]
pub(crate) struct Guard(Arc<State>);

impl Stage for Guard {
    type Carry = ();

    fn before<B>(&self, request: &mut Request<B>) -> Result<(), Response<Body>> {
        self.0
            .guard
            .check(request.uri(), request.headers())
            .map_err(|refused| refused.response())
    }

    fn after(&self, (): (), response: Response<Body>) -> Response<Body> {
        response
    }
}

/// The request is open from here until its response's last byte: a shutdown lets it
/// finish. A response marked [`NotAwaited`] (the MCP notification stream, open as long
/// as its session) does not count.
#[derive(Clone)]
pub(crate) struct Counted(Arc<State>);

/// In a response's extensions: not a request a shutdown should wait for.
#[derive(Clone, Copy)]
pub(crate) struct NotAwaited;

impl Stage for Counted {
    type Carry = OpenRequest;

    fn before<B>(&self, _: &mut Request<B>) -> Result<OpenRequest, Response<Body>> {
        Ok(self.0.open.start())
    }

    fn after(&self, open: OpenRequest, response: Response<Body>) -> Response<Body> {
        if response.extensions().get::<NotAwaited>().is_some() {
            return response;
        }
        let (parts, inner) = response.into_parts();
        Response::from_parts(parts, body::holding(inner, open))
    }
}

/// Who is calling ([`crate::auth`]): the bearer token or JWT, or (downloads) a signed
/// link ([`crate::files`]); the principal goes into the request's extensions as a
/// [`Caller`], where the later stages and [`dataref_mcp::DatarefServer::per_request`]
/// find it.
#[derive(Clone)]
pub(crate) struct Authenticate {
    state: Arc<State>,
    signed_links: bool,
}

impl Authenticate {
    fn bearer(state: &Arc<State>) -> Self {
        Self {
            state: state.clone(),
            signed_links: false,
        }
    }

    fn signed_link_or_bearer(state: &Arc<State>) -> Self {
        Self {
            state: state.clone(),
            signed_links: true,
        }
    }
}

impl Stage for Authenticate {
    type Carry = ();

    fn before<B>(&self, request: &mut Request<B>) -> Result<(), Response<Body>> {
        let signed = if self.signed_links {
            files::signed_principal(&self.state, request)
        } else {
            None
        };
        let principal = match signed {
            Some(principal) => principal?,
            None => self
                .state
                .auth
                .authenticate(request.headers())
                .map_err(|failure| self.state.auth.challenge(&failure))?,
        };
        request.extensions_mut().insert(Caller(principal));
        Ok(())
    }

    fn after(&self, (): (), response: Response<Body>) -> Response<Body> {
        response
    }
}

/// The caller [`Authenticate`] put into the request.
#[expect(
    clippy::result_large_err,
    reason = "the refusal is the response itself, made once per refused request"
)]
fn caller<B>(request: &Request<B>) -> Result<Principal, Response<Body>> {
    match request.extensions().get::<Caller>() {
        Some(Caller(principal)) => Ok(principal.clone()),
        None => {
            tracing::error!("a request passed the authentication layer without a principal");
            Err(json_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                json!({"error": "internal", "message": "the request carries no authenticated principal; the details are in the server log"}),
            ))
        }
    }
}

/// One token from the caller's bucket ([`crate::limits`]).
#[derive(Clone)]
pub(crate) struct RateLimit(Arc<State>);

impl Check for RateLimit {
    type Carry = ();

    fn check<B>(&self, request: &Request<B>) -> CheckFuture<()> {
        let principal = caller(request);
        let limits = self.0.limits.clone();
        Box::pin(async move {
            limits
                .admit(&principal?)
                .await
                .map_err(|refused| refused.response())
        })
    }

    fn after(&self, (): (), response: Response<Body>) -> Response<Body> {
        response
    }
}

/// One of the caller's in-flight slots, held until the response's last byte: tool calls
/// (MCP POSTs; a GET is the long-lived notification stream and a DELETE ends a session,
/// neither of which should take a slot), or downloads, which have slots of their own.
#[derive(Clone)]
pub(crate) struct Slot {
    state: Arc<State>,
    downloads: bool,
}

impl Slot {
    fn tool_calls(state: &Arc<State>) -> Self {
        Self {
            state: state.clone(),
            downloads: false,
        }
    }

    fn downloads(state: &Arc<State>) -> Self {
        Self {
            state: state.clone(),
            downloads: true,
        }
    }
}

impl Check for Slot {
    type Carry = Option<Permit>;

    fn check<B>(&self, request: &Request<B>) -> CheckFuture<Option<Permit>> {
        let kind = if self.downloads {
            SlotKind::Download
        } else if request.method() == Method::POST {
            SlotKind::ToolCall
        } else {
            return Box::pin(std::future::ready(Ok(None)));
        };
        let principal = caller(request);
        let limits = self.state.limits.clone();
        Box::pin(async move {
            limits
                .slot(&principal?, kind)
                .await
                .map(Some)
                .map_err(|refused| refused.response())
        })
    }

    fn after(&self, permit: Option<Permit>, response: Response<Body>) -> Response<Body> {
        match permit {
            Some(permit) => {
                let (parts, inner) = response.into_parts();
                Response::from_parts(parts, body::holding(inner, permit))
            }
            None => response,
        }
    }
}

/// A 2025-11-25 session is bound to the principal that opened it ([`crate::sessions`]):
/// its `Mcp-Session-Id` from anyone else is an unknown session.
#[derive(Clone)]
pub(crate) struct SessionBinding(Arc<State>);

impl Stage for SessionBinding {
    /// The session the request named, its method and the caller.
    type Carry = (Option<String>, Method, Principal);

    fn before<B>(&self, request: &mut Request<B>) -> Result<Self::Carry, Response<Body>> {
        let principal = caller(request)?;
        let session = request
            .headers()
            .get(sessions::HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        if let Some(id) = &session
            && !self.0.sessions.is_bound_to(id, &principal)
        {
            return Err(sessions::unknown_session());
        }
        Ok((session, request.method().clone(), principal))
    }

    fn after(
        &self,
        (session, method, principal): Self::Carry,
        response: Response<Body>,
    ) -> Response<Body> {
        match (&session, &method) {
            (None, _) => {
                if let Some(id) = response
                    .headers()
                    .get(sessions::HEADER)
                    .and_then(|v| v.to_str().ok())
                {
                    self.0.sessions.bind(id, &principal);
                }
            }
            (Some(id), &Method::DELETE) if response.status().is_success() => {
                self.0.sessions.forget(id);
            }
            (Some(_), _) => {}
        }
        response
    }
}

/// The request body must arrive whole within the limit ([`body::with_deadline`]); when it
/// did not, the answer is 408 and the connection is closed, whatever the inner service
/// made of the broken body.
#[derive(Clone, Copy)]
pub(crate) struct BodyDeadlineLayer(Duration);

impl<S> Layer<S> for BodyDeadlineLayer {
    type Service = BodyDeadline<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BodyDeadline {
            limit: self.0,
            inner,
        }
    }
}

#[derive(Clone)]
pub(crate) struct BodyDeadline<S> {
    limit: Duration,
    inner: S,
}

impl<S: PipelineService<Deadline>> Service<Request<Incoming>> for BodyDeadline<S> {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Incoming>) -> BoxFuture {
        let limit = self.limit;
        let (parts, incoming) = request.into_parts();
        let (deadline, timed_out) = body::with_deadline(incoming, limit);
        let mut inner = self.inner.clone();
        Box::pin(async move {
            let response = inner.call(Request::from_parts(parts, deadline)).await?;
            if timed_out.happened() {
                return Ok(crate::body_timed_out(limit));
            }
            Ok(response)
        })
    }
}
