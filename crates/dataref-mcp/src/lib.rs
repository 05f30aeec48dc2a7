//! The MCP server of dataref, on [`rmcp`].
//!
//! - [`DatarefServer`]: built from the [`ToolRegistry`](dataref_tool::ToolRegistry) and
//!   either a base [`RunContext`](dataref_tool::RunContext) (one fixed principal: stdio,
//!   in-process) or a [`SharedContext`](dataref_tool::SharedContext) (store, limits, clock, data dir: each request runs
//!   as the [`Caller`] the HTTP layer authenticated, in that principal's workspace). It
//!   serves:
//!   - `tools/list`: every registered tool with its input and output schemas, title and
//!     hints (`readOnlyHint`, `openWorldHint`, `destructiveHint: false` when read-only);
//!   - `tools/call`: through [`execute_tool_call`](dataref_tool::execute_tool_call) under
//!     the request id as the call id, so every failure is an `isError` result (its
//!     [`OutcomeKind`](dataref_tool::OutcomeKind) says which) the model can act on, never
//!     a protocol error.
//!     The request's cancellation reaches the tool (`notifications/cancelled` stops a
//!     fetch and removes its partial artifact), and when the request carries a
//!     `progressToken`, the tool's progress goes out as `notifications/progress`
//!     (throttled to one per 100 ms, the last always sent);
//!   - resources: the principal's live tables as `dataref://artifacts/{dataRef}`, read as
//!     a bounded CSV preview. Unknown, expired and someone else's references all answer
//!     "resource not found" (`-32002`). The files of the session's workspace (from the
//!     [`RunContext`](dataref_tool::RunContext)) as `dataref://files/{path}`, the path
//!     percent-encoded: listed (at most 200, newest modified first, after the tables),
//!     read whole up to 20 MiB with the MIME type of their extension, as text or a base64
//!     blob. Every path is resolved and opened beneath the workspace root, so `..`,
//!     absolute paths and links or hard links leading outside answer "resource not found"
//!     naming only the requested relative path; another principal's files cannot be
//!     named at all.
//!   - prompts (`analyse_table`, `compare_periods`, `analyse_<query>` per named query) that
//!     set the model on the by-reference workflow, never embedding rows;
//!   - `completion/complete` for prompt arguments and resource templates, from declared
//!     values and what the caller owns (dataRefs, column names, workspace paths) only;
//!   - `logging/setLevel` per session, and log messages about the caller's own call (its
//!     steps, a spilled result, a failure) on that request;
//!   - `resources/subscribe` and `notifications/resources/{updated,list_changed}` (and
//!     2026-07-28 `subscriptions/listen`): each principal's tables and files are watched
//!     while one of its sessions listens, and changes go to that principal's sessions only.
//! - [`INSTRUCTIONS`]: what the client is told at `initialize`: never ask for rows, work
//!   with references.
//! - [`upstream`]: the MCP client side. Other MCP servers (`[[upstream]]`: a child process
//!   on stdio, or Streamable HTTP) are connected at start and each of their tools becomes
//!   a [`Tool`](dataref_tool::Tool) named `prefix + name`, registered next to the
//!   built-in ones; calls are forwarded with cancellation and a timeout, results mapped to
//!   text, structured content and attachments.
//! - [`StreamableHttp`]: rmcp's Streamable HTTP service (both protocol revisions) for a
//!   per-request server, with every POST body checked; [`Caller`] and [`DownloadLinks`]
//!   are what the HTTP side hands in. Serving it (listener, auth, limits, Host/Origin,
//!   downloads) is the `dataref-http` crate, which depends on this one, never the reverse:
//!   nothing here knows hyper, tokens or routes.
//! - Every message is answered: on stdio (and [`DatarefServer::serve_io`]) each line, over
//!   HTTP each POST body, is checked before rmcp sees it, and one that is not JSON
//!   (`-32700`: too deep, invalid UTF-8, a lone surrogate) or not a JSON-RPC message
//!   (`-32600`) gets a JSON-RPC error with the request's `id` when it can be read (else
//!   `null`); over HTTP with status 400.
//! - Transports: [`DatarefServer::serve_stdio`], [`DatarefServer::serve_io`],
//!   [`DatarefServer::serve_transport`], and [`connect_in_process`], which runs the server
//!   on a [`tokio::io::duplex`] pipe and returns a connected rmcp client, so a program (the
//!   `dataref demo`, tests) can play the MCP host without a subprocess. [`rmcp`] is
//!   re-exported for the types such a client needs.
//!
//! Nothing here writes to stdout: on stdio it is the protocol channel. Logs go through
//! `tracing`; the binary sends them to stderr.
//!
//! ```no_run
//! use std::sync::Arc;
//! use dataref_mcp::{DatarefServer, connect_in_process, rmcp};
//! use rmcp::model::CallToolRequestParams;
//!
//! # async fn demo(
//! #     registry: Arc<dataref_tool::ToolRegistry>,
//! #     ctx: dataref_tool::RunContext,
//! # ) -> Result<(), Box<dyn std::error::Error>> {
//! let server = DatarefServer::new(registry, ctx);
//!
//! // As a stdio server (`dataref serve`):
//! // server.serve_stdio().await?;
//!
//! // Or on any byte stream, e.g. one end of an in-memory pipe, with an rmcp client
//! // (`().serve(client_end)`) on the other:
//! // let (server_end, client_end) = tokio::io::duplex(64 * 1024);
//! // tokio::spawn(server.serve_io(server_end));
//!
//! // Or let `connect_in_process` do the pipe and the client's handshake:
//! let session = connect_in_process(server, ()).await?;
//! let args = serde_json::json!({"since": "2025-01-01"});
//! let result = session
//!     .client
//!     .call_tool(CallToolRequestParams::new("fetch_sales").with_arguments(
//!         args.as_object().cloned().unwrap_or_default(),
//!     ))
//!     .await?;
//! let data_ref = &result.structured_content.unwrap_or_default()["dataRef"];
//! session.client.cancel().await?;
//! session.server.await??;
//! # let _ = data_ref;
//! # Ok(())
//! # }
//! ```

mod completion;
mod host;
mod jsonrpc;
mod notify;
mod progress;
mod prompts;
mod resources;
mod serve;
mod server;
mod streamable;
mod tools;
pub mod upstream;
mod view;

pub use host::{Caller, DownloadLinks};
pub use rmcp;
pub use serve::{InProcessSession, McpServeError, connect_in_process};
pub use server::{DatarefServer, INSTRUCTIONS};
pub use streamable::{SESSION_HEADER, StreamableHttp};
pub use view::{UI_EXTENSION, VIEW_HTML, VIEW_MIME, VIEW_URI};
