//! The built-in tools: producers (`fetch_*`, `query`), store tools (`describe_data`,
//! `list_artifacts`) and file tools over the caller's workspace (`read_file`, `list_files`,
//! `copy_file`).

mod describe_data;
mod export_data;
mod fetch;
mod files;
mod lake;
mod lineage;
mod list_artifacts;
mod load_file;
mod query;
mod render_chart;
mod render_table;
mod run_python;
mod run_sql;
mod view;

use std::sync::Arc;

use dataref_config::Config;
use dataref_sandbox::pool::PythonSandbox;
use dataref_sources::Sources;
use dataref_tool::{CallToolTool, ToolRegistry, ToolRegistryBuilder, ToolsError};

use crate::support::ExportCsv;

pub use describe_data::DescribeDataTool;
pub(crate) use export_data::ExportArgs;
pub use fetch::FetchTool;
pub use files::{CopyFileTool, ListFilesTool, ReadFileTool, mime_type_for};
pub use lake::probe_files;
pub use lineage::LineageTool;
pub use list_artifacts::ListArtifactsTool;
pub use load_file::{LoadFileTool, Loaded, load_into};
pub(crate) use query::QueryArgs;
pub use query::QueryTool;
pub(crate) use render_chart::ChartArgs;
pub use render_chart::RenderChartTool;
pub use render_table::RenderTableTool;
pub(crate) use render_table::TableArgs;
pub(crate) use run_python::RunPythonArgs;
pub use run_python::{RUNS_DIR, RunPythonTool, STREAM_SHOWN_BYTES, sandbox_settings};
pub use run_sql::{RunSqlResult, RunSqlTool};
pub use view::{
    MAX_DOWNLOAD_BYTES, MAX_PAGE_ROWS, ViewArtifactsTool, ViewChartTool, ViewDownloadTool,
    ViewRowsTool,
};

/// Every built-in tool for `config`: one `fetch_<name>` per configured query, `query` when
/// a source allows SQL, `describe_data`, `list_artifacts`, `lineage`, `run_sql` (unless `[sql] enabled = false`), `run_python` (unless
/// `[python] enabled = false`), `load_file`, `read_file`, `list_files`, `copy_file`, and one tool per
/// `[http_tools.NAME]`. `run_python`
/// gets a sandbox of its own that starts nothing until its first call.
pub fn builtin_registry(config: &Config) -> Result<ToolRegistry, ToolsError> {
    let python = config
        .python
        .enabled
        .then(|| Arc::new(PythonSandbox::new(sandbox_settings(config))));
    builtin_registry_with(config, python)
}

/// [`builtin_registry`] with the caller's sandbox for `run_python` (a server keeps it to
/// fill the warm pool at start-up); `None` leaves `run_python` out.
pub fn builtin_registry_with(
    config: &Config,
    python: Option<Arc<PythonSandbox>>,
) -> Result<ToolRegistry, ToolsError> {
    builtin_registry_builder(config, python).build()
}

/// The built-in tools, registered but not built, so a server can add more (an upstream MCP
/// server's tools) before [`ToolRegistryBuilder::build`] checks the names.
pub fn builtin_registry_builder(
    config: &Config,
    python: Option<Arc<PythonSandbox>>,
) -> ToolRegistryBuilder {
    let mut b = ToolRegistry::builder();
    // One pool per PostgreSQL source for the registry's lifetime; none connects yet.
    let producers = Arc::new(Sources::new(config));
    for q in config.queries.values() {
        // Resolution guarantees the source exists.
        if let Some(source) = config.sources.get(&q.source) {
            b.register(Arc::new(FetchTool::new(
                q.clone(),
                source.clone(),
                producers.clone(),
            )));
        }
    }
    let sql_sources: Vec<_> = config
        .sources
        .values()
        .filter(|s| s.allow_sql)
        .cloned()
        .collect();
    if !sql_sources.is_empty() {
        b.register(Arc::new(QueryTool::new(sql_sources, producers)));
    }
    b.register(Arc::new(DescribeDataTool::new()));
    b.register(Arc::new(ListArtifactsTool::new()));
    b.register(Arc::new(LineageTool::new()));
    b.register(Arc::new(RenderChartTool::new()));
    b.register(Arc::new(RenderTableTool::new()));
    if config.sql.enabled {
        b.register(Arc::new(RunSqlTool::new(config.sql.clone())));
    }
    if let Some(sandbox) = python {
        b.register(Arc::new(RunPythonTool::new(sandbox, config.python.clone())));
    }
    b.register(Arc::new(LoadFileTool::new()));
    b.register(Arc::new(ReadFileTool::new()));
    b.register(Arc::new(ListFilesTool::new()));
    b.register(Arc::new(CopyFileTool::new()));
    b.register(Arc::new(export_data::ExportDataTool::new()));
    b.register(Arc::new(CallToolTool::new()));
    // The view's own (app-only): listed only to MCP Apps hosts, never to a model.
    b.register(Arc::new(ViewRowsTool::new(config.sql.clone())));
    b.register(Arc::new(ViewChartTool::new()));
    b.register(Arc::new(ViewArtifactsTool::new()));
    b.register(Arc::new(ViewDownloadTool::new(config.sql.clone())));
    b.register(Arc::new(ListFilesTool::for_view()));
    for http in config.http_tools.values() {
        b.register(Arc::new(crate::http_tool::HttpTool::new(http.clone())));
    }
    b.spill(config.spill.clone());
    b.records_csv(Arc::new(ExportCsv));
    b
}
