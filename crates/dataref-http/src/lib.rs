//! `dataref serve --http`: MCP over Streamable HTTP for many principals in one process.
//!
//! rmcp's [`StreamableHttpService`] speaks the protocol (2025-11-25 with sessions, and
//! 2026-07-28, which it always serves statelessly); this module is everything around it,
//! on hyper's HTTP/1.1 server:
//!
//! - every route: the `Host` and `Origin` checks against DNS rebinding (403; a repeated
//!   `Host` or `Origin`, or a request target naming another host, 400); a request body
//!   must arrive whole within `body_timeout` (else 408), and a connection whose client
//!   reads nothing of a response for `send_timeout` is closed;
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
//!   same 404. Downloads have their own per-principal bound (`max_downloads`), apart from
//!   tool calls.
//!
//! At shutdown the server stops accepting, lets open requests (tool calls, downloads)
//! finish for up to [`DRAIN`], and only then ends the MCP sessions.
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

mod auth;
mod body;
mod conn;
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
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use dataref_mcp::{Caller, DatarefServer, StreamableHttp};

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

struct State {
    server: DatarefServer,
    mcp: StreamableHttp,
    sessions: sessions::Sessions,
    auth: auth::Authenticator,
    guard: guard::Guard,
    limits: limits::Limits,
    signer: Arc<files::Signer>,
    download_ttl: Duration,
    body_timeout: Duration,
    /// Requests being answered; a shutdown waits for them.
    open: conn::Open,
    /// Without a trailing `/`.
    public_url: String,
}

impl HttpServer {
    /// Checks the options ([`validate`]), binds `options.http.listen` and builds the
    /// routes. Nothing is served until [`Self::serve`].
    pub async fn bind(server: DatarefServer, options: HttpOptions) -> Result<Self, HttpError> {
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
        } = check(&options, &public_url)?;
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
            // Auth off is one local user on loopback: a rate limit would only throttle
            // them against themselves (a host's burst of requests, the conformance
            // suite), there is no other principal to protect. Concurrency still applies.
            limits: limits::Limits::new(
                http.max_concurrent,
                http.max_downloads,
                if http.auth {
                    http.rate_per_minute
                } else {
                    u32::MAX
                },
            ),
            signer,
            download_ttl: http.download_ttl,
            body_timeout: http.body_timeout,
            open: conn::Open::default(),
            public_url,
        });
        Ok(Self {
            listener,
            local,
            state,
            mcp_shutdown,
            send_timeout: http.send_timeout,
        })
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
    /// [`DRAIN`] to finish, and ends the MCP sessions (cancelling what is still running).
    pub async fn serve(self, shutdown: CancellationToken) -> Result<(), HttpError> {
        let Self {
            listener,
            state,
            mcp_shutdown,
            send_timeout,
            ..
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
                        .serve_connection(
                            TokioIo::new(conn::SendTimeout::new(stream, send_timeout)),
                            service,
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
        // Ends the sessions and their notification streams (and cancels calls left over).
        mcp_shutdown.cancel();
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
    check(options, &public_url).map(drop)
}

/// What [`check`] builds: the parts of the server that come from the config.
struct Checked {
    auth: auth::Authenticator,
    guard: guard::Guard,
    signer: Arc<files::Signer>,
}

/// `auth = false` is for loopback only (checked before anything listens).
fn check_listen(options: &HttpOptions) -> Result<(), HttpError> {
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
/// options, `${NAME}` expanded from the environment: each refuses what it cannot use.
fn check(options: &HttpOptions, public_url: &str) -> Result<Checked, HttpError> {
    check_listen(options)?;
    let HttpOptions {
        http,
        principals,
        anonymous,
    } = options;
    let lookup = |name: &str| std::env::var(name).ok();
    let auth = auth::Authenticator::new(http, principals, anonymous.clone(), public_url, &lookup)?;
    let guard = guard::Guard::new(http, public_url);
    let signer = Arc::new(files::Signer::new(http.signing_key.as_deref(), &lookup)?);
    Ok(Checked {
        auth,
        guard,
        signer,
    })
}

/// One request, any route.
async fn route(state: &State, request: Request<Incoming>) -> Response<Body> {
    if let Err(refused) = state.guard.check(request.uri(), request.headers()) {
        return refused.response();
    }
    let path = request.uri().path().to_owned();
    if path == METADATA_PATH || path == format!("{METADATA_PATH}{MCP_PATH}") {
        return match *request.method() {
            Method::GET | Method::HEAD => metadata(state, &path),
            _ => method_not_allowed("GET"),
        };
    }
    // Counted from here until the response's last byte: a shutdown waits for it.
    let open = state.open.start();
    if path == MCP_PATH {
        return mcp(state, request, open).await;
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
            Method::GET => files::download(state, request, &rest, open).await,
            _ => method_not_allowed("GET"),
        };
    }
    json_response(
        StatusCode::NOT_FOUND,
        json!({
            "error": "not_found",
            "message": format!("nothing is served at `{}`", dataref_protocol::truncate_echo(&path)),
            "hint": format!("the MCP endpoint is `{MCP_PATH}`"),
        }),
    )
}

/// `/mcp`: authenticate, limit, bind sessions to principals, then rmcp.
async fn mcp(state: &State, request: Request<Incoming>, open: conn::OpenRequest) -> Response<Body> {
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
    let (mut parts, body) = request.into_parts();
    parts.extensions.insert(Caller(principal.clone()));
    let (body, timed_out) = body::with_deadline(body, state.body_timeout);
    let response = state.mcp.handle(Request::from_parts(parts, body)).await;
    if timed_out.happened() {
        return body_timed_out(state.body_timeout);
    }
    match (&session, &method) {
        (None, _) => {
            if let Some(id) = response
                .headers()
                .get(sessions::HEADER)
                .and_then(|v| v.to_str().ok())
            {
                state.sessions.bind(id, &principal);
            }
        }
        (Some(id), &Method::DELETE) if response.status().is_success() => {
            state.sessions.forget(id);
        }
        (Some(_), _) => {}
    }
    let (parts, body) = response.into_parts();
    // A GET is the session's notification stream, open as long as the session: not a
    // request a shutdown should wait for.
    let open = (method != Method::GET).then_some(open);
    Response::from_parts(parts, body::holding(body, (permit, open)))
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

/// Seconds since the Unix epoch.
pub(crate) fn now_secs() -> i64 {
    dataref_protocol::Timestamp::now().unix_seconds()
}
