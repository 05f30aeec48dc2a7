//! The SQLite producer: one read-only statement, streamed into a table artifact.
//!
//! A fetch opens its own read-only connection, installs the [authorizer](guard) and a
//! progress handler (deadline and cancellation), prepares and binds the statement, fixes
//! the Arrow schema (declared in config, else declared in SQLite, else inferred from the
//! first [`INFER_ROWS`] rows), and then appends rows to per-column builders, closing a
//! batch every [`BATCH_ROWS`] rows (or sooner, at [`BATCH_BYTES`] of text and blobs).
//! Stepping and building run on the calling thread; each full batch goes through a
//! bounded queue to a writer thread that encodes and writes it ([`pipeline`]), so the two
//! overlap. At no point are more than a few batches (plus the inference rows) in memory.

mod columns;
mod guard;
mod params;
mod pipeline;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::panic::{self, AssertUnwindSafe};
use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{Field, Schema, SchemaRef};
use dataref_config::{ColumnType, SourceConfig, SourceKind};
use dataref_protocol::Principal;
use dataref_store::{ArtifactMeta, ArtifactStore, Lineage};
use rusqlite::types::ValueRef;
use rusqlite::{Connection, ErrorCode, OpenFlags, Row, Statement};

use self::columns::Builder;
use self::guard::{Refusals, Stop, StopState};
use self::pipeline::Batches;
use crate::SourceError;

pub use self::params::bind_params;

/// Rows per Arrow batch written to the store. Large enough that the per-batch costs (IPC
/// framing, a progress report, a channel hand-off) vanish, small enough that the writer
/// starts early and a batch of the sample (~4.6 MB) is cheap to hold twice over.
const BATCH_ROWS: usize = 65_536;
/// A batch also ends once its text and blob columns hold this many bytes, so wide rows
/// keep memory bounded and a column's 32-bit offsets cannot overflow.
const BATCH_BYTES: usize = 16 << 20;
/// Cells per batch, at most: a result of many columns gets fewer rows per batch (never
/// under [`MIN_BATCH_ROWS`]), so the few batches in flight between the two threads stay
/// around 8 MiB of fixed-width values each, however wide the rows.
const BATCH_CELLS: usize = 1 << 20;
const MIN_BATCH_ROWS: usize = 1_024;
/// Rows looked at to choose the type of a column nobody declared.
const INFER_ROWS: usize = 1_024;
/// How often the watcher thread asks the caller whether the fetch was cancelled.
const CANCEL_POLL: Duration = Duration::from_millis(20);
/// The longest a fetch waits for a writer's lock on the file. The wait happens outside
/// the progress handler, so it is kept short rather than tied to the source timeout.
const BUSY_WAIT: Duration = Duration::from_secs(5);

/// A bound parameter value.
#[derive(Debug, Clone, PartialEq)]
pub enum ParamValue {
    Null,
    Integer(i64),
    Real(f64),
    Text(String),
}

impl FetchRequest<'_> {
    /// The value of each placeholder name, in order, as `convert` makes it; a name with no
    /// value is an error naming it.
    pub(crate) fn bind<T>(
        &self,
        names: &[String],
        convert: impl Fn(&ParamValue) -> T,
    ) -> Result<Vec<T>, SourceError> {
        names
            .iter()
            .map(|name| match self.params.iter().find(|(n, _)| n == name) {
                Some((_, v)) => Ok(convert(v)),
                None => Err(SourceError::BadParam {
                    name: name.clone(),
                    message: "the SQL has this placeholder but no value was given for it".into(),
                }),
            })
            .collect()
    }
}

/// How much the SQL is trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SqlPolicy {
    /// SQL written by the operator in dataref.toml. Still read-only.
    Configured,
    /// SQL written by the model (`query` tool): read-only, no ATTACH, no state-changing
    /// pragmas, one statement.
    Generic,
}

/// One statement to run on a source.
#[derive(Debug, Clone)]
pub struct FetchRequest<'a> {
    pub source: &'a SourceConfig,
    pub sql: &'a str,
    pub params: Vec<(String, ParamValue)>,
    /// Declared column types, overriding what the source reports.
    pub declared: &'a BTreeMap<String, ColumnType>,
    pub policy: SqlPolicy,
}

/// Runs `req` and streams the rows into a new table artifact owned by `owner`.
/// `progress` is called with the rows so far after each batch; `is_cancelled` is polled
/// while the statement runs (cancellation removes the partial artifact).
///
/// Both policies get the same guards: a read-only connection, the authorizer, exactly one
/// statement, and `sqlite3_stmt_readonly`. Operator SQL is trusted to be sensible, not to
/// be harmless, and the checks cost nothing per row.
pub fn fetch(
    req: &FetchRequest<'_>,
    store: &dyn ArtifactStore,
    owner: &Principal,
    mut lineage: Lineage,
    progress: &(dyn Fn(u64) + Sync),
    is_cancelled: &(dyn Fn() -> bool + Sync),
) -> Result<ArtifactMeta, SourceError> {
    let started = Instant::now();
    let SourceKind::Sqlite { path } = &req.source.kind else {
        return Err(SourceError::Open {
            source_name: req.source.name.clone(),
            message: "not a SQLite source".into(),
        });
    };
    let mut conn = open(req.source, path)?;
    lineage.set_source_version(file_version(path));
    let setup_failed = |e: rusqlite::Error| SourceError::Open {
        source_name: req.source.name.clone(),
        message: format!("cannot set up the connection: {e}"),
    };
    let refusals = guard::install_authorizer(&mut conn).map_err(setup_failed)?;
    let stop = StopState::default();
    guard::install_progress_handler(&mut conn, req.source.timeout, &stop).map_err(setup_failed)?;
    if is_cancelled() {
        return Err(SourceError::Cancelled);
    }

    let ctx = Ctx {
        req,
        refusals,
        stop,
    };
    // The progress handler must be `'static`, so it cannot call the borrowed
    // `is_cancelled`; a scoped thread polls it instead and raises a flag the handler reads.
    let meta = std::thread::scope(|scope| {
        let (done, done_rx) = mpsc::channel::<()>();
        let watched = ctx.stop.clone();
        let watcher = std::thread::Builder::new()
            .name("dataref-sqlite-cancel".into())
            .spawn_scoped(scope, move || {
                loop {
                    match done_rx.recv_timeout(CANCEL_POLL) {
                        Err(RecvTimeoutError::Timeout) => {
                            // A panicking `is_cancelled` stops the fetch too.
                            let asked = panic::catch_unwind(AssertUnwindSafe(is_cancelled));
                            if !matches!(asked, Ok(false)) {
                                watched.cancel();
                                return asked.err();
                            }
                        }
                        Ok(()) | Err(RecvTimeoutError::Disconnected) => return None,
                    }
                }
            })
            .map_err(|e| pipeline::internal(path, "cannot start the cancellation watcher", &e))?;
        let cx = pipeline::Context {
            database: path,
            stop: &ctx.stop,
            progress,
            is_cancelled,
        };
        let result = run(&conn, &ctx, &cx, store, owner, lineage);
        drop(done);
        match watcher.join() {
            Ok(None) => result,
            // The artifact is committed by now: an error would leave it stored unreported.
            Ok(Some(_)) | Err(_) if result.is_ok() => {
                tracing::warn!(database = %path.display(), "the cancellation check panicked after the fetch had finished");
                result
            }
            Ok(Some(payload)) | Err(payload) => Err(pipeline::panicked(
                path,
                "the cancellation check",
                payload.as_ref(),
            )),
        }
    })?;
    tracing::debug!(
        source = %req.source.name,
        rows = meta.rows,
        bytes = meta.bytes,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "fetched"
    );
    Ok(meta)
}

/// Files at most this large are hashed for a receipt; larger ones are named by size and
/// modification time only (hashing them would cost every fetch a full read).
const HASHED_BYTES: u64 = 64 << 20;

/// The database file's version for a receipt: its size and modification time, its content
/// hash when it is at most [`HASHED_BYTES`], and the same of its write-ahead log when there
/// is one (committed changes live there until a checkpoint). `PRAGMA data_version` is no
/// version: it counts changes seen by one connection, and each fetch opens its own.
/// Read just before the statement's read transaction starts; `None` when the file cannot
/// be looked at.
fn file_version(path: &Path) -> Option<String> {
    let main = file_state(path)?;
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    match file_state(Path::new(&wal)) {
        Some(wal) if !wal.starts_with("0 bytes") => Some(format!("{main}; wal {wal}")),
        _ => Some(main),
    }
}

#[expect(
    clippy::disallowed_methods,
    reason = "the source's own database file, which this crate opens anyway"
)]
fn file_state(path: &Path) -> Option<String> {
    let file = std::fs::File::open(path).ok()?;
    let meta = file.metadata().ok()?;
    let modified = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| {
            let secs = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
            let at = dataref_protocol::Timestamp(secs).to_string();
            format!(
                ", modified {}.{:09}Z",
                at.trim_end_matches('Z'),
                d.subsec_nanos()
            )
        })
        .unwrap_or_default();
    let mut text = format!("{} bytes{modified}", meta.len());
    if meta.len() <= HASHED_BYTES {
        match dataref_store::Checksum::of_file(&file) {
            Ok((_, sum)) => text.push_str(&format!(", {sum}")),
            Err(_) => return Some(text),
        }
    }
    Some(text)
}

fn open(source: &SourceConfig, path: &Path) -> Result<Connection, SourceError> {
    let open_failed = |e: rusqlite::Error| SourceError::Open {
        source_name: source.name.clone(),
        message: format!("`{}`: {e}", path.display()),
    };
    // No SQLITE_OPEN_URI: the configured path is a file name, never `file:…?mode=rw`.
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(open_failed)?;
    conn.busy_timeout(BUSY_WAIT.min(source.timeout))
        .map_err(open_failed)?;
    Ok(conn)
}

/// What error classification needs to know about the running fetch.
struct Ctx<'r, 'a> {
    req: &'r FetchRequest<'a>,
    refusals: Refusals,
    stop: StopState,
}

impl Ctx<'_, '_> {
    /// Turns a SQLite error into what the caller can act on, by its code.
    #[cold]
    fn classify(&self, e: rusqlite::Error) -> SourceError {
        // A refusal always fails the prepare, but not always with SQLITE_AUTH: a refused
        // function is reported as a plain SQLITE_ERROR. What the authorizer recorded is
        // the reliable signal.
        if let Some(what) = self.refusals.first() {
            return SourceError::NotAllowed { what };
        }
        match e {
            rusqlite::Error::SqliteFailure(failure, message) => match failure.code {
                // Only reachable if SQLite refuses on its own account.
                ErrorCode::AuthorizationForStatementDenied => SourceError::NotAllowed {
                    what: "a statement this source does not allow".into(),
                },
                ErrorCode::OperationInterrupted => match self.stop.reason() {
                    Stop::Timeout => SourceError::Timeout {
                        after: self.req.source.timeout,
                    },
                    Stop::Cancelled => SourceError::Cancelled,
                },
                ErrorCode::ReadOnly => SourceError::NotAllowed {
                    what: "writing to the source".into(),
                },
                ErrorCode::NotADatabase
                | ErrorCode::CannotOpen
                | ErrorCode::DatabaseCorrupt
                | ErrorCode::SystemIoFailure => SourceError::Open {
                    source_name: self.req.source.name.clone(),
                    message: message.unwrap_or_else(|| failure.to_string()),
                },
                _ => SourceError::Sql {
                    message: message.unwrap_or_else(|| failure.to_string()),
                },
            },
            rusqlite::Error::MultipleStatement => SourceError::NotAllowed {
                what: "more than one statement (send one statement per call)".into(),
            },
            rusqlite::Error::Empty => SourceError::Sql {
                message: "the SQL is empty".into(),
            },
            other => SourceError::Sql {
                message: other.to_string(),
            },
        }
    }
}

fn run(
    conn: &Connection,
    ctx: &Ctx<'_, '_>,
    cx: &pipeline::Context<'_>,
    store: &dyn ArtifactStore,
    owner: &Principal,
    lineage: Lineage,
) -> Result<ArtifactMeta, SourceError> {
    let req = ctx.req;
    let mut stmt = conn.prepare(req.sql).map_err(|e| ctx.classify(e))?;
    if !stmt.readonly() {
        return Err(SourceError::NotAllowed {
            what: "a statement that writes to the database".into(),
        });
    }
    bind(&mut stmt, &req.params)?;
    if stmt.column_count() == 0 {
        return Err(SourceError::Sql {
            message: "the statement returns no columns; run a SELECT".into(),
        });
    }
    let names = unique_names(stmt.column_names());
    let fixed: Vec<Option<ColumnType>> = stmt
        .columns()
        .map(|c| {
            declared(req.declared, c.name())
                .or_else(|| c.decl_type().and_then(ColumnType::from_decl))
        })
        .collect();
    for name in req.declared.keys() {
        if !names.iter().any(|n| n.eq_ignore_ascii_case(name)) {
            tracing::warn!(column = %name, "a declared column type names no result column");
        }
    }

    let n = names.len();
    let mut rows = stmt.raw_query();
    // Owned copies of the first rows, only when some column's type must be inferred
    // from them; they are replayed into the builders below.
    let mut head: Vec<Vec<OwnedCell>> = Vec::new();
    if fixed.iter().any(Option::is_none) {
        while head.len() < INFER_ROWS {
            let Some(row) = rows.next().map_err(|e| ctx.classify(e))? else {
                break;
            };
            let values = (0..n)
                .map(|i| row.get_ref(i).map(OwnedCell::from))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| ctx.classify(e))?;
            head.push(values);
        }
    }
    let types: Vec<ColumnType> = fixed
        .iter()
        .enumerate()
        .map(|(i, ty)| ty.unwrap_or_else(|| columns::infer(head.iter().map(|r| r[i].as_ref()))))
        .collect();
    let schema: SchemaRef = Arc::new(Schema::new(
        names
            .iter()
            .zip(&types)
            .map(|(name, ty)| Field::new(name, columns::arrow_type(*ty), true))
            .collect::<Vec<_>>(),
    ));

    let writer = store.create_table(owner, schema.clone(), lineage)?;
    let mut batch = Batch::new(names, types, schema, req.source.max_rows);
    pipeline::overlap(writer, cx, |out| {
        let streamed = (|| {
            for values in &head {
                batch.push(|i| Ok(values[i].as_ref()), ctx)?;
                batch.send_if_full(out)?;
            }
            drop(head);
            while let Some(row) = rows.next().map_err(|e| ctx.classify(e))? {
                batch.push_row(row, ctx)?;
                batch.send_if_full(out)?;
            }
            if batch.rows > 0 {
                out.send(batch.take()?)?;
            }
            Ok(())
        })();
        // Text is checked for UTF-8 when its batch closes; text that was not, in the rows
        // before whatever stopped the fetch, is what a row-by-row check would have found.
        streamed.map_err(|e| batch.invalid_text().unwrap_or(e))
    })
}

/// Binds every parameter by name. A declared parameter the SQL does not use is skipped;
/// a placeholder in the SQL with no value is an error, because SQLite would quietly bind
/// NULL and the query would match nothing.
fn bind(stmt: &mut Statement<'_>, params: &[(String, ParamValue)]) -> Result<(), SourceError> {
    let bind_failed = |e: rusqlite::Error| SourceError::Sql {
        message: e.to_string(),
    };
    let mut bound = vec![false; stmt.parameter_count() + 1];
    for (name, value) in params {
        let Some(idx) = stmt
            .parameter_index(&format!(":{name}"))
            .map_err(bind_failed)?
        else {
            continue;
        };
        match value {
            ParamValue::Null => stmt.raw_bind_parameter(idx, rusqlite::types::Null),
            ParamValue::Integer(i) => stmt.raw_bind_parameter(idx, i),
            ParamValue::Real(r) => stmt.raw_bind_parameter(idx, r),
            ParamValue::Text(s) => stmt.raw_bind_parameter(idx, s.as_str()),
        }
        .map_err(bind_failed)?;
        bound[idx] = true;
    }
    if let Some(idx) = (1..bound.len()).find(|&i| !bound[i]) {
        let name = stmt.parameter_name(idx).map_or_else(
            || format!("?{idx}"),
            |n| n.trim_start_matches([':', '@', '$']).to_owned(),
        );
        return Err(SourceError::BadParam {
            name,
            message: "the SQL has this placeholder but no value was given for it".into(),
        });
    }
    Ok(())
}

/// SQLite allows two result columns with the same name (`SELECT a.id, b.id`); a table
/// artifact is addressed by column name, so later ones become `id_2`, `id_3`, ….
pub(crate) fn unique_names<'a>(names: impl ExactSizeIterator<Item = &'a str>) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(names.len());
    for name in names {
        let mut candidate = name.to_owned();
        let mut k = 2;
        while out.contains(&candidate) {
            candidate = format!("{name}_{k}");
            k += 1;
        }
        out.push(candidate);
    }
    out
}

/// SQLite column names compare case-insensitively, so a declaration does too, preferring
/// an exact match.
fn declared(declared: &BTreeMap<String, ColumnType>, name: &str) -> Option<ColumnType> {
    declared.get(name).copied().or_else(|| {
        declared
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, ty)| *ty)
    })
}

/// A cell kept past its row (only the inference rows are). Text stays bytes so invalid
/// UTF-8 reaches the column builder and is reported there, like in any other row.
enum OwnedCell {
    Null,
    Integer(i64),
    Real(f64),
    Text(Vec<u8>),
    Blob(Vec<u8>),
}

impl From<ValueRef<'_>> for OwnedCell {
    fn from(v: ValueRef<'_>) -> Self {
        match v {
            ValueRef::Null => Self::Null,
            ValueRef::Integer(i) => Self::Integer(i),
            ValueRef::Real(r) => Self::Real(r),
            ValueRef::Text(t) => Self::Text(t.to_vec()),
            ValueRef::Blob(b) => Self::Blob(b.to_vec()),
        }
    }
}

impl OwnedCell {
    fn as_ref(&self) -> ValueRef<'_> {
        match self {
            Self::Null => ValueRef::Null,
            Self::Integer(i) => ValueRef::Integer(*i),
            Self::Real(r) => ValueRef::Real(*r),
            Self::Text(t) => ValueRef::Text(t),
            Self::Blob(b) => ValueRef::Blob(b),
        }
    }
}

struct Column {
    name: String,
    ty: ColumnType,
    builder: Builder,
}

/// The builders of the batch being filled. Rows go in one at a time; [`Batch::take`]
/// closes the batch as a `RecordBatch` and starts the next.
struct Batch {
    columns: Vec<Column>,
    schema: SchemaRef,
    /// The text and blob columns, whose bytes also bound a batch.
    variable: Vec<usize>,
    /// Rows a batch ends at: [`BATCH_ROWS`], fewer for many columns.
    batch_rows: usize,
    /// Rows in this batch.
    rows: usize,
    /// Rows in all batches, this one included.
    total: u64,
    max_rows: u64,
}

impl Batch {
    fn new(names: Vec<String>, types: Vec<ColumnType>, schema: SchemaRef, max_rows: u64) -> Self {
        let batch_rows = (BATCH_CELLS / types.len().max(1)).clamp(MIN_BATCH_ROWS, BATCH_ROWS);
        let variable = types
            .iter()
            .enumerate()
            .filter(|(_, ty)| matches!(ty, ColumnType::Text | ColumnType::Blob))
            .map(|(i, _)| i)
            .collect();
        Self {
            columns: names
                .into_iter()
                .zip(types)
                .map(|(name, ty)| Column {
                    name,
                    ty,
                    builder: Builder::new(ty, batch_rows),
                })
                .collect(),
            schema,
            variable,
            batch_rows,
            rows: 0,
            total: 0,
            max_rows,
        }
    }

    #[inline]
    fn push_row(&mut self, row: &Row<'_>, ctx: &Ctx<'_, '_>) -> Result<(), SourceError> {
        self.push(|i| row.get_ref(i), ctx)
    }

    #[inline]
    fn push<'v>(
        &mut self,
        cell: impl Fn(usize) -> rusqlite::Result<ValueRef<'v>>,
        ctx: &Ctx<'_, '_>,
    ) -> Result<(), SourceError> {
        if self.total >= self.max_rows {
            return Err(SourceError::TooManyRows {
                max_rows: self.max_rows,
            });
        }
        for i in 0..self.columns.len() {
            let v = cell(i).map_err(|e| ctx.classify(e))?;
            if self.columns[i].builder.append(v).is_err() {
                return Err(self.type_change(i, self.rows, v));
            }
        }
        self.total += 1;
        self.rows += 1;
        Ok(())
    }

    /// Hands the batch to the writer once it is full.
    #[inline]
    fn send_if_full(&mut self, out: &Batches) -> Result<(), SourceError> {
        if self.rows == self.batch_rows || self.variable_bytes() >= BATCH_BYTES {
            out.send(self.take()?)?;
        }
        Ok(())
    }

    #[inline]
    fn variable_bytes(&self) -> usize {
        self.variable
            .iter()
            .map(|&i| self.columns[i].builder.bytes())
            .sum()
    }

    /// The rows so far as a `RecordBatch`; the builders start over.
    fn take(&mut self) -> Result<RecordBatch, SourceError> {
        if let Some(e) = self.invalid_text() {
            return Err(e);
        }
        let arrays = self
            .columns
            .iter_mut()
            .map(|c| c.builder.finish(self.batch_rows))
            .collect::<Result<Vec<ArrayRef>, _>>()
            .map_err(|e| SourceError::Store(e.into()))?;
        self.rows = 0;
        RecordBatch::try_new(self.schema.clone(), arrays).map_err(|e| SourceError::Store(e.into()))
    }

    /// The first text cell of this batch that is not UTF-8, as the error a row-by-row
    /// check would have given.
    #[cold]
    fn invalid_text(&self) -> Option<SourceError> {
        // Row first, then column: the order cells were appended in.
        let (col, index, found) = self
            .variable
            .iter()
            .filter_map(|&i| {
                let (index, found) = self.columns[i].builder.first_invalid_text()?;
                Some((i, index, found))
            })
            .min_by_key(|(i, index, _)| (*index, *i))?;
        Some(self.refused(col, index, found))
    }

    /// A type change at row `index` of this batch.
    #[cold]
    fn type_change(&self, col: usize, index: usize, v: ValueRef<'_>) -> SourceError {
        // A cell refused here comes after any text not yet checked in this batch.
        self.invalid_text()
            .unwrap_or_else(|| self.refused(col, index, columns::found(v)))
    }

    fn refused(&self, col: usize, index: usize, found: String) -> SourceError {
        let column = &self.columns[col];
        let before = self.total - self.rows as u64;
        SourceError::TypeChange {
            column: column.name.clone(),
            row: before + index as u64 + 1,
            expected: columns::expected(column.ty).into(),
            found,
        }
    }
}
