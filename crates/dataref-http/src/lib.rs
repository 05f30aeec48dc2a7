//! dataref's HTTP server (`dataref serve --http`): MCP over Streamable HTTP for many
//! principals in one process, and the workspace downloads.
//!
//! It owns HTTP serving and nothing of the protocol: the listener and its connections
//! (hyper's HTTP/1.1 server, a header timeout, a send timeout on the socket, the drain at
//! shutdown), the routes and their stacks on axum (`router.rs`: the guard, then per route
//! body deadline → auth → rate limit → slot → handler), bearer tokens and JWTs,
//! per-principal limits, Host/Origin checks and signed download links. The MCP protocol is
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
//! - `/agent/…`: the agent API (`agent.rs`): a message to a new or existing session
//!   answered as `text/event-stream` (one SSE event per `dataref_agent::AgentEvent`; the
//!   client going away cancels the run), the caller's sessions (list, history, delete),
//!   approvals of `ask` tools answered by the same principal, the profiles. Every message
//!   goes through `dataref_agent::AgentHost::send`. A request that starts a run takes an
//!   in-flight slot, as a tool call does;
//! - `/v1/chat/completions`, `/v1/models`: the OpenAI-compatible facade
//!   (`agent/openai.rs`), `model` naming an agent profile, streamed or not.
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
//! The modules form a DAG, each importing only modules listed before it:
//!
//! 1. `paths`, `error`, `response`: the fixed paths, [`HttpError`], the JSON bodies and
//!    bodies that hold something until their last byte;
//! 2. `links`: download-link keys and signatures, the 404 of every failed download;
//! 3. `layer::{jwt, auth, guard, limits, deadline, session, open}`: the checks, each an
//!    axum middleware over only its own part of the state;
//! 4. `state`: what the server is given ([`HttpOptions`], [`Replicated`]) and what the
//!    handlers share (`AppState`, made from the layers' parts);
//! 5. `route::{page, ready, mcp, files}` and `agent` (`agent::sse`, then `agent::openai`):
//!    the handlers;
//! 6. `router`: the one place paths meet their stacks;
//! 7. `server`: bind, serve, drain ([`HttpServer`]).
//!
//! Beside them, `metrics` (importing only `error`): the layer that counts every request,
//! and [`MetricsEndpoint`], the Prometheus endpoint on a port of its own (`[metrics]`).
//!
//! Owns: `axum`, `hyper`, `hyper-util` and `ring` (token hashes, JWT signatures, signed links).
//! Must not import rmcp, the tools, the store or the sandbox: the agent runtime
//! (`dataref-agent`) and the tool framework (`dataref-tool`) are what it runs agents on.
mod agent;
mod error;
mod layer;
mod links;
mod metrics;
mod paths;
mod response;
mod route;
mod router;
mod server;
mod state;

use dataref_config::HttpConfig;

pub use agent::{APPROVAL_TIMEOUT, MAX_AGENT_BODY};
pub use error::HttpError;
pub use layer::auth::{NewToken, new_token};
pub use layer::limits::{LimitConfig, Limiter, Permit, Refused, SlotKind};
pub use links::SigningKey;
pub use metrics::{MetricsEndpoint, validate_metrics};
pub use paths::{MCP_PATH, READY_PATH};
pub use server::HttpServer;
pub use state::{HttpOptions, Readiness, Replicated};

/// Everything `serve --http` refuses at start, short of binding the port: `auth = false`
/// on an address that is not loopback, nobody with a token and no `[http.jwt]`, a JWT key
/// that cannot be used (an unreadable JWKS file, a short or unset HS256 secret), a bad
/// `signing_key`. [`HttpServer::bind`] runs the same checks, so `dataref doctor`, which
/// calls this, refuses exactly what the server would, with the same message.
pub fn validate(options: &HttpOptions) -> Result<(), HttpError> {
    state::check_listen(options)?;
    let public_url = options
        .http
        .public_url
        .clone()
        .unwrap_or_else(|| format!("http://{}", options.http.listen));
    state::check(options, &public_url, None).map(drop)
}

/// The key download links are signed with: `[http] signing_key` when set (`${NAME}`
/// expanded from the environment), else `replicated`'s shared key; `None` when neither, and
/// then each process makes a random one (links die with a restart and verify only on the
/// process that signed them).
pub fn download_key(
    http: &HttpConfig,
    replicated: &Replicated,
) -> Result<Option<SigningKey>, HttpError> {
    links::configured_key(http.signing_key.as_deref(), &dataref_config::env::process)
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
