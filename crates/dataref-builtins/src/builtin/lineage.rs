//! `lineage(dataRef)`: a stored table's receipt, for the model when it asks — never part of
//! any other result.

use async_trait::async_trait;
use dataref_protocol::{DataRef, Receipt, ToolSpec, truncate_chars};
use dataref_tool::TypedTool;
use dataref_tool::{RunContext, ToolError, ToolOutput};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::support::{blocking, output, spec_for};

/// Characters of the SQL or code the model is given back, at most (it wrote most of it).
pub(crate) const SHOWN_CHARS: usize = 2_000;

/// Arguments of `lineage`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LineageArgs {
    /// The table.
    data_ref: DataRef,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct LineageResult {
    data_ref: DataRef,
    /// The tool that made it.
    made_by: String,
    /// The stored content's hash.
    #[serde(skip_serializing_if = "String::is_empty")]
    checksum: String,
    /// Empty for a table stored before receipts were kept (`note` says so).
    #[serde(skip_serializing_if = "is_empty")]
    receipt: Receipt,
    /// What is missing or cut, and where the whole is.
    #[serde(skip_serializing_if = "String::is_empty")]
    note: String,
}

fn is_empty(r: &Receipt) -> bool {
    *r == Receipt::default()
}

pub struct LineageTool {
    spec: ToolSpec,
}

impl LineageTool {
    pub fn new() -> Self {
        Self {
            spec: spec_for::<LineageArgs, LineageResult>(
                "lineage",
                "How a stored table was made: source and version, SQL and parameters, \
                 parents, code, when, engines, checksum. Only when provenance is asked for.",
                true,
                false,
            ),
        }
    }
}

impl Default for LineageTool {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl TypedTool for LineageTool {
    /// A synopsis made for the model: never spilled by default.
    fn result_is_synopsis(&self) -> bool {
        true
    }

    type Args = LineageArgs;

    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, a: LineageArgs, ctx: &RunContext) -> Result<ToolOutput, ToolError> {
        let store = ctx.store.clone();
        let owner = ctx.principal.clone();
        // The owner check: another principal's table answers as an unknown one.
        let meta = blocking("lineage", move || Ok(store.meta(&owner, &a.data_ref)?)).await?;
        let mut cut = Vec::new();
        let receipt = meta.lineage.receipt.map(|mut r| {
            for (what, text) in [("SQL", &mut r.sql), ("code", &mut r.code)] {
                if let Some(t) = text
                    && t.chars().count() > SHOWN_CHARS
                {
                    *t = truncate_chars(t, SHOWN_CHARS);
                    cut.push(what);
                }
            }
            r
        });
        let note = if receipt.is_none() {
            "no receipt: the table was stored before dataref kept them".to_owned()
        } else if !cut.is_empty() {
            format!(
                "the {} is cut at {SHOWN_CHARS} characters; the whole is in the page's \
                 provenance panel",
                cut.join(" and ")
            )
        } else {
            String::new()
        };
        output(LineageResult {
            data_ref: meta.data_ref,
            made_by: meta.lineage.tool,
            checksum: meta.checksum.map(|c| c.to_string()).unwrap_or_default(),
            receipt: receipt.unwrap_or_default(),
            note,
        })
    }
}
