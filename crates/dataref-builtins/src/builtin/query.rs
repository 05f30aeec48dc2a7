//! `query(source, sql)`: read-only SQL written by the model, only on sources that allow it.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use dataref_config::{SourceConfig, SourceKind};
use dataref_protocol::{Description, ToolAnnotations, ToolSpec, ToolUi, VIEW_URI, object_schema};
use dataref_sources::{Sources, SqlPolicy};
use dataref_store::Lineage;
use dataref_tool::parse_args;
use dataref_tool::{RunContext, Tool, ToolError, ToolOutput};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::fetch::produce;
use crate::replay::{Replay, one_line, produced_comment, read_sql, result_dates, tick};
use crate::support::output;

/// Arguments of `query`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct QueryArgs {
    /// The source to query.
    source: String,
    /// One read-only SELECT; filter and aggregate here.
    sql: String,
}

pub struct QueryTool {
    spec: ToolSpec,
    sources: BTreeMap<String, SourceConfig>,
    producers: Arc<Sources>,
}

impl QueryTool {
    /// `sources`: the ones that allow SQL; `producers`: shared by every producer tool.
    pub fn new(sources: Vec<SourceConfig>, producers: Arc<Sources>) -> Self {
        let names: Vec<String> = sources.iter().map(|s| s.name.clone()).collect();
        let mut input_schema = object_schema::<QueryArgs>();
        if let Some(o) = input_schema
            .pointer_mut("/properties/source")
            .and_then(Value::as_object_mut)
        {
            o.insert("enum".into(), Value::from(names.clone()));
        }
        let listed: Vec<String> = sources
            .iter()
            .map(|s| match &s.kind {
                SourceKind::Postgres { .. } => format!("`{}` (PostgreSQL)", s.name),
                SourceKind::Mysql { .. } => format!("`{}` (MySQL)", s.name),
                SourceKind::Adbc { .. } => format!("`{}` (ADBC: the database's own SQL)", s.name),
                SourceKind::Files { table, .. } => {
                    format!("`{}` (files: one table, `{table}`)", s.name)
                }
                _ => format!("`{}` (SQLite)", s.name),
            })
            .collect();
        let mut how = Vec::new();
        if sources
            .iter()
            .any(|s| matches!(s.kind, SourceKind::Sqlite { .. }))
        {
            how.push("`SELECT name, sql FROM sqlite_schema`");
        }
        if sources
            .iter()
            .any(|s| matches!(s.kind, SourceKind::Postgres { .. }))
        {
            how.push(
                "`information_schema.tables` (PostgreSQL: runs as your own role, grants decide)",
            );
        }
        if sources
            .iter()
            .any(|s| matches!(s.kind, SourceKind::Mysql { .. }))
        {
            how.push(
                "`information_schema.tables` (MySQL: runs as your own database user, grants decide)",
            );
        }
        if sources
            .iter()
            .any(|s| matches!(s.kind, SourceKind::Files { .. }))
        {
            how.push("files: the one table named above (DataFusion SQL; Hive folders are columns)");
        }
        let description = format!(
            "Run one read-only SQL statement and store the result server-side: you get a \
             dataRef, the schema, row count and a small sample, not the rows. Sources: {}. \
             Results over the row limit are refused. Tables: {}.",
            listed.join(", "),
            how.join("; ")
        );
        let spec = ToolSpec {
            name: "query".into(),
            title: None,
            description,
            input_schema,
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
            sources: sources.into_iter().map(|s| (s.name.clone(), s)).collect(),
            producers,
        }
    }
}

#[async_trait]
impl Tool for QueryTool {
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
        let lineage = Lineage::new("query", Value::Object(args.clone()));
        let a: QueryArgs = parse_args(args)?;
        let Some(source) = self.sources.get(&a.source) else {
            let names: Vec<String> = self.sources.keys().map(|k| format!("`{k}`")).collect();
            return Err(ToolError::respond(
                format!("`query` is not available on source `{}`", a.source),
                Some(format!("sources that allow SQL: {}", names.join(", "))),
            ));
        };
        let d = produce(
            ctx,
            self.producers.clone(),
            source.clone(),
            a.sql,
            Vec::new(),
            BTreeMap::new(),
            SqlPolicy::Generic,
            lineage,
        )
        .await?;
        output(d)
    }
}

impl QueryArgs {
    /// The call as a cell of a session's replay: the same SQL on the same source, read
    /// with pandas into `query_<step>`.
    pub(crate) fn replay(&self, n: usize, parsed: Option<&Value>, raw: &str, r: &mut Replay<'_>) {
        let source = match r.source(n, &self.source) {
            Ok(s) => s,
            Err(note) => return r.md(note),
        };
        let con = r.connection(&source);
        let var = format!("query_{n}");
        r.md(format!(
            "### Step {n}: `query`\n\nSQL the agent wrote, on source {}.",
            tick(&self.source)
        ));
        let mut code = format!(
            "# Step {n}: `query`, the agent's SQL on source `{}`.\n",
            one_line(&self.source)
        );
        code.push_str(&produced_comment(parsed, raw));
        code.push_str(&read_sql(&var, &self.sql, &con, &[], &result_dates(parsed)));
        r.code(code);
        r.produced(parsed, raw, var);
    }
}
