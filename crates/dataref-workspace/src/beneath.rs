//! Opening a relative path beneath a directory fd so that nothing outside can be reached,
//! even if the tree changes while we look: `openat2(RESOLVE_BENEATH)` where the kernel has
//! it (Linux 5.6+), otherwise a walk one component at a time with `O_NOFOLLOW`, following
//! relative links by hand and never climbing above the root.

use std::collections::VecDeque;
use std::io;

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{self, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::EntryKind;
use crate::error::{Escape, MAX_DEPTH, WorkspacePathError};

/// Links followed in one resolution before giving up, as the kernel does (`MAXSYMLINKS`).
pub(crate) const MAX_LINKS: usize = 40;

/// How often an open is retried when the tree changed under it (`EAGAIN` from `openat2`,
/// an entry that turned into a link between the walk and the open).
const RETRIES: usize = 8;

/// What is being opened; decides the open flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Want {
    /// A regular file for reading. `O_NONBLOCK` so that a FIFO cannot hang the open; the
    /// caller checks the type on the opened fd and clears the flag.
    ReadFile,
    /// A directory for listing.
    Directory,
    /// Anything, for `fstat` only (`O_PATH`: opens nothing's contents).
    Path,
}

impl Want {
    fn flags(self) -> OFlags {
        match self {
            Self::ReadFile => OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            Self::Directory => OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Self::Path => OFlags::PATH | OFlags::CLOEXEC,
        }
    }
}

/// `openat2(root, rel, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`. The kernel follows links
/// that stay beneath `root` and fails with `EXDEV` for any that would leave it (including
/// every absolute link), at the moment of the open: there is no gap to race.
pub(crate) fn openat2_beneath(
    root: BorrowedFd<'_>,
    rel: &str,
    want: Want,
) -> Result<OwnedFd, Errno> {
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
    let mut attempt = 0;
    loop {
        match fs::openat2(root, rel, want.flags(), Mode::empty(), resolve) {
            // A concurrent rename anywhere makes the kernel refuse rather than risk a wrong
            // `..`; trying again is what the man page asks for.
            Err(Errno::AGAIN) if attempt < RETRIES => attempt += 1,
            other => return other,
        }
    }
}

/// One name still to be looked up, and the link (index into `Walk::links`) it came from.
struct Part {
    name: Vec<u8>,
    link: Option<usize>,
}

/// What a walk ended on.
pub(crate) enum Leaf {
    /// A directory: the last of `Walked::dirs`, or the root when that is empty.
    Directory,
    /// Something else, named `name` in the last directory.
    Other { name: Vec<u8> },
}

/// The result of a walk: an `O_PATH` fd for every real directory passed through (so
/// `..` from a link pops to the directory we actually came from) and the leaf.
pub(crate) struct Walked {
    pub(crate) dirs: Vec<OwnedFd>,
    pub(crate) leaf: Leaf,
}

impl Walked {
    /// The directory holding the leaf (or the leaf itself when it is a directory).
    pub(crate) fn dir<'a>(&'a self, root: BorrowedFd<'a>) -> BorrowedFd<'a> {
        self.dirs.last().map_or(root, AsFd::as_fd)
    }
}

/// Resolves `rel` (already normalised, no `..`) beneath `root` one component at a time.
///
/// Every component is opened with `O_PATH | O_NOFOLLOW` relative to the fd of the
/// directory before it, so each lookup is one name in a directory we hold; a link is read
/// through its own fd and its target spliced in front of the rest. A `..` (only ever from a
/// link) pops back to the previous directory fd, and popping past the root is an escape.
/// Containment is therefore a property of the stack, not of any string.
pub(crate) fn walk(
    root: BorrowedFd<'_>,
    rel: &str,
    shown: &str,
) -> Result<Walked, WorkspacePathError> {
    let mut pending: VecDeque<Part> = rel
        .split('/')
        .filter(|p| !p.is_empty())
        .map(|p| Part {
            name: p.as_bytes().to_vec(),
            link: None,
        })
        .collect();
    let mut dirs: Vec<OwnedFd> = Vec::new();
    // Display names of `dirs`, to name a link in a message by its place in the workspace.
    let mut names: Vec<String> = Vec::new();
    let mut links: Vec<String> = Vec::new();

    while let Some(part) = pending.pop_front() {
        match part.name.as_slice() {
            b"" | b"." => {}
            b".." => {
                if dirs.pop().is_none() {
                    return Err(WorkspacePathError::Escapes {
                        path: shown.to_owned(),
                        link: part.link.and_then(|i| links.get(i).cloned()),
                        how: Escape::AboveRoot,
                    });
                }
                names.pop();
            }
            name => {
                let parent = dirs.last().map_or(root, AsFd::as_fd);
                let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
                let fd = fs::openat(parent, name, flags, Mode::empty())
                    .map_err(|e| lookup_error(e, shown, name.len()))?;
                let stat = fs::fstat(&fd).map_err(|e| io_error("inspect", shown, e))?;
                match FileType::from_raw_mode(stat.st_mode) {
                    FileType::Directory => {
                        if dirs.len() == MAX_DEPTH {
                            return Err(WorkspacePathError::TooDeep {
                                path: shown.to_owned(),
                            });
                        }
                        dirs.push(fd);
                        names.push(String::from_utf8_lossy(name).into_owned());
                    }
                    FileType::Symlink => {
                        let here = display_join(&names, name);
                        if links.len() == MAX_LINKS {
                            return Err(WorkspacePathError::SymlinkLoop {
                                path: shown.to_owned(),
                            });
                        }
                        // Reading the link through the fd we hold, not by name again, so
                        // what we follow is the link we classified.
                        let target = fs::readlinkat(&fd, "", Vec::new())
                            .map_err(|e| io_error("read the link in", shown, e))?;
                        let target = target.as_bytes();
                        if target.is_empty() {
                            // The kernel treats an empty target as a missing file.
                            return Err(WorkspacePathError::NotFound {
                                path: shown.to_owned(),
                            });
                        }
                        if target.starts_with(b"/") {
                            return Err(WorkspacePathError::Escapes {
                                path: shown.to_owned(),
                                link: Some(here),
                                how: Escape::AbsoluteTarget,
                            });
                        }
                        links.push(here);
                        let index = links.len() - 1;
                        for piece in target.split(|b| *b == b'/').rev() {
                            pending.push_front(Part {
                                name: piece.to_vec(),
                                link: Some(index),
                            });
                        }
                    }
                    _ => {
                        // Anything after a non-directory, even `.` or a trailing `/` from a
                        // link's target, is `ENOTDIR`, as in the kernel.
                        if !pending.is_empty() {
                            return Err(WorkspacePathError::NotADirectory {
                                path: shown.to_owned(),
                            });
                        }
                        return Ok(Walked {
                            dirs,
                            leaf: Leaf::Other {
                                name: name.to_vec(),
                            },
                        });
                    }
                }
            }
        }
    }
    Ok(Walked {
        dirs,
        leaf: Leaf::Directory,
    })
}

/// Opens `rel` beneath `root` without `openat2`: a [`walk`], then the leaf. A directory is
/// reopened through `.` of the fd the walk holds (no name lookup at all); anything else by
/// name in its directory with `O_NOFOLLOW`, and if it turned into a link meanwhile the walk
/// starts again.
pub(crate) fn open_walk(
    root: BorrowedFd<'_>,
    rel: &str,
    shown: &str,
    want: Want,
) -> Result<OwnedFd, WorkspacePathError> {
    for _ in 0..RETRIES {
        let walked = walk(root, rel, shown)?;
        let dir = walked.dir(root);
        match &walked.leaf {
            Leaf::Directory => {
                return fs::openat(dir, ".", want.flags(), Mode::empty())
                    .map_err(|e| open_error(e, shown));
            }
            Leaf::Other { .. } if want == Want::Directory => {
                return Err(WorkspacePathError::NotADirectory {
                    path: shown.to_owned(),
                });
            }
            Leaf::Other { name } => {
                match fs::openat(
                    dir,
                    name.as_slice(),
                    want.flags() | OFlags::NOFOLLOW,
                    Mode::empty(),
                ) {
                    // `O_PATH | O_NOFOLLOW` opens a link itself instead of failing.
                    Ok(fd) if is_symlink(&fd) => {}
                    Ok(fd) => return Ok(fd),
                    Err(Errno::LOOP) => {}
                    Err(e) => return Err(open_error(e, shown)),
                }
            }
        }
    }
    Err(io_error("open", shown, Errno::AGAIN))
}

fn is_symlink(fd: &OwnedFd) -> bool {
    fs::fstat(fd).is_ok_and(|s| FileType::from_raw_mode(s.st_mode) == FileType::Symlink)
}

pub(crate) fn kind_of(mode: u32) -> EntryKind {
    match FileType::from_raw_mode(mode) {
        FileType::RegularFile => EntryKind::File,
        FileType::Directory => EntryKind::Directory,
        FileType::Symlink => EntryKind::Symlink,
        _ => EntryKind::Other,
    }
}

fn display_join(names: &[String], name: &[u8]) -> String {
    let name = String::from_utf8_lossy(name);
    if names.is_empty() {
        name.into_owned()
    } else {
        format!("{}/{name}", names.join("/"))
    }
}

/// An error from looking up one component during a walk.
fn lookup_error(e: Errno, shown: &str, name_len: usize) -> WorkspacePathError {
    match e {
        Errno::NOENT => WorkspacePathError::NotFound {
            path: shown.to_owned(),
        },
        Errno::NOTDIR => WorkspacePathError::NotADirectory {
            path: shown.to_owned(),
        },
        Errno::NAMETOOLONG => WorkspacePathError::NameTooLong {
            path: shown.to_owned(),
            bytes: name_len,
        },
        e => io_error("open", shown, e),
    }
}

/// An error from the final open (by either method).
pub(crate) fn open_error(e: Errno, shown: &str) -> WorkspacePathError {
    match e {
        Errno::NOENT => WorkspacePathError::NotFound {
            path: shown.to_owned(),
        },
        Errno::NOTDIR => WorkspacePathError::NotADirectory {
            path: shown.to_owned(),
        },
        Errno::XDEV => WorkspacePathError::Escapes {
            path: shown.to_owned(),
            link: None,
            how: Escape::Refused,
        },
        Errno::LOOP => WorkspacePathError::SymlinkLoop {
            path: shown.to_owned(),
        },
        // Opening a socket.
        Errno::NXIO => WorkspacePathError::NotAFile {
            path: shown.to_owned(),
            found: EntryKind::Other,
        },
        e => io_error("open", shown, e),
    }
}

pub(crate) fn io_error(
    op: &'static str,
    shown: &str,
    e: impl Into<io::Error>,
) -> WorkspacePathError {
    let source = e.into();
    if let Some(refusal) = crate::quota::QuotaRefusal::of(&source) {
        return WorkspacePathError::QuotaExceeded {
            path: shown.to_owned(),
            limit: refusal.limit,
            used: refusal.used,
            largest: refusal.largest.clone(),
        };
    }
    WorkspacePathError::Io {
        op,
        path: shown.to_owned(),
        source,
    }
}
