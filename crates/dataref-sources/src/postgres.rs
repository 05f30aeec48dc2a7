//! The PostgreSQL producer: one statement run as the caller's role, streamed from a
//! portal into a table artifact over the binary protocol.
//!
//! Every call takes a connection from a [`PgPool`] and runs, in one transaction:
//!
//! ```sql
//! START TRANSACTION READ ONLY;
//! SET LOCAL ROLE "<the principal's pg_role>";
//! SET LOCAL statement_timeout = <the source's timeout in ms>;
//! -- the statement, bound to a portal and fetched FETCH_ROWS rows at a time
//! SELECT current_user;   -- still the caller's role? (else the result is refused)
//! ROLLBACK;
//! ```
//!
//! so grants and row-level security decide what comes back. The boundary between
//! principals is the pool's *login* role: named queries (operator SQL) run on the source's
//! shared login, model-written SQL ([`SqlPolicy::Generic`]) on a pool that logs in as the
//! caller's own role ([`PgPool::for_role`]), whose connections are refused when the
//! database says that role can become another principal's — so no statement, however it
//! is written, can. Only with the source's `allow_sql_shared_roles` does model SQL run on
//! the shared login; then `set_config` is refused and statements must return rows (so
//! `SET ROLE`/`RESET ROLE` are refused before they run), which narrows but cannot close
//! the gap.
//!
//! The source's timeout is also a client-side deadline (a cancel request), which a
//! statement cannot raise. A connection returns to its pool only after a call that
//! succeeded, an acknowledged ROLLBACK and `pool::SESSION_RESET`; otherwise it is closed.
//! `:name` placeholders become `$1..$n` and are sent as text for the server to read as
//! whatever type it inferred (a date compared with a date column is a date). Cancellation
//! and the timeout remove the partial artifact.

mod decode;
mod pool;
mod sql;

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_schema::{Field, Schema, SchemaRef};
use bytes::BytesMut;
use dataref_protocol::Principal;
use dataref_store::{ArtifactStore, Lineage, TableWriter};
use futures_util::{FutureExt, StreamExt};
use tokio::time::Instant;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{Format, FromSql, IsNull, ToSql, Type};
use tokio_postgres::{CancelToken, NoTls, Transaction};

use self::decode::{Column, Plan, Scalar};
use crate::error::{ConnectProblem, RoleProblem};
use crate::sqlite::unique_names;
use crate::{FetchRequest, Fetched, ParamValue, SourceError, SqlPolicy};

pub use self::pool::{EnvLookup, PgPool, RoleLogin};
pub use self::sql::{Numbered, number_params, pyformat_params};

/// Rows per Arrow batch written to the store.
const BATCH_ROWS: usize = 65_536;
/// Rows asked of the portal per round trip. They stream in as the server sends them, so
/// decoding overlaps the server's work; only between round trips is there a pause.
const FETCH_ROWS: i32 = 65_536;
/// How often a running call asks whether it was cancelled.
const POLL: Duration = Duration::from_millis(20);
/// How long the server gets to answer a cancel request, or a ROLLBACK, before the
/// connection is given up.
const GRACE: Duration = Duration::from_secs(5);

/// Runs `req` on `pool` as PostgreSQL role `role` and streams the rows into a new table
/// artifact owned by `owner`. `progress` gets the rows so far after each batch;
/// `is_cancelled` is polled while the call runs.
#[expect(
    clippy::too_many_arguments,
    reason = "the producer contract, as for SQLite"
)]
pub async fn fetch(
    pool: &PgPool,
    req: &FetchRequest<'_>,
    role: &str,
    store: &dyn ArtifactStore,
    owner: &Principal,
    lineage: Lineage,
    progress: &(dyn Fn(u64) + Sync),
    is_cancelled: &(dyn Fn() -> bool + Sync),
) -> Result<Fetched, SourceError> {
    let started = Instant::now();
    let deadline = started + req.source.timeout;
    match (req.policy, pool.role_login()) {
        (SqlPolicy::Generic, None) if !shared_login_accepted(req) => {
            return Err(SourceError::NotAllowed {
                what: "model-written SQL on the shared login role of this source (it logs in \
                       as the caller's own role; set `allow_sql_shared_roles = true` on the \
                       source to accept the shared login)"
                    .into(),
            });
        }
        (_, Some(login)) if login.role != role => {
            return Err(SourceError::Connect {
                source_name: pool.source_name().to_owned(),
                message: format!(
                    "internal: a pool of role `{}` was given a call of role `{role}`",
                    login.role
                ),
                problem: ConnectProblem::Other,
            });
        }
        _ => {}
    }
    if req.policy == SqlPolicy::Generic
        && let Some(f) = sql::refused_function(req.sql)
    {
        return Err(SourceError::NotAllowed {
            what: format!("calling `{f}` (it changes the role or settings of the transaction)"),
        });
    }
    // Only operator SQL has named parameters; model SQL is sent as written (so an array
    // slice like `a[1:n]` is not mistaken for a placeholder).
    let numbered = match req.policy {
        SqlPolicy::Configured => sql::number_params(req.sql),
        SqlPolicy::Generic => sql::Numbered {
            sql: req.sql.to_owned(),
            names: Vec::new(),
        },
    };
    let params = req.bind(&numbered.names, |v| TextParam::from(v))?;
    if is_cancelled() {
        return Err(SourceError::Cancelled);
    }

    let mut conn = pool
        .get(deadline.saturating_duration_since(Instant::now()))
        .await?;
    let client = conn.client()?;
    let mut guard = Guard {
        cancel: client.cancel_token(),
        is_cancelled,
        deadline,
        stopped: None,
        lost: false,
    };
    let call = Call {
        req,
        role,
        owner,
        source_name: pool.source_name(),
    };
    let txn = match guard
        .run(client.build_transaction().read_only(true).start())
        .await
    {
        Ok(txn) => txn,
        Err(f) => return Err(call.error(f, Phase::Statement, &guard)),
    };
    let result = call
        .run(
            &txn,
            &mut guard,
            &numbered.sql,
            &params,
            store,
            lineage,
            progress,
        )
        .await;
    // Only a call that succeeded leaves its connection reusable: after an error, a refused
    // result, a timeout or a cancellation it is closed (dropped), so a cancel request that
    // arrives late, or anything the statement left in its session, reaches no other call.
    if result.is_ok() && guard.stopped.is_none() && !guard.lost {
        let rolled_back = tokio::time::timeout(GRACE, txn.rollback())
            .await
            .is_ok_and(|r| r.is_ok());
        let clean = rolled_back
            && tokio::time::timeout(GRACE, client.batch_execute(pool::SESSION_RESET))
                .await
                .is_ok_and(|r| r.is_ok());
        if clean {
            conn.give_back();
        }
    } else {
        drop(txn);
    }
    if let Ok(f) = &result {
        tracing::debug!(
            source = %pool.source_name(),
            role,
            rows = f.meta.rows,
            bytes = f.meta.bytes,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "fetched"
        );
    }
    result
}

/// Why a running call was stopped by us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Cancelled,
    Timeout,
}

/// A failed step: the server's error, or our stop.
enum Failure {
    Pg(tokio_postgres::Error),
    Stopped(Stop),
}

/// Runs each server round trip against cancellation and the deadline. On either it sends
/// a cancel request and waits (bounded) for the server's answer, so the connection stays
/// in step; if none comes the connection is marked lost.
/// The WAL position and the snapshot, each asked only where the role may call the function
/// (`CASE` calls it only then). On a standby the position is the last one replayed.
const VERSION_SQL: &str = "\
SELECT CASE \
         WHEN pg_catalog.pg_is_in_recovery() THEN \
           CASE WHEN pg_catalog.has_function_privilege('pg_catalog.pg_last_wal_replay_lsn()', 'EXECUTE') \
                THEN pg_catalog.pg_last_wal_replay_lsn()::text END \
         WHEN pg_catalog.has_function_privilege('pg_catalog.pg_current_wal_lsn()', 'EXECUTE') \
           THEN pg_catalog.pg_current_wal_lsn()::text \
       END, \
       CASE WHEN pg_catalog.has_function_privilege('pg_catalog.pg_current_snapshot()', 'EXECUTE') \
            THEN pg_catalog.pg_current_snapshot()::text END";

struct Guard<'c> {
    cancel: CancelToken,
    is_cancelled: &'c (dyn Fn() -> bool + Sync),
    deadline: Instant,
    stopped: Option<Stop>,
    lost: bool,
}

impl Guard<'_> {
    async fn run<T>(
        &mut self,
        fut: impl Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, Failure> {
        if let Some(stop) = self.stopped {
            return Err(Failure::Stopped(stop));
        }
        let mut fut = pin!(fut);
        let stop = tokio::select! {
            biased;
            r = &mut fut => return r.map_err(Failure::Pg),
            stop = watch(self.is_cancelled, self.deadline) => stop,
        };
        self.stopped = Some(stop);
        let _ = tokio::time::timeout(GRACE, self.cancel.cancel_query(NoTls)).await;
        if tokio::time::timeout(GRACE, &mut fut).await.is_err() {
            self.lost = true;
        }
        Err(Failure::Stopped(stop))
    }

    /// After an error of ours mid-chunk (too many rows, a value Arrow cannot take): the
    /// server is asked to stop producing the rest, so the ROLLBACK is answered at once.
    async fn abort(&mut self) {
        let _ = tokio::time::timeout(GRACE, self.cancel.cancel_query(NoTls)).await;
    }

    /// Between batches: a cancellation or the deadline seen while decoding. The portal may
    /// still be producing rows, so the server is asked to cancel too.
    async fn check(&mut self) -> Result<(), Failure> {
        if let Some(stop) = self.stopped {
            return Err(Failure::Stopped(stop));
        }
        let stop = if (self.is_cancelled)() {
            Stop::Cancelled
        } else if Instant::now() >= self.deadline {
            Stop::Timeout
        } else {
            return Ok(());
        };
        self.stopped = Some(stop);
        let _ = tokio::time::timeout(GRACE, self.cancel.cancel_query(NoTls)).await;
        Err(Failure::Stopped(stop))
    }
}

async fn watch(is_cancelled: &(dyn Fn() -> bool + Sync), deadline: Instant) -> Stop {
    loop {
        if is_cancelled() {
            return Stop::Cancelled;
        }
        let now = Instant::now();
        if now >= deadline {
            return Stop::Timeout;
        }
        tokio::time::sleep(POLL.min(deadline - now)).await;
    }
}

/// Which step failed, for reading the server's error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Role,
    Statement,
}

struct Call<'r, 'a> {
    req: &'r FetchRequest<'a>,
    role: &'r str,
    owner: &'r Principal,
    source_name: &'r str,
}

impl Call<'_, '_> {
    /// Classifies by SQLSTATE and the step, never by the message text.
    fn error(&self, f: Failure, phase: Phase, guard: &Guard<'_>) -> SourceError {
        let e = match f {
            Failure::Stopped(Stop::Cancelled) => return SourceError::Cancelled,
            Failure::Stopped(Stop::Timeout) => {
                return SourceError::Timeout {
                    after: self.req.source.timeout,
                };
            }
            Failure::Pg(e) => e,
        };
        let Some(db) = e.as_db_error() else {
            return SourceError::Connect {
                source_name: self.source_name.to_owned(),
                message: format!("the connection failed during the call: {e}"),
                problem: ConnectProblem::Other,
            };
        };
        let code = db.code();
        if phase == Phase::Role {
            let problem = if *code == SqlState::INVALID_PARAMETER_VALUE
                || *code == SqlState::UNDEFINED_OBJECT
            {
                Some(RoleProblem::Missing)
            } else if *code == SqlState::INSUFFICIENT_PRIVILEGE {
                Some(RoleProblem::NotGranted)
            } else {
                None
            };
            if let Some(problem) = problem {
                return SourceError::Role {
                    principal: self.owner.as_str().to_owned(),
                    role: self.role.to_owned(),
                    source_name: self.source_name.to_owned(),
                    problem,
                };
            }
        }
        if *code == SqlState::QUERY_CANCELED {
            return match guard.stopped {
                Some(Stop::Cancelled) => SourceError::Cancelled,
                // Our deadline, or the server's statement_timeout.
                Some(Stop::Timeout) | None => SourceError::Timeout {
                    after: self.req.source.timeout,
                },
            };
        }
        if *code == SqlState::INSUFFICIENT_PRIVILEGE {
            return SourceError::PermissionDenied {
                principal: self.owner.as_str().to_owned(),
                role: self.role.to_owned(),
                message: db.message().to_owned(),
            };
        }
        if *code == SqlState::READ_ONLY_SQL_TRANSACTION {
            return SourceError::NotAllowed {
                what: "a statement that writes to the database".into(),
            };
        }
        SourceError::Postgres {
            message: db.message().to_owned(),
            server_hint: db.hint().map(str::to_owned),
        }
    }

    /// The database's version of its data as this transaction starts reading, as the
    /// caller's role: the WAL position (the replayed one on a standby) and the transaction
    /// snapshot, each only where the role may call the function; `None` when it may call
    /// neither. A refusal is undone by a savepoint, so it never fails the read.
    async fn version(
        &self,
        txn: &Transaction<'_>,
        guard: &mut Guard<'_>,
    ) -> Result<Option<String>, SourceError> {
        guard
            .run(txn.batch_execute("SAVEPOINT dataref_version"))
            .await
            .map_err(|f| self.error(f, Phase::Statement, guard))?;
        let asked = guard.run(txn.query_one(VERSION_SQL, &[])).await;
        let row = match asked {
            Ok(row) => row,
            Err(Failure::Pg(e)) => {
                tracing::debug!(error = %e, "the source's version could not be read");
                guard
                    .run(txn.batch_execute("ROLLBACK TO SAVEPOINT dataref_version"))
                    .await
                    .map_err(|f| self.error(f, Phase::Statement, guard))?;
                return Ok(None);
            }
            Err(f) => return Err(self.error(f, Phase::Statement, guard)),
        };
        guard
            .run(txn.batch_execute("RELEASE SAVEPOINT dataref_version"))
            .await
            .map_err(|f| self.error(f, Phase::Statement, guard))?;
        let lsn: Option<String> = row.try_get(0).ok().flatten();
        let snapshot: Option<String> = row.try_get(1).ok().flatten();
        let parts: Vec<String> = [
            lsn.map(|l| format!("lsn {l}")),
            snapshot.map(|s| format!("snapshot {s}")),
        ]
        .into_iter()
        .flatten()
        .collect();
        Ok((!parts.is_empty()).then(|| parts.join(", ")))
    }

    #[expect(clippy::too_many_arguments, reason = "one call's state, passed once")]
    async fn run(
        &self,
        txn: &Transaction<'_>,
        guard: &mut Guard<'_>,
        sql: &str,
        params: &[TextParam],
        store: &dyn ArtifactStore,
        mut lineage: Lineage,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<Fetched, SourceError> {
        let timeout_ms = self
            .req
            .source
            .timeout
            .as_millis()
            .clamp(1, i32::MAX as u128);
        let setup = format!(
            "SET LOCAL ROLE {}; SET LOCAL statement_timeout = {timeout_ms}",
            quote_ident(self.role)
        );
        guard
            .run(txn.batch_execute(&setup))
            .await
            .map_err(|f| self.error(f, Phase::Role, guard))?;
        lineage.set_source_version(self.version(txn, guard).await?);

        let mut stmt = guard
            .run(txn.prepare(sql))
            .await
            .map_err(|f| self.error(f, Phase::Statement, guard))?;
        if stmt.columns().is_empty() {
            return Err(SourceError::NotAllowed {
                what: "a statement that returns no rows (send one SELECT)".into(),
            });
        }
        let names = unique_names(stmt.columns().iter().map(|c| c.name()));
        let plans: Vec<Plan> = stmt
            .columns()
            .iter()
            .map(|c| decode::plan(c.type_(), c.type_modifier()))
            .collect();
        let mut notes = Vec::new();
        for ((name, plan), col) in names.iter().zip(&plans).zip(stmt.columns()) {
            match plan {
                Plan::CastToText => notes.push(format!(
                    "column `{name}` (PostgreSQL type `{}`) is stored as its text form",
                    col.type_().name()
                )),
                Plan::Scalar(Scalar::NumericText) | Plan::List(Scalar::NumericText) => {
                    notes.push(format!(
                        "column `{name}` is `numeric` without a precision of at most 38 (as \
                         `sum` and arithmetic return), so it is stored as exact decimal text; \
                         cast in SQL for numbers (`::numeric(18,2)` or `::float8`)"
                    ))
                }
                _ => {}
            }
        }
        if plans.contains(&Plan::CastToText) {
            let wrapped = cast_to_text(sql, &plans);
            stmt = guard
                .run(txn.prepare(&wrapped))
                .await
                .map_err(|f| self.error(f, Phase::Statement, guard))?;
        }

        let schema: SchemaRef = Arc::new(Schema::new(
            names
                .iter()
                .zip(&plans)
                .map(|(name, plan)| Field::new(name, plan.data_type(), true))
                .collect::<Vec<_>>(),
        ));
        let columns = plans
            .iter()
            .zip(&names)
            .map(|(plan, name)| {
                Column::new(*plan, BATCH_ROWS).map_err(|message| SourceError::Unsupported {
                    column: name.clone(),
                    message,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let params: Vec<&(dyn ToSql + Sync)> =
            params.iter().map(|p| p as &(dyn ToSql + Sync)).collect();
        let portal = guard
            .run(txn.bind(&stmt, &params))
            .await
            .map_err(|f| self.error(f, Phase::Statement, guard))?;

        let writer = store.create_table(self.owner, schema.clone(), lineage)?;
        let mut sink = Sink {
            names,
            columns,
            schema,
            writer,
            in_batch: 0,
            total: 0,
            max_rows: self.req.source.max_rows,
            progress,
        };
        loop {
            let asked = chunk_rows(sink.total, sink.max_rows);
            let stream = guard
                .run(txn.query_portal_raw(&portal, asked))
                .await
                .map_err(|f| self.error(f, Phase::Statement, guard))?;
            let mut stream = pin!(stream);
            let mut in_chunk = 0usize;
            loop {
                // Rows usually wait in the connection's buffer: take them without a timer;
                // only an empty buffer waits under cancellation and the deadline.
                let next = match stream.next().now_or_never() {
                    Some(next) => next.transpose().map_err(Failure::Pg),
                    None => guard.run(async { stream.next().await.transpose() }).await,
                };
                let Some(row) = next.map_err(|f| self.error(f, Phase::Statement, guard))? else {
                    break;
                };
                in_chunk += 1;
                let pushed = sink.push(&row).and_then(|()| match sink.in_batch {
                    BATCH_ROWS => sink.flush(),
                    _ => Ok(()),
                });
                if let Err(e) = pushed {
                    // The portal may still be producing this chunk: stop the server too.
                    guard.abort().await;
                    return Err(e);
                }
                if sink.in_batch == 0
                    && let Err(f) = guard.check().await
                {
                    return Err(self.error(f, Phase::Statement, guard));
                }
            }
            if in_chunk < asked as usize {
                break;
            }
            if let Err(f) = guard.check().await {
                return Err(self.error(f, Phase::Statement, guard));
            }
        }

        // `SET ROLE` cannot run here (it returns no rows) and `set_config` is refused in
        // model SQL, but a function could still change the role: check after the fact.
        let now = guard
            .run(txn.query_one("SELECT current_user::text", &[]))
            .await
            .map_err(|f| self.error(f, Phase::Statement, guard))?;
        let current: String = now.try_get(0).map_err(|e| SourceError::Postgres {
            message: e.to_string(),
            server_hint: None,
        })?;
        if current != self.role {
            return Err(SourceError::NotAllowed {
                what: format!(
                    "changing the role of the transaction (it ran as `{}`, then was `{current}`)",
                    self.role
                ),
            });
        }

        for (name, col) in sink.names.iter().zip(&sink.columns) {
            let n = col.nulled();
            if n > 0 {
                notes.push(format!(
                    "column `{name}`: {n} value(s) Arrow cannot hold (±infinity, NaN) are stored as NULL"
                ));
            }
        }
        let meta = sink.finish()?;
        Ok(Fetched { meta, notes })
    }
}

/// Rows to ask of the portal next: never more than one past `max_rows`, so a refused
/// result costs the server no more than that.
fn chunk_rows(total: u64, max_rows: u64) -> i32 {
    let left = max_rows.saturating_sub(total).saturating_add(1);
    i32::try_from(left).map_or(FETCH_ROWS, |left| left.min(FETCH_ROWS))
}

/// `SELECT q.c1, q.c2::text, … FROM (<sql>) AS q(c1, c2, …)`: the columns with no binary
/// decoder come back as text, the others unchanged and in the same order.
fn cast_to_text(sql: &str, plans: &[Plan]) -> String {
    let body = sql.trim_end().trim_end_matches(';');
    let cols: Vec<String> = plans
        .iter()
        .enumerate()
        .map(|(i, p)| match p {
            Plan::CastToText => format!("q.c{i}::text"),
            Plan::Scalar(_) | Plan::List(_) => format!("q.c{i}"),
        })
        .collect();
    let aliases: Vec<String> = (0..plans.len()).map(|i| format!("c{i}")).collect();
    format!(
        "SELECT {} FROM (\n{body}\n) AS q({})",
        cols.join(", "),
        aliases.join(", ")
    )
}

/// `"name"` with inner quotes doubled: a role name is an identifier, never spliced raw.
pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A cell's raw bytes in the binary format, borrowed from the row (`None` is NULL).
struct Raw<'a>(Option<&'a [u8]>);

impl<'a> FromSql<'a> for Raw<'a> {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Self(Some(raw)))
    }

    fn from_sql_null(_: &Type) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Self(None))
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}

/// A parameter sent in text format, read by the server as the type it inferred.
#[derive(Debug)]
struct TextParam(Option<String>);

impl From<&ParamValue> for TextParam {
    fn from(v: &ParamValue) -> Self {
        Self(match v {
            ParamValue::Null => None,
            ParamValue::Integer(i) => Some(i.to_string()),
            ParamValue::Real(r) if r.is_nan() => Some("NaN".into()),
            ParamValue::Real(r) if r.is_infinite() => {
                Some(if *r > 0.0 { "Infinity" } else { "-Infinity" }.into())
            }
            ParamValue::Real(r) => Some(r.to_string()),
            ParamValue::Text(s) => Some(s.clone()),
        })
    }
}

impl ToSql for TextParam {
    fn to_sql(
        &self,
        _: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match &self.0 {
            Some(s) => {
                out.extend_from_slice(s.as_bytes());
                Ok(IsNull::No)
            }
            None => Ok(IsNull::Yes),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    fn encode_format(&self, _: &Type) -> Format {
        Format::Text
    }

    fn to_sql_checked(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        self.to_sql(ty, out)
    }
}

/// The builders of the batch being filled and the writer full batches go to. Dropping it
/// without [`Sink::finish`] drops the writer, which removes the partial artifact.
struct Sink<'a> {
    names: Vec<String>,
    columns: Vec<Column>,
    schema: SchemaRef,
    writer: Box<dyn TableWriter>,
    in_batch: usize,
    total: u64,
    max_rows: u64,
    progress: &'a (dyn Fn(u64) + Sync),
}

impl Sink<'_> {
    #[inline]
    fn push(&mut self, row: &tokio_postgres::Row) -> Result<(), SourceError> {
        if self.total >= self.max_rows {
            return Err(SourceError::TooManyRows {
                max_rows: self.max_rows,
            });
        }
        for (i, col) in self.columns.iter_mut().enumerate() {
            let raw = row
                .try_get::<_, Raw<'_>>(i)
                .map_err(|e| SourceError::Postgres {
                    message: e.to_string(),
                    server_hint: None,
                })?;
            col.append(raw.0)
                .map_err(|message| SourceError::Unsupported {
                    column: self.names[i].clone(),
                    message: format!("row {}: {message}", self.total + 1),
                })?;
        }
        self.total += 1;
        self.in_batch += 1;
        Ok(())
    }

    fn flush(&mut self) -> Result<(), SourceError> {
        let arrays = self
            .columns
            .iter_mut()
            .zip(&self.names)
            .map(|(c, name)| {
                c.finish().map_err(|message| SourceError::Unsupported {
                    column: name.clone(),
                    message,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let batch = RecordBatch::try_new(self.schema.clone(), arrays)
            .map_err(|e| SourceError::Store(e.into()))?;
        self.writer.write(&batch)?;
        self.in_batch = 0;
        (self.progress)(self.total);
        Ok(())
    }

    fn finish(mut self) -> Result<dataref_store::ArtifactMeta, SourceError> {
        if self.in_batch > 0 {
            self.flush()?;
        }
        Ok(self.writer.finish()?)
    }
}

/// A connection attempt's error, by SQLSTATE or I/O error, never by message.
pub(crate) fn connect_error(source: &str, e: &tokio_postgres::Error) -> SourceError {
    let problem = match e.as_db_error().map(|db| db.code()) {
        Some(c)
            if *c == SqlState::INVALID_PASSWORD
                || *c == SqlState::INVALID_AUTHORIZATION_SPECIFICATION =>
        {
            ConnectProblem::Auth
        }
        Some(c) if *c == SqlState::INVALID_CATALOG_NAME => ConnectProblem::NoDatabase,
        Some(_) => ConnectProblem::Other,
        None if io_cause(e) => ConnectProblem::Unreachable,
        None => ConnectProblem::Other,
    };
    let message = match e.as_db_error() {
        Some(db) => db.message().to_owned(),
        None => e.to_string(),
    };
    SourceError::Connect {
        source_name: source.to_owned(),
        message,
        problem,
    }
}

fn io_cause(e: &tokio_postgres::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(c) = cause {
        if c.is::<std::io::Error>() {
            return true;
        }
        cause = c.source();
    }
    false
}

/// What `dataref doctor` reports about a PostgreSQL source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// The role the connection logs in as.
    pub login_role: String,
    pub server_version: String,
    /// Whether the login role inherits its roles' privileges (it should not: `NOINHERIT`).
    pub login_inherits: bool,
    pub login_is_superuser: bool,
    /// Each asked-about role: can the login role `SET ROLE` to it?
    pub roles: Vec<(String, RoleStatus)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RoleStatus {
    Usable,
    Missing,
    NotGranted,
}

/// Connects (a fresh connection, not from the pool), and reports the login role and
/// which of `roles` it may switch to.
pub async fn probe(pool: &PgPool, roles: &[String]) -> Result<Probe, SourceError> {
    let client = pool.connect().await?;
    let fail = |e: tokio_postgres::Error| SourceError::Postgres {
        message: e
            .as_db_error()
            .map_or_else(|| e.to_string(), |d| d.message().to_owned()),
        server_hint: None,
    };
    let row = client
        .query_one(
            "SELECT current_user::text, current_setting('server_version'), r.rolinherit, r.rolsuper \
             FROM pg_roles r WHERE r.rolname = current_user",
            &[],
        )
        .await
        .map_err(fail)?;
    let mut out = Probe {
        login_role: row.try_get(0).map_err(fail)?,
        server_version: row.try_get(1).map_err(fail)?,
        login_inherits: row.try_get(2).map_err(fail)?,
        login_is_superuser: row.try_get(3).map_err(fail)?,
        roles: Vec::new(),
    };
    for role in roles {
        let row = client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1::text), \
                 COALESCE((SELECT pg_has_role(current_user, oid, 'MEMBER') FROM pg_roles \
                 WHERE rolname = $1::text), false)",
                &[role],
            )
            .await
            .map_err(fail)?;
        let exists: bool = row.try_get(0).map_err(fail)?;
        let member: bool = row.try_get(1).map_err(fail)?;
        let status = match (exists, member) {
            (false, _) => RoleStatus::Missing,
            (true, false) => RoleStatus::NotGranted,
            (true, true) => RoleStatus::Usable,
        };
        out.roles.push((role.clone(), status));
    }
    Ok(out)
}

/// Whether the source's operator accepted model-written SQL on the shared login role.
fn shared_login_accepted(req: &FetchRequest<'_>) -> bool {
    matches!(
        req.source.kind,
        dataref_config::SourceKind::Postgres {
            allow_sql_shared_roles: true,
            ..
        }
    )
}

/// What `dataref doctor` reports about one principal's own login (model-written SQL).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginProbe {
    pub principal: String,
    pub role: String,
    /// The login failed, or: the roles it can become that it must not (empty: safe).
    pub result: Result<Vec<String>, String>,
}

/// Logs in as the role of `pool` (a pool made by [`PgPool::for_role`]) and asks the
/// database which forbidden roles that login can become. None for a shared-login pool.
pub async fn probe_login(pool: &PgPool) -> Option<LoginProbe> {
    let login = pool.role_login()?;
    let result = match pool.open().await {
        Err(e) => Err(match &e {
            SourceError::Connect { message, .. } => message.clone(),
            other => other.to_string(),
        }),
        Ok(client) => pool::reach(&client, login).await.map_err(|e| {
            e.as_db_error()
                .map_or_else(|| e.to_string(), |d| d.message().to_owned())
        }),
    };
    Some(LoginProbe {
        principal: login.principal.clone(),
        role: login.role.clone(),
        result,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_stop_one_row_past_the_limit() {
        assert_eq!(chunk_rows(0, 3), 4);
        assert_eq!(chunk_rows(2, 3), 2);
        assert_eq!(chunk_rows(0, u64::MAX), FETCH_ROWS);
        assert_eq!(chunk_rows(0, 10_000_000), FETCH_ROWS);
    }

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(quote_ident("eu_analyst"), "\"eu_analyst\"");
        assert_eq!(quote_ident("a\"; DROP"), "\"a\"\"; DROP\"");
    }

    #[test]
    fn casting_wraps_the_statement() {
        let plans = [Plan::Scalar(Scalar::Int4), Plan::CastToText];
        assert_eq!(
            cast_to_text("SELECT 1, inet '1.2.3.4' -- x\n;", &plans),
            "SELECT q.c0, q.c1::text FROM (\nSELECT 1, inet '1.2.3.4' -- x\n\n) AS q(c0, c1)"
        );
    }
}
