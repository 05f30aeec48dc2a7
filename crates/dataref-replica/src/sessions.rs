//! Agent sessions shared by every replica: the same three tables as the SQLite store
//! (`dataref_sessions`, `dataref_session_messages`, `dataref_session_requests`), keyed by
//! principal and id, so another principal's session is not found exactly as an unknown
//! one is. A session answering a message is held by an advisory lock on this replica's
//! lock connection ([`crate::locks`]): a second message through any replica is refused,
//! and a replica that dies lets its sessions go with its connection.
//!
//! Appends to one session are serialised by its row (`SELECT … FOR UPDATE`), so each run's
//! messages follow the last run's even when two replicas append at once. The sweep takes
//! old sessions in batches with `FOR UPDATE SKIP LOCKED`: several replicas sweeping at once
//! each remove different sessions, none twice, and none waits on another.

use std::sync::Arc;

use async_trait::async_trait;
use dataref_agent::{
    NewRun, SessionBackend, SessionError, SessionInfo, SessionLock, StoredSession, Usage,
};
use dataref_protocol::{Principal, Timestamp};

use crate::Backend;
use crate::error::SharedError;
use crate::locks::{Held, LockKind};

/// Sessions swept per statement: a month of sessions goes in many short transactions, each
/// well within `[shared] timeout`.
const SWEEP_BATCH: i64 = 500;

/// The agent sessions in the shared index.
#[derive(Debug)]
pub(crate) struct PgSessions {
    backend: Arc<Backend>,
}

impl PgSessions {
    pub(crate) fn new(backend: Arc<Backend>) -> Self {
        Self { backend }
    }
}

/// What the person is told stays short; the index's own words go to the log through
/// `detail`.
fn session_error(e: SharedError) -> SessionError {
    if e.is_unavailable() {
        SessionError::Unavailable {
            detail: e.to_string(),
        }
    } else {
        SessionError::Database {
            path: "dataref_sessions (the shared index)".into(),
            detail: e.to_string(),
        }
    }
}

/// The lock's text: the id first (it has no `/`), so no two (principal, id) pairs share one.
fn lock_text(principal: &Principal, id: &str) -> String {
    format!("{id}/{}", principal.as_str())
}

/// Column `i` of `row`; a value of another type is the index's fault, not its absence.
fn col<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a tokio_postgres::Row,
    i: usize,
) -> Result<T, SharedError> {
    row.try_get(i)
        .map_err(|e| SharedError::Index(e.to_string()))
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn to_u32(n: i64) -> u32 {
    u32::try_from(n.max(0)).unwrap_or(u32::MAX)
}

fn to_u64(n: i64) -> u64 {
    u64::try_from(n.max(0)).unwrap_or(0)
}

#[async_trait]
impl SessionBackend for PgSessions {
    fn load(&self, principal: &Principal, id: &str) -> Result<Option<StoredSession>, SessionError> {
        let pg = self.backend.pg.clone();
        let (p, id) = (principal.as_str().to_owned(), id.to_owned());
        self.backend
            .io
            .block("reading an agent session", async move {
                let c = pg.get().await?;
                let Some(row) = c
                    .query_opt(
                        "SELECT agent FROM dataref_sessions WHERE principal = $1 AND id = $2",
                        &[&p, &id],
                    )
                    .await?
                else {
                    return Ok(None);
                };
                let messages = c
                    .query(
                        "SELECT message FROM dataref_session_messages \
                         WHERE principal = $1 AND session = $2 ORDER BY seq",
                        &[&p, &id],
                    )
                    .await?
                    .iter()
                    .map(|r| col::<String>(r, 0))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Some(StoredSession {
                    agent: col(&row, 0)?,
                    messages,
                }))
            })
            .map_err(session_error)
    }

    fn append(
        &self,
        principal: &Principal,
        id: &str,
        run: &NewRun<'_>,
    ) -> Result<(), SessionError> {
        let pg = self.backend.pg.clone();
        let (p, id) = (principal.as_str().to_owned(), id.to_owned());
        let (agent, title) = (run.agent.to_owned(), run.title.to_owned());
        let now = run.now.unix_seconds();
        let starts_run = run.starts_run;
        let messages = run.messages.to_vec();
        let turns: Vec<i64> = run.requests.iter().map(|r| i64::from(r.turn)).collect();
        let prompt: Vec<i64> = run
            .requests
            .iter()
            .map(|r| to_i64(r.usage.prompt_tokens))
            .collect();
        let completion: Vec<i64> = run
            .requests
            .iter()
            .map(|r| to_i64(r.usage.completion_tokens))
            .collect();
        let context: Vec<i64> = run
            .requests
            .iter()
            .map(|r| to_i64(r.context_tokens))
            .collect();
        let usage = (
            to_i64(run.usage.prompt_tokens),
            to_i64(run.usage.completion_tokens),
        );
        let ungrounded = i64::from(run.ungrounded);
        self.backend
            .io
            .block("appending to an agent session", async move {
                let mut c = pg.get().await?;
                let tx = c.transaction().await?;
                tx.execute(
                    "INSERT INTO dataref_sessions (principal, id, agent, title, created, updated) \
                     VALUES ($1, $2, $3, $4, $5, $5) ON CONFLICT (principal, id) DO NOTHING",
                    &[&p, &id, &agent, &title, &now],
                )
                .await?;
                // The session's row, held to the commit: appends to it take turns here,
                // whichever replica makes them.
                let runs: i64 = tx
                    .query_one(
                        "SELECT runs FROM dataref_sessions WHERE principal = $1 AND id = $2 \
                         FOR UPDATE",
                        &[&p, &id],
                    )
                    .await
                    .map_err(SharedError::from)
                    .and_then(|r| col(&r, 0))?;
                // A continuation of a run kept in pieces belongs to the session's last run.
                let run_no = if starts_run { runs + 1 } else { runs.max(1) };
                let last: i64 = tx
                    .query_one(
                        "SELECT COALESCE(MAX(seq), 0)::bigint FROM dataref_session_messages \
                         WHERE principal = $1 AND session = $2",
                        &[&p, &id],
                    )
                    .await
                    .map_err(SharedError::from)
                    .and_then(|r| col(&r, 0))?;
                tx.execute(
                    "INSERT INTO dataref_session_messages (principal, session, seq, run, message) \
                     SELECT $1::text, $2::text, $3::bigint + t.n, $4::bigint, t.m \
                     FROM unnest($5::text[]) WITH ORDINALITY AS t(m, n)",
                    &[&p, &id, &last, &run_no, &messages],
                )
                .await?;
                tx.execute(
                    "INSERT INTO dataref_session_requests \
                     (principal, session, run, turn, prompt_tokens, completion_tokens, context_tokens) \
                     SELECT $1::text, $2::text, $3::bigint, t.turn, t.p, t.c, t.x \
                     FROM unnest($4::bigint[], $5::bigint[], $6::bigint[], $7::bigint[]) \
                     AS t(turn, p, c, x)",
                    &[&p, &id, &run_no, &turns, &prompt, &completion, &context],
                )
                .await?;
                tx.execute(
                    "UPDATE dataref_sessions SET runs = $3, updated = $4, \
                     prompt_tokens = prompt_tokens + $5, completion_tokens = completion_tokens + $6, \
                     ungrounded = ungrounded + $7 \
                     WHERE principal = $1 AND id = $2",
                    &[&p, &id, &run_no, &now, &usage.0, &usage.1, &ungrounded],
                )
                .await?;
                tx.commit().await?;
                Ok(())
            })
            .map_err(session_error)
    }

    fn list(
        &self,
        principal: &Principal,
        only: Option<&str>,
    ) -> Result<Vec<SessionInfo>, SessionError> {
        let pg = self.backend.pg.clone();
        let p = principal.as_str().to_owned();
        let only = only.map(str::to_owned);
        self.backend
            .io
            .block("listing agent sessions", async move {
                let c = pg.get().await?;
                let rows = c
                    .query(
                        "SELECT s.id, s.agent, s.title, s.created, s.updated, s.runs, \
                         s.prompt_tokens, s.completion_tokens, \
                         (SELECT COUNT(*) FROM dataref_session_messages m \
                          WHERE m.principal = s.principal AND m.session = s.id), \
                         s.ungrounded \
                         FROM dataref_sessions s \
                         WHERE s.principal = $1 AND ($2::text IS NULL OR s.id = $2) \
                         ORDER BY s.updated DESC, s.id",
                        &[&p, &only],
                    )
                    .await?;
                rows.iter()
                    .map(|r| {
                        Ok(SessionInfo {
                            id: col(r, 0)?,
                            agent: col(r, 1)?,
                            title: col(r, 2)?,
                            created: Timestamp(col(r, 3)?),
                            updated: Timestamp(col(r, 4)?),
                            runs: to_u32(col(r, 5)?),
                            usage: Usage {
                                prompt_tokens: to_u64(col(r, 6)?),
                                completion_tokens: to_u64(col(r, 7)?),
                            },
                            messages: to_u32(col(r, 8)?),
                            ungrounded: to_u32(col(r, 9)?),
                        })
                    })
                    .collect::<Result<Vec<_>, SharedError>>()
            })
            .map_err(session_error)
    }

    fn delete(&self, principal: &Principal, id: &str) -> Result<bool, SessionError> {
        let pg = self.backend.pg.clone();
        let (p, id) = (principal.as_str().to_owned(), id.to_owned());
        self.backend
            .io
            .block("deleting an agent session", async move {
                let c = pg.get().await?;
                // Its messages and requests go with it (`ON DELETE CASCADE`).
                let n = c
                    .execute(
                        "DELETE FROM dataref_sessions WHERE principal = $1 AND id = $2",
                        &[&p, &id],
                    )
                    .await?;
                Ok(n > 0)
            })
            .map_err(session_error)
    }

    fn sweep(&self, before: Timestamp) -> Result<usize, SessionError> {
        let mut removed = 0usize;
        loop {
            let pg = self.backend.pg.clone();
            let cut = before.unix_seconds();
            let n = self
                .backend
                .io
                .block("sweeping agent sessions", async move {
                    let c = pg.get().await?;
                    // Rows another sweeper (or an append) holds are skipped, not waited for.
                    Ok(c.execute(
                        "DELETE FROM dataref_sessions WHERE (principal, id) IN ( \
                             SELECT principal, id FROM dataref_sessions WHERE updated < $1 \
                             ORDER BY updated LIMIT $2 FOR UPDATE SKIP LOCKED)",
                        &[&cut, &SWEEP_BATCH],
                    )
                    .await?)
                })
                .map_err(session_error)?;
            removed += usize::try_from(n).unwrap_or(usize::MAX);
            if n < SWEEP_BATCH.unsigned_abs() {
                return Ok(removed);
            }
        }
    }

    async fn lock(
        &self,
        principal: &Principal,
        id: &str,
    ) -> Result<Option<Box<dyn SessionLock>>, SessionError> {
        let backend = self.backend.clone();
        let text = lock_text(principal, id);
        self.backend
            .io
            .run("claiming an agent session", async move {
                // Made here, on the backend's runtime: if the caller went away meanwhile,
                // the answer is dropped with the task and the lock let go.
                Ok(backend
                    .locks
                    .try_lock(LockKind::Session, &text)
                    .await?
                    .map(|held| Box::new(HeldSession(held)) as Box<dyn SessionLock>))
            })
            .await
            .map_err(session_error)
    }
}

/// A session held on this replica's lock connection ([`crate::locks::Held`]: let go in
/// the background when dropped).
#[derive(Debug)]
struct HeldSession(Held);

#[async_trait]
impl SessionLock for HeldSession {
    async fn release(self: Box<Self>) {
        self.0.release().await;
    }
}
