//! The agent over HTTP: `/agent/…`, behind the same Host/Origin checks, authentication and
//! limits as `/mcp` ([`crate::router`] gives these routes their stacks: a request that
//! starts a run takes an in-flight slot, as a tool call does). Every message goes through
//! [`AgentHost::send`](dataref_agent::AgentHost::send); runs stream as SSE ([`sse`]); the
//! OpenAI-compatible facade is [`openai`].
//!
//! - `POST /agent/sessions` (a new session, its id made here) and
//!   `POST /agent/sessions/{id}/messages` with `{"message": "…", "agent"?: "name"}`:
//!   `text/event-stream` — `event: session` first, then one event per [`AgentEvent`](dataref_agent::AgentEvent)
//!   (`event: <type>`, `data: <the event>`), `event: done` last. A client that goes away
//!   cancels the run. What fails before the run starts is a JSON 4xx: unknown agent 404,
//!   a bad session id 400, an unknown session 404, a session busy with another message 409.
//! - `GET /agent/sessions`, `GET /agent/sessions/{id}`, `DELETE /agent/sessions/{id}`.
//! - `POST /agent/sessions/{id}/approvals/{call_id}` with `{"approve": bool, "reason"?}`:
//!   answers an `approval_needed` of a run of the same principal (pending in this server's
//!   memory, or with replicas in their shared [`ApprovalStore`], so any replica answers).
//! - `GET /agent/agents`: the profiles.
//!
//! Sessions are keyed by principal: another principal's session, or approval, is the same
//! 404 as one that does not exist.

pub(crate) mod openai;
mod sse;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Body;
use axum::extract::{FromRequestParts, Path};
use axum::response::Response;
use bytes::Bytes;
use dataref_agent::approval::Asked;
use dataref_agent::approvals::{ApprovalStore, PendingCall};
use dataref_agent::{
    ApprovalRequest, Approver, Decision, ProfileError, SendError, SessionError, SessionStore,
    Stopped,
};
use dataref_mcp::Caller;
use dataref_protocol::Principal;
use dataref_workspace::Workspace;
use http::StatusCode;
use http::request::Parts;
use http_body_util::BodyExt;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::response::json_response;
use crate::state::{Agents, AppState};
use sse::{SseEvents, sse_event, sse_response};

/// The largest request body of the agent routes (a message, a facade conversation).
pub const MAX_AGENT_BODY: usize = 1024 * 1024;
/// How long a run waits for the person's answer to an `approval_needed` before the call
/// is refused (the refusal says so).
pub const APPROVAL_TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// `GET /agent/agents`.
pub(crate) async fn agents(call: Call) -> Response {
    call.list_agents()
}

/// `GET /agent/sessions`.
pub(crate) async fn sessions(call: Call) -> Response {
    call.list_sessions().await
}

/// `POST /agent/sessions`: a message to a new session, its id made here.
pub(crate) async fn start(call: Call, body: Body) -> Response {
    call.message(SessionStore::new_id(), true, body).await
}

/// `GET /agent/sessions/{id}`.
pub(crate) async fn session(call: Call, Ids(id): Ids<String>) -> Response {
    call.session(&id).await
}

/// `DELETE /agent/sessions/{id}`.
pub(crate) async fn delete(call: Call, Ids(id): Ids<String>) -> Response {
    call.delete(&id).await
}

/// `POST /agent/sessions/{id}/messages`.
pub(crate) async fn message(call: Call, Ids(id): Ids<String>, body: Body) -> Response {
    call.message(id, false, body).await
}

/// `POST /agent/sessions/{id}/approvals/{call_id}`.
pub(crate) async fn approve(
    call: Call,
    Ids((id, call_id)): Ids<(String, String)>,
    body: Body,
) -> Response {
    call.approve(&id, call_id, body).await
}

/// The ids in an agent path (`{id}`, `{call_id}`), percent-decoded. One that is not UTF-8
/// is a bad session id (400), as any other malformed one is.
pub(crate) struct Ids<T>(T);

impl<T, S> FromRequestParts<S> for Ids<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Response> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(ids)) => Ok(Self(ids)),
            Err(_) => Err(session_error(&SessionError::BadId(
                dataref_protocol::truncate_echo(parts.uri.path()),
            ))),
        }
    }
}

/// One authenticated request to the agent routes: the caller, and the agents this server
/// runs (extracting it refuses the request when there are none).
pub(crate) struct Call {
    pub(crate) state: Arc<AppState>,
    pub(crate) agents: Arc<Agents>,
    pub(crate) principal: Principal,
}

/// Why no [`Call`] could be made of a request.
pub(crate) enum NoCall {
    /// It passed no authentication layer: a fault of ours.
    Unauthenticated,
    /// This server runs no agents.
    NoAgents,
}

impl Call {
    /// The caller and the agents of a request past authentication.
    pub(crate) fn of(parts: &Parts, state: &Arc<AppState>) -> Result<Self, NoCall> {
        let Some(Caller(principal)) = parts.extensions.get::<Caller>().cloned() else {
            tracing::error!("an agent request passed the authentication layer without a principal");
            return Err(NoCall::Unauthenticated);
        };
        let agents = state.agents.get().cloned().ok_or(NoCall::NoAgents)?;
        Ok(Self {
            state: state.clone(),
            agents,
            principal,
        })
    }
}

impl FromRequestParts<Arc<AppState>> for Call {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, Response> {
        Self::of(parts, state).map_err(|no| match no {
            NoCall::Unauthenticated => internal(),
            NoCall::NoAgents => error(
                StatusCode::NOT_FOUND,
                "no_agents",
                "this server runs no agents",
                "the agent API is part of `dataref serve --http`",
            ),
        })
    }
}

/// Asks the HTTP client of a run: the stream carries `approval_needed`, the answer comes
/// as `POST /agent/sessions/{id}/approvals/{call_id}`.
pub(crate) struct HttpApprover {
    pub(crate) approvals: Arc<dyn ApprovalStore>,
    pub(crate) principal: Principal,
    pub(crate) session: String,
    pub(crate) timeout: Duration,
    pub(crate) cancel: CancellationToken,
}

#[async_trait]
impl Approver for HttpApprover {
    async fn decide(&self, request: &ApprovalRequest) -> Decision {
        self.ask(request).await.decision().await
    }

    /// Pending in the store before the stream says `approval_needed`: the answer may come
    /// through another replica the moment the client sees it.
    async fn ask<'a>(&'a self, request: &'a ApprovalRequest) -> Asked<'a> {
        let call = PendingCall {
            principal: self.principal.clone(),
            session: self.session.clone(),
            call_id: request.call_id.clone(),
        };
        let mut wait = match self.approvals.ask(&call, self.timeout).await {
            Ok(wait) => wait,
            Err(e) => {
                tracing::error!(session = %self.session, error = ?e, "an approval could not be asked");
                return Asked::Decided(Decision::Deny(Some(format!(
                    "the approval could not be asked ({e}), so the call was not approved"
                ))));
            }
        };
        Asked::Waiting(Box::pin(async move {
            let decision = tokio::select! {
                decided = wait.decided() => decided.unwrap_or_else(|| Decision::Deny(Some(
                    "the approval was withdrawn before anyone answered".into(),
                ))),
                () = tokio::time::sleep(self.timeout) => Decision::Deny(Some(format!(
                    "nobody answered the approval within {} s, so the call was not approved",
                    self.timeout.as_secs()
                ))),
                () = self.cancel.cancelled() => Decision::Deny(Some(
                    "the run was cancelled before anyone answered".into(),
                )),
            };
            // Nothing of the call is left once the run goes on.
            wait.end().await;
            decision
        }))
    }
}

/// The body of a message.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MessageBody {
    message: String,
    #[serde(default)]
    agent: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ApprovalBody {
    approve: bool,
    #[serde(default)]
    reason: Option<String>,
}

impl Call {
    /// The caller's workspace (opened on first use, then cached by the MCP server).
    #[expect(
        clippy::result_large_err,
        reason = "the refusal is the response itself, made once per refused request"
    )]
    pub(crate) fn workspace(&self) -> Result<Arc<Workspace>, Response> {
        match self.state.server.workspace_of(&self.principal) {
            Ok(Some(w)) => Ok(w),
            Ok(None) => {
                tracing::error!(principal = %self.principal, "this server has no workspace for the caller");
                Err(internal())
            }
            Err(e) => {
                tracing::error!(principal = %self.principal, error = %e, "opening a workspace for an agent run failed");
                Err(internal())
            }
        }
    }

    fn list_agents(&self) -> Response {
        let host = &self.agents.host;
        let agents: Vec<Value> = host
            .names()
            .iter()
            .filter_map(|name| host.agent(Some(name)).ok())
            .map(|a| {
                json!({
                    "name": a.name,
                    "model": a.config.model.model,
                    "tools": a.registry.names(),
                    "model_configured": a.model.is_some(),
                    "default": a.name == host.default_name(),
                })
            })
            .collect();
        json_response(
            StatusCode::OK,
            json!({"agents": agents, "default": host.default_name()}),
        )
    }

    async fn list_sessions(&self) -> Response {
        let principal = self.principal.clone();
        match self.sessions(move |s| s.list(&principal)).await {
            Ok(list) => json_response(StatusCode::OK, json!({"sessions": list})),
            Err(e) => session_error(&e),
        }
    }

    async fn session(&self, id: &str) -> Response {
        let (principal, id) = (self.principal.clone(), id.to_owned());
        let read = self
            .sessions(move |s| {
                let info = s.info(&principal, &id)?;
                Ok((info, s.history(&principal, &id, None)?))
            })
            .await;
        match read {
            Ok((info, messages)) => json_response(
                StatusCode::OK,
                json!({"session": info, "messages": messages}),
            ),
            Err(e) => session_error(&e),
        }
    }

    async fn delete(&self, id: &str) -> Response {
        // Not while it answers a message.
        let claim = match self.agents.host.claim(&self.principal, id).await {
            Ok(c) => c,
            Err(e) => return send_error(&e),
        };
        let (principal, owned) = (self.principal.clone(), id.to_owned());
        let deleted = self.sessions(move |s| s.delete(&principal, &owned)).await;
        claim.release().await;
        match deleted {
            Ok(()) => {
                let mut r = Response::new(Body::empty());
                *r.status_mut() = StatusCode::NO_CONTENT;
                r
            }
            Err(e) => session_error(&e),
        }
    }

    /// `f` on the session store, on the blocking pool: a store may wait for a file lock
    /// or a round trip to the shared index, which an async worker must not.
    pub(crate) async fn sessions<T: Send + 'static>(
        &self,
        f: impl FnOnce(&SessionStore) -> Result<T, SessionError> + Send + 'static,
    ) -> Result<T, SessionError> {
        let store = self.agents.host.sessions.clone();
        tokio::task::spawn_blocking(move || f(&store))
            .await
            .unwrap_or_else(|e| {
                Err(SessionError::Database {
                    path: "agent sessions".into(),
                    detail: format!("the session task ended abnormally: {e}"),
                })
            })
    }

    async fn approve(&self, id: &str, call_id: String, body: Body) -> Response {
        if let Err(e) = SessionStore::check_id(id) {
            return session_error(&e);
        }
        let body: ApprovalBody = match read_body(body).await.and_then(|b| parse(&b)) {
            Ok(b) => b,
            Err(e) => {
                return e.response(
                    "send `{\"approve\": true}` or `{\"approve\": false, \"reason\": \"…\"}`",
                );
            }
        };
        let decision = if body.approve {
            Decision::Approve
        } else {
            Decision::Deny(body.reason.filter(|r| !r.trim().is_empty()))
        };
        let call = PendingCall {
            principal: self.principal.clone(),
            session: id.to_owned(),
            call_id: call_id.clone(),
        };
        let answered = match self.agents.approvals.answer(&call, decision).await {
            Ok(answered) => answered,
            Err(e) => {
                tracing::error!(session = id, error = ?e, "an approval could not be answered");
                return error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "approvals_unavailable",
                    e.to_string(),
                    e.hint().to_owned(),
                );
            }
        };
        if !answered {
            return error(
                StatusCode::NOT_FOUND,
                "no_pending_approval",
                format!(
                    "no approval is pending for call `{}` of session `{id}`",
                    dataref_protocol::truncate_echo(&call_id)
                ),
                "answer while the run's stream shows `approval_needed` for that call; an unanswered one is refused after its timeout",
            );
        }
        json_response(
            StatusCode::OK,
            json!({"session": id, "call_id": call_id, "approved": body.approve}),
        )
    }

    /// A message to a new (`new`) or existing session: everything that can be refused is
    /// refused here, as JSON; then the run streams.
    async fn message(self, id: String, new: bool, body: Body) -> Response {
        let body: MessageBody = match read_body(body).await.and_then(|b| parse(&b)) {
            Ok(b) => b,
            Err(e) => return e.response("send `{\"message\": \"…\"}`, optionally with `\"agent\": \"NAME\"` (see `GET /agent/agents`)"),
        };
        if body.message.trim().is_empty() {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_request",
                "the message is empty",
                "send `{\"message\": \"…\"}` with what you want to ask",
            );
        }
        let host = &self.agents.host;
        // An existing session keeps its agent.
        let agent = if new {
            body.agent
        } else {
            let (principal, owned) = (self.principal.clone(), id.clone());
            match self.sessions(move |s| s.info(&principal, &owned)).await {
                Ok(info) => match body.agent {
                    Some(asked) if asked != info.agent => {
                        return session_error(&SessionError::OtherAgent {
                            id,
                            agent: info.agent,
                            asked,
                        });
                    }
                    _ => Some(info.agent),
                },
                Err(e) => return session_error(&e),
            }
        };
        let agent = match host.agent(agent.as_deref()) {
            Ok(a) => a.name.clone(),
            Err(e) => return profile_error(&e),
        };
        let workspace = match self.workspace() {
            Ok(w) => w,
            Err(r) => return r,
        };
        // Claimed here, so a second message is 409 before anything streams.
        let claim = match host.claim(&self.principal, &id).await {
            Ok(c) => c,
            Err(e) => return send_error(&e),
        };
        let ctx = self
            .agents
            .shared
            .context(self.principal.clone(), workspace);
        let cancel = self.agents.shutdown.child_token();
        let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
        let _ = tx.send(sse_event(
            "session",
            &json!({"session": id, "agent": agent}),
        ));
        let response = sse_response(rx, cancel.clone());
        let agents = self.agents.clone();
        let principal = self.principal.clone();
        tokio::spawn(async move {
            let sink = SseEvents(tx.clone());
            let approver = HttpApprover {
                approvals: agents.approvals.clone(),
                principal,
                session: id.clone(),
                timeout: agents.approval_timeout,
                cancel: cancel.clone(),
            };
            let sent = agents
                .host
                .send_claimed(
                    claim,
                    dataref_agent::SendRequest {
                        ctx,
                        agent: Some(&agent),
                        session: Some(id.clone()),
                        message: body.message,
                        events: &sink,
                        approver: &approver,
                        cancel,
                    },
                )
                .await;
            let last = match sent {
                Ok(sent) => sse_event(
                    "done",
                    &json!({
                        "session": sent.session,
                        "answer": sent.run.answer,
                        "stopped": sent.run.stopped.as_ref().map(Stopped::as_str),
                        "grounded": sent.run.grounding.as_ref().map(|g| g.grounded()),
                        "unmatched": sent.run.grounding.as_ref()
                            .map(|g| g.unmatched.clone()).unwrap_or_default(),
                        "usage": {
                            "prompt_tokens": sent.run.usage.prompt_tokens,
                            "completion_tokens": sent.run.usage.completion_tokens,
                        },
                    }),
                ),
                Err(e) => {
                    tracing::error!(session = %id, error = %e, "an agent run over HTTP failed");
                    sse_event(
                        "error",
                        &json!({"message": public_message(&e), "hint": e.hint()}),
                    )
                }
            };
            let _ = tx.send(last);
        });
        response
    }
}

/// Why a request body could not be used.
pub(crate) enum BodyError {
    TooLarge,
    Unreadable,
    Invalid(String),
}

impl BodyError {
    fn response(&self, hint: &str) -> Response {
        match self {
            Self::TooLarge => error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                format!("the body is larger than {} KiB", MAX_AGENT_BODY / 1024),
                "send a shorter message; files belong in the workspace, not the message",
            ),
            Self::Unreadable => error(
                StatusCode::BAD_REQUEST,
                "bad_request",
                "the request body could not be read",
                hint.to_owned(),
            ),
            Self::Invalid(detail) => error(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("the body is not what this route takes: {detail}"),
                hint.to_owned(),
            ),
        }
    }
}

/// The whole body, at most [`MAX_AGENT_BODY`] (one that did not arrive within the body
/// deadline is answered 408 by its layer).
pub(crate) async fn read_body(body: Body) -> Result<Bytes, BodyError> {
    // A `Content-Length` over the limit is refused before a byte of it is read.
    if http_body::Body::size_hint(&body).lower() > MAX_AGENT_BODY as u64 {
        return Err(BodyError::TooLarge);
    }
    match http_body_util::Limited::new(body, MAX_AGENT_BODY)
        .collect()
        .await
    {
        Ok(b) => Ok(b.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(BodyError::TooLarge),
        Err(_) => Err(BodyError::Unreadable),
    }
}

pub(crate) fn parse<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, BodyError> {
    serde_json::from_slice(bytes).map_err(|e| BodyError::Invalid(e.to_string()))
}

pub(crate) use crate::response::error;

pub(crate) fn internal() -> Response {
    error(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        "the request could not be answered",
        "the details are in the server log",
    )
}

pub(crate) fn session_error(e: &SessionError) -> Response {
    let (status, code, hint) = match e {
        SessionError::NotFound(_) => (
            StatusCode::NOT_FOUND,
            "session_not_found",
            "list your sessions with `GET /agent/sessions`, or start one with `POST /agent/sessions`",
        ),
        SessionError::BadId(_) => (
            StatusCode::BAD_REQUEST,
            "bad_session_id",
            "session ids are what `POST /agent/sessions` returned: letters, digits, `-` and `_`",
        ),
        SessionError::OtherAgent { .. } => (
            StatusCode::CONFLICT,
            "other_agent",
            "leave `agent` out to continue with the session's own agent, or start a new session",
        ),
        SessionError::Unavailable { detail } => {
            tracing::error!(error = %e, detail, "the agent session store is unavailable");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "sessions_unavailable",
                "try again in a moment",
            )
        }
        SessionError::Database { .. } => {
            tracing::error!(error = %e, "the agent session store failed");
            return internal();
        }
    };
    error(status, code, e.to_string(), hint.to_owned())
}

fn profile_error(e: &ProfileError) -> Response {
    let (status, code) = match e {
        ProfileError::NoSuchAgent(..) => (StatusCode::NOT_FOUND, "unknown_agent"),
        ProfileError::NoEndpoint { .. } => (StatusCode::SERVICE_UNAVAILABLE, "no_model_endpoint"),
        _ => {
            tracing::error!(error = %e, "an agent profile cannot be used");
            return internal();
        }
    };
    let hint = e
        .hint()
        .unwrap_or_else(|| "list the agents with `GET /agent/agents`".into());
    error(status, code, e.to_string(), hint)
}

/// What a client is told of a failed send: the session store's own failure (a file path,
/// SQLite's words) stays in the log.
pub(crate) fn public_message(e: &SendError) -> String {
    match e {
        SendError::Session(SessionError::Database { .. }) => {
            "the session store failed; the details are in the server log".to_owned()
        }
        other => other.to_string(),
    }
}

pub(crate) fn send_error(e: &SendError) -> Response {
    match e {
        SendError::Agent(p) => profile_error(p),
        SendError::Session(s) => session_error(s),
        SendError::Busy(_) => error(
            StatusCode::CONFLICT,
            "session_busy",
            e.to_string(),
            e.hint().unwrap_or_default(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use dataref_agent::approvals::{ApprovalError, ApprovalWait, LocalApprovals};

    use super::*;

    fn request() -> ApprovalRequest {
        ApprovalRequest {
            call_id: "call_1".into(),
            tool: "fetch_sales".into(),
            arguments: json!({}),
            via: None,
        }
    }

    fn approver(approvals: &Arc<LocalApprovals>, timeout: Duration) -> HttpApprover {
        HttpApprover {
            approvals: approvals.clone(),
            principal: Principal::new("eu_analyst").unwrap(),
            session: "s-1".into(),
            timeout,
            cancel: CancellationToken::new(),
        }
    }

    #[tokio::test]
    async fn an_unanswered_approval_is_denied_after_the_timeout_and_forgotten() {
        let approvals = Arc::new(LocalApprovals::default());
        let a = approver(&approvals, Duration::from_millis(50));
        let Decision::Deny(Some(reason)) = a.decide(&request()).await else {
            panic!("not denied")
        };
        assert!(
            reason.contains("nobody answered the approval within"),
            "{reason}"
        );
        assert_eq!(approvals.pending(), 0);
    }

    /// A shared store out of reach.
    struct Unreachable;

    #[async_trait]
    impl ApprovalStore for Unreachable {
        async fn ask(
            &self,
            _call: &PendingCall,
            _timeout: Duration,
        ) -> Result<Box<dyn ApprovalWait>, ApprovalError> {
            Err(ApprovalError::Unavailable {
                detail: "connection refused".into(),
            })
        }

        async fn answer(
            &self,
            _call: &PendingCall,
            _decision: Decision,
        ) -> Result<bool, ApprovalError> {
            Ok(false)
        }
    }

    #[tokio::test]
    async fn a_question_the_store_cannot_take_is_refused_and_not_shown() {
        let a = HttpApprover {
            approvals: Arc::new(Unreachable),
            ..approver(
                &Arc::new(LocalApprovals::default()),
                Duration::from_secs(60),
            )
        };
        // `Decided`: the loop sends no `approval_needed` nobody could answer.
        let Asked::Decided(Decision::Deny(Some(reason))) = a.ask(&request()).await else {
            panic!("not refused at once")
        };
        assert!(reason.contains("could not be asked"), "{reason}");
    }

    #[tokio::test]
    async fn only_the_same_principal_and_session_answer() {
        let approvals = Arc::new(LocalApprovals::default());
        let a = approver(&approvals, Duration::from_secs(60));
        let waiting = tokio::spawn(async move { a.decide(&request()).await });
        let call = |who: &str| PendingCall {
            principal: Principal::new(who).unwrap(),
            session: "s-1".to_owned(),
            call_id: "call_1".to_owned(),
        };
        let (other, own) = (call("us_analyst"), call("eu_analyst"));
        while approvals.pending() == 0 {
            tokio::task::yield_now().await;
        }
        let answer = |call, decision| {
            let approvals = approvals.clone();
            async move { approvals.answer(&call, decision).await.unwrap() }
        };
        assert!(!answer(other, Decision::Approve).await);
        assert!(answer(own.clone(), Decision::Deny(Some("no".into()))).await);
        assert_eq!(waiting.await.unwrap(), Decision::Deny(Some("no".into())));
        assert!(!answer(own, Decision::Approve).await, "answered once");
    }
}
