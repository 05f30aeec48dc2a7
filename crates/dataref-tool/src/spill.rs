//! Spill: a tool result longer than the threshold is written to `.spill/` in the caller's
//! workspace before the model sees it, and the model gets the path, the format, the sizes,
//! a short preview and, for a table, the rows and columns the server wrote plus a dataRef.
//!
//! The model then hands the path (or the dataRef) to the next tool instead of writing the
//! data out again as arguments: slow, lossy (models regenerate, they do not copy) and
//! bounded by the output cap.
//!
//! - JSON carried as text (an MCP server's text block) is written as indented JSON, so
//!   line-oriented tools find their way in it; other text is written as it came.
//! - Flat records (an array of objects, or an object's one such array) are also written as
//!   CSV and stored as a table artifact, when the registry was given a [`RecordsCsv`]
//!   (writing CSV is `dataref-export`'s, which the framework does not import; without one
//!   the records stay in the JSON file only).
//! - A failed call's full error text is spilled too; the model gets its first line and
//!   the path.
//! - Spilling never fails a call: when the disk is full the result goes on as it is (and
//!   the result cap still applies), with a warning in the log.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow_array::RecordBatch;
use dataref_config::SpillConfig;
use dataref_protocol::{DataRef, Principal, Timestamp};
use dataref_store::Lineage;
use dataref_workspace::{EntryKind, Overwrite, Swept, Workspace, WorkspacePathError};
use serde::Serialize;
use serde_json::{Value, json};
use tracing::warn;

use crate::{CallOutcome, OutcomeKind, RunContext, ToolRegistry, records};

/// The workspace directory spill files go to.
pub const SPILL_DIR: &str = ".spill";
/// Column names a synopsis lists, at most.
pub const SPILL_COLUMNS_LISTED: usize = 50;

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Writes the flat records found in a spilled result as CSV, beside the JSON. The host
/// gives one to [`ToolRegistryBuilder::records_csv`](crate::ToolRegistryBuilder::records_csv)
/// (the built-in registry gives `dataref-export`'s); without one, records are spilled as
/// JSON only, with no CSV and no table artifact.
pub trait RecordsCsv: Send + Sync {
    /// Writes every row of `batch`, with a header line, to `out`.
    fn write_csv(
        &self,
        batch: &RecordBatch,
        out: &mut (dyn Write + Send),
    ) -> Result<CsvWritten, Box<dyn std::error::Error + Send + Sync>>;
}

/// What a [`RecordsCsv`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsvWritten {
    /// Data rows (the header not counted).
    pub rows: u64,
    /// The column names as written, in order.
    pub columns: Vec<String>,
}

/// What the model gets instead of a spilled result (also its `structuredContent`).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SpillSynopsis {
    /// Always true: tells this apart from the tool's own result.
    pub spilled: bool,
    /// Workspace path of the whole result.
    pub path: String,
    /// `json` or `text`.
    pub format: &'static str,
    pub bytes: u64,
    /// Characters of the result as the model would have read it.
    pub characters: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub table: Option<SpilledTable>,
    /// The first characters of the result.
    pub preview: String,
    pub hint: String,
}

/// Flat records found in a spilled result, as the server wrote them.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SpilledTable {
    pub rows: u64,
    /// The first `SPILL_COLUMNS_LISTED` column names.
    pub columns: Vec<String>,
    /// And this many more columns, in the CSV and the table but not listed.
    #[serde(skip_serializing_if = "is_zero")]
    pub more_columns: u64,
    /// Workspace path of the same rows as CSV.
    pub csv: String,
    /// The rows as a table artifact, for `run_python`, `export_data`, `render_chart`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_ref: Option<DataRef>,
}

/// The schema of [`SpillSynopsis`], one alternative of a spilling tool's output schema.
pub(crate) fn synopsis_schema() -> Value {
    json!({
        "type": "object",
        "description": "The result was longer than the spill threshold and was written to the caller's workspace.",
        "properties": {
            "spilled": {"const": true},
            "path": {"type": "string"},
            "format": {"type": "string", "enum": ["json", "text"]},
            "bytes": {"type": "integer"},
            "characters": {"type": "integer"},
            "table": {
                "type": "object",
                "properties": {
                    "rows": {"type": "integer"},
                    "columns": {"type": "array", "items": {"type": "string"}},
                    "moreColumns": {"type": "integer"},
                    "csv": {"type": "string"},
                    "dataRef": {"type": "string"}
                },
                "required": ["rows", "columns", "csv"]
            },
            "preview": {"type": "string"},
            "hint": {"type": "string"}
        },
        "required": ["spilled", "path", "format", "bytes", "characters", "preview", "hint"]
    })
}

/// Spills `outcome` when its text is longer than `threshold` characters. `structured_text`
/// says the text is the JSON of `outcome.structured` (our own tools), so it need not be
/// parsed again.
pub(crate) async fn spill(
    outcome: CallOutcome,
    tool: &str,
    threshold: usize,
    structured_text: bool,
    registry: &ToolRegistry,
    ctx: &RunContext,
) -> CallOutcome {
    // Bytes bound characters from above: most results skip the count.
    if outcome.text.len() <= threshold {
        return outcome;
    }
    let characters = outcome.text.chars().count();
    if characters <= threshold {
        return outcome;
    }
    let job = Job {
        tool: tool.to_owned(),
        preview_chars: registry.spill_config().preview_chars,
        csv: registry.records_csv(),
        workspace: ctx.workspace.clone(),
        store: ctx.store.clone(),
        principal: ctx.principal.clone(),
        now: ctx.clock.now(),
    };
    let handle = tokio::task::spawn_blocking(move || {
        let written = job.write(&outcome, characters as u64, structured_text);
        (outcome, written)
    });
    let (outcome, written) = match handle.await {
        Ok(r) => r,
        Err(e) => {
            // The outcome went with the task; say what happened rather than lose the call.
            warn!(tool, "spill task ended abnormally: {e}");
            return CallOutcome::error(
                OutcomeKind::ServerFault,
                &format!("the result of `{tool}` was lost while being written to the workspace"),
                Some("call the tool again"),
            );
        }
    };
    match written {
        Ok(spilled) => spilled.into_outcome(outcome),
        Err(e) => {
            warn!(tool, error = %e, "spilling a large result failed; returning it as it is");
            outcome
        }
    }
}

struct Job {
    tool: String,
    preview_chars: usize,
    csv: Option<Arc<dyn RecordsCsv>>,
    workspace: Arc<Workspace>,
    store: Arc<dyn dataref_store::ArtifactStore>,
    principal: dataref_protocol::Principal,
    now: Timestamp,
}

/// What was written, and what to tell the model.
struct Spilled {
    synopsis: SpillSynopsis,
    is_error: bool,
}

#[derive(Debug, thiserror::Error)]
enum SpillError {
    #[error(transparent)]
    Path(#[from] WorkspacePathError),
    #[error("writing {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("writing the CSV: {0}")]
    Csv(Box<dyn std::error::Error + Send + Sync>),
}

impl Job {
    fn write(
        &self,
        outcome: &CallOutcome,
        characters: u64,
        structured_text: bool,
    ) -> Result<Spilled, SpillError> {
        let text = outcome.text.as_str();
        let preview = preview(text, self.preview_chars);
        if outcome.is_error() {
            return self.write_text(text, characters, preview, true);
        }
        // Our own tools' results are already a value; other JSON arrives as text and is
        // indented as text (no tree), parsed only when it may hold records.
        enum Json<'a> {
            Value(&'a Value),
            Text(crate::json_indent::Indented),
        }
        let json = match (&outcome.structured, structured_text) {
            (Some(v), true) if v.is_object() || v.is_array() => Some(Json::Value(v)),
            _ if is_json_document(text) => Some(Json::Text(crate::json_indent::indent(text))),
            _ => None,
        };
        let Some(json) = json else {
            return self.write_text(text, characters, preview, false);
        };
        let (path, bytes) = self.write_file("json", |w| {
            match &json {
                Json::Value(v) => serde_json::to_writer_pretty(&mut *w, v)?,
                Json::Text(t) => w.write_all(&t.bytes)?,
            }
            w.write_all(b"\n")
        })?;
        let parsed;
        let value = match json {
            Json::Value(v) => Some(v),
            Json::Text(t) if t.maybe_records => {
                parsed = serde_json::from_str::<Value>(text).ok();
                parsed.as_ref()
            }
            Json::Text(_) => None,
        };
        let table = match &self.csv {
            Some(csv) => value
                .and_then(records::find_records)
                .and_then(records::records_to_batch)
                .map(|batch| self.write_table(csv.as_ref(), &path, &batch))
                .transpose()?,
            None => None,
        };
        let hint = match &table {
            Some(t) => table_hint(&path, t),
            None => text_hint(&path),
        };
        Ok(Spilled {
            synopsis: SpillSynopsis {
                spilled: true,
                path,
                format: "json",
                bytes,
                characters,
                table,
                preview,
                hint,
            },
            is_error: false,
        })
    }

    /// The result (or the error) as it came, in a `.txt` file.
    fn write_text(
        &self,
        text: &str,
        characters: u64,
        preview: String,
        is_error: bool,
    ) -> Result<Spilled, SpillError> {
        let (path, bytes) = self.write_file("txt", |w| w.write_all(text.as_bytes()))?;
        let hint = if is_error {
            format!(
                "the whole error ({characters} characters) is in `{path}`: read it with read_file before changing anything"
            )
        } else {
            text_hint(&path)
        };
        Ok(Spilled {
            synopsis: SpillSynopsis {
                spilled: true,
                path,
                format: "text",
                bytes,
                characters,
                table: None,
                preview,
                hint,
            },
            is_error,
        })
    }

    /// Writes a new file in `.spill/`, named by the time, the tool and a counter.
    fn write_file(
        &self,
        ext: &str,
        body: impl Fn(&mut BufWriter<&mut dataref_workspace::AtomicFile>) -> std::io::Result<()>,
    ) -> Result<(String, u64), SpillError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        loop {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let name = format!(
                "{SPILL_DIR}/{}-{}-{n}.{ext}",
                self.now.compact(),
                safe_name(&self.tool)
            );
            let mut file = match self.workspace.create_atomic(&name, Overwrite::Refuse) {
                Ok(f) => f,
                // Another server process wrote this name: take the next number.
                Err(WorkspacePathError::AlreadyExists { .. }) => continue,
                Err(e) => return Err(e.into()),
            };
            let shown = file.path().as_str().to_owned();
            let mut w = BufWriter::new(&mut file);
            body(&mut w)
                .and_then(|()| w.flush())
                .map_err(|source| SpillError::Write {
                    path: shown.clone(),
                    source,
                })?;
            drop(w);
            let path = match file.commit_unsynced() {
                Ok(path) => path,
                // Another replica took the name between the look and the commit (with a
                // shared workspace the index decides): write it again under the next one.
                Err(WorkspacePathError::AlreadyExists { .. }) => continue,
                Err(e) => return Err(e.into()),
            };
            let bytes = self.workspace.metadata(&path)?.size;
            return Ok((path.as_str().to_owned(), bytes));
        }
    }

    /// The records as CSV beside the JSON, and as a table artifact (best effort: a store
    /// that refuses, e.g. over quota, leaves the CSV without a dataRef).
    fn write_table(
        &self,
        writer: &dyn RecordsCsv,
        json_path: &str,
        batch: &RecordBatch,
    ) -> Result<SpilledTable, SpillError> {
        let csv_name = match json_path.strip_suffix(".json") {
            Some(stem) => format!("{stem}.csv"),
            None => format!("{json_path}.csv"),
        };
        let mut file = self.workspace.create_atomic(&csv_name, Overwrite::Refuse)?;
        let mut w = BufWriter::new(&mut file);
        let exported = writer.write_csv(batch, &mut w).map_err(SpillError::Csv)?;
        w.flush().map_err(|source| SpillError::Write {
            path: csv_name.clone(),
            source,
        })?;
        drop(w);
        let csv = file.commit_unsynced()?.as_str().to_owned();
        let lineage = Lineage::new(self.tool.clone(), json!({ "spilledTo": json_path }));
        let data_ref = match self.store_table(batch, lineage) {
            Ok(r) => Some(r),
            Err(e) => {
                warn!(tool = %self.tool, error = %e, "spilled records not stored as an artifact");
                None
            }
        };
        let mut columns = exported.columns;
        let more_columns = columns.len().saturating_sub(SPILL_COLUMNS_LISTED) as u64;
        columns.truncate(SPILL_COLUMNS_LISTED);
        Ok(SpilledTable {
            rows: exported.rows,
            columns,
            more_columns,
            csv,
            data_ref,
        })
    }

    fn store_table(
        &self,
        batch: &RecordBatch,
        lineage: Lineage,
    ) -> Result<DataRef, dataref_store::StoreError> {
        let mut writer = self
            .store
            .create_table(&self.principal, batch.schema(), lineage)?;
        writer.write(batch)?;
        Ok(writer.finish()?.data_ref)
    }
}

impl Spilled {
    fn into_outcome(self, original: CallOutcome) -> CallOutcome {
        let Spilled { synopsis, is_error } = self;
        if is_error {
            let text = format!(
                "error (cut; the whole text is in `{}`):\n{}…\nhint: {}",
                synopsis.path, synopsis.preview, synopsis.hint
            );
            return CallOutcome {
                call_id: original.call_id,
                kind: original.kind,
                structured: None,
                text,
                attachments: original.attachments,
            };
        }
        let structured = serde_json::to_value(&synopsis).unwrap_or(Value::Null);
        CallOutcome {
            call_id: original.call_id,
            kind: OutcomeKind::Spilled,
            text: structured.to_string(),
            structured: Some(structured),
            attachments: original.attachments,
        }
    }
}

fn text_hint(path: &str) -> String {
    format!(
        "the whole result is in `{path}`: read parts with read_file, or pass the path to \
         run_python (`files`) or export_data (`source`). To send it to another tool, write \
         that tool's arguments to a JSON file with run_python and use call_tool — do not \
         copy the data into arguments."
    )
}

fn table_hint(path: &str, table: &SpilledTable) -> String {
    let by_ref = match &table.data_ref {
        Some(r) => format!(
            "pass `{r}` to run_python (`inputs`), render_chart, render_table or export_data"
        ),
        None => format!("pass `{}` to export_data (`source`)", table.csv),
    };
    format!(
        "the whole result is in `{path}` and its {} rows in `{}`: {by_ref}; count and sum with \
         run_python, never by reading rows. Do not copy the data into arguments.",
        table.rows, table.csv
    )
}

/// `text` is one JSON object or array (checked without building a tree).
fn is_json_document(text: &str) -> bool {
    matches!(text.trim_start().as_bytes().first(), Some(b'{' | b'['))
        && serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok()
}

/// The first `chars` characters, cut at a character boundary.
fn preview(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((i, _)) => text[..i].to_owned(),
        None => text.to_owned(),
    }
}

/// A tool name as a file name part: letters, digits, `_` and `-`, at most 64.
fn safe_name(tool: &str) -> String {
    tool.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect()
}

/// Removes spill files older than `retention` from the workspace (copies a person keeps
/// live elsewhere and are not touched).
pub fn sweep_spill(
    workspace: &Workspace,
    now: Timestamp,
    retention: std::time::Duration,
) -> Result<Swept, WorkspacePathError> {
    let cutoff = Timestamp(now.0.saturating_sub(retention.as_secs() as i64));
    workspace.remove_old_files(SPILL_DIR, cutoff)
}

/// Sweeps `workspace`'s spill files now and then every `config.sweep_interval`, for as
/// long as the runtime runs (one principal per process: `serve` on stdio).
pub fn spawn_spill_sweeper(
    workspace: Arc<Workspace>,
    clock: Arc<dyn dataref_store::Clock>,
    config: &SpillConfig,
) {
    let retention = config.retention;
    spawn_every(config.sweep_interval, move || {
        sweep_spill(&workspace, clock.now(), retention).map_err(|e| e.to_string())
    });
}

/// Sweeps the spill files of every principal's workspace under the data directory
/// (`<home>/workspaces/*`) now and then every `config.sweep_interval` (one process for
/// many principals: `serve --http`).
pub fn spawn_all_spill_sweeper(
    home: PathBuf,
    clock: Arc<dyn dataref_store::Clock>,
    config: &SpillConfig,
) {
    let retention = config.retention;
    spawn_every(config.sweep_interval, move || {
        sweep_all_spill(&home, clock.now(), retention)
    });
}

/// Removes spill files older than `retention` from every principal's workspace under
/// `home`. A workspace that cannot be swept is logged and skipped; the error is only for
/// a `workspaces` directory that exists and cannot be listed.
pub fn sweep_all_spill(
    home: &Path,
    now: Timestamp,
    retention: std::time::Duration,
) -> Result<Swept, String> {
    let parent = home.join("workspaces");
    // Opened as a workspace so the listing is the sealed, link-refusing one; each
    // principal's directory is then opened the way a request opens it.
    let workspaces = match Workspace::open(&parent) {
        Ok(w) => w,
        // No workspace yet: nothing to sweep.
        Err(dataref_workspace::WorkspaceError::Open { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            return Ok(Swept::default());
        }
        Err(e) => return Err(e.to_string()),
    };
    let listing = workspaces
        .list_dir(&workspaces.root_path(), MAX_SWEPT_WORKSPACES)
        .map_err(|e| e.to_string())?;
    let mut total = Swept::default();
    for entry in listing.entries {
        if entry.kind != EntryKind::Directory {
            continue;
        }
        let Ok(principal) = Principal::new(entry.path.as_str()) else {
            continue;
        };
        let swept = Workspace::for_principal(home, &principal)
            .map_err(|e| e.to_string())
            .and_then(|w| sweep_spill(&w, now, retention).map_err(|e| e.to_string()));
        match swept {
            Ok(s) => {
                total.removed += s.removed;
                total.bytes += s.bytes;
            }
            Err(e) => warn!(%principal, "sweeping spill files failed: {e}"),
        }
    }
    if listing.truncated {
        warn!("more than {MAX_SWEPT_WORKSPACES} workspaces; the others were not swept this time");
    }
    Ok(total)
}

/// Workspaces one sweep visits.
const MAX_SWEPT_WORKSPACES: usize = 100_000;

fn spawn_every(
    interval: std::time::Duration,
    sweep: impl Fn() -> Result<Swept, String> + Send + Sync + 'static,
) {
    let sweep = Arc::new(sweep);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        loop {
            tick.tick().await;
            let s = sweep.clone();
            match tokio::task::spawn_blocking(move || s()).await {
                Ok(Ok(s)) if s.removed > 0 => {
                    tracing::info!(
                        removed = s.removed,
                        bytes = s.bytes,
                        "swept old spill files"
                    )
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => warn!("sweeping spill files failed: {e}"),
                Err(e) => warn!("spill sweeper task ended abnormally: {e}"),
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[expect(
        clippy::disallowed_methods,
        reason = "the fixture writes spill files directly"
    )]
    fn every_workspace_under_home_is_swept() {
        let home = tempfile::tempdir().unwrap();
        for name in ["eu_analyst", "us_analyst"] {
            let p = Principal::new(name).unwrap();
            Workspace::for_principal(home.path(), &p).unwrap();
            let dir = home.path().join("workspaces").join(name).join(SPILL_DIR);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("old.json"), "[]").unwrap();
        }
        // Not a workspace: left alone.
        std::fs::write(home.path().join("workspaces/notes.txt"), "x").unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let week = std::time::Duration::from_secs(7 * 86_400);
        let swept = sweep_all_spill(home.path(), Timestamp(now), week).unwrap();
        assert_eq!(swept.removed, 0, "younger than the retention");
        let swept = sweep_all_spill(home.path(), Timestamp(now + 8 * 86_400), week).unwrap();
        assert_eq!(swept.removed, 2);
        assert!(home.path().join("workspaces/notes.txt").exists());
        let fresh = tempfile::tempdir().unwrap();
        let swept = sweep_all_spill(fresh.path(), Timestamp(now), week).unwrap();
        assert_eq!(swept.removed, 0, "no workspaces yet");
    }

    #[test]
    fn names_and_previews() {
        assert_eq!(safe_name("up/x tool"), "up_x_tool");
        assert_eq!(preview("héllo", 2), "hé");
        assert_eq!(preview("hé", 5), "hé");
    }

    #[test]
    fn widened_schema_admits_both() {
        let own =
            json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
        let wide = crate::cap::widen_output_schema(own, true);
        let v = jsonschema::validator_for(&wide).unwrap();
        assert!(v.is_valid(&json!({"n": 1})));
        let synopsis = SpillSynopsis {
            spilled: true,
            path: ".spill/x.json".into(),
            format: "json",
            bytes: 10,
            characters: 10,
            table: None,
            preview: "[".into(),
            hint: "h".into(),
        };
        assert!(v.is_valid(&serde_json::to_value(&synopsis).unwrap()));
        assert!(!v.is_valid(&json!({"other": 1})));
    }
}
