//! A byte quota on a workspace, enforced where every byte enters it: [`AtomicFile`]'s
//! `write`. A write that would take the workspace over its quota fails before a byte of it
//! reaches the disk, so no writer (spill, export, `run_python`'s files and logs, copies,
//! charts) can fill the disk with repeated calls, and none needs a check of its own.
//!
//! The count is kept per directory (by device and inode), shared by every [`Workspace`]
//! value of the same directory in this process: bytes on disk (from a walk of the tree when
//! the count is first needed, then moved by each commit) plus bytes written by writes not
//! yet committed. Files changed behind its back (a person deleting files, the spill sweep)
//! make the count too high, never too low, and a refused write walks the tree again before
//! it gives up.
//!
//! [`AtomicFile`]: crate::AtomicFile
//! [`Workspace`]: crate::Workspace

use std::fmt;
use std::io;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{self, AtFlags, FileType, Mode, OFlags};

pub use dataref_protocol::human_bytes;

use crate::TEMP_PREFIX;

/// Entries a walk looks at before it stops counting (what it saw still counts).
const MAX_WALK_ENTRIES: usize = 200_000;
/// Directory levels a walk descends.
const MAX_WALK_DEPTH: usize = 64;
/// Largest entries named in a refusal.
const LARGEST_SHOWN: usize = 3;

/// What the workspace holds, by top-level entry.
#[derive(Debug, Clone, Default)]
struct Usage {
    bytes: u64,
    /// `(name, bytes)` of each top-level entry (a directory with everything beneath it),
    /// largest first, at most [`LARGEST_SHOWN`].
    largest: Vec<(String, u64)>,
}

#[derive(Debug, Default)]
struct Count {
    /// `None` until the first walk.
    on_disk: Option<Usage>,
    /// Bytes written by writes not yet committed.
    in_flight: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Ledger {
    count: Mutex<Count>,
}

/// A directory by device and inode.
type DirKey = (u64, u64);

/// The ledger of the directory `root` is, shared by every workspace of it in this process.
fn ledger_for(root: BorrowedFd<'_>) -> io::Result<Arc<Ledger>> {
    static LEDGERS: Mutex<Vec<(DirKey, Weak<Ledger>)>> = Mutex::new(Vec::new());
    let stat = fs::fstat(root)?;
    let key = (stat.st_dev, stat.st_ino);
    let mut ledgers = LEDGERS.lock().unwrap_or_else(PoisonError::into_inner);
    ledgers.retain(|(_, weak)| weak.strong_count() > 0);
    if let Some(ledger) = ledgers
        .iter()
        .find(|(k, _)| *k == key)
        .and_then(|(_, weak)| weak.upgrade())
    {
        return Ok(ledger);
    }
    let ledger = Arc::new(Ledger::default());
    ledgers.push((key, Arc::downgrade(&ledger)));
    Ok(ledger)
}

/// A workspace's quota.
#[derive(Debug, Clone)]
pub(crate) struct Quota {
    limit: u64,
    ledger: Arc<Ledger>,
}

impl Quota {
    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }

    pub(crate) fn new(root: BorrowedFd<'_>, limit: u64) -> io::Result<Self> {
        Ok(Self {
            limit,
            ledger: ledger_for(root)?,
        })
    }

    /// A budget for one file about to be written; `replaced` is the size of the file it
    /// will replace (given back when it commits).
    pub(crate) fn budget(&self, root: BorrowedFd<'_>, replaced: u64) -> Budget {
        Budget {
            limit: self.limit,
            ledger: Arc::clone(&self.ledger),
            root: root.try_clone_to_owned().ok(),
            replaced,
            written: 0,
        }
    }
}

/// One file's share of the quota while it is written.
#[derive(Debug)]
pub(crate) struct Budget {
    limit: u64,
    ledger: Arc<Ledger>,
    /// For walking the tree (first use, or again before refusing).
    root: Option<OwnedFd>,
    replaced: u64,
    written: u64,
}

impl Budget {
    /// Takes `len` more bytes, or refuses with what the workspace holds.
    pub(crate) fn take(&mut self, len: usize) -> io::Result<()> {
        let len = len as u64;
        let mut count = self
            .ledger
            .count
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for fresh_walk in [false, true] {
            if count.on_disk.is_none() || fresh_walk {
                let usage = self
                    .root
                    .as_ref()
                    .map(|r| walk(r.as_fd()))
                    .unwrap_or_default();
                count.on_disk = Some(usage);
            }
            let on_disk = count.on_disk.as_ref().map_or(0, |u| u.bytes);
            let after = on_disk
                .saturating_sub(self.replaced)
                .saturating_add(count.in_flight)
                .saturating_add(len);
            if after <= self.limit {
                count.in_flight += len;
                self.written += len;
                return Ok(());
            }
        }
        let usage = count.on_disk.clone().unwrap_or_default();
        Err(io::Error::new(
            io::ErrorKind::QuotaExceeded,
            QuotaRefusal {
                limit: self.limit,
                used: usage.bytes.saturating_add(count.in_flight),
                largest: usage.largest,
            },
        ))
    }

    /// `len` bytes taken but not written (a short write).
    pub(crate) fn give_back(&mut self, len: usize) {
        let len = (len as u64).min(self.written);
        let mut count = self
            .ledger
            .count
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        count.in_flight = count.in_flight.saturating_sub(len);
        self.written -= len;
    }

    /// The file was moved into place: its bytes are on disk now, the replaced file's not.
    pub(crate) fn committed(mut self) {
        let mut count = self
            .ledger
            .count
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        count.in_flight = count.in_flight.saturating_sub(self.written);
        if let Some(usage) = &mut count.on_disk {
            usage.bytes = usage
                .bytes
                .saturating_add(self.written)
                .saturating_sub(self.replaced);
        }
        self.written = 0;
    }
}

impl Drop for Budget {
    fn drop(&mut self) {
        // Not committed (or already accounted): the temporary file is gone with its bytes.
        if self.written > 0 {
            let mut count = self
                .ledger
                .count
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            count.in_flight = count.in_flight.saturating_sub(self.written);
        }
    }
}

/// Why a write was refused; carried inside the `io::Error` a write returns, and turned into
/// [`WorkspacePathError::QuotaExceeded`](crate::WorkspacePathError::QuotaExceeded) by
/// whoever names the path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaRefusal {
    pub limit: u64,
    /// Bytes the workspace holds (and has in flight).
    pub used: u64,
    /// The largest top-level entries, `(name, bytes)`, largest first; a directory counts
    /// with everything beneath it.
    pub largest: Vec<(String, u64)>,
}

impl fmt::Display for QuotaRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the workspace quota of {} is used up ({} in use)",
            human_bytes(self.limit),
            human_bytes(self.used)
        )
    }
}

impl std::error::Error for QuotaRefusal {}

impl QuotaRefusal {
    /// The refusal inside `e`, if `e` is one.
    pub fn of(e: &io::Error) -> Option<&QuotaRefusal> {
        e.get_ref()?.downcast_ref::<QuotaRefusal>()
    }
}

/// Sizes of the regular files beneath `root`, by top-level entry, never following a link
/// (temporary files of writes in flight are counted by the ledger instead).
fn walk(root: BorrowedFd<'_>) -> Usage {
    let mut seen = 0usize;
    let mut top: Vec<(String, u64)> = Vec::new();
    let mut total = 0u64;
    for (name, kind, size) in entries(root, &mut seen) {
        let bytes = match kind {
            FileType::RegularFile => size,
            FileType::Directory => match open_dir(root, &name) {
                Ok(dir) => tree_bytes(&dir, 1, &mut seen),
                Err(_) => 0,
            },
            _ => 0,
        };
        total = total.saturating_add(bytes);
        if bytes > 0 {
            let shown = if kind == FileType::Directory {
                format!("{name}/")
            } else {
                name
            };
            top.push((shown, bytes));
        }
    }
    top.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    top.truncate(LARGEST_SHOWN);
    Usage {
        bytes: total,
        largest: top,
    }
}

fn tree_bytes(dir: &OwnedFd, depth: usize, seen: &mut usize) -> u64 {
    let mut total = 0u64;
    for (name, kind, size) in entries(dir.as_fd(), seen) {
        total = total.saturating_add(match kind {
            FileType::RegularFile => size,
            FileType::Directory if depth < MAX_WALK_DEPTH => match open_dir(dir.as_fd(), &name) {
                Ok(sub) => tree_bytes(&sub, depth + 1, seen),
                Err(_) => 0,
            },
            _ => 0,
        });
    }
    total
}

/// `(name, type, size)` of the entries of `dir` (not following links), skipping
/// temporary files; stops once `seen` reaches [`MAX_WALK_ENTRIES`].
fn entries(dir: BorrowedFd<'_>, seen: &mut usize) -> Vec<(String, FileType, u64)> {
    let Ok(listing) = fs::Dir::read_from(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in listing {
        let Ok(entry) = entry else { break };
        let raw = entry.file_name().to_bytes();
        if raw == b"." || raw == b".." {
            continue;
        }
        *seen += 1;
        if *seen > MAX_WALK_ENTRIES {
            break;
        }
        let name = String::from_utf8_lossy(raw).into_owned();
        if name.starts_with(TEMP_PREFIX) {
            continue;
        }
        let Ok(stat) = fs::statat(dir, entry.file_name(), AtFlags::SYMLINK_NOFOLLOW) else {
            continue;
        };
        let size = u64::try_from(stat.st_size).unwrap_or(0);
        out.push((name, FileType::from_raw_mode(stat.st_mode), size));
    }
    out
}

fn open_dir(dir: BorrowedFd<'_>, name: &str) -> rustix::io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    fs::openat(dir, name, flags, Mode::empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(human_bytes(80), "80 bytes");
        assert_eq!(human_bytes(12 << 10), "12 KiB");
        assert_eq!(human_bytes(1536 << 20), "1.5 GiB");
        assert_eq!(human_bytes(312 << 20), "312 MiB");
    }
}
