//! Sessions: each principal's conversations with an agent, kept in SQLite under the data
//! dir (`agent/sessions.sqlite`) with the store's crash-safety rules (WAL, `synchronous =
//! FULL`, one transaction per run appended), resumable, listable, deletable, swept after
//! their retention. Token usage is kept per request. Sessions are keyed by principal and id:
//! another principal's session is not found, the same answer as an unknown one.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use dataref_protocol::{Principal, Timestamp};
use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;

use crate::message::{Message, Usage};
use crate::run::RunOutcome;

const SCHEMA_VERSION: i64 = 1;
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
";

/// Sessions not used for this long are deleted by [`sweep_sessions`].
pub const SESSION_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);
/// How often [`sweep_sessions`] looks.
pub const SESSION_SWEEP_INTERVAL: Duration = Duration::from_secs(3600);

/// Deletes sessions past [`SESSION_RETENTION`] every [`SESSION_SWEEP_INTERVAL`], for as long
/// as the server runs (spawn it on the server's runtime).
pub async fn sweep_sessions(
    store: std::sync::Arc<SessionStore>,
    clock: std::sync::Arc<dyn dataref_store::Clock>,
) {
    let mut tick = tokio::time::interval(SESSION_SWEEP_INTERVAL);
    loop {
        tick.tick().await;
        let now = clock.now();
        let before = Timestamp(now.0 - SESSION_RETENTION.as_secs() as i64);
        let s = store.clone();
        match tokio::task::spawn_blocking(move || s.sweep(before)).await {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => tracing::info!(removed = n, "swept old agent sessions"),
            Ok(Err(e)) => tracing::warn!("sweeping agent sessions failed: {e}"),
            Err(e) => tracing::warn!("session sweeper task ended abnormally: {e}"),
        }
    }
}

/// The longest session id accepted from a caller.
pub const MAX_SESSION_ID: usize = 64;

/// Why a session operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("no session `{0}`")]
    NotFound(String),
    #[error("`{0}` is not a session id: use 1 to {MAX_SESSION_ID} letters, digits, `-` and `_`")]
    BadId(String),
    #[error("the session database `{path}`: {detail}")]
    Database { path: String, detail: String },
    #[error("session `{id}` belongs to agent `{agent}`, not `{asked}`")]
    OtherAgent {
        id: String,
        agent: String,
        asked: String,
    },
}

/// One session, as listed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionInfo {
    pub id: String,
    pub agent: String,
    /// The first message, cut to 80 characters.
    pub title: String,
    pub created: Timestamp,
    pub updated: Timestamp,
    pub runs: u32,
    pub messages: u32,
    pub usage: Usage,
}

/// The sessions of every principal on this data dir.
#[derive(Debug)]
pub struct SessionStore {
    path: PathBuf,
    conn: Mutex<Connection>,
}

impl SessionStore {
    /// Opens (and creates) `<home>/agent/sessions.sqlite`.
    #[expect(
        clippy::disallowed_methods,
        reason = "the agent's own directory under the data dir, not a workspace"
    )]
    pub fn open(home: &Path) -> Result<Self, SessionError> {
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

    /// A new random session id (`s-` and 20 hex digits).
    pub fn new_id() -> String {
        let mut b = [0u8; 10];
        let _ = getrandom::fill(&mut b);
        let mut s = String::from("s-");
        for x in b {
            s.push_str(&format!("{x:02x}"));
        }
        s
    }

    /// Checks a caller's session id.
    pub fn check_id(id: &str) -> Result<(), SessionError> {
        let ok = !id.is_empty()
            && id.len() <= MAX_SESSION_ID
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if ok {
            Ok(())
        } else {
            Err(SessionError::BadId(id.chars().take(80).collect()))
        }
    }

    /// The session's history, or `NotFound` (also for another principal's). With `agent`,
    /// a session of another agent is an error naming it.
    pub fn history(
        &self,
        principal: &Principal,
        id: &str,
        agent: Option<&str>,
    ) -> Result<Vec<Message>, SessionError> {
        Self::check_id(id)?;
        let conn = self.lock();
        let owner: Option<String> = conn
            .query_row(
                "SELECT agent FROM sessions WHERE principal = ?1 AND id = ?2",
                params![principal.as_str(), id],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.db(e))?;
        let Some(owner) = owner else {
            return Err(SessionError::NotFound(id.to_owned()));
        };
        if let Some(asked) = agent
            && asked != owner
        {
            return Err(SessionError::OtherAgent {
                id: id.to_owned(),
                agent: owner,
                asked: asked.to_owned(),
            });
        }
        let mut stmt = conn
            .prepare(
                "SELECT message FROM messages WHERE principal = ?1 AND session = ?2 ORDER BY seq",
            )
            .map_err(|e| self.db(e))?;
        let rows = stmt
            .query_map(params![principal.as_str(), id], |r| r.get::<_, String>(0))
            .map_err(|e| self.db(e))?;
        let mut out = Vec::new();
        for r in rows {
            let text = r.map_err(|e| self.db(e))?;
            match serde_json::from_str::<Message>(&text) {
                Ok(m) => out.push(m),
                Err(e) => {
                    tracing::warn!(session = id, error = %e, "a stored message cannot be read; skipped")
                }
            }
        }
        Ok(out)
    }

    /// Whether the principal has this session.
    pub fn exists(&self, principal: &Principal, id: &str) -> Result<bool, SessionError> {
        Self::check_id(id)?;
        self.lock()
            .query_row(
                "SELECT 1 FROM sessions WHERE principal = ?1 AND id = ?2",
                params![principal.as_str(), id],
                |_| Ok(()),
            )
            .optional()
            .map(|o| o.is_some())
            .map_err(|e| self.db(e))
    }

    /// Appends one run (its messages and requests) to the session, creating it on its
    /// first run; one transaction.
    pub fn append_run(
        &self,
        principal: &Principal,
        id: &str,
        agent: &str,
        now: Timestamp,
        run: &RunOutcome,
    ) -> Result<(), SessionError> {
        Self::check_id(id)?;
        let mut conn = self.lock();
        // IMMEDIATE: the write lock first, so a read here cannot deadlock with another
        // process's write on the same data dir.
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(|e| self.db(e))?;
        let title: String = run
            .messages
            .first()
            .map(|m| m.content.chars().take(80).collect())
            .unwrap_or_default();
        let p = principal.as_str();
        tx.execute(
            "INSERT INTO sessions (principal, id, agent, title, created, updated) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?5) ON CONFLICT (principal, id) DO NOTHING",
            params![p, id, agent, title, now.unix_seconds()],
        )
        .map_err(|e| self.db(e))?;
        let runs: i64 = tx
            .query_row(
                "SELECT runs FROM sessions WHERE principal = ?1 AND id = ?2",
                params![p, id],
                |r| r.get(0),
            )
            .map_err(|e| self.db(e))?;
        let run_no = runs + 1;
        let next: i64 = tx
            .query_row(
                "SELECT COALESCE(MAX(seq), 0) FROM messages WHERE principal = ?1 AND session = ?2",
                params![p, id],
                |r| r.get(0),
            )
            .map_err(|e| self.db(e))?;
        for (i, m) in run.messages.iter().enumerate() {
            let text = serde_json::to_string(m).unwrap_or_default();
            tx.execute(
                "INSERT INTO messages (principal, session, seq, run, message) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![p, id, next + 1 + i as i64, run_no, text],
            )
            .map_err(|e| self.db(e))?;
        }
        for r in &run.requests {
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
             completion_tokens = completion_tokens + ?6 WHERE principal = ?1 AND id = ?2",
            params![
                p,
                id,
                run_no,
                now.unix_seconds(),
                run.usage.prompt_tokens as i64,
                run.usage.completion_tokens as i64
            ],
        )
        .map_err(|e| self.db(e))?;
        tx.commit().map_err(|e| self.db(e))
    }

    /// The principal's sessions, the most recently used first.
    pub fn list(&self, principal: &Principal) -> Result<Vec<SessionInfo>, SessionError> {
        let conn = self.lock();
        let mut stmt = conn
            .prepare(
                "SELECT s.id, s.agent, s.title, s.created, s.updated, s.runs, s.prompt_tokens, \
                 s.completion_tokens, (SELECT COUNT(*) FROM messages m WHERE m.principal = s.principal AND m.session = s.id) \
                 FROM sessions s WHERE s.principal = ?1 ORDER BY s.updated DESC, s.id",
            )
            .map_err(|e| self.db(e))?;
        let rows = stmt
            .query_map(params![principal.as_str()], |r| {
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
                })
            })
            .map_err(|e| self.db(e))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(|e| self.db(e))
    }

    /// One session's listing, or `NotFound`.
    pub fn info(&self, principal: &Principal, id: &str) -> Result<SessionInfo, SessionError> {
        Self::check_id(id)?;
        self.list(principal)?
            .into_iter()
            .find(|s| s.id == id)
            .ok_or_else(|| SessionError::NotFound(id.to_owned()))
    }

    /// Deletes a session of the principal; `NotFound` when there is none.
    pub fn delete(&self, principal: &Principal, id: &str) -> Result<(), SessionError> {
        Self::check_id(id)?;
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
        if n == 0 {
            return Err(SessionError::NotFound(id.to_owned()));
        }
        Ok(())
    }

    /// Deletes every session not used since `before`; returns how many.
    pub fn sweep(&self, before: Timestamp) -> Result<usize, SessionError> {
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
