//! Bringing the local copy of a path (a file, or a directory with everything beneath it)
//! up to date with the mirror's index.
//!
//! The order matters: local regular files the index does not have are removed first (so a
//! stale file cannot stand where the index has a directory), then each row is fetched
//! where the local copy is missing or not known to be that version. Everything is done
//! from directory fds, never following a link: parents are opened or made the way
//! `create_atomic` does it, a fetched file goes to an `O_EXCL` temporary file and is
//! renamed into place, and removals unlink names in a directory fd held open.
//!
//! A version can vanish between the listing and its fetch (replaced on another replica,
//! and its content swept). Then that one path is listed again and its new version fetched,
//! a few times at most; if it still cannot be had, the local copy is removed rather than
//! left standing as a version older than anything the index named.
//!
//! Syncing a directory does not fail because one of its files cannot be fetched: that file
//! is logged and left out (its stale copy removed), and only a sync of that file itself
//! reports the reason. The index being unreachable still fails the call, and so does the
//! store failing fetch after fetch (each of which may cost a full timeout).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::time::Duration;

use dataref_protocol::Timestamp;
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{self, AtFlags, Dir, FileType, Mode, OFlags};
use rustix::io::Errno;

use super::known::{self, Identity};
use super::{Mirror, MirrorError, Remote, Verify, hex, set_modified};
use crate::atomic::create_temp;
use crate::beneath::io_error;
use crate::error::{MAX_DEPTH, WorkspacePathError};
use crate::path::{normalize, split_last};
use crate::{TEMP_PREFIX, Workspace, WorkspacePath};

/// Entries a removal walk looks at, at most (as the quota's walk).
const MAX_WALK_ENTRIES: usize = 200_000;
/// Directory levels a removal walk descends (as `list_tree`).
const MAX_WALK_DEPTH: usize = 64;
/// Fetches of one path whose version keeps vanishing (each after listing it again).
const MAX_FETCH_TRIES: usize = 3;
/// Files of one directory sync left out because the store failed to send them (not
/// because of what they are): one more and the store is taken to be down, and the call
/// fails as it would have for the first.
const MAX_SKIPPED_UNAVAILABLE: usize = 3;
/// How long a path [`Workspace::resolve`] synced counts as up to date for a listing of it
/// by the same workspace: long enough for the listing that follows a resolve in the same
/// call, short enough that a path kept for later is synced again.
const FRESH_SYNC: Duration = Duration::from_secs(1);

/// Why one row could not be made the local copy.
#[derive(Debug)]
enum Failed {
    /// `fetch` says the row's version is gone (replaced or removed since the listing).
    Gone,
    /// Its version kept vanishing, or the index names a version the store does not have.
    Changing,
    /// `fetch` failed otherwise: the store unreachable for it, or what it sent does not
    /// match the index.
    Fetch(MirrorError),
    /// Listing the path again failed: the index is unreachable.
    Index(MirrorError),
    /// A local operation failed.
    Local(WorkspacePathError),
}

impl From<WorkspacePathError> for Failed {
    fn from(e: WorkspacePathError) -> Self {
        Self::Local(e)
    }
}

impl Failed {
    fn into_path_error(self, op: &'static str, path: &str) -> WorkspacePathError {
        match self {
            Self::Gone | Self::Changing => WorkspacePathError::SharedChanging {
                path: path.to_owned(),
                op,
            },
            Self::Fetch(e) | Self::Index(e) => e.into_path_error(op, path),
            Self::Local(e) => e,
        }
    }
}

impl Workspace {
    /// With a mirror: makes the local copy of `rel` (normalised; empty for the whole
    /// workspace) equal to the index. `op` and `shown` name the operation and path in an
    /// error. Rows the index should never have had (paths that are not normalised, leave
    /// `rel`, or would be written through a link or over a non-empty directory) are logged
    /// and skipped. An index that cannot be listed makes the call fail, with nothing
    /// changed; so does a row at `rel` itself that cannot be fetched. Rows beneath `rel`
    /// that cannot be fetched are logged and left out, unless the store fails more than
    /// [`MAX_SKIPPED_UNAVAILABLE`] fetches. Nothing half-written is ever put in place.
    pub(crate) fn sync(
        &self,
        rel: &str,
        op: &'static str,
        shown: &str,
    ) -> Result<(), WorkspacePathError> {
        let Some(mirror) = self.mirror() else {
            return Ok(());
        };
        let start = known::lock().seq();
        let rows = mirror.list(rel).map_err(|e| e.into_path_error(op, shown))?;
        let wanted = valid_rows(rel, rows);
        self.remove_unlisted(rel, &wanted, start);
        let mut unavailable = 0;
        for remote in wanted.values() {
            let failed = match self.sync_current(mirror.as_ref(), remote, start) {
                Ok(()) => continue,
                Err(failed) => failed,
            };
            let path = remote.path.as_str();
            if path == rel {
                // The file asked for: the caller learns why it cannot have it.
                return Err(failed.into_path_error(op, path));
            }
            match failed {
                Failed::Index(e) => return Err(e.into_path_error(op, shown)),
                Failed::Local(e) => return Err(e),
                Failed::Fetch(e @ (MirrorError::Unavailable { .. } | MirrorError::Io(_))) => {
                    unavailable += 1;
                    if unavailable > MAX_SKIPPED_UNAVAILABLE {
                        return Err(e.into_path_error(op, shown));
                    }
                    tracing::warn!(path, error = %e, "leaving out a shared file that cannot be fetched now");
                    self.remove_stale(path, start);
                }
                Failed::Fetch(e) => {
                    tracing::warn!(path, error = %e, "leaving out a shared file that cannot be fetched");
                    self.remove_stale(path, start);
                }
                // Logged, and the copy removed, where it was decided.
                Failed::Gone | Failed::Changing => {}
            }
        }
        Ok(())
    }

    /// [`Workspace::sync`] of a directory about to be listed, unless this workspace's
    /// [`Workspace::resolve`] gave `dir` and synced it a moment ago (the listing that
    /// follows a resolve in the same call need not ask the index twice).
    pub(crate) fn sync_listed(&self, dir: &WorkspacePath) -> Result<(), WorkspacePathError> {
        let fresh = dir
            .sync_mark()
            .is_some_and(|m| m.workspace == self.id() && m.at.elapsed() < FRESH_SYNC);
        if fresh {
            return Ok(());
        }
        self.sync(dir.rel(), "listed", dir.as_str())
    }

    /// With a mirror, the early answer of `create_atomic` under [`Overwrite::Refuse`]:
    /// whether the shared index has `rel` (asked without fetching it). A stale local copy
    /// the index no longer has is removed, so it does not refuse the name either.
    ///
    /// [`Overwrite::Refuse`]: crate::Overwrite::Refuse
    pub(crate) fn check_free(&self, rel: &str, shown: &str) -> Result<(), WorkspacePathError> {
        let Some(mirror) = self.mirror() else {
            return Ok(());
        };
        let start = known::lock().seq();
        let rows = mirror
            .list(rel)
            .map_err(|e| e.into_path_error("saved", shown))?;
        let wanted = valid_rows(rel, rows);
        if wanted.contains_key(rel) {
            return Err(WorkspacePathError::AlreadyExists {
                path: shown.to_owned(),
            });
        }
        if !wanted.is_empty() {
            return Err(WorkspacePathError::NotAFile {
                path: shown.to_owned(),
                found: crate::EntryKind::Directory,
            });
        }
        self.remove_unlisted(rel, &wanted, start);
        Ok(())
    }

    /// With a mirror, [`Workspace::remove_old_files`]: removes from the index the files
    /// directly in `dir` published before `cutoff`, then brings `dir` up to date (which
    /// removes their local copies).
    pub(crate) fn remove_old_shared(
        &self,
        mirror: &dyn Mirror,
        dir: &str,
        cutoff: Timestamp,
    ) -> Result<crate::Swept, WorkspacePathError> {
        let rows = mirror
            .list(dir)
            .map_err(|e| e.into_path_error("swept", dir))?;
        let mut swept = crate::Swept::default();
        for remote in valid_rows(dir, rows).into_values() {
            let directly_in = remote
                .path
                .strip_prefix(dir)
                .and_then(|rest| rest.strip_prefix('/'))
                .is_some_and(|name| !name.contains('/'));
            if !directly_in || remote.modified >= cutoff {
                continue;
            }
            match mirror.remove(&remote) {
                Ok(true) => {
                    swept.removed += 1;
                    swept.bytes += remote.bytes;
                }
                Ok(false) | Err(MirrorError::NotFound { .. }) => {}
                Err(e) => return Err(e.into_path_error("swept", &remote.path)),
            }
        }
        self.sync(dir, "swept", dir)?;
        Ok(swept)
    }

    /// Removes the local regular files at or beneath `rel` that are not in `wanted`, never
    /// through a link, leaving temporary files of writes in flight alone. Failures are
    /// logged: a file that cannot be removed is stale, which the next sync tries again.
    fn remove_unlisted(&self, rel: &str, wanted: &BTreeMap<String, Remote>, start: u64) {
        let mut walk = Removal {
            wanted,
            start,
            seen: 0,
        };
        if rel.is_empty() {
            walk.dir(self.root_fd(), "", 0);
            return;
        }
        let (parent, name) = split_last(rel);
        let Some(dir) = open_dirs_nofollow(self.root_fd(), parent) else {
            return;
        };
        match fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => match FileType::from_raw_mode(stat.st_mode) {
                FileType::RegularFile => walk.file(dir.as_fd(), name, rel, &stat),
                FileType::Directory => {
                    if let Ok(sub) = open_dir_nofollow(dir.as_fd(), name) {
                        walk.dir(sub.as_fd(), rel, 1);
                    }
                }
                _ => {}
            },
            Err(Errno::NOENT | Errno::NOTDIR) => {}
            Err(e) => tracing::warn!(path = rel, error = %e, "cannot inspect a local copy"),
        }
    }

    /// Removes the local copy of `path` if it is a regular file this sync may judge (not
    /// committed since `start`, unchanged meanwhile): a row that could not be fetched must
    /// not be served from an older copy. Directories and links are left alone.
    fn remove_stale(&self, path: &str, start: u64) {
        let (parent, name) = split_last(path);
        let Some(dir) = open_dirs_nofollow(self.root_fd(), parent) else {
            return;
        };
        let Ok(stat) = fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) else {
            return;
        };
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
            return;
        }
        let none = BTreeMap::new();
        let mut walk = Removal {
            wanted: &none,
            start,
            seen: 0,
        };
        walk.file(dir.as_fd(), name, path, &stat);
    }

    /// [`Workspace::sync_file`] of a listed row; if its version vanished before it could
    /// be fetched, lists that one path again and fetches the version it has now, up to
    /// [`MAX_FETCH_TRIES`] fetches. When the path left the index meanwhile, its copy goes
    /// as a sync would remove it; when no version could be had, the copy goes and the
    /// answer is [`Failed::Changing`].
    fn sync_current(&self, mirror: &dyn Mirror, listed: &Remote, start: u64) -> Result<(), Failed> {
        let mut row = Cow::Borrowed(listed);
        let mut tries = 0;
        loop {
            match self.sync_file(mirror, &row, start) {
                Err(Failed::Gone) => {}
                done => return done,
            }
            tries += 1;
            let path = row.path.as_str();
            if tries == MAX_FETCH_TRIES {
                tracing::warn!(
                    path,
                    tries,
                    "a shared file kept changing while it was fetched; removing its local copy"
                );
                break;
            }
            tracing::debug!(path, version = %row.version, "gone from the shared store meanwhile; listing it again");
            let rows = mirror.list(path).map_err(Failed::Index)?;
            let mut now = valid_rows(path, rows);
            match now.remove(path) {
                Some(next) if next.version != row.version => row = Cow::Owned(next),
                Some(_) => {
                    // Listing again will not help: the row stands, its content is gone.
                    tracing::warn!(path, version = %row.version, "the shared index names a version the store does not have; removing the local copy");
                    break;
                }
                None => {
                    // No longer a file of the index (removed, or a directory now): what a
                    // sync of it would remove goes; files beneath it wait for the next.
                    self.remove_unlisted(path, &now, start);
                    return Ok(());
                }
            }
        }
        self.remove_stale(&row.path, start);
        Err(Failed::Changing)
    }

    /// Makes the local copy of one row that version, unless it already is. On failure
    /// nothing changes locally.
    fn sync_file(&self, mirror: &dyn Mirror, remote: &Remote, start: u64) -> Result<(), Failed> {
        let path = remote.path.as_str();
        let (parent, name) = split_last(path);
        // Real directories only, as for any write: a link planted in a parent (even one
        // that stays inside) or a file where a directory should be skips the row.
        let dir = match self.make_dirs(parent, path) {
            Ok(dir) => dir,
            Err(e) => {
                tracing::warn!(path, error = %e, "not syncing a shared file");
                return Ok(());
            }
        };
        let mut before = match fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => Some(stat),
            Err(Errno::NOENT) => None,
            Err(e) => return Err(Failed::Local(io_error("inspect", path, e))),
        };
        if let Some(stat) = &before {
            let id = Identity::of(stat);
            match FileType::from_raw_mode(stat.st_mode) {
                FileType::RegularFile => {
                    let entry = known::lock()
                        .get(&id)
                        .map(|(version, seq)| (version == remote.version, seq));
                    match entry {
                        Some((true, _)) => return Ok(()),
                        // Put there after the listing began (a commit of this process):
                        // the listing cannot judge it.
                        Some((false, seq)) if seq > start => return Ok(()),
                        // Another version, or unknown (written before a restart, or beside
                        // dataref): the same bytes need no fetch (a chart drawn again the
                        // same, a copy restored from a backup).
                        Some((false, _)) | None => {
                            if id.size() == remote.bytes && same_content(&dir, name, &id, remote) {
                                return Ok(());
                            }
                        }
                    }
                }
                FileType::Directory => {
                    // Left over from files the index no longer has beneath it (removed
                    // just before): an empty tree may go; anything else stays, and so
                    // does the row's absence here.
                    if !remove_empty_tree(dir.as_fd(), name, 0) {
                        tracing::warn!(
                            path,
                            "a local directory stands where the shared index has a file; not syncing it"
                        );
                        return Ok(());
                    }
                    before = None;
                }
                // A link or special file: the rename replaces the entry itself, nothing is
                // written through it.
                _ => {}
            }
        }
        let before = before.as_ref().map(Identity::of);

        let (file, temp_name) = create_temp(&dir, path, false)?;
        let mut temp = Fetched {
            dir: dir.as_fd(),
            name: temp_name,
            file,
            placed: false,
        };
        let mut sink = Verify::new(&mut temp.file, remote.bytes);
        let fetched = mirror.fetch(remote, &mut sink);
        if sink.overflowed() {
            // Whatever the store made of the sink's refusal.
            return Err(Failed::Fetch(MirrorError::Corrupt {
                path: path.to_owned(),
                detail: format!("more than the {} bytes its index names", remote.bytes),
            }));
        }
        match fetched {
            Ok(()) => {}
            // Replaced or removed since the listing: the caller lists it again.
            Err(MirrorError::NotFound { .. }) => return Err(Failed::Gone),
            Err(e) => return Err(Failed::Fetch(e)),
        }
        let (bytes, sha256) = sink.finish();
        if bytes != remote.bytes || sha256 != remote.sha256 {
            let detail = format!(
                "{bytes} bytes with SHA-256 {}, where the index says {} bytes with {}",
                hex(&sha256),
                remote.bytes,
                hex(&remote.sha256)
            );
            return Err(Failed::Fetch(MirrorError::Corrupt {
                path: path.to_owned(),
                detail,
            }));
        }
        set_modified(&temp.file, remote.modified, path);

        let mut known = known::lock();
        let now = match fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => Some(Identity::of(&stat)),
            Err(Errno::NOENT) => None,
            Err(e) => return Err(Failed::Local(io_error("inspect", path, e))),
        };
        if now != before {
            // Changed while we fetched (a commit of this process, another process, a
            // person): whatever it is now is judged by the next sync, not by this listing.
            return Ok(());
        }
        match fs::renameat(&dir, temp.name.as_str(), &dir, name) {
            Ok(()) => temp.placed = true,
            Err(Errno::ISDIR | Errno::NOTEMPTY | Errno::EXIST) => {
                tracing::warn!(
                    path,
                    "a directory appeared where the shared index has a file; not syncing it"
                );
                return Ok(());
            }
            Err(e) => return Err(Failed::Local(io_error("move into place", path, e))),
        }
        match fs::fstat(&temp.file) {
            Ok(stat) => known.record(Identity::of(&stat), remote.version.clone()),
            // Unknown, so hashed once at the next sync: slower, never wrong.
            Err(e) => tracing::debug!(path, error = %e, "cannot inspect a fetched file"),
        }
        Ok(())
    }
}

/// The rows that name a proper path at or beneath `rel`, by path. The index is trusted for
/// content (checked by hash), never for where it goes: a path must be exactly what
/// [`normalize`] makes of it, not name a temporary file, and stay within `rel`.
fn valid_rows(rel: &str, rows: Vec<Remote>) -> BTreeMap<String, Remote> {
    let mut wanted = BTreeMap::new();
    for remote in rows {
        if let Err(why) = check_row(rel, &remote.path) {
            tracing::warn!(
                path = %remote.path.escape_debug(),
                why = %why,
                "skipping a row of the shared workspace index"
            );
            continue;
        }
        if wanted.contains_key(&remote.path) {
            tracing::warn!(path = %remote.path, "the shared index lists this path twice; keeping the first");
            continue;
        }
        wanted.insert(remote.path.clone(), remote);
    }
    wanted
}

fn check_row(rel: &str, path: &str) -> Result<(), String> {
    let normal = normalize(path.as_bytes()).map_err(|e| e.to_string())?;
    if normal.is_empty() {
        return Err("it names the workspace root, not a file".into());
    }
    if normal != path {
        return Err(format!("it is not in normal form (`{normal}`)"));
    }
    if normal.split('/').count() > MAX_DEPTH {
        return Err("it is too deep".into());
    }
    if normal.split('/').any(|name| name.starts_with(TEMP_PREFIX)) {
        return Err("it names a temporary file".into());
    }
    let inside = rel.is_empty()
        || path == rel
        || path
            .strip_prefix(rel)
            .is_some_and(|rest| rest.starts_with('/'));
    if !inside {
        return Err(format!("it is not beneath `{rel}`, which was listed"));
    }
    Ok(())
}

/// The walk of [`Workspace::remove_unlisted`].
struct Removal<'a> {
    wanted: &'a BTreeMap<String, Remote>,
    start: u64,
    seen: usize,
}

impl Removal<'_> {
    /// The directory `fd`, which is `prefix` in the workspace, at `depth`.
    fn dir(&mut self, fd: BorrowedFd<'_>, prefix: &str, depth: usize) {
        let names = match names(fd) {
            Ok(names) => names,
            Err(e) => {
                tracing::warn!(path = prefix, error = %e, "cannot list a local directory");
                return;
            }
        };
        for name in names {
            self.seen += 1;
            if self.seen > MAX_WALK_ENTRIES {
                return;
            }
            if name.starts_with(TEMP_PREFIX) {
                continue;
            }
            let path = if prefix.is_empty() {
                name.clone()
            } else {
                format!("{prefix}/{name}")
            };
            let Ok(stat) = fs::statat(fd, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) else {
                continue;
            };
            match FileType::from_raw_mode(stat.st_mode) {
                FileType::RegularFile => self.file(fd, &name, &path, &stat),
                FileType::Directory if depth < MAX_WALK_DEPTH => {
                    if let Ok(sub) = open_dir_nofollow(fd, &name) {
                        self.dir(sub.as_fd(), &path, depth + 1);
                    }
                }
                // Links are not followed, and not removed: they are not the index's.
                _ => {}
            }
        }
    }

    /// The regular file `name` in `dir`, which is `path`, as `stat` saw it.
    fn file(&mut self, dir: BorrowedFd<'_>, name: &str, path: &str, stat: &fs::Stat) {
        if self.wanted.contains_key(path) {
            return;
        }
        let seen = Identity::of(stat);
        let mut known = known::lock();
        if known.newer_than(&seen, self.start) {
            return;
        }
        // Still the file we judged: not replaced by a commit meanwhile.
        let same = fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|s| Identity::of(&s) == seen);
        if !same {
            return;
        }
        match fs::unlinkat(dir, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => known.forget(&seen),
            Err(e) => {
                tracing::warn!(path, error = %e, "cannot remove a stale copy of a shared file")
            }
        }
    }
}

/// The UTF-8 names in `dir` (others cannot be in the index), without `.` and `..`.
fn names(dir: BorrowedFd<'_>) -> Result<Vec<String>, Errno> {
    let mut listing = Dir::read_from(dir)?;
    let mut out = Vec::new();
    while let Some(entry) = listing.read() {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        if let Ok(name) = std::str::from_utf8(name) {
            out.push(name.to_owned());
        }
    }
    Ok(out)
}

/// Whether the regular file `name` in `dir`, seen as `id`, has the row's content. A match
/// is recorded, so the file is not hashed again while it stays the same.
fn same_content(dir: &OwnedFd, name: &str, id: &Identity, remote: &Remote) -> bool {
    let flags =
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    let Ok(fd) = fs::openat(dir, name, flags, Mode::empty()) else {
        return false;
    };
    let opened = |fd: &OwnedFd| fs::fstat(fd).ok().map(|s| Identity::of(&s));
    if opened(&fd).as_ref() != Some(id) {
        return false;
    }
    #[cfg(test)]
    tests::HASHED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let mut file = File::from(fd);
    let mut sink = Verify::new(std::io::sink(), remote.bytes);
    if std::io::copy(
        &mut (&mut file).take(remote.bytes.saturating_add(1)),
        &mut sink,
    )
    .is_err()
    {
        return false;
    }
    let (bytes, sha256) = sink.finish();
    if bytes != remote.bytes || sha256 != remote.sha256 {
        return false;
    }
    let mut known = known::lock();
    // Unchanged while it was read: the hash is of this identity's content.
    if opened(&OwnedFd::from(file)).as_ref() != Some(id) {
        return false;
    }
    known.record(*id, remote.version.clone());
    true
}

/// Opens each directory of `parent` (normalised) beneath `root` without following a link
/// or creating anything; `None` if one is missing, a link or not a directory.
fn open_dirs_nofollow(root: BorrowedFd<'_>, parent: &str) -> Option<OwnedFd> {
    let mut dir = fs::openat(
        root,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    for name in parent.split('/').filter(|n| !n.is_empty()) {
        dir = open_dir_nofollow(dir.as_fd(), name).ok()?;
    }
    Some(dir)
}

fn open_dir_nofollow(dir: BorrowedFd<'_>, name: &str) -> Result<OwnedFd, Errno> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    fs::openat(dir, name, flags, Mode::empty())
}

/// Removes the directory `name` in `dir` if it holds nothing but empty directories; true
/// if it is gone.
fn remove_empty_tree(dir: BorrowedFd<'_>, name: &str, depth: usize) -> bool {
    if depth > MAX_WALK_DEPTH {
        return false;
    }
    let Ok(sub) = open_dir_nofollow(dir, name) else {
        return false;
    };
    let Ok(children) = names(sub.as_fd()) else {
        return false;
    };
    for child in children {
        let is_dir = fs::statat(&sub, child.as_str(), AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|s| FileType::from_raw_mode(s.st_mode) == FileType::Directory);
        if !is_dir || !remove_empty_tree(sub.as_fd(), &child, depth + 1) {
            return false;
        }
    }
    // `AT_REMOVEDIR` removes only an empty directory, whatever happened meanwhile.
    matches!(
        fs::unlinkat(dir, name, AtFlags::REMOVEDIR),
        Ok(()) | Err(Errno::NOENT)
    )
}

/// A fetched file's temporary name, removed unless it was renamed into place.
struct Fetched<'a> {
    dir: BorrowedFd<'a>,
    name: String,
    file: File,
    placed: bool,
}

impl Drop for Fetched<'_> {
    fn drop(&mut self) {
        if !self.placed {
            // Best effort: an error here leaves a `.dataref-tmp-*` file, which every walk
            // skips.
            let _ = fs::unlinkat(self.dir, self.name.as_str(), AtFlags::empty());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    use sha2::{Digest, Sha256};

    use super::*;
    use crate::Overwrite;

    /// Calls of `same_content` that got as far as reading the file.
    pub(super) static HASHED: AtomicUsize = AtomicUsize::new(0);

    /// The smallest mirror: enough to tell a hash from a fetch from nothing.
    #[derive(Debug, Default)]
    struct One {
        rows: Mutex<HashMap<String, (Remote, Vec<u8>)>>,
        fetches: AtomicUsize,
    }

    impl Mirror for One {
        fn publish(
            &self,
            path: &str,
            file: &mut File,
            bytes: u64,
            sha256: [u8; 32],
            _overwrite: Overwrite,
        ) -> Result<Remote, MirrorError> {
            let mut content = Vec::new();
            file.read_to_end(&mut content)?;
            let mut rows = self.rows.lock().unwrap();
            let remote = Remote {
                path: path.into(),
                version: format!("{path}@{}", rows.len() + 1),
                sha256,
                bytes,
                modified: Timestamp(1_000),
            };
            rows.insert(path.into(), (remote.clone(), content));
            Ok(remote)
        }

        fn list(&self, under: &str) -> Result<Vec<Remote>, MirrorError> {
            let rows = self.rows.lock().unwrap();
            Ok(rows
                .values()
                .map(|(r, _)| r.clone())
                .filter(|r| under.is_empty() || r.path == under)
                .collect())
        }

        fn fetch(&self, remote: &Remote, sink: &mut dyn Write) -> Result<(), MirrorError> {
            self.fetches.fetch_add(1, Ordering::SeqCst);
            let rows = self.rows.lock().unwrap();
            sink.write_all(&rows[&remote.path].1)?;
            Ok(())
        }

        fn remove(&self, _remote: &Remote) -> Result<bool, MirrorError> {
            Ok(false)
        }
    }

    #[test]
    #[expect(
        clippy::disallowed_methods,
        reason = "the fixture writes a copy directly"
    )]
    fn a_known_copy_is_neither_fetched_nor_hashed_again() {
        let mirror = Arc::new(One::default());
        let dirs = [(); 3].map(|()| tempfile::tempdir().unwrap());
        let [a, b, c] = dirs.each_ref().map(|d| {
            Workspace::open(d.path())
                .unwrap()
                .with_mirror(mirror.clone())
        });
        a.write_atomic("known-copy.txt", b"content", Overwrite::Refuse)
            .unwrap();
        let hashed = || HASHED.load(Ordering::SeqCst);
        let before = hashed();
        for _ in 0..3 {
            a.resolve("known-copy.txt").unwrap();
            b.resolve("known-copy.txt").unwrap();
        }
        assert_eq!(mirror.fetches.load(Ordering::SeqCst), 1);
        assert_eq!(
            hashed(),
            before,
            "the writer and the fetcher know their copies"
        );

        // As after a restart: a copy this process has not seen is hashed once.
        std::fs::write(dirs[2].path().join("known-copy.txt"), "content").unwrap();
        for _ in 0..3 {
            c.resolve("known-copy.txt").unwrap();
        }
        assert_eq!(mirror.fetches.load(Ordering::SeqCst), 1);
        assert_eq!(hashed(), before + 1);
        assert_eq!(
            Sha256::digest(std::fs::read(dirs[2].path().join("known-copy.txt")).unwrap())[..],
            mirror.rows.lock().unwrap()["known-copy.txt"].0.sha256[..]
        );
    }
}
