//! Bodies. Responses: whole, read from a file chunk by chunk (downloads), and rmcp's with
//! a guard (a concurrency slot, the shutdown drain's count) held until the last byte is
//! sent. Requests: the incoming body with a deadline for the whole of it.

use std::convert::Infallible;
use std::fs::File;
use std::io::Read;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;
use tokio::task::JoinHandle;
use tokio::time::Sleep;

/// Every response body of the HTTP server.
pub(crate) type Body = BoxBody<Bytes, std::io::Error>;

pub(crate) fn full(bytes: Bytes) -> Body {
    http_body_util::Full::new(bytes)
        .map_err(|never: Infallible| match never {})
        .boxed()
}

/// `inner` (rmcp's SSE stream for a tool call runs as long as the call; a file), keeping
/// `guard` (a slot, the open-request count) until it ends or the client goes away.
pub(crate) fn holding<G: Send + Sync + Unpin + 'static>(inner: Body, guard: G) -> Body {
    Holding {
        inner,
        guard: Some(guard),
    }
    .boxed()
}

struct Holding<G> {
    inner: Body,
    guard: Option<G>,
}

impl<G: Unpin> http_body::Body for Holding<G> {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
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
    FileBody {
        file: Some(file),
        reading: None,
        remaining: len,
        len,
    }
    .boxed()
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

/// Why an incoming body could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadError {
    #[error("the request body did not arrive within {0:?}")]
    TimedOut(Duration),
    #[error("reading the request body failed: {0}")]
    Read(#[from] hyper::Error),
}

/// A request body that must arrive whole within `limit` of the request's start; past it,
/// reading fails and [`TimedOut::happened`] says so (a client sending a byte now and then
/// would otherwise hold a connection and a handler forever).
pub(crate) fn with_deadline(body: hyper::body::Incoming, limit: Duration) -> (Deadline, TimedOut) {
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

pub(crate) struct Deadline {
    inner: hyper::body::Incoming,
    sleep: Pin<Box<Sleep>>,
    limit: Duration,
    flag: TimedOut,
}

/// Set when a [`Deadline`] body ran out of time.
#[derive(Clone)]
pub(crate) struct TimedOut(Arc<AtomicBool>);

impl TimedOut {
    pub(crate) fn happened(&self) -> bool {
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
