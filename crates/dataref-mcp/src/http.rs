//! `dataref serve --http`: MCP over Streamable HTTP for many principals in one process.
//!
//! rmcp's [`StreamableHttpService`] speaks the protocol (2025-11-25 with sessions, and
//! 2026-07-28, which it always serves statelessly); this module is everything around it,
//! on hyper's HTTP/1.1 server:
//!
//! - every route: the `Host` and `Origin` checks against DNS rebinding (403);
//! - `/mcp`: a bearer token (hashed and looked up in `[principals]`) or a JWT names the
//!   caller, else 401 with `WWW-Authenticate` pointing at the protected-resource metadata;
//!   per-principal rate (token bucket) and concurrency limits (429 with `Retry-After`); the
//!   caller goes into the request's extensions as a [`Caller`], where
//!   [`DatarefServer::per_request`] finds it. A 2025-11-25 session is bound to the principal
//!   that opened it: its `Mcp-Session-Id` used by anyone else is an unknown session (404);
//! - `/.well-known/oauth-protected-resource` (and `…/mcp`): RFC 9728 metadata;
//! - `GET /files/{path}`: the caller's workspace file, streamed; with a bearer token, or a
//!   signed URL from `POST /files/sign` (HMAC-SHA256 over principal, path and expiry).
//!   Another principal's file, a missing file and a bad or expired signature all get the
//!   same 404.
//!
//! ```no_run
//! # async fn run(server: dataref_mcp::DatarefServer, options: dataref_mcp::http::HttpOptions)
//! # -> Result<(), dataref_mcp::http::HttpError> {
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! let http = dataref_mcp::http::HttpServer::bind(server, options).await?;
//! eprintln!("serving MCP at {}", http.mcp_url());
//! http.serve(shutdown).await?;
//! # Ok(()) }
//! ```

mod auth;
mod body;
mod files;
mod guard;
mod jwt;
mod limits;
mod sessions;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use dataref_config::{HttpConfig, PrincipalConfig};
use dataref_protocol::Principal;
use http::{Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::{Caller, DatarefServer};

pub use auth::{NewToken, new_token};
pub(crate) use body::Body;

/// The MCP endpoint's path.
pub const MCP_PATH: &str = "/mcp";
const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";
/// How long open connections may take to finish after a shutdown signal.
const DRAIN: Duration = Duration::from_secs(10);
/// A request's headers must arrive within this (slow clients hold a connection otherwise).
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

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

/// A bound, configured server; [`HttpServer::serve`] runs it.
pub struct HttpServer {
    listener: TcpListener,
    state: Arc<State>,
    /// Cancels rmcp's sessions and streams at shutdown.
    mcp_shutdown: CancellationToken,
}

impl std::fmt::Debug for HttpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpServer")
            .field("public_url", &self.state.public_url)
            .finish_non_exhaustive()
    }
}

struct State {
    server: DatarefServer,
    mcp: StreamableHttpService<DatarefServer, LocalSessionManager>,
    sessions: sessions::Sessions,
    auth: auth::Authenticator,
    guard: guard::Guard,
    limits: limits::Limits,
    signer: Arc<files::Signer>,
    download_ttl: Duration,
    /// Without a trailing `/`.
    public_url: String,
}

impl HttpServer {
    /// Checks the options, binds `options.http.listen` and builds the routes. Nothing is
    /// served until [`Self::serve`].
    pub async fn bind(server: DatarefServer, options: HttpOptions) -> Result<Self, HttpError> {
        let HttpOptions {
            http,
            principals,
            anonymous,
        } = options;
        if !http.auth && !http.listen.ip().is_loopback() {
            return Err(HttpError::AuthOffNotLoopback {
                addr: http.listen,
                principal: anonymous,
            });
        }
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
        let lookup = |name: &str| std::env::var(name).ok();
        let auth = auth::Authenticator::new(&http, &principals, anonymous, &public_url, &lookup)?;
        let guard = guard::Guard::new(&http, &public_url);
        let signer = Arc::new(files::Signer::new(http.signing_key.as_deref(), &lookup)?);
        server.set_download_links(Arc::new(files::Links {
            signer: signer.clone(),
            public_url: public_url.clone(),
            ttl: http.download_ttl,
        }));
        let mcp_shutdown = CancellationToken::new();
        let manager = Arc::new(LocalSessionManager::default());
        // Host and Origin are checked here for every route, before authentication.
        let config = StreamableHttpServerConfig::default()
            .with_legacy_session_mode(true)
            .disable_allowed_hosts()
            .disable_allowed_origins()
            .with_cancellation_token(mcp_shutdown.clone());
        let factory_server = server.clone();
        let mcp =
            StreamableHttpService::new(move || Ok(factory_server.clone()), manager.clone(), config);
        let state = Arc::new(State {
            server,
            mcp,
            sessions: sessions::Sessions::new(manager),
            auth,
            guard,
            limits: limits::Limits::new(http.max_concurrent, http.rate_per_minute),
            signer,
            download_ttl: http.download_ttl,
            public_url,
        });
        Ok(Self {
            listener,
            state,
            mcp_shutdown,
        })
    }

    /// The address actually bound (the port of `:0` filled in).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The MCP endpoint as clients should reach it: `<public_url>/mcp`.
    pub fn mcp_url(&self) -> String {
        format!("{}{MCP_PATH}", self.state.public_url)
    }

    /// Serves until `shutdown` is cancelled, then stops accepting, ends the MCP sessions
    /// and gives open requests [`DRAIN`] to finish.
    pub async fn serve(self, shutdown: CancellationToken) -> Result<(), HttpError> {
        let Self {
            listener,
            state,
            mcp_shutdown,
        } = self;
        let pruner = sessions::spawn_pruner(state.clone(), mcp_shutdown.clone());
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
                    let state = state.clone();
                    let service = hyper::service::service_fn(move |request| {
                        let state = state.clone();
                        async move { Ok::<_, Infallible>(route(&state, request).await) }
                    });
                    let connection = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(HEADER_TIMEOUT)
                        .serve_connection(TokioIo::new(stream), service);
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
        mcp_shutdown.cancel();
        pruner.abort();
        tokio::select! {
            () = graceful.shutdown() => tracing::info!("all connections closed"),
            () = tokio::time::sleep(DRAIN) => {
                tracing::warn!("connections still open after {DRAIN:?}; stopping anyway");
            }
        }
        Ok(())
    }
}

/// One request, any route.
async fn route(state: &State, request: Request<Incoming>) -> Response<Body> {
    if let Err(refused) = state.guard.check(request.headers()) {
        return refused.response();
    }
    let path = request.uri().path().to_owned();
    if path == METADATA_PATH || path == format!("{METADATA_PATH}{MCP_PATH}") {
        return match *request.method() {
            Method::GET | Method::HEAD => metadata(state, &path),
            _ => method_not_allowed("GET"),
        };
    }
    if path == MCP_PATH {
        return mcp(state, request).await;
    }
    if path == "/files/sign" {
        return match *request.method() {
            Method::POST => files::sign(state, request).await,
            _ => method_not_allowed("POST"),
        };
    }
    if let Some(rest) = path.strip_prefix("/files/") {
        let rest = rest.to_owned();
        return match *request.method() {
            Method::GET => files::download(state, request, &rest).await,
            _ => method_not_allowed("GET"),
        };
    }
    json_response(
        StatusCode::NOT_FOUND,
        json!({
            "error": "not_found",
            "message": format!("nothing is served at `{}`", truncate(&path)),
            "hint": format!("the MCP endpoint is `{MCP_PATH}`"),
        }),
    )
}

/// `/mcp`: authenticate, limit, bind sessions to principals, then rmcp.
async fn mcp(state: &State, mut request: Request<Incoming>) -> Response<Body> {
    let principal = match state.auth.authenticate(request.headers()) {
        Ok(p) => p,
        Err(failure) => return state.auth.challenge(&failure),
    };
    if let Err(refused) = state.limits.admit(&principal) {
        return refused.response();
    }
    // Tool calls arrive as POSTs; a GET is the long-lived notification stream and a
    // DELETE ends a session, neither of which should take a slot.
    let permit = if request.method() == Method::POST {
        match state.limits.slot(&principal) {
            Ok(p) => Some(p),
            Err(refused) => return refused.response(),
        }
    } else {
        None
    };
    let session = request
        .headers()
        .get(sessions::HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if let Some(id) = &session
        && !state.sessions.is_bound_to(id, &principal)
    {
        return sessions::unknown_session();
    }
    let method = request.method().clone();
    request.extensions_mut().insert(Caller(principal.clone()));
    let response = crate::jsonrpc::handle(&state.mcp, request).await;
    match (&session, method) {
        (None, _) => {
            if let Some(id) = response
                .headers()
                .get(sessions::HEADER)
                .and_then(|v| v.to_str().ok())
            {
                state.sessions.bind(id, &principal);
            }
        }
        (Some(id), Method::DELETE) if response.status().is_success() => {
            state.sessions.forget(id);
        }
        (Some(_), _) => {}
    }
    let (parts, body) = response.into_parts();
    Response::from_parts(parts, body::holding(body, permit))
}

/// RFC 9728 protected-resource metadata. `resource` is the URL this document describes:
/// the server for the bare path, the MCP endpoint for the `/mcp`-suffixed one.
fn metadata(state: &State, path: &str) -> Response<Body> {
    let resource = if path.ends_with(MCP_PATH) {
        format!("{}{MCP_PATH}", state.public_url)
    } else {
        state.public_url.clone()
    };
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

fn method_not_allowed(allowed: &'static str) -> Response<Body> {
    let mut r = json_response(
        StatusCode::METHOD_NOT_ALLOWED,
        json!({
            "error": "method_not_allowed",
            "message": format!("this path answers {allowed} only"),
        }),
    );
    r.headers_mut()
        .insert(header::ALLOW, header::HeaderValue::from_static(allowed));
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

/// Echoed request values are bounded.
pub(crate) fn truncate(s: &str) -> String {
    const MAX: usize = 100;
    match s.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

/// Seconds since the Unix epoch.
pub(crate) fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}
