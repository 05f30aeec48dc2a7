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
//! The server lets a connection take a lock it already holds again (and counts it), so with
//! one connection per replica it cannot tell two holders on the same replica apart. This
//! replica's own holders are therefore kept here too ([`Inner::held`]): a lock held here is
//! refused here without asking the server. Giving a lock back is two steps: forgetting it
//! here, at once and synchronously (so a `Drop` can do it and the next holder on this
//! replica need not wait), then unlocking on the server later. A holder that takes the
//! same lock in between is counted twice by the server and once by the late unlock, and
//! keeps it. Each lock remembers the connection that took it: after a reconnect the server
//! has already let the old connection's locks go, and a late unlock of one must not release
//! a new holder's lock.
//!
//! If that connection breaks while locks are held (the index restarted), they are gone on
//! the server too; the next request reconnects, and holders learn of it only in the log —
//! the index being down is the bigger news then. Their holders on this replica still
//! exclude each other until they give the locks back.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError};

use tokio::sync::{Mutex, oneshot};
use tokio_postgres::Client;
use tokio_postgres::types::Type;

use crate::error::SharedError;
use crate::pg::Pg;

/// What each kind of lock seeds its hash with (arbitrary constants of ours, distinct).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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

/// A lock: its kind and text.
type Key = (LockKind, String);

/// Which connection took a lock: the count of connections made before it.
pub(crate) type Generation = u64;

#[derive(Debug)]
pub(crate) struct Locks {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    pg: Arc<Pg>,
    conn: Mutex<Connection>,
    /// The locks held on this replica, with the connection that took each; `None` while
    /// one is being taken. Only ever locked for a moment, never across an await.
    held: std::sync::Mutex<HashMap<Key, Option<Generation>>>,
}

#[derive(Debug, Default)]
struct Connection {
    client: Option<Client>,
    generation: Generation,
}

impl Locks {
    pub(crate) fn new(pg: Arc<Pg>) -> Self {
        Self {
            inner: Arc::new(Inner {
                pg,
                conn: Mutex::new(Connection::default()),
                held: std::sync::Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Takes the lock `(kind, text)` if nobody holds it; `false` when someone does (on any
    /// replica, this one included). Must run on the backend's runtime. A caller that goes
    /// away before the answer leaves no lock behind.
    pub(crate) async fn try_lock(&self, kind: LockKind, text: &str) -> Result<bool, SharedError> {
        let key = (kind, text.to_owned());
        {
            let mut held = self.inner.held();
            if held.contains_key(&key) {
                return Ok(false);
            }
            held.insert(key.clone(), None);
        }
        // Taken by a task of its own, so the answer is recorded even if this caller is
        // dropped halfway; a lock taken for nobody is given back by the claim's `Drop`.
        let (tx, rx) = oneshot::channel();
        let inner = self.inner.clone();
        tokio::spawn(async move {
            let _ = tx.send(inner.take(key).await);
        });
        match rx.await {
            Ok(Ok(Some(claim))) => {
                claim.keep();
                Ok(true)
            }
            Ok(Ok(None)) => Ok(false),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(SharedError::Runtime(
                "taking a lock: the task was lost".into(),
            )),
        }
    }

    /// Releases a lock this replica holds, the first half, synchronous (a `Drop` can call
    /// it): this replica no longer holds the lock, and another holder here may take it at
    /// once. The server still holds it for this replica until [`Self::release_on_server`]
    /// with the generation returned (`None`: the lock was not held here, nothing to do).
    pub(crate) fn release_here(&self, kind: LockKind, text: &str) -> Option<Generation> {
        self.inner.release_here(&(kind, text.to_owned()))
    }

    /// The second half of releasing a lock ([`Self::release_here`]). Must run on the
    /// backend's runtime.
    pub(crate) async fn release_on_server(
        &self,
        kind: LockKind,
        text: &str,
        generation: Generation,
    ) -> Result<(), SharedError> {
        self.inner
            .release_on_server(&(kind, text.to_owned()), generation)
            .await
    }
}

impl Inner {
    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Option<Generation>>> {
        // Inserts and removals only: nothing half done to see after a panic.
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn release_here(&self, key: &Key) -> Option<Generation> {
        self.held().remove(key).flatten()
    }

    /// Asks the server for `key` (already marked as being taken here) and records the
    /// answer.
    async fn take(self: Arc<Self>, key: Key) -> Result<Option<Claim>, SharedError> {
        let asked = async {
            let mut conn = self.conn.lock().await;
            let client = self.connected(&mut conn).await?;
            let row = client
                .query_typed_one(
                    "SELECT pg_try_advisory_lock(hashtextextended($1, $2))",
                    &[(&key.1, Type::TEXT), (&key.0.seed(), Type::INT8)],
                )
                .await?;
            Ok::<_, SharedError>((row.get::<_, bool>(0), conn.generation))
        }
        .await;
        let mut held = self.held();
        match asked {
            Ok((true, generation)) => {
                held.insert(key.clone(), Some(generation));
                drop(held);
                Ok(Some(Claim {
                    inner: self.clone(),
                    key: Some(key),
                }))
            }
            Ok((false, _)) => {
                held.remove(&key);
                Ok(None)
            }
            Err(e) => {
                held.remove(&key);
                Err(e)
            }
        }
    }

    async fn release_on_server(
        &self,
        key: &Key,
        generation: Generation,
    ) -> Result<(), SharedError> {
        let conn = self.conn.lock().await;
        let Some(client) = conn.client.as_ref() else {
            return Ok(());
        };
        if conn.generation != generation || client.is_closed() {
            // The connection that took it is gone, and the lock with it.
            return Ok(());
        }
        client
            .query_typed_one(
                "SELECT pg_advisory_unlock(hashtextextended($1, $2))",
                &[(&key.1, Type::TEXT), (&key.0.seed(), Type::INT8)],
            )
            .await?;
        Ok(())
    }

    /// The lock connection, made first when there is none or it broke.
    async fn connected<'c>(&self, conn: &'c mut Connection) -> Result<&'c Client, SharedError> {
        if conn.client.as_ref().is_none_or(Client::is_closed) {
            if conn.client.is_some() {
                tracing::warn!(
                    "the shared index's lock connection broke: the locks this replica held \
                     (busy sessions, concurrency slots) were released on the server"
                );
            }
            conn.client = None;
            conn.client = Some(self.pg.connect().await?);
            conn.generation += 1;
        }
        conn.client
            .as_ref()
            .ok_or_else(|| SharedError::Runtime("no lock connection".into()))
    }
}

/// A lock just taken, on its way to the caller of [`Locks::try_lock`]: given back when
/// dropped before [`Claim::keep`] (the caller went away).
struct Claim {
    inner: Arc<Inner>,
    key: Option<Key>,
}

impl Claim {
    fn keep(mut self) {
        self.key = None;
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let Some(key) = self.key.take() else {
            return;
        };
        let Some(generation) = self.inner.release_here(&key) else {
            return;
        };
        // Dropped on the backend's runtime (in the taking task, or with the channel it
        // was sent on); if that runtime is gone, so is the connection and the lock.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let inner = self.inner.clone();
            runtime.spawn(async move {
                if let Err(e) = inner.release_on_server(&key, generation).await {
                    tracing::warn!("giving back a lock nobody received: {e}");
                }
            });
        }
    }
}
