//! Locks every replica sees, held by this replica's own connection to the index.
//!
//! PostgreSQL's session-level advisory locks belong to the connection that took them. All of
//! a replica's locks are taken on one dedicated connection, so when the replica dies (or is
//! killed with `kill -9`), the server notices the connection is gone and every lock it held
//! is released at once: a crash never leaves a session "busy" or a concurrency slot taken
//! for good. Keys are 64-bit hashes the server computes of a text (`principal`, an id) and a
//! seed per kind of lock, so different kinds never collide by design and the same text means
//! the same lock on every replica.
//!
//! If that connection breaks while locks are held (the index restarted), they are gone on
//! the server too; the next request reconnects, and holders learn of it only in the log —
//! the index being down is the bigger news then.

use std::sync::Arc;

use tokio::sync::Mutex;
use tokio_postgres::Client;

use crate::error::SharedError;
use crate::pg::Pg;

/// What each kind of lock seeds its hash with (arbitrary constants of ours, distinct).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LockKind {
    /// An agent session answering a message: one message at a time per session.
    Session,
    /// One of a principal's concurrency slots.
    Slot,
}

impl LockKind {
    fn seed(self) -> i64 {
        match self {
            Self::Session => 0x5e55_1011,
            Self::Slot => 0x5107_5107,
        }
    }
}

#[derive(Debug)]
pub(crate) struct Locks {
    pg: Arc<Pg>,
    conn: Mutex<Option<Client>>,
}

impl Locks {
    pub(crate) fn new(pg: Arc<Pg>) -> Self {
        Self {
            pg,
            conn: Mutex::new(None),
        }
    }

    /// Takes the lock `(kind, text)` if nobody holds it; `false` when someone does (on any
    /// replica, this one included). Must run on the backend's runtime.
    pub(crate) async fn try_lock(&self, kind: LockKind, text: &str) -> Result<bool, SharedError> {
        let mut conn = self.conn.lock().await;
        let client = self.connected(&mut conn).await?;
        let row = client
            .query_one(
                "SELECT pg_try_advisory_lock(hashtextextended($1, $2))",
                &[&text, &kind.seed()],
            )
            .await?;
        Ok(row.get::<_, bool>(0))
    }

    /// Releases a lock this replica holds (a lock it does not hold: nothing happens).
    pub(crate) async fn unlock(&self, kind: LockKind, text: &str) -> Result<(), SharedError> {
        let mut conn = self.conn.lock().await;
        let client = self.connected(&mut conn).await?;
        client
            .query_one(
                "SELECT pg_advisory_unlock(hashtextextended($1, $2))",
                &[&text, &kind.seed()],
            )
            .await?;
        Ok(())
    }

    /// The lock connection, made first when there is none or it broke.
    async fn connected<'c>(&self, conn: &'c mut Option<Client>) -> Result<&'c Client, SharedError> {
        if conn.as_ref().is_none_or(Client::is_closed) {
            if conn.is_some() {
                tracing::warn!(
                    "the shared index's lock connection broke: the locks this replica held \
                     (busy sessions, concurrency slots) were released on the server"
                );
            }
            *conn = None;
            *conn = Some(self.pg.connect().await?);
        }
        conn.as_ref()
            .ok_or_else(|| SharedError::Runtime("no lock connection".into()))
    }
}
