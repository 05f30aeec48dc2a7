//! `GET /ready`: 200 while this replica reaches what it shares
//! ([`Readiness`](crate::state::Readiness)), else 503 saying what it cannot reach. No token:
//! a balancer's health check has none.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::response::Response;
use http::{HeaderValue, StatusCode, header};
use serde_json::json;

use crate::response::json_response;
use crate::state::AppState;

/// How long one answer of the readiness check serves every `/ready` after it.
const READY_FOR: Duration = Duration::from_secs(1);

/// Anyone who reaches the port may ask, so the check runs at most once a second, whoever
/// asks how often (those who ask meanwhile wait for it and share its answer), and the
/// answer names what is out of reach, never how (the details are in the log).
pub(crate) async fn ready(State(state): State<Arc<AppState>>) -> Response {
    let checked = match &state.readiness {
        None => Ok(()),
        Some(readiness) => {
            let mut last = state.last_ready.lock().await;
            match &*last {
                Some((at, answer)) if at.elapsed() < READY_FOR => answer.clone(),
                _ => {
                    let answer = readiness.check().await;
                    *last = Some((Instant::now(), answer.clone()));
                    answer
                }
            }
        }
    };
    match checked {
        Ok(()) => json_response(StatusCode::OK, json!({"ready": true})),
        Err(reason) => {
            let mut r = json_response(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({
                    "ready": false,
                    "error": "not_ready",
                    "message": reason,
                    "hint": "this replica cannot reach the shared store now; a balancer \
                             should send requests to another until it can",
                }),
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(5));
            r
        }
    }
}
