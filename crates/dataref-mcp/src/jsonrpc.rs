//! Every JSON-RPC message gets an answer, on stdio and over HTTP.
//!
//! rmcp drops a stdio line it cannot parse as JSON (nesting past serde_json's depth limit,
//! invalid UTF-8, a lone surrogate escape) without a word, so the client waits forever,
//! and over HTTP it answers such a body with a plain-text 415. Here each incoming message
//! is checked before rmcp sees it ([`check`]): one that is not JSON gets a `-32700` parse
//! error, one that is JSON but not a JSON-RPC message gets `-32600` (`-32602` when it names
//! a method but its params do not fit), each with the request's `id` when it can be read
//! even from broken JSON, `null` otherwise.
//!
//! - stdio (and any byte stream): [`transport`] is an rmcp [`Transport`] whose reader task
//!   checks every line and writes the error itself, through the same writer (one lock, one
//!   whole line per write) that carries rmcp's messages, so lines never interleave;
//! - HTTP: [`check_post`] (through [`crate::StreamableHttp::handle`]) reads a POST body, answers a bad one with HTTP 400 and the
//!   JSON-RPC error as an `application/json` body (the Streamable HTTP transport's answer
//!   to input the server cannot accept), and hands a good one on to rmcp unchanged.

use std::sync::Arc;

use std::convert::Infallible;

use bytes::Bytes;
use dataref_ops::metrics;
use http::{Request, Response, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use rmcp::RoleServer;
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, ErrorCode, JsonRpcMessage, RequestId};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{Mutex, mpsc};

/// The longest line (one message) read on a byte stream, as rmcp's own stdio transport.
pub(crate) const MAX_LINE_BYTES: usize = rmcp::transport::async_rw::DEFAULT_MAX_LINE_LENGTH;
/// Messages checked but not yet taken by rmcp; the reader waits beyond this.
const QUEUE: usize = 16;

/// What to do with one incoming message.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// A message rmcp can take.
    Message(Box<ClientJsonRpcMessage>),
    /// A notification that does not fit (such as one of a protocol rmcp does not know):
    /// JSON-RPC never answers a notification.
    Ignore,
    /// The error response to send back (a whole JSON-RPC error object).
    Reject(Value),
}

/// Counts one incoming message in the metrics: a request by its method (`other` for one
/// of a protocol rmcp does not know), a refused message as `invalid`. Responses and
/// notifications are not requests.
fn count(transport: metrics::Transport, verdict: &Verdict) {
    let method = match verdict {
        Verdict::Message(message) => match message.as_ref() {
            JsonRpcMessage::Request(r) => match &r.request {
                ClientRequest::CustomRequest(_) => metrics::OTHER,
                known => known.method(),
            },
            JsonRpcMessage::Response(_)
            | JsonRpcMessage::Notification(_)
            | JsonRpcMessage::Error(_) => return,
        },
        Verdict::Ignore => return,
        Verdict::Reject(_) => "invalid",
    };
    metrics::mcp_request(transport, method);
}

/// Checks one message (a stdio line without its newline, or an HTTP body).
pub(crate) fn check(bytes: &[u8]) -> Verdict {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let parse_error = match serde_json::from_slice::<ClientJsonRpcMessage>(bytes) {
        Ok(message) => return Verdict::Message(Box::new(message)),
        Err(e) => e,
    };
    if let Err(e) = std::str::from_utf8(bytes) {
        return Verdict::Reject(error(
            top_level_id(bytes),
            ErrorCode::PARSE_ERROR,
            format!(
                "Parse error: the message is not valid UTF-8 (at byte {})",
                e.valid_up_to()
            ),
            "send the message as UTF-8 JSON; other bytes belong in a file, not in a request",
        ));
    }
    let value = match serde_json::from_slice::<Value>(bytes) {
        Ok(value) => value,
        Err(e) => return Verdict::Reject(syntax_error(bytes, &e)),
    };
    let Value::Object(object) = &value else {
        return Verdict::Reject(error(
            None,
            ErrorCode::INVALID_REQUEST,
            format!(
                "Invalid Request: a JSON-RPC message is one object, not {}",
                dataref_protocol::json_kind(&value)
            ),
            "send one `{\"jsonrpc\": \"2.0\", \"id\": ..., \"method\": ...}` object per message (MCP has no batches)",
        ));
    };
    let id = object.get("id");
    let readable_id = id.and_then(|v| serde_json::from_value::<RequestId>(v.clone()).ok());
    let method = object.get("method").and_then(Value::as_str);
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Verdict::Reject(error(
            readable_id,
            ErrorCode::INVALID_REQUEST,
            "Invalid Request: `jsonrpc` must be \"2.0\"".into(),
            "add `\"jsonrpc\": \"2.0\"` to the message",
        ));
    }
    match (id, method) {
        // A notification (no `id`) is never answered, however broken its params.
        (None, Some(method)) => {
            tracing::debug!(
                method,
                "ignoring a notification that does not fit: {parse_error}"
            );
            Verdict::Ignore
        }
        (Some(_), _) if readable_id.is_none() => Verdict::Reject(error(
            None,
            ErrorCode::INVALID_REQUEST,
            "Invalid Request: `id` must be a string or an integer".into(),
            "give each request a string or integer `id`",
        )),
        (Some(_), Some(method)) => Verdict::Reject(error(
            readable_id,
            ErrorCode::INVALID_PARAMS,
            format!(
                "Invalid params for `{}`: {parse_error}",
                dataref_protocol::truncate_echo(method)
            ),
            "check the request's `params` against the method's schema in the MCP specification",
        )),
        (_, None) => Verdict::Reject(error(
            readable_id,
            ErrorCode::INVALID_REQUEST,
            format!(
                "Invalid Request: not a JSON-RPC request, notification or response: {parse_error}"
            ),
            "a request has `jsonrpc`, `id`, `method` and `params`; a response has `jsonrpc`, `id` and `result` or `error`",
        )),
    }
}

fn syntax_error(bytes: &[u8], e: &serde_json::Error) -> Value {
    let hint = if e.to_string().starts_with("recursion limit exceeded") {
        "the message nests arrays and objects deeper than 128 levels; flatten it, or put the data in a file and pass its path"
    } else if e.to_string().starts_with("lone leading surrogate") {
        "a `\\ud800`-`\\udbff` escape must be followed by a `\\udc00`-`\\udfff` one; encode text as UTF-8 JSON strings"
    } else {
        "send one complete JSON object per message (on stdio: per line)"
    };
    error(
        top_level_id(bytes),
        ErrorCode::PARSE_ERROR,
        format!("Parse error: the message is not valid JSON: {e}"),
        hint,
    )
}

/// A JSON-RPC error response. `id` is written as `null` when unknown, as JSON-RPC 2.0
/// requires (rmcp would leave it out).
fn error(id: Option<RequestId>, code: ErrorCode, message: String, hint: &str) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": id.map_or(Value::Null, RequestId::into_json_value),
        "error": {"code": code.0, "message": message, "data": {"hint": hint}},
    })
}

/// The `id` member of a top-level object, read from bytes that need not be valid JSON as
/// a whole (so a request broken deeper down still gets its answer matched to it). Nested
/// values are skipped by counting brackets, never by recursion, so depth costs nothing.
fn top_level_id(bytes: &[u8]) -> Option<RequestId> {
    let mut i = skip_ws(bytes, 0);
    if bytes.get(i) != Some(&b'{') {
        return None;
    }
    i += 1;
    loop {
        i = skip_ws(bytes, i);
        if bytes.get(i) != Some(&b'"') {
            return None;
        }
        let key_end = string_end(bytes, i)?;
        let key = &bytes[i..key_end];
        i = skip_ws(bytes, key_end);
        if bytes.get(i) != Some(&b':') {
            return None;
        }
        i = skip_ws(bytes, i + 1);
        let value_end = value_end(bytes, i)?;
        if key == b"\"id\"" {
            return serde_json::from_slice(&bytes[i..value_end]).ok();
        }
        i = skip_ws(bytes, value_end);
        if bytes.get(i) != Some(&b',') {
            return None;
        }
        i += 1;
    }
}

fn skip_ws(bytes: &[u8], mut i: usize) -> usize {
    while bytes.get(i).is_some_and(|b| b" \t\r\n".contains(b)) {
        i += 1;
    }
    i
}

/// The index after the closing quote of the string opening at `start`.
fn string_end(bytes: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    loop {
        match bytes.get(i)? {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
}

/// The index after the value starting at `start`.
fn value_end(bytes: &[u8], start: usize) -> Option<usize> {
    match bytes.get(start)? {
        b'"' => string_end(bytes, start),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut i = start;
            loop {
                match bytes.get(i)? {
                    b'"' => {
                        i = string_end(bytes, i)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
        }
        _ => {
            let mut i = start;
            while bytes.get(i).is_some_and(|b| !b" \t\r\n,}]".contains(b)) {
                i += 1;
            }
            Some(i)
        }
    }
}

// ---------------------------------------------------------------------------------------
// Byte streams (stdio).

type Writer<W> = Arc<Mutex<Option<W>>>;

/// An rmcp server transport on a newline-delimited JSON-RPC byte stream that answers every
/// line it cannot hand on.
pub(crate) fn transport<R, W>(read: R, write: W) -> CheckedTransport<W>
where
    R: AsyncRead + Send + Unpin + 'static,
    W: AsyncWrite + Send + Unpin + 'static,
{
    let writer: Writer<W> = Arc::new(Mutex::new(Some(write)));
    let (tx, rx) = mpsc::channel(QUEUE);
    let reader = tokio::spawn(read_lines(BufReader::new(read), tx, writer.clone()));
    CheckedTransport {
        rx,
        writer,
        reader: reader.abort_handle(),
    }
}

pub(crate) struct CheckedTransport<W> {
    rx: mpsc::Receiver<ClientJsonRpcMessage>,
    writer: Writer<W>,
    reader: tokio::task::AbortHandle,
}

impl<W> Drop for CheckedTransport<W> {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// Writes `line` and its newline in one piece, under the lock every message takes.
async fn write_line<W: AsyncWrite + Unpin>(
    writer: &Mutex<Option<W>>,
    mut line: Vec<u8>,
) -> std::io::Result<()> {
    line.push(b'\n');
    let mut guard = writer.lock().await;
    let Some(w) = guard.as_mut() else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotConnected,
            "the transport is closed",
        ));
    };
    w.write_all(&line).await?;
    w.flush().await
}

impl<W> Transport<RoleServer> for CheckedTransport<W>
where
    W: AsyncWrite + Send + Unpin + 'static,
{
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let writer = self.writer.clone();
        async move {
            let line = serde_json::to_vec(&item)?;
            write_line(&writer, line).await
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        self.rx.recv().await
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.reader.abort();
        let mut guard = self.writer.lock().await;
        if let Some(mut w) = guard.take() {
            w.shutdown().await.ok();
        }
        Ok(())
    }
}

/// Reads lines until the stream ends, handing good messages to rmcp and answering the rest.
async fn read_lines<R, W>(
    mut read: BufReader<R>,
    tx: mpsc::Sender<ClientJsonRpcMessage>,
    writer: Writer<W>,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut line = Vec::new();
    loop {
        line.clear();
        let outcome = match read_line(&mut read, &mut line).await {
            Ok(outcome) => outcome,
            Err(e) => {
                tracing::error!("reading the MCP input failed: {e}");
                return;
            }
        };
        let verdict = match outcome {
            Line::Eof => return,
            Line::Oversized => Verdict::Reject(error(
                top_level_id(&line),
                ErrorCode::INVALID_REQUEST,
                format!(
                    "Invalid Request: the message is longer than {} MiB",
                    MAX_LINE_BYTES / (1024 * 1024)
                ),
                "put large data in a file in the workspace and pass its path",
            )),
            Line::Whole => {
                let bytes = line.strip_suffix(b"\n").unwrap_or(&line);
                let bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
                if bytes.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                check(bytes)
            }
        };
        count(metrics::Transport::Stdio, &verdict);
        match verdict {
            Verdict::Message(message) => {
                if tx.send(*message).await.is_err() {
                    return;
                }
            }
            Verdict::Ignore => {}
            Verdict::Reject(response) => {
                tracing::debug!(%response, "answering a message rmcp cannot take");
                let bytes = response.to_string().into_bytes();
                if let Err(e) = write_line(&writer, bytes).await {
                    tracing::error!("writing to the MCP output failed: {e}");
                    return;
                }
            }
        }
    }
}

enum Line {
    /// `line` holds a whole line (its newline too, unless the stream ended without one).
    Whole,
    /// The line was longer than [`MAX_LINE_BYTES`] and has been skipped; `line` holds its
    /// first bytes (for its `id`).
    Oversized,
    Eof,
}

/// One line, never buffering more than [`MAX_LINE_BYTES`] of it.
async fn read_line<R: AsyncRead + Unpin>(
    read: &mut BufReader<R>,
    line: &mut Vec<u8>,
) -> std::io::Result<Line> {
    let mut oversized = false;
    loop {
        let available = read.fill_buf().await?;
        if available.is_empty() {
            return Ok(match (oversized, line.is_empty()) {
                (true, _) => Line::Oversized,
                (false, true) => Line::Eof,
                (false, false) => Line::Whole,
            });
        }
        let newline = available.iter().position(|b| *b == b'\n');
        let take = newline.map_or(available.len(), |i| i + 1);
        if !oversized {
            if line.len() + take > MAX_LINE_BYTES {
                oversized = true;
                let room = MAX_LINE_BYTES.saturating_sub(line.len()).min(take);
                line.extend_from_slice(&available[..room]);
            } else {
                line.extend_from_slice(&available[..take]);
            }
        }
        read.consume(take);
        if newline.is_some() {
            return Ok(if oversized {
                Line::Oversized
            } else {
                Line::Whole
            });
        }
    }
}

// ---------------------------------------------------------------------------------------
// HTTP.

pub(crate) type RmcpResponse = Response<BoxBody<Bytes, Infallible>>;

/// A POST body read (at most `max_bytes`, as rmcp would) and checked.
pub(crate) async fn check_post<B>(
    request: Request<B>,
    max_bytes: usize,
) -> Result<Request<Full<Bytes>>, RmcpResponse>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let (parts, body) = request.into_parts();
    let bytes = match Limited::new(body, max_bytes).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(answer(
                StatusCode::PAYLOAD_TOO_LARGE,
                &error(
                    None,
                    ErrorCode::INVALID_REQUEST,
                    format!("Invalid Request: the body is larger than {max_bytes} bytes"),
                    "put large data in a file in the workspace and pass its path",
                ),
            ));
        }
        Err(e) => {
            return Err(answer(
                StatusCode::BAD_REQUEST,
                &error(
                    None,
                    ErrorCode::PARSE_ERROR,
                    format!("Parse error: the request body could not be read: {e}"),
                    "send the whole body again",
                ),
            ));
        }
    };
    let verdict = check(&bytes);
    count(metrics::Transport::Http, &verdict);
    match verdict {
        Verdict::Message(_) => Ok(Request::from_parts(parts, Full::new(bytes))),
        // Over HTTP even a notification gets an answer: the one for input not accepted.
        Verdict::Ignore => Err(answer(
            StatusCode::BAD_REQUEST,
            &error(
                None,
                ErrorCode::INVALID_REQUEST,
                "Invalid Request: the notification does not fit its method's schema".into(),
                "check the notification's `params` against the MCP specification",
            ),
        )),
        Verdict::Reject(response) => Err(answer(StatusCode::BAD_REQUEST, &response)),
    }
}

/// A JSON-RPC error as an HTTP response: the Streamable HTTP transport answers input it
/// cannot accept with an HTTP error status, the body a JSON-RPC error.
fn answer(status: StatusCode, error: &Value) -> RmcpResponse {
    let mut r = Response::new(Full::new(Bytes::from(error.to_string())).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejected(bytes: &[u8]) -> Value {
        match check(bytes) {
            Verdict::Reject(v) => v,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn every_bad_message_gets_an_error_with_its_id_when_readable() {
        let deep = format!(
            r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"x","arguments":{{"a":{}{}}}}}}}"#,
            "[".repeat(10_000),
            "]".repeat(10_000)
        );
        let e = rejected(deep.as_bytes());
        assert_eq!(e["error"]["code"], -32700, "{e}");
        assert_eq!(e["id"], 7, "{e}");
        assert!(e["error"]["data"]["hint"].as_str().unwrap().contains("128"));

        let e = rejected(b"{\"jsonrpc\":\"2.0\",\"id\":\"a\",\"method\":\"ping\",\"params\":{\"x\":\"\xff\xfe\"}}");
        assert_eq!(
            (e["error"]["code"].as_i64(), &e["id"]),
            (Some(-32700), &json!("a")),
            "{e}"
        );

        let e = rejected(
            br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"\ud800"}}"#,
        );
        assert_eq!(
            (e["error"]["code"].as_i64(), &e["id"]),
            (Some(-32700), &json!(3)),
            "{e}"
        );

        for non_object in [
            "[]",
            "5",
            "\"x\"",
            "null",
            "[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}]",
        ] {
            let e = rejected(non_object.as_bytes());
            assert_eq!(
                (e["error"]["code"].as_i64(), &e["id"]),
                (Some(-32600), &Value::Null),
                "{e}"
            );
        }
        // (line, code, the id answered)
        for (line, code, id) in [
            (
                &br#"{"jsonrpc":"2.0","id":4,"method":5}"#[..],
                -32600,
                json!(4),
            ),
            (
                br#"{"jsonrpc":"1.0","id":4,"method":"ping"}"#,
                -32600,
                json!(4),
            ),
            (
                br#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}"#,
                -32600,
                Value::Null,
            ),
            (br#"{"jsonrpc":"2.0","id":9,"method":"#, -32700, json!(9)),
        ] {
            let e = rejected(line);
            assert_eq!(
                (e["error"]["code"].as_i64(), &e["id"]),
                (Some(code), &id),
                "{e}"
            );
        }
        let e = rejected(br#"{"jsonrpc":"2.0","id":9}"#);
        assert_eq!(e["error"]["code"], -32600, "{e}");
    }

    #[test]
    fn good_messages_and_stray_notifications_pass() {
        assert!(matches!(
            check(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#),
            Verdict::Message(_)
        ));
        assert!(matches!(
            check(b"\xEF\xBB\xBF{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}"),
            Verdict::Message(_)
        ));
        assert!(matches!(
            check(br#"{"jsonrpc":"2.0","method":"$/lsp-thing","params":{"x":1}}"#),
            Verdict::Ignore | Verdict::Message(_)
        ));
    }

    #[test]
    fn the_id_is_found_past_nested_values_and_strings() {
        let bytes = br#" { "params" : {"a": ["}", {"id": 1}], "b": "\"id\""}, "x": 1.5e3 , "id" : "r-1" , "#;
        assert_eq!(top_level_id(bytes), Some(RequestId::String("r-1".into())));
        assert_eq!(top_level_id(br#"{"params": {"id": 1}}"#), None);
        assert_eq!(top_level_id(b"[1]"), None);
    }
}
