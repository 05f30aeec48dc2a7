//! 2025-11-25 sessions bound to the principal that opened them. A session id presented
//! by anyone else, or one this server never issued, gets exactly rmcp's answer for an
//! unknown session (404), so an id reveals nothing and cannot be borrowed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use dataref_protocol::Principal;
use http::{Response, StatusCode};
use tokio_util::sync::CancellationToken;

use crate::server::State;
use crate::{Body, body};

pub(crate) const HEADER: &str = dataref_mcp::SESSION_HEADER;
/// How often bindings of sessions rmcp has closed (idle, deleted) are dropped.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

#[derive(Default)]
pub(crate) struct Sessions {
    bound: Mutex<HashMap<String, Principal>>,
}

impl Sessions {
    pub(crate) fn is_bound_to(&self, id: &str, principal: &Principal) -> bool {
        self.lock().get(id) == Some(principal)
    }

    pub(crate) fn bind(&self, id: &str, principal: &Principal) {
        self.lock().insert(id.to_owned(), principal.clone());
    }

    pub(crate) fn forget(&self, id: &str) {
        self.lock().remove(id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Principal>> {
        self.bound.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn prune(&self, mcp: &dataref_mcp::StreamableHttp) {
        let ids: Vec<String> = self.lock().keys().cloned().collect();
        for id in ids {
            if !mcp.has_session(&id).await {
                self.forget(&id);
            }
        }
    }
}

pub(crate) fn spawn_pruner(
    state: Arc<State>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(PRUNE_EVERY);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    state.sessions.prune(&state.mcp).await;
                    state.limits.forget_idle();
                    state.server.forget_idle_workspaces();
                }
                () = stop.cancelled() => return,
            }
        }
    })
}

/// rmcp's answer for a session it does not know, byte for byte.
pub(crate) fn unknown_session() -> Response<Body> {
    let mut r = Response::new(body::full(Bytes::from_static(
        b"Not Found: Session not found",
    )));
    *r.status_mut() = StatusCode::NOT_FOUND;
    r
}
