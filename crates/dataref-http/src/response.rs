//! What every answer is made of: JSON bodies with `Cache-Control: no-store`, the 405 with
//! `Allow`, a refusal that closes a connection whose request body was never read, and
//! response bodies that hold something (a slot, the open-request count) until their last
//! byte, or stream a file chunk by chunk.

use std::fs::File;
use std::io::Read;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use http_body::{Frame, SizeHint};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

/// A JSON body with `Cache-Control: no-store` (answers are per caller).
pub(crate) fn json_response(status: StatusCode, value: Value) -> Response {
    let mut r = Response::new(Body::from(value.to_string()));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// A JSON error as every route sends them: `error` (a stable code), `message`, `hint`.
pub(crate) fn error(
    status: StatusCode,
    code: &str,
    message: impl Into<String>,
    hint: impl Into<String>,
) -> Response {
    json_response(
        status,
        json!({"error": code, "message": message.into(), "hint": hint.into()}),
    )
}

/// 405 for a path that answers `allowed` only.
pub(crate) fn method_not_allowed(allowed: &'static str) -> Response {
    let mut r = json_response(
        StatusCode::METHOD_NOT_ALLOWED,
        json!({
            "error": "method_not_allowed",
            "message": format!("this path answers {allowed} only"),
        }),
    );
    r.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allowed));
    r
}

/// A refusal answered before the request's body was read: the connection cannot carry
/// another request (the unread body is in the way) and is closed after the answer, so it
/// says `Connection: close` rather than leaving a keep-alive client to find out by a
/// broken pipe on its next request.
pub(crate) fn refused_unread(request: &HeaderMap, mut refused: Response) -> Response {
    let declares_body = request.contains_key(header::TRANSFER_ENCODING)
        || request
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim() != "0");
    if declares_body {
        refused
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    refused
}

/// `response` keeping `guard` (a slot, the open-request count) until its body ends or the
/// client goes away (rmcp's SSE stream for a tool call runs as long as the call; a file).
pub(crate) fn holding<G: Send + Sync + Unpin + 'static>(response: Response, guard: G) -> Response {
    response.map(|inner| {
        Body::new(Holding {
            inner,
            guard: Some(guard),
        })
    })
}

struct Holding<G> {
    inner: Body,
    guard: Option<G>,
}

impl<G: Unpin> http_body::Body for Holding<G> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(None | Some(Err(_))) = &polled {
            this.guard = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

const CHUNK: usize = 64 * 1024;

/// `len` bytes of `file`, each chunk read on a blocking thread only when the connection
/// asks for it: a client that stops reading holds the file (and what the layers around
/// hold with it), never a thread. A file that ends early ends the response as broken, not
/// short.
pub(crate) fn file(file: File, len: u64) -> Body {
    Body::new(FileBody {
        file: Some(file),
        reading: None,
        remaining: len,
        len,
    })
}

struct FileBody {
    /// `None` while a read is in flight.
    file: Option<File>,
    reading: Option<JoinHandle<(File, std::io::Result<Vec<u8>>)>>,
    remaining: u64,
    len: u64,
}

impl http_body::Body for FileBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let this = self.get_mut();
        if this.remaining == 0 {
            return Poll::Ready(None);
        }
        if this.reading.is_none() {
            let Some(mut file) = this.file.take() else {
                return Poll::Ready(None);
            };
            let want = usize::try_from(this.remaining).map_or(CHUNK, |r| r.min(CHUNK));
            this.reading = Some(tokio::task::spawn_blocking(move || {
                let mut buf = vec![0u8; want];
                let read = file.read(&mut buf).map(|n| {
                    buf.truncate(n);
                    buf
                });
                (file, read)
            }));
        }
        let Some(reading) = this.reading.as_mut() else {
            return Poll::Ready(None);
        };
        let joined = ready!(Pin::new(reading).poll(cx));
        this.reading = None;
        let (file, read) = joined.map_err(std::io::Error::other)?;
        this.file = Some(file);
        let buf = read?;
        if buf.is_empty() {
            this.remaining = 0;
            return Poll::Ready(Some(Err(std::io::Error::other(
                "the file shrank while being sent",
            ))));
        }
        this.remaining = this.remaining.saturating_sub(buf.len() as u64);
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(buf)))))
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.len)
    }
}

/// Seconds since the Unix epoch.
pub(crate) fn now_secs() -> i64 {
    dataref_protocol::Timestamp::now().unix_seconds()
}
