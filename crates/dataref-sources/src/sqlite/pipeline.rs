//! The two halves of a fetch, overlapped: the calling thread steps the statement and fills
//! Arrow builders; a writer thread encodes each full batch as Arrow IPC and writes it to
//! the store.
//!
//! Between them is a bounded channel of [`QUEUE_BATCHES`] batches, so at most that many
//! wait while one is written and one is filled: memory stays a few batches, however many
//! rows the statement returns.
//!
//! Either side stops the other. The SQLite side stops by closing the channel (the writer
//! hands its `TableWriter` back unfinished); the writer side stops by raising the
//! cancellation flag the progress handler reads, so a statement still inside SQLite is
//! interrupted too, and by dropping its end of the channel. The first side's error is the
//! one reported: the writer's always concerns earlier rows than the SQLite side's. A
//! panic on either side becomes an error, and every way out but a clean end of both drops
//! the writer, which removes the partial artifact.

use std::any::Any;
use std::panic::{self, AssertUnwindSafe};
use std::path::Path;
use std::sync::mpsc::{self, Receiver, SyncSender};

use arrow_array::RecordBatch;
use dataref_store::{ArtifactMeta, TableWriter};

use super::guard::StopState;
use crate::SourceError;

/// Full batches waiting for the writer. Two keep the writer busy while the SQLite side
/// fills the next one, and bound what waits to two batches.
pub(super) const QUEUE_BATCHES: usize = 2;

/// The SQLite side's end of the channel.
pub(super) struct Batches {
    tx: SyncSender<RecordBatch>,
}

impl Batches {
    /// Hands a full batch to the writer, waiting while the queue is full. An error means
    /// the writer has stopped; its own error is the one reported.
    pub(super) fn send(&self, batch: RecordBatch) -> Result<(), SourceError> {
        self.tx.send(batch).map_err(|_| SourceError::Cancelled)
    }
}

/// What the fetch is about, for errors that are nobody's fault but ours.
pub(super) struct Context<'a> {
    pub(super) database: &'a Path,
    pub(super) stop: &'a StopState,
    pub(super) progress: &'a (dyn Fn(u64) + Sync),
    pub(super) is_cancelled: &'a (dyn Fn() -> bool + Sync),
}

/// Runs `produce` on this thread with the writer on another, and finishes the table when
/// both ended well.
pub(super) fn overlap(
    writer: Box<dyn TableWriter>,
    cx: &Context<'_>,
    produce: impl FnOnce(&Batches) -> Result<(), SourceError>,
) -> Result<ArtifactMeta, SourceError> {
    let (tx, rx) = mpsc::sync_channel::<RecordBatch>(QUEUE_BATCHES);
    let (produced, written) = std::thread::scope(|scope| {
        let spawned = std::thread::Builder::new()
            .name("dataref-sqlite-writer".into())
            .spawn_scoped(scope, move || write_all(writer, rx, cx));
        let handle = match spawned {
            Ok(handle) => handle,
            Err(e) => return Err(internal(cx.database, "cannot start the writer thread", &e)),
        };
        let batches = Batches { tx };
        let produced = panic::catch_unwind(AssertUnwindSafe(|| produce(&batches)));
        // Closing the channel is what ends the writer's loop, on every path.
        drop(batches);
        Ok((produced, handle.join()))
    })?;
    let writer = match written {
        Ok(Ok(writer)) => writer,
        // The writer stopped first; the SQLite side only followed.
        Ok(Err(e)) => return Err(e),
        Err(payload) => return Err(panicked(cx.database, "the writer thread", payload.as_ref())),
    };
    match produced {
        // Cancelled after the last batch: nothing is committed (the writer is dropped).
        Ok(Ok(())) if cx.stop.is_cancelled() => Err(SourceError::Cancelled),
        Ok(Ok(())) => Ok(writer.finish()?),
        // `writer` is dropped on the way out, which removes the partial artifact.
        Ok(Err(e)) => Err(e),
        Err(payload) => Err(panicked(cx.database, "reading the rows", payload.as_ref())),
    }
}

/// The writer thread: every batch into the table, a progress report after each. Hands the
/// writer back unfinished when the channel closes, or drops it (removing the artifact) on
/// an error or a panic, after telling the SQLite side to stop.
fn write_all(
    mut writer: Box<dyn TableWriter>,
    rx: Receiver<RecordBatch>,
    cx: &Context<'_>,
) -> Result<Box<dyn TableWriter>, SourceError> {
    let written = panic::catch_unwind(AssertUnwindSafe(|| {
        for batch in rx.iter() {
            if cx.stop.is_cancelled() {
                return Err(SourceError::Cancelled);
            }
            writer.write(&batch)?;
            drop(batch);
            (cx.progress)(writer.rows());
            // The cancellation watcher polls; asking here too stops a fetch right after
            // the batch during which it was cancelled.
            if cx.stop.is_cancelled() || (cx.is_cancelled)() {
                return Err(SourceError::Cancelled);
            }
        }
        Ok(())
    }));
    let e = match written {
        Ok(Ok(())) => return Ok(writer),
        Ok(Err(e)) => e,
        Err(payload) => panicked(cx.database, "the writer thread", payload.as_ref()),
    };
    // Interrupts a statement still running in SQLite; its `send` fails once `rx` is gone.
    cx.stop.cancel();
    Err(e)
}

/// `what` says who panicked, e.g. "the writer thread".
pub(super) fn panicked(database: &Path, what: &str, payload: &(dyn Any + Send)) -> SourceError {
    let message = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("no message");
    internal(database, &format!("{what} panicked"), &message)
}

pub(super) fn internal(database: &Path, what: &str, why: &dyn std::fmt::Display) -> SourceError {
    SourceError::Io {
        context: "internal error while fetching from",
        path: database.to_path_buf(),
        source: std::io::Error::other(format!("{what}: {why}")),
    }
}
