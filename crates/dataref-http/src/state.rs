//! What the server is given ([`HttpOptions`], and from the shared backend [`Replicated`])
//! and what every handler shares ([`AppState`]), made once by [`AppState::new`] from the
//! options, which refuses what it cannot use ([`check`]).

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use dataref_agent::AgentHost;
use dataref_agent::approvals::ApprovalStore;
use dataref_config::{HttpConfig, PrincipalConfig};
use dataref_mcp::{DatarefServer, StreamableHttp};
use dataref_protocol::Principal;
use dataref_tool::SharedContext;
use tokio_util::sync::CancellationToken;

use crate::error::HttpError;
use crate::layer::auth::Authenticator;
use crate::layer::guard::Guard;
use crate::layer::limits::{LimitConfig, Limiter, LocalLimiter};
use crate::layer::open::Open;
use crate::layer::session::Sessions;
use crate::links::{Links, Signer, SigningKey};

/// What `serve --http` needs from the config.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// `[http]`; `listen` is where [`HttpServer::bind`](crate::HttpServer::bind) listens.
    pub http: HttpConfig,
    /// `[principals]`: whose tokens are accepted.
    pub principals: BTreeMap<Principal, PrincipalConfig>,
    /// Every caller when `[http] auth = false`.
    pub anonymous: Principal,
}

/// What the replicas of one deployment share, from the shared backend: given to
/// [`HttpServer::bind_replicated`](crate::HttpServer::bind_replicated). The default is one
/// server on its own: limits counted in this process, a random download-link key unless
/// `[http] signing_key` is set.
#[derive(Clone, Default)]
pub struct Replicated {
    /// Counts every principal's requests and slots across the replicas.
    pub limiter: Option<Arc<dyn Limiter>>,
    /// The download-link key every replica signs with when `[http] signing_key` is not
    /// set (a configured key wins).
    pub signing_key: Option<SigningKey>,
    /// What `GET /ready` checks.
    pub readiness: Option<Arc<dyn Readiness>>,
}

impl std::fmt::Debug for Replicated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replicated")
            .field("limiter", &self.limiter.as_ref().map(|_| "shared"))
            .field("signing_key", &self.signing_key)
            .field("readiness", &self.readiness.as_ref().map(|_| "shared"))
            .finish()
    }
}

/// Whether this replica reaches what it shares with the others now: `GET /ready` asks it
/// and answers 200, or 503 with what is out of reach, so a balancer sends requests only
/// to replicas that can serve them. Without one, `/ready` answers 200 while the server runs.
#[async_trait::async_trait]
pub trait Readiness: Send + Sync {
    /// `Err` says what this replica cannot reach, for anyone who asks: name it ("the
    /// object store"), and log how it failed (addresses, errors) instead.
    async fn check(&self) -> Result<(), String>;
}

/// Everything the handlers share: made once per server, read by every request.
pub(crate) struct AppState {
    pub(crate) server: DatarefServer,
    pub(crate) mcp: StreamableHttp,
    pub(crate) sessions: Arc<Sessions>,
    pub(crate) auth: Arc<Authenticator>,
    pub(crate) guard: Arc<Guard>,
    pub(crate) limits: Arc<dyn Limiter>,
    /// What `GET /ready` checks; `None`: ready while serving.
    pub(crate) readiness: Option<Arc<dyn Readiness>>,
    /// The last answer of `readiness` and when it came (see `route::ready`).
    pub(crate) last_ready: tokio::sync::Mutex<Option<(Instant, Result<(), String>)>>,
    pub(crate) signer: Arc<Signer>,
    pub(crate) download_ttl: Duration,
    pub(crate) body_timeout: Duration,
    /// Bytes of one upload, at most.
    pub(crate) max_upload_bytes: u64,
    /// Requests being answered; a shutdown waits for them.
    pub(crate) open: Open,
    /// Without a trailing `/`.
    pub(crate) public_url: String,
    /// The agents behind `/agent/…` and `/v1/…`, once
    /// [`HttpServer::with_agents`](crate::HttpServer::with_agents) gave some.
    pub(crate) agents: OnceLock<Arc<Agents>>,
}

impl AppState {
    /// The state of a server reached at `public_url` (without a trailing `/`); rmcp's
    /// sessions end when `mcp_shutdown` is cancelled. Attaches the download links to
    /// `server`'s tool results.
    pub(crate) fn new(
        server: DatarefServer,
        options: &HttpOptions,
        replicated: Replicated,
        public_url: String,
        mcp_shutdown: CancellationToken,
    ) -> Result<Self, HttpError> {
        let Checked {
            auth,
            guard,
            signer,
        } = check(options, &public_url, replicated.signing_key.as_ref())?;
        let http = &options.http;
        server.set_download_links(Arc::new(Links {
            signer: signer.clone(),
            public_url: public_url.clone(),
            ttl: http.download_ttl,
        }));
        let mcp = StreamableHttp::new(&server, mcp_shutdown);
        Ok(Self {
            server,
            mcp,
            sessions: Arc::default(),
            auth: Arc::new(auth),
            guard: Arc::new(guard),
            limits: replicated
                .limiter
                .unwrap_or_else(|| Arc::new(LocalLimiter::with(LimitConfig::of(http)))),
            readiness: replicated.readiness,
            last_ready: tokio::sync::Mutex::new(None),
            signer,
            download_ttl: http.download_ttl,
            body_timeout: http.body_timeout,
            max_upload_bytes: http.max_upload_bytes,
            open: Open::default(),
            public_url,
            agents: OnceLock::new(),
        })
    }
}

/// The agents a server runs and what their HTTP routes share.
pub(crate) struct Agents {
    pub(crate) host: Arc<AgentHost>,
    pub(crate) shared: SharedContext,
    /// Where runs' approvals wait for their answers (this server's memory, or shared by
    /// the replicas).
    pub(crate) approvals: Arc<dyn ApprovalStore>,
    pub(crate) approval_timeout: Duration,
    /// Cancelled when the server stops: every run's token is a child of it.
    pub(crate) shutdown: CancellationToken,
}

impl Agents {
    pub(crate) fn new(
        host: Arc<AgentHost>,
        shared: SharedContext,
        approvals: Arc<dyn ApprovalStore>,
        approval_timeout: Duration,
    ) -> Self {
        Self {
            host,
            shared,
            approvals,
            approval_timeout,
            shutdown: CancellationToken::new(),
        }
    }
}

/// What [`check`] builds: the parts of the server that come from the config.
pub(crate) struct Checked {
    pub(crate) auth: Authenticator,
    pub(crate) guard: Guard,
    pub(crate) signer: Arc<Signer>,
}

/// `auth = false` is for loopback only (checked before anything listens).
pub(crate) fn check_listen(options: &HttpOptions) -> Result<(), HttpError> {
    let http = &options.http;
    if !http.auth && !http.listen.ip().is_loopback() {
        return Err(HttpError::AuthOffNotLoopback {
            addr: http.listen,
            principal: options.anonymous.clone(),
        });
    }
    Ok(())
}

/// Builds the authenticator, the Host/Origin guard and the download signer from the
/// options, `${NAME}` expanded from the environment: each refuses what it cannot use. The
/// signer's key is `[http] signing_key`, else `shared_key`, else a random one.
pub(crate) fn check(
    options: &HttpOptions,
    public_url: &str,
    shared_key: Option<&SigningKey>,
) -> Result<Checked, HttpError> {
    check_listen(options)?;
    let HttpOptions {
        http,
        principals,
        anonymous,
    } = options;
    let auth = Authenticator::new(
        http,
        principals,
        anonymous.clone(),
        public_url,
        &dataref_config::env::process,
    )?;
    let guard = Guard::new(http, public_url);
    let signer = Arc::new(Signer::with_shared(
        http.signing_key.as_deref(),
        shared_key,
        &dataref_config::env::process,
    )?);
    Ok(Checked {
        auth,
        guard,
        signer,
    })
}
