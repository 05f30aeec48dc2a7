//! The caller's data as MCP resources, so a host can show it to the person without it
//! passing through the model:
//!
//! - stored tables, `dataref://artifacts/{dataRef}`, read as a CSV preview bounded in rows
//!   and bytes (the whole table goes out through `export_data`). Unknown, expired and
//!   someone else's references give the same "resource not found" answer as the store
//!   does, so a reference reveals nothing;
//! - workspace files, `dataref://files/{path}` ([`files`]).
//!
//! `resources/list` gives the tables first (newest first), then the files (newest modified
//! first). The cursor says which part a page starts in: `N` is the N-th table, `files:N`
//! the N-th file; the page that ends the tables fills up with the first files.

pub(crate) mod files;

use dataref_protocol::DataRef;
use dataref_store::{ArtifactMeta, StoreError, Table, cell_to_json};
use dataref_tool::RunContext;
use rmcp::ErrorData as McpError;
use rmcp::model::{
    Annotations, CacheScope, ListResourceTemplatesResult, ListResourcesResult, MetaObject,
    ReadResourceResult, Resource, ResourceContents, ResourceTemplate, Role,
};
use serde_json::{Value, json};

pub(crate) const URI_PREFIX: &str = "dataref://artifacts/";
pub(crate) const URI_TEMPLATE: &str = "dataref://artifacts/{dataRef}";
const CSV: &str = "text/csv";
/// One `resources/list` page.
const LIST_PAGE: usize = 100;
/// A preview is for a person's eyes (or a host's table widget), not a transfer channel.
const PREVIEW_MAX_ROWS: usize = 1_000;
const PREVIEW_MAX_BYTES: usize = 256 * 1024;
/// Echoing a client's junk back is bounded too.
const MAX_ECHO_CHARS: usize = 100;
const FILES_CURSOR: &str = "files:";

pub(crate) fn uri_for(data_ref: &DataRef) -> String {
    format!("{URI_PREFIX}{data_ref}")
}

/// Listings and previews are per principal and change with every fetch: a client may
/// cache them for nobody else and must not treat them as fresh.
const TTL_MS: u64 = 0;

/// Where a `resources/list` page starts.
#[derive(Debug, PartialEq)]
enum Cursor {
    /// At the n-th stored table.
    Artifacts(usize),
    /// At the n-th workspace file, the tables all listed.
    Files(usize),
}

impl Cursor {
    fn parse(cursor: Option<&str>) -> Option<Self> {
        match cursor {
            None => Some(Self::Artifacts(0)),
            Some(c) => match c.strip_prefix(FILES_CURSOR) {
                Some(n) => n.parse().ok().map(Self::Files),
                None => c.parse().ok().map(Self::Artifacts),
            },
        }
    }
}

pub(crate) async fn list(
    ctx: &RunContext,
    cursor: Option<String>,
) -> Result<ListResourcesResult, McpError> {
    let Some(start) = Cursor::parse(cursor.as_deref()) else {
        return Err(McpError::invalid_params(
            "invalid cursor for `resources/list`",
            Some(json!({"hint": "pass the `nextCursor` of the previous page unchanged"})),
        ));
    };
    let mut page = Vec::new();
    let mut next_cursor = None;
    let files_from = match start {
        Cursor::Artifacts(offset) => {
            let store = ctx.store.clone();
            let owner = ctx.principal.clone();
            let (metas, total) =
                blocking(move || store.list(&owner, offset.saturating_add(LIST_PAGE)))
                    .await?
                    .map_err(store_fault)?;
            page.extend(metas.iter().skip(offset).map(resource_for));
            let shown_to = offset.saturating_add(page.len());
            // Newest first, so a page boundary can shift when new artifacts arrive; a
            // listing is a convenience, `list_artifacts` and the dataRefs are the record.
            if (shown_to as u64) < total {
                next_cursor = Some(shown_to.to_string());
                None
            } else {
                Some(0)
            }
        }
        Cursor::Files(offset) => Some(offset),
    };
    let mut meta = None;
    if let Some(offset) = files_from {
        let workspace = ctx.workspace.clone();
        let listing = blocking(move || files::list(&workspace))
            .await?
            .map_err(|e| {
                tracing::error!(error = %e, "workspace listing failed while listing resources");
                McpError::internal_error(
                    "the workspace could not be listed; the details are in the server log",
                    None,
                )
            })?;
        let room = LIST_PAGE.saturating_sub(page.len());
        let before = page.len();
        page.extend(
            listing
                .files
                .iter()
                .skip(offset)
                .take(room)
                .map(files::resource_for),
        );
        let shown_to = offset.saturating_add(page.len() - before);
        if shown_to < listing.files.len() {
            next_cursor = Some(format!("{FILES_CURSOR}{shown_to}"));
        } else if listing.truncated {
            // Never a silent cut: the last page says the listing is not the whole workspace.
            meta = Some(MetaObject(
                json!({
                    "dataref/filesTruncated": true,
                    "dataref/note": format!(
                        "only the {} most recently modified workspace files are listed; \
                         `list_files` finds the others",
                        files::MAX_LISTED
                    ),
                })
                .as_object()
                .cloned()
                .unwrap_or_default(),
            ));
        }
    }
    let mut result = ListResourcesResult::with_all_items(page);
    result.next_cursor = next_cursor;
    result.meta = meta;
    Ok(result
        .with_ttl_ms(TTL_MS)
        .with_cache_scope(CacheScope::Private))
}

pub(crate) fn templates() -> ListResourceTemplatesResult {
    let artifact = ResourceTemplate::new(URI_TEMPLATE, "artifact")
        .with_title("Stored table (CSV preview)")
        .with_description(format!(
            "A table you stored with a producer tool (`fetch_*`, `query`, …), by its dataRef. \
             Reading it gives a CSV preview: the header and at most {PREVIEW_MAX_ROWS} rows \
             ({} KB); `_meta` says how many rows the table has. Only the caller who made it \
             can read it, until it expires.",
            PREVIEW_MAX_BYTES / 1024
        ))
        .with_mime_type(CSV);
    ListResourceTemplatesResult::with_all_items(vec![artifact, files::template()])
}

fn resource_for(meta: &ArtifactMeta) -> Resource {
    let columns = meta.schema.fields().len();
    let mut annotations = Annotations::default().with_audience(vec![Role::User]);
    annotations.last_modified = Some(meta.created_at.to_string());
    Resource::new(uri_for(&meta.data_ref), meta.data_ref.to_string())
        .with_title(format!("{} ({})", meta.lineage.name(), meta.data_ref))
        .with_description(format!(
            "{} × {}, made by `{}`, expires {}. Reading it gives a CSV preview (header and at \
             most {PREVIEW_MAX_ROWS} rows).",
            count(meta.rows, "row"),
            count(columns as u64, "column"),
            meta.lineage.tool,
            meta.expires_at,
        ))
        .with_mime_type(CSV)
        .with_annotations(annotations)
}

fn count(n: u64, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

pub(crate) async fn read(ctx: &RunContext, uri: String) -> Result<ReadResourceResult, McpError> {
    if uri == crate::view::VIEW_URI {
        return Ok(crate::view::read());
    }
    if uri.starts_with(files::URI_PREFIX) {
        return files::read(ctx.workspace.clone(), uri).await;
    }
    let Some(raw) = uri.strip_prefix(URI_PREFIX) else {
        return Err(McpError::resource_not_found(
            format!(
                "no resource `{}`; stored tables are `{URI_TEMPLATE}`, workspace files `{}`",
                echo(&uri),
                files::URI_TEMPLATE
            ),
            Some(json!({"uri": echo(&uri)})),
        ));
    };
    let store = ctx.store.clone();
    let owner = ctx.principal.clone();
    // A malformed reference gets the answer an unknown one gets: nothing to learn here.
    let Ok(data_ref) = DataRef::parse(raw) else {
        return Err(not_found(&uri, echo(raw)));
    };
    let opened = blocking(move || store.open_table(&owner, &data_ref)).await?;
    let table = match opened {
        Ok(t) => t,
        Err(StoreError::NotFound { data_ref }) => return Err(not_found(&uri, data_ref)),
        Err(e) => return Err(store_fault(e)),
    };
    let preview = csv_preview(&table, PREVIEW_MAX_ROWS, PREVIEW_MAX_BYTES);
    let rows = table.meta.rows;
    let note = if preview.rows as u64 >= rows {
        format!("the whole table: {}", count(rows, "row"))
    } else {
        format!(
            "a preview: the first {} of {}; export the table (`export_data`) for all of it",
            preview.rows,
            count(rows, "row")
        )
    };
    let meta = MetaObject(
        json!({
            "dataref/rows": rows,
            "dataref/columns": table.meta.schema.fields().len(),
            "dataref/previewRows": preview.rows,
            "dataref/complete": preview.rows as u64 >= rows,
            "dataref/note": note,
            "dataref/expiresAt": table.meta.expires_at,
        })
        .as_object()
        .cloned()
        .unwrap_or_default(),
    );
    let contents = ResourceContents::text(preview.text, uri)
        .with_mime_type(CSV)
        .with_meta(meta);
    Ok(ReadResourceResult::new(vec![contents])
        .with_ttl_ms(TTL_MS)
        .with_cache_scope(CacheScope::Private))
}

/// The URI `resources/subscribe` keeps for `uri`: a table's or a workspace file's, written
/// the way listings write it. Neither needs to exist yet (a reference reveals nothing, and
/// a file may be written later); a path that could never be inside the workspace, or a
/// URI of no resource of ours, is refused.
pub(crate) fn subscribable(uri: &str) -> Result<String, McpError> {
    if let Some(raw) = uri.strip_prefix(URI_PREFIX) {
        return match DataRef::parse(raw) {
            Ok(data_ref) => Ok(uri_for(&data_ref)),
            Err(_) => Err(not_found(uri, echo(raw))),
        };
    }
    if let Some(raw) = uri.strip_prefix(files::URI_PREFIX) {
        let path = dataref_protocol::percent_decode(raw).and_then(|b| String::from_utf8(b).ok());
        let inside = path.as_deref().is_some_and(|p| {
            !p.is_empty()
                && !p.starts_with('/')
                && !p.contains('\0')
                && p.split('/').all(|c| c != ".." && c != "." && !c.is_empty())
        });
        return match path {
            Some(p) if inside => Ok(files::uri_for(&p)),
            _ => Err(McpError::invalid_params(
                format!("`{}` is not a workspace path", echo(raw)),
                Some(json!({
                    "uri": echo(uri),
                    "hint": "a relative path without `.` or `..` components, percent-encoded as in `resources/list`",
                })),
            )),
        };
    }
    Err(McpError::invalid_params(
        format!("no resource `{}` can be subscribed to", echo(uri)),
        Some(json!({
            "uri": echo(uri),
            "hint": format!("subscribe to a stored table `{URI_TEMPLATE}` or a workspace file `{}`", files::URI_TEMPLATE),
        })),
    ))
}

fn not_found(uri: &str, data_ref: String) -> McpError {
    let e = StoreError::NotFound { data_ref };
    let message = match e.hint() {
        Some(hint) => format!("{e}; {hint}"),
        None => e.to_string(),
    };
    McpError::resource_not_found(message, Some(json!({"uri": echo(uri)})))
}

pub(crate) fn store_fault(e: StoreError) -> McpError {
    if e.is_damage() {
        // Logged where it was found; the reader must know which of their tables and why.
        let message = match e.hint() {
            Some(hint) => format!("{e}; {hint}"),
            None => e.to_string(),
        };
        return McpError::internal_error(message, None);
    }
    tracing::error!(error = %e, "artifact store failed while serving a resource");
    McpError::internal_error(
        "the artifact store failed; the details are in the server log",
        None,
    )
}

pub(crate) fn echo(s: &str) -> String {
    if s.chars().count() <= MAX_ECHO_CHARS {
        s.to_owned()
    } else {
        let kept: String = s.chars().take(MAX_ECHO_CHARS).collect();
        format!("{kept}…")
    }
}

/// Store and workspace calls touch SQLite and files: off the async threads, in the
/// request's span (the store's own spans are its children in a trace).
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, McpError> {
    let span = tracing::Span::current();
    tokio::task::spawn_blocking(move || span.in_scope(f))
        .await
        .map_err(|e| {
            tracing::error!(error = %e, "resource task ended abnormally");
            McpError::internal_error("the server failed while serving a resource", None)
        })
}

#[derive(Debug, PartialEq)]
struct Preview {
    text: String,
    /// Data rows in `text` (the header is not counted).
    rows: usize,
}

/// RFC 4180 CSV: a header, then whole rows while both bounds hold. NULL is an empty
/// field; text is written as is (quoted when it must be); lines end in CRLF.
fn csv_preview(table: &Table, max_rows: usize, max_bytes: usize) -> Preview {
    let mut text = String::new();
    let names: Vec<&str> = table
        .meta
        .schema
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .collect();
    // The header goes in whole even past `max_bytes`: without it the rows mean nothing.
    write_record(&mut text, names.iter().map(|n| (*n).to_owned()));
    let mut rows = 0;
    let mut line = String::new();
    'batches: for batch in &table.batches {
        for row in 0..batch.num_rows() {
            if rows >= max_rows {
                break 'batches;
            }
            line.clear();
            // A cell longer than the whole budget cannot fit, so it need not be copied in full.
            write_record(
                &mut line,
                batch
                    .columns()
                    .iter()
                    .map(|c| cell_text(cell_to_json(c, row, Some(max_bytes)).0)),
            );
            if text.len() + line.len() > max_bytes {
                break 'batches;
            }
            text.push_str(&line);
            rows += 1;
        }
    }
    Preview { text, rows }
}

fn cell_text(v: Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s,
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        other @ (Value::Array(_) | Value::Object(_)) => other.to_string(),
    }
}

fn write_record(out: &mut String, fields: impl Iterator<Item = String>) {
    for (i, field) in fields.enumerate() {
        if i > 0 {
            out.push(',');
        }
        if field.contains([',', '"', '\r', '\n']) {
            out.push('"');
            out.push_str(&field.replace('"', "\"\""));
            out.push('"');
        } else {
            out.push_str(&field);
        }
    }
    out.push_str("\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        let mut s = String::new();
        write_record(
            &mut s,
            ["plain", "a,b", "say \"hi\"", "two\nlines", ""]
                .into_iter()
                .map(String::from),
        );
        assert_eq!(s, "plain,\"a,b\",\"say \"\"hi\"\"\",\"two\nlines\",\r\n");
    }

    #[test]
    fn cells() {
        assert_eq!(cell_text(Value::Null), "");
        assert_eq!(cell_text(json!("x,y")), "x,y");
        assert_eq!(cell_text(json!(1.5)), "1.5");
        assert_eq!(cell_text(json!(true)), "true");
    }

    #[test]
    fn cursors() {
        assert_eq!(Cursor::parse(None), Some(Cursor::Artifacts(0)));
        assert_eq!(Cursor::parse(Some("100")), Some(Cursor::Artifacts(100)));
        assert_eq!(Cursor::parse(Some("files:7")), Some(Cursor::Files(7)));
        assert_eq!(Cursor::parse(Some("files:")), None);
        assert_eq!(Cursor::parse(Some("-1")), None);
        assert_eq!(Cursor::parse(Some("x")), None);
    }

    #[test]
    fn echo_is_bounded() {
        assert_eq!(echo("short"), "short");
        assert_eq!(echo(&"x".repeat(500)).chars().count(), MAX_ECHO_CHARS + 1);
    }
}
