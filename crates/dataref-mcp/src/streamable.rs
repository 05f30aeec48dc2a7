//! What the HTTP server (dataref-http) needs of MCP: rmcp's Streamable HTTP service for a
//! [`DatarefServer`] (2025-11-25 sessions and stateless 2026-07-28), with every POST body
//! checked before rmcp sees it ([`crate::jsonrpc`]), and whether a session is still open.
//!
//! The HTTP server authenticates the request and puts its [`Caller`](crate::Caller) into
//! the request's extensions before [`StreamableHttp::handle`]; Host and Origin are checked
//! there too (rmcp's own checks are off), for every route.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::combinators::BoxBody;
use rmcp::transport::streamable_http_server::session::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use crate::DatarefServer;
use crate::jsonrpc::check_post;

/// The header naming a 2025-11-25 session.
pub const SESSION_HEADER: &str = "mcp-session-id";

/// rmcp's Streamable HTTP service for one [`DatarefServer`] (a fresh
/// [`DatarefServer::for_session`] per session).
pub struct StreamableHttp {
    service: StreamableHttpService<DatarefServer, LocalSessionManager>,
    manager: Arc<LocalSessionManager>,
}

impl std::fmt::Debug for StreamableHttp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamableHttp").finish_non_exhaustive()
    }
}

impl StreamableHttp {
    /// The service; cancelling `shutdown` ends its sessions and their streams.
    pub fn new(server: &DatarefServer, shutdown: CancellationToken) -> Self {
        let manager = Arc::new(LocalSessionManager::default());
        // Host and Origin are checked by the HTTP server for every route, before
        // authentication.
        let config = StreamableHttpServerConfig::default()
            .with_legacy_session_mode(true)
            .disable_allowed_hosts()
            .disable_allowed_origins()
            .with_cancellation_token(shutdown);
        let factory_server = server.clone();
        let service = StreamableHttpService::new(
            move || Ok(factory_server.for_session()),
            manager.clone(),
            config,
        );
        Self { service, manager }
    }

    /// rmcp's [`StreamableHttpService::handle`], with every POST body checked on the way: a
    /// good body goes on unchanged, a bad one is answered here (400 with a JSON-RPC error,
    /// 413 past rmcp's body limit).
    pub async fn handle<B>(&self, request: Request<B>) -> Response<BoxBody<Bytes, Infallible>>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: std::error::Error + Send + Sync + 'static,
    {
        if request.method() != Method::POST {
            return self.service.handle(request).await;
        }
        match check_post(request, self.service.config.max_request_body_bytes).await {
            Ok(request) => self.service.handle(request).await,
            Err(refused) => refused,
        }
    }

    /// Whether rmcp still has the session `id` (an error reading it counts as open).
    pub async fn has_session(&self, id: &str) -> bool {
        self.manager
            .has_session(&id.to_owned().into())
            .await
            .unwrap_or(true)
    }
}
