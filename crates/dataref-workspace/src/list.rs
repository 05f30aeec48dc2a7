use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{self, AtFlags, Dir, Mode, OFlags};
use rustix::io::Errno;

use crate::beneath::{Want, io_error};
use crate::error::WorkspacePathError;
use crate::workspace::metadata_of;
use crate::{Entry, EntryKind, Listing, TreeOptions, Workspace, WorkspacePath};

/// Deepest a tree listing goes whatever the options say; each level holds an open fd.
const MAX_TREE_DEPTH: usize = 64;

impl Workspace {
    /// Lists the entries of one directory (the root: [`Workspace::root_path`]), sorted by
    /// name, at most `max_entries` of them. Links are reported as links, not followed.
    /// With a mirror, the directory's subtree is brought up to date with it first, unless
    /// `dir` was just resolved (so synced) by this workspace; files that cannot be fetched
    /// are left out (see [`Workspace::resolve`]).
    pub fn list_dir(
        &self,
        dir: &WorkspacePath,
        max_entries: usize,
    ) -> Result<Listing, WorkspacePathError> {
        self.sync_listed(dir)?;
        let fd = self.open_beneath(dir, Want::Directory)?;
        let (names, skipped_non_utf8) = read_names(&fd, dir.as_str())?;
        let mut listing = Listing {
            skipped_non_utf8,
            ..Listing::default()
        };
        for name in &names {
            if listing.entries.len() == max_entries {
                listing.truncated = true;
                break;
            }
            if let Some(entry) = stat_entry(fd.as_fd(), dir, name, &dir.join(name))? {
                listing.entries.push(entry);
            }
        }
        Ok(listing)
    }

    /// Lists a directory tree depth-first (names sorted within each directory), keeping
    /// the entries whose path relative to `dir` matches `options.glob`.
    ///
    /// Symlinked directories are never entered (they are listed as links), so the walk
    /// cannot leave the workspace or loop. Bounded by `max_entries`, `max_depth` (at most
    /// 64) and `max_scanned`; the flags on [`Listing`] say when a bound cut it short.
    /// With a mirror, the directory's subtree is brought up to date with it first, as for
    /// [`Workspace::list_dir`].
    pub fn list_tree(
        &self,
        dir: &WorkspacePath,
        options: &TreeOptions,
    ) -> Result<Listing, WorkspacePathError> {
        self.sync_listed(dir)?;
        let fd = self.open_beneath(dir, Want::Directory)?;
        let mut walk = TreeWalk {
            options,
            max_depth: options.max_depth.min(MAX_TREE_DEPTH),
            base: dir,
            listing: Listing::default(),
            scanned: 0,
            done: false,
        };
        walk.visit(&fd, "", 1)?;
        Ok(walk.listing)
    }
}

struct TreeWalk<'a> {
    options: &'a TreeOptions,
    max_depth: usize,
    base: &'a WorkspacePath,
    listing: Listing,
    scanned: usize,
    /// A bound was hit: stop everywhere.
    done: bool,
}

impl TreeWalk<'_> {
    /// Lists the directory `fd`, which is `prefix` below the listed directory, at `depth`.
    fn visit(
        &mut self,
        fd: &OwnedFd,
        prefix: &str,
        depth: usize,
    ) -> Result<(), WorkspacePathError> {
        let shown = if prefix.is_empty() {
            self.base.clone()
        } else {
            self.base.join(prefix)
        };
        let (names, skipped) = read_names(fd, shown.as_str())?;
        self.listing.skipped_non_utf8 += skipped;
        for name in &names {
            if self.done {
                return Ok(());
            }
            if self.scanned == self.options.max_scanned {
                self.listing.truncated = true;
                self.done = true;
                return Ok(());
            }
            self.scanned += 1;
            let rel = if prefix.is_empty() {
                name.clone()
            } else {
                format!("{prefix}/{name}")
            };
            let path = self.base.join(&rel);
            let Some(entry) = stat_entry(fd.as_fd(), &shown, name, &path)? else {
                continue;
            };
            let kind = entry.kind;
            if self.options.glob.as_ref().is_none_or(|g| g.matches(&rel)) {
                if self.listing.entries.len() == self.options.max_entries {
                    self.listing.truncated = true;
                    self.done = true;
                    return Ok(());
                }
                self.listing.entries.push(entry);
            }
            if kind != EntryKind::Directory {
                continue;
            }
            if depth >= self.max_depth {
                self.listing.depth_limited = true;
                continue;
            }
            // `O_NOFOLLOW`: if the directory was swapped for a link since the `stat`, the
            // open fails instead of following it.
            let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            match fs::openat(fd, name.as_str(), flags, Mode::empty()) {
                Ok(sub) => self.visit(&sub, &rel, depth + 1)?,
                Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => {}
                Err(e) => return Err(io_error("list", path.as_str(), e)),
            }
        }
        Ok(())
    }
}

/// The UTF-8 names in a directory, sorted, and how many others there were.
fn read_names(fd: &OwnedFd, shown: &str) -> Result<(Vec<String>, usize), WorkspacePathError> {
    let mut dir = Dir::read_from(fd).map_err(|e| io_error("list", shown, e))?;
    let mut names = Vec::new();
    let mut skipped = 0;
    while let Some(entry) = dir.read() {
        let entry = entry.map_err(|e| io_error("list", shown, e))?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        match std::str::from_utf8(name) {
            Ok(name) => names.push(name.to_owned()),
            Err(_) => skipped += 1,
        }
    }
    names.sort_unstable();
    Ok((names, skipped))
}

/// An entry's metadata without following it; `None` if it vanished since it was read.
fn stat_entry(
    dir: BorrowedFd<'_>,
    shown: &WorkspacePath,
    name: &str,
    path: &WorkspacePath,
) -> Result<Option<Entry>, WorkspacePathError> {
    match fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => {
            let meta = metadata_of(&stat);
            Ok(Some(Entry {
                path: path.clone(),
                kind: meta.kind,
                size: meta.size,
                modified: meta.modified,
            }))
        }
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(io_error("list", shown.as_str(), e)),
    }
}
