//! The built-in tools: producers (`fetch_*`, `query`), store tools (`describe_data`,
//! `list_artifacts`) and file tools over the caller's workspace (`read_file`, `list_files`,
//! `copy_file`).

mod describe_data;
mod fetch;
mod files;
mod list_artifacts;
mod query;

use std::sync::Arc;

use dataref_config::Config;

use crate::{ToolRegistry, ToolsError};

pub use describe_data::DescribeDataTool;
pub use fetch::FetchTool;
pub use files::{CopyFileTool, ListFilesTool, ReadFileTool, mime_type_for};
pub use list_artifacts::ListArtifactsTool;
pub use query::QueryTool;

/// Every built-in tool for `config`: one `fetch_<name>` per configured query, `query` when
/// a source allows SQL, `describe_data`, `list_artifacts`, `read_file`, `list_files` and
/// `copy_file`.
pub fn builtin_registry(config: &Config) -> Result<ToolRegistry, ToolsError> {
    let mut b = ToolRegistry::builder();
    for q in config.queries.values() {
        // Resolution guarantees the source exists.
        if let Some(source) = config.sources.get(&q.source) {
            b.register(Arc::new(FetchTool::new(q.clone(), source.clone())));
        }
    }
    let sql_sources: Vec<_> = config
        .sources
        .values()
        .filter(|s| s.allow_sql)
        .cloned()
        .collect();
    if !sql_sources.is_empty() {
        b.register(Arc::new(QueryTool::new(sql_sources)));
    }
    b.register(Arc::new(DescribeDataTool::new()));
    b.register(Arc::new(ListArtifactsTool::new()));
    b.register(Arc::new(ReadFileTool::new()));
    b.register(Arc::new(ListFilesTool::new()));
    b.register(Arc::new(CopyFileTool::new()));
    b.build()
}
