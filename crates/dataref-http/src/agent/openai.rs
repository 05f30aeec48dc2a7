//! The OpenAI-compatible facade: `POST /v1/chat/completions` and `GET /v1/models`, so a
//! stock OpenAI client talks to dataref's agents. `model` names an agent profile.
//!
//! The last user message is the new message; the user and assistant text messages before
//! it are the history. The client's system messages are ignored (the profile owns the
//! prompt), and so are its tool messages and tool calls (the agent runs its own tools).
//! Nobody can be asked for an approval here: a tool whose policy is `ask` is refused
//! ([`NoOneToAsk`]). A run is not kept as a session unless the request carries
//! `X-Dataref-Session: <id>`: then it continues that session of the caller (starting it
//! when there is none) and the client's history is ignored.
//!
//! Errors are OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

use std::sync::{Arc, Mutex, PoisonError};

use axum::body::Body;
use axum::extract::FromRequestParts;
use axum::response::Response;
use bytes::Bytes;
use dataref_agent::SessionClaim;
use dataref_agent::{
    AgentEvent, EventSink, Message, NoEvents, NoOneToAsk, RunInput, RunOutcome, SendError,
    SessionError, SessionStore, Stopped,
};
use http::request::Parts;
use http::{HeaderMap, HeaderValue, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::sse::sse_response;
use super::{BodyError, Call, NoCall, internal, public_message, read_body};
use crate::response::{json_response, now_secs};
use crate::state::{Agents, AppState};

/// The header that makes a facade run continue (and be kept in) one of the caller's
/// sessions.
const SESSION_HEADER: &str = "x-dataref-session";

/// A [`Call`] whose refusals are in OpenAI's shape.
pub(crate) struct FacadeCall(Call);

impl FromRequestParts<Arc<AppState>> for FacadeCall {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, Response> {
        Call::of(parts, state).map(Self).map_err(|no| match no {
            NoCall::Unauthenticated => internal(),
            NoCall::NoAgents => error(
                StatusCode::NOT_FOUND,
                "this server runs no agents",
                "invalid_request_error",
                "no_agents",
            ),
        })
    }
}

/// The `code` of a run the model failed (also what `Stopped::Model` reads as).
const MODEL_ERROR: &str = "model_error";

/// An error in OpenAI's shape.
fn error(status: StatusCode, message: impl Into<String>, kind: &str, code: &str) -> Response {
    json_response(
        status,
        json!({"error": {"message": message.into(), "type": kind, "param": null, "code": code}}),
    )
}

fn invalid(message: impl Into<String>, code: &str) -> Response {
    error(
        StatusCode::BAD_REQUEST,
        message,
        "invalid_request_error",
        code,
    )
}

#[derive(Deserialize)]
struct CompletionRequest {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    messages: Vec<Value>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

/// `GET /v1/models`: the agent profiles.
pub(crate) async fn models(FacadeCall(call): FacadeCall) -> Response {
    let data: Vec<Value> = call
        .agents
        .host
        .names()
        .into_iter()
        .map(|name| json!({"id": name, "object": "model", "created": 0, "owned_by": "dataref"}))
        .collect();
    json_response(StatusCode::OK, json!({"object": "list", "data": data}))
}

/// A message's text: a string, or the `text` parts of an array of parts.
fn text_of(content: &Value) -> Option<String> {
    match content {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => {
            let text: Vec<&str> = parts
                .iter()
                .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect();
            (!text.is_empty()).then(|| text.join("\n"))
        }
        _ => None,
    }
}

/// The new message (the last user message) and the history before it.
#[expect(
    clippy::result_large_err,
    reason = "the refusal is the response itself, made once per refused request"
)]
fn conversation(messages: &[Value]) -> Result<(String, Vec<Message>), Response> {
    let role = |m: &Value| m.get("role").and_then(Value::as_str).map(str::to_owned);
    let Some(last) = messages
        .iter()
        .rposition(|m| role(m).as_deref() == Some("user"))
    else {
        return Err(invalid(
            "`messages` has no user message: the last user message is what the agent answers",
            "missing_user_message",
        ));
    };
    let message = messages[last]
        .get("content")
        .and_then(text_of)
        .filter(|t| !t.trim().is_empty())
        .ok_or_else(|| invalid("the last user message has no text", "missing_user_message"))?;
    let history = messages[..last]
        .iter()
        .filter_map(|m| {
            let text = m.get("content").and_then(text_of)?;
            match role(m).as_deref() {
                Some("user") => Some(Message::user(text)),
                Some("assistant") if !text.trim().is_empty() => Some(Message::assistant(text)),
                // System messages: the profile owns the prompt. Tool messages: the agent
                // runs its own tools.
                _ => None,
            }
        })
        .collect();
    Ok((message, history))
}

/// A run stopped by a limit (a budget too) finishes with `length`, its content ending in
/// the sentence saying which limit: a stock client shows that text as the answer.
fn finish_reason(stopped: Option<&Stopped>) -> &'static str {
    match stopped {
        Some(
            Stopped::MaxTurns(_)
            | Stopped::MaxToolCalls(_)
            | Stopped::WallTime(_)
            | Stopped::Context(_)
            | Stopped::Budget(_),
        ) => "length",
        Some(Stopped::Cancelled | Stopped::Model(_)) | None => "stop",
    }
}

fn usage_json(run: &RunOutcome) -> Value {
    json!({
        "prompt_tokens": run.usage.prompt_tokens,
        "completion_tokens": run.usage.completion_tokens,
        "total_tokens": run.usage.total(),
    })
}

fn send_error(e: &SendError) -> Response {
    match e {
        SendError::Busy(_) => error(
            StatusCode::CONFLICT,
            e.to_string(),
            "invalid_request_error",
            "session_busy",
        ),
        SendError::Session(SessionError::BadId(_)) => invalid(e.to_string(), "bad_session_id"),
        SendError::Session(SessionError::OtherAgent { .. }) => error(
            StatusCode::CONFLICT,
            e.to_string(),
            "invalid_request_error",
            "other_agent",
        ),
        SendError::Session(SessionError::Unavailable { detail }) => {
            tracing::error!(error = %e, detail, "the agent session store is unavailable");
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                e.to_string(),
                "server_error",
                "sessions_unavailable",
            )
        }
        _ => {
            tracing::error!(error = %e, "a facade run failed");
            error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the run could not be completed; the details are in the server log",
                "server_error",
                "internal",
            )
        }
    }
}

/// What a facade run needs besides its events.
struct Run {
    agents: Arc<Agents>,
    agent: Arc<dataref_agent::Agent>,
    /// The session to continue, claimed; `None`: the client's history, nothing kept.
    session: Option<SessionClaim>,
    ctx: dataref_tool::RunContext,
    history: Vec<Message>,
    message: String,
    cancel: CancellationToken,
}

impl Run {
    async fn go(self, events: &dyn EventSink) -> Result<RunOutcome, SendError> {
        let host = &self.agents.host;
        match self.session {
            Some(claim) => {
                let sent = host
                    .send_claimed(
                        claim,
                        dataref_agent::SendRequest {
                            ctx: self.ctx,
                            agent: Some(&self.agent.name),
                            session: None,
                            message: self.message,
                            events,
                            approver: &NoOneToAsk,
                            cancel: self.cancel,
                        },
                    )
                    .await;
                sent.map(|sent| sent.run)
            }
            None => Ok(self
                .agent
                .run(RunInput {
                    ctx: self.ctx,
                    history: self.history,
                    message: self.message,
                    model: host.model_of(&self.agent),
                    events,
                    approver: &NoOneToAsk,
                    cancel: self.cancel,
                    checkpoint: None,
                })
                .await),
        }
    }
}

/// `POST /v1/chat/completions`.
pub(crate) async fn completions(
    FacadeCall(call): FacadeCall,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let header = headers
        .get(SESSION_HEADER)
        .map(|v| v.to_str().map(str::to_owned));
    let request: CompletionRequest = match read_body(body).await.and_then(|b| super::parse(&b)) {
        Ok(r) => r,
        Err(BodyError::TooLarge) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the request is larger than {} KiB",
                    super::MAX_AGENT_BODY / 1024
                ),
                "invalid_request_error",
                "payload_too_large",
            );
        }
        Err(BodyError::Unreadable) => {
            return invalid("the request body could not be read", "invalid_body");
        }
        Err(BodyError::Invalid(detail)) => {
            return invalid(
                format!("the body is not a Chat Completions request: {detail}"),
                "invalid_body",
            );
        }
    };
    let host = call.agents.host.clone();
    let Some(model) = request.model.filter(|m| !m.is_empty()) else {
        return invalid(
            "`model` is required: it names one of this server's agents (GET /v1/models)",
            "missing_model",
        );
    };
    let agent = match host.agent(Some(&model)) {
        Ok(a) => a.clone(),
        Err(_) => {
            return error(
                StatusCode::NOT_FOUND,
                format!(
                    "The model `{}` does not exist: the models here are dataref's agents ({}); list them with GET /v1/models",
                    dataref_protocol::truncate_echo(&model),
                    host.names()
                        .iter()
                        .map(|n| format!("`{n}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                "invalid_request_error",
                "model_not_found",
            );
        }
    };
    if !host.has_model(&agent) {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "agent `{}` has no model endpoint: the operator sets DATAREF_LLM_URL and DATAREF_LLM_MODEL, or `url` and `model` in [agents.{}]",
                agent.name, agent.name
            ),
            "server_error",
            "no_model_endpoint",
        );
    }
    let (message, history) = match conversation(&request.messages) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let session = match header {
        None => None,
        Some(Err(_)) => {
            return invalid("`X-Dataref-Session` is not ASCII", "bad_session_id");
        }
        Some(Ok(id)) => {
            let id = id.trim().to_owned();
            let (principal, owned, name) = (call.principal.clone(), id.clone(), agent.name.clone());
            match call
                .sessions(move |s| s.history(&principal, &owned, Some(&name)))
                .await
            {
                Ok(_) | Err(SessionError::NotFound(_)) => {}
                Err(e) => return send_error(&SendError::Session(e)),
            }
            match host.claim(&call.principal, &id).await {
                Ok(claim) => Some(claim),
                Err(e) => return send_error(&e),
            }
        }
    };
    let session_id = session.as_ref().map(|c| c.session().to_owned());
    let workspace = match call.workspace() {
        Ok(w) => w,
        Err(r) => return r,
    };
    let cancel = call.agents.shutdown.child_token();
    let run = Run {
        agents: call.agents.clone(),
        agent: agent.clone(),
        session,
        ctx: call
            .agents
            .shared
            .context(call.principal.clone(), workspace),
        history,
        message,
        cancel: cancel.clone(),
    };
    let chunks = Chunks {
        id: format!(
            "chatcmpl-{}",
            SessionStore::new_id().trim_start_matches("s-")
        ),
        model: agent.name.clone(),
        created: now_secs(),
        include_usage: request
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
    };
    let mut response = if request.stream.unwrap_or(false) {
        streamed(run, chunks, cancel)
    } else {
        whole(run, chunks, cancel).await
    };
    if let Some(id) = session_id
        && let Ok(v) = HeaderValue::from_str(&id)
    {
        response.headers_mut().insert(SESSION_HEADER, v);
    }
    response
}

/// `stream: false`: the run to its end, then one `chat.completion`. The run is a task of
/// its own; the client going away cancels it (and a kept session records that).
async fn whole(run: Run, chunks: Chunks, cancel: CancellationToken) -> Response {
    let _cancel_if_gone = cancel.drop_guard();
    let task = tokio::spawn(async move { run.go(&NoEvents).await });
    let outcome = match task.await {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => return send_error(&e),
        Err(e) => {
            tracing::error!(error = %e, "a facade run's task failed");
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the run could not be completed; the details are in the server log",
                "server_error",
                "internal",
            );
        }
    };
    if let Some(Stopped::Model(_)) = &outcome.stopped {
        return error(
            StatusCode::BAD_GATEWAY,
            outcome.answer,
            "server_error",
            MODEL_ERROR,
        );
    }
    json_response(
        StatusCode::OK,
        json!({
            "id": chunks.id,
            "object": "chat.completion",
            "created": chunks.created,
            "model": chunks.model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": outcome.answer},
                "finish_reason": finish_reason(outcome.stopped.as_ref()),
            }],
            "usage": usage_json(&outcome),
        }),
    )
}

/// How the chunks of one streamed completion look.
struct Chunks {
    id: String,
    model: String,
    created: i64,
    include_usage: bool,
}

impl Chunks {
    fn chunk(&self, delta: Value, finish: Option<&str>) -> Bytes {
        let mut c = json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        });
        if self.include_usage {
            c["usage"] = Value::Null;
        }
        data(&c)
    }

    fn usage(&self, run: &RunOutcome) -> Bytes {
        data(&json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": usage_json(run),
        }))
    }
}

fn data(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// Turns the run's text deltas into content deltas. The text the final answer has beyond
/// what streamed since the last tool call (a limit's sentence) goes out as one more delta.
struct ChunkEvents {
    chunks: Arc<Chunks>,
    tx: mpsc::UnboundedSender<Bytes>,
    /// Text streamed since the last tool event, and the text of the turn before it (a run
    /// stopped by a limit answers with that turn's text and the limit's sentence).
    since_tools: Mutex<(String, String)>,
}

impl EventSink for ChunkEvents {
    fn event(&self, event: AgentEvent) {
        let mut guard = self
            .since_tools
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (since, before) = &mut *guard;
        match event {
            AgentEvent::TextDelta { text } => {
                since.push_str(&text);
                let _ = self
                    .tx
                    .send(self.chunks.chunk(json!({"content": text}), None));
            }
            AgentEvent::ToolCallStarted { .. }
            | AgentEvent::ToolCallFinished { .. }
            | AgentEvent::ApprovalNeeded { .. } => {
                if !since.is_empty() {
                    *before = std::mem::take(since);
                }
            }
            // The text so far was a draft: what follows is the answer again, checked. A
            // stream cannot take text back; the client reads why the answer repeats.
            AgentEvent::Checked { unmatched } => {
                since.clear();
                before.clear();
                let note = format!(
                    "\n\n(dataref asked the model to check numbers no tool produced: {})\n\n",
                    unmatched.join(", ")
                );
                let _ = self
                    .tx
                    .send(self.chunks.chunk(json!({"content": note}), None));
            }
            // A run the model failed ends in an error event, not in an answer: its text
            // (the error's sentence) is not the assistant's.
            AgentEvent::Final { stopped, .. } if stopped.as_deref() == Some(MODEL_ERROR) => {}
            AgentEvent::Final { text, .. } => {
                let rest = text
                    .strip_prefix(since.as_str())
                    .filter(|_| !since.is_empty())
                    .or_else(|| {
                        text.strip_prefix(before.as_str())
                            .filter(|_| !before.is_empty())
                    })
                    .unwrap_or(&text);
                if !rest.is_empty() {
                    let _ = self
                        .tx
                        .send(self.chunks.chunk(json!({"content": rest}), None));
                }
                since.clear();
            }
            AgentEvent::Usage { .. } | AgentEvent::Error { .. } | AgentEvent::Budget { .. } => {}
        }
    }
}

/// `stream: true`: `chat.completion.chunk`s as the run goes, the finish chunk, the usage
/// chunk when asked for, `data: [DONE]`.
fn streamed(run: Run, chunks: Chunks, cancel: CancellationToken) -> Response {
    let chunks = Arc::new(chunks);
    let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
    let _ = tx.send(chunks.chunk(json!({"role": "assistant", "content": ""}), None));
    let response = sse_response(rx, cancel);
    tokio::spawn(async move {
        let events = ChunkEvents {
            chunks: chunks.clone(),
            tx: tx.clone(),
            since_tools: Mutex::new((String::new(), String::new())),
        };
        match run.go(&events).await {
            // As OpenAI's own stream reports a failure: an `error` event instead of a finish
            // chunk, which its clients raise as an API error (a `stop` would read as an
            // answer).
            Ok(RunOutcome {
                stopped: Some(Stopped::Model(message)),
                ..
            }) => {
                let _ = tx.send(data(&json!({"error": {
                    "message": message,
                    "type": "server_error",
                    "param": null,
                    "code": MODEL_ERROR,
                }})));
            }
            Ok(outcome) => {
                let _ =
                    tx.send(chunks.chunk(json!({}), Some(finish_reason(outcome.stopped.as_ref()))));
                if chunks.include_usage {
                    let _ = tx.send(chunks.usage(&outcome));
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "a streamed facade run failed");
                let _ = tx.send(data(&json!({"error": {
                    "message": public_message(&e),
                    "type": "server_error",
                    "param": null,
                    "code": "run_failed",
                }})));
            }
        }
        let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n"));
    });
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use dataref_agent::Role;

    #[test]
    fn the_last_user_message_is_new_and_system_and_tool_messages_are_ignored() {
        let messages = vec![
            json!({"role": "system", "content": "You are a pirate."}),
            json!({"role": "user", "content": "first"}),
            json!({"role": "assistant", "content": "an answer"}),
            json!({"role": "assistant", "content": null, "tool_calls": []}),
            json!({"role": "tool", "tool_call_id": "x", "content": "rows"}),
            json!({"role": "user", "content": [{"type": "text", "text": "second"}]}),
        ];
        let (message, history) = conversation(&messages).unwrap();
        assert_eq!(message, "second");
        let roles: Vec<Role> = history.iter().map(|m| m.role).collect();
        assert_eq!(roles, vec![Role::User, Role::Assistant]);
        assert!(conversation(&[json!({"role": "system", "content": "x"})]).is_err());
    }

    #[test]
    fn limits_finish_with_length() {
        assert_eq!(finish_reason(None), "stop");
        assert_eq!(finish_reason(Some(&Stopped::MaxTurns(3))), "length");
        assert_eq!(finish_reason(Some(&Stopped::Cancelled)), "stop");
    }
}
