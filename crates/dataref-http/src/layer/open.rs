//! The requests a shutdown waits for: each is open from the moment it passes the guard
//! until its response's last byte ([`count`]); a response marked [`NotAwaited`] (the MCP
//! notification stream, open as long as its session) does not count.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use tokio::sync::Notify;

use crate::response::holding;

/// The layer: the request is open until its response's last byte.
pub(crate) async fn count(State(open): State<Open>, request: Request, next: Next) -> Response {
    let started = open.start();
    let response = next.run(request).await;
    if response.extensions().get::<NotAwaited>().is_some() {
        return response;
    }
    holding(response, started)
}

/// In a response's extensions: not a request a shutdown should wait for.
#[derive(Clone, Copy)]
pub(crate) struct NotAwaited;

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
    fn start(&self) -> OpenRequest {
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
