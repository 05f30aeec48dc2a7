//! The one place paths meet their stacks. Outermost first:
//!
//! ```text
//! measure (dataref_http_requests_total)                 every request
//! guard (Host, Origin)                                  every request
//! ├─ /ready, /.well-known/oauth-protected-resource[/mcp]  GET (and HEAD), no token
//! └─ counted (a shutdown waits for it)
//!    ├─ /                     the page: GET (and HEAD), no token
//!    ├─ /mcp                  deadline → auth → rate → slot (POST) → session → rmcp
//!    ├─ /files/sign           deadline → auth → rate → sign
//!    ├─ /files/{path}         GET: path → auth (signed link or token) → rate → transfer slot → file
//!    │                        PUT: path → auth (token) → rate → transfer slot → upload
//!    ├─ /agent/…, /v1/…       deadline → auth → rate [→ slot, for a request that starts a run]
//!    └─ anything else         404 naming the MCP endpoint
//! ```
//!
//! A method a path does not answer is a 405 with `Allow` before any of its stack runs (so
//! before a token is asked for); `HEAD` is answered only where `GET` and `HEAD` both are.

use std::sync::Arc;

use axum::Router;
use axum::middleware::{from_fn, from_fn_with_state};
use axum::routing::{MethodRouter, any, delete, get, post, put};

use crate::agent::{self, openai};
use crate::layer::auth::{self, Auth};
use crate::layer::limits::{self, SlotKind, Slots};
use crate::layer::{deadline, guard, open, session};
use crate::links;
use crate::paths::{MCP_PATH, METADATA_PATH, READY_PATH};
use crate::response::method_not_allowed;
use crate::route::{self, files, mcp, page, ready};
use crate::state::AppState;

type Route = MethodRouter<Arc<AppState>>;

/// The whole server: every route and its stack over the state `s`.
pub(crate) fn router(s: &Arc<AppState>) -> Router {
    let bearer = Auth {
        tokens: s.auth.clone(),
        links: None,
    };
    let deadline = from_fn_with_state(s.body_timeout, deadline::body);
    let authenticate = from_fn_with_state(bearer.clone(), auth::authenticate);
    let rate = from_fn_with_state(s.limits.clone(), limits::rate);
    let tool_call = from_fn_with_state(
        Slots {
            limits: s.limits.clone(),
            kind: SlotKind::ToolCall,
        },
        limits::slot,
    );
    // Past the deadline, authentication and the rate limit: every request with a token.
    let checked = (deadline, authenticate, rate.clone());

    // `any` is a fallback of its own: `layer`, not `route_layer`, puts the stack on it.
    let mcp = any(mcp::mcp).layer((
        checked.clone(),
        tool_call.clone(),
        from_fn_with_state(s.sessions.clone(), session::bind),
    ));
    let sign = only(post(files::sign).route_layer(checked.clone()), "POST");
    // Downloads and uploads hold a transfer slot, apart from the tool calls' slots.
    let transfer = from_fn_with_state(
        Slots {
            limits: s.limits.clone(),
            kind: SlotKind::Download,
        },
        limits::slot,
    );
    // Uploads: the bearer token only (a signed link reads, never writes), and no whole-body
    // deadline (a large file on a slow link takes longer): the handler abandons a stall.
    let upload = put(files::upload).route_layer((
        from_fn(links::file_path),
        from_fn_with_state(bearer.clone(), auth::authenticate),
        rate.clone(),
        transfer.clone(),
    ));
    let signed_or_bearer = Auth {
        tokens: s.auth.clone(),
        links: Some(s.signer.clone()),
    };
    let files = only(
        get(files::download)
            .route_layer((
                from_fn(links::file_path),
                from_fn_with_state(signed_or_bearer, auth::authenticate),
                rate.clone(),
                transfer,
            ))
            .merge(upload),
        "GET, PUT",
    );
    // A run holds one of the caller's in-flight slots for as long as it streams, as a tool
    // call does; listing, history and approvals take none (an approval must get through
    // while its run holds the slot).
    let run = |route: Route| route.route_layer(tool_call.clone());
    let agent = |route: Route, allowed| only(route.route_layer(checked.clone()), allowed);
    let counted = Router::new()
        .route("/", get(page::page).fallback(page::not_allowed))
        .route(MCP_PATH, mcp)
        .route("/files/sign", sign)
        .route("/files/{*path}", files)
        .route("/agent/agents", agent(get(agent::agents), "GET"))
        .route(
            "/agent/sessions",
            agent(
                run(post(agent::start)).merge(get(agent::sessions)),
                "GET, POST",
            ),
        )
        .route(
            "/agent/sessions/{id}",
            agent(
                get(agent::session).merge(delete(agent::delete)),
                "GET, DELETE",
            ),
        )
        .route(
            "/agent/sessions/{id}/messages",
            agent(run(post(agent::message)), "POST"),
        )
        .route(
            "/agent/sessions/{id}/approvals/{call_id}",
            agent(post(agent::approve), "POST"),
        )
        .route(
            "/v1/chat/completions",
            agent(run(post(openai::completions)), "POST"),
        )
        .route("/v1/models", agent(get(openai::models), "GET"))
        .fallback(route::not_found)
        .layer(from_fn_with_state(s.open.clone(), open::count));
    Router::new()
        .route(READY_PATH, or_refuse(get(ready::ready), "GET"))
        .route(METADATA_PATH, or_refuse(get(mcp::metadata), "GET"))
        .route(
            &format!("{METADATA_PATH}{MCP_PATH}"),
            or_refuse(get(mcp::mcp_metadata), "GET"),
        )
        .merge(counted)
        .layer(from_fn_with_state(s.guard.clone(), guard::check))
        // Outermost: a request the guard refuses is counted too.
        .layer(from_fn(crate::metrics::measure))
        .with_state(s.clone())
}

/// `route` (its stack applied), and 405 with `Allow: allowed` for every other method,
/// `HEAD` included (axum would answer it with the `GET` route), before `route`'s stack runs.
fn only(route: Route, allowed: &'static str) -> Route {
    let refuse = move || async move { method_not_allowed(allowed) };
    or_refuse(route.head(refuse), allowed)
}

/// `route`, and 405 with `Allow: allowed` for every method it does not answer.
fn or_refuse(route: Route, allowed: &'static str) -> Route {
    route.fallback(move || async move { method_not_allowed(allowed) })
}
