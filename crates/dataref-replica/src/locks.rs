//! Locks every replica sees, held by this replica's own connection to the index.
//!
//! PostgreSQL's session-level advisory locks belong to the connection that took them. All of
//! a replica's locks are taken on one dedicated connection (`application_name`
//! `dataref-locks`), so when the replica dies (or is killed with `kill -9`), the server
//! notices the connection is gone and every lock it held is released at once: a crash never
//! leaves a session "busy" or a concurrency slot taken for good. A replica whose host
//! vanishes without closing its connection is noticed by TCP keepalives, which this
//! connection asks the server for (10 s idle, then 3 probes 5 s apart, `tcp_user_timeout`
//! 30 s): its locks go within about half a minute, not the hours of the system defaults.
//! Keys are 64-bit hashes the server computes of a text (`principal`, an id) and a seed per
//! kind of lock, so different kinds never collide by design and the same text means the
//! same lock on every replica.
//!
//! The server lets a connection take a lock it already holds again (and counts it), so with
//! one connection per replica it cannot tell two holders on the same replica apart. This
//! replica's own holders are therefore kept here too ([`State::held`]): a lock held here is
//! refused here without asking the server. Every statement on the connection runs under
//! one mutex, and the map changes only under it when the server is involved, so the two
//! always agree. A lock is given back ([`Held`]) in two steps: forgotten here at once and
//! synchronously (a `Drop` can do it), and queued for the server, where it is unlocked
//! before anything else the connection does next — a holder that takes the same lock again
//! right after finds it unlocked first, and an unlock is never abandoned halfway.
//!
//! Every statement is bounded by [`LOCK_TIMEOUT`]. A connection that fails or times out is
//! given up (its server process remembered), and the next use makes a new one: that first
//! ends the old server process if it is still there (`pg_terminate_backend`, so its locks
//! are not left with a connection nobody uses), then takes every lock this replica still
//! holds again, before anything else. A lock another replica took in between (the window
//! between the old connection's end and the new one, about a second when this replica sees
//! the break itself) cannot be had: it is logged as an error, and its holder here is not
//! told — it runs on, so for that while the lock has two holders (a session answering on
//! two replicas, one slot too many); it still excludes the other holders on this replica
//! until it lets go. While something is held, a background task checks the connection every
//! second and pings it every [`PING_EVERY`], so a broken connection is replaced, and the
//! locks taken again, without waiting for the next request. When the connection cannot be
//! made, callers are answered "unavailable" (never "busy"), at once for a second after each
//! failed attempt.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{Mutex, oneshot};
use tokio_postgres::Client;
use tokio_postgres::types::Type;

use crate::error::SharedError;
use crate::pg::Pg;

/// The longest any statement on the lock connection (or making it) may take; past it the
/// connection is given up. A lock statement is one short round trip: even a busy index
/// answers it in milliseconds.
pub(crate) const LOCK_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a new connection waits for the server process of the one given up on to end.
/// Its locks are still held until it does; meanwhile callers are answered "unavailable".
const STALE_WAIT: Duration = Duration::from_secs(1);
/// After a failed attempt to connect, callers are answered at once for this long.
const RECONNECT_PAUSE: Duration = Duration::from_secs(1);
/// How often the background task looks at the connection while something is held.
const TICK: Duration = Duration::from_secs(1);
/// A connection holding locks that has been silent this long is pinged.
const PING_EVERY: Duration = Duration::from_secs(10);
/// How long [`Held::release`] waits for the server to have the lock back (the unlock
/// itself goes on past it).
const RELEASE_WAIT: Duration = LOCK_TIMEOUT;

/// Set on the lock connection. The keepalives are the server's side of noticing a replica
/// gone without a word; `application_name` lets an operator find it in `pg_stat_activity`.
const SETUP: &str = "SET application_name = 'dataref-locks'; \
    SET tcp_keepalives_idle = 10; SET tcp_keepalives_interval = 5; SET tcp_keepalives_count = 3; \
    SELECT set_config(name, '30000', false) FROM pg_settings WHERE name = 'tcp_user_timeout'";
/// The connection's server process, told apart from a later one with the same pid.
const WHO: &str = "SELECT pg_backend_pid(), (extract(epoch FROM backend_start) * 1000000)::int8 \
    FROM pg_stat_activity WHERE pid = pg_backend_pid()";
/// Ends the server processes of connections given up on (`$1` pids, `$2` start times);
/// one row for each still there.
const TERMINATE: &str = "SELECT pg_terminate_backend(a.pid) FROM pg_stat_activity a \
    JOIN unnest($1::int4[], $2::int8[]) AS s(pid, started) \
    ON a.pid = s.pid AND (extract(epoch FROM a.backend_start) * 1000000)::int8 = s.started";
const TAKE: &str = "SELECT pg_try_advisory_lock(hashtextextended($1, $2))";
/// Every row is evaluated (no `LIMIT`): each lock is asked for exactly once.
const RETAKE: &str = "SELECT u.n, pg_try_advisory_lock(hashtextextended(u.t, u.s)) \
    FROM unnest($1::text[], $2::int8[]) WITH ORDINALITY AS u(t, s, n)";
const UNLOCK: &str = "SELECT pg_advisory_unlock(hashtextextended(u.t, u.s)) \
    FROM unnest($1::text[], $2::int8[]) AS u(t, s)";

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

/// Which connection holds a lock: the count of connections made up to it.
type Generation = u64;

/// How this replica holds a lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hold {
    /// On the server, through connection `Generation` (taken again on the next one when
    /// that one is lost).
    Server(Generation),
    /// Here only: another replica took it while this replica's connection was down.
    Lost,
}

#[derive(Debug)]
pub(crate) struct Locks {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    pg: Arc<Pg>,
    /// Every statement on the lock connection runs holding this.
    conn: Mutex<Connection>,
    /// Only ever locked for a moment, never across an await.
    state: std::sync::Mutex<State>,
    /// Whether the background task ([`Inner::tend`]) runs.
    tending: AtomicBool,
}

#[derive(Debug, Default)]
struct State {
    /// The locks held on this replica.
    held: HashMap<Key, Hold>,
    /// Locks given back here and still owed to the server, with the connection holding
    /// each; unlocked before that connection does anything else (moot once it is gone).
    unlocks: Vec<(Key, Generation)>,
}

/// A server process of the lock connection: its pid and start (microseconds since the
/// epoch), so a later process with the same pid is never taken for it.
#[derive(Debug, Clone, Copy)]
struct Process {
    pid: i32,
    started: i64,
}

#[derive(Debug)]
struct Connection {
    client: Option<Client>,
    generation: Generation,
    /// `client`'s server process.
    process: Option<Process>,
    /// Server processes of connections given up on that may still be there, holding
    /// their locks: ended before the next connection takes anything.
    stale: Vec<Process>,
    /// After a failed attempt to connect: callers are answered at once until then.
    retry_at: Option<Instant>,
    last_error: String,
    /// When the connection last answered a statement.
    answered: Instant,
}

impl Locks {
    pub(crate) fn new(pg: Arc<Pg>) -> Self {
        Self {
            inner: Arc::new(Inner {
                pg,
                conn: Mutex::new(Connection {
                    client: None,
                    generation: 0,
                    process: None,
                    stale: Vec::new(),
                    retry_at: None,
                    last_error: String::new(),
                    answered: Instant::now(),
                }),
                state: std::sync::Mutex::new(State::default()),
                tending: AtomicBool::new(false),
            }),
        }
    }

    /// Takes the lock `(kind, text)` if nobody holds it; `None` when someone does (on any
    /// replica, this one included). Must run on the backend's runtime. A caller that goes
    /// away before the answer leaves no lock behind.
    pub(crate) async fn try_lock(
        &self,
        kind: LockKind,
        text: &str,
    ) -> Result<Option<Held>, SharedError> {
        self.try_lock_any(kind, vec![text.to_owned()]).await
    }

    /// Takes the first of `texts`, in order, that nobody holds: one wait for the
    /// connection, and a round trip only for each lock this replica does not hold itself.
    /// `None` when every one is held. Must run on the backend's runtime.
    pub(crate) async fn try_lock_any(
        &self,
        kind: LockKind,
        texts: Vec<String>,
    ) -> Result<Option<Held>, SharedError> {
        let free: Vec<Key> = {
            let state = self.inner.state();
            texts
                .into_iter()
                .map(|text| (kind, text))
                .filter(|key| !state.held.contains_key(key))
                .collect()
        };
        if free.is_empty() {
            return Ok(None);
        }
        self.inner.tend_in_background();
        // Taken by a task of its own, so the answer is recorded even if this caller is
        // dropped halfway; a lock taken for nobody is given back as its `Held` drops.
        let (tx, rx) = oneshot::channel();
        let inner = self.inner.clone();
        tokio::spawn(async move {
            let taken = inner.take_first(free, &tx).await;
            let _ = tx.send(taken);
        });
        rx.await
            .map_err(|_| SharedError::Runtime("taking a lock: the task was lost".into()))?
    }
}

/// A lock this replica holds. [`Held::release`] gives it back and waits until the server
/// has it back too; dropped, it is given back in the background. Either way the next
/// holder on this replica may take it at once. Holds the locks weakly: when the backend is
/// gone, so is the connection and every lock with it.
#[derive(Debug)]
pub(crate) struct Held {
    inner: Weak<Inner>,
    /// The backend's runtime, where the unlock runs.
    runtime: tokio::runtime::Handle,
    /// `None` once given back.
    key: Option<Key>,
}

impl Held {
    /// Gives the lock back: at once on this replica, and on the server before this
    /// returns (or [`RELEASE_WAIT`] has passed; the unlock still runs to its end).
    pub(crate) async fn release(mut self) {
        if let Some(done) = self.give_back() {
            let _ = done.await;
        }
    }

    /// Forgets the lock here and starts giving it back on the server; the receiver hears
    /// when that is done. `None` when there is nothing to give back.
    fn give_back(&mut self) -> Option<oneshot::Receiver<()>> {
        let key = self.key.take()?;
        let inner = self.inner.upgrade()?;
        if !inner.release_here(key) {
            return None;
        }
        let (tx, rx) = oneshot::channel();
        // If that runtime is gone, so is the connection and the lock.
        self.runtime.spawn(async move {
            // A task of its own: a waiter that gives up never cuts an unlock short.
            let unlock = tokio::spawn(async move { inner.unlock_owed().await });
            let _ = tokio::time::timeout(RELEASE_WAIT, unlock).await;
            let _ = tx.send(());
        });
        Some(rx)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let _ = self.give_back();
    }
}

/// Runs one statement of the lock connection within [`LOCK_TIMEOUT`]. Any failure means
/// the connection cannot be used, whatever the server said: "unavailable" to callers.
async fn bounded<T, E>(
    what: &'static str,
    fut: impl Future<Output = Result<T, E>>,
) -> Result<T, SharedError>
where
    SharedError: From<E>,
{
    match tokio::time::timeout(LOCK_TIMEOUT, fut).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(e)) => Err(match SharedError::from(e) {
            e if e.is_unavailable() => e,
            e => SharedError::IndexUnreachable(format!("its lock connection failed: {e}")),
        }),
        Err(_) => Err(SharedError::TimedOut {
            what,
            after: LOCK_TIMEOUT,
        }),
    }
}

/// The texts and seeds of `keys`, as the statements take them.
fn columns<'k>(keys: impl Iterator<Item = &'k Key>) -> (Vec<String>, Vec<i64>) {
    keys.map(|(kind, text)| (text.clone(), kind.seed())).unzip()
}

impl Connection {
    /// The client, when there is one that has not closed.
    fn live(&self) -> Option<&Client> {
        self.client.as_ref().filter(|c| !c.is_closed())
    }

    /// Gives the connection up after `why`: its server process may still be there and is
    /// ended by the next connection. `held`: how many locks this replica holds.
    fn give_up(&mut self, why: &SharedError, held: usize) {
        if self.client.take().is_some() {
            if let Some(process) = self.process.take() {
                self.stale.push(process);
            }
            tracing::warn!(
                "the shared index's lock connection failed ({why}): the {held} locks this \
                 replica holds (busy sessions, concurrency slots) are taken again on a new one"
            );
        }
    }
}

impl Inner {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Inserts and removals only: nothing half done to see after a panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Forgets `key` here; true when the server still holds it for this replica (the
    /// unlock is then queued).
    fn release_here(&self, key: Key) -> bool {
        let mut state = self.state();
        match state.held.remove(&key) {
            Some(Hold::Server(generation)) => {
                state.unlocks.push((key, generation));
                true
            }
            Some(Hold::Lost) | None => false,
        }
    }

    fn holding(&self) -> (usize, bool) {
        let state = self.state();
        (
            state.held.len(),
            state.held.values().any(|h| matches!(h, Hold::Server(_))),
        )
    }

    /// Takes the first of `keys` nobody holds, for the caller waiting on `tx`.
    async fn take_first(
        self: &Arc<Self>,
        keys: Vec<Key>,
        tx: &oneshot::Sender<Result<Option<Held>, SharedError>>,
    ) -> Result<Option<Held>, SharedError> {
        let mut conn = self.conn.lock().await;
        if tx.is_closed() {
            // Its caller gave up while this waited: nothing to take for nobody.
            return Ok(None);
        }
        self.connected(&mut conn).await?;
        self.unlock_due(&mut conn).await?;
        for key in keys {
            if self.state().held.contains_key(&key) {
                continue;
            }
            let Some(client) = conn.live() else {
                return Err(SharedError::IndexUnreachable(
                    "its lock connection closed".into(),
                ));
            };
            let asked = bounded("taking a lock", async {
                client
                    .query_typed_one(TAKE, &[(&key.1, Type::TEXT), (&key.0.seed(), Type::INT8)])
                    .await?
                    .try_get::<_, bool>(0)
            })
            .await;
            let taken = match asked {
                Ok(taken) => taken,
                Err(e) => {
                    conn.give_up(&e, self.holding().0);
                    return Err(e);
                }
            };
            conn.answered = Instant::now();
            if taken {
                self.state()
                    .held
                    .insert(key.clone(), Hold::Server(conn.generation));
                return Ok(Some(Held {
                    inner: Arc::downgrade(self),
                    runtime: tokio::runtime::Handle::current(),
                    key: Some(key),
                }));
            }
        }
        Ok(None)
    }

    /// Runs the unlocks owed to the server (for [`Held`]).
    async fn unlock_owed(&self) {
        let mut conn = self.conn.lock().await;
        if let Err(e) = self.unlock_due(&mut conn).await {
            tracing::debug!("giving locks back: {e}; they went with the connection");
        }
    }

    /// Unlocks on the server what was given back here, in one statement. Unlocks owed by a
    /// connection given up on are dropped: its locks go with it.
    async fn unlock_due(&self, conn: &mut Connection) -> Result<(), SharedError> {
        let owed = std::mem::take(&mut self.state().unlocks);
        let due: Vec<&Key> = owed
            .iter()
            .filter(|(_, generation)| *generation == conn.generation)
            .map(|(key, _)| key)
            .collect();
        if due.is_empty() {
            return Ok(());
        }
        let Some(client) = conn.live() else {
            return Ok(());
        };
        let (texts, seeds) = columns(due.into_iter());
        let unlocked = bounded(
            "giving locks back",
            client.query_typed(
                UNLOCK,
                &[(&texts, Type::TEXT_ARRAY), (&seeds, Type::INT8_ARRAY)],
            ),
        )
        .await;
        match unlocked {
            Ok(_) => {
                conn.answered = Instant::now();
                Ok(())
            }
            Err(e) => {
                conn.give_up(&e, self.holding().0);
                Err(e)
            }
        }
    }

    /// Makes sure there is a working connection holding every lock this replica holds.
    async fn connected(&self, conn: &mut Connection) -> Result<(), SharedError> {
        if conn.live().is_some() {
            return Ok(());
        }
        if conn.client.is_some() {
            let closed = SharedError::IndexUnreachable("the connection closed".into());
            conn.give_up(&closed, self.holding().0);
        }
        if let Some(at) = conn.retry_at
            && Instant::now() < at
        {
            return Err(SharedError::IndexUnreachable(format!(
                "its lock connection is down ({}); trying again in a moment",
                conn.last_error
            )));
        }
        match self.reconnect(conn).await {
            Ok(()) => {
                conn.retry_at = None;
                Ok(())
            }
            Err(e) => {
                conn.retry_at = Some(Instant::now() + RECONNECT_PAUSE);
                conn.last_error = e.to_string();
                Err(e)
            }
        }
    }

    /// A new connection: set up, the ones given up on ended, every lock held here taken
    /// again on it.
    async fn reconnect(&self, conn: &mut Connection) -> Result<(), SharedError> {
        let client = bounded("connecting the lock connection", self.pg.connect()).await?;
        let process = bounded("setting up the lock connection", async {
            client.batch_execute(SETUP).await?;
            let row = client.query_one(WHO, &[]).await?;
            Ok::<_, tokio_postgres::Error>(Process {
                pid: row.try_get(0)?,
                started: row.try_get(1)?,
            })
        })
        .await?;
        end_stale(&client, &conn.stale).await?;
        conn.stale.clear();
        conn.client = Some(client);
        conn.process = Some(process);
        conn.generation += 1;
        conn.answered = Instant::now();
        if let Err(e) = self.retake(conn).await {
            conn.give_up(&e, self.holding().0);
            return Err(e);
        }
        Ok(())
    }

    /// Takes every lock held here on an earlier connection again on this one, in one
    /// statement. One that cannot be had was taken by another replica meanwhile: it stays
    /// held here (its holder runs on), and the log says so.
    async fn retake(&self, conn: &mut Connection) -> Result<(), SharedError> {
        let generation = conn.generation;
        let keys: Vec<Key> = self
            .state()
            .held
            .iter()
            .filter(|(_, hold)| matches!(hold, Hold::Server(g) if *g < generation))
            .map(|(key, _)| key.clone())
            .collect();
        if keys.is_empty() {
            return Ok(());
        }
        let Some(client) = conn.live() else {
            return Err(SharedError::IndexUnreachable(
                "its lock connection closed".into(),
            ));
        };
        let (texts, seeds) = columns(keys.iter());
        let rows = bounded("taking this replica's locks again", async {
            client
                .query_typed(
                    RETAKE,
                    &[(&texts, Type::TEXT_ARRAY), (&seeds, Type::INT8_ARRAY)],
                )
                .await?
                .iter()
                .map(|row| Ok((row.try_get::<_, i64>(0)?, row.try_get::<_, bool>(1)?)))
                .collect::<Result<Vec<_>, tokio_postgres::Error>>()
        })
        .await?;
        conn.answered = Instant::now();
        let mut got = vec![false; keys.len()];
        for (n, taken) in rows {
            // `WITH ORDINALITY` counts from 1.
            if let Some(slot) = usize::try_from(n - 1).ok().and_then(|i| got.get_mut(i)) {
                *slot = taken;
            }
        }
        let (mut kept, mut lost) = (0usize, 0usize);
        let mut state = self.state();
        for (key, taken) in keys.into_iter().zip(got) {
            match state.held.get_mut(&key) {
                Some(hold @ Hold::Server(_)) if taken => {
                    *hold = Hold::Server(generation);
                    kept += 1;
                }
                Some(hold @ Hold::Server(_)) => {
                    *hold = Hold::Lost;
                    lost += 1;
                    tracing::error!(
                        "the lock `{}` ({:?}) was taken by another replica while this \
                         replica's lock connection was down: until its holder here lets \
                         go, it has two holders (a session answering on two replicas, or one \
                         concurrency slot too many)",
                        key.1,
                        key.0
                    );
                }
                // Given back while it was being taken again: owed to the server now.
                _ if taken => state.unlocks.push((key, generation)),
                _ => {}
            }
        }
        drop(state);
        tracing::warn!(
            "the shared index's lock connection is back: {kept} locks this replica holds \
             taken again, {lost} lost to other replicas"
        );
        Ok(())
    }

    /// Starts the background task that keeps the connection (once per replica).
    fn tend_in_background(self: &Arc<Self>) {
        if self.tending.swap(true, Ordering::Relaxed) {
            return;
        }
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(TICK).await;
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                inner.tend().await;
            }
        });
    }

    /// While locks are held, or a connection given up on may still hold some: a broken
    /// connection replaced (and the locks taken again), a silent one pinged, the unlocks
    /// owed run.
    async fn tend(&self) {
        let mut conn = self.conn.lock().await;
        let (_, holding) = self.holding();
        let owed = !self.state().unlocks.is_empty();
        if !holding && !owed && conn.stale.is_empty() {
            return;
        }
        if (holding || !conn.stale.is_empty())
            && let Err(e) = self.connected(&mut conn).await
        {
            tracing::debug!("keeping the lock connection: {e}");
            return;
        }
        if self.unlock_due(&mut conn).await.is_err() || !holding {
            return;
        }
        if conn.answered.elapsed() < PING_EVERY {
            return;
        }
        let Some(client) = conn.live() else {
            return;
        };
        match bounded(
            "pinging the lock connection",
            client.simple_query("SELECT 1"),
        )
        .await
        {
            Ok(_) => conn.answered = Instant::now(),
            Err(e) => conn.give_up(&e, self.holding().0),
        }
    }
}

/// Ends the server processes of the connections given up on, and waits (up to
/// [`STALE_WAIT`]) until they are gone: the locks they hold must be free before they are
/// taken again.
async fn end_stale(client: &Client, stale: &[Process]) -> Result<(), SharedError> {
    if stale.is_empty() {
        return Ok(());
    }
    let pids: Vec<i32> = stale.iter().map(|p| p.pid).collect();
    let started: Vec<i64> = stale.iter().map(|p| p.started).collect();
    let deadline = Instant::now() + STALE_WAIT;
    loop {
        let left = bounded(
            "ending the lock connection given up on",
            client.query_typed(
                TERMINATE,
                &[(&pids, Type::INT4_ARRAY), (&started, Type::INT8_ARRAY)],
            ),
        )
        .await?
        .len();
        if left == 0 {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(SharedError::IndexUnreachable(format!(
                "the server process of its last lock connection (pid {pids:?}) has not ended \
                 yet, and holds this replica's locks"
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
