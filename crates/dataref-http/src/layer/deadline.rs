//! Time limits on both directions of a connection. A request body must arrive whole within
//! `[http] body_timeout` of the request's start ([`body`], 408 and the connection closed
//! otherwise); a socket whose writes make no progress for `send_timeout` fails them
//! ([`SendTimeout`]), so a client that stops reading a response has its connection
//! closed. Either way, a client sending or reading a byte now and then cannot hold a
//! connection, a handler, a file or a slot forever.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use http_body::{Frame, SizeHint};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

use crate::response::error;

/// The request body must arrive whole within `limit` ([`with_deadline`]); when it did not,
/// the answer is 408 and the connection is closed, whatever the handler made of the broken
/// body.
pub(crate) async fn body(State(limit): State<Duration>, request: Request, next: Next) -> Response {
    let (parts, incoming) = request.into_parts();
    let (deadline, timed_out) = with_deadline(incoming, limit);
    let response = next
        .run(Request::from_parts(parts, Body::new(deadline)))
        .await;
    if timed_out.happened() {
        return timed_out_response(limit);
    }
    response
}

/// 408 for a request body that did not arrive within `limit`; the connection is closed
/// (what is left of the body is never read).
fn timed_out_response(limit: Duration) -> Response {
    tracing::info!("refused a request whose body did not arrive within {limit:?}");
    let mut r = error(
        StatusCode::REQUEST_TIMEOUT,
        "request_timeout",
        format!(
            "the request body did not arrive within {} s",
            limit.as_secs_f64()
        ),
        "send the whole body at once; an operator may raise `[http] body_timeout`",
    );
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// Why an incoming body could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadError {
    #[error("the request body did not arrive within {0:?}")]
    TimedOut(Duration),
    #[error("reading the request body failed: {0}")]
    Read(#[from] axum::Error),
}

/// A request body that must arrive whole within `limit` of the request's start; past it,
/// reading fails and [`TimedOut::happened`] says so.
fn with_deadline(body: Body, limit: Duration) -> (Deadline, TimedOut) {
    let flag = TimedOut(Arc::new(AtomicBool::new(false)));
    (
        Deadline {
            inner: body,
            sleep: Box::pin(tokio::time::sleep(limit)),
            limit,
            flag: flag.clone(),
        },
        flag,
    )
}

struct Deadline {
    inner: Body,
    sleep: Pin<Box<Sleep>>,
    limit: Duration,
    flag: TimedOut,
}

/// Set when a [`Deadline`] body ran out of time.
#[derive(Clone)]
struct TimedOut(Arc<AtomicBool>);

impl TimedOut {
    fn happened(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

impl http_body::Body for Deadline {
    type Data = Bytes;
    type Error = ReadError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ReadError>>> {
        let this = self.get_mut();
        if this.sleep.as_mut().poll(cx).is_ready() {
            this.flag.0.store(true, Ordering::Relaxed);
            return Poll::Ready(Some(Err(ReadError::TimedOut(this.limit))));
        }
        Pin::new(&mut this.inner)
            .poll_frame(cx)
            .map(|f| f.map(|r| r.map_err(ReadError::from)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A socket whose writes fail once they have made no progress for `limit`: a client that
/// stops reading a response (a download, a tool call's stream) has its connection closed,
/// which drops the response and whatever it held (a file, a slot), instead of keeping them
/// forever. Time spent waiting for the client's next request or for a slow tool is not a
/// stalled write and does not count.
pub(crate) struct SendTimeout<T> {
    io: T,
    limit: Duration,
    /// Armed while a write is pending.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<T> SendTimeout<T> {
    pub(crate) fn new(io: T, limit: Duration) -> Self {
        Self {
            io,
            limit,
            stalled: None,
        }
    }

    /// `Ready(Err)` once a write pending since the first `Pending` has waited `limit`.
    fn on_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let limit = self.limit;
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing for {limit:?}"),
            )),
            Poll::Pending => Poll::Pending,
        }
    }

    fn track<R>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        match polled {
            Poll::Ready(r) => {
                self.stalled = None;
                Poll::Ready(r)
            }
            Poll::Pending => self.on_pending(cx).map(Err),
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for SendTimeout<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for SendTimeout<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write(cx, buf);
        this.track(cx, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.track(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_flush(cx);
        this.track(cx, polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_shutdown(cx);
        this.track(cx, polled)
    }
}
