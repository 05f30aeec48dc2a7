//! `describe_data(dataRef, columns?, columnOffset?)`: summary statistics of a stored table.

use async_trait::async_trait;
use dataref_protocol::{DataRef, StatsTable, ToolSpec};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::tool::{TypedTool, blocking, output, spec_for};
use crate::{RunContext, ToolError, ToolOutput};

/// Arguments of `describe_data`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct DescribeArgs {
    /// The table to describe.
    data_ref: DataRef,
    /// Only these columns (default: all, a page at a time).
    #[serde(default)]
    columns: Option<Vec<String>>,
    /// Skip this many columns (from `nextColumnOffset` of the previous answer).
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
                "Summary statistics of a stored table, computed server-side: per column the \
                 count, NULLs, distinct values, min/max, mean/std/quartiles for numbers, and the \
                 most frequent values for text. Use it to check units, outliers, empty columns \
                 and categories before writing code. Wide tables come a page of columns at a \
                 time (`nextColumnOffset`).",
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
            let table = store.open_table(&owner, &a.data_ref)?;
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
