//! The view's own tools (MCP Apps `visibility: ["app"]`): what the page and an MCP host's
//! view call to show a stored table or a chart to the person. Hosts with the extension
//! keep them from the model, hosts without it never see them listed, and an agent profile
//! cannot name them; their results are neither spilled nor capped for a model's context,
//! each bounds itself (a page of rows, a chart's points).
//!
//! - `view_rows`: one page of a table, sorted and filtered by the SQL engine over the
//!   mapped artifact, with a hidden row number as the last sort key so pages over ties
//!   never repeat or skip a row;
//! - `view_chart`: the points `render_chart` would draw (folded and downsampled the same
//!   way), for the view to draw itself;
//! - `view_artifacts`: the caller's tables with their provenance (tool and arguments);
//! - `view_download`: a table as the grid shows it (filtered and sorted) as a CSV, XLSX or
//!   Parquet file, given whole in the result (at most [`MAX_DOWNLOAD_BYTES`]), so a
//!   download writes nothing into the workspace.
//!
//! Every one opens through the store as the caller: another principal's table answers as
//! an unknown one.

use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, RecordBatchOptions, UInt64Array};
use arrow_ord::sort::{SortColumn, lexsort_to_indices};
use arrow_schema::SortOptions;
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef};
use async_trait::async_trait;
use dataref_chart::{Body, Plot, XScale};
use dataref_config::SqlConfig;
use dataref_protocol::{DataRef, ToolSpec, VIEW_URI};
use dataref_sql::{Columns, Input, Query, QueryLimits};
use dataref_store::{MappedTable, cell_to_json, did_you_mean};
use dataref_tool::{RunContext, ToolError, ToolOutput, TypedTool};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::render_chart::{ChartArgs, chart_error};
use crate::support::{blocking, output, spec_for};

/// Rows in one page, at most (and by default).
pub const MAX_PAGE_ROWS: u32 = 500;
const DEFAULT_PAGE_ROWS: u32 = 100;
/// From this offset on, a sorted page is not the engine's top-k (see `deep_page`).
const DEEP_PAGE: u64 = 100_000;
/// A page stops short of its row count rather than pass this many characters of JSON.
const MAX_PAGE_CHARS: usize = 2 << 20;
/// A cell's text is cut here (the grid shows the start; an export has the whole).
const MAX_CELL_CHARS: usize = 2_000;
/// Artifacts listed, newest first.
const MAX_LISTED: usize = 500;
/// The table's name in the engine.
const TABLE: &str = "t";

/// Marks a spec as the view's own: listed only to hosts with MCP Apps, hidden from models.
fn app_only(mut spec: ToolSpec) -> ToolSpec {
    spec.ui.app_only = true;
    spec.ui.resource_uri = Some(VIEW_URI.into());
    spec
}

/// The grid's column kinds (how a cell is aligned and filtered).
fn kind_of(dt: &DataType) -> &'static str {
    match dt {
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::UInt64 => "integer",
        DataType::Float16 | DataType::Float32 | DataType::Float64 => "number",
        DataType::Decimal32(..)
        | DataType::Decimal64(..)
        | DataType::Decimal128(..)
        | DataType::Decimal256(..) => "decimal",
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "text",
        DataType::Dictionary(_, v) => kind_of(v),
        DataType::Boolean => "boolean",
        DataType::Date32 | DataType::Date64 => "date",
        DataType::Timestamp(..) => "timestamp",
        _ => "other",
    }
}

#[derive(Debug, Serialize, JsonSchema)]
struct ColumnInfo {
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
}

fn columns_of(schema: &Schema) -> Vec<ColumnInfo> {
    schema
        .fields()
        .iter()
        .map(|f| ColumnInfo {
            name: f.name().clone(),
            kind: kind_of(f.data_type()),
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// view_rows

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RowsArgs {
    data_ref: DataRef,
    /// Rows skipped (after filtering and sorting).
    #[serde(default)]
    offset: u64,
    #[serde(default)]
    #[schemars(range(min = 1, max = 500))]
    limit: Option<u32>,
    /// Sort keys, the first most significant.
    #[serde(default)]
    sort: Vec<SortKey>,
    /// Every filter must hold.
    #[serde(default)]
    filter: Vec<Filter>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct SortKey {
    column: String,
    #[serde(default)]
    descending: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Filter {
    column: String,
    op: Op,
    /// A string or a number (none for `is null` and `is not null`).
    #[serde(default)]
    value: Option<Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
enum Op {
    /// The cell's text holds the value, ignoring case.
    #[serde(rename = "contains")]
    Contains,
    #[serde(rename = "=")]
    Eq,
    #[serde(rename = "!=")]
    Ne,
    #[serde(rename = "<")]
    Lt,
    #[serde(rename = "<=")]
    Le,
    #[serde(rename = ">")]
    Gt,
    #[serde(rename = ">=")]
    Ge,
    #[serde(rename = "is null")]
    IsNull,
    #[serde(rename = "is not null")]
    NotNull,
}

impl Op {
    fn sql(self) -> &'static str {
        match self {
            Self::Eq => "=",
            Self::Ne => "<>",
            Self::Lt => "<",
            Self::Le => "<=",
            Self::Gt => ">",
            Self::Ge => ">=",
            Self::Contains | Self::IsNull | Self::NotNull => "",
        }
    }
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct RowsResult {
    data_ref: DataRef,
    columns: Vec<ColumnInfo>,
    /// Rows in the table.
    rows: u64,
    /// Rows that pass the filters.
    matched: u64,
    offset: u64,
    /// The page: one array of cells per row, in column order.
    page: Vec<Vec<Value>>,
}

pub struct ViewRowsTool {
    spec: ToolSpec,
    config: SqlConfig,
}

impl ViewRowsTool {
    pub fn new(config: SqlConfig) -> Self {
        Self {
            spec: app_only(spec_for::<RowsArgs, RowsResult>(
                "view_rows",
                "For the view: one page of a stored table, sorted and filtered on the server.",
                true,
                false,
            )),
            config,
        }
    }
}

/// `"name"`, quoted for the engine.
fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `'text'`, quoted for the engine.
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The SQL of one filter, its value checked against the column's type.
fn predicate(f: &Filter, dt: &DataType) -> Result<String, ToolError> {
    let col = ident(&f.column);
    let value = || {
        f.value.as_ref().filter(|v| !v.is_null()).ok_or_else(|| {
            ToolError::respond(
                format!("the filter on `{}` needs a `value`", f.column),
                Some("give a string or a number, or use `is null`".into()),
            )
        })
    };
    Ok(match f.op {
        Op::IsNull => format!("{col} IS NULL"),
        Op::NotNull => format!("{col} IS NOT NULL"),
        Op::Contains => format!(
            "strpos(lower(CAST({col} AS VARCHAR)), lower({})) > 0",
            literal(&value_text(value()?))
        ),
        op => {
            let v = value()?;
            let rhs = match kind_of(dt) {
                "integer" | "number" | "decimal" => {
                    let text = value_text(v);
                    let n: f64 = text.trim().parse().map_err(|_| {
                        ToolError::respond(
                            format!("`{}` holds numbers; `{text}` is not one", f.column),
                            Some("compare with a number, e.g. `>= 10`".into()),
                        )
                    })?;
                    if !n.is_finite() {
                        return Err(ToolError::respond(
                            format!("`{text}` is not a finite number"),
                            None,
                        ));
                    }
                    // Rust's shortest round-trip form is valid SQL for every finite f64.
                    format!("{n:?}")
                }
                "date" => format!("CAST({} AS DATE)", literal(&value_text(v))),
                "timestamp" => format!("CAST({} AS TIMESTAMP)", literal(&value_text(v))),
                "boolean" => match value_text(v).trim().to_ascii_lowercase().as_str() {
                    "true" => "TRUE".into(),
                    "false" => "FALSE".into(),
                    other => {
                        return Err(ToolError::respond(
                            format!("`{}` holds true or false; `{other}` is neither", f.column),
                            None,
                        ));
                    }
                },
                _ => literal(&value_text(v)),
            };
            format!("{col} {} {rhs}", op.sql())
        }
    })
}

/// A name for the hidden row number that no column of `schema` has.
fn row_column(schema: &Schema) -> String {
    let mut name = String::from("__dataref_row");
    while schema.fields().iter().any(|f| f.name() == &name) {
        name.push('_');
    }
    name
}

/// ` WHERE …` of every filter (each checked against its column's type), or nothing.
fn where_sql(filter: &[Filter], schema: &Schema) -> Result<String, ToolError> {
    let mut filters = Vec::with_capacity(filter.len());
    for f in filter {
        let dt = schema
            .field_with_name(&f.column)
            .map_or(DataType::Null, |x| x.data_type().clone());
        filters.push(predicate(f, &dt)?);
    }
    Ok(if filters.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", filters.join(" AND "))
    })
}

/// A stored table with its row numbers as one more column (last), made only when a plan
/// reads it: the tie-breaker that makes every sort total.
#[derive(Debug)]
struct Numbered {
    table: MappedTable,
    /// The stored columns.
    width: usize,
}

impl Numbered {
    /// `table` numbered, and its schema with the row number's column
    /// ([`row_column`]) last.
    fn input(table: MappedTable) -> (SchemaRef, Arc<Self>) {
        let schema = table.meta.schema.clone();
        let mut fields: Vec<_> = schema.fields().iter().cloned().collect();
        fields.push(Arc::new(Field::new(
            row_column(&schema),
            DataType::UInt64,
            false,
        )));
        let width = schema.fields().len();
        (
            Arc::new(Schema::new(fields)),
            Arc::new(Self { table, width }),
        )
    }
}

impl Columns for Numbered {
    fn batches(&self, projection: Option<&[usize]>) -> Result<Vec<RecordBatch>, ArrowError> {
        let all: Vec<usize> = (0..=self.width).collect();
        let projection = projection.unwrap_or(&all);
        let stored: Vec<usize> = projection
            .iter()
            .copied()
            .filter(|&i| i < self.width)
            .collect();
        let numbered = projection.contains(&self.width);
        // At least one stored column gives the batches' lengths.
        let read: &[usize] = if stored.is_empty() && numbered {
            &[0]
        } else {
            &stored
        };
        let batches = self
            .table
            .batches(Some(read))
            .map_err(|e| ArrowError::ExternalError(Box::new(e)))?;
        if !numbered {
            return Ok(batches);
        }
        let full = self.table.meta.schema.clone();
        let row_field = Arc::new(Field::new("row", DataType::UInt64, false));
        let fields: Vec<_> = projection
            .iter()
            .map(|&i| {
                if i < self.width {
                    Arc::new(full.field(i).clone())
                } else {
                    row_field.clone()
                }
            })
            .collect();
        let schema = Arc::new(Schema::new(fields));
        let mut start = 0u64;
        let mut out = Vec::with_capacity(batches.len());
        for b in batches {
            let n = b.num_rows() as u64;
            let rows: ArrayRef = Arc::new(UInt64Array::from_iter_values(start..start + n));
            start += n;
            let mut next_stored = 0;
            let columns = projection
                .iter()
                .map(|&i| {
                    if i < self.width {
                        let c = b.column(next_stored).clone();
                        next_stored += 1;
                        c
                    } else {
                        rows.clone()
                    }
                })
                .collect();
            let options = RecordBatchOptions::new().with_row_count(Some(b.num_rows()));
            out.push(RecordBatch::try_new_with_options(
                schema.clone(),
                columns,
                &options,
            )?);
        }
        Ok(out)
    }
}

/// The rows numbered `rows` (in stored order, from 0), in that order, one batch each.
fn rows_at(
    table: &MappedTable,
    rows: &[u64],
) -> Result<Vec<RecordBatch>, dataref_store::StoreError> {
    let batches = table.batches(None)?;
    let mut starts = Vec::with_capacity(batches.len());
    let mut start = 0u64;
    for b in &batches {
        starts.push(start);
        start += b.num_rows() as u64;
    }
    Ok(rows
        .iter()
        .filter_map(|&row| {
            let at = starts.partition_point(|&s| s <= row).checked_sub(1)?;
            let local = usize::try_from(row - starts[at]).ok()?;
            let b = &batches[at];
            (local < b.num_rows()).then(|| b.slice(local, 1))
        })
        .collect())
}

/// Every column a sort key or a filter names is one of `schema`'s.
fn check_columns(sort: &[SortKey], filter: &[Filter], schema: &Schema) -> Result<(), ToolError> {
    for name in sort
        .iter()
        .map(|s| &s.column)
        .chain(filter.iter().map(|f| &f.column))
    {
        if schema.index_of(name).is_err() {
            return Err(unknown_column(name, schema));
        }
    }
    Ok(())
}

/// The engine's limits for the view's sorting and filtering: `[sql] memory`.
fn query_limits(config: &SqlConfig) -> QueryLimits {
    QueryLimits {
        memory_bytes: usize::try_from(config.memory_bytes).unwrap_or(usize::MAX),
        ..QueryLimits::default()
    }
}

/// `work` (sorting or filtering a table for `what`), within `[sql] timeout` and until the
/// call is cancelled.
async fn bounded<T>(
    config: &SqlConfig,
    ctx: &RunContext,
    what: &str,
    work: impl std::future::Future<Output = Result<T, ToolError>>,
) -> Result<T, ToolError> {
    tokio::select! {
        r = tokio::time::timeout(config.timeout, work) => r.map_err(|_| {
            ToolError::respond(
                "sorting or filtering this table took too long",
                Some("filter on fewer columns, or export the table".into()),
            )
        })?,
        () = ctx.cancel.cancelled() => Err(ToolError::respond(format!("{what} was cancelled"), None)),
    }
}

fn unknown_column(column: &str, schema: &Schema) -> ToolError {
    let available: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
    ToolError::respond(
        format!("no column `{column}`"),
        Some(did_you_mean(column, &available)),
    )
}

/// The page's cells, stopping before [`MAX_PAGE_CHARS`].
fn cells(batches: &[RecordBatch], columns: usize, out: &mut Vec<Vec<Value>>) {
    let mut chars = 0usize;
    for b in batches {
        for row in 0..b.num_rows() {
            let line: Vec<Value> = b
                .columns()
                .iter()
                .take(columns)
                .map(|c| cell_to_json(c, row, Some(MAX_CELL_CHARS)).0)
                .collect();
            chars += line.iter().map(|v| v.to_string().len() + 1).sum::<usize>();
            if chars > MAX_PAGE_CHARS && !out.is_empty() {
                return;
            }
            out.push(line);
        }
    }
}

fn sql_error(e: dataref_sql::SqlError) -> ToolError {
    if e.is_caller_error() {
        ToolError::respond(e.to_string(), e.hint())
    } else {
        ToolError::Fatal(e.to_string())
    }
}

async fn collect(
    sql: &str,
    input: Input,
    limits: &QueryLimits,
) -> Result<Vec<RecordBatch>, ToolError> {
    let mut q = Query::start(sql, vec![input], limits)
        .await
        .map_err(sql_error)?;
    let mut out = Vec::new();
    while let Some(b) = q.next_batch().await.map_err(sql_error)? {
        out.push(b);
    }
    Ok(out)
}

/// Rows `offset..offset + limit` of `batches` (the sort keys `k0…`, then the row number)
/// in the page's order: each key as `descending` says, NULLs last, then the row number;
/// their row numbers.
fn deep_page(
    batches: &[RecordBatch],
    descending: &[bool],
    offset: u64,
    limit: usize,
) -> Result<Vec<u64>, ArrowError> {
    let total: u64 = batches.iter().map(|b| b.num_rows() as u64).sum();
    if offset >= total {
        return Ok(Vec::new());
    }
    let mut keys = Vec::with_capacity(descending.len() + 1);
    for i in 0..=descending.len() {
        let arrays: Vec<&dyn arrow_array::Array> =
            batches.iter().map(|b| b.column(i).as_ref()).collect();
        keys.push(SortColumn {
            values: arrow_select::concat::concat(&arrays)?,
            options: Some(SortOptions {
                descending: descending.get(i).copied().unwrap_or(false),
                nulls_first: false,
            }),
        });
    }
    let end = offset.saturating_add(limit as u64).min(total);
    let fetch = usize::try_from(end).unwrap_or(usize::MAX);
    let order = lexsort_to_indices(&keys, Some(fetch))?;
    let rows = keys
        .last()
        .and_then(|k| k.values.as_any().downcast_ref::<UInt64Array>())
        .ok_or_else(|| ArrowError::SchemaError("no row numbers".into()))?;
    let from = usize::try_from(offset).unwrap_or(usize::MAX);
    Ok(order
        .values()
        .iter()
        .skip(from)
        .map(|&i| rows.value(i as usize))
        .collect())
}

#[async_trait]
impl TypedTool for ViewRowsTool {
    type Args = RowsArgs;

    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, a: RowsArgs, ctx: &RunContext) -> Result<ToolOutput, ToolError> {
        let limit = a.limit.unwrap_or(DEFAULT_PAGE_ROWS).clamp(1, MAX_PAGE_ROWS) as usize;
        let store = ctx.store.clone();
        let owner = ctx.principal.clone();
        let data_ref = a.data_ref.clone();
        let table = blocking("view_rows", move || Ok(store.map_table(&owner, &data_ref)?)).await?;
        let schema = table.meta.schema.clone();
        let total = table.meta.rows;
        let width = schema.fields().len();
        check_columns(&a.sort, &a.filter, &schema)?;
        let mut page = Vec::new();
        let matched;
        if a.sort.is_empty() && a.filter.is_empty() {
            // In stored order: a slice of the mapped batches, no engine.
            matched = total;
            let (offset, table) = (a.offset, table.clone());
            let batches = blocking("view_rows", move || {
                let batches = table.batches(None)?;
                let mut skip = offset;
                let mut want = limit;
                let mut out = Vec::new();
                for b in batches {
                    let n = b.num_rows() as u64;
                    if skip >= n {
                        skip -= n;
                        continue;
                    }
                    let start = skip as usize;
                    let len = want.min(b.num_rows() - start);
                    out.push(b.slice(start, len));
                    skip = 0;
                    want -= len;
                    if want == 0 {
                        break;
                    }
                }
                Ok(out)
            })
            .await?;
            cells(&batches, width, &mut page);
        } else {
            let where_sql = where_sql(&a.filter, &schema)?;
            let row = row_column(&schema);
            let (numbered, source) = Numbered::input(table);
            let input = || Input::columns(TABLE, numbered.clone(), source.clone());
            let mut order: Vec<String> = a
                .sort
                .iter()
                .map(|s| {
                    let dir = if s.descending { "DESC" } else { "ASC" };
                    format!("{} {dir} NULLS LAST", ident(&s.column))
                })
                .collect();
            order.push(ident(&row));
            // The page's row numbers first; the rows themselves are then read from the
            // mapping. Near the top, the engine's top-k over the keys and the row number.
            // Deeper, a top-k would keep every row before the page in its heap (millions
            // of entries in the middle of a large table, over any sane memory limit): the
            // engine only filters, and the keys and row numbers it streams back are sorted
            // here, up to the page's end.
            let deep = a.offset >= DEEP_PAGE;
            let sql = if deep {
                let mut select: Vec<String> = a
                    .sort
                    .iter()
                    .enumerate()
                    .map(|(i, s)| format!("{} AS k{i}", ident(&s.column)))
                    .collect();
                select.push(ident(&row));
                format!("SELECT {} FROM {TABLE}{where_sql}", select.join(", "))
            } else {
                format!(
                    "SELECT {} FROM {TABLE}{where_sql} ORDER BY {} LIMIT {limit} OFFSET {}",
                    ident(&row),
                    order.join(", "),
                    a.offset
                )
            };
            let descending: Vec<bool> = a.sort.iter().map(|s| s.descending).collect();
            let offset = a.offset;
            let limits = query_limits(&self.config);
            let work = async {
                if deep {
                    let batches = collect(&sql, input(), &limits).await?;
                    let matched = batches.iter().map(|b| b.num_rows() as u64).sum();
                    let rows = blocking("view_rows", move || {
                        deep_page(&batches, &descending, offset, limit)
                            .map_err(|e| ToolError::Fatal(e.to_string()))
                    })
                    .await?;
                    return Ok::<_, ToolError>((rows, matched));
                }
                let batches = collect(&sql, input(), &limits).await?;
                let rows: Vec<u64> = batches
                    .iter()
                    .filter_map(|b| b.column(0).as_any().downcast_ref::<UInt64Array>())
                    .flat_map(|c| c.values().iter().copied())
                    .collect();
                let matched = if where_sql.is_empty() {
                    total
                } else {
                    let counted = collect(
                        &format!("SELECT count(*) FROM {TABLE}{where_sql}"),
                        input(),
                        &limits,
                    )
                    .await?;
                    counted
                        .first()
                        .filter(|b| b.num_rows() > 0)
                        .and_then(|b| {
                            b.column(0)
                                .as_any()
                                .downcast_ref::<arrow_array::Int64Array>()
                                .map(|c| c.value(0))
                        })
                        .map_or(0, |n| u64::try_from(n).unwrap_or(0))
                };
                Ok::<_, ToolError>((rows, matched))
            };
            let (rows, counted) = bounded(&self.config, ctx, "the page", work).await?;
            matched = counted;
            let table = source.table.clone();
            let batches = blocking("view_rows", move || Ok(rows_at(&table, &rows)?)).await?;
            cells(&batches, width, &mut page);
        }
        let text = format!(
            "rows {}–{} of {matched} (table: {total})",
            a.offset + u64::from(!page.is_empty()),
            a.offset + page.len() as u64
        );
        let mut out = output(RowsResult {
            data_ref: a.data_ref,
            columns: columns_of(&schema),
            rows: total,
            matched,
            offset: a.offset,
            page,
        })?;
        out.text = Some(text);
        Ok(out)
    }
}

// ---------------------------------------------------------------------------------------
// view_download

/// The file of what the grid shows, at most: it travels whole inside one result, as
/// base64, to the person (a larger table is exported with `export_data`).
pub const MAX_DOWNLOAD_BYTES: u64 = 32 << 20;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DownloadArgs {
    data_ref: DataRef,
    format: DownloadFormat,
    /// Sort keys, the first most significant (as `view_rows` takes them).
    #[serde(default)]
    sort: Vec<SortKey>,
    /// Every filter must hold (as `view_rows` takes them).
    #[serde(default)]
    filter: Vec<Filter>,
}

#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
enum DownloadFormat {
    Csv,
    Xlsx,
    Parquet,
}

impl DownloadFormat {
    fn format(self) -> dataref_export::Format {
        match self {
            Self::Csv => dataref_export::Format::Csv,
            Self::Xlsx => dataref_export::Format::Xlsx,
            Self::Parquet => dataref_export::Format::Parquet,
        }
    }
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct DownloadResult {
    /// The file's name: the table's name and the format's extension.
    name: String,
    mime_type: &'static str,
    /// Rows in the file: those that pass the filters.
    rows: u64,
    bytes: u64,
}

pub struct ViewDownloadTool {
    spec: ToolSpec,
    config: SqlConfig,
}

impl ViewDownloadTool {
    pub fn new(config: SqlConfig) -> Self {
        Self {
            spec: app_only(spec_for::<DownloadArgs, DownloadResult>(
                "view_download",
                "For the view: a stored table as the grid shows it (filtered and sorted), as \
                 a CSV, XLSX or Parquet file given to the person whole; nothing is written.",
                true,
                false,
            )),
            config,
        }
    }
}

/// A file name from a table's name: letters, digits, `-`, `_` and `.` kept, every other
/// run of characters one `_`.
fn file_name(name: &str, fallback: &DataRef, ext: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if c.is_alphanumeric() || matches!(c, '-' | '_' | '.') {
            out.push(c);
        } else if !out.ends_with('_') {
            out.push('_');
        }
    }
    let stem = out.trim_matches(|c| c == '_' || c == '.');
    let stem = if stem.is_empty() {
        fallback.as_str()
    } else {
        stem
    };
    format!("{stem}.{ext}")
}

/// Bytes kept in memory up to a cap; one more is an error of kind `FileTooLarge`.
struct Capped {
    bytes: Vec<u8>,
    cap: u64,
}

impl std::io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if (self.bytes.len() + buf.len()) as u64 > self.cap {
            return Err(std::io::Error::new(
                std::io::ErrorKind::FileTooLarge,
                "over the download's cap",
            ));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[async_trait]
impl TypedTool for ViewDownloadTool {
    type Args = DownloadArgs;

    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, a: DownloadArgs, ctx: &RunContext) -> Result<ToolOutput, ToolError> {
        let store = ctx.store.clone();
        let owner = ctx.principal.clone();
        let data_ref = a.data_ref.clone();
        let table = blocking("view_download", move || {
            Ok(store.map_table(&owner, &data_ref)?)
        })
        .await?;
        let schema = table.meta.schema.clone();
        check_columns(&a.sort, &a.filter, &schema)?;
        // Which rows, in which order: the engine filters, and the keys and row numbers it
        // streams back are sorted here (the view's deep page, over every matching row).
        let rows = if a.sort.is_empty() && a.filter.is_empty() {
            None
        } else {
            let where_sql = where_sql(&a.filter, &schema)?;
            let row = row_column(&schema);
            let (numbered, source) = Numbered::input(table.clone());
            let mut select: Vec<String> = a
                .sort
                .iter()
                .enumerate()
                .map(|(i, s)| format!("{} AS k{i}", ident(&s.column)))
                .collect();
            select.push(ident(&row));
            let sql = format!("SELECT {} FROM {TABLE}{where_sql}", select.join(", "));
            let descending: Vec<bool> = a.sort.iter().map(|s| s.descending).collect();
            let limits = query_limits(&self.config);
            let work = async {
                let batches =
                    collect(&sql, Input::columns(TABLE, numbered, source), &limits).await?;
                blocking("view_download", move || {
                    deep_page(&batches, &descending, 0, usize::MAX)
                        .map_err(|e| ToolError::Fatal(e.to_string()))
                })
                .await
            };
            let order = bounded(&self.config, ctx, "the download", work).await?;
            let order = order
                .into_iter()
                .map(u32::try_from)
                .collect::<Result<Vec<u32>, _>>()
                .map_err(|_| {
                    ToolError::respond(
                        "the table has too many rows to download from the view",
                        Some("export it with `export_data`".into()),
                    )
                })?;
            Some(order)
        };
        let format = a.format.format();
        let name = file_name(&table.meta.lineage.name(), &a.data_ref, format.extension());
        let cancel = ctx.cancel.clone();
        let (rows, bytes) = blocking("view_download", move || {
            let batches = table.batches(None)?;
            let options = dataref_export::ExportOptions {
                rows,
                ..dataref_export::ExportOptions::default()
            };
            let mut out = Capped {
                bytes: Vec::new(),
                cap: MAX_DOWNLOAD_BYTES,
            };
            let done =
                dataref_export::export(format, &schema, &batches, &options, &mut out, &|| {
                    cancel.is_cancelled()
                });
            match done {
                Ok(done) => Ok((done.rows, out.bytes)),
                Err(dataref_export::ExportError::Io(e))
                    if e.kind() == std::io::ErrorKind::FileTooLarge =>
                {
                    Err(ToolError::respond(
                        format!(
                            "the file would be over {}, more than the view gives whole",
                            dataref_protocol::human_bytes(MAX_DOWNLOAD_BYTES)
                        ),
                        Some(
                            "filter the grid to fewer rows, pick Parquet (smaller), or export \
                             the whole table with `export_data`"
                                .into(),
                        ),
                    ))
                }
                Err(e) => Err(super::export_data::export_error(e)),
            }
        })
        .await?;
        let mut out = output(DownloadResult {
            name: name.clone(),
            mime_type: format.mime_type(),
            rows,
            bytes: bytes.len() as u64,
        })?;
        out.text = Some(format!("{name}: {rows} rows"));
        out.attachments.push(dataref_tool::Attachment::File {
            uri: format!("dataref://downloads/{name}"),
            mime_type: format.mime_type().to_owned(),
            data: bytes,
        });
        Ok(out)
    }
}

// ---------------------------------------------------------------------------------------
// view_chart

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct ChartData {
    kind: &'static str,
    title: String,
    x_label: String,
    y_label: String,
    rows: u64,
    points: u64,
    /// Everything the kind needs: `categories` + `series[].values` (bar), `x` +
    /// `series[].points` (line, area, scatter), `edges` + `series[].counts` (histogram),
    /// `slices` (pie).
    #[serde(flatten)]
    #[schemars(with = "serde_json::Map<String, Value>")]
    body: serde_json::Map<String, Value>,
}

fn x_json(x: &XScale, body: &mut serde_json::Map<String, Value>) {
    match x {
        XScale::Number => {
            body.insert("x".into(), json!("number"));
        }
        XScale::Date => {
            body.insert("x".into(), json!("date"));
        }
        XScale::Category(labels) => {
            body.insert("x".into(), json!("category"));
            body.insert("categories".into(), json!(labels));
        }
    }
}

/// Non-finite numbers have no JSON: they go as null.
fn num(v: f64) -> Value {
    serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number)
}

fn chart_json(plot: &Plot, kind: &'static str, title: String) -> ChartData {
    let mut body = serde_json::Map::new();
    match &plot.body {
        Body::Bars { categories, series } => {
            body.insert("categories".into(), json!(categories));
            let series: Vec<Value> = series
                .iter()
                .map(|(name, values)| {
                    json!({"name": name, "values": values.iter().map(|&v| num(v)).collect::<Vec<_>>()})
                })
                .collect();
            body.insert("series".into(), Value::Array(series));
        }
        Body::Lines { x, series, .. } | Body::Dots { x, series } => {
            x_json(x, &mut body);
            let series: Vec<Value> = series
                .iter()
                .map(|s| {
                    let points: Vec<Value> = s
                        .points
                        .iter()
                        .map(|&(x, y)| Value::Array(vec![num(x), num(y)]))
                        .collect();
                    json!({"name": s.name, "points": points})
                })
                .collect();
            body.insert("series".into(), Value::Array(series));
        }
        Body::Histogram { x, edges, series } => {
            x_json(x, &mut body);
            body.insert(
                "edges".into(),
                Value::Array(edges.iter().map(|&e| num(e)).collect()),
            );
            let series: Vec<Value> = series
                .iter()
                .map(|(name, counts)| json!({"name": name, "counts": counts}))
                .collect();
            body.insert("series".into(), Value::Array(series));
        }
        Body::Pie { slices } => {
            let slices: Vec<Value> = slices
                .iter()
                .map(|(label, value)| json!({"label": label, "value": num(*value)}))
                .collect();
            body.insert("slices".into(), Value::Array(slices));
        }
    }
    ChartData {
        kind,
        title,
        x_label: plot.x_label.clone(),
        y_label: plot.y_label.clone(),
        rows: plot.rows,
        points: plot.points(),
        body,
    }
}

pub struct ViewChartTool {
    spec: ToolSpec,
}

impl ViewChartTool {
    pub fn new() -> Self {
        Self {
            spec: app_only(spec_for::<ChartArgs, ChartData>(
                "view_chart",
                "For the view: the points of a chart (`render_chart`'s arguments), to draw.",
                true,
                false,
            )),
        }
    }
}

impl Default for ViewChartTool {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl TypedTool for ViewChartTool {
    type Args = ChartArgs;

    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, a: ChartArgs, ctx: &RunContext) -> Result<ToolOutput, ToolError> {
        let store = ctx.store.clone();
        let owner = ctx.principal.clone();
        let data = blocking("view_chart", move || {
            let spec = a.chart_spec();
            let table = store.open_table(&owner, a.data_ref())?;
            let plot = dataref_chart::plot(&table.meta.schema, &table.batches, &spec)
                .map_err(chart_error)?;
            let title = spec.title.clone().unwrap_or_else(|| plot.default_title());
            Ok(chart_json(&plot, spec.kind.as_str(), title))
        })
        .await?;
        let text = format!("{} points of {} rows", data.points, data.rows);
        let mut out = output(data)?;
        out.text = Some(text);
        Ok(out)
    }
}

// ---------------------------------------------------------------------------------------
// view_artifacts

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ArtifactsArgs {}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Listed {
    data_ref: DataRef,
    /// What a person knows it by: the file, the query and its arguments, the output.
    name: String,
    rows: u64,
    bytes: u64,
    columns: Vec<ColumnInfo>,
    /// The tool that made it, and with which arguments.
    tool: String,
    arguments: Value,
    created_at: dataref_protocol::Timestamp,
    expires_at: dataref_protocol::Timestamp,
    /// The stored content's hash.
    #[serde(skip_serializing_if = "Option::is_none")]
    checksum: Option<String>,
    /// How it was made (the provenance panel); none for a table stored before receipts.
    #[serde(skip_serializing_if = "Option::is_none")]
    receipt: Option<dataref_protocol::Receipt>,
}

#[derive(Debug, Serialize, JsonSchema)]
struct ArtifactsResult {
    artifacts: Vec<Listed>,
    total: u64,
}

pub struct ViewArtifactsTool {
    spec: ToolSpec,
}

impl ViewArtifactsTool {
    pub fn new() -> Self {
        Self {
            spec: app_only(spec_for::<ArtifactsArgs, ArtifactsResult>(
                "view_artifacts",
                "For the view: your stored tables, newest first, with the tool and arguments \
                 that made each and its receipt.",
                true,
                false,
            )),
        }
    }
}

impl Default for ViewArtifactsTool {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl TypedTool for ViewArtifactsTool {
    type Args = ArtifactsArgs;

    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, _a: ArtifactsArgs, ctx: &RunContext) -> Result<ToolOutput, ToolError> {
        let store = ctx.store.clone();
        let owner = ctx.principal.clone();
        let (metas, total) = blocking(
            "view_artifacts",
            move || Ok(store.list(&owner, MAX_LISTED)?),
        )
        .await?;
        let artifacts: Vec<Listed> = metas
            .into_iter()
            .map(|m| Listed {
                columns: columns_of(&m.schema),
                name: m.lineage.name(),
                data_ref: m.data_ref,
                rows: m.rows,
                bytes: m.bytes,
                tool: m.lineage.tool,
                arguments: m.lineage.args,
                created_at: m.created_at,
                expires_at: m.expires_at,
                checksum: m.checksum.map(|c| c.to_string()),
                receipt: m.lineage.receipt,
            })
            .collect();
        let text = format!("{} of {total} tables", artifacts.len());
        let mut out = output(ArtifactsResult { artifacts, total })?;
        out.text = Some(text);
        Ok(out)
    }
}
