//! Small text helpers used on both sides of the HTTP/MCP split: percent-encoding of
//! workspace paths (resource URIs, download URLs), MIME types by extension, bounding
//! values echoed back in messages, and sizes as people read them.

/// Unreserved characters and `/` as they are, every other byte as `%XX`: the path part of
/// `dataref://files/{path}` URIs and of download URLs.
///
/// ```
/// assert_eq!(dataref_protocol::percent_encode("a b/ü.csv"), "a%20b/%C3%BC.csv");
/// ```
pub fn percent_encode(path: &str) -> String {
    let mut uri = String::with_capacity(path.len());
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/') {
            uri.push(char::from(b));
        } else {
            uri.push_str(&format!("%{b:02X}"));
        }
    }
    uri
}

/// `%XX` escapes to bytes; everything else as is. `None` for a `%` not followed by two hex
/// digits.
pub fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hi = hex_value(bytes.next()?)?;
            let lo = hex_value(bytes.next()?)?;
            out.push(hi << 4 | lo);
        } else {
            out.push(b);
        }
    }
    Some(out)
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// The MIME type of a workspace file by the extension of its last name (case-insensitive):
/// the one table for the file tools, the MCP resources and the HTTP downloads.
/// For an unknown extension the contents decide when they are at hand (UTF-8 is
/// `text/plain`, anything else `application/octet-stream`); without them it is unknown.
pub fn mime_type(path: &str, contents: Option<&[u8]>) -> Option<&'static str> {
    let name = path.rsplit('/').next().unwrap_or(path);
    let extension = name
        .rsplit_once('.')
        .filter(|(stem, _)| !stem.is_empty())
        .map(|(_, ext)| ext.to_ascii_lowercase());
    let known = match extension.as_deref() {
        Some("png") => Some("image/png"),
        Some("jpg" | "jpeg") => Some("image/jpeg"),
        Some("gif") => Some("image/gif"),
        Some("webp") => Some("image/webp"),
        Some("svg") => Some("image/svg+xml"),
        Some("pdf") => Some("application/pdf"),
        Some("csv") => Some("text/csv"),
        Some("tsv") => Some("text/tab-separated-values"),
        Some("json") => Some("application/json"),
        Some("ndjson" | "jsonl") => Some("application/x-ndjson"),
        Some("txt" | "log") => Some("text/plain"),
        Some("md") => Some("text/markdown"),
        Some("html" | "htm") => Some("text/html"),
        Some("xml") => Some("application/xml"),
        Some("xlsx") => Some("application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"),
        Some("parquet") => Some("application/vnd.apache.parquet"),
        Some("arrow" | "feather") => Some("application/vnd.apache.arrow.file"),
        Some("zip") => Some("application/zip"),
        Some("gz") => Some("application/gzip"),
        Some("py") => Some("text/x-python"),
        Some("toml") => Some("application/toml"),
        Some("yaml" | "yml") => Some("application/yaml"),
        _ => None,
    };
    known.or_else(|| {
        contents.map(|bytes| {
            if std::str::from_utf8(bytes).is_ok() {
                "text/plain"
            } else {
                "application/octet-stream"
            }
        })
    })
}

/// A request value echoed in a message, bounded to 100 characters (then `…`).
pub fn truncate_echo(s: &str) -> String {
    truncate_chars(s, 100)
}

/// `s` cut after `max` characters (never inside one), with `…` when it was cut.
pub fn truncate_chars(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

/// A byte count as people read it: `1.5 GiB`, `312 MiB`, `12 KiB`, `80 bytes` (quota
/// refusals, `run_sql`'s memory limit).
pub fn human_bytes(n: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (unit, size) in UNITS {
        if n >= size {
            let whole = n / size;
            return if whole < 10 {
                let tenths = (n % size) * 10 / size;
                format!("{whole}.{tenths} {unit}")
            } else {
                format!("{whole} {unit}")
            };
        }
    }
    format!("{n} bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mime_by_extension() {
        assert_eq!(mime_type("a/chart.PNG", None), Some("image/png"));
        assert_eq!(mime_type("x.jpeg", None), Some("image/jpeg"));
        assert_eq!(mime_type("x.svg", None), Some("image/svg+xml"));
        assert_eq!(mime_type("rows.ndjson", None), Some("application/x-ndjson"));
        assert_eq!(
            mime_type("t.parquet", None),
            Some("application/vnd.apache.parquet")
        );
        assert_eq!(mime_type("notes.md", None), Some("text/markdown"));
        assert_eq!(mime_type("x.webp", None), Some("image/webp"));
        assert_eq!(
            mime_type("t.feather", None),
            Some("application/vnd.apache.arrow.file")
        );
        // A dot in a directory name, or a leading dot, is no extension.
        assert_eq!(mime_type("v1.2/Makefile", None), None);
        assert_eq!(mime_type(".csv", None), None);
        assert_eq!(mime_type("Makefile", Some(b"all:\n")), Some("text/plain"));
        assert_eq!(
            mime_type("blob", Some(&[0xff, 0xfe])),
            Some("application/octet-stream")
        );
        assert_eq!(mime_type("x.csv", Some(&[0xff])), Some("text/csv"));
    }

    #[test]
    fn percent_decoding() {
        let path = "my report/50% off?#ü.csv";
        let encoded = percent_encode(path);
        assert_eq!(encoded, "my%20report/50%25%20off%3F%23%C3%BC.csv");
        assert_eq!(percent_decode(&encoded).as_deref(), Some(path.as_bytes()));
        assert_eq!(percent_decode("%2e%2E/x").as_deref(), Some(&b"../x"[..]));
        assert_eq!(percent_decode("a%00b").as_deref(), Some(&b"a\0b"[..]));
        assert_eq!(percent_decode("bad%zz"), None);
        assert_eq!(percent_decode("cut%4"), None);
    }

    #[test]
    fn echoes_are_bounded_on_char_boundaries() {
        assert_eq!(truncate_echo("short"), "short");
        let long = "ü".repeat(150);
        let cut = truncate_echo(&long);
        assert_eq!(cut.chars().count(), 101);
        assert!(cut.ends_with('…'));
    }
}
