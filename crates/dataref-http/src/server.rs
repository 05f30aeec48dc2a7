//! The listener and its connections: [`HttpServer::bind`] checks the options and builds
//! the state the pipeline shares, [`HttpServer::serve`] accepts connections (HTTP/1.1,
//! a header timeout, a send timeout on the socket), runs each request through the
//! pipeline ([`crate::pipeline`]) and drains at shutdown.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use dataref_agent::AgentHost;
use dataref_mcp::{DatarefServer, StreamableHttp};
use dataref_tool::SharedContext;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::{
    Checked, DRAIN, HEADER_TIMEOUT, HttpError, HttpOptions, MCP_PATH, Replicated, agent_api, auth,
    check, check_listen, conn, files, guard, limits, pipeline, sessions,
};
use dataref_agent::approvals::{ApprovalStore, LocalApprovals};

/// A bound, configured server; [`HttpServer::serve`] runs it.
pub struct HttpServer {
    listener: TcpListener,
    /// The address bound (the port of `:0` filled in).
    local: SocketAddr,
    state: Arc<State>,
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

pub(crate) struct State {
    pub(crate) server: DatarefServer,
    pub(crate) mcp: StreamableHttp,
    pub(crate) sessions: sessions::Sessions,
    pub(crate) auth: auth::Authenticator,
    pub(crate) guard: guard::Guard,
    pub(crate) limits: Arc<dyn limits::Limiter>,
    /// What `GET /ready` checks; `None`: ready while serving.
    pub(crate) readiness: Option<Arc<dyn crate::Readiness>>,
    /// The last answer of `readiness` and when it came (see [`crate::routes`]'s `ready`).
    pub(crate) last_ready: tokio::sync::Mutex<Option<(std::time::Instant, Result<(), String>)>>,
    pub(crate) signer: Arc<files::Signer>,
    pub(crate) download_ttl: Duration,
    pub(crate) body_timeout: Duration,
    /// Requests being answered; a shutdown waits for them.
    pub(crate) open: conn::Open,
    /// Without a trailing `/`.
    pub(crate) public_url: String,
    /// The agents behind `/agent/…` and `/v1/…`, when [`HttpServer::with_agents`] gave some.
    pub(crate) agents: OnceLock<Arc<agent_api::Agents>>,
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
        let Checked {
            auth,
            guard,
            signer,
        } = check(&options, &public_url, replicated.signing_key.as_ref())?;
        let http = options.http;
        server.set_download_links(Arc::new(files::Links {
            signer: signer.clone(),
            public_url: public_url.clone(),
            ttl: http.download_ttl,
        }));
        let mcp_shutdown = CancellationToken::new();
        // Host and Origin are checked here for every route, before authentication.
        let mcp = StreamableHttp::new(&server, mcp_shutdown.clone());
        let state = Arc::new(State {
            server,
            mcp,
            sessions: sessions::Sessions::default(),
            auth,
            guard,
            limits: replicated.limiter.unwrap_or_else(|| {
                Arc::new(limits::LocalLimiter::with(limits::LimitConfig::of(&http)))
            }),
            readiness: replicated.readiness,
            last_ready: tokio::sync::Mutex::new(None),
            signer,
            download_ttl: http.download_ttl,
            body_timeout: http.body_timeout,
            open: conn::Open::default(),
            public_url,
            agents: OnceLock::new(),
        });
        Ok(Self {
            listener,
            local,
            state,
            mcp_shutdown,
            send_timeout: http.send_timeout,
        })
    }

    /// Serves `host`'s agents too: the agent API under `/agent/…` and the OpenAI-compatible
    /// facade under `/v1/…`, each run in a context made from `shared` for the caller and
    /// the caller's workspace. An `ask` approval unanswered for
    /// [`APPROVAL_TIMEOUT`](crate::APPROVAL_TIMEOUT) is refused. The first call wins.
    pub fn with_agents(self, host: Arc<AgentHost>, shared: SharedContext) -> Self {
        self.with_agents_timeout(host, shared, agent_api::APPROVAL_TIMEOUT)
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
        let _ = self.state.agents.set(Arc::new(agent_api::Agents::new(
            host,
            shared,
            approvals,
            approval_timeout,
        )));
        self
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
        let pruner = sessions::spawn_pruner(state.clone(), mcp_shutdown.clone());
        let pipeline = pipeline::build(&state);
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let stream = match accepted {
                        Ok((stream, _)) => stream,
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
                            TokioIo::new(conn::SendTimeout::new(stream, send_timeout)),
                            TowerToHyperService::new(pipeline.clone()),
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
