//! The caller's workspace files as MCP resources, `dataref://files/{path}`, so a host can
//! show a chart or offer a download to the person without the bytes passing through the
//! model.
//!
//! Every path goes through the session's [`Workspace`]: it is resolved and opened beneath
//! the workspace root, so `..`, absolute paths, links leading outside, hard links and NUL
//! are refused by structure. Another principal's files cannot even be named: each session
//! only holds its own workspace. Messages name the workspace-relative path as requested,
//! never a host path.

use std::io::{self, Read};
use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use dataref_protocol::{mime_type, percent_decode, percent_encode};
use dataref_workspace::{
    Entry, EntryKind, TEMP_PREFIX, TreeOptions, Workspace, WorkspacePath, WorkspacePathError,
};
use rmcp::ErrorData as McpError;
use rmcp::model::{
    Annotations, CacheScope, ReadResourceResult, Resource, ResourceContents, ResourceTemplate, Role,
};
use serde_json::json;

use super::{TTL_MS, blocking, echo};

pub(crate) const URI_PREFIX: &str = "dataref://files/";
pub(crate) const URI_TEMPLATE: &str = "dataref://files/{path}";
/// Files in a listing at most: a listing is for picking a file, not an inventory
/// (`list_files` is, with globs and its own bounds).
pub(super) const MAX_LISTED: usize = 200;
/// Directory entries a listing examines at most, so a huge tree cannot stall `resources/list`.
const MAX_SCANNED: usize = 10_000;
const MAX_DEPTH: usize = 16;
/// Largest file served: a resource is read whole into one JSON message (base64 adds a
/// third for binary files).
pub(super) const MAX_READ_BYTES: u64 = 20 * 1024 * 1024;

/// The files a listing shows, newest modified first.
pub(crate) struct FileListing {
    pub(crate) files: Vec<Entry>,
    /// Some files are not shown: more than [`MAX_LISTED`], or the scan bounds were hit.
    pub(crate) truncated: bool,
}

/// Regular files anywhere in the workspace, newest modified first (then by path, so pages
/// are stable while nothing changes). Links, directories and the temporary files of
/// unfinished writes are left out; a link may be read by its URI, but is not offered.
pub(crate) fn list(workspace: &Workspace) -> Result<FileListing, WorkspacePathError> {
    let listing = workspace.list_tree(
        &workspace.root_path(),
        &TreeOptions {
            glob: None,
            max_entries: MAX_SCANNED,
            max_depth: MAX_DEPTH,
            max_scanned: MAX_SCANNED,
        },
    )?;
    let mut files: Vec<Entry> = listing
        .entries
        .into_iter()
        .filter(|e| e.kind == EntryKind::File)
        // A temp file (or anything under a temp name) is a write in progress or its debris.
        .filter(|e| {
            !e.path
                .as_str()
                .split('/')
                .any(|c| c.starts_with(TEMP_PREFIX))
        })
        .collect();
    files.sort_by(|a, b| {
        b.modified
            .cmp(&a.modified)
            .then_with(|| a.path.cmp(&b.path))
    });
    let truncated = listing.truncated || listing.depth_limited || files.len() > MAX_LISTED;
    files.truncate(MAX_LISTED);
    Ok(FileListing { files, truncated })
}

pub(super) fn template() -> ResourceTemplate {
    ResourceTemplate::new(URI_TEMPLATE, "file")
        .with_title("File in your workspace")
        .with_description(format!(
            "A file in your workspace (charts, exports, spilled results, files you put there), \
             by its path relative to the workspace root, percent-encoded where a URI needs it. \
             Text files read as text, others as base64 blobs, with the MIME type of their \
             extension; files over {} MiB are not served. Only you can read your workspace.",
            MAX_READ_BYTES / (1024 * 1024)
        ))
}

pub(super) fn resource_for(entry: &Entry) -> Resource {
    let path = entry.path.as_str();
    let mut annotations = Annotations::default().with_audience(vec![Role::User]);
    annotations.last_modified = Some(entry.modified.to_string());
    let resource = Resource::new(uri_for(path), path)
        .with_description(format!(
            "File in your workspace, {} bytes, modified {}.",
            entry.size, entry.modified
        ))
        .with_size(entry.size)
        .with_annotations(annotations);
    // An unknown extension's type depends on the contents, which a listing does not read.
    match mime_type(path, None) {
        Some(mime) => resource.with_mime_type(mime),
        None => resource,
    }
}

/// The URI of a workspace path: unreserved characters and `/` as they are, every other
/// byte percent-encoded, so names with spaces, `%`, `?` or `#` survive URI parsers.
pub(crate) fn uri_for(path: &str) -> String {
    let mut uri = String::with_capacity(URI_PREFIX.len() + path.len());
    uri.push_str(URI_PREFIX);
    uri.push_str(&percent_encode(path));
    uri
}

/// Types served as text (when the bytes are UTF-8); the rest go out as base64 blobs.
fn is_text(mime: &str) -> bool {
    mime.starts_with("text/")
        || matches!(
            mime,
            "application/json"
                | "application/x-ndjson"
                | "application/xml"
                | "application/toml"
                | "application/yaml"
                | "image/svg+xml"
        )
}

enum ReadError {
    Path(WorkspacePathError),
    /// `size` is the file's size, or (when it grew while being read) what was read.
    TooLarge {
        path: WorkspacePath,
        size: u64,
    },
    Io {
        path: WorkspacePath,
        source: io::Error,
    },
}

impl From<WorkspacePathError> for ReadError {
    fn from(e: WorkspacePathError) -> Self {
        Self::Path(e)
    }
}

/// Resolves and reads a file beneath the workspace root, at most [`MAX_READ_BYTES`].
fn read_capped(
    workspace: &Workspace,
    requested: &[u8],
) -> Result<(WorkspacePath, Vec<u8>), ReadError> {
    let path = workspace.resolve_bytes(requested)?;
    let file = workspace.open_read(&path)?;
    // `fstat` on the opened fd: the size of what is being read, not of what the name
    // points to now.
    let size = match file.metadata() {
        Ok(m) => m.len(),
        Err(source) => return Err(ReadError::Io { path, source }),
    };
    if size > MAX_READ_BYTES {
        return Err(ReadError::TooLarge { path, size });
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    // One byte past the cap tells a file that grew since the `fstat` from one that fits.
    if let Err(source) = file
        .take(MAX_READ_BYTES.saturating_add(1))
        .read_to_end(&mut bytes)
    {
        return Err(ReadError::Io { path, source });
    }
    let read = bytes.len() as u64;
    if read > MAX_READ_BYTES {
        return Err(ReadError::TooLarge { path, size: read });
    }
    Ok((path, bytes))
}

/// Reads `uri`, which starts with [`URI_PREFIX`]; the rest, percent-decoded, is the path
/// relative to the workspace root.
pub(super) async fn read(
    workspace: Arc<Workspace>,
    uri: String,
) -> Result<ReadResourceResult, McpError> {
    let raw = uri.strip_prefix(URI_PREFIX).unwrap_or_default();
    let Some(requested) = percent_decode(raw) else {
        return Err(McpError::resource_not_found(
            format!(
                "`{}` is not a valid path: a `%` must be followed by two hex digits",
                echo(raw)
            ),
            Some(json!({
                "uri": echo(&uri),
                "hint": "percent-encode the path as in the URI from `resources/list`",
            })),
        ));
    };
    let (path, bytes) = match blocking(move || read_capped(&workspace, &requested)).await? {
        Ok(read) => read,
        Err(ReadError::Path(e)) if e.is_caller_error() => {
            let message = match e.hint() {
                Some(hint) => format!("{e}; {hint}"),
                None => e.to_string(),
            };
            return Err(McpError::resource_not_found(
                message,
                Some(json!({"uri": echo(&uri)})),
            ));
        }
        Err(ReadError::Path(e)) => return Err(workspace_fault(&e)),
        Err(ReadError::Io { path, source }) => {
            return Err(workspace_fault(&format!("cannot read `{path}`: {source}")));
        }
        Err(ReadError::TooLarge { path, size }) => {
            return Err(McpError::invalid_params(
                format!(
                    "`{path}` is too large to serve as a resource: {size} bytes; the limit is \
                     {MAX_READ_BYTES} bytes ({} MiB)",
                    MAX_READ_BYTES / (1024 * 1024)
                ),
                Some(json!({
                    "uri": echo(&uri),
                    "size": size,
                    "limit": MAX_READ_BYTES,
                    "hint": "read a part of it with `read_file`, or make a smaller file",
                })),
            ));
        }
    };
    let mime = mime_type(path.as_str(), Some(&bytes)).unwrap_or("application/octet-stream");
    let contents = if is_text(mime) {
        match String::from_utf8(bytes) {
            Ok(text) => ResourceContents::text(text, uri),
            // Named like text but is not: the bytes as they are, still with their type.
            Err(e) => ResourceContents::blob(BASE64.encode(e.as_bytes()), uri),
        }
    } else {
        ResourceContents::blob(BASE64.encode(&bytes), uri)
    };
    Ok(ReadResourceResult::new(vec![contents.with_mime_type(mime)])
        .with_ttl_ms(TTL_MS)
        .with_cache_scope(CacheScope::Private))
}

/// The details (an errno, never a host path, but still nothing a client can act on) go to
/// the log only.
fn workspace_fault(e: &dyn std::fmt::Display) -> McpError {
    tracing::error!(error = %e, "workspace failed while serving a resource");
    McpError::internal_error(
        "the workspace could not be read; the details are in the server log",
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_types() {
        assert!(is_text("text/csv"));
        assert!(is_text("image/svg+xml"));
        assert!(is_text("application/json"));
        assert!(!is_text("image/png"));
        assert!(!is_text("application/vnd.apache.parquet"));
    }

    #[test]
    fn percent_coding_round_trips() {
        let path = "my report/50% off?#ü.csv";
        let uri = uri_for(path);
        assert_eq!(
            uri,
            "dataref://files/my%20report/50%25%20off%3F%23%C3%BC.csv"
        );
        let decoded = percent_decode(uri.strip_prefix(URI_PREFIX).unwrap_or_default());
        assert_eq!(decoded.as_deref(), Some(path.as_bytes()));
        assert_eq!(percent_decode("%2e%2E/x").as_deref(), Some(&b"../x"[..]));
        assert_eq!(percent_decode("a%00b").as_deref(), Some(&b"a\0b"[..]));
        assert_eq!(percent_decode("bad%zz"), None);
        assert_eq!(percent_decode("cut%4"), None);
    }
}
