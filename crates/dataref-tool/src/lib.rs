//! The tool framework every transport goes through: the MCP server and the agent loop run
//! tools through it, and it knows no tool in particular.
//!
//! - [`Tool`]: one required method pair, `spec` and `call` (and [`TypedTool`] for a tool
//!   whose arguments arrive as its own type). Tools never see transport details; what they
//!   need arrives in the [`RunContext`] (principal, store, workspace, limits, progress,
//!   cancellation, clock), which is never part of the model's schema.
//!   [`Tool::is_mutating`] comes from the read-only annotation of the tool's spec.
//! - [`ToolRegistry`]: built once from a [`ToolRegistryBuilder`], then immutable; it holds
//!   each tool's compiled input-schema validator and the listed (portable) form of its
//!   schemas.
//! - [`execute_tool_call`]: owns every branch of a call once (unknown tool with "did you
//!   mean", broken JSON, schema violation, `call_tool` expanded from its argument file,
//!   tool error, timeout, cancellation, panic, spill, the result cap), each ending in one
//!   [`OutcomeKind`], so a caller never reads the text to decide. A [`ToolCall`] carries
//!   the caller's call id (an MCP request id, a model's `tool_call` id), and every call runs
//!   in a `tool_call` tracing span with the principal, the tool and that id.
//! - `spill`: results over the threshold written to `.spill/` in the caller's workspace,
//!   with the synopsis the model gets instead ([`SpillSynopsis`]) and the retention sweep;
//!   [`records`] makes flat JSON records a table. Writing CSV belongs to `dataref-export`,
//!   which this crate must not import: the host hands a [`RecordsCsv`] to
//!   [`ToolRegistryBuilder::records_csv`].
//!
//! The built-in tools (`fetch_*`, `query`, `run_python`, `render_*`, `export_data`, the
//! file tools) live in `dataref-builtins`, above this crate. This crate must not import
//! `dataref-sandbox`, `dataref-sources`, `dataref-chart` or `dataref-export` (nor rmcp):
//! the agent runtime depends on the framework without any tool's engine.
//!
//! ```no_run
//! # async fn demo(registry: dataref_tool::ToolRegistry, ctx: dataref_tool::RunContext) {
//! use dataref_tool::{OutcomeKind, ToolCall, execute_tool_call};
//! let outcome = execute_tool_call(
//!     &registry,
//!     ToolCall::from_json_text("fetch_sales", r#"{"since":"2025-01-01"}"#).with_id("call_1"),
//!     &ctx,
//! )
//! .await;
//! assert_eq!(outcome.call_id, "call_1");
//! match outcome.kind {
//!     OutcomeKind::Ok | OutcomeKind::Spilled | OutcomeKind::TooLarge => {}
//!     OutcomeKind::UnknownTool
//!     | OutcomeKind::InvalidArguments
//!     | OutcomeKind::ToolFailed
//!     | OutcomeKind::ServerFault
//!     | OutcomeKind::Panicked
//!     | OutcomeKind::TimedOut
//!     | OutcomeKind::Cancelled => assert!(outcome.is_error()),
//! }
//! # }
//! ```

mod cap;
mod context;
mod delegate;
mod error;
mod execute;
mod json_indent;
mod listed;
pub mod records;
mod registry;
mod spill;
mod tool;

pub use context::{NoProgress, ProgressSink, RunContext, SharedContext, WorkspaceMirrors};
pub use delegate::{CALL_TOOL, CallToolArgs, CallToolTool, MAX_ARGS_FILE_BYTES};
pub use error::{ToolError, ToolsError};
pub use execute::{
    CallArguments, CallOutcome, OutcomeKind, ToolCall, execute_tool_call, expand_call, unknown_tool,
};
pub use registry::{ToolRegistry, ToolRegistryBuilder};
pub use spill::{
    CsvWritten, RecordsCsv, SPILL_DIR, SpillSynopsis, SpilledTable, spawn_all_spill_sweeper,
    spawn_spill_sweeper, sweep_all_spill, sweep_spill,
};
pub use tool::{Attachment, Tool, ToolOutput, TypedTool, parse_args, read_capped};
