//! 2025-11-25 sessions bound to the principal that opened them. A session id presented
//! by anyone else, or one this server never issued, gets exactly rmcp's answer for an
//! unknown session (404), so an id reveals nothing and cannot be borrowed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use dataref_protocol::Principal;
use http::{Method, StatusCode};

use super::auth::caller;
use crate::response::refused_unread;

const HEADER: &str = dataref_mcp::SESSION_HEADER;

/// The layer on `/mcp`, past authentication: a named session must be the caller's; a
/// session the response opens becomes the caller's, one it deletes is forgotten.
pub(crate) async fn bind(
    State(sessions): State<Arc<Sessions>>,
    request: Request,
    next: Next,
) -> Response {
    let principal = match caller(&request) {
        Ok(principal) => principal,
        Err(fault) => return refused_unread(request.headers(), fault),
    };
    let session = request
        .headers()
        .get(HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if let Some(id) = &session
        && !sessions.is_bound_to(id, &principal)
    {
        return refused_unread(request.headers(), unknown_session());
    }
    let method = request.method().clone();
    let response = next.run(request).await;
    match (&session, &method) {
        (None, _) => {
            if let Some(id) = response.headers().get(HEADER).and_then(|v| v.to_str().ok()) {
                sessions.bind(id, &principal);
            }
        }
        (Some(id), &Method::DELETE) if response.status().is_success() => sessions.forget(id),
        (Some(_), _) => {}
    }
    response
}

#[derive(Default)]
pub(crate) struct Sessions {
    bound: Mutex<HashMap<String, Principal>>,
}

impl Sessions {
    fn is_bound_to(&self, id: &str, principal: &Principal) -> bool {
        self.lock().get(id) == Some(principal)
    }

    fn bind(&self, id: &str, principal: &Principal) {
        self.lock().insert(id.to_owned(), principal.clone());
    }

    fn forget(&self, id: &str) {
        self.lock().remove(id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Principal>> {
        self.bound.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Drops the bindings of sessions rmcp has closed (idle, deleted).
    pub(crate) async fn prune(&self, mcp: &dataref_mcp::StreamableHttp) {
        let ids: Vec<String> = self.lock().keys().cloned().collect();
        for id in ids {
            if !mcp.has_session(&id).await {
                self.forget(&id);
            }
        }
    }
}

/// rmcp's answer for a session it does not know, byte for byte.
fn unknown_session() -> Response {
    let mut r = Response::new(Body::from("Not Found: Session not found"));
    *r.status_mut() = StatusCode::NOT_FOUND;
    r
}
