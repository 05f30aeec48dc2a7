//! The store on this machine's disk: one Arrow IPC file per table, memory-mapped to read.
//! By default ([`LocalStore::open`]) the files are the artifacts themselves and one SQLite
//! row indexes each; [`LocalStore::with_backend`] takes another index and another home for
//! the bytes (PostgreSQL and object storage, `dataref-replica`), the local files then being
//! a cache of them.
//!
//! Layout under the home directory (the default backend):
//!
//! ```text
//! index.sqlite              ref, owner, rows, bytes, schema, null counts, times, lineage
//! artifacts/<ref>.arrow     IPC *file* format, uncompressed, so it can be memory-mapped
//! artifacts/.tmp/<ref>.arrow  tables being written
//! ```
//!
//! Invariants:
//! - A file in `artifacts/` is complete and never written again. It appears there by
//!   rename after an fsync, and only then gets its index row; it is read through a shared
//!   memory map, which is sound only because nothing modifies it afterwards.
//! - A ref is visible exactly when its index row exists, belongs to the caller and has
//!   not expired. Every other case answers [`StoreError::NotFound`], word for word the
//!   same, so a ref cannot be probed for existence.
//! - Removal goes the other way round: index row first, then the file.
//! - The index lock is held for SQL statements only, never across file I/O.
//!
//! A crash therefore leaves at most temp files and files without a row, which
//! [`LocalStore::open`] removes — but only when no other `LocalStore` has the home open
//! (in this process or another: two servers on one data dir are common, a stdio server per
//! MCP host window), since their writes in progress look exactly like a crash's leftovers.
//! Every open store holds a shared `flock` on `index.sqlite` for its lifetime (flock locks
//! are apart from the POSIX locks SQLite takes on the same file);
//! reconciling needs the exclusive lock, taken without waiting, so the kernel — not a pid
//! file that can go stale — says whether anyone else is still writing.

#![expect(
    clippy::disallowed_methods,
    reason = "this module owns the artifact files and the index"
)]

mod index;
mod mapped;
mod parts;
mod verify;
mod writer;

pub use index::SqliteIndex;
pub use verify::{DamagedTable, VerifyReport};

pub(crate) use mapped::{Mapping, decode};
pub(crate) use parts::{check_fetched, fetch_columns};

use std::collections::VecDeque;
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rustix::fs::{FlockOperation, flock};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use dataref_protocol::{DataRef, Principal, Timestamp};

use self::writer::{Bound, Cap, LocalTableWriter};
use crate::backend::{ArtifactBytes, ArtifactIndex, LocalFiles, io_err};
use crate::{ArtifactMeta, ArtifactStore, Clock, Lineage, MappedTable, StoreError, TableWriter};

const ARTIFACTS_DIR: &str = "artifacts";
/// Artifacts whose mapping (and decoded columns) the store keeps between reads. An agent
/// asks several questions of the few tables it fetched; a few dozen covers that, and
/// holding more would keep more swept files' disk space until they are evicted.
const MAPPINGS_KEPT: usize = 32;
const TMP_DIR: &str = ".tmp";
const INDEX_FILE: &str = "index.sqlite";

/// Bounds of the store (from `[store]` in config).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreLimits {
    pub ttl: Duration,
    pub max_artifact_bytes: u64,
    pub owner_quota_bytes: u64,
}

impl Default for StoreLimits {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(24 * 3600),
            max_artifact_bytes: 1 << 30,
            owner_quota_bytes: 10 << 30,
        }
    }
}

/// What a sweep removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepReport {
    pub removed: u64,
    pub bytes_freed: u64,
}

/// Arrow IPC files under `<home>/artifacts`, indexed in `<home>/index.sqlite`; or, made
/// with [`LocalStore::with_backend`], the local files of another index and byte store.
///
/// Cheap to share: clone the `Arc` it sits in; writers keep what they need alive.
#[derive(Debug)]
pub struct LocalStore {
    inner: Arc<Inner>,
}

/// What the store and its open writers share.
#[derive(Debug)]
struct Inner {
    /// Where tables are written before they are published.
    tmp: PathBuf,
    index: Box<dyn ArtifactIndex>,
    bytes: Box<dyn ArtifactBytes>,
    limits: StoreLimits,
    clock: Arc<dyn Clock>,
    /// The most recently read artifacts' mappings, newest last. Keyed by ref alone: the
    /// owner is checked against the index on every read, before this is looked at.
    mappings: Mutex<VecDeque<Kept>>,
    /// The files this process has checked against their checksums.
    verified: verify::Verified,
    /// Holds the shared flock on `index.sqlite` while this store is open (see the module
    /// docs); released when the last writer and the store are gone. Other backends
    /// reconcile their own leftovers. Held, never read.
    _lock: Option<File>,
}

impl Inner {
    fn artifact_path(&self, data_ref: &DataRef) -> PathBuf {
        self.bytes.local_path(data_ref)
    }

    fn mappings(&self) -> std::sync::MutexGuard<'_, VecDeque<Kept>> {
        // Every change to the list is a single push, pop or retain: nothing half done.
        self.mappings.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The kept mapping of `data_ref`, now the most recently used.
    fn kept_mapping(&self, data_ref: &DataRef) -> Option<Arc<Mapping>> {
        let mut kept = self.mappings();
        let at = kept.iter().position(|k| k.data_ref == *data_ref)?;
        let entry = kept.remove(at)?;
        let mapping = entry.mapping.clone();
        kept.push_back(entry);
        Some(mapping)
    }

    /// Keeps `mapping` of the artifact `meta` describes for later reads, evicting the least
    /// recently used beyond [`MAPPINGS_KEPT`] and any expired; when another read kept one
    /// meanwhile, that one is used instead.
    fn keep_mapping(&self, meta: &ArtifactMeta, mapping: Mapping) -> Arc<Mapping> {
        let now = self.clock.now();
        let mut kept = self.mappings();
        kept.retain(|k| k.expires_at > now);
        if let Some(other) = kept.iter().find(|k| k.data_ref == meta.data_ref) {
            return other.mapping.clone();
        }
        let mapping = Arc::new(mapping);
        // Expired since the owner check: served this once, not kept for a sweep to miss.
        if meta.expires_at <= now {
            return mapping;
        }
        kept.push_back(Kept {
            data_ref: meta.data_ref.clone(),
            expires_at: meta.expires_at,
            mapping: mapping.clone(),
        });
        while kept.len() > MAPPINGS_KEPT {
            kept.pop_front();
        }
        mapping
    }

    /// Drops the mappings of expired artifacts, so a swept file's disk space is freed once
    /// its last reader is done. By expiry, not by the refs this sweep removed: another
    /// store on the same home (another server) may have swept them.
    fn forget_expired(&self, now: Timestamp) {
        self.mappings().retain(|k| k.expires_at > now);
    }

    /// Drops the kept mapping of a table that is gone.
    fn forget_mapping(&self, data_ref: &DataRef) {
        self.mappings().retain(|k| k.data_ref != *data_ref);
        self.verified.forget(data_ref);
    }

    fn expiry(&self, now: Timestamp) -> Timestamp {
        let ttl = i64::try_from(self.limits.ttl.as_secs()).unwrap_or(i64::MAX);
        Timestamp(now.0.saturating_add(ttl))
    }
}

/// A mapping the store keeps between reads.
#[derive(Debug)]
struct Kept {
    data_ref: DataRef,
    /// When the artifact expires: a sweep, by this store or another on the same home,
    /// removes it then.
    expires_at: Timestamp,
    mapping: Arc<Mapping>,
}

/// The report of [`LocalStore::open`]'s reconciliation, for the log.
#[derive(Debug, Default)]
struct Reconciled {
    temp_files: usize,
    unindexed_files: usize,
    missing_files: usize,
}

impl LocalStore {
    /// Opens (creating if needed) the store under `home` and reconciles it with the disk:
    /// temp files and files without an index row are removed, and index rows whose file
    /// is missing are dropped.
    pub fn open(
        home: &Path,
        limits: StoreLimits,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, StoreError> {
        let artifacts = home.join(ARTIFACTS_DIR);
        let tmp = artifacts.join(TMP_DIR);
        // The artifact files are the principals' data: only this uid may list or read them
        // (the sandbox gets them as descriptors, never by path).
        std::os::unix::fs::DirBuilderExt::mode(fs::DirBuilder::new().recursive(true), 0o700)
            .create(&tmp)
            .map_err(|e| io_err("cannot create directory", &tmp, e))?;
        let lock_path = home.join(INDEX_FILE);
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| io_err("cannot open the index to lock it", &lock_path, e))?;
        // Alone: reconcile, then share. Not alone: another store is live and its writes in
        // progress must not be taken for a crash's leftovers; it reconciled when it opened.
        let alone = match flock(&lock, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => true,
            Err(rustix::io::Errno::WOULDBLOCK) => false,
            Err(e) => return Err(io_err("cannot lock the store", &lock_path, e.into())),
        };
        let index = SqliteIndex::open(&lock_path)?;
        let files = LocalFiles::new(artifacts);
        let r = if alone {
            reconcile(&index, &files, &tmp)
        } else {
            Ok(Reconciled::default())
        };
        // Alone, this converts the exclusive lock to a shared one; not alone, it waits only
        // while another store reconciles.
        flock(&lock, FlockOperation::LockShared)
            .map_err(|e| io_err("cannot lock the store", &lock_path, e.into()))?;
        let r = r?;
        if r.temp_files + r.unindexed_files + r.missing_files > 0 {
            tracing::info!(
                temp_files = r.temp_files,
                unindexed_files = r.unindexed_files,
                missing_files = r.missing_files,
                "artifact store reconciled after an unclean stop"
            );
        }
        Ok(Self::assemble(
            tmp,
            Box::new(index),
            Box::new(files),
            limits,
            clock,
            Some(lock),
        ))
    }

    /// A store whose index rows live in `index` and whose bytes `bytes` keeps, writing
    /// tables under `tmp` (created 0700 if missing) before they are published. Nothing is
    /// reconciled here: such a backend cleans up after its own crashes.
    pub fn with_backend(
        tmp: &Path,
        index: Box<dyn ArtifactIndex>,
        bytes: Box<dyn ArtifactBytes>,
        limits: StoreLimits,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, StoreError> {
        std::os::unix::fs::DirBuilderExt::mode(fs::DirBuilder::new().recursive(true), 0o700)
            .create(tmp)
            .map_err(|e| io_err("cannot create directory", tmp, e))?;
        Ok(Self::assemble(
            tmp.to_owned(),
            index,
            bytes,
            limits,
            clock,
            None,
        ))
    }

    fn assemble(
        tmp: PathBuf,
        index: Box<dyn ArtifactIndex>,
        bytes: Box<dyn ArtifactBytes>,
        limits: StoreLimits,
        clock: Arc<dyn Clock>,
        lock: Option<File>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                tmp,
                index,
                bytes,
                limits,
                clock,
                mappings: Mutex::default(),
                verified: verify::Verified::default(),
                _lock: lock,
            }),
        }
    }

    /// A new ref: 128 bits from the OS CSPRNG, so refs cannot be guessed.
    fn mint_ref(&self) -> Result<DataRef, StoreError> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).map_err(|e| {
            io_err(
                "cannot draw random bytes for a new ref",
                &self.inner.tmp,
                io::Error::other(e.to_string()),
            )
        })?;
        Ok(DataRef::from_random_bytes(bytes))
    }

    /// What this write may put on disk: the artifact cap, or what is left of the quota
    /// if that is less.
    fn cap_for(&self, owner: &Principal) -> Result<Cap, StoreError> {
        let limits = &self.inner.limits;
        let used = self.usage(owner)?;
        let left = limits.owner_quota_bytes.saturating_sub(used);
        Ok(if left < limits.max_artifact_bytes {
            Cap {
                bytes: left,
                bound: Bound::Quota {
                    quota: limits.owner_quota_bytes,
                    used,
                },
            }
        } else {
            Cap {
                bytes: limits.max_artifact_bytes,
                bound: Bound::Artifact,
            }
        })
    }
}

/// Removes what a crash left: temp files, files without a row, rows without a file.
fn reconcile(
    index: &SqliteIndex,
    files: &LocalFiles,
    tmp: &Path,
) -> Result<Reconciled, StoreError> {
    let mut report = Reconciled::default();

    // Writes that never finished: nobody can finish them now.
    for entry in read_dir(tmp)? {
        let path = entry.path();
        let removed = if entry.file_type().is_ok_and(|t| t.is_dir()) {
            fs::remove_dir_all(&path)
        } else {
            fs::remove_file(&path)
        };
        match removed {
            Ok(()) => report.temp_files += 1,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot remove temp file")
            }
        }
    }

    // Files renamed into place whose index row was never committed.
    let mut on_disk = std::collections::HashSet::new();
    for entry in read_dir(files.dir())? {
        let path = entry.path();
        let is_artifact = path.extension().is_some_and(|e| e == LocalFiles::EXTENSION)
            && entry.file_type().is_ok_and(|t| t.is_file());
        if let (true, Some(stem)) = (is_artifact, path.file_stem().and_then(|s| s.to_str())) {
            on_disk.insert(stem.to_owned());
        }
    }
    let indexed = index.all_refs()?;
    for stem in on_disk.difference(&indexed) {
        let path = files
            .dir()
            .join(format!("{stem}.{}", LocalFiles::EXTENSION));
        match fs::remove_file(&path) {
            Ok(()) => report.unindexed_files += 1,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot remove unindexed artifact")
            }
        }
    }

    // Rows whose file is gone (deleted by hand, lost with a disk): the ref could never
    // be opened, and it would count against its owner's quota. The file is looked up
    // again because the listing above is older than the rows.
    for r in indexed.difference(&on_disk) {
        let path = files.dir().join(format!("{r}.{}", LocalFiles::EXTENSION));
        if !path.try_exists().unwrap_or(true) {
            index.remove(r)?;
            report.missing_files += 1;
        }
    }
    Ok(report)
}

fn not_found(data_ref: &DataRef) -> StoreError {
    StoreError::NotFound {
        data_ref: data_ref.as_str().to_owned(),
    }
}

impl ArtifactStore for LocalStore {
    fn create_table(
        &self,
        owner: &Principal,
        schema: SchemaRef,
        lineage: Lineage,
    ) -> Result<Box<dyn TableWriter>, StoreError> {
        let cap = self.cap_for(owner)?;
        let data_ref = self.mint_ref()?;
        // Open from here to `finish` (or the abort): the trace shows how long a table took
        // to write, under the tool call that wrote it.
        let span = tracing::info_span!(
            "store_write",
            data_ref = %data_ref,
            tool = %lineage.tool,
            rows = tracing::field::Empty,
            bytes = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        );
        let writer = span.in_scope(|| {
            LocalTableWriter::create(
                self.inner.clone(),
                owner.clone(),
                data_ref,
                schema,
                lineage,
                cap,
            )
        })?;
        Ok(Box::new(TracedWriter { writer, span }))
    }

    fn map_table(&self, owner: &Principal, data_ref: &DataRef) -> Result<MappedTable, StoreError> {
        let span = tracing::info_span!(
            "store_read",
            data_ref = %data_ref,
            rows = tracing::field::Empty,
            bytes = tracing::field::Empty,
            cached = tracing::field::Empty,
        );
        let _in_read = span.enter();
        // The owner check, on every read: the cache below is only looked at after it.
        let meta = self.meta(owner, data_ref)?;
        span.record("rows", meta.rows);
        span.record("bytes", meta.bytes);
        let path = self.inner.artifact_path(data_ref);
        let kept = self.inner.kept_mapping(data_ref);
        span.record("cached", kept.is_some());
        let mapping = match kept {
            Some(mapping) => mapping,
            None => {
                let (_, buffer) = self.inner.open_verified(&meta, verify::Check::Once)?;
                self.inner.keep_mapping(&meta, Mapping::new(buffer))
            }
        };
        Ok(MappedTable {
            meta,
            path,
            mapping,
            parts: None,
        })
    }

    fn map_columns(
        &self,
        owner: &Principal,
        data_ref: &DataRef,
    ) -> Result<MappedTable, StoreError> {
        if self.inner.kept_mapping(data_ref).is_none() {
            let _in_read =
                tracing::info_span!("store_read", data_ref = %data_ref, parts = true).entered();
            // The owner check first, as every read.
            let meta = self.meta(owner, data_ref)?;
            if let Some(parts) = self.inner.bytes.open_parts(&meta)? {
                let path = self.inner.artifact_path(data_ref);
                let buffer = mapped::map_file(parts.file())
                    .map_err(|e| io_err("cannot map artifact", &path, e))?;
                return Ok(MappedTable {
                    meta,
                    path,
                    mapping: Arc::new(Mapping::new(buffer)),
                    parts: Some(parts),
                });
            }
        }
        self.map_table(owner, data_ref)
    }

    fn open_file(&self, owner: &Principal, data_ref: &DataRef) -> Result<File, StoreError> {
        let _in_read =
            tracing::info_span!("store_read", data_ref = %data_ref, file = true).entered();
        let meta = self.meta(owner, data_ref)?;
        let (file, _) = self.inner.open_verified(&meta, verify::Check::Once)?;
        Ok(file)
    }

    fn meta(&self, owner: &Principal, data_ref: &DataRef) -> Result<ArtifactMeta, StoreError> {
        let now = self.inner.clock.now();
        self.inner
            .index
            .get(owner, data_ref, now)?
            .ok_or_else(|| not_found(data_ref))
    }

    fn list(
        &self,
        owner: &Principal,
        limit: usize,
    ) -> Result<(Vec<ArtifactMeta>, u64), StoreError> {
        self.inner.index.list(owner, self.inner.clock.now(), limit)
    }

    fn usage(&self, owner: &Principal) -> Result<u64, StoreError> {
        self.inner.index.usage(owner, self.inner.clock.now())
    }

    fn totals(&self) -> Result<Option<(u64, u64)>, StoreError> {
        self.inner.index.totals(self.inner.clock.now()).map(Some)
    }

    fn sweep(&self) -> Result<SweepReport, StoreError> {
        let now = self.inner.clock.now();
        let expired = self.inner.index.take_expired(now)?;
        let mut report = SweepReport::default();
        for (r, bytes) in expired {
            report.removed += 1;
            report.bytes_freed += bytes;
            // Refs come from our own index; a malformed one cannot name a file of ours.
            let Ok(data_ref) = DataRef::parse(&r) else {
                tracing::warn!(data_ref = %r, "malformed ref in the index");
                continue;
            };
            self.inner.bytes.remove(&data_ref);
        }
        self.inner.forget_expired(now);
        Ok(report)
    }
}

/// A table write inside its `store_write` span, which closes when the writer is dropped
/// (finished or aborted).
struct TracedWriter {
    writer: LocalTableWriter,
    span: tracing::Span,
}

impl TableWriter for TracedWriter {
    fn write(&mut self, batch: &RecordBatch) -> Result<(), StoreError> {
        let _in_write = self.span.enter();
        self.writer.write(batch)
    }

    fn rows(&self) -> u64 {
        self.writer.rows()
    }

    fn finish(self: Box<Self>) -> Result<ArtifactMeta, StoreError> {
        let Self { writer, span } = *self;
        let _in_write = span.enter();
        let finished = Box::new(writer).finish();
        match &finished {
            Ok(meta) => {
                span.record("rows", meta.rows);
                span.record("bytes", meta.bytes);
            }
            Err(_) => {
                span.record("otel.status_code", "ERROR");
            }
        }
        finished
    }
}

fn read_dir(dir: &Path) -> Result<Vec<fs::DirEntry>, StoreError> {
    fs::read_dir(dir)
        .and_then(|entries| entries.collect::<io::Result<Vec<_>>>())
        .map_err(|e| io_err("cannot read directory", dir, e))
}
