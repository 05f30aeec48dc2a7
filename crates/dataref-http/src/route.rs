//! The handlers at the end of the stacks [`crate::router`] builds: the MCP endpoint and its
//! metadata ([`mcp`]), the downloads ([`files`]), `/ready` ([`ready`]), the page
//! ([`page`]), and [`not_found`] for every other path. The agent's own routes are
//! [`crate::agent`]'s.

pub(crate) mod files;
pub(crate) mod mcp;
pub(crate) mod page;
pub(crate) mod ready;

use axum::extract::Request;
use axum::response::Response;
use http::StatusCode;

use crate::paths::MCP_PATH;
use crate::response::error;

/// Any path nothing is served at: 404 naming the MCP endpoint.
pub(crate) async fn not_found(request: Request) -> Response {
    error(
        StatusCode::NOT_FOUND,
        "not_found",
        format!(
            "nothing is served at `{}`",
            dataref_protocol::truncate_echo(request.uri().path())
        ),
        format!("the MCP endpoint is `{MCP_PATH}`"),
    )
}
