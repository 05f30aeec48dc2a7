//! Sessions in SQLite under the data dir (`agent/sessions.sqlite`), with the store's
//! crash-safety rules (WAL, `synchronous = FULL`, one transaction per run appended). Several
//! processes on one data dir share the file; each keeps its own busy sessions.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use dataref_protocol::{Principal, Timestamp};
use rusqlite::{Connection, OptionalExtension, params};

use super::{NewRun, SessionBackend, SessionError, SessionInfo, StoredSession};
use crate::budget::{GroupBy, SqlValue, UsageGroup, UsageLedger, UsageQuery, UsageRow, Used};
use crate::message::Usage;

/// 2: `sessions.ungrounded` (answers whose numbers matched nothing a tool produced).
/// 3: `usage`, the ledger of model requests budgets are counted on ([`crate::budget`]).
const SCHEMA_VERSION: i64 = 3;
const SCHEMA_SQL: &str = "
CREATE TABLE IF NOT EXISTS sessions (
    principal TEXT NOT NULL,
    id TEXT NOT NULL,
    agent TEXT NOT NULL,
    title TEXT NOT NULL,
    created INTEGER NOT NULL,
    updated INTEGER NOT NULL,
    runs INTEGER NOT NULL DEFAULT 0,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    ungrounded INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (principal, id)
);
CREATE TABLE IF NOT EXISTS messages (
    principal TEXT NOT NULL,
    session TEXT NOT NULL,
    seq INTEGER NOT NULL,
    run INTEGER NOT NULL,
    message TEXT NOT NULL,
    PRIMARY KEY (principal, session, seq)
);
CREATE TABLE IF NOT EXISTS requests (
    principal TEXT NOT NULL,
    session TEXT NOT NULL,
    run INTEGER NOT NULL,
    turn INTEGER NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    context_tokens INTEGER NOT NULL,
    PRIMARY KEY (principal, session, run, turn)
);
-- One row per model request, kept when its session is deleted or swept: budgets and
-- `dataref usage` count it. The indexes hold the summed columns: a budget check reads
-- them alone.
CREATE TABLE IF NOT EXISTS usage (
    at INTEGER NOT NULL,
    principal TEXT NOT NULL,
    agent TEXT NOT NULL,
    model TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    cost_micros INTEGER NOT NULL,
    session TEXT NOT NULL,
    -- 1: the tokens are dataref's estimate (cancelled, timed out, failed, no usage sent).
    estimated INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS usage_agent
    ON usage (agent, at, prompt_tokens, completion_tokens, cost_micros);
CREATE INDEX IF NOT EXISTS usage_principal
    ON usage (principal, at, prompt_tokens, completion_tokens, cost_micros);
";

/// The sessions of every principal on this data dir.
#[derive(Debug)]
pub(crate) struct SqliteSessions {
    path: PathBuf,
    conn: Mutex<Connection>,
}

impl SqliteSessions {
    /// Opens (and creates) `<home>/agent/sessions.sqlite`.
    #[expect(
        clippy::disallowed_methods,
        reason = "the agent's own directory under the data dir, not a workspace"
    )]
    pub(crate) fn open(home: &Path) -> Result<Self, SessionError> {
        let dir = home.join("agent");
        let path = dir.join("sessions.sqlite");
        let db = |e: &dyn std::fmt::Display| SessionError::Database {
            path: path.display().to_string(),
            detail: e.to_string(),
        };
        std::fs::create_dir_all(&dir).map_err(|e| db(&e))?;
        let conn = Connection::open(&path).map_err(|e| db(&e))?;
        let setup = || -> rusqlite::Result<i64> {
            conn.busy_timeout(Duration::from_secs(10))?;
            let _: String =
                conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
            conn.pragma_update(None, "synchronous", "FULL")?;
            let v: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
            conn.execute_batch(SCHEMA_SQL)?;
            if v == 1 {
                conn.execute_batch(
                    "ALTER TABLE sessions ADD COLUMN ungrounded INTEGER NOT NULL DEFAULT 0",
                )?;
            }
            conn.pragma_update(None, "user_version", SCHEMA_VERSION)?;
            Ok(v)
        };
        let version = setup().map_err(|e| db(&e))?;
        if version > SCHEMA_VERSION {
            return Err(db(&format!(
                "written by a newer dataref (version {version}, this build knows {SCHEMA_VERSION})"
            )));
        }
        Ok(Self {
            path,
            conn: Mutex::new(conn),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn db(&self, e: rusqlite::Error) -> SessionError {
        SessionError::Database {
            path: self.path.display().to_string(),
            detail: e.to_string(),
        }
    }
}

impl SessionBackend for SqliteSessions {
    fn load(&self, principal: &Principal, id: &str) -> Result<Option<StoredSession>, SessionError> {
        let conn = self.lock();
        let owner: Option<String> = conn
            .query_row(
                "SELECT agent FROM sessions WHERE principal = ?1 AND id = ?2",
                params![principal.as_str(), id],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.db(e))?;
        let Some(agent) = owner else {
            return Ok(None);
        };
        let mut stmt = conn
            .prepare(
                "SELECT message FROM messages WHERE principal = ?1 AND session = ?2 ORDER BY seq",
            )
            .map_err(|e| self.db(e))?;
        let rows = stmt
            .query_map(params![principal.as_str(), id], |r| r.get::<_, String>(0))
            .map_err(|e| self.db(e))?;
        let messages = rows
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.db(e))?;
        Ok(Some(StoredSession { agent, messages }))
    }

    fn append(
        &self,
        principal: &Principal,
        id: &str,
        run: &NewRun<'_>,
    ) -> Result<(), SessionError> {
        let mut conn = self.lock();
        // IMMEDIATE: the write lock first, so a read here cannot deadlock with another
        // process's write on the same data dir.
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(|e| self.db(e))?;
        let p = principal.as_str();
        tx.execute(
            "INSERT INTO sessions (principal, id, agent, title, created, updated) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?5) ON CONFLICT (principal, id) DO NOTHING",
            params![p, id, run.agent, run.title, run.now.unix_seconds()],
        )
        .map_err(|e| self.db(e))?;
        let runs: i64 = tx
            .query_row(
                "SELECT runs FROM sessions WHERE principal = ?1 AND id = ?2",
                params![p, id],
                |r| r.get(0),
            )
            .map_err(|e| self.db(e))?;
        // A continuation of a run kept in pieces belongs to the session's last run.
        let run_no = if run.starts_run {
            runs + 1
        } else {
            runs.max(1)
        };
        let next: i64 = tx
            .query_row(
                "SELECT COALESCE(MAX(seq), 0) FROM messages WHERE principal = ?1 AND session = ?2",
                params![p, id],
                |r| r.get(0),
            )
            .map_err(|e| self.db(e))?;
        for (i, text) in run.messages.iter().enumerate() {
            tx.execute(
                "INSERT INTO messages (principal, session, seq, run, message) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![p, id, next + 1 + i as i64, run_no, text],
            )
            .map_err(|e| self.db(e))?;
        }
        for r in run.requests {
            tx.execute(
                "INSERT INTO requests (principal, session, run, turn, prompt_tokens, completion_tokens, context_tokens) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    p,
                    id,
                    run_no,
                    r.turn,
                    r.usage.prompt_tokens as i64,
                    r.usage.completion_tokens as i64,
                    r.context_tokens as i64
                ],
            )
            .map_err(|e| self.db(e))?;
        }
        tx.execute(
            "UPDATE sessions SET runs = ?3, updated = ?4, prompt_tokens = prompt_tokens + ?5, \
             completion_tokens = completion_tokens + ?6, ungrounded = ungrounded + ?7 \
             WHERE principal = ?1 AND id = ?2",
            params![
                p,
                id,
                run_no,
                run.now.unix_seconds(),
                run.usage.prompt_tokens as i64,
                run.usage.completion_tokens as i64,
                i64::from(run.ungrounded)
            ],
        )
        .map_err(|e| self.db(e))?;
        tx.commit().map_err(|e| self.db(e))
    }

    fn list(
        &self,
        principal: &Principal,
        only: Option<&str>,
    ) -> Result<Vec<SessionInfo>, SessionError> {
        let conn = self.lock();
        let mut stmt = conn
            .prepare(
                "SELECT s.id, s.agent, s.title, s.created, s.updated, s.runs, s.prompt_tokens, \
                 s.completion_tokens, (SELECT COUNT(*) FROM messages m WHERE m.principal = s.principal AND m.session = s.id), \
                 s.ungrounded \
                 FROM sessions s WHERE s.principal = ?1 AND (?2 IS NULL OR s.id = ?2) \
                 ORDER BY s.updated DESC, s.id",
            )
            .map_err(|e| self.db(e))?;
        let rows = stmt
            .query_map(params![principal.as_str(), only], |r| {
                Ok(SessionInfo {
                    id: r.get(0)?,
                    agent: r.get(1)?,
                    title: r.get(2)?,
                    created: Timestamp(r.get(3)?),
                    updated: Timestamp(r.get(4)?),
                    runs: r.get::<_, i64>(5)? as u32,
                    usage: Usage {
                        prompt_tokens: r.get::<_, i64>(6)? as u64,
                        completion_tokens: r.get::<_, i64>(7)? as u64,
                    },
                    messages: r.get::<_, i64>(8)? as u32,
                    ungrounded: r.get::<_, i64>(9)? as u32,
                })
            })
            .map_err(|e| self.db(e))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(|e| self.db(e))
    }

    fn delete(&self, principal: &Principal, id: &str) -> Result<bool, SessionError> {
        let mut conn = self.lock();
        let tx = conn.transaction().map_err(|e| self.db(e))?;
        let p = principal.as_str();
        let n = tx
            .execute(
                "DELETE FROM sessions WHERE principal = ?1 AND id = ?2",
                params![p, id],
            )
            .map_err(|e| self.db(e))?;
        tx.execute(
            "DELETE FROM messages WHERE principal = ?1 AND session = ?2",
            params![p, id],
        )
        .map_err(|e| self.db(e))?;
        tx.execute(
            "DELETE FROM requests WHERE principal = ?1 AND session = ?2",
            params![p, id],
        )
        .map_err(|e| self.db(e))?;
        tx.commit().map_err(|e| self.db(e))?;
        Ok(n > 0)
    }

    fn sweep(&self, before: Timestamp) -> Result<usize, SessionError> {
        let mut conn = self.lock();
        let tx = conn.transaction().map_err(|e| self.db(e))?;
        let cut = before.unix_seconds();
        for table in ["messages", "requests"] {
            tx.execute(
                &format!(
                    "DELETE FROM {table} WHERE (principal, session) IN \
                     (SELECT principal, id FROM sessions WHERE updated < ?1)"
                ),
                params![cut],
            )
            .map_err(|e| self.db(e))?;
        }
        let n = tx
            .execute("DELETE FROM sessions WHERE updated < ?1", params![cut])
            .map_err(|e| self.db(e))?;
        tx.commit().map_err(|e| self.db(e))?;
        Ok(n)
    }
}

/// The usage ledger in the sessions' database: a connection of its own, so a budget check
/// does not wait behind a session's append in this process.
#[derive(Debug)]
pub(crate) struct SqliteUsage {
    path: PathBuf,
    conn: Mutex<Connection>,
}

impl SqliteUsage {
    /// Opens the ledger of `<home>/agent/sessions.sqlite`, which [`SqliteSessions::open`]
    /// made (or brought up to date) first.
    pub(crate) fn open(home: &Path) -> Result<Self, SessionError> {
        let path = home.join("agent").join("sessions.sqlite");
        let db = |e: &dyn std::fmt::Display| SessionError::Database {
            path: path.display().to_string(),
            detail: e.to_string(),
        };
        let conn = Connection::open(&path).map_err(|e| db(&e))?;
        let setup = || -> rusqlite::Result<()> {
            conn.busy_timeout(Duration::from_secs(10))?;
            // A row lost to a power cut undercounts one request; an fsync per model request
            // is not worth that.
            conn.pragma_update(None, "synchronous", "NORMAL")?;
            Ok(())
        };
        setup().map_err(|e| db(&e))?;
        Ok(Self {
            path,
            conn: Mutex::new(conn),
        })
    }

    /// Opens the ledger of `<home>/agent/sessions.sqlite` read-only, to report it: `None`
    /// when the file or its `usage` table does not exist yet (nothing is created, nothing
    /// is migrated).
    #[expect(
        clippy::disallowed_methods,
        reason = "the agent's own database under the data dir, not a workspace"
    )]
    pub(crate) fn open_read_only(home: &Path) -> Result<Option<Self>, SessionError> {
        let path = home.join("agent").join("sessions.sqlite");
        if !path.exists() {
            return Ok(None);
        }
        let db = |e: &dyn std::fmt::Display| SessionError::Database {
            path: path.display().to_string(),
            detail: e.to_string(),
        };
        let conn = Connection::open_with_flags(
            &path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| db(&e))?;
        let setup = || -> rusqlite::Result<bool> {
            conn.busy_timeout(Duration::from_secs(10))?;
            conn.query_row(
                "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'usage')",
                [],
                |r| r.get(0),
            )
        };
        if !setup().map_err(|e| db(&e))? {
            return Ok(None);
        }
        Ok(Some(Self {
            path,
            conn: Mutex::new(conn),
        }))
    }

    fn db(&self, e: rusqlite::Error) -> SessionError {
        SessionError::Database {
            path: self.path.display().to_string(),
            detail: e.to_string(),
        }
    }
}

fn sql_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn sql_u64(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

impl UsageLedger for SqliteUsage {
    fn record(&self, row: &UsageRow) -> Result<(), SessionError> {
        let conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        conn.prepare(
            "INSERT INTO usage (at, principal, agent, model, prompt_tokens, completion_tokens, \
             cost_micros, session, estimated) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![
                row.at.unix_seconds(),
                row.principal,
                row.agent,
                row.model,
                sql_i64(row.prompt_tokens),
                sql_i64(row.completion_tokens),
                sql_i64(row.cost_micros),
                row.session,
                i64::from(row.estimated)
            ])
        })
        .map_err(|e| self.db(e))?;
        Ok(())
    }

    fn used(&self, queries: &[UsageQuery]) -> Result<Vec<Used>, SessionError> {
        if queries.is_empty() {
            return Ok(Vec::new());
        }
        let (sql, binds) = crate::budget::used_statement("usage", '?', queries);
        let values: Vec<rusqlite::types::Value> = binds
            .into_iter()
            .map(|b| match b {
                SqlValue::Text(t) => rusqlite::types::Value::Text(t),
                SqlValue::Int(i) => rusqlite::types::Value::Integer(i),
            })
            .collect();
        let conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        let mut stmt = conn.prepare(&sql).map_err(|e| self.db(e))?;
        stmt.query_row(rusqlite::params_from_iter(values), |r| {
            (0..queries.len())
                .map(|i| {
                    Ok(Used {
                        tokens: sql_u64(r.get(2 * i)?),
                        cost_micros: sql_u64(r.get(2 * i + 1)?),
                    })
                })
                .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(|e| self.db(e))
    }

    fn report(
        &self,
        by: GroupBy,
        since: Option<Timestamp>,
        until: Option<Timestamp>,
    ) -> Result<Vec<UsageGroup>, SessionError> {
        let col = by.column();
        let sql = format!(
            "SELECT {col}, COUNT(*), SUM(prompt_tokens), SUM(completion_tokens), SUM(cost_micros), \
             SUM(estimated) FROM usage WHERE at >= ?1 AND at < ?2 GROUP BY {col} \
             ORDER BY SUM(prompt_tokens + completion_tokens) DESC, {col}"
        );
        let conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        let mut stmt = conn.prepare(&sql).map_err(|e| self.db(e))?;
        let rows = stmt
            .query_map(
                params![
                    since.map_or(i64::MIN, Timestamp::unix_seconds),
                    until.map_or(i64::MAX, Timestamp::unix_seconds)
                ],
                |r| {
                    Ok(UsageGroup {
                        key: r.get(0)?,
                        requests: sql_u64(r.get(1)?),
                        prompt_tokens: sql_u64(r.get(2)?),
                        completion_tokens: sql_u64(r.get(3)?),
                        cost_micros: sql_u64(r.get(4)?),
                        estimated: sql_u64(r.get(5)?),
                    })
                },
            )
            .map_err(|e| self.db(e))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(|e| self.db(e))
    }
}
