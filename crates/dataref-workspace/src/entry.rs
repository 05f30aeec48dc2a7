use dataref_protocol::Timestamp;

use crate::WorkspacePath;
use crate::glob::Glob;

/// What a directory entry is. Links are reported as links, never followed, in listings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EntryKind {
    File,
    Directory,
    Symlink,
    /// A device, socket or FIFO.
    Other,
}

/// What `fstat` says about an opened path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metadata {
    pub kind: EntryKind,
    /// Bytes (for a directory, whatever the file system reports).
    pub size: u64,
    pub modified: Timestamp,
}

/// One entry of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Relative to the workspace root, so it can be handed back to `resolve` as is.
    pub path: WorkspacePath,
    pub kind: EntryKind,
    /// Bytes; for a link, the length of its target.
    pub size: u64,
    pub modified: Timestamp,
}

/// The result of a listing, sorted by path. Nothing is cut silently: the flags and the
/// count say what is missing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Listing {
    pub entries: Vec<Entry>,
    /// More entries matched than `max_entries`, or the scan budget ran out.
    pub truncated: bool,
    /// Some directories were not entered because they are deeper than `max_depth`.
    pub depth_limited: bool,
    /// Entries left out because their names are not UTF-8 (they cannot be named in a
    /// request, so listing them would only invite a failing call).
    pub skipped_non_utf8: usize,
}

/// Bounds and filter for [`Workspace::list_tree`](crate::Workspace::list_tree).
#[derive(Debug, Clone)]
pub struct TreeOptions {
    /// Matched against each entry's path relative to the listed directory.
    pub glob: Option<Glob>,
    /// Entries returned at most.
    pub max_entries: usize,
    /// Directory levels below the listed one: 1 lists its children only.
    pub max_depth: usize,
    /// Entries examined at most, matching or not, so a glob that matches nothing cannot
    /// make a listing walk a huge tree.
    pub max_scanned: usize,
}

impl Default for TreeOptions {
    fn default() -> Self {
        Self {
            glob: None,
            max_entries: 1_000,
            max_depth: 16,
            max_scanned: 100_000,
        }
    }
}
