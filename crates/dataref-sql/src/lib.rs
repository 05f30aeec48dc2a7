//! `run_sql`'s engine: one read-only query over tables the caller already holds, in
//! DataFusion, with no way out to files, URLs or settings.
//!
//! The boundary is what the engine is built with, not a scan of the text:
//!
//! - **Only queries.** The statement is parsed first and only a query (`SELECT`, `WITH`,
//!   `VALUES`, set operations) goes on; anything else is [`SqlError::Refused`] naming its
//!   kind. The plan is then checked again (no DDL, DML or statements: `SELECT … INTO` plans
//!   as a table creation and is refused there).
//! - **Only the inputs.** The catalog holds the inputs and nothing else: no file formats,
//!   table factories or table functions are registered, URL tables are off, and the object
//!   store registry has no store at all, so even a plan that named a file could not open it.
//! - **Bounded.** A memory pool of [`QueryLimits::memory_bytes`] with spilling disabled (a query
//!   that needs more is [`SqlError::OutOfMemory`]); the caller bounds the time (dropping the
//!   stream stops every task of the query).
//!
//! Inputs are the store's memory-mapped batches, handed to the engine without a copy; an
//! [`Input::columns`] source decodes (and validates) only the columns the plan reads.
//!
//! ```no_run
//! # async fn demo(batches: Vec<arrow_array::RecordBatch>, schema: arrow_schema::SchemaRef)
//! # -> Result<(), dataref_sql::SqlError> {
//! let inputs = vec![dataref_sql::Input::new("sales", schema, batches)];
//! let mut q = dataref_sql::Query::start(
//!     "SELECT line, sum(revenue) AS revenue FROM sales GROUP BY line",
//!     inputs,
//!     &dataref_sql::QueryLimits::default(),
//! )
//! .await?;
//! while let Some(batch) = q.next_batch().await? {
//!     println!("{} rows", batch.num_rows());
//! }
//! # Ok(()) }
//! ```

mod dates;
mod engine;
mod error;
mod exact;
mod input;
mod lake;
mod objects;
mod once;
mod paced;
mod shape;
mod sized;
mod traps;

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::SessionStateDefaults;
use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::memory_pool::{GreedyMemoryPool, TrackConsumersPool};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::{SQLOptions, SessionConfig, SessionContext};
use datafusion::sql::parser::{DFParserBuilder, Statement as DfStatement};
use datafusion::sql::sqlparser::ast::{SetExpr, Statement as AstStatement};
use datafusion::sql::sqlparser::dialect::dialect_from_str;
use futures_util::{FutureExt, StreamExt};
use tracing::Instrument;

pub use error::{SqlError, TableColumns};
pub use input::{Columns, Input};
pub use lake::{Lake, LakeFormat};
pub use shape::{Exceeded, MAX_DEPTH, MAX_SELECTS, MAX_TABLES};
pub use traps::Trap;

/// The version of the engine every query runs in, for a table's receipt.
pub const DATAFUSION_VERSION: &str = datafusion::DATAFUSION_VERSION;

/// What one query may use.
#[derive(Debug, Clone)]
pub struct QueryLimits {
    /// The engine's working memory (hash tables, sorts, buffers); the inputs are mapped
    /// files and do not count.
    pub memory_bytes: usize,
    /// Threads the query may use at once (at least 1).
    pub threads: usize,
}

impl Default for QueryLimits {
    fn default() -> Self {
        Self {
            memory_bytes: 512 << 20,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

/// A running query. Dropping it stops the query.
///
/// The query runs on the engine's own runtime (see `engine`), never on the caller's:
/// an operator that computes for a long time without yielding occupies the engine's
/// threads, not the server's, so the caller's time limit still fires and its other requests
/// are still answered.
pub struct Query {
    /// The result's batches, then `Ok(None)`: a queue that closes without it means the
    /// task ended abnormally, never that the result ended.
    batches: tokio::sync::mpsc::Receiver<Result<Option<RecordBatch>, SqlError>>,
    ended: bool,
    schema: SchemaRef,
    source_version: Option<String>,
    /// Stops the query's task when the query is dropped.
    _task: engine::AbortOnDrop,
}

impl std::fmt::Debug for Query {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Query")
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

/// Batches in flight between the engine's task and the caller.
const QUEUE: usize = 2;

impl Query {
    /// Parses, checks and plans `sql` over `inputs`, and starts it on the engine's runtime.
    pub async fn start(
        sql: &str,
        inputs: Vec<Input>,
        limits: &QueryLimits,
    ) -> Result<Self, SqlError> {
        Self::start_with(sql, Tables::Inputs(inputs), Vec::new(), limits).await
    }

    /// Parses, checks and plans `sql` over `tables`, with `params` bound to its
    /// placeholders `$1`, `$2`, … (never spliced into the text), and starts it.
    pub async fn start_with(
        sql: &str,
        tables: Tables,
        params: Vec<Param>,
        limits: &QueryLimits,
    ) -> Result<Self, SqlError> {
        if sql.len() > MAX_SQL_BYTES {
            return Err(SqlError::TooLong {
                bytes: sql.len(),
                limit: MAX_SQL_BYTES,
            });
        }
        // The query's span lasts while its task runs (planned, executed, every batch
        // sent). Its text is recorded only when traces are told to include text, so it
        // reaches neither an exported span nor the log otherwise.
        let span = tracing::info_span!(
            "sql_query",
            db.system.name = "datafusion",
            db.operation.name = "SELECT",
            db.query.text = tracing::field::Empty,
            db.query.parameters = params.len(),
        );
        if dataref_ops::trace::include_text() {
            span.record("db.query.text", sql);
        }
        let sql = sql.to_owned();
        let limits = limits.clone();
        let (tx, batches) = tokio::sync::mpsc::channel(QUEUE);
        let (ready_tx, ready) = tokio::sync::oneshot::channel();
        let job = async move {
            let mut ready_tx = Some(ready_tx);
            let work = drive(&sql, tables, params, &limits, &tx, &mut ready_tx);
            // A panic in the engine (a reader meeting a damaged file, say) fails this query
            // with what happened, and nothing else: the answer is an error, never a cut
            // result, and the server goes on.
            if let Err(panic) = std::panic::AssertUnwindSafe(work).catch_unwind().await {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "no message".to_owned());
                let e = SqlError::Engine(format!("{what} (nothing was stored)"));
                match ready_tx.take() {
                    Some(r) => {
                        let _ = r.send(Err(e));
                    }
                    None => {
                        let _ = tx.send(Err(e)).await;
                    }
                }
            }
        };
        let task = engine::spawn(job.instrument(span))?;
        let (schema, source_version) = ready
            .await
            .map_err(|_| SqlError::Engine("the query's task ended without an answer".into()))??;
        Ok(Self {
            batches,
            ended: false,
            schema,
            source_version,
            _task: task,
        })
    }

    /// The version of a lake's files as the query's listing found them: their count,
    /// bytes, newest time and a hash over names, sizes, times and ETags. `None` for a query
    /// over stored tables.
    pub fn source_version(&self) -> Option<&str> {
        self.source_version.as_deref()
    }

    /// The result's schema.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// The next batch of the result, or `None` at its end.
    pub async fn next_batch(&mut self) -> Result<Option<RecordBatch>, SqlError> {
        if self.ended {
            return Ok(None);
        }
        match self.batches.recv().await {
            Some(Ok(Some(batch))) => Ok(Some(batch)),
            Some(Ok(None)) => {
                self.ended = true;
                Ok(None)
            }
            Some(Err(e)) => Err(e),
            // The task is gone without saying the result ended (a panic in the engine): a
            // cut result must never pass for a whole one.
            None => Err(SqlError::Engine(
                "the query's task ended before its result did".into(),
            )),
        }
    }
}

type Ready = tokio::sync::oneshot::Sender<Result<(SchemaRef, Option<String>), SqlError>>;
type Sent = tokio::sync::mpsc::Sender<Result<Option<RecordBatch>, SqlError>>;

/// Plans and runs the query on the engine's runtime: the schema (or the error) goes to
/// `ready`, then the batches and `Ok(None)` (or an error) to `tx`.
async fn drive(
    sql: &str,
    tables: Tables,
    params: Vec<Param>,
    limits: &QueryLimits,
    tx: &Sent,
    ready: &mut Option<Ready>,
) {
    let running = match Running::start(sql, tables, params, limits).await {
        Ok(r) => r,
        Err(e) => {
            if let Some(r) = ready.take() {
                let _ = r.send(Err(e));
            }
            return;
        }
    };
    let Running {
        mut stream,
        tables,
        memory_bytes,
        version,
    } = running;
    if ready
        .take()
        .is_none_or(|r| r.send(Ok((stream.schema(), version))).is_err())
    {
        return;
    }
    while let Some(item) = stream.next().await {
        let item = item
            .map(Some)
            .map_err(|e| SqlError::from_engine(e, sql, &tables, memory_bytes));
        let failed = item.is_err();
        if tx.send(item).await.is_err() || failed {
            return;
        }
    }
    let _ = tx.send(Ok(None)).await;
}

/// A query planned and started, on the engine's runtime.
struct Running {
    stream: SendableRecordBatchStream,
    tables: Vec<TableColumns>,
    memory_bytes: usize,
    /// A lake's version as its listing found it.
    version: Option<String>,
}

impl Running {
    async fn start(
        sql: &str,
        tables: Tables,
        params: Vec<Param>,
        limits: &QueryLimits,
    ) -> Result<Self, SqlError> {
        let memory = limits.memory_bytes;
        let (ctx, tables, version) = match tables {
            Tables::Inputs(inputs) => {
                let columns: Vec<TableColumns> = inputs.iter().map(TableColumns::of).collect();
                let ctx = context(inputs, lake::Stores::default(), limits)
                    .map_err(|e| SqlError::from_engine(e, sql, &columns, memory))?;
                (ctx, columns, None)
            }
            Tables::Lake(lake) => {
                let ctx = context(Vec::new(), lake.stores()?, limits)
                    .map_err(|e| SqlError::from_engine(e, sql, &[], memory))?;
                let (table, schema, version) = lake.table(&ctx).await?;
                ctx.register_table(lake.name.as_str(), table)
                    .map_err(|e| SqlError::from_engine(e, sql, &[], memory))?;
                let columns = vec![TableColumns {
                    name: lake.name.clone(),
                    columns: schema.fields().iter().map(|f| f.name().clone()).collect(),
                }];
                (ctx, columns, Some(version))
            }
        };
        let fail = |e| SqlError::from_engine(e, sql, &tables, memory);
        let state = ctx.state();
        let mut statements = parse(sql, &state).map_err(fail)?;
        if statements.len() > 1 {
            return Err(SqlError::Refused {
                kind: "a second statement".to_owned(),
            });
        }
        let Some(statement) = statements.pop_front() else {
            return Err(fail(datafusion::error::DataFusionError::Plan(
                "there is no statement to run".to_owned(),
            )));
        };
        check_statement(&statement)?;
        // Kept for a second try when two expressions come out with one name.
        let again = statement.clone();
        let plan = match state.statement_to_plan(statement).await {
            Ok(plan) => plan,
            Err(e) => match casts_named(again) {
                Some(renamed) if error::duplicate_name(&e) => state
                    .statement_to_plan(renamed)
                    .await
                    .map_err(|_| fail(e))?,
                _ => return Err(fail(e)),
            },
        };
        let plan = if params.is_empty() {
            plan
        } else {
            let values: Vec<datafusion::scalar::ScalarValue> =
                params.into_iter().map(Param::into_scalar).collect();
            plan.with_param_values(values).map_err(fail)?
        };
        check_plan(&plan)?;
        check_names(plan.schema().inner())?;
        let frame = ctx.execute_logical_plan(plan).await.map_err(fail)?;
        let task = Arc::new(frame.task_ctx());
        let physical = frame.create_physical_plan().await.map_err(fail)?;
        let physical = paced::pace(physical).map_err(fail)?;
        let stream = datafusion::physical_plan::execute_stream(physical, task).map_err(fail)?;
        Ok(Self {
            stream,
            tables,
            memory_bytes: memory,
            version,
        })
    }
}

/// `statement` with each CAST given to a function wrapped in `coalesce(…)`, if it has one:
/// the same value and type, under a name of its own. DataFusion leaves a CAST out of an
/// expression's name, so in `SELECT sum(x) AS a, sum(CAST(x AS BIGINT)) AS b` both sums
/// are `sum(x)` to it and the valid query is refused as naming one column twice.
fn casts_named(mut statement: DfStatement) -> Option<DfStatement> {
    use datafusion::sql::sqlparser::ast::{
        Expr, FunctionArg, FunctionArgExpr, FunctionArguments, ObjectName, visit_expressions_mut,
    };
    let DfStatement::Statement(s) = &mut statement else {
        return None;
    };
    let mut changed = false;
    let _ = visit_expressions_mut(s.as_mut(), |e| {
        if let Expr::Function(f) = e
            && let FunctionArguments::List(list) = &mut f.args
        {
            for arg in &mut list.args {
                if let FunctionArg::Unnamed(FunctionArgExpr::Expr(x)) = arg
                    && matches!(x, Expr::Cast { .. })
                {
                    let cast = std::mem::replace(
                        x,
                        Expr::value(datafusion::sql::sqlparser::ast::Value::Null),
                    );
                    let mut call = f_coalesce();
                    if let FunctionArguments::List(l) = &mut call.args {
                        l.args = vec![FunctionArg::Unnamed(FunctionArgExpr::Expr(cast))];
                    }
                    *x = Expr::Function(call);
                    changed = true;
                }
            }
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
    fn f_coalesce() -> datafusion::sql::sqlparser::ast::Function {
        datafusion::sql::sqlparser::ast::Function {
            name: ObjectName::from(vec![datafusion::sql::sqlparser::ast::Ident::new(
                "coalesce",
            )]),
            uses_odbc_syntax: false,
            parameters: FunctionArguments::None,
            args: FunctionArguments::List(datafusion::sql::sqlparser::ast::FunctionArgumentList {
                duplicate_treatment: None,
                args: Vec::new(),
                clauses: Vec::new(),
            }),
            filter: None,
            null_treatment: None,
            over: None,
            within_group: Vec::new(),
        }
    }
    changed.then_some(statement)
}

/// The longest SQL text: a query a model writes is a few hundred bytes; the depth and size
/// limits of `shape` bound what the engine plans.
pub const MAX_SQL_BYTES: usize = 100_000;

/// The result's columns are stored and described by name: two of one name would be one
/// column in the description and two in the rows.
fn check_names(schema: &arrow_schema::Schema) -> Result<(), SqlError> {
    let mut seen = std::collections::HashSet::new();
    let mut twice: Vec<String> = Vec::new();
    for f in schema.fields() {
        if !seen.insert(f.name().as_str()) && !twice.contains(f.name()) {
            twice.push(f.name().clone());
        }
    }
    if twice.is_empty() {
        return Ok(());
    }
    Err(SqlError::DuplicateColumns { names: twice })
}

/// What a query reads.
#[derive(Debug)]
pub enum Tables {
    /// Tables the caller holds, by the names the SQL uses.
    Inputs(Vec<Input>),
    /// One table of files, and the store they are in.
    Lake(Lake),
}

/// A value bound to a placeholder.
#[derive(Debug, Clone, PartialEq)]
pub enum Param {
    Null,
    Integer(i64),
    Real(f64),
    Text(String),
}

impl Param {
    fn into_scalar(self) -> datafusion::scalar::ScalarValue {
        use datafusion::scalar::ScalarValue;
        match self {
            Self::Null => ScalarValue::Null,
            Self::Integer(i) => ScalarValue::Int64(Some(i)),
            Self::Real(r) => ScalarValue::Float64(Some(r)),
            Self::Text(t) => ScalarValue::Utf8(Some(t)),
        }
    }
}

/// A session that knows the inputs (and the stores of `stores`) and nothing else.
fn context(
    inputs: Vec<Input>,
    stores: lake::Stores,
    limits: &QueryLimits,
) -> datafusion::error::Result<SessionContext> {
    let threads = limits.threads.max(1);
    let mut config = SessionConfig::new()
        .with_target_partitions(threads)
        .with_information_schema(false)
        .with_create_default_catalog_and_schema(true);
    let options = config.options_mut();
    // Positions in errors, so the model can find what to fix.
    options.sql_parser.collect_spans = true;
    // A lake's Parquet files: filters are applied while decoding, so rows (and pages) a
    // filter drops are never materialised.
    options.execution.parquet.pushdown_filters = true;
    let runtime = RuntimeEnvBuilder::new()
        .with_memory_pool(Arc::new(TrackConsumersPool::new(
            GreedyMemoryPool::new(limits.memory_bytes),
            std::num::NonZeroUsize::MIN.saturating_add(2),
        )))
        .with_disk_manager_builder(
            DiskManagerBuilder::default().with_mode(DiskManagerMode::Disabled),
        )
        .with_object_store_registry(Arc::new(stores))
        .build_arc()?;
    let state = SessionStateBuilder::new()
        .with_config(config)
        .with_runtime_env(runtime)
        .with_expr_planners(SessionStateDefaults::default_expr_planners())
        .with_scalar_functions(sized::bound(
            SessionStateDefaults::default_scalar_functions(),
            limits.memory_bytes,
        ))
        .with_aggregate_functions(SessionStateDefaults::default_aggregate_functions())
        .with_window_functions(SessionStateDefaults::default_window_functions())
        .with_analyzer_rule(Arc::new(exact::Exact))
        .with_analyzer_rule(Arc::new(dates::DateTruncOnDays))
        .with_analyzer_rule(Arc::new(once::ComputeOnce))
        .build();
    let ctx = SessionContext::new_with_state(state);
    for input in inputs {
        let name = input.name.clone();
        ctx.register_table(name.as_str(), input.into_table(threads))?;
    }
    Ok(ctx)
}

/// The statements of `sql`, parsed as the session would, all of them: the engine's own
/// parse stops at a second one with only "not supported", where we refuse it by kind.
fn parse(
    sql: &str,
    state: &datafusion::execution::session_state::SessionState,
) -> datafusion::error::Result<std::collections::VecDeque<DfStatement>> {
    let options = state.config().options();
    let name = options.sql_parser.dialect;
    let dialect = dialect_from_str(name).ok_or_else(|| {
        datafusion::error::DataFusionError::Plan(format!("no SQL dialect `{name}`"))
    })?;
    DFParserBuilder::new(sql)
        .with_dialect(dialect.as_ref())
        .with_recursion_limit(options.sql_parser.recursion_limit.get())
        .build()?
        .parse_statements()
}

/// Only a query goes on; every other kind is refused by name.
fn check_statement(statement: &DfStatement) -> Result<(), SqlError> {
    let kind = match statement {
        DfStatement::Statement(s) => match s.as_ref() {
            AstStatement::Query(q) => {
                // Measured first: the walks below and every later stage recurse over it.
                shape::check(s).map_err(SqlError::TooComplex)?;
                traps::check(s).map_err(SqlError::Unreliable)?;
                // `SELECT … INTO t` is a query in the grammar but creates a table.
                if !selects_into(&q.body) {
                    return Ok(());
                }
                "SELECT … INTO".to_owned()
            }
            other => statement_kind(other),
        },
        DfStatement::CreateExternalTable(_) => "CREATE EXTERNAL TABLE".to_owned(),
        DfStatement::CopyTo(_) => "COPY".to_owned(),
        DfStatement::Explain(_) => "EXPLAIN".to_owned(),
        DfStatement::Reset(_) => "RESET".to_owned(),
    };
    Err(SqlError::Refused { kind })
}

/// Whether a query's body (or a branch of its set operation) is a `SELECT … INTO`.
fn selects_into(body: &SetExpr) -> bool {
    match body {
        SetExpr::Select(s) => s.into.is_some(),
        SetExpr::Query(q) => selects_into(&q.body),
        SetExpr::SetOperation { left, right, .. } => selects_into(left) || selects_into(right),
        _ => false,
    }
}

/// The statement's leading keywords (`CREATE TABLE`, `SET`, …), from its own rendering.
fn statement_kind(s: &AstStatement) -> String {
    let text = s.to_string();
    let words: Vec<&str> = text
        .split_whitespace()
        .take_while(|w| w.chars().all(|c| c.is_ascii_alphabetic()))
        .take(2)
        .collect();
    match words.as_slice() {
        [] => "this statement".to_owned(),
        [one] => one.to_ascii_uppercase(),
        [first, second]
            if matches!(
                first.to_ascii_uppercase().as_str(),
                "CREATE" | "DROP" | "ALTER" | "SHOW"
            ) =>
        {
            format!(
                "{} {}",
                first.to_ascii_uppercase(),
                second.to_ascii_uppercase()
            )
        }
        [first, ..] => first.to_ascii_uppercase(),
    }
}

/// The plan again: a query may still plan as something else (`SELECT … INTO` creates a
/// table), and DataFusion's own check sees every subquery.
fn check_plan(plan: &LogicalPlan) -> Result<(), SqlError> {
    let kind = match plan {
        LogicalPlan::Ddl(d) => Some(d.name().to_owned()),
        LogicalPlan::Dml(_) => Some("a write".to_owned()),
        LogicalPlan::Copy(_) => Some("COPY".to_owned()),
        LogicalPlan::Statement(_) => Some("a statement".to_owned()),
        LogicalPlan::Explain(_) | LogicalPlan::Analyze(_) => Some("EXPLAIN".to_owned()),
        LogicalPlan::DescribeTable(_) => Some("DESCRIBE".to_owned()),
        _ => None,
    };
    if let Some(kind) = kind {
        return Err(SqlError::Refused { kind });
    }
    SQLOptions::new()
        .with_allow_ddl(false)
        .with_allow_dml(false)
        .with_allow_statements(false)
        .verify_plan(plan)
        .map_err(|e| SqlError::Refused {
            kind: e.message().into_owned(),
        })
}
