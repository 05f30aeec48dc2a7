use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use dataref_protocol::{Principal, Timestamp};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{self, Mode, OFlags};
use rustix::io::Errno;

use crate::beneath::{self, Want, io_error, kind_of, open_error};
use crate::error::{WorkspaceError, WorkspacePathError, shown};
use crate::mirror::Mirror;
use crate::path::{Synced, normalize};
use crate::quota::Quota;
use crate::{EntryKind, Metadata, WorkspacePath};

/// How paths are opened beneath the root. Both ways give the same answers; the choice only
/// exists because `openat2` is Linux 5.6+ and some seccomp filters hide it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OpenMethod {
    /// `openat2` with `RESOLVE_BENEATH`, falling back to the walk (for good) the first time
    /// the kernel answers `ENOSYS` (or `EPERM`, which some seccomp filters give instead).
    #[default]
    Auto,
    /// Always `openat2`; `ENOSYS` is an error. For tests.
    Openat2,
    /// Always the component-wise `O_NOFOLLOW` walk from the root fd.
    NoFollowWalk,
}

/// One workspace: an open directory fd of its root, and every operation relative to it.
///
/// Holding the fd (not a path string) means renaming or replacing the root's path later
/// changes nothing for this value, and no operation ever builds an absolute host path.
#[derive(Debug)]
pub struct Workspace {
    /// `O_RDONLY | O_DIRECTORY`, so it serves as the base of every `*at` call and can also
    /// be read, `fsync`ed and `fchmod`ed.
    root: OwnedFd,
    /// Only for [`Workspace::host_path_for_logging`]; never used to open anything.
    host_path: PathBuf,
    method: OpenMethod,
    openat2_missing: AtomicBool,
    /// Bytes the workspace may hold; every write through [`AtomicFile`](crate::AtomicFile)
    /// is counted against it. `None`: unbounded.
    quota: Option<Quota>,
    /// The shared truth this directory is a cache of; `None`: the directory is the truth.
    mirror: Option<Arc<dyn Mirror>>,
    /// Unique in the process: tells the paths this value synced from other workspaces'.
    id: u64,
}

impl Workspace {
    /// The workspace of `principal` under the data directory: `<home>/workspaces/<principal>`,
    /// created with mode 0700 if missing (and tightened to 0700 if it is wider).
    ///
    /// The principal's directory itself must not be a symbolic link: it is ours to create.
    pub fn for_principal(home: &Path, principal: &Principal) -> Result<Self, WorkspaceError> {
        let parent_path = home.join("workspaces");
        let path = parent_path.join(principal.as_str());
        // A missing data dir is made 0711: the sandbox's uid must be able to pass through
        // it to its job directories, but nobody else may list it. Its parents are made as
        // `mkdir -p` would. `workspaces/` is 0700 like each principal's directory.
        let made = create_dir_all(home, Mode::from_raw_mode(0o711))
            .and_then(|()| create_dir_all(&parent_path, Mode::RWXU));
        made.map_err(|e| WorkspaceError::Create {
            path: parent_path.clone(),
            source: e.into(),
        })?;
        let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let parent = fs::openat(fs::CWD, &parent_path, dir_flags, Mode::empty()).map_err(|e| {
            WorkspaceError::Open {
                path: parent_path.clone(),
                source: e.into(),
            }
        })?;
        match fs::mkdirat(&parent, principal.as_str(), Mode::RWXU) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => {
                return Err(WorkspaceError::Create {
                    path,
                    source: e.into(),
                });
            }
        }
        let root = fs::openat(
            &parent,
            principal.as_str(),
            dir_flags | OFlags::NOFOLLOW,
            Mode::empty(),
        )
        .map_err(|e| WorkspaceError::Open {
            path: path.clone(),
            source: e.into(),
        })?;
        let open_error = |e: Errno| WorkspaceError::Open {
            path: path.clone(),
            source: e.into(),
        };
        let stat = fs::fstat(&root).map_err(open_error)?;
        if stat.st_mode & 0o077 != 0 {
            fs::fchmod(&root, Mode::RWXU).map_err(open_error)?;
        }
        Ok(Self::from_fd(root, path))
    }

    /// An explicitly given workspace directory (`dataref serve --workspace DIR`). It must
    /// exist; links in `dir` are followed, since the operator chose it.
    pub fn open(dir: &Path) -> Result<Self, WorkspaceError> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let root =
            fs::openat(fs::CWD, dir, flags, Mode::empty()).map_err(|e| WorkspaceError::Open {
                path: dir.to_owned(),
                source: e.into(),
            })?;
        Ok(Self::from_fd(root, dir.to_owned()))
    }

    fn from_fd(root: OwnedFd, host_path: PathBuf) -> Self {
        Self {
            root,
            host_path,
            method: OpenMethod::default(),
            openat2_missing: AtomicBool::new(false),
            quota: None,
            mirror: None,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Bounds the bytes of files the workspace holds: a write that would go past `bytes`
    /// fails with [`WorkspacePathError::QuotaExceeded`] before any of it reaches the disk
    /// (see the `quota` module). Every `Workspace` of the same directory in this process
    /// shares one count. Fails only if the root cannot be `fstat`ed.
    pub fn with_quota(mut self, bytes: u64) -> Result<Self, WorkspaceError> {
        let quota =
            Quota::new(self.root.as_fd(), bytes).map_err(|source| WorkspaceError::Open {
                path: self.host_path.clone(),
                source,
            })?;
        self.quota = Some(quota);
        Ok(self)
    }

    /// The quota set with [`Workspace::with_quota`].
    pub fn quota_bytes(&self) -> Option<u64> {
        self.quota.as_ref().map(Quota::limit)
    }

    pub(crate) fn quota(&self) -> Option<&Quota> {
        self.quota.as_ref()
    }

    /// Makes the directory a cache of `mirror`, the workspace's shared truth (see the
    /// `mirror` module): commits publish to it before they rename, and resolving and
    /// listing bring what they name up to date with it first. The local quota stays as it
    /// is; the mirror's own (shared) quota refuses with the same error.
    #[must_use]
    pub fn with_mirror(mut self, mirror: Arc<dyn Mirror>) -> Self {
        self.mirror = Some(mirror);
        self
    }

    pub(crate) fn mirror(&self) -> Option<&Arc<dyn Mirror>> {
        self.mirror.as_ref()
    }

    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Chooses how paths are opened (tests use this to run both ways).
    #[must_use]
    pub fn with_open_method(mut self, method: OpenMethod) -> Self {
        self.method = method;
        self
    }

    /// The root's host path as given when the workspace was opened, for logs and operator
    /// messages only. Never show it to the model; never open anything through it.
    pub fn host_path_for_logging(&self) -> &Path {
        &self.host_path
    }

    /// The workspace root itself, for listing.
    pub fn root_path(&self) -> WorkspacePath {
        WorkspacePath::root()
    }

    /// Resolves a path requested by the model: relative POSIX path, no `..`, every link
    /// followed only while it stays inside, and the target must exist. The empty path (and
    /// `.`) is the root, which only directory operations accept.
    ///
    /// Links with absolute targets are refused ([`Escape::AbsoluteTarget`]), even ones
    /// that point back inside.
    ///
    /// With a mirror ([`Workspace::with_mirror`]) the path (a file, or a directory with
    /// everything beneath it) is first brought up to date with the shared index. A
    /// directory's files that cannot be fetched are left out (logged); the path of such a
    /// file, resolved itself, fails with the reason. [`Workspace::list_dir`] and
    /// [`Workspace::list_tree`] of the returned path within a second do not sync again.
    ///
    /// [`Escape::AbsoluteTarget`]: crate::Escape::AbsoluteTarget
    pub fn resolve(&self, requested: &str) -> Result<WorkspacePath, WorkspacePathError> {
        self.resolve_bytes(requested.as_bytes())
    }

    /// [`Workspace::resolve`] for bytes that may not be UTF-8 (which are refused).
    pub fn resolve_bytes(&self, requested: &[u8]) -> Result<WorkspacePath, WorkspacePathError> {
        let rel = normalize(requested)?;
        self.sync(&rel, "read", &shown(requested))?;
        let synced = self.mirror.is_some().then(|| Synced {
            workspace: self.id,
            at: Instant::now(),
        });
        // The walk (not `openat2`) even where `openat2` exists: it can say which link left
        // the workspace and whether its target was absolute. Each later open checks again.
        beneath::walk(self.root.as_fd(), &rel, &shown(requested))?;
        Ok(WorkspacePath::synced(rel, synced))
    }

    /// Opens a regular file for reading. The type and link count are checked with `fstat` on
    /// the opened fd, never by a second lookup.
    pub fn open_read(&self, path: &WorkspacePath) -> Result<File, WorkspacePathError> {
        let fd = self.open_beneath(path, Want::ReadFile)?;
        let stat = fs::fstat(&fd).map_err(|e| io_error("inspect", path.as_str(), e))?;
        let kind = kind_of(stat.st_mode);
        if kind != EntryKind::File {
            return Err(WorkspacePathError::NotAFile {
                path: path.as_str().to_owned(),
                found: kind,
            });
        }
        let links = stat_u64(stat.st_nlink);
        if links > 1 {
            return Err(WorkspacePathError::HardLinked {
                path: path.as_str().to_owned(),
                links,
            });
        }
        let flags = fs::fcntl_getfl(&fd).map_err(|e| io_error("open", path.as_str(), e))?;
        fs::fcntl_setfl(&fd, flags - OFlags::NONBLOCK)
            .map_err(|e| io_error("open", path.as_str(), e))?;
        Ok(File::from(fd))
    }

    /// Kind, size and modification time of what `path` names (links followed, inside only).
    pub fn metadata(&self, path: &WorkspacePath) -> Result<Metadata, WorkspacePathError> {
        let fd = self.open_beneath(path, Want::Path)?;
        let stat = fs::fstat(&fd).map_err(|e| io_error("inspect", path.as_str(), e))?;
        Ok(metadata_of(&stat))
    }

    pub(crate) fn root_fd(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// Opens `path` beneath the root by the chosen method.
    pub(crate) fn open_beneath(
        &self,
        path: &WorkspacePath,
        want: Want,
    ) -> Result<OwnedFd, WorkspacePathError> {
        let rel = path.rel_for_open();
        if self.use_openat2() {
            match beneath::openat2_beneath(self.root.as_fd(), rel, want) {
                Ok(fd) => return Ok(fd),
                // `ENOSYS`: kernel before 5.6. `EPERM`: seccomp filters that predate
                // `openat2` (older container runtimes) answer that for unknown calls. The
                // walk is as safe, only slower, so switching for good costs nothing.
                Err(Errno::NOSYS | Errno::PERM) if self.method == OpenMethod::Auto => {
                    self.openat2_missing.store(true, Ordering::Relaxed);
                }
                Err(Errno::XDEV) => {
                    // Say which link left, if the walk still sees it; otherwise the generic
                    // refusal (the tree changed back meanwhile).
                    beneath::walk(self.root.as_fd(), rel, path.as_str())?;
                    return Err(open_error(Errno::XDEV, path.as_str()));
                }
                Err(e) => return Err(open_error(e, path.as_str())),
            }
        }
        beneath::open_walk(self.root.as_fd(), rel, path.as_str(), want)
    }

    fn use_openat2(&self) -> bool {
        match self.method {
            OpenMethod::Auto => !self.openat2_missing.load(Ordering::Relaxed),
            OpenMethod::Openat2 => true,
            OpenMethod::NoFollowWalk => false,
        }
    }
}

/// The next [`Workspace::id`].
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// The mode a missing parent of the data directory is created with, before the umask.
const DATA_DIR_MODE: Mode = Mode::from_raw_mode(0o755);

/// `mkdir -p` with `mode` for what it creates; an existing directory is fine.
fn create_dir_all(path: &Path, mode: Mode) -> Result<(), Errno> {
    match fs::mkdirat(fs::CWD, path, mode) {
        Ok(()) | Err(Errno::EXIST) => Ok(()),
        Err(Errno::NOENT) => {
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                create_dir_all(parent, DATA_DIR_MODE)?;
            }
            match fs::mkdirat(fs::CWD, path, mode) {
                Ok(()) | Err(Errno::EXIST) => Ok(()),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

pub(crate) fn metadata_of(stat: &fs::Stat) -> Metadata {
    Metadata {
        kind: kind_of(stat.st_mode),
        size: stat_u64(stat.st_size),
        modified: Timestamp(stat_i64(stat.st_mtime)),
    }
}

/// `stat` field types differ between targets (`st_nlink` is `u32` on some, `u64` on
/// others); a generic conversion keeps one spelling for all of them.
/// Negative values (impossible for the fields this is used on) become 0.
pub(crate) fn stat_u64<T: TryInto<u64>>(value: T) -> u64 {
    value.try_into().unwrap_or(0)
}

pub(crate) fn stat_i64<T: TryInto<i64>>(value: T) -> i64 {
    value.try_into().unwrap_or(i64::MAX)
}
