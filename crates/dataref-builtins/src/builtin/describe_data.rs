//! `describe_data(dataRef, columns?, columnOffset?)`: summary statistics of a stored table.

use async_trait::async_trait;
use dataref_protocol::{DataRef, StatsTable, ToolSpec};
use dataref_tool::TypedTool;
use dataref_tool::{RunContext, ToolError, ToolOutput};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::support::{blocking, output, spec_for};

/// Arguments of `describe_data`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DescribeArgs {
    /// The table to describe.
    data_ref: DataRef,
    /// Only these columns (default: all).
    #[serde(default)]
    columns: Option<Vec<String>>,
    /// The previous answer's `nextColumnOffset`, for the next page.
    #[serde(default)]
    column_offset: Option<usize>,
}

pub struct DescribeDataTool {
    spec: ToolSpec,
}

impl DescribeDataTool {
    pub fn new() -> Self {
        Self {
            spec: spec_for::<DescribeArgs, StatsTable>(
                "describe_data",
                "Per-column statistics of a stored table, computed server-side: count, NULLs, \
                 distinct, min/max, mean, quartiles, top values. Use it to check units, \
                 outliers and categories before writing code, instead of reading rows.",
                true,
                false,
            ),
        }
    }
}

#[async_trait]
impl TypedTool for DescribeDataTool {
    /// A synopsis made for the model: never spilled by default.
    fn result_is_synopsis(&self) -> bool {
        true
    }

    type Args = DescribeArgs;

    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, a: DescribeArgs, ctx: &RunContext) -> Result<ToolOutput, ToolError> {
        let store = ctx.store.clone();
        let owner = ctx.principal.clone();
        let max_columns = ctx.limits.describe_max_columns;
        let stats = blocking("describe_data", move || {
            let table = store.map_table(&owner, &a.data_ref)?;
            Ok(dataref_store::describe_data(
                &table,
                a.columns.as_deref(),
                a.column_offset.unwrap_or(0),
                max_columns,
            )?)
        })
        .await?;
        output(StatsTable::from(&stats))
    }
}
