use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::time::Instant;

use crate::error::{InvalidBytes, MAX_NAME_BYTES, MAX_PATH_BYTES, WorkspacePathError, shown};

/// A path inside a workspace, made only by [`Workspace::resolve`](crate::Workspace::resolve)
/// (or returned by a write), so holding one means it was checked.
///
/// It is relative to the workspace root and normalised: no leading or doubled `/`, no `.`
/// and never `..`. It is what results show the model; there is no way to get an absolute
/// host path from it. Every use opens it again beneath the root's directory fd, so a link
/// swapped in after resolution cannot lead outside.
///
/// Two paths are equal when they name the same place: how fresh a path's sync is (see
/// below) is not part of its identity.
#[derive(Clone)]
pub struct WorkspacePath {
    /// Normalised components joined by `/`; empty for the root.
    rel: String,
    /// Set by [`Workspace::resolve`](crate::Workspace::resolve) of a workspace with a
    /// mirror: that workspace brought this path (and everything beneath it) up to date with
    /// the shared index, so a listing of it right after need not ask the index again.
    synced: Option<Synced>,
}

/// Which workspace synced a path, and when the sync finished.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Synced {
    /// [`Workspace`](crate::Workspace)s are told apart by a number given when they open.
    pub(crate) workspace: u64,
    pub(crate) at: Instant,
}

impl WorkspacePath {
    pub(crate) fn root() -> Self {
        Self {
            rel: String::new(),
            synced: None,
        }
    }

    /// Only for strings that went through [`normalize`] or are joins of such strings with
    /// single names read from a directory.
    pub(crate) fn from_normalized(rel: String) -> Self {
        Self { rel, synced: None }
    }

    /// As [`WorkspacePath::from_normalized`], for a path whose subtree was just synced.
    pub(crate) fn synced(rel: String, synced: Option<Synced>) -> Self {
        Self { rel, synced }
    }

    pub(crate) fn sync_mark(&self) -> Option<Synced> {
        self.synced
    }

    /// The path relative to the workspace root; `.` for the root itself.
    pub fn as_str(&self) -> &str {
        if self.rel.is_empty() { "." } else { &self.rel }
    }

    /// True for the workspace root (the empty path, `.`, `./`).
    pub fn is_root(&self) -> bool {
        self.rel.is_empty()
    }

    /// The last name in the path; `None` for the root.
    pub fn file_name(&self) -> Option<&str> {
        if self.rel.is_empty() {
            return None;
        }
        self.rel.rsplit('/').next()
    }

    /// The normalised path, empty for the root (as the mirror's index names paths).
    pub(crate) fn rel(&self) -> &str {
        &self.rel
    }

    /// The path as the kernel takes it relative to the root fd (`.` for the root).
    pub(crate) fn rel_for_open(&self) -> &str {
        self.as_str()
    }

    pub(crate) fn join(&self, name: &str) -> Self {
        if self.rel.is_empty() {
            Self::from_normalized(name.to_owned())
        } else {
            Self::from_normalized(format!("{}/{name}", self.rel))
        }
    }
}

impl PartialEq for WorkspacePath {
    fn eq(&self, other: &Self) -> bool {
        self.rel == other.rel
    }
}

impl Eq for WorkspacePath {}

impl Hash for WorkspacePath {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.rel.hash(state);
    }
}

impl PartialOrd for WorkspacePath {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for WorkspacePath {
    fn cmp(&self, other: &Self) -> Ordering {
        self.rel.cmp(&other.rel)
    }
}

impl fmt::Display for WorkspacePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for WorkspacePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WorkspacePath({:?})", self.as_str())
    }
}

/// The lexical half of resolution: POSIX relative path, no absolute, no `..`, lengths,
/// NUL and UTF-8. Returns the normalised components joined by `/` ("" for the root).
///
/// `..` is refused even where it would come back inside (`a/../b`): the model gets one
/// simple rule, and what a `..` means after a symlink is exactly what this crate avoids
/// reasoning about in strings.
pub(crate) fn normalize(requested: &[u8]) -> Result<String, WorkspacePathError> {
    if requested.len() > MAX_PATH_BYTES {
        return Err(WorkspacePathError::PathTooLong {
            bytes: requested.len(),
        });
    }
    if requested.contains(&0) {
        return Err(WorkspacePathError::InvalidBytes {
            path: shown(requested),
            problem: InvalidBytes::Nul,
        });
    }
    let Ok(text) = std::str::from_utf8(requested) else {
        return Err(WorkspacePathError::InvalidBytes {
            path: shown(requested),
            problem: InvalidBytes::NotUtf8,
        });
    };
    if text.starts_with('/') {
        return Err(WorkspacePathError::Absolute {
            path: shown(requested),
        });
    }
    let mut parts = Vec::new();
    for part in text.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                return Err(WorkspacePathError::ParentComponent {
                    path: shown(requested),
                });
            }
            name if name.len() > MAX_NAME_BYTES => {
                return Err(WorkspacePathError::NameTooLong {
                    path: shown(requested),
                    bytes: name.len(),
                });
            }
            name => parts.push(name),
        }
    }
    Ok(parts.join("/"))
}

/// Splits a normalised, non-root path into its parent and last name.
pub(crate) fn split_last(rel: &str) -> (&str, &str) {
    match rel.rsplit_once('/') {
        Some((parent, name)) => (parent, name),
        None => ("", rel),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> String {
        normalize(s.as_bytes()).unwrap()
    }

    #[test]
    fn dots_and_slashes_normalise() {
        assert_eq!(ok("notes.txt"), "notes.txt");
        assert_eq!(ok("./x"), "x");
        assert_eq!(ok("a/./b"), "a/b");
        assert_eq!(ok("a//b/"), "a/b");
        assert_eq!(ok(""), "");
        assert_eq!(ok("."), "");
        assert_eq!(ok("./"), "");
        // Only `/` separates: a backslash is an ordinary character in a POSIX name.
        assert_eq!(ok("a\\..\\b"), "a\\..\\b");
        assert_eq!(ok("..."), "...");
    }

    #[test]
    fn refusals() {
        assert!(matches!(
            normalize(b"/etc/passwd"),
            Err(WorkspacePathError::Absolute { .. })
        ));
        assert!(matches!(
            normalize(b"../../secret"),
            Err(WorkspacePathError::ParentComponent { .. })
        ));
        assert!(matches!(
            normalize(b"a/../b"),
            Err(WorkspacePathError::ParentComponent { .. })
        ));
        assert!(matches!(
            normalize(b"a\0b"),
            Err(WorkspacePathError::InvalidBytes {
                problem: InvalidBytes::Nul,
                ..
            })
        ));
        assert!(matches!(
            normalize(b"a\xffb"),
            Err(WorkspacePathError::InvalidBytes {
                problem: InvalidBytes::NotUtf8,
                ..
            })
        ));
        let long_name = "n".repeat(256);
        assert!(matches!(
            normalize(long_name.as_bytes()),
            Err(WorkspacePathError::NameTooLong { bytes: 256, .. })
        ));
        assert_eq!(ok(&"n".repeat(255)).len(), 255);
        let long_path = "abc/".repeat(1025);
        assert!(matches!(
            normalize(long_path.as_bytes()),
            Err(WorkspacePathError::PathTooLong { bytes: 4100 })
        ));
    }

    #[test]
    fn root_shows_as_dot() {
        let root = WorkspacePath::root();
        assert_eq!(root.as_str(), ".");
        assert!(root.is_root());
        assert_eq!(root.file_name(), None);
        assert_eq!(root.join("a").join("b").as_str(), "a/b");
        assert_eq!(root.join("a").join("b").file_name(), Some("b"));
    }

    #[test]
    fn split_last_parts() {
        assert_eq!(split_last("a/b/c"), ("a/b", "c"));
        assert_eq!(split_last("c"), ("", "c"));
    }
}
