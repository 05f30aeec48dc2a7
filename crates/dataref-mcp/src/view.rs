//! The view (MCP Apps, `io.modelcontextprotocol/ui`, stable 2026-01-26): one HTML document
//! that shows a tool's result to the person — a chart drawn from its points, a table paged
//! on the server — without the rows passing through the model.
//!
//! - Hosts with the extension read it as the resource [`VIEW_URI`] (`text/html;profile=mcp-app`)
//!   and render it in a sandboxed iframe beside the result of a tool whose `_meta.ui`
//!   names it; the view gets its data through the app-only tools (`view_rows`,
//!   `view_chart`, `view_artifacts`), which such hosts keep from the model.
//! - `dataref serve --http` serves the same document at `/` as the page, where it talks to
//!   `/mcp` and `/agent/…` itself with the person's token.
//! - Hosts without the extension list neither the app-only tools nor `_meta.ui`: their
//!   `tools/list` is what it was before the view existed.

use rmcp::RoleServer;
use rmcp::model::{ReadResourceResult, ResourceContents};
use rmcp::service::RequestContext;
use serde_json::json;

/// The extension's identifier in `capabilities.extensions`.
pub const UI_EXTENSION: &str = "io.modelcontextprotocol/ui";
/// The view's resource.
pub use dataref_protocol::VIEW_URI;
/// What MCP Apps calls an HTML view.
pub const VIEW_MIME: &str = "text/html;profile=mcp-app";
/// The document itself (no script, style or font from anywhere else).
pub const VIEW_HTML: &str = include_str!("../ui/view.html");

/// The client of this request declared the extension (per request in the 2026-07-28
/// revision, at `initialize` for a session).
pub(crate) fn host_shows_views(context: &RequestContext<RoleServer>) -> bool {
    context
        .client_capabilities()
        .and_then(|c| c.extensions)
        .is_some_and(|e| e.contains_key(UI_EXTENSION))
}

/// What the server declares: the extension, with the one kind of view it serves.
pub(crate) fn server_extensions() -> rmcp::model::ExtensionCapabilities {
    let mut ui = rmcp::model::JsonObject::new();
    ui.insert("mimeTypes".into(), json!([VIEW_MIME]));
    let mut extensions = rmcp::model::ExtensionCapabilities::new();
    extensions.insert(UI_EXTENSION.into(), ui);
    extensions
}

/// The view as a `resources/list` entry, for a host that shows views.
pub(crate) fn resource() -> rmcp::model::Resource {
    rmcp::model::Resource::new(VIEW_URI, "dataref-view")
        .with_title("dataref: tables, charts and downloads")
        .with_description(
            "The view of this server's tables and charts (MCP Apps): a page of rows, a chart, \
             downloads, without the rows passing through the model.",
        )
        .with_mime_type(VIEW_MIME)
}

/// `resources/read` of [`VIEW_URI`]. It needs no network access of any kind, so it asks
/// for none (the hosts' restrictive default CSP).
pub(crate) fn read() -> ReadResourceResult {
    let mut meta = rmcp::model::MetaObject::new();
    meta.insert("ui".into(), json!({"prefersBorder": true}));
    ReadResourceResult::new(vec![ResourceContents::TextResourceContents {
        uri: VIEW_URI.into(),
        mime_type: Some(VIEW_MIME.into()),
        text: VIEW_HTML.into(),
        meta: Some(meta),
    }])
}
