//! Connections: a send timeout on the socket, and the count of open requests that a
//! shutdown waits for.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Sleep;

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

/// Requests being answered (a tool call until its result is sent, a download until its
/// last byte), which a shutdown lets finish before it ends the MCP sessions.
#[derive(Clone, Default)]
pub(crate) struct Open(Arc<OpenInner>);

#[derive(Default)]
struct OpenInner {
    count: AtomicUsize,
    none_left: Notify,
}

/// One open request; dropping it (with its response body) closes it.
pub(crate) struct OpenRequest(Arc<OpenInner>);

impl Open {
    pub(crate) fn start(&self) -> OpenRequest {
        self.0.count.fetch_add(1, Ordering::SeqCst);
        OpenRequest(self.0.clone())
    }

    /// Returns once no request is open.
    pub(crate) async fn none_left(&self) {
        loop {
            let notified = self.0.none_left.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.0.count.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }

    pub(crate) fn count(&self) -> usize {
        self.0.count.load(Ordering::SeqCst)
    }
}

impl Drop for OpenRequest {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.none_left.notify_waiters();
        }
    }
}
