//! `export_data(source, format, …)`: a stored table written to a file in the caller's
//! workspace (`exports/`) for the person: CSV, XLSX, Parquet, JSON or NDJSON.

use std::collections::BTreeMap;

use async_trait::async_trait;
use dataref_export::{Bom, ExportError, ExportOptions, Format, Formulas, SortBy};
use dataref_protocol::{DataRef, ToolSpec};
use dataref_workspace::{Overwrite, Workspace, WorkspacePath, WorkspacePathError};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::replay::{Replay, py_list, py_str, py_value, tick};
use crate::support::{blocking, spec_for};
use dataref_tool::TypedTool;
use dataref_tool::records::{find_records, records_to_batch};
use dataref_tool::{Attachment, RunContext, ToolError, ToolOutput};
use std::fmt::Write as _;

/// Where exports go in the workspace.
pub const EXPORTS_DIR: &str = "exports";
/// Tries at a free name (`name.csv`, `name-2.csv`, …) before giving up.
const NAME_TRIES: u32 = 100;

// File formats of `export_data` (no doc comment: it would be listed as the argument's).
#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
enum FormatArg {
    Csv,
    Xlsx,
    Parquet,
    Json,
    Ndjson,
}

impl FormatArg {
    fn format(self) -> Format {
        match self {
            Self::Csv => Format::Csv,
            Self::Xlsx => Format::Xlsx,
            Self::Parquet => Format::Parquet,
            Self::Json => Format::Json,
            Self::Ndjson => Format::Ndjson,
        }
    }
}

/// Arguments of `export_data`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExportArgs {
    /// A dataRef, or a workspace table file (`.arrow`, `.csv`, `.json`, `.ndjson`).
    source: String,
    format: FormatArg,
    /// These columns, in order (default: all).
    #[serde(default)]
    columns: Option<Vec<String>>,
    /// New names by column, e.g. `{"revenue": "Revenue (EUR)"}`.
    #[serde(default)]
    headers: Option<BTreeMap<String, String>>,
    /// Sort rows by this column.
    #[serde(default)]
    sort_by: Option<String>,
    #[serde(default)]
    descending: Option<bool>,
    #[serde(default)]
    offset: Option<u64>,
    #[serde(default)]
    limit: Option<u64>,
    /// A name without directory or extension, e.g. `q3-sales`.
    #[serde(default)]
    filename: Option<String>,
    /// CSV: a UTF-8 byte order mark, for Excel.
    #[serde(default)]
    bom: Option<bool>,
}

#[derive(Debug, Serialize, JsonSchema)]
struct ExportResult {
    /// The file, relative to your workspace (linked for the person).
    path: String,
    /// Data rows written.
    rows: u64,
    /// The file's size.
    bytes: u64,
    /// XLSX: worksheets (a sheet holds 1,048,575 rows; more continue on the next).
    #[serde(skip_serializing_if = "Option::is_none")]
    sheets: Option<usize>,
}

pub struct ExportDataTool {
    spec: ToolSpec,
}

impl ExportDataTool {
    pub fn new() -> Self {
        Self {
            spec: spec_for::<ExportArgs, ExportResult>(
                "export_data",
                "Write a stored table to a file under `exports/` for the person, by reference: \
                 the rows never pass through you, and the person gets a link. Choose, rename, \
                 sort and page columns and rows here; filter or aggregate first (SQL or \
                 `run_python`) and export the dataRef that returns.",
                false,
                false,
            ),
        }
    }
}

#[async_trait]
impl TypedTool for ExportDataTool {
    /// A synopsis made for the model: never spilled by default.
    fn result_is_synopsis(&self) -> bool {
        true
    }

    type Args = ExportArgs;

    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, a: ExportArgs, ctx: &RunContext) -> Result<ToolOutput, ToolError> {
        let format = a.format.format();
        let stem = match &a.filename {
            Some(name) => file_stem(name, format)?,
            None => generated_stem(ctx.clock.now().0),
        };
        let options = ExportOptions {
            columns: a.columns,
            headers: a.headers.unwrap_or_default(),
            sort: a
                .sort_by
                .map(|column| SortBy::new(column, a.descending.unwrap_or(false))),
            rows: None,
            offset: a.offset.unwrap_or(0),
            limit: a.limit,
            bom: if a.bom.unwrap_or(false) {
                Bom::With
            } else {
                Bom::Without
            },
            formulas: Formulas::Neutralise,
        };
        let (store, owner, workspace) = (
            ctx.store.clone(),
            ctx.principal.clone(),
            ctx.workspace.clone(),
        );
        let cancel = ctx.cancel.clone();
        let source = a.source;
        let result = blocking("export_data", move || {
            let (schema, batches) = if source.starts_with("data_") {
                let data_ref = DataRef::parse(&source).map_err(|_| {
                    ToolError::respond(
                        format!("`{source}` is not a valid dataRef"),
                        Some(
                            "pass a `dataRef` exactly as a tool returned it (`data_` and 22 \
                             characters), or call `list_artifacts`"
                                .into(),
                        ),
                    )
                })?;
                let table = store.open_table(&owner, &data_ref)?;
                (table.meta.schema, table.batches)
            } else {
                read_table_file(&workspace, &source)?
            };
            let (mut file, mut n) = create_free(&workspace, &stem, format)?;
            let target = file.path().as_str().to_owned();
            let done =
                dataref_export::export(format, &schema, &batches, &options, &mut file, &|| {
                    cancel.is_cancelled()
                })
                .map_err(|e| match file.quota_refusal() {
                    // The workspace quota refused a write: the model can free space. Asked
                    // of the file, since the XLSX and Parquet encoders wrap the I/O error.
                    Some(refusal) => WorkspacePathError::write_failed(
                        &target,
                        std::io::Error::other(refusal.clone()),
                    )
                    .into(),
                    None => export_error(e),
                })?;
            // Another export may have taken the free name while this one was written.
            let path = file.commit_renumbered(|| {
                n += 1;
                (n <= NAME_TRIES).then(|| numbered(&stem, n, format))
            })?;
            let bytes = workspace.metadata(&path)?.size;
            Ok(ExportResult {
                path: path.as_str().to_owned(),
                rows: done.rows,
                bytes,
                sheets: matches!(format, Format::Xlsx).then_some(done.sheets),
            })
        })
        .await?;
        let name = result
            .path
            .rsplit('/')
            .next()
            .unwrap_or(&result.path)
            .to_owned();
        let link = Attachment::ResourceLink {
            uri: format!("dataref://files/{}", result.path),
            name,
            // `resources/read` gives the type; 20-odd bytes fewer in the model's context.
            mime_type: None,
            description: None,
        };
        let structured = serde_json::to_value(&result)
            .map_err(|e| ToolError::Fatal(format!("serialising the result: {e}")))?;
        // The link is the whole content (the path is in its URI); no text block repeats
        // `structuredContent`, whose copy a host passing every block would also send.
        Ok(ToolOutput {
            structured,
            attachments: vec![link],
            text: Some(String::new()),
        })
    }
}

/// The model's file name, checked: one plain name, the format's extension optional.
fn file_stem(name: &str, format: Format) -> Result<String, ToolError> {
    let ext = format!(".{}", format.extension());
    let stem = match name.len().checked_sub(ext.len()) {
        Some(cut) if name.is_char_boundary(cut) && name[cut..].eq_ignore_ascii_case(&ext) => {
            &name[..cut]
        }
        _ => name,
    };
    let bad = stem.is_empty()
        || stem.starts_with('.')
        || stem.chars().count() > 120
        || stem
            .chars()
            .any(|c| c == '/' || c == '\\' || c.is_control());
    if bad {
        return Err(ToolError::respond(
            format!("`{name}` cannot be an export's file name"),
            Some(format!(
                "give a plain name such as `q3-sales` (no `/`, not starting with `.`, at most \
                 120 characters); the file goes to `{EXPORTS_DIR}/` and gets `{ext}`; use \
                 `copy_file` afterwards to put it elsewhere"
            )),
        ));
    }
    Ok(stem.to_owned())
}

/// `export-20251231-235959` for the given time (seconds since the epoch, UTC).
fn generated_stem(now_secs: i64) -> String {
    let iso = dataref_store::format_timestamp_micros(now_secs.saturating_mul(1_000_000));
    let compact: String = iso
        .chars()
        .map(|c| if c == 'T' { '-' } else { c })
        .filter(|c| c.is_ascii_digit() || *c == '-')
        .collect();
    // `2025-12-31-23:59:59` → `20251231-235959`
    let (date, time) = compact.split_at(compact.len().min(10));
    format!(
        "export-{}-{}",
        date.replace('-', ""),
        time.trim_start_matches('-')
    )
}

/// A new file `exports/<stem>.<ext>`, or `<stem>-2`, `<stem>-3`, … when that exists, and
/// the number it has (1 for none).
fn create_free(
    workspace: &Workspace,
    stem: &str,
    format: Format,
) -> Result<(dataref_workspace::AtomicFile, u32), ToolError> {
    for n in 1..=NAME_TRIES {
        let path = format!("{EXPORTS_DIR}/{}", numbered(stem, n, format));
        match workspace.create_atomic(&path, Overwrite::Refuse) {
            Ok(file) => return Ok((file, n)),
            Err(WorkspacePathError::AlreadyExists { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let ext = format.extension();
    Err(ToolError::respond(
        format!("`{EXPORTS_DIR}/{stem}.{ext}` and {NAME_TRIES} numbered variants exist already"),
        Some("pick another `filename`".into()),
    ))
}

/// `<stem>.<ext>` for 1, `<stem>-<n>.<ext>` after.
fn numbered(stem: &str, n: u32, format: Format) -> String {
    let ext = format.extension();
    if n == 1 {
        format!("{stem}.{ext}")
    } else {
        format!("{stem}-{n}.{ext}")
    }
}

/// A JSON source is parsed whole, and parsed JSON takes several times its size in memory,
/// so it is bounded well below what a streamed CSV may be.
const MAX_JSON_SOURCE_BYTES: u64 = 256 << 20;

/// The layouts of table files `export_data` reads.
#[derive(Debug, Clone, Copy)]
enum FileLayout {
    /// Arrow IPC (`.arrow`, `.feather`).
    Arrow,
    /// CSV or TSV with a header row.
    Delimited(u8),
    Json(JsonLayout),
}

/// How a JSON table file holds its records.
#[derive(Debug, Clone, Copy)]
enum JsonLayout {
    /// One document: an array of flat objects, or an object with one field holding one.
    Document,
    /// One flat object per line (NDJSON, JSON Lines).
    Lines,
}

/// The batches of a tabular file in the workspace: Arrow IPC (`.arrow`, `.feather`), CSV /
/// TSV with a header row (column types inferred from the first 10,000 rows), or JSON
/// records (`.json`, `.ndjson`, `.jsonl`; types from all the values, see `records`).
fn read_table_file(
    workspace: &Workspace,
    source: &str,
) -> Result<(arrow_schema::SchemaRef, Vec<arrow_array::RecordBatch>), ToolError> {
    let ext = source
        .rsplit_once('.')
        .map(|(_, ext)| ext.to_ascii_lowercase())
        .unwrap_or_default();
    let layout = match ext.as_str() {
        "arrow" | "feather" => FileLayout::Arrow,
        "csv" => FileLayout::Delimited(b','),
        "tsv" => FileLayout::Delimited(b'\t'),
        "json" => FileLayout::Json(JsonLayout::Document),
        "ndjson" | "jsonl" => FileLayout::Json(JsonLayout::Lines),
        _ => {
            return Err(ToolError::respond(
                format!(
                    "`{source}` is neither a dataRef nor a tabular file this tool reads \
                     (`.arrow`, `.csv`, `.tsv`, `.json`, `.ndjson`, `.jsonl`)"
                ),
                Some(
                    "pass a `dataRef` (`data_…`), or load the file with `run_python` \
                     (`outputs[\"t\"] = pd.read_excel(...)`) and export the dataRef it returns"
                        .into(),
                ),
            ));
        }
    };
    let path = workspace.resolve(source)?;
    let file = workspace.open_read(&path)?;
    let unreadable = |e: arrow_schema::ArrowError| {
        ToolError::respond(
            format!("`{path}` could not be read as a table: {e}"),
            Some(
                "pass a `dataRef`, or load the file with `run_python` and export the \
                 dataRef it returns"
                    .into(),
            ),
        )
    };
    match layout {
        FileLayout::Arrow => {
            // Anyone (the model's code, an upload) may have written this file: its structure
            // is checked before the Arrow reader sees it, and every reader step runs under
            // `catch_unwind`.
            let malformed = |e: dataref_store::MalformedIpc| {
                ToolError::respond(
                    format!("your file `{path}` is malformed: {e}"),
                    Some(
                        "write it again with `pyarrow.ipc.new_file` (or `df.to_feather(path, \
                         compression=\"uncompressed\")`), or pass a `dataRef`"
                            .into(),
                    ),
                )
            };
            let table = dataref_store::UntrustedIpc::open(file).map_err(malformed)?;
            let schema = table.schema();
            let batches = table
                .batches()
                .map_err(malformed)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(malformed)?;
            Ok((schema, batches))
        }
        FileLayout::Delimited(delimiter) => {
            let mut file = file;
            let format = arrow_csv::reader::Format::default()
                .with_header(true)
                .with_delimiter(delimiter);
            let (schema, _) = format
                .infer_schema(&mut file, Some(10_000))
                .map_err(unreadable)?;
            std::io::Seek::rewind(&mut file)
                .map_err(|e| ToolError::Fatal(format!("rewinding `{path}`: {e}")))?;
            let schema = std::sync::Arc::new(schema);
            let reader = arrow_csv::ReaderBuilder::new(schema.clone())
                .with_format(format)
                .with_batch_size(65_536)
                .build(file)
                .map_err(unreadable)?;
            let batches = reader.collect::<Result<Vec<_>, _>>().map_err(unreadable)?;
            Ok((schema, batches))
        }
        FileLayout::Json(json) => {
            let batch = read_json_records(file, &path, json)?;
            Ok((batch.schema(), vec![batch]))
        }
    }
}

/// The flat records of a JSON or NDJSON file as one batch.
fn read_json_records(
    file: std::fs::File,
    path: &WorkspacePath,
    layout: JsonLayout,
) -> Result<arrow_array::RecordBatch, ToolError> {
    let too_big = |size: u64| {
        ToolError::respond(
            format!(
                "`{path}` is {size} bytes; a JSON file is read whole, so at most \
                 {MAX_JSON_SOURCE_BYTES} bytes ({} MiB) of it",
                MAX_JSON_SOURCE_BYTES >> 20
            ),
            Some(
                "export a `.csv` or `.arrow` version of the data instead (one may have been \
                 saved beside it), which has no such limit"
                    .into(),
            ),
        )
    };
    let bytes = dataref_tool::read_capped(file, path.as_str(), MAX_JSON_SOURCE_BYTES, too_big)?;
    let not_json = |e: serde_json::Error| {
        let (what, hint) = match layout {
            JsonLayout::Document => (
                "JSON",
                "a `.json` source holds one JSON document; one object per line is `.ndjson` \
                 or `.jsonl`",
            ),
            JsonLayout::Lines => (
                "JSON lines",
                "each line of a `.ndjson` or `.jsonl` source holds one complete JSON object",
            ),
        };
        ToolError::respond(
            format!("`{path}` is not valid {what}: {e}"),
            Some(hint.into()),
        )
    };
    let not_a_table = |reason: String| {
        let what = match layout {
            JsonLayout::Document => "an array of flat records",
            JsonLayout::Lines => "flat records, one object per line",
        };
        ToolError::respond(
            format!("`{path}` is not {what}: {reason}"),
            Some(
                "turn it into one with `run_python` (e.g. `pd.json_normalize`, stored in \
                 `outputs`) and export the dataRef it returns, or export the CSV spilled \
                 beside it if there is one"
                    .into(),
            ),
        )
    };
    match layout {
        JsonLayout::Lines => {
            // Positions in errors are the file's own lines.
            let records = serde_json::Deserializer::from_slice(&bytes)
                .into_iter::<Value>()
                .collect::<Result<Vec<_>, _>>()
                .map_err(not_json)?;
            drop(bytes);
            records_to_batch(&records).ok_or_else(|| not_a_table(not_flat(&records)))
        }
        JsonLayout::Document => {
            let value: Value = serde_json::from_slice(&bytes).map_err(not_json)?;
            drop(bytes);
            let Some(records) = find_records(&value) else {
                return Err(not_a_table(no_records(&value)));
            };
            records_to_batch(records).ok_or_else(|| not_a_table(not_flat(records)))
        }
    }
}

/// Why a JSON document holds no records, for the model to act on.
fn no_records(value: &Value) -> String {
    let arrays: Vec<&str> = match value {
        Value::Object(fields) => fields
            .iter()
            .filter(|(_, v)| v.is_array() && find_records(v).is_some())
            .map(|(k, _)| k.as_str())
            .collect(),
        _ => Vec::new(),
    };
    if arrays.len() > 1 {
        let names: Vec<String> = arrays.iter().map(|k| format!("`{k}`")).collect();
        return format!(
            "{} each hold an array of objects, and which one is the table is not guessed",
            names.join(", ")
        );
    }
    "it holds no array of objects, neither as the whole document nor in one field such as \
     `{\"rows\": [...]}`"
        .into()
}

/// Why records are not a flat table, for the model to act on.
fn not_flat(records: &[Value]) -> String {
    if records.is_empty() {
        return "it holds no records".into();
    }
    for (n, record) in records.iter().enumerate() {
        let Value::Object(fields) = record else {
            return format!("record {} is not a JSON object", n + 1);
        };
        for (key, value) in fields {
            let nested = match value {
                Value::Array(_) => "an array",
                Value::Object(_) => "an object",
                Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => continue,
            };
            return format!(
                "`{key}` holds {nested} in record {}; values must be numbers, text, booleans \
                 or null",
                n + 1
            );
        }
    }
    if records
        .iter()
        .all(|r| r.as_object().is_none_or(|o| o.is_empty()))
    {
        return "there are no fields".into();
    }
    "there are more than 1,000 distinct fields".into()
}

/// A failed export as the model reads it.
pub(super) fn export_error(e: ExportError) -> ToolError {
    match &e {
        ExportError::Cancelled => ToolError::respond("the export was cancelled", None),
        _ if e.is_caller_error() => ToolError::respond(e.to_string(), e.hint()),
        _ => ToolError::Fatal(e.to_string()),
    }
}

impl ExportArgs {
    /// The call as a cell of a session's replay: the same file written again with pandas.
    pub(crate) fn replay(&self, n: usize, parsed: Option<&Value>, rp: &mut Replay<'_>) {
        let source = self.source.as_str();
        let ext = self.format.format().extension();
        let format = ext;
        let stem = match self.filename.as_deref() {
            Some(name) => {
                let suffix = format!(".{ext}");
                let cut = name.len().saturating_sub(suffix.len());
                if name.is_char_boundary(cut) && name[cut..].eq_ignore_ascii_case(&suffix) {
                    name[..cut].to_owned()
                } else {
                    name.to_owned()
                }
            }
            None => parsed
                .and_then(|v| v.get("path"))
                .and_then(Value::as_str)
                .and_then(|p| p.rsplit('/').next())
                .and_then(|f| f.strip_suffix(&format!(".{ext}")))
                .map_or_else(|| format!("export-step{n}"), str::to_owned),
        };
        let stem: String = stem
            .trim_start_matches('.')
            .chars()
            .map(|c| {
                if c == '/' || c == '\\' || c.is_control() {
                    '_'
                } else {
                    c
                }
            })
            .collect();
        let stem = if stem.is_empty() {
            format!("export-step{n}")
        } else {
            stem
        };
        let file = format!("exports/{stem}.{ext}");
        rp.md(format!(
            "**Step {n}:** {} exported to the person as {}, from {}.",
            tick(format),
            tick(&file),
            rp.shown_from(source)
        ));
        let mut code = format!("# Step {n}: the export, written again with pandas.\n");
        let expr = match rp.table_of(source) {
            Ok(e) => e,
            Err(c) => {
                code.push_str(&c);
                return rp.code(code);
            }
        };
        let _ = writeln!(code, "_export = {expr}");
        if let Some(cols) = &self.columns {
            let _ = writeln!(code, "_export = _export[{}]", py_list(cols));
        }
        if let Some(by) = self.sort_by.as_deref() {
            let desc = self.descending.unwrap_or(false);
            let _ = writeln!(
                code,
                "_export = _export.sort_values({}, ascending={}, kind=\"stable\")",
                py_str(by),
                if desc { "False" } else { "True" }
            );
        }
        let offset = self.offset.unwrap_or(0);
        let limit = self.limit;
        if offset > 0 || limit.is_some() {
            let end = limit.map(|l| (offset + l).to_string()).unwrap_or_default();
            let _ = writeln!(code, "_export = _export.iloc[{offset}:{end}]");
        }
        if let Some(h) = &self.headers {
            let renames: serde_json::Map<String, Value> = h
                .iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect();
            let _ = writeln!(
                code,
                "_export = _export.rename(columns={})",
                py_value(&Value::Object(renames))
            );
        }
        let bom = self.bom.unwrap_or(false);
        let path = py_str(&file);
        code.push_str("os.makedirs(\"exports\", exist_ok=True)\n");
        match self.format {
            FormatArg::Xlsx => {
                let _ = writeln!(
                    code,
                    "_export.to_excel({path}, index=False)  # needs openpyxl"
                );
            }
            FormatArg::Parquet => {
                let _ = writeln!(code, "_export.to_parquet({path}, index=False)");
            }
            FormatArg::Json => {
                let _ = writeln!(
                    code,
                    "_export.to_json({path}, orient=\"records\", date_format=\"iso\")"
                );
            }
            FormatArg::Ndjson => {
                let _ = writeln!(
                    code,
                    "_export.to_json({path}, orient=\"records\", lines=True, date_format=\"iso\")"
                );
            }
            FormatArg::Csv => {
                let encoding = if bom { "utf-8-sig" } else { "utf-8" };
                let _ = writeln!(
                    code,
                    "_export.to_csv({path}, index=False, encoding=\"{encoding}\")"
                );
            }
        }
        let _ = writeln!(
            code,
            "print(\"step {n}: wrote\", {path}, len(_export), \"rows\")"
        );
        rp.code(code);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_names_carry_the_time() {
        assert_eq!(generated_stem(1_767_225_599), "export-20251231-235959");
    }

    #[test]
    fn file_names_are_plain() {
        assert_eq!(file_stem("q3-sales.CSV", Format::Csv).unwrap(), "q3-sales");
        assert_eq!(file_stem("q3 sales", Format::Xlsx).unwrap(), "q3 sales");
        assert_eq!(file_stem("x.csv", Format::Xlsx).unwrap(), "x.csv");
        for bad in ["../x", "a/b", ".hidden", "", ".csv"] {
            assert!(file_stem(bad, Format::Csv).is_err(), "{bad}");
        }
    }
}
