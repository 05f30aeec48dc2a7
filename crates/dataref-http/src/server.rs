//! The listener and its connections: [`HttpServer::bind`] checks the options and builds
//! the state the routes share ([`AppState`]), [`HttpServer::serve`] accepts connections
//! (hyper's HTTP/1.1 server: a header timeout, a send timeout on the socket), runs each
//! request through the router ([`crate::router`]) and drains at shutdown. axum's own
//! `serve` sets neither timeout, so the connections are served here.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use dataref_agent::AgentHost;
use dataref_agent::approvals::{ApprovalStore, LocalApprovals};
use dataref_mcp::DatarefServer;
use dataref_tool::SharedContext;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::agent::APPROVAL_TIMEOUT;
use crate::error::HttpError;
use crate::layer::deadline::SendTimeout;
use crate::paths::MCP_PATH;
use crate::router::router;
use crate::state::{Agents, AppState, HttpOptions, Replicated, check_listen};

/// How long open connections may take to finish after a shutdown signal.
const DRAIN: Duration = Duration::from_secs(10);
/// A request's headers must arrive within this (slow clients hold a connection otherwise).
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// How often bindings of MCP sessions rmcp has closed (idle, deleted), idle limits and
/// idle workspaces are dropped.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// A bound, configured server; [`HttpServer::serve`] runs it.
pub struct HttpServer {
    listener: TcpListener,
    /// The address bound (the port of `:0` filled in).
    local: SocketAddr,
    state: Arc<AppState>,
    /// Cancels rmcp's sessions and streams at shutdown.
    mcp_shutdown: CancellationToken,
    send_timeout: Duration,
}

impl std::fmt::Debug for HttpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpServer")
            .field("public_url", &self.state.public_url)
            .finish_non_exhaustive()
    }
}

impl HttpServer {
    /// Checks the options ([`crate::validate`]), binds `options.http.listen` and builds the
    /// routes. Nothing is served until [`Self::serve`].
    pub async fn bind(server: DatarefServer, options: HttpOptions) -> Result<Self, HttpError> {
        Self::bind_replicated(server, options, Replicated::default()).await
    }

    /// [`Self::bind`] for one of several replicas: the limits counted by
    /// `replicated.limiter`, download links signed with `replicated.signing_key` unless
    /// `[http] signing_key` is set.
    pub async fn bind_replicated(
        server: DatarefServer,
        options: HttpOptions,
        replicated: Replicated,
    ) -> Result<Self, HttpError> {
        check_listen(&options)?;
        let http = &options.http;
        let listener = TcpListener::bind(http.listen)
            .await
            .map_err(|source| HttpError::Bind {
                addr: http.listen,
                source,
            })?;
        let local = listener.local_addr().map_err(|source| HttpError::Bind {
            addr: http.listen,
            source,
        })?;
        let public_url = http
            .public_url
            .clone()
            .unwrap_or_else(|| format!("http://{local}"));
        let mcp_shutdown = CancellationToken::new();
        let send_timeout = options.http.send_timeout;
        let state = Arc::new(AppState::new(
            server,
            &options,
            replicated,
            public_url,
            mcp_shutdown.clone(),
        )?);
        Ok(Self {
            listener,
            local,
            state,
            mcp_shutdown,
            send_timeout,
        })
    }

    /// Serves `host`'s agents too: the agent API under `/agent/…` and the OpenAI-compatible
    /// facade under `/v1/…`, each run in a context made from `shared` for the caller and
    /// the caller's workspace. An `ask` approval unanswered for
    /// [`APPROVAL_TIMEOUT`] is refused. The first call wins.
    pub fn with_agents(self, host: Arc<AgentHost>, shared: SharedContext) -> Self {
        self.with_agents_timeout(host, shared, APPROVAL_TIMEOUT)
    }

    /// [`Self::with_agents`] with another approval timeout.
    pub fn with_agents_timeout(
        self,
        host: Arc<AgentHost>,
        shared: SharedContext,
        approval_timeout: Duration,
    ) -> Self {
        self.with_agents_approvals(
            host,
            shared,
            Arc::new(LocalApprovals::default()),
            approval_timeout,
        )
    }

    /// [`Self::with_agents`] for one of several replicas: runs' approvals wait in
    /// `approvals`, which every replica reaches, so the person's answer may come through
    /// any of them.
    pub fn with_agents_approvals(
        self,
        host: Arc<AgentHost>,
        shared: SharedContext,
        approvals: Arc<dyn ApprovalStore>,
        approval_timeout: Duration,
    ) -> Self {
        let _ = self.state.agents.set(Arc::new(Agents::new(
            host,
            shared,
            approvals,
            approval_timeout,
        )));
        self
    }

    /// Every route and its stack as one service, without the socket: a request through it
    /// (`tower::ServiceExt::oneshot`) is answered as one through [`Self::serve`] would be,
    /// short of the connection's own limits (header and send timeouts, the drain).
    pub fn router(&self) -> axum::Router {
        router(&self.state)
    }

    /// The address actually bound (the port of `:0` filled in).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The MCP endpoint at the address this server listens on: `http://<addr>/mcp`. It is
    /// [`Self::mcp_url`] unless `[http] public_url` names another (a proxy in front).
    pub fn listen_url(&self) -> String {
        format!("http://{}{MCP_PATH}", self.local)
    }

    /// The MCP endpoint as clients should reach it: `<public_url>/mcp`.
    pub fn mcp_url(&self) -> String {
        format!("{}{MCP_PATH}", self.state.public_url)
    }

    /// Serves until `shutdown` is cancelled, then stops accepting, gives open requests
    /// 10 s (`DRAIN`) to finish, and ends the MCP sessions (cancelling what is still running).
    pub async fn serve(self, shutdown: CancellationToken) -> Result<(), HttpError> {
        let Self {
            listener,
            state,
            mcp_shutdown,
            send_timeout,
            ..
        } = self;
        let pruner = spawn_pruner(state.clone(), mcp_shutdown.clone());
        let router = router(&state);
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let (stream, peer) = match accepted {
                        Ok(accepted) => accepted,
                        Err(e) => {
                            // Out of file descriptors and the like: wait, do not spin.
                            tracing::warn!("accepting a connection failed: {e}");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    let connection = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(HEADER_TIMEOUT)
                        .serve_connection(
                            TokioIo::new(SendTimeout::new(stream, send_timeout)),
                            // The peer's address goes with each request (the audit trail
                            // names where a refused token came from): one wrapper around
                            // the router, not its routes layered again per connection.
                            TowerToHyperService::new(tower::Layer::layer(
                                &axum::Extension(crate::layer::auth::Peer(peer)),
                                router.clone(),
                            )),
                        );
                    let connection = graceful.watch(connection);
                    tokio::spawn(async move {
                        if let Err(e) = connection.await {
                            tracing::debug!("connection ended with an error: {e}");
                        }
                    });
                }
                () = shutdown.cancelled() => break,
            }
        }
        drop(listener);
        let deadline = tokio::time::Instant::now() + DRAIN;
        // Idle connections close now and busy ones after their current request; open
        // requests run on, the sessions they belong to included.
        let closed = graceful.shutdown();
        tokio::pin!(closed);
        let mut all_closed = false;
        let open = state.open.clone();
        tokio::select! {
            () = &mut closed => all_closed = true,
            () = open.none_left() => {}
            () = tokio::time::sleep_until(deadline) => {
                tracing::warn!(
                    "{} request(s) still open after {DRAIN:?}; cancelling them",
                    open.count()
                );
            }
        }
        // Ends the sessions and their notification streams (and cancels calls left over),
        // and cancels the agent runs still going (each records that it was cancelled).
        mcp_shutdown.cancel();
        if let Some(agents) = state.agents.get() {
            agents.shutdown.cancel();
        }
        pruner.abort();
        if !all_closed {
            let grace = deadline.max(tokio::time::Instant::now() + Duration::from_secs(1));
            tokio::select! {
                () = &mut closed => tracing::info!("all connections closed"),
                () = tokio::time::sleep_until(grace) => {
                    tracing::warn!("connections still open at shutdown; stopping anyway");
                }
            }
        }
        Ok(())
    }
}

/// Housekeeping every minute until `stop`: forgets what a fresh start would equal.
fn spawn_pruner(state: Arc<AppState>, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
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
