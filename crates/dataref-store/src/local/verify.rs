//! A table's bytes checked against the sums written with them before any of them is
//! served: the first time this process maps the file, and again whenever its size, times
//! or inode changed (the quick check; `dataref store verify` the content hash). A copy of
//! bytes kept elsewhere (the shared store's cache) that fails is dropped and fetched once
//! more; what still fails is [`StoreError::Damaged`], logged, and never cached or served.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::sync::{Mutex, PoisonError};

use arrow_buffer::Buffer;
use dataref_protocol::{DataRef, Principal};

use super::{Inner, mapped, not_found};
use crate::backend::io_err;
use crate::{ArtifactMeta, Checksum, Opened, QuickCheck, StoreError};

/// One version of a local file: the same size, modification and change times and inode as
/// when its bytes were verified. (A flipped bit on disk changes none of them; the next process to
/// map the file, and `dataref store verify`, hash it again.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Stamp {
    len: u64,
    modified_ns: i128,
    /// Moved by every write and by setting the modification time back, and set back by no
    /// call.
    changed_ns: i128,
    ino: u64,
    dev: u64,
}

impl Stamp {
    fn of(file: &File) -> std::io::Result<Self> {
        let m = file.metadata()?;
        Ok(Self {
            len: m.len(),
            modified_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
            changed_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
            ino: m.ino(),
            dev: m.dev(),
        })
    }
}

/// Files beyond this many verified ones are forgotten all at once (and hashed again when
/// next mapped): a bound on memory, not a cache anyone should reach.
const VERIFIED_KEPT: usize = 16_384;

/// The files this process has verified.
#[derive(Debug, Default)]
pub(super) struct Verified(Mutex<HashMap<DataRef, Stamp>>);

impl Verified {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<DataRef, Stamp>> {
        // Every change is one insert or removal.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn holds(&self, data_ref: &DataRef, stamp: Stamp) -> bool {
        self.lock().get(data_ref) == Some(&stamp)
    }

    fn record(&self, data_ref: &DataRef, stamp: Stamp) {
        let mut map = self.lock();
        if map.len() >= VERIFIED_KEPT {
            map.clear();
        }
        map.insert(data_ref.clone(), stamp);
    }

    pub(super) fn forget(&self, data_ref: &DataRef) {
        self.lock().remove(data_ref);
    }
}

/// How hard to look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Check {
    /// Hash unless this process verified this very file already.
    Once,
    /// Hash whatever this process knows (`dataref store verify`).
    Always,
}

impl Inner {
    /// `meta`'s bytes, opened and mapped, verified (see the module docs).
    pub(super) fn open_verified(
        &self,
        meta: &ArtifactMeta,
        check: Check,
    ) -> Result<(File, Buffer), StoreError> {
        let data_ref = &meta.data_ref;
        let path = self.artifact_path(data_ref);
        let mut fetched_again = false;
        loop {
            let opened = match self.bytes.open(meta)? {
                Some(opened) => opened,
                None => return Err(self.missing(&meta.owner, data_ref)),
            };
            let stamp =
                Stamp::of(&opened.file).map_err(|e| io_err("cannot inspect artifact", &path, e))?;
            let detail = match self.check_bytes(meta, &opened, stamp, check)? {
                Ok(buffer) => {
                    self.verified.record(data_ref, stamp);
                    return Ok((opened.file, buffer));
                }
                Err(detail) => detail,
            };
            self.verified.forget(data_ref);
            drop(opened);
            if !fetched_again && self.bytes.forget_copy(data_ref) {
                tracing::warn!(%data_ref, %detail, "this machine's copy of a table is damaged; fetching it again");
                fetched_again = true;
                continue;
            }
            tracing::error!(%data_ref, owner = %meta.owner, %detail, "a stored table is damaged; none of it is served");
            return Err(StoreError::Damaged {
                data_ref: data_ref.as_str().to_owned(),
                detail,
            });
        }
    }

    /// The opened file mapped, if its bytes are the ones written (hashed unless already
    /// known good); else what is wrong with them.
    fn check_bytes(
        &self,
        meta: &ArtifactMeta,
        opened: &Opened,
        stamp: Stamp,
        check: Check,
    ) -> Result<Result<Buffer, String>, StoreError> {
        if stamp.len != meta.bytes {
            return Ok(Err(format!(
                "its file holds {} bytes where {} were written",
                stamp.len, meta.bytes
            )));
        }
        let path = self.artifact_path(&meta.data_ref);
        let buffer =
            mapped::map_file(&opened.file).map_err(|e| io_err("cannot map artifact", &path, e))?;
        if opened.verified || (check == Check::Once && self.verified.holds(&meta.data_ref, stamp)) {
            return Ok(Ok(buffer));
        }
        // On a read, the quick check where the row has one (see `QuickCheck` for why it
        // is enough); `dataref store verify` checks the content hash.
        if let (Check::Once, Some(_), Some(expected)) = (check, meta.checksum, meta.quick_check) {
            return Ok(QuickCheck::of(buffer.as_slice())
                .matches(&expected)
                .map(|()| buffer));
        }
        let found = Checksum::of(buffer.as_slice());
        match meta.checksum {
            Some(expected) => Ok(found.matches(&expected).map(|()| buffer)),
            None => {
                // Indexed before checksums were kept: what is there now is adopted.
                self.index.adopt_checksum(&meta.data_ref, &found)?;
                tracing::info!(data_ref = %meta.data_ref, checksum = %found, "adopted the checksum of a table stored before checksums");
                Ok(Ok(buffer))
            }
        }
    }

    /// `data_ref` has no bytes. Swept between the index read and now: not found (as every
    /// other unknown ref). Still indexed and live: its bytes were lost, and saying "unknown"
    /// would contradict `list_artifacts`.
    fn missing(&self, owner: &Principal, data_ref: &DataRef) -> StoreError {
        match self.index.get(owner, data_ref, self.clock.now()) {
            Ok(Some(_)) => {
                let detail = "its bytes are missing from the store".to_owned();
                tracing::error!(%data_ref, %owner, %detail, "a stored table is damaged; none of it is served");
                StoreError::Damaged {
                    data_ref: data_ref.as_str().to_owned(),
                    detail,
                }
            }
            Ok(None) => not_found(data_ref),
            Err(e) => e,
        }
    }
}

/// What `dataref store verify` found.
#[derive(Debug, Default)]
pub struct VerifyReport {
    /// Tables whose bytes matched.
    pub intact: u64,
    /// Their bytes in all.
    pub bytes: u64,
    /// Of those, tables stored before checksums, whose checksum was recorded now.
    pub adopted: u64,
    pub damaged: Vec<DamagedTable>,
    /// Damaged tables whose rows and bytes were removed (`--drop`).
    pub dropped: u64,
}

/// A table that failed its check.
#[derive(Debug)]
pub struct DamagedTable {
    pub data_ref: DataRef,
    pub owner: Principal,
    pub detail: String,
}

impl super::LocalStore {
    /// Hashes every live table's bytes against its checksum (a copy kept here of bytes
    /// kept elsewhere is fetched again when it fails). With `drop_damaged`, a table that
    /// still fails is removed: its row, then whatever bytes are left. `progress` is told
    /// (done, total) after each table.
    pub fn verify(
        &self,
        drop_damaged: bool,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<VerifyReport, StoreError> {
        let inner = &self.inner;
        let rows = inner.index.every(inner.clock.now())?;
        let total = u64::try_from(rows.len()).unwrap_or(u64::MAX);
        let mut report = VerifyReport::default();
        for (done, meta) in (1..).zip(rows) {
            match inner.open_verified(&meta, Check::Always) {
                Ok(_) => {
                    report.intact += 1;
                    report.bytes += meta.bytes;
                    report.adopted += u64::from(meta.checksum.is_none());
                }
                Err(StoreError::Damaged { detail, .. }) => {
                    if drop_damaged && inner.index.drop_row(&meta.data_ref)? {
                        inner.forget_mapping(&meta.data_ref);
                        inner.bytes.remove(&meta.data_ref);
                        report.dropped += 1;
                    }
                    report.damaged.push(DamagedTable {
                        data_ref: meta.data_ref,
                        owner: meta.owner,
                        detail,
                    });
                }
                // Expired and swept while this ran.
                Err(StoreError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
            progress(done, total);
        }
        Ok(report)
    }
}
