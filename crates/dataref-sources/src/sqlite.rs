//! The SQLite producer: one read-only statement, streamed into a table artifact.
//!
//! A fetch opens its own read-only connection, installs the [authorizer](guard) and a
//! progress handler (deadline and cancellation), prepares and binds the statement, fixes
//! the Arrow schema (declared in config, else declared in SQLite, else inferred from the
//! first [`INFER_ROWS`] rows), and then appends rows to per-column builders, writing a
//! batch of [`BATCH_ROWS`] rows to the store at a time. At no point is more than one batch
//! (plus the inference rows) held in memory.

mod columns;
mod guard;
mod params;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use arrow_schema::{Field, Schema, SchemaRef};
use dataref_config::{ColumnType, SourceConfig, SourceKind};
use dataref_protocol::Principal;
use dataref_store::{ArtifactMeta, ArtifactStore, Lineage, TableWriter};
use rusqlite::types::ValueRef;
use rusqlite::{Connection, ErrorCode, OpenFlags, Row, Statement};

use self::columns::Builder;
use self::guard::{Refusals, Stop, StopState};
use crate::SourceError;

pub use self::params::bind_params;

/// Rows per Arrow batch written to the store.
const BATCH_ROWS: usize = 65_536;
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
    lineage: Lineage,
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
        scope.spawn(move || {
            loop {
                match done_rx.recv_timeout(CANCEL_POLL) {
                    Err(RecvTimeoutError::Timeout) => {
                        if is_cancelled() {
                            watched.cancel();
                            return;
                        }
                    }
                    Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
                }
            }
        });
        let result = run(&conn, &ctx, store, owner, lineage, progress, is_cancelled);
        drop(done);
        result
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
    store: &dyn ArtifactStore,
    owner: &Principal,
    lineage: Lineage,
    progress: &(dyn Fn(u64) + Sync),
    is_cancelled: &(dyn Fn() -> bool + Sync),
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
    let mut sink = Sink {
        columns: names
            .into_iter()
            .zip(types)
            .map(|(name, ty)| Column {
                name,
                ty,
                builder: Builder::new(ty, BATCH_ROWS),
            })
            .collect(),
        schema,
        writer,
        in_batch: 0,
        total: 0,
        max_rows: req.source.max_rows,
        progress,
        is_cancelled,
        stop: &ctx.stop,
    };
    for values in &head {
        sink.push(|i| Ok(values[i].as_ref()), ctx)?;
    }
    drop(head);
    while let Some(row) = rows.next().map_err(|e| ctx.classify(e))? {
        sink.push_row(row, ctx)?;
    }
    sink.finish()
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

/// The builders of the batch being filled and the writer the full batches go to.
/// Dropping a sink without [`Sink::finish`] drops the writer, which removes the partial
/// artifact: every error path after `create_table` relies on that.
struct Sink<'a> {
    columns: Vec<Column>,
    schema: SchemaRef,
    writer: Box<dyn TableWriter>,
    in_batch: usize,
    total: u64,
    max_rows: u64,
    progress: &'a (dyn Fn(u64) + Sync),
    is_cancelled: &'a (dyn Fn() -> bool + Sync),
    stop: &'a StopState,
}

impl Sink<'_> {
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
        for (i, col) in self.columns.iter_mut().enumerate() {
            let v = cell(i).map_err(|e| ctx.classify(e))?;
            if col.builder.append(v).is_err() {
                return Err(SourceError::TypeChange {
                    column: col.name.clone(),
                    row: self.total + 1,
                    expected: columns::expected(col.ty).into(),
                    found: columns::found(v),
                });
            }
        }
        self.total += 1;
        self.in_batch += 1;
        if self.in_batch == BATCH_ROWS {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), SourceError> {
        let arrays = self
            .columns
            .iter_mut()
            .map(|c| c.builder.finish(BATCH_ROWS))
            .collect();
        let batch = RecordBatch::try_new(self.schema.clone(), arrays)
            .map_err(|e| SourceError::Store(e.into()))?;
        self.writer.write(&batch)?;
        self.in_batch = 0;
        (self.progress)(self.total);
        // Between batches the fetch is in our code, not SQLite's, so the progress handler
        // cannot see a cancellation here.
        if self.stop.is_cancelled() || (self.is_cancelled)() {
            return Err(SourceError::Cancelled);
        }
        Ok(())
    }

    fn finish(mut self) -> Result<ArtifactMeta, SourceError> {
        if self.in_batch > 0 {
            self.flush()?;
        }
        Ok(self.writer.finish()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicate_names_get_suffixes() {
        assert_eq!(
            unique_names(["id", "id", "x", "id", "id_2"].into_iter()),
            ["id", "id_2", "x", "id_3", "id_2_2"]
        );
    }

    #[test]
    fn declarations_match_case_insensitively() {
        let d = BTreeMap::from([("Day".to_owned(), ColumnType::Date)]);
        assert_eq!(declared(&d, "day"), Some(ColumnType::Date));
        assert_eq!(declared(&d, "Day"), Some(ColumnType::Date));
        assert_eq!(declared(&d, "night"), None);
    }
}
