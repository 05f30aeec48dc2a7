//! File tools over the caller's sealed workspace: `read_file`, `list_files`, `copy_file`.
//!
//! Every path the model names goes through [`Workspace::resolve`] (or a write beneath the
//! root); nothing here touches `std::fs` by path. Results name workspace-relative paths
//! only ([`WorkspacePath::as_str`]), never the host path of the workspace.
//!
//! [`Workspace::resolve`]: dataref_workspace::Workspace::resolve
//! [`WorkspacePath::as_str`]: dataref_workspace::WorkspacePath::as_str

mod copy_file;
mod list_files;
mod read_file;

pub use copy_file::CopyFileTool;
pub use list_files::ListFilesTool;
pub use read_file::ReadFileTool;

/// The MIME type of a file, guessed from its extension (case-insensitive, by
/// [`dataref_protocol::mime_type`]); `application/octet-stream` when the extension is unknown.
///
/// ```
/// assert_eq!(dataref_builtins::mime_type_for("charts/sales.PNG"), "image/png");
/// assert_eq!(dataref_builtins::mime_type_for("notes"), "application/octet-stream");
/// ```
pub fn mime_type_for(path: &str) -> &'static str {
    known_mime_type(path).unwrap_or("application/octet-stream")
}

/// The MIME type for a known extension; `None` lets each caller pick its own default
/// (text or bytes, depending on what it found in the file).
pub(crate) fn known_mime_type(path: &str) -> Option<&'static str> {
    dataref_protocol::mime_type(path, None)
}

/// The `dataref://files/{path}` URI of a workspace path, as the MCP server lists it:
/// unreserved characters and `/` as they are, every other byte percent-encoded.
pub(crate) fn file_uri(path: &str) -> String {
    format!("dataref://files/{}", dataref_protocol::percent_encode(path))
}

/// The last part of a workspace path: a link's name (the URI holds the whole path).
pub(crate) fn file_name(path: &str) -> String {
    path.rsplit('/').next().unwrap_or(path).to_owned()
}

/// A file name from a title: lowercase ASCII letters and digits joined by `-`, at most
/// 40 characters, then `-` and 8 hex digits of `key`, so different requests get different
/// files and the same request the same file.
pub(crate) fn file_stem(title: &str, key: &str) -> String {
    let mut slug = String::new();
    for c in title.chars().flat_map(char::to_lowercase) {
        if c.is_ascii_alphanumeric() {
            slug.push(c);
        } else if !slug.is_empty() && !slug.ends_with('-') {
            slug.push('-');
        }
        if slug.len() >= 40 {
            break;
        }
    }
    let slug = slug.trim_end_matches('-');
    let slug = if slug.is_empty() { "untitled" } else { slug };
    format!("{slug}-{:08x}", fnv1a(key.as_bytes()) as u32)
}

/// 64-bit FNV-1a: a fixed, published function, so a file name made from a request stays the
/// same across runs, machines and Rust releases (std's `DefaultHasher` promises none of that).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// `12,345` — numbers in prose (notes, messages); arguments to pass back stay plain.
pub(crate) fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mime_types_by_extension() {
        assert_eq!(mime_type_for("a/b/report.csv"), "text/csv");
        assert_eq!(mime_type_for("photo.JPG"), "image/jpeg");
        assert_eq!(mime_type_for("data.tar.gz"), "application/gzip");
        assert_eq!(mime_type_for(".gitignore"), "application/octet-stream");
        assert_eq!(mime_type_for("dir.csv/README"), "application/octet-stream");
        assert_eq!(known_mime_type("x.unknown"), None);
        assert_eq!(
            mime_type_for("t.feather"),
            "application/vnd.apache.arrow.file"
        );
    }

    #[test]
    fn stems_and_uris() {
        let a = file_stem("Revenue by Région (2024)", "k1");
        assert!(a.starts_with("revenue-by-r-gion-2024-"), "{a}");
        assert_ne!(a, file_stem("Revenue by Région (2024)", "k2"));
        assert_eq!(a, file_stem("Revenue by Région (2024)", "k1"));
        assert!(file_stem("!!!", "k").starts_with("untitled-"));
        // Pinned: the same name on every machine and Rust release (FNV-1a's test vectors).
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(file_stem("Q", "k1"), "q-b56224c1");
        assert_eq!(
            file_uri("charts/a b.png"),
            "dataref://files/charts/a%20b.png"
        );
    }

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(4_812), "4,812");
        assert_eq!(thousands(12_345_678), "12,345,678");
    }
}
