//! The audit trail's copy in the shared index (`dataref_audit`): each line a replica writes
//! to its own files is queued here and inserted in the background, keyed by its trail's id
//! and `seq`, with the line's exact text (so the copy verifies like the files) and its
//! fields as JSONB (so it can be queried). Recording never waits for the index: a full
//! queue or a failed insert drops the lines and counts them
//! (`dataref_ops::audit::dropped`); the files still hold them. A seq the index already
//! holds is compared by hash: the same line is fine (sent twice), another is a conflict,
//! counted ([`conflicts`]) and logged. `dataref_ops::audit::flush` waits, bounded, for the
//! queue to drain at exit.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dataref_ops::audit::{Forward, Written, count_dropped};
use tokio::sync::mpsc;

use crate::Backend;
use crate::error::SharedError;

/// Lines waiting for the index; past this they are dropped.
const QUEUE: usize = 4096;
/// Lines inserted in one transaction.
const BATCH: usize = 256;

const INSERT: &str = "INSERT INTO dataref_audit \
     (trail, seq, at, principal, event, record, line, prev, hash) \
     VALUES ($1, $2, $3::text::timestamptz, $4, $5, $6::text::jsonb, $6, $7, $8) \
     ON CONFLICT (trail, seq) DO NOTHING";

/// The hash the index holds for a seq that was there already.
const HELD: &str = "SELECT hash FROM dataref_audit WHERE trail = $1 AND seq = $2";

/// Lines whose seq the index held with another hash.
static CONFLICTS: AtomicU64 = AtomicU64::new(0);

pub(crate) fn conflicts() -> u64 {
    CONFLICTS.load(Ordering::Relaxed)
}

/// The queue into the index for one trail.
pub(crate) struct PgAudit {
    tx: mpsc::Sender<Written>,
    /// Lines queued and not yet inserted (or dropped).
    pending: Arc<AtomicU64>,
}

impl PgAudit {
    /// Starts the writer of trail `trail`'s lines on the backend's runtime.
    pub(crate) fn start(backend: Arc<Backend>, trail: String) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        let pending = Arc::new(AtomicU64::new(0));
        let io = backend.clone();
        io.io
            .spawn(write_lines(backend, trail, rx, pending.clone()));
        Self { tx, pending }
    }
}

impl Forward for PgAudit {
    fn forward(&self, line: Written) {
        self.pending.fetch_add(1, Ordering::AcqRel);
        if self.tx.try_send(line).is_err() {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            count_dropped();
        }
    }

    fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.pending.load(Ordering::Acquire) > 0 {
            if Instant::now() >= deadline {
                tracing::warn!(
                    lines = self.pending.load(Ordering::Acquire),
                    "audit lines were not copied to the shared index before exit (the files keep them)"
                );
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }
}

async fn write_lines(
    backend: Arc<Backend>,
    trail: String,
    mut rx: mpsc::Receiver<Written>,
    pending: Arc<AtomicU64>,
) {
    let mut batch = Vec::with_capacity(BATCH);
    while rx.recv_many(&mut batch, BATCH).await > 0 {
        let bound = backend.io.timeout();
        let done = tokio::time::timeout(bound, insert(&backend, &trail, &batch)).await;
        let failed = match done {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some(format!("no answer within {bound:?}")),
        };
        if let Some(error) = failed {
            tracing::warn!(
                lines = batch.len(),
                %error,
                "audit lines could not be copied to the shared index and were dropped there (the files keep them)"
            );
            for _ in 0..batch.len() {
                count_dropped();
            }
        }
        pending.fetch_sub(batch.len() as u64, Ordering::AcqRel);
        batch.clear();
    }
}

async fn insert(backend: &Arc<Backend>, trail: &str, lines: &[Written]) -> Result<(), SharedError> {
    let mut c = backend.pg.get().await?;
    let tx = c.transaction().await?;
    let statement = tx.prepare(INSERT).await?;
    let held = tx.prepare(HELD).await?;
    for w in lines {
        let seq = i64::try_from(w.seq).unwrap_or(i64::MAX);
        let inserted = tx
            .execute(
                &statement,
                &[
                    &trail,
                    &seq,
                    &w.at,
                    &w.principal,
                    &w.event,
                    &w.line,
                    &w.prev,
                    &w.hash,
                ],
            )
            .await?;
        if inserted == 0 {
            let row = tx.query_opt(&held, &[&trail, &seq]).await?;
            let hash: Option<String> = row.map(|r| r.try_get(0)).transpose()?;
            if hash.as_deref() != Some(w.hash.as_str()) {
                CONFLICTS.fetch_add(1, Ordering::Relaxed);
                count_dropped();
                tracing::error!(
                    trail,
                    seq = w.seq,
                    kept = hash.as_deref().unwrap_or_default(),
                    written = %w.hash,
                    "the shared index holds another line under this audit seq: two trails share \
                     an id, or a trail was rewritten; the index keeps its line, the files this one"
                );
            }
        }
    }
    tx.commit().await?;
    Ok(())
}

/// The index's copy of `trail`, by seq.
pub(crate) fn lines(backend: &Backend, trail: &str) -> Result<Vec<(u64, String)>, SharedError> {
    let pg = backend.pg.clone();
    let trail = trail.to_owned();
    backend
        .io
        .block("reading the audit trail's copy", async move {
            let c = pg.get().await?;
            let rows = c
                .query(
                    "SELECT seq, line FROM dataref_audit WHERE trail = $1 ORDER BY seq",
                    &[&trail],
                )
                .await?;
            rows.iter()
                .map(|r| {
                    let seq: i64 = r.try_get(0)?;
                    let line: String = r.try_get(1)?;
                    Ok((u64::try_from(seq).unwrap_or(0), line))
                })
                .collect()
        })
}
