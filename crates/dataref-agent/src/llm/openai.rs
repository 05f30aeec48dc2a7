//! OpenAI-compatible Chat Completions: `POST {base_url}/chat/completions`, streamed (SSE) or
//! not, with retries on 429/5xx and dropped connections.
//!
//! The same wire format is spoken by OpenAI, vLLM, llama.cpp's server, Ollama, LiteLLM and
//! OpenRouter; their differences are met tolerantly: tool-call deltas are assembled by id
//! when a delta has one and by index otherwise (some servers number every parallel call
//! 0), a stream that ends without `[DONE]` after its `finish_reason` is complete, and a
//! server that answers a streamed request with plain JSON is read as JSON.
//!
//! The API key is sent as `Authorization: Bearer` and appears nowhere else: not in
//! `Debug`, not in errors (a provider that echoes it back has it replaced by `***`), not in
//! logs.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue, RETRY_AFTER};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::sse::{SseEvent, SseParser};
use super::{ChatModel, ChatRequest, ChatResponse, LlmError, TextSink};
use crate::message::{AssistantToolCall, Message, Role, Usage};

/// The first backoff; each retry doubles it, up to [`BACKOFF_CAP`].
const BACKOFF_BASE: Duration = Duration::from_millis(250);
const BACKOFF_CAP: Duration = Duration::from_secs(8);
/// The longest provider message or body excerpt an error carries.
const EXCERPT_CHARS: usize = 300;

/// Where and how to reach one OpenAI-compatible endpoint.
#[derive(Clone, PartialEq)]
pub struct OpenAiSettings {
    /// The base URL, e.g. `https://api.openai.com/v1` (`/chat/completions` is appended).
    pub base_url: String,
    /// The key, already expanded from the environment; sent as `Authorization: Bearer`.
    pub api_key: Option<String>,
    /// One request's whole time, streaming included.
    pub timeout: Duration,
    /// Retries after the first attempt, on 429/5xx and connection errors.
    pub max_retries: u32,
    /// The longest wait a `Retry-After` may ask for (longer is capped to this).
    pub max_retry_after: Duration,
    /// Ask for a streamed answer (SSE). Default true.
    pub stream: bool,
}

impl OpenAiSettings {
    pub fn new(base_url: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            api_key: None,
            timeout: Duration::from_secs(120),
            max_retries: 4,
            max_retry_after: Duration::from_secs(30),
            stream: true,
        }
    }
}

/// Never the key: only whether there is one.
impl std::fmt::Debug for OpenAiSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiSettings")
            .field("base_url", &redact_url(&self.base_url))
            .field("api_key", &self.api_key.as_ref().map(|_| "***"))
            .field("timeout", &self.timeout)
            .field("max_retries", &self.max_retries)
            .field("max_retry_after", &self.max_retry_after)
            .field("stream", &self.stream)
            .finish()
    }
}

/// A Chat Completions client for one endpoint.
pub struct OpenAiCompatible {
    settings: OpenAiSettings,
    client: reqwest::Client,
    /// `{base_url}/chat/completions`, as requested.
    url: String,
    /// The same for people: any password in the URL replaced by `***`.
    endpoint: String,
    /// `Authorization: Bearer …`, marked sensitive.
    auth: Option<HeaderValue>,
    /// Strings never to show: the key, a password in the URL.
    secrets: Vec<String>,
}

impl std::fmt::Debug for OpenAiCompatible {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiCompatible")
            .field("endpoint", &self.endpoint)
            .field("api_key", &self.auth.as_ref().map(|_| "***"))
            .field("stream", &self.settings.stream)
            .finish_non_exhaustive()
    }
}

impl OpenAiCompatible {
    /// Checks the URL and key and makes the HTTP client (no request is sent).
    pub fn new(settings: OpenAiSettings) -> Result<Self, LlmError> {
        let url = format!(
            "{}/chat/completions",
            settings.base_url.trim().trim_end_matches('/')
        );
        let endpoint = redact_url(&url);
        let parsed = reqwest::Url::parse(&url).map_err(|e| LlmError::Unreachable {
            endpoint: endpoint.clone(),
            detail: format!("not a valid URL ({e}); it looks like https://api.openai.com/v1"),
        })?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(LlmError::Unreachable {
                endpoint,
                detail: format!("the URL scheme is `{}`, not http or https", parsed.scheme()),
            });
        }
        let mut secrets = Vec::new();
        if let Some(password) = parsed.password().filter(|p| !p.is_empty()) {
            secrets.push(password.to_owned());
        }
        let auth = match settings.api_key.as_deref().map(str::trim) {
            Some(key) if !key.is_empty() => {
                secrets.push(key.to_owned());
                let mut value = HeaderValue::from_str(&format!("Bearer {key}")).map_err(|_| {
                    LlmError::Unreachable {
                        endpoint: endpoint.clone(),
                        detail: "the API key has characters an HTTP header cannot carry \
                                 (a line break or a non-ASCII character?)"
                            .into(),
                    }
                })?;
                value.set_sensitive(true);
                Some(value)
            }
            _ => None,
        };
        dataref_config::tls::install_provider();
        let client = reqwest::Client::builder()
            .connect_timeout(settings.timeout.min(Duration::from_secs(30)))
            .build()
            .map_err(|e| LlmError::Unreachable {
                endpoint: endpoint.clone(),
                detail: format!("cannot set up the HTTP client: {}", causes(&e)),
            })?;
        Ok(Self {
            settings,
            client,
            url,
            endpoint,
            auth,
            secrets,
        })
    }

    /// The models the endpoint lists (`GET {base}/models`, OpenAI's list): one request,
    /// no retry, at most 10 s, for `dataref doctor` to say whether the endpoint answers,
    /// takes the key and serves the model. An endpoint that lists none gives an empty list.
    pub async fn models(&self) -> Result<Vec<String>, LlmError> {
        let url = format!(
            "{}/models",
            self.settings.base_url.trim().trim_end_matches('/')
        );
        let mut request = self
            .client
            .get(&url)
            .header(ACCEPT, "application/json")
            .timeout(self.settings.timeout.min(Duration::from_secs(10)));
        if let Some(auth) = &self.auth {
            request = request.header(AUTHORIZATION, auth.clone());
        }
        let mut response = request
            .send()
            .await
            .map_err(|e| self.redact_error(self.unreachable(causes(&e))))?;
        let status = response.status();
        if !status.is_success() {
            let text = read_capped(&mut response, MAX_ERROR_BYTES)
                .await
                .unwrap_or_default();
            return Err(self.redact_error(LlmError::Status {
                endpoint: redact_url(&url),
                status: status.as_u16(),
                message: provider_message(
                    &String::from_utf8_lossy(&text),
                    status.canonical_reason(),
                ),
            }));
        }
        let bytes = read_capped(&mut response, MAX_ERROR_BYTES * 16)
            .await
            .map_err(|_| self.protocol("the model list could not be read whole"))?;
        let list: Value = serde_json::from_slice(&bytes)
            .map_err(|e| self.protocol(format!("`GET /models` did not answer JSON ({e})")))?;
        Ok(list
            .get("data")
            .and_then(Value::as_array)
            .map(|models| {
                models
                    .iter()
                    .filter_map(|m| m.get("id").and_then(Value::as_str).map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// `s` with every secret replaced by `***`.
    fn redact(&self, s: String) -> String {
        self.secrets.iter().fold(s, |s, secret| {
            if s.contains(secret.as_str()) {
                s.replace(secret.as_str(), "***")
            } else {
                s
            }
        })
    }

    /// The same error with its texts redacted.
    fn redact_error(&self, e: LlmError) -> LlmError {
        match e {
            LlmError::Unreachable { endpoint, detail } => LlmError::Unreachable {
                endpoint,
                detail: self.redact(detail),
            },
            LlmError::Status {
                endpoint,
                status,
                message,
            } => LlmError::Status {
                endpoint,
                status,
                message: self.redact(message),
            },
            LlmError::Protocol { endpoint, detail } => LlmError::Protocol {
                endpoint,
                detail: self.redact(detail),
            },
            other => other,
        }
    }

    fn unreachable(&self, detail: impl Into<String>) -> LlmError {
        LlmError::Unreachable {
            endpoint: self.endpoint.clone(),
            detail: detail.into(),
        }
    }

    fn protocol(&self, detail: impl Into<String>) -> LlmError {
        LlmError::Protocol {
            endpoint: self.endpoint.clone(),
            detail: detail.into(),
        }
    }

    /// One attempt: send, then read the whole answer. `shown` is set once text reached the
    /// sink (from then on the attempt is never repeated).
    async fn attempt(
        &self,
        body: &[u8],
        sink: &dyn TextSink,
        shown: &mut bool,
    ) -> Result<ChatResponse, Failure> {
        let stream = self.settings.stream;
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(
            ACCEPT,
            HeaderValue::from_static(if stream {
                "text/event-stream, application/json"
            } else {
                "application/json"
            }),
        );
        if let Some(auth) = &self.auth {
            headers.insert(AUTHORIZATION, auth.clone());
        }
        let sent = self
            .client
            .post(&self.url)
            .headers(headers)
            .body(body.to_vec())
            .send()
            .await;
        let mut response = match sent {
            Ok(response) => response,
            Err(e) if e.is_builder() => {
                return Err(Failure::Fatal(self.unreachable(causes(&e))));
            }
            Err(e) => {
                return Err(Failure::Retry {
                    error: self.unreachable(causes(&e)),
                    after: None,
                });
            }
        };
        let status = response.status();
        if !status.is_success() {
            let after = retry_after(response.headers());
            // An error's body is read only as far as its message can be.
            let text = String::from_utf8_lossy(
                &read_capped(&mut response, MAX_ERROR_BYTES)
                    .await
                    .unwrap_or_default(),
            )
            .into_owned();
            let error = LlmError::Status {
                endpoint: self.endpoint.clone(),
                status: status.as_u16(),
                message: provider_message(&text, status.canonical_reason()),
            };
            let code = status.as_u16();
            return Err(if code == 429 || (500..=599).contains(&code) {
                Failure::Retry { error, after }
            } else {
                Failure::Fatal(error)
            });
        }
        let is_sse = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
        if is_sse {
            return self.read_stream(&mut response, sink, shown).await;
        }
        let bytes = match read_capped(&mut response, MAX_ANSWER_BYTES).await {
            Ok(bytes) => bytes,
            Err(Capped::Over) => {
                return Err(Failure::Fatal(self.protocol(format!(
                    "the answer is over {} MiB",
                    MAX_ANSWER_BYTES >> 20
                ))));
            }
            Err(Capped::Read(e)) => {
                return Err(Failure::Retry {
                    error: self.unreachable(format!(
                        "the connection dropped while the answer was read: {}",
                        causes(&e)
                    )),
                    after: None,
                });
            }
        };
        let answer = self.parse_whole(&bytes).map_err(Failure::Fatal)?;
        if !answer.message.content.is_empty() {
            *shown = true;
            sink.text(&answer.message.content);
        }
        Ok(answer)
    }

    /// A non-streamed answer: `choices[0].message`.
    fn parse_whole(&self, bytes: &[u8]) -> Result<ChatResponse, LlmError> {
        let value: Value = serde_json::from_slice(bytes).map_err(|e| {
            self.protocol(format!(
                "the answer is not JSON ({e}): {}",
                excerpt(&String::from_utf8_lossy(bytes))
            ))
        })?;
        if let Some(message) = error_message(&value) {
            return Err(self.protocol(format!("the answer is an error: {message}")));
        }
        let choice = value
            .get("choices")
            .and_then(Value::as_array)
            .and_then(|c| c.first())
            .ok_or_else(|| {
                self.protocol(format!(
                    "the answer has no `choices`: {}",
                    excerpt(&value.to_string())
                ))
            })?;
        let message = choice.get("message").unwrap_or(&Value::Null);
        let content = match message.get("content") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect(),
            _ => String::new(),
        };
        let mut calls = Vec::new();
        for (i, call) in message
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let function = call.get("function").unwrap_or(&Value::Null);
            calls.push(AssistantToolCall {
                id: call
                    .get("id")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .map_or_else(|| format!("call_{i}"), str::to_owned),
                name: function
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                arguments: match function.get("arguments") {
                    Some(Value::String(s)) => s.clone(),
                    None | Some(Value::Null) => String::new(),
                    Some(other) => other.to_string(),
                },
            });
        }
        Ok(ChatResponse {
            message: Message::assistant_calls(content, calls),
            usage: value.get("usage").and_then(parse_usage),
            finish_reason: choice
                .get("finish_reason")
                .and_then(Value::as_str)
                .map(str::to_owned),
        })
    }

    /// A streamed answer: SSE events of `chat.completion.chunk`s until `[DONE]`.
    async fn read_stream(
        &self,
        response: &mut reqwest::Response,
        sink: &dyn TextSink,
        shown: &mut bool,
    ) -> Result<ChatResponse, Failure> {
        let mut parser = SseParser::new();
        let mut events: Vec<SseEvent> = Vec::new();
        let mut state = StreamState::default();
        let mut read = 0usize;
        loop {
            let chunk = response.chunk().await;
            let ended = match chunk {
                Ok(Some(bytes)) => {
                    read += bytes.len();
                    if read > MAX_ANSWER_BYTES {
                        return Err(Failure::Fatal(self.protocol(format!(
                            "the answer is over {} MiB",
                            MAX_ANSWER_BYTES >> 20
                        ))));
                    }
                    parser
                        .push(&bytes, &mut events)
                        .map_err(|d| Failure::Fatal(self.protocol(d)))?;
                    None
                }
                Ok(None) => {
                    parser.finish(&mut events);
                    Some(None)
                }
                Err(e) => Some(Some(causes(&e))),
            };
            for event in events.drain(..) {
                if state
                    .on_event(&event, sink, shown)
                    .map_err(|d| Failure::Fatal(self.protocol(d)))?
                {
                    return Ok(state.into_response());
                }
            }
            let Some(error) = ended else { continue };
            if error.is_none() && state.finish_reason.is_some() {
                // No `[DONE]`, but the model said it was finished.
                return Ok(state.into_response());
            }
            let why = error.map_or_else(
                || "the stream ended before the answer was complete".to_owned(),
                |e| format!("the stream broke off: {e}"),
            );
            return Err(if *shown {
                Failure::Fatal(self.protocol(format!(
                    "{why}, after part of the answer was already shown (not retried, so the text \
                     is not shown twice)"
                )))
            } else {
                Failure::Retry {
                    error: self.unreachable(why),
                    after: None,
                }
            });
        }
    }

    /// How long to wait before retry number `retry` (1-based).
    fn wait_before(&self, retry: u32, after: Option<Duration>) -> Duration {
        if let Some(after) = after {
            return after.min(self.settings.max_retry_after);
        }
        let exp = BACKOFF_BASE
            .saturating_mul(1u32 << (retry.saturating_sub(1)).min(16))
            .min(BACKOFF_CAP);
        // Equal jitter: half fixed, half random.
        let half = exp / 2;
        let random = getrandom::u64().unwrap_or(0) % (half.as_millis() as u64 + 1);
        half + Duration::from_millis(random)
    }
}

#[async_trait]
impl ChatModel for OpenAiCompatible {
    fn endpoint(&self) -> &str {
        &self.endpoint
    }

    async fn complete(
        &self,
        request: &ChatRequest,
        sink: &dyn TextSink,
        cancel: &CancellationToken,
    ) -> Result<ChatResponse, LlmError> {
        let body = serde_json::to_vec(&request_body(request, self.settings.stream))
            .map_err(|e| self.protocol(format!("cannot write the request as JSON: {e}")))?;
        let attempts = self.settings.max_retries.saturating_add(1);
        let mut attempt = 0;
        loop {
            attempt += 1;
            if cancel.is_cancelled() {
                return Err(LlmError::Cancelled);
            }
            let mut shown = false;
            let outcome = tokio::select! {
                biased;
                () = cancel.cancelled() => return Err(LlmError::Cancelled),
                r = tokio::time::timeout(self.settings.timeout, self.attempt(&body, sink, &mut shown)) => r,
            };
            let (error, after) = match outcome {
                Ok(Ok(response)) => return Ok(response),
                Ok(Err(Failure::Fatal(e))) => return Err(self.redact_error(e)),
                Ok(Err(Failure::Retry { error, after })) => (error, after),
                Err(_elapsed) => {
                    let error = LlmError::Timeout {
                        endpoint: self.endpoint.clone(),
                        after: self.settings.timeout,
                    };
                    if shown {
                        return Err(error);
                    }
                    (error, None)
                }
            };
            let error = self.redact_error(error);
            if attempt >= attempts {
                return Err(gave_up(error, attempt));
            }
            let wait = self.wait_before(attempt, after);
            tracing::warn!(
                endpoint = %self.endpoint,
                attempt,
                of = attempts,
                wait_ms = wait.as_millis() as u64,
                error = %error,
                "model request failed; retrying"
            );
            tokio::select! {
                biased;
                () = cancel.cancelled() => return Err(LlmError::Cancelled),
                () = tokio::time::sleep(wait) => {}
            }
            tracing::debug!(endpoint = %self.endpoint, attempt = attempt + 1, "model request retry");
        }
    }
}

/// What one attempt came to, when not an answer.
enum Failure {
    /// 429, 5xx, a connection error, a stream cut before any text was shown.
    Retry {
        error: LlmError,
        after: Option<Duration>,
    },
    /// Never repeated: 4xx, a broken answer, a stream cut after text was shown.
    Fatal(LlmError),
}

/// The last error, saying how many attempts were made.
fn gave_up(error: LlmError, attempts: u32) -> LlmError {
    if attempts < 2 {
        return error;
    }
    let note = format!(" (gave up after {attempts} attempts)");
    match error {
        LlmError::Unreachable { endpoint, detail } => LlmError::Unreachable {
            endpoint,
            detail: detail + &note,
        },
        LlmError::Status {
            endpoint,
            status,
            message,
        } => LlmError::Status {
            endpoint,
            status,
            message: message + &note,
        },
        other => other,
    }
}

/// The Chat Completions request body.
fn request_body(request: &ChatRequest, stream: bool) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), Value::String(request.model.clone()));
    body.insert(
        "messages".into(),
        Value::Array(request.messages.iter().map(message_json).collect()),
    );
    if !request.tools.is_empty() {
        let tools = request
            .tools
            .iter()
            .map(|t| {
                json!({
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    }
                })
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    if let Some(t) = request.temperature {
        // Through the decimal text, so 0.2f32 is 0.2 and not 0.20000000298023224.
        let t = t.to_string().parse::<f64>().unwrap_or(f64::from(t));
        body.insert("temperature".into(), json!(t));
    }
    if let Some(m) = request.max_tokens {
        body.insert("max_tokens".into(), json!(m));
    }
    if stream {
        body.insert("stream".into(), Value::Bool(true));
        body.insert("stream_options".into(), json!({ "include_usage": true }));
    }
    Value::Object(body)
}

fn message_json(m: &Message) -> Value {
    let role = match m.role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    };
    let mut out = Map::new();
    out.insert("role".into(), Value::String(role.into()));
    let content = if m.role == Role::Assistant && m.content.is_empty() && !m.tool_calls.is_empty() {
        Value::Null
    } else {
        Value::String(m.content.clone())
    };
    out.insert("content".into(), content);
    if !m.tool_calls.is_empty() {
        let calls = m
            .tool_calls
            .iter()
            .map(|c| {
                json!({
                    "id": c.id,
                    "type": "function",
                    "function": { "name": c.name, "arguments": c.arguments },
                })
            })
            .collect();
        out.insert("tool_calls".into(), Value::Array(calls));
    }
    if let Some(id) = &m.tool_call_id {
        out.insert("tool_call_id".into(), Value::String(id.clone()));
    }
    Value::Object(out)
}

/// A streamed answer as it is assembled.
#[derive(Default)]
struct StreamState {
    content: String,
    calls: CallAssembler,
    finish_reason: Option<String>,
    usage: Option<Usage>,
}

impl StreamState {
    /// Takes one event; `Ok(true)` at `[DONE]`.
    fn on_event(
        &mut self,
        event: &SseEvent,
        sink: &dyn TextSink,
        shown: &mut bool,
    ) -> Result<bool, String> {
        let data = event.data.trim();
        if data == "[DONE]" {
            return Ok(true);
        }
        if data.is_empty() {
            return Ok(false);
        }
        let chunk: Value = serde_json::from_str(data)
            .map_err(|e| format!("a stream event is not JSON ({e}): {}", excerpt(data)))?;
        if let Some(message) = error_message(&chunk) {
            return Err(format!("the stream carried an error: {message}"));
        }
        if let Some(usage) = chunk.get("usage").and_then(parse_usage) {
            self.usage = Some(usage);
        }
        let choices = chunk.get("choices").and_then(Value::as_array);
        let Some(choice) = choices
            .into_iter()
            .flatten()
            .find(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0) == 0)
        else {
            return Ok(false);
        };
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish_reason = Some(reason.to_owned());
        }
        let Some(delta) = choice.get("delta") else {
            return Ok(false);
        };
        if let Some(text) = delta.get("content").and_then(Value::as_str)
            && !text.is_empty()
        {
            self.content.push_str(text);
            *shown = true;
            sink.text(text);
        }
        for call in delta
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            self.calls.delta(call);
        }
        Ok(false)
    }

    fn into_response(self) -> ChatResponse {
        ChatResponse {
            message: Message::assistant_calls(self.content, self.calls.finish()),
            usage: self.usage,
            finish_reason: self.finish_reason,
        }
    }
}

/// Tool-call deltas, assembled by id when a delta carries one, else by index.
#[derive(Default)]
struct CallAssembler {
    calls: Vec<PartialCall>,
    by_id: HashMap<String, usize>,
    /// The most recent call at each index.
    at_index: HashMap<u64, usize>,
}

#[derive(Default)]
struct PartialCall {
    id: Option<String>,
    /// The index its first delta gave.
    index: Option<u64>,
    name: String,
    arguments: String,
}

impl CallAssembler {
    fn delta(&mut self, delta: &Value) {
        let id = delta
            .get("id")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty());
        let index = delta.get("index").and_then(Value::as_u64);
        let slot = match (id, index) {
            // The call at this index with this id goes on.
            (Some(id), Some(index))
                if self
                    .at_index
                    .get(&index)
                    .is_some_and(|&slot| self.calls[slot].id.as_deref() == Some(id)) =>
            {
                self.at_index[&index]
            }
            // A known id at its own index (or without one) continues that call; the same id
            // at another index is another call (some servers give every call one id).
            (Some(id), index)
                if self.by_id.get(id).is_some_and(|&slot| {
                    index.is_none()
                        || self.calls[slot].index.is_none()
                        || self.calls[slot].index == index
                }) =>
            {
                self.by_id[id]
            }
            (Some(id), index) => {
                // A new id: a call at this index that has no id yet is this one (its id came
                // late); any other is an earlier call at a reused index.
                let unnamed = index
                    .and_then(|i| self.at_index.get(&i).copied())
                    .filter(|&slot| self.calls[slot].id.is_none());
                let slot = unnamed.unwrap_or_else(|| self.push());
                self.calls[slot].id = Some(id.to_owned());
                self.by_id.insert(id.to_owned(), slot);
                slot
            }
            (None, Some(index)) => match self.at_index.get(&index) {
                Some(&slot) => slot,
                None => self.push(),
            },
            (None, None) => {
                if self.calls.is_empty() {
                    self.push()
                } else {
                    self.calls.len() - 1
                }
            }
        };
        if let Some(index) = index {
            self.at_index.insert(index, slot);
        }
        let call = &mut self.calls[slot];
        if call.index.is_none() {
            call.index = index;
        }
        if let Some(function) = delta.get("function") {
            if let Some(name) = function.get("name").and_then(Value::as_str) {
                call.name.push_str(name);
            }
            match function.get("arguments") {
                Some(Value::String(s)) => call.arguments.push_str(s),
                None | Some(Value::Null) => {}
                Some(other) => call.arguments.push_str(&other.to_string()),
            }
        }
    }

    fn push(&mut self) -> usize {
        self.calls.push(PartialCall::default());
        self.calls.len() - 1
    }

    fn finish(self) -> Vec<AssistantToolCall> {
        self.calls
            .into_iter()
            .enumerate()
            .map(|(i, c)| AssistantToolCall {
                id: c.id.unwrap_or_else(|| format!("call_{i}")),
                name: c.name,
                arguments: c.arguments,
            })
            .collect()
    }
}

fn parse_usage(v: &Value) -> Option<Usage> {
    let prompt = v.get("prompt_tokens").and_then(Value::as_u64);
    let completion = v.get("completion_tokens").and_then(Value::as_u64);
    if prompt.is_none() && completion.is_none() {
        return None;
    }
    Some(Usage {
        prompt_tokens: prompt.unwrap_or(0),
        completion_tokens: completion.unwrap_or(0),
    })
}

/// `{"error":{"message":…}}`, `{"error":"…"}` (Ollama, some proxies).
fn error_message(v: &Value) -> Option<String> {
    match v.get("error")? {
        Value::String(s) => Some(excerpt(s)),
        Value::Object(o) => o
            .get("message")
            .and_then(Value::as_str)
            .map(excerpt)
            .or_else(|| Some(excerpt(&Value::Object(o.clone()).to_string()))),
        Value::Null => None,
        other => Some(excerpt(&other.to_string())),
    }
}

/// The provider's message out of an error body, else a short excerpt of the body.
fn provider_message(body: &str, reason: Option<&str>) -> String {
    if let Ok(v) = serde_json::from_str::<Value>(body) {
        if let Some(m) = error_message(&v) {
            return m;
        }
        if let Some(m) = v.get("message").and_then(Value::as_str) {
            return excerpt(m);
        }
    }
    let body = body.trim();
    if body.is_empty() {
        reason.unwrap_or("no message").to_owned()
    } else {
        excerpt(body)
    }
}

/// At most [`EXCERPT_CHARS`] characters, on one line.
fn excerpt(s: &str) -> String {
    let s = s.trim();
    let mut out: String = s
        .chars()
        .take(EXCERPT_CHARS)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if s.chars().nth(EXCERPT_CHARS).is_some() {
        out.push('…');
    }
    out
}

/// `Retry-After` (seconds or an HTTP date), or OpenAI's `retry-after-ms`.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    if let Some(ms) = headers
        .get("retry-after-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|ms| ms.is_finite() && *ms >= 0.0)
    {
        return Some(Duration::from_secs_f64(ms.min(1e9) / 1000.0));
    }
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = http_date(value)?;
    let now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?.as_secs();
    Some(Duration::from_secs(at.saturating_sub(now)))
}

/// An IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`) as Unix seconds.
fn http_date(s: &str) -> Option<u64> {
    let parts: Vec<&str> = s.split_whitespace().collect();
    let [_, day, month, year, time, "GMT"] = parts.as_slice() else {
        return None;
    };
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month = MONTHS.iter().position(|m| m == month)? as i64 + 1;
    let day: i64 = day.parse().ok()?;
    let year: i64 = year.parse().ok()?;
    let mut hms = time.split(':').map(|p| p.parse::<i64>().ok());
    let (h, m, sec) = (hms.next()??, hms.next()??, hms.next()??);
    // A year past 9999 is no retry time (and would overflow the seconds).
    if !(1..=31).contains(&day) || !(1970..=9999).contains(&year) || h > 23 || m > 59 || sec > 60 {
        return None;
    }
    let days = dataref_protocol::days_from_civil(year, month as u32, day as u32);
    u64::try_from(days * 86_400 + h * 3600 + m * 60 + sec).ok()
}

/// The URL with any password replaced by `***`.
fn redact_url(url: &str) -> String {
    match reqwest::Url::parse(url.trim()) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        _ => url.trim().to_owned(),
    }
}

/// The most of one answer read (a model's reply is kilobytes; this bounds a broken server).
const MAX_ANSWER_BYTES: usize = 32 << 20;
/// The most of an error's body read (its message is at its start).
const MAX_ERROR_BYTES: usize = 64 << 10;

/// Why [`read_capped`] stopped.
enum Capped {
    Over,
    Read(reqwest::Error),
}

/// The body, chunk by chunk, refused past `cap` bytes.
async fn read_capped(response: &mut reqwest::Response, cap: usize) -> Result<Vec<u8>, Capped> {
    let mut out = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(Capped::Read)? {
        if out.len() + chunk.len() > cap {
            return Err(Capped::Over);
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// An error and its sources, each once, joined with `: ` ("error sending request" alone
/// does not say "connection refused").
fn causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(e);
    while let Some(err) = next {
        let text = err.to_string();
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
    fn http_dates_parse() {
        assert_eq!(
            http_date("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(784_111_777)
        );
        assert_eq!(http_date("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        assert_eq!(http_date("Sunday, 06-Nov-94 08:49:37 GMT"), None);
        assert_eq!(http_date("soon"), None);
        assert_eq!(http_date("Sun, 06 Nov 1000000000000 08:49:37 GMT"), None);
    }

    #[test]
    fn provider_messages_and_excerpts() {
        assert_eq!(
            provider_message(r#"{"error":{"message":"bad key","type":"x"}}"#, None),
            "bad key"
        );
        assert_eq!(
            provider_message(r#"{"error":"model not found"}"#, None),
            "model not found"
        );
        assert_eq!(provider_message("", Some("Bad Gateway")), "Bad Gateway");
        let long = "x".repeat(1000);
        assert_eq!(
            provider_message(&long, None).chars().count(),
            EXCERPT_CHARS + 1
        );
    }

    #[test]
    fn passwords_in_urls_are_hidden() {
        assert_eq!(
            redact_url("https://user:hunter2@example.com/v1"),
            "https://user:***@example.com/v1"
        );
        assert_eq!(
            redact_url("http://localhost:8080/v1"),
            "http://localhost:8080/v1"
        );
    }

    #[test]
    fn one_id_at_two_indexes_is_two_calls() {
        let mut a = CallAssembler::default();
        for d in [
            json!({"index":0,"id":"same","function":{"name":"f","arguments":"{\"a\""}}),
            json!({"index":1,"id":"same","function":{"name":"g","arguments":"{}"}}),
            json!({"index":0,"id":"same","function":{"arguments":":1}"}}),
        ] {
            a.delta(&d);
        }
        let got: Vec<(String, String)> = a
            .finish()
            .into_iter()
            .map(|c| (c.name, c.arguments))
            .collect();
        assert_eq!(
            got,
            [
                ("f".to_owned(), "{\"a\":1}".to_owned()),
                ("g".to_owned(), "{}".to_owned())
            ]
        );
    }

    #[test]
    fn reused_indexes_with_new_ids_are_new_calls() {
        let mut a = CallAssembler::default();
        for d in [
            json!({"index":0,"id":"a","function":{"name":"f","arguments":""}}),
            json!({"index":0,"function":{"arguments":"{\"x\""}}),
            json!({"index":0,"function":{"arguments":":1}"}}),
            json!({"index":0,"id":"b","function":{"name":"g","arguments":"{}"}}),
            json!({"index":1,"function":{"name":"h"}}),
            json!({"function":{"arguments":"[]"}}),
        ] {
            a.delta(&d);
        }
        let calls = a.finish();
        let got: Vec<(&str, &str, &str)> = calls
            .iter()
            .map(|c| (c.id.as_str(), c.name.as_str(), c.arguments.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("a", "f", "{\"x\":1}"),
                ("b", "g", "{}"),
                ("call_2", "h", "[]")
            ]
        );
    }
}
