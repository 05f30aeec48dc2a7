//! Reading a tree that someone else wrote (the sandbox's `out/`, written by the model's
//! code), one name at a time from a directory fd, never following a link.
//!
//! [`Workspace`](crate::Workspace) resolves paths the model names and follows links that
//! stay inside. A tree written by hostile code needs less and must allow less: the caller
//! walks it entry by entry, so every open here is of one plain name (no `/`, no `.` or `..`)
//! in a directory we hold, with `O_NOFOLLOW`. Nothing is ever resolved through a link, so
//! no link, swapped in at any moment, can lead anywhere; the type and link count are read
//! with `fstat` on the opened fd, never by a second lookup. Listings are bounded by an
//! [`EntryBudget`] shared across a walk, and files by a byte cap.

use std::fs::File;
use std::io;
use std::path::Path;

use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{self, AtFlags, Dir, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::workspace::stat_u64;

/// What an entry is, as `lstat` or `fstat` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileKind {
    Regular,
    Directory,
    Symlink,
    Fifo,
    Socket,
    CharacterDevice,
    BlockDevice,
    Unknown,
}

impl FileKind {
    fn of(mode: u32) -> Self {
        match FileType::from_raw_mode(mode) {
            FileType::RegularFile => Self::Regular,
            FileType::Directory => Self::Directory,
            FileType::Symlink => Self::Symlink,
            FileType::Fifo => Self::Fifo,
            FileType::Socket => Self::Socket,
            FileType::CharacterDevice => Self::CharacterDevice,
            FileType::BlockDevice => Self::BlockDevice,
            FileType::Unknown => Self::Unknown,
        }
    }

    /// `a FIFO`, `a character device`, …: for messages.
    pub const fn description(self) -> &'static str {
        match self {
            Self::Regular => "a regular file",
            Self::Directory => "a directory",
            Self::Symlink => "a symbolic link",
            Self::Fifo => "a FIFO",
            Self::Socket => "a socket",
            Self::CharacterDevice => "a character device",
            Self::BlockDevice => "a block device",
            Self::Unknown => "an unknown kind of file",
        }
    }
}

/// Why an entry of an [`UntrustedDir`] was not opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// Not one plain name: empty, `.`, `..`, or holding `/` or NUL.
    #[error("not a single plain file name")]
    BadName,
    /// A symbolic link (`O_NOFOLLOW` refused it).
    #[error("a symbolic link")]
    Symlink,
    /// A directory was asked for and something else (a link included) is there.
    #[error("not a directory")]
    NotADirectory,
    /// A regular file was asked for and this is something else.
    #[error("not a regular file ({})", .0.description())]
    NotRegular(FileKind),
    /// A regular file with more than one name: another name may be outside.
    #[error("a hard link ({links} names)")]
    HardLinked { links: u64 },
    #[error("{bytes} bytes, over the {cap}-byte cap")]
    TooLarge { bytes: u64, cap: u64 },
    /// The system refused (missing, permissions, a socket's `ENXIO`, …).
    #[error(transparent)]
    Io(io::Error),
}

impl From<Errno> for Refusal {
    fn from(e: Errno) -> Self {
        match e {
            // One name opened with `O_NOFOLLOW`: `ELOOP` means it is a link.
            Errno::LOOP => Self::Symlink,
            Errno::NOTDIR => Self::NotADirectory,
            e => Self::Io(e.into()),
        }
    }
}

/// Directory entries a walk may look at in all, so that a million empty files cost little.
/// One budget is shared by every [`UntrustedDir::names`] of a walk.
#[derive(Debug, Clone)]
pub struct EntryBudget {
    left: usize,
}

impl EntryBudget {
    pub fn new(max_entries: usize) -> Self {
        Self { left: max_entries }
    }
}

/// The names of one directory, sorted (so what falls over a bound does not depend on the
/// file system's order), as bytes: a name that is not UTF-8 is still there to be reported.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Names {
    pub names: Vec<Vec<u8>>,
    /// The [`EntryBudget`] ran out in this directory: there were more.
    pub cut: bool,
}

/// A directory of a tree someone else wrote, held by fd. See the module docs.
#[derive(Debug)]
pub struct UntrustedDir {
    fd: OwnedFd,
}

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

impl UntrustedDir {
    /// Opens the directory at `path`. Its parents are ours and followed; the last component
    /// is not (a link there fails).
    pub fn open(path: &Path) -> io::Result<Self> {
        let fd = fs::openat(fs::CWD, path, DIR_FLAGS, Mode::empty())?;
        Ok(Self { fd })
    }

    /// A new fd of the directory `dir` (which the caller keeps), with its own read offset.
    pub fn reopen(dir: impl AsFd) -> io::Result<Self> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let fd = fs::openat(dir, ".", flags, Mode::empty())?;
        Ok(Self { fd })
    }

    /// The directory `name` in this one; a link or anything else there is refused.
    pub fn open_dir(&self, name: &str) -> Result<Self, Refusal> {
        check_name(name)?;
        let fd = fs::openat(&self.fd, name, DIR_FLAGS, Mode::empty())?;
        Ok(Self { fd })
    }

    /// The regular file `name` in this one and its size, if it has one name and at most
    /// `max_bytes`. `O_NONBLOCK` keeps a FIFO from hanging the open (cleared again on a
    /// regular file); the type, links and size are those of the opened fd.
    pub fn open_file(&self, name: &str, max_bytes: u64) -> Result<(File, u64), Refusal> {
        check_name(name)?;
        let flags =
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
        let fd = fs::openat(&self.fd, name, flags, Mode::empty())?;
        let stat = fs::fstat(&fd)?;
        match FileKind::of(stat.st_mode) {
            FileKind::Regular => {}
            other => return Err(Refusal::NotRegular(other)),
        }
        let links = stat_u64(stat.st_nlink);
        if links != 1 {
            return Err(Refusal::HardLinked { links });
        }
        let bytes = stat_u64(stat.st_size);
        if bytes > max_bytes {
            return Err(Refusal::TooLarge {
                bytes,
                cap: max_bytes,
            });
        }
        let flags = fs::fcntl_getfl(&fd)?;
        fs::fcntl_setfl(&fd, flags - OFlags::NONBLOCK)?;
        Ok((File::from(fd), bytes))
    }

    /// What `name` is, without following it. Only a hint for which open to try: the open
    /// checks again on its fd.
    pub fn kind(&self, name: &str) -> Result<FileKind, Refusal> {
        check_name(name)?;
        let stat = fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| Refusal::Io(e.into()))?;
        Ok(FileKind::of(stat.st_mode))
    }

    /// The entries' names (not `.` and `..`), each counted against `budget`; once it is
    /// spent the listing stops and says so. An error while reading ends the listing with
    /// what was read.
    pub fn names(&self, budget: &mut EntryBudget) -> io::Result<Names> {
        let mut dir = Dir::read_from(&self.fd)?;
        let mut listed = Names::default();
        while let Some(Ok(entry)) = dir.read() {
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            if budget.left == 0 {
                listed.cut = true;
                break;
            }
            budget.left -= 1;
            listed.names.push(name.to_vec());
        }
        listed.names.sort_unstable();
        Ok(listed)
    }
}

impl AsFd for UntrustedDir {
    fn as_fd(&self) -> rustix::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

fn check_name(name: &str) -> Result<(), Refusal> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
        return Err(Refusal::BadName);
    }
    Ok(())
}
