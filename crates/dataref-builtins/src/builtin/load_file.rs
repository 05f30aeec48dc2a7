//! `load_file(path, …)`: a workspace file — uploaded, exported, spilled or written by
//! `run_python` — read by `dataref-load` and streamed into a new table of the caller's,
//! described like a producer's result. Nothing is stored unless every row was read.

use std::collections::BTreeMap;

use async_trait::async_trait;
use dataref_load::{ColumnKind, Decimal, Format, LoadError, LoadOptions, Sheet, TextEncoding};
use dataref_protocol::{Description, ToolSpec};
use dataref_store::{Lineage, SampleOptions, describe};
use dataref_tool::{RunContext, ToolError, ToolOutput, TypedTool};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::support::{blocking, output, spec_for};

const DESCRIPTION: &str = "Store a workspace file (CSV, TSV, XLSX, Parquet, Arrow, JSON, NDJSON) \
as a table, like a query's result. Encoding, delimiter, header and types are detected; \
override them only when wrong.";

/// Rows in the description's sample: a producer's default (`[sources.*] sample_rows`).
const SAMPLE_ROWS: usize = 2;
/// Characters of a sampled value, as a producer's default.
const SAMPLE_VALUE_CHARS: usize = 80;

/// Arguments of `load_file`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LoadFileArgs {
    /// Relative to your workspace.
    path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    format: Option<Format>,
    /// XLSX: name or 0-based index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sheet: Option<Sheet>,
    /// First row is the header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    header: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1))]
    delimiter: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    encoding: Option<TextEncoding>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    decimal: Option<Decimal>,
    /// Column → type, where detection is wrong.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    columns: BTreeMap<String, ColumnKind>,
}

impl LoadFileArgs {
    fn options(&self) -> Result<LoadOptions, ToolError> {
        let delimiter = match self.delimiter.as_deref() {
            None => None,
            Some(d) => match d.as_bytes() {
                [b] if b.is_ascii() && *b != b'"' && *b != b'\n' && *b != b'\r' => Some(*b),
                _ => {
                    return Err(ToolError::respond(
                        format!("`{d}` cannot be a delimiter"),
                        Some("pass one ASCII character, such as `,`, `;`, `|` or a tab".into()),
                    ));
                }
            },
        };
        Ok(LoadOptions {
            format: self.format,
            delimiter,
            header: self.header,
            encoding: self.encoding,
            decimal: self.decimal,
            sheet: self.sheet.clone(),
            columns: self.columns.clone(),
            ..LoadOptions::default()
        })
    }
}

pub struct LoadFileTool {
    spec: ToolSpec,
}

impl LoadFileTool {
    /// Read-only, like a query: it reads a workspace file and makes a table of the caller's
    /// (as `fetch_*` and `run_sql` do); it writes nothing into the workspace.
    pub fn new() -> Self {
        Self {
            spec: spec_for::<LoadFileArgs, Description>("load_file", DESCRIPTION, true, false)
                .with_view(dataref_protocol::VIEW_URI),
        }
    }
}

impl Default for LoadFileTool {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl TypedTool for LoadFileTool {
    /// A synopsis made for the model: never spilled by default.
    fn result_is_synopsis(&self) -> bool {
        true
    }

    type Args = LoadFileArgs;

    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, a: LoadFileArgs, ctx: &RunContext) -> Result<ToolOutput, ToolError> {
        let options = a.options()?;
        let workspace = ctx.workspace.clone();
        let store = ctx.store.clone();
        let owner = ctx.principal.clone();
        let progress = ctx.progress.clone();
        let cancel = ctx.cancel.clone();
        let lineage = Lineage::new("load_file", serde_json::to_value(&a).unwrap_or_default());
        let receipt = crate::receipt::started(ctx);
        let d = blocking("load_file", move || {
            let path = workspace.resolve(&a.path)?;
            let file = workspace.open_read(&path)?;
            let hashed = file
                .try_clone()
                .map_err(|e| load_error(&a.path, LoadError::Io(e)))?;
            let is_cancelled = || cancel.is_cancelled();
            let mut opened = dataref_load::open(file, path.as_str(), &options, &is_cancelled)
                .map_err(|e| load_error(&a.path, e))?;
            // The bytes the table is read from, hashed through the same open file. The load
            // is refused if the file is written to after `open` began, so the hash and the
            // rows are of one version of it.
            let read = file_read(&hashed, path.as_str()).map_err(|e| load_error(&a.path, e))?;
            let lineage = lineage.with_receipt(dataref_protocol::Receipt {
                file: Some(read),
                ..receipt
            });
            let total = opened.rows.map(|r| r as f64);
            let report = |rows: u64| {
                progress.report(rows as f64, total, Some(format!("{rows} rows loaded")));
            };
            let meta = load_into(
                store.as_ref(),
                &owner,
                opened.batches.as_mut(),
                lineage,
                &report,
                &is_cancelled,
            )
            .map_err(|e| match e {
                Loaded::Read(e) => load_error(&a.path, e),
                Loaded::Store(e) => e.into(),
            })?;
            let table = store.map_table(&owner, &meta.data_ref)?.head(SAMPLE_ROWS)?;
            let mut d = describe(
                &table,
                SampleOptions {
                    rows: SAMPLE_ROWS,
                    max_value_chars: SAMPLE_VALUE_CHARS,
                },
            );
            d.notes = opened.notes;
            Ok(d)
        })
        .await?;
        output(d)
    }
}

/// `file`'s size and content hash, for the receipt (read by offset, on every core).
fn file_read(file: &std::fs::File, path: &str) -> Result<dataref_protocol::FileRead, LoadError> {
    let (bytes, checksum) = dataref_store::Checksum::of_file(file).map_err(LoadError::Io)?;
    Ok(dataref_protocol::FileRead {
        path: path.to_owned(),
        bytes,
        checksum: checksum.to_string(),
    })
}

/// Why [`load_into`] stored nothing.
#[derive(Debug)]
pub enum Loaded {
    /// Reading the file failed (or the load was cancelled).
    Read(LoadError),
    /// The store refused the table (its size cap, the owner's quota, the disk).
    Store(dataref_store::StoreError),
}

/// Batches in flight between reading the file and writing the store.
const IN_FLIGHT: usize = 2;

/// Stores every batch of `batches` as a new table of `owner`'s. The store writes on a
/// thread of its own while the next batch is read, so parsing and encoding overlap. On any
/// error or a cancellation the partial table is removed: nothing is stored unless every
/// row was read. `progress` gets the rows stored so far.
pub fn load_into(
    store: &dyn dataref_store::ArtifactStore,
    owner: &dataref_protocol::Principal,
    batches: &mut dyn dataref_load::Batches,
    lineage: Lineage,
    progress: &(dyn Fn(u64) + Sync),
    cancelled: &(dyn Fn() -> bool + Sync),
) -> Result<dataref_store::ArtifactMeta, Loaded> {
    // Dropped without `finish` on any error: the partial table is removed.
    let mut writer = store
        .create_table(owner, batches.schema(), lineage)
        .map_err(Loaded::Store)?;
    std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<arrow_array::RecordBatch>(IN_FLIGHT);
        let written = std::thread::Builder::new()
            .name("dataref-load-write".into())
            .spawn_scoped(scope, move || -> Result<_, Loaded> {
                while let Ok(batch) = rx.recv() {
                    writer.write(&batch).map_err(Loaded::Store)?;
                    progress(writer.rows());
                }
                Ok(writer)
            })
            .map_err(|e| Loaded::Read(LoadError::Io(e)))?;
        let read = (|| {
            while let Some(batch) = batches.next_batch().map_err(Loaded::Read)? {
                if cancelled() {
                    return Err(Loaded::Read(LoadError::Cancelled));
                }
                // A closed queue: the writer failed, and its error is the one to report.
                if tx.send(batch).is_err() {
                    break;
                }
            }
            Ok(())
        })();
        drop(tx);
        let writer = written.join().map_err(|_| {
            Loaded::Read(LoadError::Io(std::io::Error::other(
                "the table's writer ended abnormally",
            )))
        })?;
        read?;
        writer?.finish().map_err(Loaded::Store)
    })
}

/// A load's error as the model sees it: the file named, what went wrong where, and what
/// to change.
fn load_error(path: &str, e: LoadError) -> ToolError {
    match e {
        LoadError::Cancelled => ToolError::respond("the load was cancelled", None),
        LoadError::Io(io) => ToolError::Fatal(format!("reading `{path}`: {io}")),
        other => {
            let hint = other.hint();
            ToolError::respond(format!("`{path}`: {other}"), hint)
        }
    }
}
