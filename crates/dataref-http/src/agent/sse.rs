//! Server-sent events: a run's events as `event: <type>` / `data: <json>`, and the
//! `text/event-stream` response that carries them, with a keep-alive comment when quiet.
//! Dropping the response (the client went away) cancels the run.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use dataref_agent::{AgentEvent, EventSink};
use http::{HeaderValue, header};
use http_body::Frame;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};

/// An SSE comment this often keeps proxies from closing a quiet stream (a long tool call)
/// and finds a client that went away.
const KEEPALIVE: Duration = Duration::from_secs(15);

/// Sends each event of a run as one SSE event named by its `type`.
pub(crate) struct SseEvents(pub(crate) mpsc::UnboundedSender<Bytes>);

impl EventSink for SseEvents {
    fn event(&self, event: AgentEvent) {
        let value = serde_json::to_value(&event).unwrap_or(Value::Null);
        let name = value
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("event")
            .to_owned();
        let _ = self.0.send(sse_event(&name, &value));
    }
}

/// `event: NAME` and `data: JSON`.
pub(crate) fn sse_event(name: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

/// A `text/event-stream` response of what comes through `rx`; dropping the body (the
/// client went away, or the stream ended) cancels `cancel`.
pub(crate) fn sse_response(
    rx: mpsc::UnboundedReceiver<Bytes>,
    cancel: CancellationToken,
) -> Response {
    let start = tokio::time::Instant::now() + KEEPALIVE;
    let mut keepalive = tokio::time::interval_at(start, KEEPALIVE);
    keepalive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let body = SseBody {
        rx,
        keepalive,
        _cancel: cancel.drop_guard(),
    };
    let mut r = Response::new(Body::new(body));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    r
}

struct SseBody {
    rx: mpsc::UnboundedReceiver<Bytes>,
    keepalive: tokio::time::Interval,
    _cancel: DropGuard,
}

impl http_body::Body for SseBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::convert::Infallible>>> {
        let this = self.get_mut();
        match this.rx.poll_recv(cx) {
            Poll::Ready(Some(bytes)) => {
                this.keepalive.reset();
                Poll::Ready(Some(Ok(Frame::data(bytes))))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match this.keepalive.poll_tick(cx) {
                Poll::Ready(_) => Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(
                    b": keep-alive\n\n",
                ))))),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}
