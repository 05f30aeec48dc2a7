//! A scripted OpenAI-compatible model server: a real HTTP/1.1 server on `127.0.0.1:0` that
//! answers `POST …/chat/completions` with the next [`Reply`] of its script, streamed (SSE,
//! chunked, like OpenAI) when the request asks for it, and records every request.
//!
//! ```no_run
//! use dataref_test_support::model_server::{Call, Reply, ScriptedModel};
//! # fn demo() -> anyhow::Result<()> {
//! let server = ScriptedModel::start(vec![
//!     Reply::tool_calls(vec![Call::new("call_1", "fetch_sales", "{}")]),
//!     Reply::status(429).retry_after(1),
//!     Reply::text("done").chunk_split(1),
//! ])?;
//! let base_url = server.url(); // http://127.0.0.1:PORT/v1
//! // … point the client at base_url …
//! assert_eq!(server.remaining(), 0);
//! let bodies = server.requests(); // every request body, in order
//! # let _ = (base_url, bodies); Ok(()) }
//! ```
//!
//! The server runs on a thread of its own with its own tokio runtime, so it serves tests on
//! any runtime (or none); it stops when dropped. Each response is sent with
//! `Connection: close`.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// One tool call a reply makes. Its arguments are sent as given: broken JSON or an unknown
/// tool name is just a `Call` with that text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

impl Call {
    pub fn new(
        id: impl Into<String>,
        name: impl Into<String>,
        arguments: impl Into<String>,
    ) -> Self {
        Self {
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
        }
    }
}

type DynamicReply = Arc<dyn Fn(&Value) -> Reply + Send + Sync>;

#[derive(Clone)]
enum Kind {
    Answer {
        text: String,
        calls: Vec<Call>,
    },
    Status {
        status: u16,
        message: Option<String>,
        raw_body: Option<String>,
    },
    Drop,
    Dynamic(DynamicReply),
}

/// One scripted answer, with modifiers for how it is sent.
#[derive(Clone)]
pub struct Reply {
    kind: Kind,
    streamed: Option<bool>,
    chunk_split: Option<usize>,
    duplicate_indexes: bool,
    usage: Option<(u64, u64)>,
    retry_after: Option<String>,
    delay: Option<Duration>,
    cut_after: Option<usize>,
    finish_reason: Option<String>,
    no_done: bool,
}

impl std::fmt::Debug for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            Kind::Answer { text, calls } => format!("answer {text:?} {calls:?}"),
            Kind::Status { status, .. } => format!("status {status}"),
            Kind::Drop => "drop connection".to_owned(),
            Kind::Dynamic(_) => "dynamic".to_owned(),
        };
        f.debug_struct("Reply")
            .field("kind", &kind)
            .finish_non_exhaustive()
    }
}

impl Reply {
    fn new(kind: Kind) -> Self {
        Self {
            kind,
            streamed: None,
            chunk_split: None,
            duplicate_indexes: false,
            usage: None,
            retry_after: None,
            delay: None,
            cut_after: None,
            finish_reason: None,
            no_done: false,
        }
    }

    /// An assistant text answer (`finish_reason: stop`).
    pub fn text(text: impl Into<String>) -> Self {
        Self::new(Kind::Answer {
            text: text.into(),
            calls: Vec::new(),
        })
    }

    /// One or more (parallel) tool calls (`finish_reason: tool_calls`).
    pub fn tool_calls(calls: Vec<Call>) -> Self {
        Self::new(Kind::Answer {
            text: String::new(),
            calls,
        })
    }

    /// Some text first, then tool calls.
    pub fn text_and_calls(text: impl Into<String>, calls: Vec<Call>) -> Self {
        Self::new(Kind::Answer {
            text: text.into(),
            calls,
        })
    }

    /// An error status with an OpenAI-style body `{"error":{"message":…}}`.
    pub fn status(status: u16) -> Self {
        Self::new(Kind::Status {
            status,
            message: None,
            raw_body: None,
        })
    }

    /// Reads the request, then closes the socket without answering.
    pub fn drop_connection() -> Self {
        Self::new(Kind::Drop)
    }

    /// The reply is made from the request body when it arrives.
    pub fn dynamic(f: impl Fn(&Value) -> Reply + Send + Sync + 'static) -> Self {
        Self::new(Kind::Dynamic(Arc::new(f)))
    }

    /// `false`: answer plain JSON even when the request asked for a stream. `true`: stream
    /// even when it did not.
    pub fn streamed(mut self, streamed: bool) -> Self {
        self.streamed = Some(streamed);
        self
    }

    /// Writes the body in pieces of `n` bytes (one HTTP chunk each, flushed), splitting
    /// lines, events and UTF-8 characters anywhere.
    pub fn chunk_split(mut self, n: usize) -> Self {
        self.chunk_split = Some(n.max(1));
        self
    }

    /// Streams every parallel call with `index: 0` (some servers do), ids kept.
    pub fn duplicate_indexes(mut self) -> Self {
        self.duplicate_indexes = true;
        self
    }

    /// The usage to report (else a rough estimate from the lengths).
    pub fn usage(mut self, prompt_tokens: u64, completion_tokens: u64) -> Self {
        self.usage = Some((prompt_tokens, completion_tokens));
        self
    }

    /// `Retry-After: secs` (for a status reply).
    pub fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs.to_string());
        self
    }

    /// `Retry-After` with any text (an HTTP date, garbage).
    pub fn retry_after_header(mut self, value: impl Into<String>) -> Self {
        self.retry_after = Some(value.into());
        self
    }

    /// A status reply's error message (else one that fits the status).
    pub fn message(mut self, message: impl Into<String>) -> Self {
        if let Kind::Status { message: m, .. } = &mut self.kind {
            *m = Some(message.into());
        }
        self
    }

    /// A status reply's whole body, as is (not JSON, say).
    pub fn raw_body(mut self, body: impl Into<String>) -> Self {
        if let Kind::Status { raw_body, .. } = &mut self.kind {
            *raw_body = Some(body.into());
        }
        self
    }

    /// Waits this long after reading the request before answering.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self
    }

    /// Writes only the first `n` bytes of the stream, then closes the socket mid-body.
    pub fn cut_after(mut self, n: usize) -> Self {
        self.cut_after = Some(n);
        self
    }

    /// The `finish_reason` to send (else `stop` or `tool_calls`).
    pub fn finish_reason(mut self, reason: impl Into<String>) -> Self {
        self.finish_reason = Some(reason.into());
        self
    }

    /// Ends the stream after the finish (and usage) chunk, without `data: [DONE]`.
    pub fn without_done(mut self) -> Self {
        self.no_done = true;
        self
    }
}

/// One request as received.
#[derive(Debug, Clone, PartialEq)]
pub struct Received {
    pub method: String,
    pub path: String,
    /// Names lowercased, in order.
    pub headers: Vec<(String, String)>,
    /// The body as JSON (a JSON string of the raw text when it was not JSON).
    pub body: Value,
}

impl Received {
    /// The first header named `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Default)]
struct State {
    script: VecDeque<Reply>,
    received: Vec<Received>,
}

/// The running server; stops when dropped.
pub struct ScriptedModel {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for ScriptedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptedModel")
            .field("addr", &self.addr)
            .field("remaining", &self.remaining())
            .finish()
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl ScriptedModel {
    /// Binds `127.0.0.1:0` and serves `script`, one reply per chat completions request.
    pub fn start(script: Vec<Reply>) -> Result<Self> {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0")
            .context("binding the scripted model server to 127.0.0.1:0")?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let state = Arc::new(Mutex::new(State {
            script: script.into(),
            received: Vec::new(),
        }));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("building the scripted model server's runtime")?;
        let (tx, rx) = oneshot::channel::<()>();
        let served = state.clone();
        let thread = std::thread::Builder::new()
            .name("scripted-model".into())
            .spawn(move || runtime.block_on(serve(std_listener, served, rx)))
            .context("starting the scripted model server's thread")?;
        Ok(Self {
            addr,
            state,
            shutdown: Some(tx),
            thread: Some(thread),
        })
    }

    /// The base URL a client is given: `http://127.0.0.1:PORT/v1`.
    pub fn url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every chat completions request body received, in order.
    pub fn requests(&self) -> Vec<Value> {
        lock(&self.state)
            .received
            .iter()
            .map(|r| r.body.clone())
            .collect()
    }

    /// Every chat completions request, with method, path and headers.
    pub fn received(&self) -> Vec<Received> {
        lock(&self.state).received.clone()
    }

    /// Replies not yet used.
    pub fn remaining(&self) -> usize {
        lock(&self.state).script.len()
    }

    /// Appends a reply to the script.
    pub fn push(&self, reply: Reply) {
        lock(&self.state).script.push_back(reply);
    }
}

impl Drop for ScriptedModel {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn serve(
    std_listener: std::net::TcpListener,
    state: Arc<Mutex<State>>,
    mut shutdown: oneshot::Receiver<()>,
) {
    let listener = match TcpListener::from_std(std_listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "scripted model server cannot listen");
            return;
        }
    };
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((socket, _)) => {
                    let state = state.clone();
                    tokio::spawn(async move {
                        if let Err(e) = connection(socket, state).await {
                            tracing::debug!(error = %e, "scripted model connection");
                        }
                    });
                }
                Err(e) => tracing::debug!(error = %e, "scripted model accept"),
            },
        }
    }
}

/// The request head and body, or `None` when the client closed first.
async fn read_request(socket: &mut TcpStream) -> Result<Option<Received>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        anyhow::ensure!(buf.len() < 1024 * 1024, "request head too long");
        let n = socket.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_owned();
    let path = parts.next().unwrap_or_default().to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut body = buf[head_end + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked"));
    if chunked {
        body = read_chunked(socket, body).await?;
    } else {
        let length: usize = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        while body.len() < length {
            let n = socket.read(&mut chunk).await?;
            anyhow::ensure!(n > 0, "the client closed mid-body");
            body.extend_from_slice(&chunk[..n]);
        }
        body.truncate(length);
    }
    let body = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    Ok(Some(Received {
        method,
        path,
        headers,
        body,
    }))
}

async fn read_chunked(socket: &mut TcpStream, mut raw: Vec<u8>) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        // Parse what is there; read more when a piece is incomplete.
        let mut pos = 0;
        let mut done = false;
        while let Some(line_end) = raw[pos..].windows(2).position(|w| w == b"\r\n") {
            let size_text = String::from_utf8_lossy(&raw[pos..pos + line_end]).into_owned();
            let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
                .context("bad chunk size")?;
            let data_start = pos + line_end + 2;
            if size == 0 {
                done = true;
                break;
            }
            if raw.len() < data_start + size + 2 {
                break;
            }
            out.extend_from_slice(&raw[data_start..data_start + size]);
            pos = data_start + size + 2;
        }
        if done {
            return Ok(out);
        }
        raw.drain(..pos);
        let n = socket.read(&mut chunk).await?;
        anyhow::ensure!(n > 0, "the client closed mid-body");
        raw.extend_from_slice(&chunk[..n]);
    }
}

/// The models `GET …/models` lists.
pub const LISTED_MODELS: &[&str] = &["gpt-4o", "gpt-4o-mini", "test-model"];

async fn connection(mut socket: TcpStream, state: Arc<Mutex<State>>) -> Result<()> {
    socket.set_nodelay(true)?;
    let Some(request) = read_request(&mut socket).await? else {
        return Ok(());
    };
    // The model list, as OpenAI's `GET /v1/models` answers it (what `dataref doctor` asks);
    // it uses no reply of the script.
    if request.method == "GET" && request.path.ends_with("/models") {
        let data: Vec<Value> = LISTED_MODELS
            .iter()
            .map(|id| json!({"id": id, "object": "model", "owned_by": "scripted"}))
            .collect();
        let body = json!({"object": "list", "data": data});
        return write_json(&mut socket, 200, &[], &body.to_string(), None).await;
    }
    if request.method != "POST" || !request.path.ends_with("/chat/completions") {
        let body = json!({"error": {
            "message": format!("scripted model: no route {} {} (only POST …/chat/completions and GET …/models)", request.method, request.path),
            "type": "invalid_request_error",
        }});
        return write_json(&mut socket, 404, &[], &body.to_string(), None).await;
    }
    let body = request.body.clone();
    let reply = {
        let mut state = lock(&state);
        let answered = state.received.len();
        state.received.push(request);
        state.script.pop_front().ok_or(answered)
    };
    let mut reply = match reply {
        Ok(reply) => reply,
        Err(answered) => {
            let body = json!({"error": {
                "message": format!(
                    "scripted model: the script is exhausted ({answered} requests answered, this is request {})",
                    answered + 1
                ),
                "type": "server_error",
            }});
            return write_json(&mut socket, 500, &[], &body.to_string(), None).await;
        }
    };
    for _ in 0..16 {
        let Kind::Dynamic(f) = &reply.kind else { break };
        let f = f.clone();
        reply = f(&body);
    }
    if let Some(delay) = reply.delay {
        tokio::time::sleep(delay).await;
    }
    match &reply.kind {
        Kind::Drop | Kind::Dynamic(_) => Ok(()),
        Kind::Status {
            status,
            message,
            raw_body,
        } => {
            let text = raw_body.clone().unwrap_or_else(|| {
                let message = message
                    .clone()
                    .unwrap_or_else(|| default_message(*status).to_owned());
                json!({"error": {"message": message, "type": error_type(*status), "code": null}})
                    .to_string()
            });
            let mut headers = Vec::new();
            if let Some(after) = &reply.retry_after {
                headers.push(("Retry-After", after.clone()));
            }
            write_json(&mut socket, *status, &headers, &text, reply.chunk_split).await
        }
        Kind::Answer { text, calls } => {
            let stream = reply
                .streamed
                .unwrap_or_else(|| body.get("stream").and_then(Value::as_bool).unwrap_or(false));
            let model = body
                .get("model")
                .and_then(Value::as_str)
                .unwrap_or("scripted")
                .to_owned();
            let usage = reply
                .usage
                .unwrap_or_else(|| estimate_usage(&body, text, calls));
            let finish = reply.finish_reason.clone().unwrap_or_else(|| {
                if calls.is_empty() {
                    "stop"
                } else {
                    "tool_calls"
                }
                .to_owned()
            });
            if stream {
                let include_usage = body
                    .pointer("/stream_options/include_usage")
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                let sse = sse_body(
                    &reply,
                    &model,
                    text,
                    calls,
                    &finish,
                    include_usage.then_some(usage),
                );
                write_stream(&mut socket, sse.as_bytes(), &reply).await
            } else {
                let answer = whole_body(&model, text, calls, &finish, usage);
                write_json(
                    &mut socket,
                    200,
                    &[],
                    &answer.to_string(),
                    reply.chunk_split,
                )
                .await
            }
        }
    }
}

fn default_message(status: u16) -> &'static str {
    match status {
        400 => "Invalid request: the scripted server refused it",
        401 => "Incorrect API key provided",
        403 => "You are not allowed to use this model",
        404 => "The model does not exist",
        422 => "Unprocessable request",
        429 => "Rate limit reached; try again later",
        500..=599 => "The server had an error while processing your request",
        _ => "scripted error",
    }
}

fn error_type(status: u16) -> &'static str {
    match status {
        401 | 403 => "authentication_error",
        429 => "rate_limit_error",
        500..=599 => "server_error",
        _ => "invalid_request_error",
    }
}

fn estimate_usage(request: &Value, text: &str, calls: &[Call]) -> (u64, u64) {
    let prompt = request.get("messages").map_or(0, |m| m.to_string().len()) / 4;
    let completion = (text.len()
        + calls
            .iter()
            .map(|c| c.name.len() + c.arguments.len())
            .sum::<usize>())
        / 4;
    (prompt.max(1) as u64, completion.max(1) as u64)
}

const CREATED: u64 = 1_700_000_000;

fn whole_body(model: &str, text: &str, calls: &[Call], finish: &str, usage: (u64, u64)) -> Value {
    let mut message = json!({
        "role": "assistant",
        "content": if text.is_empty() && !calls.is_empty() { Value::Null } else { Value::String(text.to_owned()) },
    });
    if !calls.is_empty() {
        message["tool_calls"] = calls
            .iter()
            .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
            .collect();
    }
    json!({
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": CREATED,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": usage_json(usage),
    })
}

fn usage_json((prompt, completion): (u64, u64)) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

/// `s` in pieces of at most `n` characters (never splitting a character).
fn char_pieces(s: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    chars.chunks(n.max(1)).map(|c| c.iter().collect()).collect()
}

/// Arguments in at least two pieces (when there are two characters to split).
fn argument_pieces(s: &str) -> Vec<String> {
    let count = s.chars().count();
    if count < 2 {
        return vec![s.to_owned()];
    }
    char_pieces(s, count.div_ceil(3).max(1))
}

fn sse_body(
    reply: &Reply,
    model: &str,
    text: &str,
    calls: &[Call],
    finish: &str,
    usage: Option<(u64, u64)>,
) -> String {
    let chunk = |choices: Value| {
        json!({
            "id": "chatcmpl-scripted",
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": model,
            "choices": choices,
        })
    };
    let delta = |delta: Value| chunk(json!([{"index": 0, "delta": delta, "finish_reason": null}]));
    let mut events = vec![delta(json!({"role": "assistant", "content": ""}))];
    for piece in char_pieces(text, 4) {
        events.push(delta(json!({"content": piece})));
    }
    for (i, call) in calls.iter().enumerate() {
        let index = if reply.duplicate_indexes { 0 } else { i };
        events.push(delta(json!({"tool_calls": [{
            "index": index,
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }]})));
        for piece in argument_pieces(&call.arguments) {
            events.push(delta(
                json!({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}),
            ));
        }
    }
    events.push(chunk(
        json!([{"index": 0, "delta": {}, "finish_reason": finish}]),
    ));
    if let Some(usage) = usage {
        let mut last = chunk(json!([]));
        last["usage"] = usage_json(usage);
        events.push(last);
    }
    let mut out: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    if !reply.no_done {
        out.push_str("data: [DONE]\n\n");
    }
    out
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}

async fn write_json(
    socket: &mut TcpStream,
    status: u16,
    headers: &[(&str, String)],
    body: &str,
    split: Option<usize>,
) -> Result<()> {
    let mut head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: application/json\r\nConnection: close\r\n",
        reason(status)
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    match split {
        None => {
            head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
            socket.write_all(head.as_bytes()).await?;
            socket.write_all(body.as_bytes()).await?;
        }
        Some(n) => {
            head.push_str("Transfer-Encoding: chunked\r\n\r\n");
            socket.write_all(head.as_bytes()).await?;
            write_chunks(socket, body.as_bytes(), n).await?;
            socket.write_all(b"0\r\n\r\n").await?;
        }
    }
    socket.flush().await?;
    socket.shutdown().await?;
    Ok(())
}

async fn write_chunks(socket: &mut TcpStream, bytes: &[u8], n: usize) -> Result<()> {
    for piece in bytes.chunks(n.max(1)) {
        socket
            .write_all(format!("{:x}\r\n", piece.len()).as_bytes())
            .await?;
        socket.write_all(piece).await?;
        socket.write_all(b"\r\n").await?;
        socket.flush().await?;
    }
    Ok(())
}

async fn write_stream(socket: &mut TcpStream, sse: &[u8], reply: &Reply) -> Result<()> {
    let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n\
                Connection: close\r\nTransfer-Encoding: chunked\r\n\r\n";
    socket.write_all(head.as_bytes()).await?;
    let (body, cut) = match reply.cut_after {
        Some(n) if n < sse.len() => (&sse[..n], true),
        _ => (sse, false),
    };
    match reply.chunk_split {
        Some(n) => write_chunks(socket, body, n).await?,
        None => {
            // One HTTP chunk per event, as servers flush them.
            let mut rest = body;
            while !rest.is_empty() {
                let end = rest
                    .windows(2)
                    .position(|w| w == b"\n\n")
                    .map_or(rest.len(), |at| at + 2);
                write_chunks(socket, &rest[..end], end).await?;
                rest = &rest[end..];
            }
        }
    }
    if !cut {
        socket.write_all(b"0\r\n\r\n").await?;
    }
    socket.flush().await?;
    socket.shutdown().await?;
    Ok(())
}
