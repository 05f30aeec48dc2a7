use std::fs::File;
use std::io::{self, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{self, AtFlags, FileType, Mode, OFlags, RenameFlags};
use rustix::io::Errno;

use crate::beneath::io_error;
use crate::error::{WorkspacePathError, shown};
use crate::mirror::known::{self, Identity};
use crate::mirror::{Mirror, hash_file, set_modified};
use crate::path::{normalize, split_last};
use crate::quota::Budget;
use crate::{EntryKind, Workspace, WorkspacePath};

/// Whether a write may replace an existing file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overwrite {
    /// Fail with [`WorkspacePathError::AlreadyExists`]; checked atomically by the final
    /// rename (`RENAME_NOREPLACE`), so two writers cannot both win.
    Refuse,
    /// Replace a file (or a link: the link itself is replaced, nothing is written through
    /// it). A directory is never replaced.
    Replace,
}

/// Prefix of temporary files, so sweeping and people can tell them apart.
pub const TEMP_PREFIX: &str = ".dataref-tmp-";

/// Mode of files and directories this crate creates: only the owner's business.
const FILE_MODE: Mode = Mode::RUSR.union(Mode::WUSR);
const DIR_MODE: Mode = Mode::RWXU;

/// A file being written: a temporary file in the destination's directory, moved into place
/// by [`AtomicFile::commit`]. Readers see the old file or the whole new one, never a part.
/// Dropping it without committing removes the temporary file.
#[derive(Debug)]
pub struct AtomicFile {
    file: File,
    /// The destination's directory, held open: the rename happens there whatever happens
    /// to its path meanwhile.
    dir: OwnedFd,
    temp_name: String,
    name: String,
    path: WorkspacePath,
    overwrite: Overwrite,
    /// The temporary name no longer exists (renamed into place).
    committed: bool,
    /// This file's share of the workspace quota, if there is one.
    budget: Option<Budget>,
    /// The quota refused a write to this file: kept here so a caller whose writer (an
    /// XLSX or Parquet encoder) wraps the I/O error into its own can still tell.
    refused: Option<crate::QuotaRefusal>,
    /// The workspace's shared truth: the commit publishes there before the rename.
    mirror: Option<Arc<dyn Mirror>>,
}

impl AtomicFile {
    /// Where the file will be once committed.
    pub fn path(&self) -> &WorkspacePath {
        &self.path
    }

    /// Why the workspace quota refused a write to this file, if it did.
    pub fn quota_refusal(&self) -> Option<&crate::QuotaRefusal> {
        self.refused.as_ref()
    }

    /// Flushes the data to disk, moves the file into place and syncs the directory, so
    /// after `Ok` the file survives a crash with all its content.
    pub fn commit(mut self) -> Result<WorkspacePath, WorkspacePathError> {
        self.finish(true)
    }

    /// Commits like [`commit`](Self::commit); when the name was taken meanwhile under
    /// [`Overwrite::Refuse`] (another writer chose the same free name in the same instant),
    /// under the next name `next` gives, in the same directory, until it gives none. So
    /// numbered files (`qoq.csv`, `qoq-2.csv`, …) all land, however many race for one name.
    pub fn commit_renumbered(
        mut self,
        mut next: impl FnMut() -> Option<String>,
    ) -> Result<WorkspacePath, WorkspacePathError> {
        loop {
            match self.finish(true) {
                Err(WorkspacePathError::AlreadyExists { path })
                    if self.overwrite == Overwrite::Refuse =>
                {
                    let Some(name) = next() else {
                        return Err(WorkspacePathError::AlreadyExists { path });
                    };
                    self.rename_to(&name)?;
                }
                other => return other,
            }
        }
    }

    /// Aims the commit at `name` in the same directory.
    fn rename_to(&mut self, name: &str) -> Result<(), WorkspacePathError> {
        let rel = match self.path.as_str().rsplit_once('/') {
            Some((parent, _)) => format!("{parent}/{name}"),
            None => name.to_owned(),
        };
        let rel = normalize(rel.as_bytes())?;
        if split_last(&rel).1 != name {
            return Err(WorkspacePathError::NotAFile {
                path: shown(name.as_bytes()),
                found: EntryKind::Directory,
            });
        }
        self.name = name.to_owned();
        self.path = WorkspacePath::from_normalized(rel);
        Ok(())
    }

    /// Moves the file into place without waiting for the disk: readers still see the old
    /// file or the whole new one, but a crash may lose it. For files that are a cache of
    /// something else (spilled results), where a fsync would cost more than the file is
    /// worth.
    pub fn commit_unsynced(mut self) -> Result<WorkspacePath, WorkspacePathError> {
        self.finish(false)
    }

    fn finish(&mut self, sync: bool) -> Result<WorkspacePath, WorkspacePathError> {
        let shown = self.path.as_str().to_owned();
        if sync {
            self.file
                .sync_all()
                .map_err(|e| io_error("write", &shown, e))?;
        }
        if let Some(mirror) = self.mirror.clone() {
            return self.publish_and_place(mirror.as_ref(), sync, &shown);
        }
        let dir = self.dir.as_fd();
        let (temp, name) = (self.temp_name.as_str(), self.name.as_str());
        let moved = match self.overwrite {
            Overwrite::Replace => fs::renameat(dir, temp, dir, name),
            Overwrite::Refuse => {
                match fs::renameat_with(dir, temp, dir, name, RenameFlags::NOREPLACE) {
                    // File systems without `RENAME_NOREPLACE`: `link` also refuses an existing
                    // name atomically; then the temporary name is removed (by `Drop` if the
                    // explicit removal fails).
                    Err(Errno::INVAL | Errno::NOSYS) => {
                        fs::linkat(dir, temp, dir, name, AtFlags::empty()).map(|()| {
                            let _ = fs::unlinkat(dir, temp, AtFlags::empty());
                        })
                    }
                    other => other,
                }
            }
        };
        match moved {
            Ok(()) => {
                self.committed = true;
                if let Some(budget) = self.budget.take() {
                    budget.committed();
                }
            }
            Err(Errno::EXIST | Errno::NOTEMPTY) if self.overwrite == Overwrite::Refuse => {
                return Err(WorkspacePathError::AlreadyExists { path: shown });
            }
            Err(Errno::ISDIR | Errno::NOTEMPTY | Errno::EXIST) => {
                return Err(WorkspacePathError::NotAFile {
                    path: shown,
                    found: EntryKind::Directory,
                });
            }
            Err(e) => return Err(io_error("move into place", &shown, e)),
        }
        if sync {
            fs::fsync(dir).map_err(|e| io_error("sync the directory of", &shown, e))?;
        }
        Ok(self.path.clone())
    }

    /// The commit with a mirror: the shared index is the truth, so the file is published
    /// first (which decides [`Overwrite::Refuse`] for every replica) and only then renamed
    /// into place here. A refused or failed publish changes nothing locally; the temporary
    /// file goes with `self`.
    fn publish_and_place(
        &mut self,
        mirror: &dyn Mirror,
        sync: bool,
        shown: &str,
    ) -> Result<WorkspacePath, WorkspacePathError> {
        let (bytes, sha256) =
            hash_file(&mut self.file).map_err(|e| io_error("read back", shown, e))?;
        let remote = mirror
            .publish(
                self.path.as_str(),
                &mut self.file,
                bytes,
                sha256,
                self.overwrite,
            )
            .map_err(|e| e.into_path_error("saved", shown))?;
        set_modified(&self.file, remote.modified, shown);
        let dir = self.dir.as_fd();
        let (temp, name) = (self.temp_name.as_str(), self.name.as_str());
        // Renamed and recorded under the lock, so no sync working from an older listing
        // can put the previous version back over it.
        let mut known = known::lock();
        // Always replacing: the index has decided, and a local file under the name is a
        // stale copy. Only a directory (made meanwhile) can stop it; the shared file then
        // stays, and this replica's next sync reports the conflict.
        match fs::renameat(dir, temp, dir, name) {
            Ok(()) => {
                self.committed = true;
                if let Some(budget) = self.budget.take() {
                    budget.committed();
                }
            }
            Err(Errno::ISDIR | Errno::NOTEMPTY | Errno::EXIST) => {
                return Err(WorkspacePathError::NotAFile {
                    path: shown.to_owned(),
                    found: EntryKind::Directory,
                });
            }
            Err(e) => return Err(io_error("move into place", shown, e)),
        }
        if let Ok(stat) = fs::fstat(&self.file) {
            known.record(Identity::of(&stat), remote.version);
        }
        drop(known);
        if sync {
            fs::fsync(dir).map_err(|e| io_error("sync the directory of", shown, e))?;
        }
        Ok(self.path.clone())
    }
}

impl Write for AtomicFile {
    /// Refused (with a [`QuotaRefusal`](crate::QuotaRefusal) inside the error) when the
    /// bytes would take the workspace over its quota; nothing of `buf` is written then.
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let Some(budget) = &mut self.budget else {
            return self.file.write(buf);
        };
        budget
            .take(buf.len())
            .inspect_err(|e| remember(&mut self.refused, e))?;
        let written = self.file.write(buf);
        budget.give_back(buf.len() - written.as_ref().map_or(0, |n| *n));
        written
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let Some(budget) = &mut self.budget else {
            return self.file.write_vectored(bufs);
        };
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        budget
            .take(len)
            .inspect_err(|e| remember(&mut self.refused, e))?;
        let written = self.file.write_vectored(bufs);
        budget.give_back(len - written.as_ref().map_or(0, |n| *n));
        written
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

/// Keeps the first quota refusal inside `e`.
fn remember(refused: &mut Option<crate::QuotaRefusal>, e: &io::Error) {
    if refused.is_none() {
        *refused = crate::QuotaRefusal::of(e).cloned();
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if !self.committed {
            // Best effort: an error here leaves a `.dataref-tmp-*` file for sweeping.
            let _ = fs::unlinkat(&self.dir, self.temp_name.as_str(), AtFlags::empty());
        }
    }
}

impl Workspace {
    /// Writes `bytes` to `requested` atomically (see [`Workspace::create_atomic`]).
    pub fn write_atomic(
        &self,
        requested: &str,
        bytes: &[u8],
        overwrite: Overwrite,
    ) -> Result<WorkspacePath, WorkspacePathError> {
        let mut file = self.create_atomic(requested, overwrite)?;
        file.write_all(bytes)
            .map_err(|e| io_error("write", requested, e))?;
        file.commit()
    }

    /// Starts an atomic write of `requested`: checks the path like
    /// [`Workspace::resolve`], creates missing parent directories beneath the root one at a
    /// time (mode 0700), and opens a temporary file (mode 0600) next to the destination.
    ///
    /// Stricter than reading: every existing parent component must be a real directory;
    /// a symbolic link there is refused ([`WorkspacePathError::LinkInWritePath`]), even one
    /// that stays inside.
    ///
    /// With a mirror and [`Overwrite::Refuse`], a name the shared index has is refused here
    /// already (the commit's publish decides in the end).
    pub fn create_atomic(
        &self,
        requested: &str,
        overwrite: Overwrite,
    ) -> Result<AtomicFile, WorkspacePathError> {
        let rel = normalize(requested.as_bytes())?;
        let shown = shown(requested.as_bytes());
        if rel.is_empty() {
            return Err(WorkspacePathError::NotAFile {
                path: ".".into(),
                found: EntryKind::Directory,
            });
        }
        if overwrite == Overwrite::Refuse {
            // Callers try names until one is free (exports, spill files): the early answer
            // must be the shared index's, not a stale copy's.
            self.check_free(&rel, &shown)?;
        }
        let (parent, name) = split_last(&rel);
        let dir = self.make_dirs(parent, &shown)?;
        // Early answers, so a large write is not made only to be refused; the rename decides.
        let mut replaced = 0;
        match fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) if FileType::from_raw_mode(stat.st_mode) == FileType::Directory => {
                return Err(WorkspacePathError::NotAFile {
                    path: shown,
                    found: EntryKind::Directory,
                });
            }
            Ok(_) if overwrite == Overwrite::Refuse => {
                return Err(WorkspacePathError::AlreadyExists { path: shown });
            }
            Ok(stat) => {
                if FileType::from_raw_mode(stat.st_mode) == FileType::RegularFile {
                    replaced = u64::try_from(stat.st_size).unwrap_or(0);
                }
            }
            Err(Errno::NOENT) => {}
            Err(e) => return Err(io_error("inspect", &shown, e)),
        }
        // Read back for hashing and publishing when there is a mirror.
        let (file, temp_name) = create_temp(&dir, &shown, self.mirror().is_some())?;
        Ok(AtomicFile {
            file,
            dir,
            temp_name,
            name: name.to_owned(),
            path: WorkspacePath::from_normalized(rel.clone()),
            overwrite,
            committed: false,
            budget: self.quota().map(|q| q.budget(self.root_fd(), replaced)),
            refused: None,
            mirror: self.mirror().cloned(),
        })
    }

    /// Copies the regular file `src` to `dst` atomically. `src` is opened like
    /// [`Workspace::open_read`] (so hard-linked files are refused) and `dst` is written like
    /// [`Workspace::create_atomic`].
    pub fn copy(
        &self,
        src: &WorkspacePath,
        dst: &str,
        overwrite: Overwrite,
    ) -> Result<WorkspacePath, WorkspacePathError> {
        let mut from = self.open_read(src)?;
        let mut to = self.create_atomic(dst, overwrite)?;
        io::copy(&mut from, &mut to).map_err(|e| io_error("copy to", to.path().as_str(), e))?;
        to.commit()
    }

    /// Opens (creating where missing) each directory of `parent` beneath the root without
    /// following any link; returns the last one, open for reading so it can be synced.
    pub(crate) fn make_dirs(
        &self,
        parent: &str,
        shown: &str,
    ) -> Result<OwnedFd, WorkspacePathError> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let mut dir = fs::openat(self.root_fd(), ".", flags, Mode::empty())
            .map_err(|e| io_error("open", ".", e))?;
        let mut so_far = String::new();
        for name in parent.split('/').filter(|n| !n.is_empty()) {
            if !so_far.is_empty() {
                so_far.push('/');
            }
            so_far.push_str(name);
            dir = open_or_make_dir(&dir, name, shown, &so_far)?;
        }
        Ok(dir)
    }
}

/// Opens the directory `name` in `dir`, creating it if missing, never through a link.
fn open_or_make_dir(
    dir: &OwnedFd,
    name: &str,
    shown: &str,
    so_far: &str,
) -> Result<OwnedFd, WorkspacePathError> {
    // Retries only when the entry changed between two looks (a link became a directory).
    for _ in 0..8 {
        match open_dir_nofollow(dir, name) {
            Ok(fd) => return Ok(fd),
            Err(Errno::NOENT) => match fs::mkdirat(dir, name, DIR_MODE) {
                // The new name must be durable before anything is renamed under it.
                Ok(()) => fs::fsync(dir).map_err(|e| io_error("create", so_far, e))?,
                Err(Errno::EXIST) => {}
                Err(e) => return Err(io_error("create the directory", so_far, e)),
            },
            Err(Errno::NOTDIR | Errno::LOOP) => {
                match fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
                    .map(|s| FileType::from_raw_mode(s.st_mode))
                {
                    Ok(FileType::Symlink) => {
                        return Err(WorkspacePathError::LinkInWritePath {
                            path: shown.to_owned(),
                            link: so_far.to_owned(),
                        });
                    }
                    Ok(FileType::Directory) | Err(Errno::NOENT) => {}
                    Ok(_) => {
                        return Err(WorkspacePathError::NotADirectory {
                            path: shown.to_owned(),
                        });
                    }
                    Err(e) => return Err(io_error("inspect", so_far, e)),
                }
            }
            Err(e) => return Err(io_error("open the directory", so_far, e)),
        }
    }
    Err(io_error("open the directory", so_far, Errno::AGAIN))
}

fn open_dir_nofollow(dir: &OwnedFd, name: &str) -> Result<OwnedFd, Errno> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    fs::openat(dir, name, flags, Mode::empty())
}

/// Creates a new temporary file in `dir` with `O_EXCL`, so an existing name (or a link
/// planted under it) is never opened; `readable` opens it for reading as well.
pub(crate) fn create_temp(
    dir: &OwnedFd,
    shown: &str,
    readable: bool,
) -> Result<(File, String), WorkspacePathError> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let access = if readable {
        OFlags::RDWR
    } else {
        OFlags::WRONLY
    };
    let flags = access | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut last = Errno::EXIST;
    for _ in 0..16 {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let name = format!(
            "{TEMP_PREFIX}{}-{}-{nanos:08x}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        match fs::openat(dir, name.as_str(), flags, FILE_MODE) {
            Ok(fd) => return Ok((File::from(fd), name)),
            Err(Errno::EXIST) => last = Errno::EXIST,
            Err(e) => return Err(io_error("create a temporary file for", shown, e)),
        }
    }
    Err(io_error("create a temporary file for", shown, last))
}
