//! Sealed workspace paths: the directory a caller's file tools and spill files live in,
//! and the only way to name anything in it.
//!
//! A [`Workspace`] holds an open directory fd of its root (per principal under the data
//! directory, or one given explicitly). A [`WorkspacePath`] can only be made by
//! [`Workspace::resolve`], which takes the path the model asked for and checks it by
//! structure, never by string prefix:
//!
//! 1. parse it as a relative POSIX path (UTF-8, no NUL, names ≤ 255 bytes, ≤ 4096 in all);
//! 2. refuse absolute paths;
//! 3. refuse any `..`, even one that would come back inside;
//! 4. resolve links one component at a time from the root fd;
//! 5. check containment on that walk: a `..` from a link that would climb above the root,
//!    or a link to an absolute path, is an escape.
//!
//! Resolving is not enough on its own: a link can be swapped in between the check and the
//! open. So every operation opens again relative to the root fd with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`, or, where the kernel lacks it
//! (`ENOSYS`), with the same walk using `O_NOFOLLOW` on every component. Whatever the tree
//! does meanwhile, nothing outside the root is opened. Files are read only if they are
//! regular and have one name (a hard link may lead to a file outside), checked with `fstat`
//! on the opened fd. Writes go to a temporary file beside the destination and are renamed
//! into place ([`AtomicFile`]).
//!
//! A tree someone else wrote (the sandbox's `out/`, filled by the model's code) is read
//! through [`UntrustedDir`] instead: a directory fd whose entries are opened one plain name
//! at a time with `O_NOFOLLOW`, never through a link, regular single-link files only, within
//! a byte cap, and listings counted against an [`EntryBudget`]. This crate is the one place
//! that opens files beneath a root, for workspaces and for trees like that alike.
//!
//! Several processes on different hosts can share one workspace through a [`Mirror`]
//! ([`Workspace::with_mirror`]): a shared index of files and their contents (implemented
//! elsewhere, e.g. PostgreSQL and object storage) that is the truth, while the local
//! directory becomes a cache of it. A commit publishes to the mirror before it renames;
//! resolving and listing first bring what they name up to date (fetching what is missing or
//! stale, removing what the index no longer has), and every path the index names is checked
//! and written beneath the root like any other, so the index cannot lead outside either.
//!
//! Errors ([`WorkspacePathError`]) are written for the model, name only workspace-relative
//! paths, and carry a [`hint`](WorkspacePathError::hint) with the next step.
//!
//! Linux only: it relies on `openat2`, `O_PATH`, `renameat2` and reading links through
//! `O_PATH` fds.
//!
//! ```
//! use std::io::Read;
//! use dataref_workspace::{Overwrite, Workspace, WorkspacePathError};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! let ws = Workspace::open(dir.path())?;
//! ws.write_atomic("reports/notes.txt", b"hello", Overwrite::Refuse)?;
//!
//! let path = ws.resolve("./reports/notes.txt")?;
//! assert_eq!(path.as_str(), "reports/notes.txt");
//! let mut text = String::new();
//! ws.open_read(&path)?.read_to_string(&mut text)?;
//! assert_eq!(text, "hello");
//!
//! let err = ws.resolve("../../etc/passwd").unwrap_err();
//! assert!(matches!(err, WorkspacePathError::ParentComponent { .. }));
//! assert_eq!(
//!     err.to_string(),
//!     "`../../etc/passwd` contains a `..` component, which workspace paths may not use"
//! );
//! # Ok(())
//! # }
//! ```

#[cfg(not(target_os = "linux"))]
compile_error!("dataref-workspace relies on Linux system calls (openat2, O_PATH, renameat2)");

mod atomic;
mod beneath;
mod entry;
mod error;
mod glob;
mod list;
mod mirror;
mod path;
mod quota;
mod sweep;
mod untrusted;
mod workspace;

pub use atomic::{AtomicFile, Overwrite, TEMP_PREFIX};
pub use entry::{Entry, EntryKind, Listing, Metadata, TreeOptions};
pub use error::{
    Escape, InvalidBytes, MAX_DEPTH, MAX_NAME_BYTES, MAX_PATH_BYTES, WorkspaceError,
    WorkspacePathError,
};
pub use glob::{Glob, GlobError, MAX_GLOB_ALTERNATIVES, MAX_GLOB_BYTES};
pub use mirror::{Mirror, MirrorError, Remote};
pub use path::WorkspacePath;
pub use quota::{QuotaRefusal, human_bytes};
pub use sweep::Swept;
pub use untrusted::{EntryBudget, FileKind, Names, Refusal, UntrustedDir};
pub use workspace::{OpenMethod, Workspace};
