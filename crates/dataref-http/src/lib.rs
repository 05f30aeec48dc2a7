//! dataref's HTTP server (`dataref serve --http`): MCP over Streamable HTTP for many
//! principals in one process, and the workspace downloads.
//!
//! It owns HTTP serving and nothing of the protocol: the listener and its connections
//! (hyper's HTTP/1.1 server, a header timeout, a send timeout on the socket, the drain at
//! shutdown), the request pipeline as tower layers ([`tower_layer::Layer`] over
//! [`tower_service::Service`], see `pipeline.rs`: the guard, then by path one stack per
//! route, body deadline → auth → rate limit → slot → handler), routing (`routes.rs`: the
//! MCP endpoint, the metadata, the downloads, and the place for the page to come), bearer tokens and JWTs, per-principal
//! limits, Host/Origin checks and signed download links. The MCP protocol is
//! `dataref-mcp`'s: [`dataref_mcp::StreamableHttp`] (rmcp's service with every POST body
//! checked), [`dataref_mcp::Caller`] (the principal this crate authenticated, in the
//! request's extensions) and [`dataref_mcp::DownloadLinks`] (implemented here). This
//! crate depends on `dataref-mcp`, never the reverse, and imports nothing of rmcp.
//!
//! - every route: the `Host` and `Origin` checks against DNS rebinding (403; a repeated
//!   `Host` or `Origin`, or a request target naming another host, 400); a request body
//!   must arrive whole within `body_timeout` (else 408), and a connection whose client
//!   reads nothing of a response for `send_timeout` is closed;
//! - `/mcp`: a bearer token (hashed and looked up in `[principals]`) or a JWT names the
//!   caller, else 401 with `WWW-Authenticate` pointing at the protected-resource metadata;
//!   per-principal rate (token bucket) and concurrency limits (429 with `Retry-After`); the
//!   caller goes into the request's extensions as a [`Caller`](dataref_mcp::Caller), where
//!   `DatarefServer::per_request` finds it. A 2025-11-25 session is bound to the principal
//!   that opened it: its `Mcp-Session-Id` used by anyone else is an unknown session (404);
//! - `/.well-known/oauth-protected-resource` (and `…/mcp`): RFC 9728 metadata;
//! - `GET /files/{path}`: the caller's workspace file, streamed; with a bearer token, or a
//!   signed URL from `POST /files/sign` (HMAC-SHA256 over principal, path and expiry).
//!   Another principal's file, a missing file and a bad or expired signature all get the
//!   same 404. Downloads have their own per-principal bound (`max_downloads`), apart from
//!   tool calls.
//! - `/agent/…`: the agent API (`agent_api.rs`): a message to a new or existing session
//!   answered as `text/event-stream` (one SSE event per `dataref_agent::AgentEvent`; the
//!   client going away cancels the run), the caller's sessions (list, history, delete),
//!   approvals of `ask` tools answered by the same principal, the profiles. Every message
//!   goes through `dataref_agent::AgentHost::send`. A request that starts a run takes an
//!   in-flight slot, as a tool call does;
//! - `/v1/chat/completions`, `/v1/models`: the OpenAI-compatible facade
//!   (`openai_facade.rs`), `model` naming an agent profile, streamed or not.
//!
//! At shutdown the server stops accepting, lets open requests (tool calls, downloads)
//! finish for up to 10 s, and only then ends the MCP sessions.
//!
//! [`validate`] is everything [`HttpServer::bind`] refuses at start (`dataref doctor`
//! runs it); [`new_token`] makes a bearer token and its `token_sha256`.
//!
//! ```no_run
//! # async fn run(server: dataref_mcp::DatarefServer, options: dataref_http::HttpOptions)
//! # -> Result<(), dataref_http::HttpError> {
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! let http = dataref_http::HttpServer::bind(server, options).await?;
//! eprintln!("serving MCP at {}", http.mcp_url());
//! http.serve(shutdown).await?;
//! # Ok(()) }
//! ```
//!
//! Owns: `hyper`, `hyper-util` and `ring` (token hashes, JWT signatures, signed links).
//! Must not import rmcp, the tools, the store or the sandbox: the agent runtime
//! (`dataref-agent`) and the tool framework (`dataref-tool`) are what it runs agents on.
mod agent_api;
mod auth;
mod body;
mod conn;
mod files;
mod guard;
mod jwt;
mod limits;
mod openai_facade;
mod page;
mod pipeline;
mod routes;
mod server;
mod sessions;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use dataref_config::{HttpConfig, PrincipalConfig};
use dataref_protocol::Principal;
use http::{Response, StatusCode, header};
use serde_json::{Value, json};

pub use agent_api::{APPROVAL_TIMEOUT, MAX_AGENT_BODY};
pub use auth::{NewToken, new_token};
pub(crate) use body::Body;
pub use files::SigningKey;
pub use limits::{LimitConfig, Limiter, Permit, Refused, SlotKind};
pub use server::HttpServer;

/// The MCP endpoint's path.
pub const MCP_PATH: &str = "/mcp";
pub(crate) const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";
/// How long open connections may take to finish after a shutdown signal.
pub(crate) const DRAIN: Duration = Duration::from_secs(10);
/// A request's headers must arrive within this (slow clients hold a connection otherwise).
pub(crate) const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// What `serve --http` needs from the config.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// `[http]`; `listen` is where [`HttpServer::bind`] listens.
    pub http: HttpConfig,
    /// `[principals]`: whose tokens are accepted.
    pub principals: BTreeMap<Principal, PrincipalConfig>,
    /// Every caller when `[http] auth = false`.
    pub anonymous: Principal,
}

/// What the replicas of one deployment share, from the shared backend: given to
/// [`HttpServer::bind_replicated`]. The default is one server on its own: limits counted
/// in this process, a random download-link key unless `[http] signing_key` is set.
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

/// Where a load balancer asks whether this replica can serve now.
pub const READY_PATH: &str = "/ready";

/// Whether this replica reaches what it shares with the others now: `GET /ready` asks it
/// and answers 200, or 503 with what is out of reach, so a balancer sends requests only
/// to replicas that can serve them. Without one, `/ready` answers 200 while the server runs.
#[async_trait::async_trait]
pub trait Readiness: Send + Sync {
    /// `Err` says what this replica cannot reach, for anyone who asks: name it ("the
    /// object store"), and log how it failed (addresses, errors) instead.
    async fn check(&self) -> Result<(), String>;
}

/// Why the HTTP server cannot start. Each says what to change.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HttpError {
    #[error(
        "`[http] auth = false` serves everyone as `{principal}`, but `{addr}` is not a loopback address"
    )]
    AuthOffNotLoopback {
        addr: SocketAddr,
        principal: Principal,
    },
    #[error(
        "nobody could call this server: no `[principals.NAME]` has a `token_sha256` and `[http.jwt]` is not set"
    )]
    NoCredentials,
    #[error("`{key}`: {message}")]
    Setting {
        key: &'static str,
        message: String,
        hint: String,
    },
    #[error("cannot listen on `{addr}`: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

impl HttpError {
    /// What to do about it.
    pub fn hint(&self) -> String {
        match self {
            Self::AuthOffNotLoopback { .. } => "listen on `127.0.0.1:PORT` (or `[::1]:PORT`), or keep `auth = true` and give each caller a token with `dataref token new NAME`".into(),
            Self::NoCredentials => "make a token with `dataref token new NAME` and paste the `[principals.NAME]` line it prints into dataref.toml, or set `[http.jwt]`".into(),
            Self::Setting { hint, .. } => hint.clone(),
            Self::Bind { .. } => "choose a free port, or stop what is listening there".into(),
        }
    }
}

/// `value` of the setting `key` with `${NAME}` expanded; an unset or malformed reference is
/// an error naming the key.
fn expand_setting(
    key: &'static str,
    value: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<String, HttpError> {
    use dataref_config::env::{ExpandError, expand};
    expand(value, lookup).map_err(|e| match e {
        ExpandError::Unset(variable) => HttpError::Setting {
            key,
            message: format!("uses `${{{variable}}}`, which is not set"),
            hint: format!("set `{variable}` in the server's environment"),
        },
        ExpandError::Malformed(message) => HttpError::Setting {
            key,
            message,
            hint: "write `${NAME}` for an environment variable, `$$` for a `$`".into(),
        },
    })
}

/// Everything `serve --http` refuses at start, short of binding the port: `auth = false`
/// on an address that is not loopback, nobody with a token and no `[http.jwt]`, a JWT key
/// that cannot be used (an unreadable JWKS file, a short or unset HS256 secret), a bad
/// `signing_key`. [`HttpServer::bind`] runs the same checks, so `dataref doctor`, which
/// calls this, refuses exactly what the server would, with the same message.
pub fn validate(options: &HttpOptions) -> Result<(), HttpError> {
    check_listen(options)?;
    let public_url = options
        .http
        .public_url
        .clone()
        .unwrap_or_else(|| format!("http://{}", options.http.listen));
    check(options, &public_url, None).map(drop)
}

/// The key download links are signed with: `[http] signing_key` when set (`${NAME}`
/// expanded from the environment), else `replicated`'s shared key; `None` when neither, and
/// then each process makes a random one (links die with a restart and verify only on the
/// process that signed them).
pub fn download_key(
    http: &HttpConfig,
    replicated: &Replicated,
) -> Result<Option<SigningKey>, HttpError> {
    files::configured_key(http.signing_key.as_deref(), &dataref_config::env::process)
        .map(|configured| configured.or_else(|| replicated.signing_key.clone()))
}

/// What replicas of this server share and what each process keeps to itself, in words
/// (`dataref doctor`, the log at start). `shared`: `[shared]` is configured.
pub fn sharing(http: &HttpConfig, shared: bool) -> String {
    match (shared, http.signing_key.is_some()) {
        (true, configured) => format!(
            "limits (`rate_per_minute`, `max_concurrent`, `max_downloads`) counted across \
             replicas in the shared index; download links signed with {}; 2025-11-25 MCP \
             sessions stay on the replica that made them (route on `Mcp-Session-Id`)",
            if configured {
                "`[http] signing_key` (set the same on every replica)"
            } else {
                "the key kept in the shared index"
            }
        ),
        (false, true) => "limits counted by this process; download links signed with \
                          `[http] signing_key`"
            .into(),
        (false, false) => "limits counted by this process; download links signed with a \
                           random key per process (they die with a restart)"
            .into(),
    }
}

/// What [`check`] builds: the parts of the server that come from the config.
pub(crate) struct Checked {
    pub(crate) auth: auth::Authenticator,
    pub(crate) guard: guard::Guard,
    pub(crate) signer: Arc<files::Signer>,
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
    let auth = auth::Authenticator::new(
        http,
        principals,
        anonymous.clone(),
        public_url,
        &dataref_config::env::process,
    )?;
    let guard = guard::Guard::new(http, public_url);
    let signer = Arc::new(files::Signer::with_shared(
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

/// 408 for a request body that did not arrive within `limit`; the connection is closed
/// (what is left of the body is never read).
pub(crate) fn body_timed_out(limit: Duration) -> Response<Body> {
    tracing::info!("refused a request whose body did not arrive within {limit:?}");
    let mut r = json_response(
        StatusCode::REQUEST_TIMEOUT,
        json!({
            "error": "request_timeout",
            "message": format!("the request body did not arrive within {} s", limit.as_secs_f64()),
            "hint": "send the whole body at once; an operator may raise `[http] body_timeout`",
        }),
    );
    r.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    r
}

/// A JSON body with `Cache-Control: no-store` (answers are per caller).
pub(crate) fn json_response(status: StatusCode, value: Value) -> Response<Body> {
    let bytes = Bytes::from(value.to_string());
    let mut r = Response::new(body::full(bytes));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    h.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    r
}

/// Seconds since the Unix epoch.
pub(crate) fn now_secs() -> i64 {
    dataref_protocol::Timestamp::now().unix_seconds()
}
