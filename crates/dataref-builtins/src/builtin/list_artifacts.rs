//! `list_artifacts`: the caller's live tables, newest first.

use async_trait::async_trait;
use dataref_protocol::{DataRef, Timestamp, ToolSpec};
use dataref_tool::TypedTool;
use dataref_tool::{RunContext, ToolError, ToolOutput};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::support::{blocking, output, spec_for};

/// Column names listed per artifact, at most: a list of wide tables stays short.
const LISTED_COLUMNS: usize = 20;

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Arguments of `list_artifacts`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListArgs {
    /// At most this many (default: the server's limit, usually 50).
    #[serde(default)]
    limit: Option<usize>,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct ArtifactSummary {
    data_ref: DataRef,
    /// What the table is: the file, the query and its arguments, the output's name.
    name: String,
    rows: u64,
    /// Column names, in order: the first 20 of a wider table.
    columns: Vec<String>,
    /// And this many more columns (`describe_data` pages through them).
    #[serde(default, skip_serializing_if = "is_zero")]
    more_columns: u64,
    bytes: u64,
    /// The tool that made it.
    made_by: String,
    created_at: Timestamp,
    expires_at: Timestamp,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct ListResult {
    artifacts: Vec<ArtifactSummary>,
    /// How many live artifacts you have in all.
    total: u64,
}

pub struct ListArtifactsTool {
    spec: ToolSpec,
}

impl ListArtifactsTool {
    pub fn new() -> Self {
        Self {
            spec: spec_for::<ListArgs, ListResult>(
                "list_artifacts",
                "Your stored tables, newest first: dataRef, rows, columns, size, maker, expiry. \
                 Use it to find an earlier dataRef instead of fetching again.",
                true,
                false,
            ),
        }
    }
}

#[async_trait]
impl TypedTool for ListArtifactsTool {
    type Args = ListArgs;

    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, a: ListArgs, ctx: &RunContext) -> Result<ToolOutput, ToolError> {
        let max = ctx.limits.list_artifacts_max;
        let limit = a.limit.unwrap_or(max).min(max);
        let store = ctx.store.clone();
        let owner = ctx.principal.clone();
        let (metas, total) =
            blocking("list_artifacts", move || Ok(store.list(&owner, limit)?)).await?;
        let artifacts = metas
            .into_iter()
            .map(|m| ArtifactSummary {
                name: m.lineage.name(),
                data_ref: m.data_ref,
                rows: m.rows,
                columns: m
                    .schema
                    .fields()
                    .iter()
                    .take(LISTED_COLUMNS)
                    .map(|f| f.name().clone())
                    .collect(),
                more_columns: m.schema.fields().len().saturating_sub(LISTED_COLUMNS) as u64,
                bytes: m.bytes,
                made_by: m.lineage.tool,
                created_at: m.created_at,
                expires_at: m.expires_at,
            })
            .collect();
        output(ListResult { artifacts, total })
    }
}
