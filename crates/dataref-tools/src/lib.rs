//! The tool framework every transport goes through, and the built-in tools.
//!
//! - [`Tool`]: one required method pair, `spec` and `call`. Tools never see transport
//!   details; what they need arrives in the [`RunContext`] (principal, store, limits,
//!   progress, cancellation, clock), which is never part of the model's schema. A
//!   [`SharedContext`] (store, limits, clock, data dir) is the one factory of them, for
//!   every host (stdio, HTTP, the demo, benchmarks).
//! - [`ToolRegistry`]: built once from a [`ToolRegistryBuilder`], then immutable; it holds
//!   each tool's compiled input-schema validator.
//! - [`execute_tool_call`]: owns every failure branch once (unknown tool, broken JSON,
//!   schema violation, tool error, timeout, cancellation, panic) and the cap on what goes
//!   back to the model. The MCP server and the agent loop both call it.
//! - [`builtin_registry`]: `fetch_*` per configured query, `query`, `describe_data`,
//!   `list_artifacts`, `render_chart` and `render_table` (an image or tables for the
//!   person as [`Attachment`]s), and the file tools `read_file`, `list_files`, `copy_file` over the
//!   caller's workspace. [`mime_type_for`] is their extension-to-MIME table.
//!
//! ```no_run
//! # async fn demo(registry: dataref_tools::ToolRegistry, ctx: dataref_tools::RunContext) {
//! use dataref_tools::{ToolCall, execute_tool_call};
//! let outcome = execute_tool_call(
//!     &registry,
//!     ToolCall::from_json_text("fetch_sales", r#"{"since":"2025-01-01"}"#),
//!     &ctx,
//! )
//! .await;
//! assert!(!outcome.is_error);
//! # }
//! ```

mod builtin;
mod cap;
mod context;
mod delegate;
mod error;
mod execute;
mod json_indent;
mod listed;
mod records;
mod registry;
mod spill;
mod tool;

pub use builtin::{
    RUNS_DIR, RunPythonTool, STREAM_SHOWN_BYTES, builtin_registry, builtin_registry_builder,
    builtin_registry_with, mime_type_for, sandbox_settings,
};
pub use context::{NoProgress, ProgressSink, RunContext, SharedContext};
pub use delegate::{CALL_TOOL, CallToolTool, MAX_ARGS_FILE_BYTES};
pub use error::{ToolError, ToolsError};
pub use execute::{CallArguments, CallOutcome, ToolCall, execute_tool_call};
pub use registry::{ToolRegistry, ToolRegistryBuilder};
pub use spill::{
    SPILL_DIR, SpillSynopsis, SpilledTable, spawn_all_spill_sweeper, spawn_spill_sweeper,
    sweep_all_spill, sweep_spill,
};
pub use tool::{Attachment, Tool, ToolOutput};
