//! `run_sql(sql, inputs, store_as?)`: one query over dataRefs in the embedded engine
//! (`dataref-sql`), as the caller: every input is opened through the store, which checks
//! the owner, and read where it is mapped. The result is a new artifact of the caller's,
//! described like a producer's, or — asked for and small — its rows.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_schema::ArrowError;
use async_trait::async_trait;
use dataref_config::SqlConfig;
use dataref_protocol::{DataRef, Description, ToolSpec};
use dataref_sql::{Columns, Input, Query, QueryLimits, SqlError};
use dataref_store::{ArtifactMeta, Lineage, MappedTable, SampleOptions, describe};
use dataref_tool::{RunContext, ToolError, ToolOutput, TypedTool};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::support::{blocking, output, spec_for};

/// Significant digits of a float in `values`: a sum's last-bit noise
/// (`14282.780000000002`) costs the model tokens and teaches it nothing.
const FLOAT_DIGITS: usize = 15;

/// Batches in flight between the engine and the writer thread.
const WRITE_QUEUE: usize = 4;
/// A `value` answer over this many characters of JSON is stored as a table instead.
const VALUE_MAX_CHARS: usize = 8_000;
/// Longest input name (a table name in the SQL).
const MAX_NAME_CHARS: usize = 64;

const DESCRIPTION: &str = "One SQL query over dataRefs, beside the data: filter, join, group, \
pivot, window. `inputs` names tables ({\"sales\": \"data_…\"} → FROM sales). DataFusion SQL, \
like PostgreSQL; `^` is XOR. Returns a dataRef, schema, sample; `store_as: \"value\"` returns \
small results' rows. Use run_python for statistics, reshaping SQL can't express, documents, \
pictures.";

/// How the result comes back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum StoreAs {
    /// Stored as a new table: a dataRef and its description.
    #[default]
    Table,
    /// The rows themselves, when there are few; otherwise stored as a table.
    Value,
}

/// Arguments of `run_sql`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunSqlArgs {
    /// One SELECT or WITH query.
    #[schemars(length(min = 1, max = 100_000))]
    sql: String,
    /// Table name → dataRef.
    inputs: BTreeMap<String, DataRef>,
    /// Default `table`.
    #[serde(default)]
    store_as: StoreAs,
}

/// What `run_sql` returns: a stored table's description, or a small result's rows.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunSqlResult {
    /// The stored result (absent when `values` holds the rows).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_ref: Option<DataRef>,
    pub rows: u64,
    /// Column name → type, in order.
    pub columns: Map<String, Value>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub more_columns: u64,
    /// Column name → NULLs, only for columns that have any.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub nulls: Map<String, Value>,
    /// First rows, arrays in `columns` order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sample: Vec<Vec<Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_note: Option<String>,
    /// Every row, arrays in `columns` order (with `store_as: "value"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub values: Option<Vec<Vec<Value>>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl From<Description> for RunSqlResult {
    fn from(d: Description) -> Self {
        Self {
            data_ref: Some(d.data_ref),
            rows: d.rows,
            columns: d.columns,
            more_columns: d.more_columns,
            nulls: d.nulls,
            sample: d.sample,
            sample_note: d.sample_note,
            values: None,
            notes: d.notes,
        }
    }
}

pub struct RunSqlTool {
    spec: ToolSpec,
    config: SqlConfig,
}

impl RunSqlTool {
    pub fn new(config: SqlConfig) -> Self {
        Self {
            spec: spec_for::<RunSqlArgs, RunSqlResult>("run_sql", DESCRIPTION, true, false)
                .with_view(dataref_protocol::VIEW_URI),
            config,
        }
    }
}

#[async_trait]
impl TypedTool for RunSqlTool {
    /// A synopsis made for the model: never spilled by default.
    fn result_is_synopsis(&self) -> bool {
        true
    }

    type Args = RunSqlArgs;

    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, a: RunSqlArgs, ctx: &RunContext) -> Result<ToolOutput, ToolError> {
        for name in a.inputs.keys() {
            check_name(name)?;
        }
        let mut receipt = crate::receipt::started(ctx);
        // The owner check on every input: another principal's ref answers as an unknown one.
        // A table fetched in parts fails (damaged, the store unavailable) while the engine
        // reads it: the store's own error, kept here, is the answer, not the engine's.
        let failed = StoreFailure::default();
        let (inputs, parents) = {
            let store = ctx.store.clone();
            let owner = ctx.principal.clone();
            let wanted = a.inputs.clone();
            let failed = failed.clone();
            blocking("run_sql", move || {
                let mut inputs = Vec::with_capacity(wanted.len());
                let mut parents = Vec::with_capacity(wanted.len());
                for (name, data_ref) in wanted {
                    let table = store.map_columns(&owner, &data_ref)?;
                    parents.push(crate::receipt::parent(&name, &table.meta));
                    let schema = table.meta.schema.clone();
                    let source = Mapped {
                        table,
                        failed: failed.clone(),
                    };
                    inputs.push(Input::columns(name, schema, Arc::new(source)));
                }
                Ok((inputs, parents))
            })
            .await?
        };
        receipt.sql = Some(a.sql.clone());
        receipt.parents = parents;
        receipt.engines.insert(
            "datafusion".into(),
            dataref_sql::DATAFUSION_VERSION.to_owned(),
        );
        let lineage = Lineage::new(
            "run_sql",
            serde_json::json!({"sql": a.sql, "inputs": a.inputs}),
        )
        .with_receipt(receipt);
        let limits = QueryLimits {
            memory_bytes: usize::try_from(self.config.memory_bytes).unwrap_or(usize::MAX),
            ..QueryLimits::default()
        };
        let timeout = self.config.timeout;
        let work = run_query(
            a.sql,
            inputs,
            limits,
            a.store_as,
            &self.config,
            ctx,
            lineage,
        );
        let result = tokio::select! {
            r = tokio::time::timeout(timeout, work) => match r {
                Ok(r) => r.map_err(|e| failed.take().unwrap_or(e))?,
                Err(_) => return Err(timed_out(timeout)),
            },
            () = ctx.cancel.cancelled() => {
                return Err(ToolError::respond("the query was cancelled", None));
            }
        };
        output(result)
    }
}

/// A stored table as the engine's input: only the columns the plan reads are decoded, so
/// a query over three of twenty columns validates three (and, for a table kept elsewhere,
/// fetches only their bytes).
#[derive(Debug)]
struct Mapped {
    table: MappedTable,
    failed: StoreFailure,
}

impl Columns for Mapped {
    fn batches(&self, projection: Option<&[usize]>) -> Result<Vec<RecordBatch>, ArrowError> {
        self.table.batches(projection).map_err(|e| {
            let message = e.to_string();
            self.failed.keep(e);
            ArrowError::ExternalError(message.into())
        })
    }
}

/// The first store error an input met while the engine read it.
#[derive(Debug, Clone, Default)]
struct StoreFailure(Arc<std::sync::Mutex<Option<dataref_store::StoreError>>>);

impl StoreFailure {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<dataref_store::StoreError>> {
        // One store or take at a time: nothing half done.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn keep(&self, e: dataref_store::StoreError) {
        self.lock().get_or_insert(e);
    }

    /// The error kept, as the tool's error.
    fn take(&self) -> Option<ToolError> {
        self.lock().take().map(ToolError::from)
    }
}

/// A table name the SQL can use as it is written: lowercase, so an unquoted name matches.
fn check_name(name: &str) -> Result<(), ToolError> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if first_ok && rest_ok && name.len() <= MAX_NAME_CHARS {
        return Ok(());
    }
    Err(ToolError::respond(
        format!("`{name}` cannot name a table in `inputs`"),
        Some(format!(
            "use lowercase letters, digits and `_`, starting with a letter, at most \
             {MAX_NAME_CHARS} characters (e.g. `sales`)"
        )),
    ))
}

pub(crate) fn timed_out(timeout: Duration) -> ToolError {
    dataref_ops::metrics::sql_stopped("time");
    ToolError::respond(
        format!(
            "the query ran longer than {} and was stopped",
            duration_text(timeout)
        ),
        Some("filter or aggregate earlier, or split the question into smaller queries".into()),
    )
}

/// `60 s`, `1.5 s`, `500 ms`: never `0 s`.
fn duration_text(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1_000 {
        format!("{ms} ms")
    } else if ms.is_multiple_of(1_000) {
        format!("{} s", ms / 1_000)
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

pub(crate) fn sql_error(e: SqlError) -> ToolError {
    if e.is_caller_error() {
        ToolError::respond(e.to_string(), e.hint())
    } else {
        ToolError::Fatal(e.to_string())
    }
}

async fn run_query(
    sql: String,
    inputs: Vec<Input>,
    limits: QueryLimits,
    store_as: StoreAs,
    config: &SqlConfig,
    ctx: &RunContext,
    lineage: Lineage,
) -> Result<RunSqlResult, ToolError> {
    let mut query = Query::start(&sql, inputs, &limits)
        .await
        .map_err(sql_error)?;
    let mut held: Vec<RecordBatch> = Vec::new();
    let mut notes = Vec::new();
    if store_as == StoreAs::Value {
        let mut rows = 0usize;
        loop {
            match query.next_batch().await.map_err(sql_error)? {
                None => {
                    let schema = query.schema();
                    if let Some(v) = as_value(&schema, &held, rows) {
                        return Ok(v);
                    }
                    notes.push(format!(
                        "the {rows} rows are more than `store_as: \"value\"` returns \
                         (about {VALUE_MAX_CHARS} characters); stored as a table instead"
                    ));
                    break;
                }
                Some(b) => {
                    rows += b.num_rows();
                    held.push(b);
                    if rows > config.value_rows {
                        notes.push(format!(
                            "more than {} rows: stored as a table instead of returned",
                            config.value_rows
                        ));
                        break;
                    }
                }
            }
        }
    }
    let meta = store_result(&mut query, held, ctx, lineage, None).await?;
    let store = ctx.store.clone();
    let owner = ctx.principal.clone();
    let mut d = blocking("run_sql", move || {
        let opts = SampleOptions::default();
        let table = store.map_table(&owner, &meta.data_ref)?.head(opts.rows)?;
        Ok(describe(&table, opts))
    })
    .await?;
    d.notes.extend(notes);
    Ok(d.into())
}

/// The rows as values when they fit, `None` when they do not.
fn as_value(
    schema: &arrow_schema::SchemaRef,
    batches: &[RecordBatch],
    rows: usize,
) -> Option<RunSqlResult> {
    let columns: Map<String, Value> = schema
        .fields()
        .iter()
        .map(|f| {
            (
                f.name().clone(),
                Value::String(dataref_store::type_name(f.data_type())),
            )
        })
        .collect();
    let mut values = Vec::with_capacity(rows);
    let mut nulls = vec![0u64; schema.fields().len()];
    let mut chars = 0usize;
    for b in batches {
        for row in 0..b.num_rows() {
            let mut out = Vec::with_capacity(b.num_columns());
            for (i, col) in b.columns().iter().enumerate() {
                let (v, _) = dataref_store::cell_to_json(col, row, None);
                let v = significant(v);
                if v.is_null()
                    && let Some(n) = nulls.get_mut(i)
                {
                    *n += 1;
                }
                chars += v.to_string().len() + 1;
                out.push(v);
            }
            values.push(out);
            if chars > VALUE_MAX_CHARS {
                return None;
            }
        }
    }
    let nulls = schema
        .fields()
        .iter()
        .zip(nulls)
        .filter(|&(_, n)| n > 0)
        .map(|(f, n)| (f.name().clone(), Value::from(n)))
        .collect();
    Some(RunSqlResult {
        data_ref: None,
        rows: values.len() as u64,
        columns,
        more_columns: 0,
        nulls,
        sample: Vec::new(),
        sample_note: None,
        values: Some(values),
        notes: Vec::new(),
    })
}

/// What the writer thread is told.
enum Step {
    Batch(RecordBatch),
    /// The query ended: make the table durable. A queue closed without it aborts.
    Finish,
}

/// Streams the result into a new artifact of the caller's on a blocking thread while the
/// engine goes on. If this future is dropped (cancelled, timed out) the queue closes
/// without [`Step::Finish`] and the writer aborts: no partial artifact is left. A result
/// of more than `max_rows` rows is refused (a source's limit), never cut.
pub(crate) async fn store_result(
    query: &mut Query,
    held: Vec<RecordBatch>,
    ctx: &RunContext,
    lineage: Lineage,
    max_rows: Option<u64>,
) -> Result<ArtifactMeta, ToolError> {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Step>(WRITE_QUEUE);
    let store = ctx.store.clone();
    let owner = ctx.principal.clone();
    let schema = query.schema();
    let progress = ctx.progress.clone();
    let span = tracing::Span::current();
    let writer = tokio::task::spawn_blocking(move || -> Result<ArtifactMeta, ToolError> {
        let _in_call = span.enter();
        let mut w = store.create_table(&owner, schema, lineage)?;
        let mut reported = 0u64;
        while let Some(step) = rx.blocking_recv() {
            match step {
                Step::Batch(b) => {
                    w.write(&b)?;
                    let rows = w.rows();
                    if rows >= reported + 100_000 {
                        reported = rows;
                        progress.report(rows as f64, None, Some(format!("{rows} rows stored")));
                    }
                }
                Step::Finish => return Ok(w.finish()?),
            }
        }
        Err(ToolError::respond("the query was stopped", None))
    });
    let feed = async move {
        for b in held {
            if tx.send(Step::Batch(b)).await.is_err() {
                return Ok(());
            }
        }
        let mut rows = 0u64;
        while let Some(b) = query.next_batch().await.map_err(sql_error)? {
            if b.num_rows() == 0 {
                continue;
            }
            rows += b.num_rows() as u64;
            if let Some(max_rows) = max_rows.filter(|m| rows > *m) {
                return Err(crate::support::source_error(
                    dataref_sources::SourceError::TooManyRows { max_rows },
                ));
            }
            // A closed queue means the writer failed; its error is the one to report.
            if tx.send(Step::Batch(b)).await.is_err() {
                return Ok(());
            }
        }
        let _ = tx.send(Step::Finish).await;
        Ok::<(), ToolError>(())
    };
    let fed = feed.await;
    let written = writer
        .await
        .map_err(|e| ToolError::Fatal(format!("run_sql writer ended abnormally: {e}")))?;
    match (fed, written) {
        // The engine's error first: the writer only saw the queue close.
        (Err(e), _) => Err(e),
        (Ok(()), w) => w,
    }
}

/// A float rounded to [`FLOAT_DIGITS`] significant digits; anything else as it is.
fn significant(v: Value) -> Value {
    let Some(x) = v.as_f64().filter(|_| v.is_f64()) else {
        return v;
    };
    format!("{x:.*e}", FLOAT_DIGITS - 1)
        .parse::<f64>()
        .ok()
        .and_then(serde_json::Number::from_f64)
        .map_or(v, Value::Number)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_lose_only_their_last_bit_noise() {
        for (raw, shown) in [
            (14282.780000000002, "14282.78"),
            (-9237.710000000003, "-9237.71"),
            (0.1 + 0.2, "0.3"),
            (1.0 / 3.0, "0.333333333333333"),
            (1e-300, "1e-300"),
        ] {
            assert_eq!(significant(serde_json::json!(raw)).to_string(), shown);
        }
        assert_eq!(significant(serde_json::json!(12)), serde_json::json!(12));
        assert_eq!(significant(serde_json::json!("x")), serde_json::json!("x"));
    }
}
