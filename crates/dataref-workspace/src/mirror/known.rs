//! Which shared version each local copy holds, as far as this process knows.
//!
//! Keyed by the file's identity: device, inode, size, and modification and change times in
//! nanoseconds. Any change to the file (a write, a rename, a `touch`, a new file under the
//! same name) changes the change time at least, so a stale entry never vouches for
//! different content; it only stays around until it is pushed out.
//!
//! The lock also orders the renames that put copies into place: a commit renames and
//! records under it, and a sync checks, renames (or unlinks) and records under it, so a
//! sync working from a listing taken before a commit cannot undo that commit. Each record
//! gets a sequence number; a sync notes the number before it lists and leaves alone any
//! file recorded after that (its listing may predate the file).

use std::collections::{HashMap, VecDeque};
use std::sync::{LazyLock, Mutex, MutexGuard, PoisonError};

use rustix::fs::Stat;

use crate::workspace::{stat_i64, stat_u64};

/// Entries kept at most: 64 Ki files of about 100 bytes each. An entry pushed out costs
/// one hash of the file at its next sync, not a fetch.
pub(crate) const MAX_KNOWN: usize = 1 << 16;

/// A file as `stat` sees it, precise enough that any change to it changes the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Identity {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl Identity {
    pub(crate) fn of(stat: &Stat) -> Self {
        let ns = |secs: i64, nsecs: i64| i128::from(secs) * 1_000_000_000 + i128::from(nsecs);
        Self {
            dev: stat_u64(stat.st_dev),
            ino: stat_u64(stat.st_ino),
            size: stat_u64(stat.st_size),
            mtime_ns: ns(stat_i64(stat.st_mtime), stat_i64(stat.st_mtime_nsec)),
            ctime_ns: ns(stat_i64(stat.st_ctime), stat_i64(stat.st_ctime_nsec)),
        }
    }

    pub(crate) fn size(&self) -> u64 {
        self.size
    }
}

#[derive(Debug)]
struct Entry {
    version: String,
    seq: u64,
}

/// What the process knows, behind [`lock`].
#[derive(Debug, Default)]
pub(crate) struct Known {
    entries: HashMap<Identity, Entry>,
    /// Insertion order with the sequence number of each insertion, for pushing out the
    /// oldest; a key re-recorded later is only removed by its latest position.
    order: VecDeque<(Identity, u64)>,
    seq: u64,
}

/// The process-wide map, locked.
pub(crate) fn lock() -> MutexGuard<'static, Known> {
    static KNOWN: LazyLock<Mutex<Known>> = LazyLock::new(Mutex::default);
    KNOWN.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Known {
    /// The sequence number of the latest record.
    pub(crate) fn seq(&self) -> u64 {
        self.seq
    }

    /// The version the file `id` holds and when that was recorded, if known.
    pub(crate) fn get(&self, id: &Identity) -> Option<(&str, u64)> {
        self.entries.get(id).map(|e| (e.version.as_str(), e.seq))
    }

    /// True if `id` was recorded after `start` (a sync's listing may predate it).
    pub(crate) fn newer_than(&self, id: &Identity, start: u64) -> bool {
        self.entries.get(id).is_some_and(|e| e.seq > start)
    }

    pub(crate) fn record(&mut self, id: Identity, version: String) {
        self.seq += 1;
        let seq = self.seq;
        self.entries.insert(id, Entry { version, seq });
        self.order.push_back((id, seq));
        while self.entries.len() > MAX_KNOWN || self.order.len() > 2 * MAX_KNOWN {
            let Some((old, old_seq)) = self.order.pop_front() else {
                break;
            };
            if self.entries.get(&old).is_some_and(|e| e.seq == old_seq) {
                self.entries.remove(&old);
            }
        }
    }

    pub(crate) fn forget(&mut self, id: &Identity) {
        self.entries.remove(id);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(ino: u64) -> Identity {
        Identity {
            dev: 1,
            ino,
            size: 0,
            mtime_ns: 0,
            ctime_ns: 0,
        }
    }

    #[test]
    fn bounded_and_oldest_out_first() {
        let mut known = Known::default();
        for i in 0..(MAX_KNOWN as u64 + 10) {
            known.record(id(i), format!("v{i}"));
        }
        assert_eq!(known.len(), MAX_KNOWN);
        assert!(known.get(&id(0)).is_none());
        assert_eq!(
            known.get(&id(MAX_KNOWN as u64 + 9)).map(|(v, _)| v),
            Some(&*format!("v{}", MAX_KNOWN + 9))
        );
    }

    #[test]
    fn a_key_recorded_again_is_not_pushed_out_by_its_old_position() {
        let mut known = Known::default();
        known.record(id(0), "a".into());
        for i in 1..(MAX_KNOWN as u64) {
            known.record(id(i), "x".into());
        }
        known.record(id(0), "b".into());
        // Over the bound: the oldest position is id(0)'s first, which is stale now.
        known.record(id(MAX_KNOWN as u64), "y".into());
        assert_eq!(known.get(&id(0)).map(|(v, _)| v), Some("b"));
        assert!(known.get(&id(1)).is_none());
        assert!(known.len() <= MAX_KNOWN);
        assert!(known.order.len() <= 2 * MAX_KNOWN);
    }
}
