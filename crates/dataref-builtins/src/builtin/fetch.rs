//! `fetch_<name>`: a named, parameterised query from config, run under the caller's
//! identity, stored as an artifact, described.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use dataref_config::{ColumnType, ParamType, QueryConfig, SourceConfig, SourceKind};
use dataref_protocol::{Description, ToolAnnotations, ToolSpec, ToolUi, VIEW_URI, object_schema};
use dataref_sources::{FetchRequest, ParamValue, Sources, SqlPolicy};
use dataref_store::{Lineage, SampleOptions, describe};
use dataref_tool::{RunContext, Tool, ToolError, ToolOutput};
use serde_json::{Map, Value, json};

use crate::support::{blocking, output, source_error};

pub struct FetchTool {
    spec: ToolSpec,
    query: QueryConfig,
    source: SourceConfig,
    sources: Arc<Sources>,
}

impl FetchTool {
    /// `sources` is shared by every producer tool of a registry (it holds the pools).
    pub fn new(query: QueryConfig, source: SourceConfig, sources: Arc<Sources>) -> Self {
        let mut properties = Map::new();
        let mut required = Vec::new();
        for p in &query.params {
            let mut s = match p.ty {
                ParamType::String => json!({"type": "string"}),
                ParamType::Integer => json!({"type": "integer"}),
                ParamType::Number => json!({"type": "number"}),
                ParamType::Boolean => json!({"type": "boolean"}),
                ParamType::Date => json!({"type": "string", "format": "date"}),
                ParamType::Timestamp => json!({"type": "string", "format": "date-time"}),
            };
            let shape = match p.ty {
                ParamType::Date => Some("YYYY-MM-DD"),
                ParamType::Timestamp => Some("RFC 3339"),
                _ => None,
            };
            let description = match (&p.description, shape) {
                (Some(d), Some(shape)) if !d.contains(shape) => Some(format!("{d} ({shape})")),
                (Some(d), _) => Some(d.clone()),
                (None, Some(shape)) => Some(shape.to_owned()),
                (None, None) => None,
            };
            if let Some(o) = s.as_object_mut() {
                if let Some(d) = description {
                    o.insert("description".into(), Value::String(d));
                }
                if let Some(d) = &p.default {
                    o.insert("default".into(), d.clone());
                }
            }
            if p.required {
                required.push(Value::String(p.name.clone()));
            }
            properties.insert(p.name.clone(), s);
        }
        let description = format!(
            "{} The rows stay server-side: you get a dataRef, the schema, row count and a small \
             sample. Pass the dataRef on; never ask for the rows.",
            query.description.trim()
        );
        let spec = ToolSpec {
            name: query.tool_name(),
            title: None,
            description,
            input_schema: json!({
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": false,
            }),
            output_schema: Some(object_schema::<Description>()),
            annotations: ToolAnnotations {
                read_only: true,
                open_world: true,
            },
            // A host with MCP Apps shows the stored table in the view.
            ui: ToolUi {
                resource_uri: Some(VIEW_URI.into()),
                app_only: false,
            },
        };
        Self {
            spec,
            query,
            source,
            sources,
        }
    }
}

#[async_trait]
impl Tool for FetchTool {
    /// A synopsis made for the model: never spilled by default.
    fn result_is_synopsis(&self) -> bool {
        true
    }

    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(
        &self,
        args: Map<String, Value>,
        ctx: &RunContext,
    ) -> Result<ToolOutput, ToolError> {
        let params = dataref_sources::bind_params(&self.query, &args).map_err(source_error)?;
        let lineage = Lineage::new(self.spec.name.clone(), Value::Object(args));
        let d = produce(
            ctx,
            self.sources.clone(),
            self.source.clone(),
            self.query.sql.clone(),
            params,
            self.query.columns.clone(),
            SqlPolicy::Configured,
            lineage,
        )
        .await?;
        output(d)
    }
}

/// Runs a statement on a blocking thread, streaming into a new artifact of the caller's,
/// reporting rows as progress and stopping when the call is cancelled; then describes it.
#[expect(clippy::too_many_arguments, reason = "one statement and where it goes")]
pub(crate) async fn produce(
    ctx: &RunContext,
    sources: Arc<Sources>,
    source: SourceConfig,
    sql: String,
    params: Vec<(String, ParamValue)>,
    declared: BTreeMap<String, ColumnType>,
    policy: SqlPolicy,
    lineage: Lineage,
) -> Result<Description, ToolError> {
    // The source adds its version as it reads.
    let lineage = lineage.with_receipt(crate::receipt::producer(ctx, &source, &sql, &params));
    if matches!(source.kind, SourceKind::Files { .. }) {
        let memory = sources.sql_memory_bytes();
        return super::lake::produce(ctx, &source, sql, params, policy, lineage, memory).await;
    }
    let store = ctx.store.clone();
    let owner = ctx.principal.clone();
    let progress = ctx.progress.clone();
    let cancel = ctx.cancel.clone();
    blocking("fetch", move || {
        let req = FetchRequest {
            source: &source,
            sql: &sql,
            params,
            declared: &declared,
            policy,
        };
        let report = |rows: u64| {
            progress.report(rows as f64, None, Some(format!("{rows} rows fetched")));
        };
        let is_cancelled = || cancel.is_cancelled();
        let fetched = sources
            .fetch(
                &req,
                store.as_ref(),
                &owner,
                lineage,
                &report,
                &is_cancelled,
            )
            .map_err(source_error)?;
        let table = store
            .map_table(&owner, &fetched.meta.data_ref)?
            .head(source.sample_rows)?;
        let mut d = describe(
            &table,
            SampleOptions {
                rows: source.sample_rows,
                max_value_chars: source.max_value_chars,
            },
        );
        d.notes = fetched.notes;
        Ok(d)
    })
    .await
}
