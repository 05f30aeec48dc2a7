//! What the HTTP host hands the MCP server: the authenticated [`Caller`] of a request and
//! signed [`DownloadLinks`]. Both the server and the result mapping (`tools`) import them
//! from here, so neither imports the other for them.

use dataref_protocol::Principal;

/// Makes a signed download URL (and its expiry, Unix seconds) for a principal's
/// workspace file; `None` when it cannot. The HTTP server (dataref-http) implements it
/// and hands it over with [`DatarefServer::set_download_links`](crate::DatarefServer::set_download_links).
pub trait DownloadLinks: Send + Sync {
    fn link(&self, principal: &Principal, path: &str) -> Option<(String, i64)>;
}

/// The authenticated principal of an HTTP request, put into the request's extensions by
/// the HTTP server's authentication layer (dataref-http) and read by
/// [`DatarefServer::per_request`](crate::DatarefServer::per_request).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller(pub Principal);
