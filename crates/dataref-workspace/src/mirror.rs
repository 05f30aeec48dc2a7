//! A workspace whose truth is shared by several processes (replicas of `dataref serve
//! --http` behind a load balancer): a [`Mirror`] holds the index of files and their
//! contents, and the local directory is a cache of it.
//!
//! With a mirror ([`Workspace::with_mirror`]):
//!
//! - a commit hashes the finished temporary file, [`Mirror::publish`]es it, and only then
//!   renames it into place locally. The shared index decides [`Overwrite::Refuse`]; if the
//!   publish fails nothing changes locally;
//! - reads bring what they name up to date first: [`Workspace::resolve`] the requested
//!   path (a file, or a directory with everything beneath it), [`Workspace::list_dir`] and
//!   [`Workspace::list_tree`] the listed directory (unless the same workspace's `resolve`
//!   gave that path and synced it within the last second). Syncing fetches what is missing
//!   or stale, and removes local regular files the index does not have. `open_read` and
//!   `metadata` take a path that was resolved (so synced) and do not ask again;
//! - a version replaced and swept between the listing and its fetch is listed again and
//!   its new version fetched (a few times at most); one that still cannot be had has its
//!   local copy removed, never served stale, and resolving that file fails with
//!   [`WorkspacePathError::SharedChanging`]. A directory's files that cannot be fetched
//!   (vanishing, corrupt, or the store failing for them) are logged and left out of its
//!   sync, so one bad object does not fail every listing; resolving such a file itself
//!   reports why;
//! - [`Workspace::create_atomic`] with [`Overwrite::Refuse`] asks the index whether the
//!   name is taken (without fetching it), so callers that try names until one is free see
//!   the shared truth;
//! - [`Workspace::remove_old_files`] removes old files from the index ([`Mirror::remove`]),
//!   then from the local directory.
//!
//! Every path the index names is checked like a path the model asks for (normalised,
//! relative, no `..`, no NUL) and written only through real directories beneath the root,
//! so a hostile or corrupted index cannot write outside the workspace; rows that fail are
//! logged and skipped. Fetched content is checked against the row's size and SHA-256 before
//! it is renamed into place, so a reader never sees part of a file.
//!
//! Which shared version a local file holds is remembered per process, keyed by the file's
//! identity (device, inode, size, modification and change times, see `mirror/known.rs`);
//! a file this process has not seen (after a restart) is hashed once and compared.
//!
//! [`Workspace::with_mirror`]: crate::Workspace::with_mirror
//! [`Workspace::resolve`]: crate::Workspace::resolve
//! [`Workspace::list_dir`]: crate::Workspace::list_dir
//! [`Workspace::list_tree`]: crate::Workspace::list_tree
//! [`Workspace::create_atomic`]: crate::Workspace::create_atomic
//! [`Workspace::remove_old_files`]: crate::Workspace::remove_old_files

use std::fmt;
use std::fs::File;
use std::io::{self, Read, Seek};

use dataref_protocol::Timestamp;
use rustix::fs::{self, Timespec, Timestamps};
use sha2::{Digest, Sha256};

use crate::Overwrite;
use crate::error::WorkspacePathError;

pub(crate) mod known;
mod sync;

/// One file as the shared index knows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Remote {
    /// Normalised relative POSIX path, as [`WorkspacePath::as_str`] gives it (never `.`).
    ///
    /// [`WorkspacePath::as_str`]: crate::WorkspacePath::as_str
    pub path: String,
    /// Opaque, and unique per publish: never reused, not even for the same content at the
    /// same path. Local copies are matched to rows by it.
    pub version: String,
    /// SHA-256 of the content.
    pub sha256: [u8; 32],
    /// Length of the content.
    pub bytes: u64,
    /// When this version was published; local copies get it as their modification time,
    /// so every replica lists the same time (and the spill sweep ages files by it).
    pub modified: Timestamp,
}

impl fmt::Debug for Remote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Remote")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("sha256", &hex(&self.sha256))
            .field("bytes", &self.bytes)
            .field("modified", &self.modified)
            .finish()
    }
}

/// The shared truth behind a workspace: an index of files (path → version, hash, size,
/// time) and their contents. Implemented outside this crate (PostgreSQL and object
/// storage); this crate keeps the local directory equal to it.
///
/// Paths are [`Remote::path`]s, relative to the workspace (the implementation scopes them
/// to one principal). Every method blocks; callers are on blocking threads (never on an
/// async runtime's worker), so an implementation over an async client may block on it.
///
/// Contract:
///
/// - **Atomic publish.** A row appears in (or changes in) the index only once its content
///   is durable and fetchable, and in one step: `list` shows the old row or the new one,
///   never a row without content. A failed `publish` changes nothing.
/// - **Refuse is decided by the index.** With [`Overwrite::Refuse`], of two publishes of
///   the same path at most one succeeds; the other fails with
///   [`MirrorError::AlreadyExists`]. With [`Overwrite::Replace`] the last publish wins.
/// - **Quota with the row.** The shared quota is charged in the same step as the row
///   (the replaced row's bytes given back), so concurrent replicas cannot overshoot it.
/// - **Read after write.** `list` reflects every `publish` and `remove` that returned
///   before it was called, on any replica (a snapshot taken after the call began).
/// - **Versions are immutable.** `fetch` gives the content of exactly `remote.version`
///   (the bytes behind a version never change), or [`MirrorError::NotFound`] once that
///   version was replaced or removed and its content is gone.
/// - **Errors.** [`MirrorError::Unavailable`] when the store cannot be reached (the caller
///   is told to try again); its `detail` goes to the logs, never to the model.
pub trait Mirror: Send + Sync + fmt::Debug {
    /// Makes `file` (the finished temporary file, positioned at offset 0, `bytes` long,
    /// with content hash `sha256`) durable as the new content of `path`, and returns the
    /// new row. Refuses with [`MirrorError::AlreadyExists`] under [`Overwrite::Refuse`]
    /// when the index has `path`, and with [`MirrorError::Quota`] when the shared quota
    /// would be exceeded.
    fn publish(
        &self,
        path: &str,
        file: &mut File,
        bytes: u64,
        sha256: [u8; 32],
        overwrite: Overwrite,
    ) -> Result<Remote, MirrorError>;

    /// Every file at `under` exactly or beneath `under/`, in any order; the empty path
    /// lists the whole workspace.
    fn list(&self, under: &str) -> Result<Vec<Remote>, MirrorError>;

    /// Writes the content of `remote.version` into `sink`. The caller checks length and
    /// hash, and discards what was written if they differ or this fails.
    fn fetch(&self, remote: &Remote, sink: &mut dyn io::Write) -> Result<(), MirrorError>;

    /// Removes `remote.path` from the index if it is still at `remote.version` (compare and
    /// delete, so a newer publish is never removed); `Ok(false)` if it was not.
    fn remove(&self, remote: &Remote) -> Result<bool, MirrorError>;
}

/// Why the shared store refused or failed. Turned into a [`WorkspacePathError`] by the
/// workspace, naming the path.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MirrorError {
    /// [`Overwrite::Refuse`] and the index has the path.
    #[error("`{path}` already exists in the shared workspace")]
    AlreadyExists { path: String },
    /// The shared quota (across replicas) would be exceeded.
    #[error(
        "the shared workspace quota of {} would be exceeded ({} in use)",
        crate::quota::human_bytes(*quota),
        crate::quota::human_bytes(*used)
    )]
    Quota { quota: u64, used: u64 },
    /// The version asked for is no longer in the store (replaced or removed meanwhile).
    #[error("`{path}` is no longer in the shared workspace at that version")]
    NotFound { path: String },
    /// The store cannot be reached (network, database, object storage down or timing
    /// out). `detail` is for the logs.
    #[error("the shared workspace store is unavailable ({detail}); try again")]
    Unavailable { detail: String },
    /// What the store returned does not match its own index (length or hash).
    #[error(
        "the shared workspace store returned content for `{path}` that does not match its index: {detail}"
    )]
    Corrupt { path: String, detail: String },
    /// A local read or write failed while publishing or fetching (reading the temporary
    /// file, writing into the sink).
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl MirrorError {
    /// The error a workspace operation on `path` reports; `op` says what could not be done
    /// ("saved", "read", "listed", "swept").
    pub(crate) fn into_path_error(self, op: &'static str, path: &str) -> WorkspacePathError {
        match self {
            Self::AlreadyExists { .. } => WorkspacePathError::AlreadyExists {
                path: path.to_owned(),
            },
            Self::Quota { quota, used } => WorkspacePathError::QuotaExceeded {
                path: path.to_owned(),
                limit: quota,
                used,
                largest: Vec::new(),
            },
            Self::NotFound { .. } => WorkspacePathError::NotFound {
                path: path.to_owned(),
            },
            Self::Unavailable { detail } => {
                // The detail may name hosts or SQL; the operator reads it here, the model
                // only learns that the store is unavailable.
                tracing::warn!(path, op, %detail, "the shared workspace store is unavailable");
                WorkspacePathError::SharedUnavailable {
                    path: path.to_owned(),
                    op,
                }
            }
            e @ Self::Corrupt { .. } => WorkspacePathError::Io {
                op: "fetch",
                path: path.to_owned(),
                source: io::Error::other(e),
            },
            Self::Io(source) => crate::beneath::io_error(op_verb(op), path, source),
        }
    }
}

/// The verb of an [`WorkspacePathError::Io`] message for a mirror operation.
fn op_verb(op: &'static str) -> &'static str {
    match op {
        "saved" => "publish",
        "listed" => "list",
        "swept" => "sweep",
        _ => "fetch",
    }
}

/// Length and SHA-256 of `file` from its start; leaves it positioned at its start.
pub(crate) fn hash_file(file: &mut File) -> io::Result<(u64, [u8; 32])> {
    file.rewind()?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 << 10];
    let mut bytes = 0u64;
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        bytes += n as u64;
    }
    file.rewind()?;
    Ok((bytes, hasher.finalize().into()))
}

/// Gives a local copy the time its version was published, as on every other replica.
/// Best effort: the time is shown, never compared.
pub(crate) fn set_modified(file: &File, modified: Timestamp, path: &str) {
    let omit = Timespec {
        tv_sec: 0,
        tv_nsec: fs::UTIME_OMIT,
    };
    let times = Timestamps {
        last_access: omit,
        last_modification: Timespec {
            tv_sec: modified.unix_seconds(),
            tv_nsec: 0,
        },
    };
    if let Err(e) = fs::futimens(file, &times) {
        tracing::debug!(path, error = %e, "cannot set the modification time of a local copy");
    }
}

/// Lowercase hex, for logs and `Debug`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use fmt::Write;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// A sink for [`Mirror::fetch`]: hashes and counts what goes through, and refuses more
/// than the row says, so a store that sends too much cannot fill the disk.
pub(crate) struct Verify<W> {
    inner: W,
    hasher: Sha256,
    bytes: u64,
    limit: u64,
    /// A write past `limit` was refused.
    overflowed: bool,
}

impl<W: io::Write> Verify<W> {
    pub(crate) fn new(inner: W, limit: u64) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
            bytes: 0,
            limit,
            overflowed: false,
        }
    }

    /// True if more was written than the row's length (the error the store got from the
    /// sink, whatever it made of it).
    pub(crate) fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// Length and hash of what was written.
    pub(crate) fn finish(self) -> (u64, [u8; 32]) {
        (self.bytes, self.hasher.finalize().into())
    }
}

impl<W: io::Write> io::Write for Verify<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.bytes.saturating_add(buf.len() as u64) > self.limit {
            self.overflowed = true;
            return Err(io::Error::other(format!(
                "the shared store sent more than the {} bytes its index names",
                self.limit
            )));
        }
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}
