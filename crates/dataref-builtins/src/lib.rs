//! The built-in tools, on the framework of `dataref-tool`.
//!
//! - [`builtin_registry`]: `fetch_*` per configured query, `query`, `describe_data`,
//!   `list_artifacts`, `run_sql` (one query over dataRefs in `dataref-sql`'s engine, the
//!   result stored as a new artifact or, small and asked for, returned), `run_python` (inputs resolved through the store, outputs re-read and
//!   written through it, files into the workspace, streams cut head+tail), `render_chart`
//!   and `render_table` (an image or tables for the person as attachments), `export_data`,
//!   the file tools `read_file`, `list_files`, `copy_file` over the caller's workspace, and
//!   `call_tool`, and one [`HttpTool`] per `[http_tools.NAME]` (an internal HTTP API
//!   declared in config); [`builtin_registry_builder`] when a server adds more (an upstream MCP
//!   server's tools) before building. The registry is given `dataref-export`'s CSV writer
//!   for spilled records ([`ExportCsv`]).
//! - [`sandbox_settings`]: `run_python`'s sandbox from the config; [`mime_type_for`]: the
//!   file tools' MIME type by extension (`dataref_protocol::mime_type`).
//!
//! The framework itself (the `Tool` trait, `RunContext`, the registry,
//! `execute_tool_call`, the result cap, spill, `call_tool`'s expansion) is `dataref-tool`,
//! which this crate depends on and does not re-export: import it from there. This crate
//! owns the dependencies on the tools' engines (`dataref-sandbox`, `dataref-sources`,
//! `dataref-sql`, `dataref-chart`, `dataref-export`), so nothing that needs only the framework pulls them in.
//!
//! ```no_run
//! # async fn demo(config: dataref_config::Config, ctx: dataref_tool::RunContext) -> Result<(), dataref_tool::ToolsError> {
//! use dataref_tool::{ToolCall, execute_tool_call};
//! let registry = dataref_builtins::builtin_registry(&config)?;
//! let outcome = execute_tool_call(
//!     &registry,
//!     ToolCall::from_json_text("fetch_sales", r#"{"since":"2025-01-01"}"#),
//!     &ctx,
//! )
//! .await;
//! assert!(!outcome.is_error());
//! # Ok(())
//! # }
//! ```

mod builtin;
mod http_tool;
mod receipt;
pub mod rederive;
pub mod replay;
mod support;

pub use builtin::{
    Loaded, MAX_DOWNLOAD_BYTES, MAX_PAGE_ROWS, RUNS_DIR, RunPythonTool, RunSqlResult, RunSqlTool,
    STREAM_SHOWN_BYTES, ViewArtifactsTool, ViewChartTool, ViewDownloadTool, ViewRowsTool,
    builtin_registry, builtin_registry_builder, builtin_registry_with, load_into, mime_type_for,
    probe_files, sandbox_settings,
};
pub use http_tool::{EnvLookup, HttpTool};
pub use support::ExportCsv;
