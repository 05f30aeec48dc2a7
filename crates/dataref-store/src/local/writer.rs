//! Writing one table: batches stream into a temp file under a byte cap; `finish` makes it
//! durable, moves it into place and indexes it.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arrow_array::{Array, RecordBatch};
use arrow_ipc::writer::FileWriter;
use arrow_schema::{ArrowError, SchemaRef};
use dataref_protocol::{DataRef, Principal};

use super::Inner;
use crate::backend::{io_err, remove_if_present};
use crate::{ArtifactMeta, Checksum, Lineage, QuickCheck, StoreError, Sums, TableWriter};

/// Large enough that arrow's many small metadata writes become few syscalls; large
/// buffers pass straight through `BufWriter` anyway.
const WRITE_BUFFER: usize = 256 * 1024;

/// A large table's bytes go to the disk as they are written, this many at a time, so the
/// fsync that makes it durable waits for the last few, not for all of them (a 600 MB table
/// waited 0.9 s here). What PostgreSQL's `backend_flush_after` does.
const WRITEBACK_EVERY: u64 = 32 << 20;

/// Starts writing `[from, from + len)` of `file` to the disk without waiting for it. Only
/// advice: an error here is the fsync's to report.
#[cfg(target_os = "linux")]
#[expect(
    unsafe_code,
    reason = "sync_file_range has no safe wrapper in rustix; it takes a descriptor and numbers"
)]
fn start_writeback(file: &File, from: u64, len: u64) {
    use std::os::fd::AsRawFd;
    let (Ok(from), Ok(len)) = (i64::try_from(from), i64::try_from(len)) else {
        return;
    };
    // SAFETY: a plain system call on a descriptor `file` keeps open for the call; no
    // memory is passed.
    let _ =
        unsafe { libc::sync_file_range(file.as_raw_fd(), from, len, libc::SYNC_FILE_RANGE_WRITE) };
}

#[cfg(not(target_os = "linux"))]
fn start_writeback(_file: &File, _from: u64, _len: u64) {}

/// The most bytes one write may put on disk, and which bound set it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Cap {
    pub(super) bytes: u64,
    pub(super) bound: Bound,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Bound {
    /// The per-artifact cap.
    Artifact,
    /// What was left of the owner's quota when the write started.
    Quota { quota: u64, used: u64 },
}

impl Cap {
    fn error(self) -> StoreError {
        match self.bound {
            Bound::Artifact => StoreError::TooLarge { limit: self.bytes },
            Bound::Quota { quota, used } => StoreError::QuotaExceeded { quota, used },
        }
    }
}

/// Counts and hashes what passes through and refuses any write that would cross the cap,
/// so an oversized result stops at the cap instead of filling the disk first.
#[derive(Debug)]
struct CappedWriter {
    inner: BufWriter<File>,
    written: u64,
    /// Bytes handed to the disk's writeback so far (see [`WRITEBACK_EVERY`]).
    writeback: u64,
    /// The content hash and quick check, computed here so the file is never read back
    /// for them.
    sums: Sums,
    cap: u64,
    /// Shared with the table writer: arrow consumes the sink when the header or the
    /// footer fails, and the error it returns does not say why.
    crossed: Arc<AtomicBool>,
}

impl Write for CappedWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let len = u64::try_from(buf.len()).unwrap_or(u64::MAX);
        if self.written.saturating_add(len) > self.cap {
            self.crossed.store(true, Ordering::Relaxed);
            return Err(io::Error::other("artifact byte cap reached"));
        }
        let n = self.inner.write(buf)?;
        self.sums.update(&buf[..n]);
        self.written += u64::try_from(n).unwrap_or(u64::MAX);
        let in_file = self.written - self.inner.buffer().len() as u64;
        if in_file - self.writeback >= WRITEBACK_EVERY {
            start_writeback(
                self.inner.get_ref(),
                self.writeback,
                in_file - self.writeback,
            );
            self.writeback = in_file;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Where the writer is. Only `Open` has a temp file worth keeping; in every other state
/// `Drop` removes it.
enum State {
    Open(Box<FileWriter<CappedWriter>>),
    /// Aborted because a cap was reached: later calls repeat that answer.
    Capped,
    /// Aborted by an I/O or encoding error, or being finished.
    Failed,
}

pub(super) struct LocalTableWriter {
    inner: Arc<Inner>,
    owner: Principal,
    data_ref: DataRef,
    schema: SchemaRef,
    lineage: Lineage,
    tmp_path: PathBuf,
    cap: Cap,
    crossed: Arc<AtomicBool>,
    rows: u64,
    null_counts: Vec<u64>,
    state: State,
}

impl std::fmt::Debug for LocalTableWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalTableWriter")
            .field("data_ref", &self.data_ref)
            .field("owner", &self.owner)
            .field("tmp_path", &self.tmp_path)
            .field("cap", &self.cap)
            .field("rows", &self.rows)
            .finish_non_exhaustive()
    }
}

impl LocalTableWriter {
    /// Creates the temp file and writes the IPC header (which already counts against `cap`).
    pub(super) fn create(
        inner: Arc<Inner>,
        owner: Principal,
        data_ref: DataRef,
        schema: SchemaRef,
        lineage: Lineage,
        cap: Cap,
    ) -> Result<Self, StoreError> {
        let tmp_path = inner.tmp.join(format!("{}.arrow", data_ref.as_str()));
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp_path)
            .map_err(|e| io_err("cannot create temp file", &tmp_path, e))?;
        let crossed = Arc::new(AtomicBool::new(false));
        let sink = CappedWriter {
            inner: BufWriter::with_capacity(WRITE_BUFFER, file),
            written: 0,
            writeback: 0,
            sums: Sums::default(),
            cap: cap.bytes,
            crossed: crossed.clone(),
        };
        let null_counts = vec![0; schema.fields().len()];
        let mut writer = Self {
            inner,
            owner,
            data_ref,
            schema,
            lineage,
            tmp_path,
            cap,
            crossed,
            rows: 0,
            null_counts,
            // `Drop` removes the temp file if the header cannot be written.
            state: State::Failed,
        };
        match FileWriter::try_new(sink, &writer.schema) {
            Ok(ipc) => writer.state = State::Open(Box::new(ipc)),
            Err(e) => return Err(writer.failed(e)),
        }
        Ok(writer)
    }

    /// Records an abort and says why. The temp file is left for `Drop` (or removed now
    /// when the writer lives on, see [`TableWriter::write`]).
    fn failed(&mut self, e: ArrowError) -> StoreError {
        if self.crossed.load(Ordering::Relaxed) {
            self.state = State::Capped;
            self.cap.error()
        } else {
            self.state = State::Failed;
            match e {
                ArrowError::IoError(_, source) => io_err("cannot write", &self.tmp_path, source),
                other => StoreError::Arrow(other),
            }
        }
    }

    fn aborted_error(&self) -> StoreError {
        match self.state {
            State::Capped => self.cap.error(),
            State::Open(_) | State::Failed => io_err(
                "the write was aborted by an earlier error",
                &self.tmp_path,
                io::Error::other("aborted"),
            ),
        }
    }

    /// Takes the open IPC writer out, leaving `Failed` behind so an early return removes
    /// the temp file; or repeats why the write was aborted.
    fn take_open(&mut self) -> Result<Box<FileWriter<CappedWriter>>, StoreError> {
        match std::mem::replace(&mut self.state, State::Failed) {
            State::Open(ipc) => Ok(ipc),
            other @ (State::Capped | State::Failed) => {
                self.state = other;
                Err(self.aborted_error())
            }
        }
    }

    /// The durable part of `finish`: footer, flush, fsync, then the bytes published (the
    /// local backend renames the file into place and syncs its directory; a shared one
    /// uploads it). Returns the final size, content hash and quick check.
    fn seal(
        &mut self,
        mut ipc: Box<FileWriter<CappedWriter>>,
    ) -> Result<(u64, Checksum, QuickCheck), StoreError> {
        // The footer goes through the cap too.
        if let Err(e) = ipc.finish() {
            return Err(self.failed(e));
        }
        let sink = match ipc.into_inner() {
            Ok(sink) => sink,
            Err(e) => return Err(self.failed(e)),
        };
        let written = sink.written;
        let (checksum, quick_check) = sink.sums.finish();
        let file = sink
            .inner
            .into_inner()
            .map_err(|e| io_err("cannot write", &self.tmp_path, e.into_error()))?;
        file.sync_all()
            .map_err(|e| io_err("cannot sync", &self.tmp_path, e))?;
        drop(file);
        self.inner.bytes.publish(&self.data_ref, &self.tmp_path)?;
        Ok((written, checksum, quick_check))
    }
}

impl TableWriter for LocalTableWriter {
    fn write(&mut self, batch: &RecordBatch) -> Result<(), StoreError> {
        // Names, types and nullability make a table; schema-level metadata does not.
        if batch.schema_ref().fields() != self.schema.fields() {
            return Err(StoreError::SchemaMismatch);
        }
        let mut ipc = self.take_open()?;
        if let Err(e) = ipc.write(batch) {
            drop(ipc);
            // The caller may keep the writer around after the error; the partial file
            // should not wait for its drop.
            remove_if_present(&self.tmp_path);
            return Err(self.failed(e));
        }
        self.state = State::Open(ipc);
        self.rows += u64::try_from(batch.num_rows()).unwrap_or(u64::MAX);
        for (count, column) in self.null_counts.iter_mut().zip(batch.columns()) {
            *count += u64::try_from(column.logical_null_count()).unwrap_or(u64::MAX);
        }
        Ok(())
    }

    fn rows(&self) -> u64 {
        self.rows
    }

    fn finish(mut self: Box<Self>) -> Result<ArtifactMeta, StoreError> {
        let ipc = self.take_open()?;
        let (bytes, checksum, quick_check) = self.seal(ipc)?;

        let now = self.inner.clock.now();
        let meta = ArtifactMeta {
            data_ref: self.data_ref.clone(),
            owner: self.owner.clone(),
            rows: self.rows,
            bytes,
            schema: self.schema.clone(),
            null_counts: std::mem::take(&mut self.null_counts),
            created_at: now,
            expires_at: self.inner.expiry(now),
            lineage: self.lineage.clone(),
            checksum: Some(checksum),
            quick_check: Some(quick_check),
        };
        let quota = self.inner.limits.owner_quota_bytes;
        if let Err(e) = self.inner.index.insert_within_quota(&meta, quota, now) {
            // Refused: the bytes go. Unreachable: the row may have been written all the same
            // (its answer lost on the way), so the bytes stay; if no row names them, the
            // shared backend's orphan sweep removes them later.
            if !e.is_transient() {
                self.inner.bytes.remove(&self.data_ref);
            }
            return Err(e);
        }
        Ok(meta)
    }
}

impl Drop for LocalTableWriter {
    fn drop(&mut self) {
        // Close the file before unlinking it (it matters on Windows).
        self.state = State::Failed;
        // After a successful finish the temp name no longer exists and this is a no-op.
        remove_if_present(&self.tmp_path);
    }
}
