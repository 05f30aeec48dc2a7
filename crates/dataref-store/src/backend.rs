//! The two parts of a store that differ between one machine and many: where the index rows
//! live ([`ArtifactIndex`]) and where an artifact's bytes are made durable
//! ([`ArtifactBytes`]). [`LocalStore`](crate::LocalStore) keeps everything else — writing
//! under the caps, the owner check on every read, mapping, the decoded-column cache,
//! sweeping — once, for both.
//!
//! - One machine (the default): SQLite beside the files ([`LocalStore::open`]), and the
//!   files themselves in `artifacts/` ([`LocalFiles`]).
//! - Several servers behind a load balancer: PostgreSQL for the index and object storage
//!   for the bytes, with a bounded local cache of whole files so memory maps and the
//!   descriptors handed to the sandbox keep working (the `dataref-replica` crate).
//!
//! [`LocalStore::open`]: crate::LocalStore::open

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_schema::Schema;
use dataref_protocol::{DataRef, Principal, Timestamp};

use crate::{ArtifactMeta, Checksum, Lineage, StoreError};

/// The index of stored tables: whose each ref is, until when, and what it holds.
///
/// Every read answers only live rows of the given owner: an unknown, expired or someone
/// else's ref is `None`, and the store turns that into the one "not found" answer.
pub trait ArtifactIndex: Send + Sync + std::fmt::Debug {
    /// The row of a live table of `owner`'s.
    fn get(
        &self,
        owner: &Principal,
        data_ref: &DataRef,
        now: Timestamp,
    ) -> Result<Option<ArtifactMeta>, StoreError>;

    /// `owner`'s live tables, newest first (ties: the later insert first), at most `limit`;
    /// and how many there are in all.
    fn list(
        &self,
        owner: &Principal,
        now: Timestamp,
        limit: usize,
    ) -> Result<(Vec<ArtifactMeta>, u64), StoreError>;

    /// Bytes of `owner`'s live tables.
    fn usage(&self, owner: &Principal, now: Timestamp) -> Result<u64, StoreError>;

    /// Inserts `meta` unless that takes its owner past `quota` (live tables only). The check
    /// and the insert are one step for every writer of that owner, on every server sharing
    /// the index: two writers finishing at once cannot both slip under the quota.
    fn insert_within_quota(
        &self,
        meta: &ArtifactMeta,
        quota: u64,
        now: Timestamp,
    ) -> Result<(), StoreError>;

    /// Deletes the rows of tables expired at `now` and returns their refs and sizes. Each
    /// row is returned to exactly one caller, however many sweep at once: the caller then
    /// removes the bytes.
    fn take_expired(&self, now: Timestamp) -> Result<Vec<(String, u64)>, StoreError>;

    /// Records the checksum of a row written before checksums were kept (only while it
    /// has none: a row's checksum, once there, never changes).
    fn adopt_checksum(&self, data_ref: &DataRef, checksum: &Checksum) -> Result<(), StoreError>;

    /// Every live row of every owner, oldest first: what `dataref store verify` checks.
    fn every(&self, now: Timestamp) -> Result<Vec<ArtifactMeta>, StoreError>;

    /// Live tables of every owner: how many, and their bytes (the metrics' store size,
    /// read at scrape time). This default reads every row; an index should count in one
    /// statement.
    fn totals(&self, now: Timestamp) -> Result<(u64, u64), StoreError> {
        let every = self.every(now)?;
        Ok((every.len() as u64, every.iter().map(|m| m.bytes).sum()))
    }

    /// Deletes `data_ref`'s row whoever owns it (`dataref store verify --drop`, for a table
    /// beyond repair); true when there was one.
    fn drop_row(&self, data_ref: &DataRef) -> Result<bool, StoreError>;
}

/// A local file with a table's bytes, from [`ArtifactBytes::open`].
#[derive(Debug)]
pub struct Opened {
    pub file: File,
    /// The bytes were hashed as they arrived (a download) and matched the checksum asked
    /// for: the reader need not hash them again.
    pub verified: bool,
}

/// A table's bytes fetched in parts into a local file of the table's length, from
/// [`ArtifactBytes::open_parts`]. A part is written only once it matched what was
/// written; the rest of the file reads as zeros, and no reader reads it.
pub trait Parts: Send + Sync + std::fmt::Debug {
    /// The file, for readers to map (read-only; only [`Parts::fetch`] writes to it).
    fn file(&self) -> &File;

    /// Makes sure the bytes of every range are in the file, fetching those that are not: a
    /// part that does not match is fetched once more, then is [`StoreError::Damaged`].
    fn fetch(&self, ranges: &[std::ops::Range<u64>]) -> Result<(), StoreError>;

    /// Whether every byte of `range` was fetched (and checked).
    fn holds(&self, range: std::ops::Range<u64>) -> bool;
}

/// Where a table's bytes are kept, and a local file to read them from.
///
/// Bytes are immutable once published: a ref names one content for its whole life, so any
/// copy of it anywhere is as good as any other, and a file that is read (mapped) is never
/// written again, only unlinked.
pub trait ArtifactBytes: Send + Sync + std::fmt::Debug {
    /// Makes the finished, synced Arrow file `staged` (in the store's staging directory)
    /// durable as `data_ref`'s bytes and puts it where [`ArtifactBytes::open`] finds it.
    /// Never replaces bytes already published under `data_ref`. On an error nothing of
    /// `data_ref` is left published; the caller removes `staged` if it is still there.
    fn publish(&self, data_ref: &DataRef, staged: &Path) -> Result<(), StoreError>;

    /// A read-only local file with the bytes of the table `meta` indexes (fetched into a
    /// local cache first when they live elsewhere); `None` when there are none (removed
    /// meanwhile). Bytes fetched from elsewhere are hashed as they arrive and, when the
    /// index has a checksum, kept only if they match it: a mismatch (or fewer bytes than
    /// `meta.bytes`) is [`StoreError::Damaged`] and nothing is cached.
    fn open(&self, meta: &ArtifactMeta) -> Result<Option<Opened>, StoreError>;

    /// A local file as long as `meta`'s bytes that this backend fills in the parts a
    /// reader asks for, each checked before it is written: for a query that reads a few
    /// columns of a table kept elsewhere. `None` when the backend has no such thing, or
    /// the whole table is already here (read it with [`ArtifactBytes::open`]).
    fn open_parts(&self, _meta: &ArtifactMeta) -> Result<Option<Arc<dyn Parts>>, StoreError> {
        Ok(None)
    }

    /// Forgets this machine's copy of `data_ref`'s bytes when it is a copy of bytes kept
    /// elsewhere, so the next [`ArtifactBytes::open`] fetches them afresh; false when the
    /// local file is the bytes themselves (nothing to fetch again).
    fn forget_copy(&self, data_ref: &DataRef) -> bool;

    /// Where [`ArtifactBytes::open`] reads `data_ref` from on this machine (the file may
    /// not be there yet).
    fn local_path(&self, data_ref: &DataRef) -> PathBuf;

    /// Removes `data_ref`'s bytes, after its index row is gone. Failures are logged, not
    /// returned: the caller has nothing better to do, and leftovers are swept later.
    fn remove(&self, data_ref: &DataRef);
}

/// The local backend's bytes: `<home>/artifacts/<ref>.arrow`, moved there by rename.
#[derive(Debug)]
pub struct LocalFiles {
    dir: PathBuf,
}

impl LocalFiles {
    pub(crate) const EXTENSION: &'static str = "arrow";

    pub(crate) fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }
}

#[expect(
    clippy::disallowed_methods,
    reason = "the artifact files are this crate's own"
)]
impl ArtifactBytes for LocalFiles {
    fn publish(&self, data_ref: &DataRef, staged: &Path) -> Result<(), StoreError> {
        let path = self.local_path(data_ref);
        std::fs::rename(staged, &path).map_err(|e| io_err("cannot move into place", &path, e))?;
        // Without this the rename may not survive a power cut even though the index row,
        // written next, does.
        if let Err(e) = sync_dir(&self.dir) {
            remove_if_present(&path);
            return Err(e);
        }
        Ok(())
    }

    fn open(&self, meta: &ArtifactMeta) -> Result<Option<Opened>, StoreError> {
        let path = self.local_path(&meta.data_ref);
        match File::open(&path) {
            Ok(file) => Ok(Some(Opened {
                file,
                verified: false,
            })),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err("cannot open artifact", &path, e)),
        }
    }

    fn local_path(&self, data_ref: &DataRef) -> PathBuf {
        self.dir
            .join(format!("{}.{}", data_ref.as_str(), Self::EXTENSION))
    }

    fn forget_copy(&self, _data_ref: &DataRef) -> bool {
        false
    }

    fn remove(&self, data_ref: &DataRef) {
        remove_if_present(&self.local_path(data_ref));
    }
}

/// An index row's columns encoded as plain values, the same for every index: SQLite here,
/// PostgreSQL in `dataref-replica`. Times are Unix seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexRow {
    pub data_ref: String,
    pub owner: String,
    pub rows: i64,
    pub bytes: i64,
    /// The Arrow schema as JSON.
    pub schema: String,
    /// The null count per column, a JSON array.
    pub null_counts: String,
    pub created_at: i64,
    pub expires_at: i64,
    pub lineage_tool: String,
    /// The lineage arguments as JSON.
    pub lineage_args: String,
    /// [`Checksum`]'s text form; `None` for a row written before checksums.
    pub checksum: Option<String>,
    /// [`QuickCheck`](crate::QuickCheck)'s text form; `None` for a row written before
    /// quick checks.
    pub quick_check: Option<String>,
    /// The [`Receipt`](dataref_protocol::Receipt) as JSON; `None` for a row written before
    /// receipts (or by a maker that keeps none).
    pub receipt: Option<String>,
}

impl IndexRow {
    /// `meta` encoded for an index.
    pub fn from_meta(meta: &ArtifactMeta) -> Result<Self, StoreError> {
        let enc = |what, r: Result<String, serde_json::Error>| r.map_err(|e| json_err(what, e));
        Ok(Self {
            data_ref: meta.data_ref.as_str().to_owned(),
            owner: meta.owner.as_str().to_owned(),
            rows: to_i64(meta.rows, "row count")?,
            bytes: to_i64(meta.bytes, "size")?,
            schema: enc("schema", serde_json::to_string(meta.schema.as_ref()))?,
            null_counts: enc("null counts", serde_json::to_string(&meta.null_counts))?,
            created_at: meta.created_at.0,
            expires_at: meta.expires_at.0,
            lineage_tool: meta.lineage.tool.clone(),
            lineage_args: enc(
                "lineage arguments",
                serde_json::to_string(&meta.lineage.args),
            )?,
            checksum: meta.checksum.map(|c| c.to_string()),
            quick_check: meta.quick_check.map(|c| c.to_string()),
            receipt: meta
                .lineage
                .receipt
                .as_ref()
                .map(|r| enc("receipt", serde_json::to_string(r)))
                .transpose()?,
        })
    }

    /// The row decoded; anything malformed is an index error naming the field.
    pub fn into_meta(self) -> Result<ArtifactMeta, StoreError> {
        let data_ref = DataRef::parse(&self.data_ref).map_err(|e| {
            StoreError::Index(format!("bad ref `{}` in the index: {e}", self.data_ref))
        })?;
        let owner = Principal::new(&self.owner).map_err(|e| {
            StoreError::Index(format!("bad owner `{}` in the index: {e}", self.owner))
        })?;
        let schema: Schema =
            serde_json::from_str(&self.schema).map_err(|e| json_err("schema", e))?;
        let checksum = match &self.checksum {
            None => None,
            Some(text) => Some(Checksum::parse(text).ok_or_else(|| {
                StoreError::Index(format!(
                    "bad checksum `{text}` for `{}` in the index",
                    self.data_ref
                ))
            })?),
        };
        let quick_check = match &self.quick_check {
            None => None,
            Some(text) => Some(crate::QuickCheck::parse(text).ok_or_else(|| {
                StoreError::Index(format!(
                    "bad quick check `{text}` for `{}` in the index",
                    self.data_ref
                ))
            })?),
        };
        Ok(ArtifactMeta {
            data_ref,
            owner,
            rows: to_u64(self.rows, "row count")?,
            bytes: to_u64(self.bytes, "size")?,
            schema: Arc::new(schema),
            null_counts: serde_json::from_str(&self.null_counts)
                .map_err(|e| json_err("null counts", e))?,
            created_at: Timestamp(self.created_at),
            expires_at: Timestamp(self.expires_at),
            lineage: Lineage {
                tool: self.lineage_tool,
                args: serde_json::from_str(&self.lineage_args)
                    .map_err(|e| json_err("lineage arguments", e))?,
                receipt: self.receipt.as_deref().and_then(read_receipt),
            },
            checksum,
            quick_check,
        })
    }
}

/// A receipt from the index. One a newer dataref wrote in a shape this build cannot read
/// is no receipt, not a broken row: the table itself is fine.
fn read_receipt(text: &str) -> Option<dataref_protocol::Receipt> {
    serde_json::from_str(text)
        .inspect_err(|e| tracing::debug!(error = %e, "a receipt this build cannot read"))
        .ok()
}

/// A count or size read from an index, which stores them signed.
pub fn to_u64(v: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(v).map_err(|_| StoreError::Index(format!("negative {what} ({v}) in the index")))
}

fn to_i64(v: u64, what: &str) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::Index(format!("{what} ({v}) too large to index")))
}

fn json_err(what: &str, e: serde_json::Error) -> StoreError {
    StoreError::Index(format!("{what} in the index: {e}"))
}

pub(crate) fn io_err(context: &'static str, path: &Path, source: io::Error) -> StoreError {
    StoreError::Io {
        context,
        path: path.to_owned(),
        source,
    }
}

/// Removes a file that should go; failing to is logged, not returned, because whoever
/// calls this is already on a path with a better error to report (or none), and leftovers
/// are removed later anyway.
#[expect(
    clippy::disallowed_methods,
    reason = "the artifact files are this crate's own"
)]
pub(crate) fn remove_if_present(path: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(path = %path.display(), error = %e, "cannot remove file"),
    }
}

/// Makes a rename in `dir` durable.
#[expect(
    clippy::disallowed_methods,
    reason = "the artifact files are this crate's own"
)]
pub(crate) fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_err("cannot sync directory", dir, e))
}
