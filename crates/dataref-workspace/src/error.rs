use std::fmt;
use std::io;
use std::path::PathBuf;

use crate::EntryKind;

/// Longest path a caller may name, in bytes (Linux `PATH_MAX`).
pub const MAX_PATH_BYTES: usize = 4096;
/// Longest single name in a path, in bytes (Linux `NAME_MAX`).
pub const MAX_NAME_BYTES: usize = 255;
/// Deepest nesting of directories a path may pass through. Resolution holds an fd for each
/// level (so that `..` from a link returns exactly where it came from); the bound keeps one
/// request from using up the process's file descriptors.
pub const MAX_DEPTH: usize = 256;

/// Why a workspace could not be created or opened. This is the operator's problem, not the
/// model's, so the messages name host paths.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkspaceError {
    #[error("cannot create the workspace directory `{}`: {source}", path.display())]
    Create { path: PathBuf, source: io::Error },
    #[error("cannot open the workspace directory `{}`: {source}", path.display())]
    Open { path: PathBuf, source: io::Error },
}

impl WorkspaceError {
    /// What the operator should do next.
    pub fn hint(&self) -> Option<String> {
        match self {
            Self::Create { .. } => Some(
                "check that the data directory exists and is writable by the user running dataref"
                    .into(),
            ),
            Self::Open { .. } => Some(
                "the workspace must be an existing directory (not a symbolic link for per-caller \
                 workspaces) readable by the user running dataref"
                    .into(),
            ),
        }
    }
}

/// Which bytes made a requested path unusable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidBytes {
    /// A NUL byte, which no file name can contain.
    Nul,
    /// Not UTF-8: workspace paths are text.
    NotUtf8,
}

/// How a path left the workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Escape {
    /// A relative link whose `..` climbs above the workspace root.
    AboveRoot,
    /// A link to an absolute path. Absolute targets are never followed, even when they
    /// happen to point back inside: the kernel's `RESOLVE_BENEATH` refuses them, and so
    /// does the fallback walk, so both ways of opening agree.
    AbsoluteTarget,
    /// The kernel refused the open because resolution would leave the root (the path
    /// changed after it was resolved, so there is no link to name).
    Refused,
}

/// Why a requested workspace path was refused or could not be used.
///
/// Messages are written for the model: they name only the path as it was requested (or
/// a link inside the workspace), never a host path or a link's target, and
/// [`WorkspacePathError::hint`] says what to do next.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkspacePathError {
    #[error("`{path}` is an absolute path; workspace paths are relative to the workspace root")]
    Absolute { path: String },
    /// Refused even when the path would come back inside (`a/../b`): one simple rule.
    #[error("`{path}` contains a `..` component, which workspace paths may not use")]
    ParentComponent { path: String },
    #[error("{}", escape_message(path, link.as_deref(), *how))]
    Escapes {
        path: String,
        /// The link (relative to the workspace root) that led outside, when known.
        link: Option<String>,
        how: Escape,
    },
    #[error("`{path}` does not exist in the workspace")]
    NotFound { path: String },
    #[error("`{path}` is {}, not a regular file", found.with_article())]
    NotAFile { path: String, found: EntryKind },
    #[error("`{path}` is not a directory, or a part of it is not a directory")]
    NotADirectory { path: String },
    #[error("`{path}` contains a name of {bytes} bytes; the limit is {MAX_NAME_BYTES} bytes")]
    NameTooLong { path: String, bytes: usize },
    #[error("the path is {bytes} bytes long; the limit is {MAX_PATH_BYTES} bytes")]
    PathTooLong { bytes: usize },
    #[error("`{path}` goes more than {MAX_DEPTH} directories deep")]
    TooDeep { path: String },
    #[error("{}", invalid_message(path, *problem))]
    InvalidBytes { path: String, problem: InvalidBytes },
    #[error("`{path}` runs into a loop of symbolic links (or more than 40 of them)")]
    SymlinkLoop { path: String },
    /// A file with another name may be a link to a file outside the workspace; where the
    /// other name lives cannot be found out, so such files are not read.
    #[error(
        "`{path}` has {links} names (hard links); a file with more than one name is not read, \
         because another name may be outside the workspace"
    )]
    HardLinked { path: String, links: u64 },
    #[error(
        "`{path}` passes through the symbolic link `{link}`; files are only written through real \
         directories"
    )]
    LinkInWritePath { path: String, link: String },
    #[error("`{path}` already exists")]
    AlreadyExists { path: String },
    /// The write would take the workspace over its byte quota; nothing past the quota was
    /// written, and the file was not created.
    #[error(
        "writing `{path}` would take your workspace over its quota of {} ({} in use)",
        crate::quota::human_bytes(*limit),
        crate::quota::human_bytes(*used)
    )]
    QuotaExceeded {
        path: String,
        limit: u64,
        used: u64,
        /// The largest top-level entries, `(name, bytes)`, largest first (`dir/` for a
        /// directory with everything beneath it).
        largest: Vec<(String, u64)>,
    },
    /// The workspace's shared store ([`Mirror`](crate::Mirror)) could not be reached;
    /// nothing was changed. Worth trying again ([`WorkspacePathError::is_transient`]).
    #[error(
        "the shared workspace store is unavailable, so `{path}` could not be {op}; nothing was \
         changed"
    )]
    SharedUnavailable {
        path: String,
        /// What could not be done: `saved`, `read`, `listed`, `swept`.
        op: &'static str,
    },
    /// The version of `path` the shared index names could not be fetched even after
    /// listing it again: it was replaced or removed each time before its content could be
    /// read (or the store lost that content). The local copy was dropped rather than serve
    /// an older version. Worth trying again ([`WorkspacePathError::is_transient`]).
    #[error(
        "`{path}` could not be {op}: it kept changing in the shared workspace while it was \
         being fetched"
    )]
    SharedChanging {
        path: String,
        /// What could not be done: `read`, `listed`, `swept`.
        op: &'static str,
    },
    #[error("cannot {op} `{path}`: {source}")]
    Io {
        op: &'static str,
        path: String,
        source: io::Error,
    },
}

impl WorkspacePathError {
    /// A failed write or copy into `path`: a quota refusal (see
    /// [`Workspace::with_quota`](crate::Workspace::with_quota)) becomes
    /// [`WorkspacePathError::QuotaExceeded`], anything else [`WorkspacePathError::Io`].
    pub fn write_failed(path: &str, e: io::Error) -> Self {
        crate::beneath::io_error("write", path, e)
    }

    /// What the model (or person) should do next.
    pub fn hint(&self) -> Option<String> {
        let hint = match self {
            Self::Absolute { .. } => {
                "use a path relative to the workspace root, such as `notes.txt` or `data/out.csv`; \
                 `list_files` shows what is there"
            }
            Self::ParentComponent { .. } => {
                "name the file from the workspace root without `..`, e.g. `b/x.csv` instead of \
                 `a/../b/x.csv`"
            }
            Self::Escapes { how, .. } => match how {
                Escape::AboveRoot | Escape::Refused => {
                    "only files inside the workspace can be used; pick another path with \
                     `list_files`"
                }
                Escape::AbsoluteTarget => {
                    "links to absolute paths are not followed; use the path of the real file \
                     inside the workspace (see `list_files`)"
                }
            },
            Self::NotFound { .. } => "check the name with `list_files`; names are case-sensitive",
            Self::NotAFile { found, .. } => match found {
                EntryKind::Directory => "list it with `list_files` and pick a file inside it",
                EntryKind::File | EntryKind::Symlink | EntryKind::Other => {
                    "only regular files can be read or copied; pick another file with `list_files`"
                }
            },
            Self::NotADirectory { .. } => {
                "check the path with `list_files`; a file cannot contain other files"
            }
            Self::NameTooLong { .. } | Self::PathTooLong { .. } => {
                "use shorter names: at most 255 bytes for each name and 4096 bytes in all"
            }
            Self::TooDeep { .. } => "use a file that is nested less deeply",
            Self::InvalidBytes { .. } => "write the path as UTF-8 text without NUL characters",
            Self::SymlinkLoop { .. } => {
                "the links in this path point at each other; use the real file's path (see \
                 `list_files`)"
            }
            Self::HardLinked { .. } => {
                "this file cannot be read here; ask the person to put a copy of it (not a hard \
                 link) in the workspace"
            }
            Self::LinkInWritePath { .. } => {
                "write to the real directory's path instead of the link's (see `list_files`)"
            }
            Self::AlreadyExists { .. } => {
                "choose another name, or ask for the existing file to be overwritten"
            }
            Self::QuotaExceeded { largest, .. } => {
                let named: Vec<String> = largest
                    .iter()
                    .map(|(name, bytes)| {
                        format!("`{name}` ({})", crate::quota::human_bytes(*bytes))
                    })
                    .collect();
                let largest = if named.is_empty() {
                    String::new()
                } else {
                    format!("; the largest are {}", named.join(", "))
                };
                return Some(format!(
                    "free space first{largest}: ask the person to delete what is no longer \
                     needed from the workspace, or replace a large file by a smaller one under \
                     the same name (`list_files` shows sizes); or write something smaller"
                ));
            }
            Self::SharedUnavailable { .. } => {
                "try the same call again in a moment; if it keeps failing, tell the person \
                 running dataref that the shared workspace store cannot be reached"
            }
            Self::SharedChanging { .. } => {
                "try the same call again in a moment; if it keeps failing, tell the person \
                 running dataref that the shared workspace store is missing this file's content"
            }
            Self::Io { .. } => return None,
        };
        Some(hint.into())
    }

    /// True for errors the caller caused and can fix (as opposed to faults of the server).
    pub fn is_caller_error(&self) -> bool {
        match self {
            Self::Absolute { .. }
            | Self::ParentComponent { .. }
            | Self::Escapes { .. }
            | Self::NotFound { .. }
            | Self::NotAFile { .. }
            | Self::NotADirectory { .. }
            | Self::NameTooLong { .. }
            | Self::PathTooLong { .. }
            | Self::TooDeep { .. }
            | Self::InvalidBytes { .. }
            | Self::SymlinkLoop { .. }
            | Self::HardLinked { .. }
            | Self::LinkInWritePath { .. }
            | Self::AlreadyExists { .. }
            | Self::QuotaExceeded { .. } => true,
            Self::SharedUnavailable { .. } | Self::SharedChanging { .. } | Self::Io { .. } => false,
        }
    }

    /// True for a fault that is expected to pass (the shared store unreachable, or a file
    /// changing in it faster than it could be fetched): not the caller's, but the caller
    /// should be told, with the hint, to try again.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::SharedUnavailable { .. } | Self::SharedChanging { .. }
        )
    }
}

fn escape_message(path: &str, link: Option<&str>, how: Escape) -> String {
    match (link, how) {
        (Some(link), Escape::AbsoluteTarget) => format!(
            "`{path}` goes through the symbolic link `{link}`, which points to an absolute path; \
             such links are not followed"
        ),
        (Some(link), Escape::AboveRoot | Escape::Refused) => {
            format!("`{path}` leads outside the workspace through the symbolic link `{link}`")
        }
        (None, _) => format!("`{path}` leads outside the workspace through a symbolic link"),
    }
}

fn invalid_message(path: &str, problem: InvalidBytes) -> String {
    match problem {
        InvalidBytes::Nul => format!("`{path}` contains a NUL character"),
        InvalidBytes::NotUtf8 => format!("`{path}` is not valid UTF-8"),
    }
}

/// A requested path as it may appear in a message: control characters escaped and the
/// length capped, so an 8 KiB path does not become an 8 KiB error.
pub(crate) fn shown(requested: &[u8]) -> String {
    const MAX_CHARS: usize = 120;
    let text = String::from_utf8_lossy(requested);
    let mut out = String::new();
    for (i, c) in text.chars().enumerate() {
        if i == MAX_CHARS {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

impl fmt::Display for EntryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::File => "file",
            Self::Directory => "directory",
            Self::Symlink => "symbolic link",
            Self::Other => "special file",
        })
    }
}

impl EntryKind {
    fn with_article(self) -> &'static str {
        match self {
            Self::File => "a regular file",
            Self::Directory => "a directory",
            Self::Symlink => "a symbolic link",
            Self::Other => "a special file (device, socket or pipe)",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_escapes_and_caps() {
        assert_eq!(shown(b"a\0b"), "a\\u{0}b");
        let long = "x".repeat(500);
        let s = shown(long.as_bytes());
        assert_eq!(s.chars().count(), 121);
        assert!(s.ends_with('…'));
    }

    #[test]
    fn every_caller_error_has_a_hint() {
        let errors = [
            WorkspacePathError::Absolute { path: "/x".into() },
            WorkspacePathError::Escapes {
                path: "l".into(),
                link: Some("l".into()),
                how: Escape::AbsoluteTarget,
            },
            WorkspacePathError::HardLinked {
                path: "h".into(),
                links: 2,
            },
        ];
        for e in errors {
            assert!(e.is_caller_error());
            assert!(e.hint().is_some(), "{e}");
        }
    }

    #[test]
    fn absolute_link_message_says_so() {
        let e = WorkspacePathError::Escapes {
            path: "data/x".into(),
            link: Some("data".into()),
            how: Escape::AbsoluteTarget,
        };
        assert_eq!(
            e.to_string(),
            "`data/x` goes through the symbolic link `data`, which points to an absolute path; \
             such links are not followed"
        );
    }
}
