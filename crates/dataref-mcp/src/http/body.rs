//! Response bodies: whole, streamed from a channel (downloads), and rmcp's with a
//! concurrency slot held until the last byte is sent.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;
use tokio::sync::OwnedSemaphorePermit;
use tokio::sync::mpsc;

/// Every response body of the HTTP server.
pub(crate) type Body = BoxBody<Bytes, std::io::Error>;

pub(crate) fn full(bytes: Bytes) -> Body {
    http_body_util::Full::new(bytes)
        .map_err(|never: Infallible| match never {})
        .boxed()
}

/// rmcp's body (an SSE stream for a tool call runs as long as the call), keeping `permit`
/// until it ends or the client goes away.
pub(crate) fn holding(
    inner: BoxBody<Bytes, Infallible>,
    permit: Option<OwnedSemaphorePermit>,
) -> Body {
    let inner = inner.map_err(|never: Infallible| match never {}).boxed();
    match permit {
        None => inner,
        Some(permit) => Holding {
            inner,
            permit: Some(permit),
        }
        .boxed(),
    }
}

struct Holding {
    inner: Body,
    permit: Option<OwnedSemaphorePermit>,
}

impl http_body::Body for Holding {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(None | Some(Err(_))) = &polled {
            this.permit = None;
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

/// A body fed by a channel of chunks (a file read on a blocking thread), `len` bytes long.
pub(crate) fn channel(rx: mpsc::Receiver<std::io::Result<Bytes>>, len: u64) -> Body {
    Channel { rx, len }.boxed()
}

struct Channel {
    rx: mpsc::Receiver<std::io::Result<Bytes>>,
    len: u64,
}

impl http_body::Body for Channel {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        self.get_mut()
            .rx
            .poll_recv(cx)
            .map(|chunk| chunk.map(|c| c.map(Frame::data)))
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.len)
    }
}
