//! `render_table(dataRef, columns?, sort?, descending?, limit?)`: a table of a stored table's
//! rows for the person (HTML written to the workspace and linked; inline Markdown and HTML
//! only with `[tables] inline`); the model gets the path and how many rows were shown.

use async_trait::async_trait;
use dataref_export::{SortBy, sort_order};
use dataref_protocol::{DataRef, ToolSpec};
use dataref_store::{Table, cell_to_json, did_you_mean};
use dataref_tool::TypedTool;
use dataref_tool::{Attachment, RunContext, ToolError, ToolOutput};
use dataref_workspace::Overwrite;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::files::{file_name, file_stem, file_uri};
use crate::replay::{Replay, py_list, py_str, tick};
use crate::support::{blocking, output, spec_for};
use std::fmt::Write as _;

/// Where HTML tables are written in the caller's workspace.
pub const TABLES_DIR: &str = "tables";
/// The most rows one table shows.
pub const MAX_TABLE_ROWS: u32 = 2000;
const DEFAULT_ROWS: u32 = 100;
/// Columns shown when none are named; wider tables say what was left out.
const DEFAULT_MAX_COLUMNS: usize = 40;
/// Longer cells end in `…`.
const MAX_CELL_CHARS: usize = 200;

/// Arguments of `render_table`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TableArgs {
    /// The table to show.
    data_ref: DataRef,
    /// These columns, in order (default: the first 40).
    #[serde(default)]
    columns: Option<Vec<String>>,
    /// Order rows by this column (default: stored order).
    #[serde(default)]
    sort: Option<String>,
    /// With `sort`: largest first.
    #[serde(default)]
    descending: Option<bool>,
    /// Rows to show (default 100).
    #[serde(default)]
    #[schemars(range(min = 1, max = 2000))]
    limit: Option<u32>,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct TableResult {
    /// The HTML table, relative to your workspace (linked for the person).
    path: String,
    /// Rows shown to the person.
    rows_shown: u64,
    /// Rows in the table.
    rows_total: u64,
    /// Columns shown.
    columns: u64,
}

pub struct RenderTableTool {
    spec: ToolSpec,
}

impl RenderTableTool {
    pub fn new() -> Self {
        Self {
            spec: spec_for::<TableArgs, TableResult>(
                "render_table",
                "Show rows of a stored table to the person (HTML under `tables/`, linked). The \
                 rows reach the person, not you: you get the path and how many were shown. Use \
                 it when the person wants to see the data; for a summary compute it first (SQL \
                 or `run_python`).",
                false,
                false,
            )
            .with_view(dataref_protocol::VIEW_URI),
        }
    }
}

#[async_trait]
impl TypedTool for RenderTableTool {
    /// A synopsis made for the model: never spilled by default.
    fn result_is_synopsis(&self) -> bool {
        true
    }

    type Args = TableArgs;

    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, a: TableArgs, ctx: &RunContext) -> Result<ToolOutput, ToolError> {
        let store = ctx.store.clone();
        let owner = ctx.principal.clone();
        let workspace = ctx.workspace.clone();
        let inline = ctx.limits.inline_table;
        let key = serde_json::to_string(&a).unwrap_or_default();
        let (result, markdown, html) = blocking("render_table", move || {
            let table = store.open_table(&owner, &a.data_ref)?;
            let limit = a.limit();
            let shown = Shown::select(
                &table,
                a.columns.as_deref(),
                a.sort.as_deref(),
                a.descending.unwrap_or(false),
                limit,
            )?;
            let markdown = shown.markdown(&table);
            let html = shown.html(&table);
            let title = format!("table {}", a.data_ref);
            let path = workspace.write_atomic(
                &format!("{TABLES_DIR}/{}.html", file_stem(&title, &key)),
                html.as_bytes(),
                Overwrite::Replace,
            )?;
            let result = TableResult {
                path: path.as_str().to_owned(),
                rows_shown: shown.rows.len() as u64,
                rows_total: table.meta.rows,
                columns: shown.columns.len() as u64,
            };
            Ok((result, markdown, html))
        })
        .await?;
        let uri = file_uri(&result.path);
        let link = Attachment::ResourceLink {
            uri: uri.clone(),
            name: file_name(&result.path),
            mime_type: Some("text/html".into()),
            description: None,
        };
        let mut out = output(&result)?;
        out.attachments = vec![link];
        if inline {
            // Only when the operator asked for it (`[tables] inline`): the rows in blocks
            // marked for the person, which some hosts still pass to the model.
            out.attachments.extend([
                Attachment::Markdown { text: markdown },
                Attachment::Document {
                    uri,
                    mime_type: "text/html".into(),
                    text: html,
                },
            ]);
        }
        Ok(out)
    }
}

/// Which columns and rows are shown: column indices, and (batch, row) pairs in order.
struct Shown {
    columns: Vec<usize>,
    rows: Vec<(usize, usize)>,
    /// Columns left out because none were named and the table is wide.
    hidden_columns: usize,
}

fn column_index(table: &Table, name: &str) -> Result<usize, ToolError> {
    table.meta.schema.index_of(name).map_err(|_| {
        let available: Vec<String> = table
            .meta
            .schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        ToolError::respond(
            format!("no column `{name}`"),
            Some(did_you_mean(name, &available)),
        )
    })
}

impl Shown {
    fn select(
        table: &Table,
        columns: Option<&[String]>,
        sort: Option<&str>,
        descending: bool,
        limit: usize,
    ) -> Result<Self, ToolError> {
        let width = table.meta.schema.fields().len();
        let (columns, hidden_columns) = match columns {
            Some(names) if !names.is_empty() => (
                names
                    .iter()
                    .map(|n| column_index(table, n))
                    .collect::<Result<Vec<_>, _>>()?,
                0,
            ),
            _ => (
                (0..width.min(DEFAULT_MAX_COLUMNS)).collect(),
                width.saturating_sub(DEFAULT_MAX_COLUMNS),
            ),
        };
        let rows = match sort {
            None => table
                .batches
                .iter()
                .enumerate()
                .flat_map(|(b, batch)| (0..batch.num_rows()).map(move |r| (b, r)))
                .take(limit)
                .collect(),
            Some(name) => {
                let c = column_index(table, name)?;
                let sort = SortBy::new(name, descending);
                let order = sort_order(&table.batches, c, &sort, Some(limit))
                    .map_err(super::export_data::export_error)?;
                // Rows are numbered across batches: back to (batch, row).
                let starts: Vec<usize> = table
                    .batches
                    .iter()
                    .scan(0, |at, b| {
                        let start = *at;
                        *at += b.num_rows();
                        Some(start)
                    })
                    .collect();
                order
                    .into_iter()
                    .map(|i| {
                        let i = i as usize;
                        let b = starts.partition_point(|&s| s <= i) - 1;
                        (b, i - starts[b])
                    })
                    .collect()
            }
        };
        Ok(Self {
            columns,
            rows,
            hidden_columns,
        })
    }

    fn names(&self, table: &Table) -> Vec<String> {
        self.columns
            .iter()
            .map(|c| table.meta.schema.field(*c).name().clone())
            .collect()
    }

    fn numeric(&self, table: &Table) -> Vec<bool> {
        self.columns
            .iter()
            .map(|c| table.meta.schema.field(*c).data_type().is_numeric())
            .collect()
    }

    /// Each shown row's cells as display text (empty for NULL).
    fn cells<'t>(&'t self, table: &'t Table) -> impl Iterator<Item = Vec<String>> + 't {
        self.rows.iter().map(move |(b, r)| {
            let batch = &table.batches[*b];
            self.columns
                .iter()
                .map(|c| display(&cell_to_json(batch.column(*c), *r, Some(MAX_CELL_CHARS)).0))
                .collect()
        })
    }

    fn caption(&self, table: &Table) -> String {
        let mut s = format!(
            "{} of {} rows",
            super::files::thousands(self.rows.len() as u64),
            super::files::thousands(table.meta.rows)
        );
        if self.hidden_columns > 0 {
            s.push_str(&format!("; {} more columns not shown", self.hidden_columns));
        }
        s
    }

    fn markdown(&self, table: &Table) -> String {
        let names = self.names(table);
        let numeric = self.numeric(table);
        let mut out = String::new();
        let row = |cells: &[String], out: &mut String| {
            out.push('|');
            for c in cells {
                out.push(' ');
                out.push_str(&md_escape(c));
                out.push_str(" |");
            }
            out.push('\n');
        };
        row(&names, &mut out);
        out.push('|');
        for n in &numeric {
            out.push_str(if *n { " ---: |" } else { " --- |" });
        }
        out.push('\n');
        for cells in self.cells(table) {
            row(&cells, &mut out);
        }
        out.push_str(&format!("\n_{}_\n", self.caption(table)));
        out
    }

    fn html(&self, table: &Table) -> String {
        let names = self.names(table);
        let numeric = self.numeric(table);
        let mut out = String::from("<table>\n<caption>");
        out.push_str(&html_escape(&self.caption(table)));
        out.push_str("</caption>\n<thead><tr>");
        for (n, num) in names.iter().zip(&numeric) {
            out.push_str(if *num {
                "<th style=\"text-align:right\">"
            } else {
                "<th>"
            });
            out.push_str(&html_escape(n));
            out.push_str("</th>");
        }
        out.push_str("</tr></thead>\n<tbody>\n");
        for cells in self.cells(table) {
            out.push_str("<tr>");
            for (c, num) in cells.iter().zip(&numeric) {
                out.push_str(if *num {
                    "<td style=\"text-align:right\">"
                } else {
                    "<td>"
                });
                out.push_str(&html_escape(c));
                out.push_str("</td>");
            }
            out.push_str("</tr>\n");
        }
        out.push_str("</tbody>\n</table>\n");
        out
    }
}

/// A cell as a person reads it: integers with thousands separators, text as is.
fn display(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => signed_thousands(i),
            (None, Some(u)) => super::files::thousands(u),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

fn signed_thousands(i: i64) -> String {
    let digits = super::files::thousands(i.unsigned_abs());
    if i < 0 { format!("-{digits}") } else { digits }
}

fn md_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '|' | '\\' | '*' | '_' | '`' | '<' | '>' | '[' | ']' => {
                out.push('\\');
                out.push(c);
            }
            '\n' | '\r' => out.push(' '),
            _ => out.push(c),
        }
    }
    out
}

fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

impl TableArgs {
    /// Rows shown: `limit`, or the default, within the bounds.
    fn limit(&self) -> usize {
        self.limit.unwrap_or(DEFAULT_ROWS).clamp(1, MAX_TABLE_ROWS) as usize
    }

    /// The call as a cell of a session's replay: the rows the person saw, from the
    /// table's variable.
    pub(crate) fn replay(&self, n: usize, rp: &mut Replay<'_>) {
        let r = self.data_ref.as_str();
        let columns = &self.columns;
        let sort = self.sort.as_deref();
        let descending = self.descending.unwrap_or(false);
        let limit = self.limit();
        let mut said = format!(
            "**Shown to the person** (step {n}): a table of the first {limit} rows of {}",
            rp.shown_from(r)
        );
        if let Some(c) = &columns {
            let _ = write!(
                said,
                ", columns {}",
                c.iter().map(|c| tick(c)).collect::<Vec<_>>().join(", ")
            );
        }
        if let Some(s) = sort {
            let _ = write!(
                said,
                ", sorted by {}{}",
                tick(s),
                if descending { " (largest first)" } else { "" }
            );
        }
        said.push('.');
        rp.md(said);
        let mut code = format!("# Step {n}: the table the person saw.\n");
        let expr = match rp.table_of(r) {
            Ok(e) => e,
            Err(c) => {
                code.push_str(&c);
                return rp.code(code);
            }
        };
        let _ = writeln!(code, "_shown = {expr}");
        if let Some(c) = &columns {
            let _ = writeln!(code, "_shown = _shown[{}]", py_list(c));
        }
        if let Some(s) = sort {
            let _ = writeln!(
                code,
                "_shown = _shown.sort_values({}, ascending={})",
                py_str(s),
                if descending { "False" } else { "True" }
            );
        }
        let _ = writeln!(code, "_shown = _shown.head({limit})");
        code.push_str(
            "try:\n    display(_shown)\nexcept NameError:\n    print(_shown.to_string())\n",
        );
        rp.code(code);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping() {
        assert_eq!(md_escape("a|b\nc"), "a\\|b c");
        assert_eq!(html_escape("<b>&\"'"), "&lt;b&gt;&amp;&quot;&#39;");
        assert_eq!(display(&serde_json::json!(-1234567)), "-1,234,567");
        assert_eq!(display(&serde_json::json!(2.5)), "2.5");
        assert_eq!(display(&Value::Null), "");
    }
}
