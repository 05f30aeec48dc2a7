//! `/mcp`, past authentication, the limits and the session check: rmcp, through the
//! JSON-RPC body check of [`dataref_mcp::StreamableHttp`]. And the RFC 9728
//! protected-resource metadata that tells a client without a token where to get one.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use http::{Method, StatusCode};
use serde_json::json;

use crate::layer::open::NotAwaited;
use crate::paths::MCP_PATH;
use crate::response::json_response;
use crate::state::AppState;

/// Every method of `/mcp`: rmcp answers.
pub(crate) async fn mcp(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let method = request.method().clone();
    let mut response = state.mcp.handle(request).await.map(Body::new);
    // A GET is the session's notification stream, open as long as the session: not a
    // request a shutdown should wait for.
    if method == Method::GET {
        response.extensions_mut().insert(NotAwaited);
    }
    response
}

/// `GET /.well-known/oauth-protected-resource` (no token). `resource` is the server.
pub(crate) async fn metadata(State(state): State<Arc<AppState>>) -> Response {
    metadata_of(&state, state.public_url.clone())
}

/// `GET /.well-known/oauth-protected-resource/mcp` (no token). `resource` is the MCP
/// endpoint.
pub(crate) async fn mcp_metadata(State(state): State<Arc<AppState>>) -> Response {
    metadata_of(&state, format!("{}{MCP_PATH}", state.public_url))
}

/// RFC 9728 protected-resource metadata for `resource`.
fn metadata_of(state: &AppState, resource: String) -> Response {
    let mut doc = json!({
        "resource": resource,
        "bearer_methods_supported": ["header"],
        "resource_name": "dataref",
    });
    if let Some(issuer) = state.auth.issuer() {
        doc["authorization_servers"] = json!([issuer]);
    }
    json_response(StatusCode::OK, doc)
}
