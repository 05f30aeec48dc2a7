//! This replica's bounded cache of whole objects, `<home>/cache/objects/<name>`, and of
//! tables fetched in parts (`<name>.<n>.part`, counted by the bytes fetched; see
//! [`crate::parts`]).
//!
//! An object never changes under its key, so a cached file is valid for as long as it is
//! kept; the owner and expiry checks happen in the index on every read, before the cache is
//! looked at. When the files' total passes the bound, the least recently used go. Eviction
//! only unlinks: a file still mapped (or handed to the sandbox as a descriptor) stays
//! readable by whoever holds it, and its space is freed when they let go.

#![expect(
    clippy::disallowed_methods,
    reason = "the cache directory is this crate's own, outside every workspace"
)]

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use crate::error::SharedError;

/// How the file of a table fetched in parts is named: `<ref>.arrow.<n>.part`.
pub(crate) const PART_SUFFIX: &str = ".part";

/// Downloads still under `.tmp/` after this long were left by a process that is gone.
const STALE_TMP: Duration = Duration::from_secs(3600);

#[derive(Debug)]
pub(crate) struct Cache {
    dir: PathBuf,
    tmp: PathBuf,
    limit: u64,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<String, Entry>,
    total: u64,
    /// A counter, not a clock: larger is more recent.
    tick: u64,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    bytes: u64,
    used: u64,
}

impl Cache {
    /// Opens (creating, 0700) the cache under `dir`, counting what is already there, oldest
    /// first by modification time; downloads left unfinished long ago are removed.
    pub(crate) fn open(dir: &Path, limit: u64) -> Result<Self, SharedError> {
        let tmp = dir.join(".tmp");
        // The data dir above the cache is the sandbox's way to its job directories: made
        // 0711 when missing, as the workspace makes it. The cache itself is this uid's only.
        if let Some(home) = dir.parent().and_then(Path::parent) {
            std::os::unix::fs::DirBuilderExt::mode(fs::DirBuilder::new().recursive(true), 0o711)
                .create(home)
                .map_err(|e| SharedError::local("cannot create directory", home, e))?;
        }
        std::os::unix::fs::DirBuilderExt::mode(fs::DirBuilder::new().recursive(true), 0o700)
            .create(&tmp)
            .map_err(|e| SharedError::local("cannot create directory", &tmp, e))?;
        let now = SystemTime::now();
        for entry in read_dir(&tmp)? {
            let old = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|m| now.duration_since(m).ok())
                .is_some_and(|age| age > STALE_TMP);
            if old {
                remove(&entry.path());
            }
        }
        let mut found: Vec<(SystemTime, String, u64)> = Vec::new();
        for entry in read_dir(dir)? {
            let Ok(meta) = entry.metadata() else { continue };
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            // A table fetched in parts is known only to the process that fetched it (which
            // parts are there): what a process before this one left is removed.
            if meta.is_file() && name.ends_with(PART_SUFFIX) {
                remove(&entry.path());
            } else if meta.is_file() && !name.starts_with('.') {
                found.push((
                    meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                    name,
                    meta.len(),
                ));
            }
        }
        found.sort();
        let mut state = State::default();
        for (_, name, bytes) in found {
            state.tick += 1;
            state.total += bytes;
            state.entries.insert(
                name,
                Entry {
                    bytes,
                    used: state.tick,
                },
            );
        }
        let cache = Self {
            dir: dir.to_owned(),
            tmp,
            limit,
            state: Mutex::new(state),
        };
        cache.evict(None);
        Ok(cache)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Every change is one insert or removal with its total: nothing half done.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Where the object `name` is kept.
    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// A new, unused name under `.tmp/` for a download or a write in progress.
    pub(crate) fn tmp_path(&self, name: &str) -> PathBuf {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        self.tmp.join(format!(
            "{name}.{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ))
    }

    /// The cached file `name`, opened read-only, if it is there (now the most recent).
    pub(crate) fn open_file(&self, name: &str) -> Result<Option<fs::File>, SharedError> {
        let path = self.path(name);
        match fs::File::open(&path) {
            Ok(file) => {
                let mut state = self.state();
                state.tick += 1;
                let tick = state.tick;
                if let Some(e) = state.entries.get_mut(name) {
                    e.used = tick;
                }
                Ok(Some(file))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(SharedError::local("cannot open", &path, e)),
        }
    }

    /// Moves the finished file `from` (under `.tmp/`, or a staged write) into the cache as
    /// `name`, then evicts the least recently used others while over the bound. Returns
    /// the file opened before it moved: even if another reader's admission evicts it at
    /// once, this reader holds it.
    pub(crate) fn admit(&self, name: &str, from: &Path) -> Result<fs::File, SharedError> {
        let to = self.path(name);
        let file = fs::File::open(from).map_err(|e| SharedError::local("cannot open", from, e))?;
        let bytes = file
            .metadata()
            .map_err(|e| SharedError::local("cannot inspect", from, e))?
            .len();
        fs::rename(from, &to)
            .map_err(|e| SharedError::local("cannot move into the cache", &to, e))?;
        {
            let mut state = self.state();
            state.tick += 1;
            let used = state.tick;
            if let Some(old) = state.entries.insert(name.to_owned(), Entry { bytes, used }) {
                state.total = state.total.saturating_sub(old.bytes);
            }
            state.total += bytes;
        }
        self.evict(Some(name));
        Ok(file)
    }

    /// Counts `bytes` more of the file `name` (a table being fetched in parts, counted from
    /// 0 when `new`), then evicts the least recently used others while over the bound.
    /// Nothing when `name` is no longer in the cache (evicted): its holder's file is
    /// unlinked, and its space freed when the holder lets go.
    pub(crate) fn grow(&self, name: &str, bytes: u64, new: bool) {
        {
            let mut state = self.state();
            state.tick += 1;
            let used = state.tick;
            match state.entries.get_mut(name) {
                Some(e) => {
                    e.bytes += bytes;
                    e.used = used;
                }
                None if new => {
                    state.entries.insert(name.to_owned(), Entry { bytes, used });
                }
                None => return,
            }
            state.total += bytes;
        }
        self.evict(Some(name));
    }

    /// Whether `name` is in the cache.
    pub(crate) fn holds(&self, name: &str) -> bool {
        self.state().entries.contains_key(name)
    }

    /// Drops `name` from the cache (its object is gone).
    pub(crate) fn forget(&self, name: &str) {
        {
            let mut state = self.state();
            if let Some(e) = state.entries.remove(name) {
                state.total = state.total.saturating_sub(e.bytes);
            }
        }
        remove(&self.path(name));
    }

    /// Bytes the cache holds.
    pub(crate) fn total(&self) -> u64 {
        self.state().total
    }

    /// Unlinks the least recently used files (never `keep`) until the total is within the
    /// bound.
    fn evict(&self, keep: Option<&str>) {
        let victims: Vec<String> = {
            let mut state = self.state();
            let mut by_age: Vec<(u64, String, u64)> = state
                .entries
                .iter()
                .filter(|(name, _)| Some(name.as_str()) != keep)
                .map(|(name, e)| (e.used, name.clone(), e.bytes))
                .collect();
            by_age.sort_unstable();
            let mut victims = Vec::new();
            for (_, name, bytes) in by_age {
                if state.total <= self.limit {
                    break;
                }
                state.entries.remove(&name);
                state.total = state.total.saturating_sub(bytes);
                victims.push(name);
            }
            victims
        };
        for name in victims {
            remove(&self.path(&name));
        }
    }
}

fn read_dir(dir: &Path) -> Result<Vec<fs::DirEntry>, SharedError> {
    fs::read_dir(dir)
        .and_then(|entries| entries.collect::<io::Result<Vec<_>>>())
        .map_err(|e| SharedError::local("cannot read directory", dir, e))
}

/// Removes a file of the cache; a failure is logged (the next start recounts anyway).
pub(crate) fn remove(path: &Path) {
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(path = %path.display(), error = %e, "cannot remove a cached file"),
    }
}
