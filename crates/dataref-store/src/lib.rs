//! The artifact store: where producer results live while the model works with references.
//!
//! - [`ArtifactStore`]: the trait every backend implements (the local one here; a shared
//!   backend with object storage and a PostgreSQL index can sit behind the same trait).
//! - [`LocalStore`]: Arrow IPC files (uncompressed, memory-mappable) under
//!   `$DATAREF_HOME/artifacts`, indexed in `index.sqlite`; or, with
//!   [`LocalStore::with_backend`], another [`ArtifactIndex`] and [`ArtifactBytes`] (the
//!   shared backend: PostgreSQL and object storage, with the local files as a cache).
//! - [`TableWriter`]: a table is written batch by batch as the producer streams; dropping
//!   the writer without [`TableWriter::finish`] removes the partial file.
//! - [`describe()`] and [`describe_data`]: what the model gets instead of rows.
//!
//! Every read takes the caller's [`Principal`]: an unknown,
//! expired or someone else's reference all give the same [`StoreError::NotFound`].
//!
//! ```no_run
//! use std::sync::Arc;
//! use dataref_store::{ArtifactStore, LocalStore, StoreLimits, SystemClock, Lineage};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = LocalStore::open("/var/lib/dataref".as_ref(), StoreLimits::default(), Arc::new(SystemClock))?;
//! let owner = dataref_protocol::Principal::new("alice")?;
//! # let schema: arrow_schema::SchemaRef = todo!();
//! # let batches: Vec<arrow_array::RecordBatch> = vec![];
//! let mut w = store.create_table(&owner, schema, Lineage::new("fetch_sales", serde_json::json!({})))?;
//! for b in &batches { w.write(b)?; }
//! let meta = w.finish()?;
//! let table = store.open_table(&owner, &meta.data_ref)?;
//! # Ok(()) }
//! ```
//!
//! Owns: the artifact files and their index (with `dataref-sources`, the only users of
//! rusqlite), refs, owners, TTL, caps, quotas and `describe`/`describe_data`. Must not
//! import the producers, the sandbox, the tools or any transport: it knows tables and
//! principals, not who asked over what.

mod backend;
mod checksum;
mod clock;
mod compare;
mod error;
mod local;
mod stats;
mod untrusted;
mod value;

pub use backend::{ArtifactBytes, ArtifactIndex, IndexRow, Opened, Parts, to_u64};
pub use checksum::{Checksum, Hashing, PieceHash, Pieces, QuickCheck, Sums};
pub use clock::{Clock, ManualClock, SystemClock};
pub use compare::{Change, ColumnChange, EXAMPLES, Example, TableDiff, compare_tables};
pub use error::StoreError;
pub use local::{DamagedTable, LocalStore, SqliteIndex, StoreLimits, SweepReport, VerifyReport};
pub use stats::{ColumnSource, SampleOptions, describe, describe_data};
pub use untrusted::{MalformedIpc, UntrustedBatches, UntrustedIpc};
pub use value::{
    cell_to_json, closest, did_you_mean, format_date, format_timestamp_micros, records_json,
    timestamp_micros, type_name,
};

use std::path::PathBuf;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use dataref_protocol::{DataRef, Principal, Receipt, Timestamp};

/// Which tool, with which arguments, made an artifact; and its receipt, how it was made
/// (the source and its version, the SQL and bound values, the parents, the engines).
#[derive(Debug, Clone, PartialEq)]
pub struct Lineage {
    pub tool: String,
    pub args: serde_json::Value,
    /// `None` for a table stored before receipts were kept, or by a maker that keeps none.
    pub receipt: Option<Receipt>,
}

impl Lineage {
    pub fn new(tool: impl Into<String>, args: serde_json::Value) -> Self {
        Self {
            tool: tool.into(),
            args,
            receipt: None,
        }
    }

    /// The same lineage with `receipt`.
    #[must_use]
    pub fn with_receipt(mut self, receipt: Receipt) -> Self {
        self.receipt = Some(receipt);
        self
    }

    /// Records the version of the source a producer read (when it has a receipt saying
    /// which source it read).
    pub fn set_source_version(&mut self, version: Option<String>) {
        if let Some(source) = self.receipt.as_mut().and_then(|r| r.source.as_mut()) {
            source.version = version;
        }
    }

    /// The name a person knows the table by, at most [`NAME_CHARS`] characters: a loaded
    /// file's name (and sheet), a `run_python` output's key, the SQL of `run_sql` or
    /// `query` (with its source), a named query or HTTP tool with its arguments
    /// (`sales since=2025-01-01`).
    pub fn name(&self) -> String {
        use serde_json::Value;
        let arg = |key: &str| self.args.get(key).and_then(Value::as_str);
        let name = match self.tool.as_str() {
            "load_file" => {
                let path = arg("path").unwrap_or("file");
                let file = path.rsplit('/').next().unwrap_or(path);
                match self.args.get("sheet") {
                    Some(Value::String(s)) => format!("{file} [{s}]"),
                    Some(Value::Number(n)) => format!("{file} [{n}]"),
                    _ => file.to_owned(),
                }
            }
            "run_python" => arg("output").unwrap_or("run_python").to_owned(),
            // A statement on one line: what a person reads a query by.
            "run_sql" => format!("sql: {}", arg("sql").unwrap_or_default()),
            "query" => format!(
                "{}: {}",
                arg("source").unwrap_or("query"),
                arg("sql").unwrap_or_default()
            ),
            tool => {
                let base = tool.strip_prefix("fetch_").unwrap_or(tool);
                let mut name = base.to_owned();
                if let Some(args) = self.args.as_object() {
                    for (k, v) in args {
                        let v = match v {
                            Value::String(s) => s.clone(),
                            Value::Null => continue,
                            other => other.to_string(),
                        };
                        name.push_str(&format!(" {k}={v}"));
                    }
                }
                name
            }
        };
        one_line(&name, NAME_CHARS)
    }
}

/// `text`'s words on one line, at most `max` characters, the last of them `…` when it was
/// cut: a table's name, a session's title.
pub fn one_line(text: &str, max: usize) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() <= max {
        return line;
    }
    let mut cut: String = line.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// The longest [`Lineage::name`], in characters.
pub const NAME_CHARS: usize = 60;

/// The index row of a stored table.
#[derive(Debug, Clone)]
pub struct ArtifactMeta {
    pub data_ref: DataRef,
    pub owner: Principal,
    pub rows: u64,
    /// Size of the stored file.
    pub bytes: u64,
    pub schema: SchemaRef,
    /// NULL count per column, in schema order.
    pub null_counts: Vec<u64>,
    pub created_at: Timestamp,
    pub expires_at: Timestamp,
    pub lineage: Lineage,
    /// The stored file's content hash, computed as it was written; checked before its
    /// bytes are served. `None` only for a table indexed before dataref kept checksums,
    /// until its first read adopts one.
    pub checksum: Option<Checksum>,
    /// The stored file's [`QuickCheck`], computed beside the checksum: what a process
    /// checks the first time it maps the file. `None` for a table written before quick
    /// checks, whose first read checks the checksum instead.
    pub quick_check: Option<QuickCheck>,
}

/// A stored table opened for reading: its batches are memory-mapped, not copied.
#[derive(Debug, Clone)]
pub struct Table {
    pub meta: ArtifactMeta,
    pub batches: Vec<RecordBatch>,
    /// The Arrow IPC file, for consumers that hand it on (e.g. to the Python sandbox).
    pub path: PathBuf,
}

/// A stored table mapped for reading, its columns decoded when asked for: a reader that
/// needs a few columns of a wide table reads (and validates) only those.
#[derive(Debug, Clone)]
pub struct MappedTable {
    pub meta: ArtifactMeta,
    /// The Arrow IPC file.
    pub path: PathBuf,
    /// The whole file, mapped, and the columns decoded from it so far (shared with the
    /// artifact's other readers).
    pub(crate) mapping: Arc<local::Mapping>,
    /// Set when the file is filled in parts as columns are read
    /// ([`ArtifactStore::map_columns`]).
    pub(crate) parts: Option<Arc<dyn Parts>>,
}

impl MappedTable {
    /// The batches, with only the columns of `projection` (schema indices, in its order)
    /// when there is one; their buffers point into the mapping.
    pub fn batches(&self, projection: Option<&[usize]>) -> Result<Vec<RecordBatch>, StoreError> {
        let Some(parts) = &self.parts else {
            return Ok(self.mapping.batches(projection)?);
        };
        local::fetch_columns(self.mapping.buffer(), parts.as_ref(), projection)?;
        let batches = self.mapping.batches(projection)?;
        local::check_fetched(
            self.mapping.buffer(),
            parts.as_ref(),
            &batches,
            &self.meta.data_ref,
        )?;
        Ok(batches)
    }

    /// The first batches, every column, only as many as hold `rows` rows (all of them if
    /// the table is shorter): what a description's sample reads, without decoding (or
    /// validating) the rest. `meta` still counts every row.
    pub fn head(&self, rows: usize) -> Result<Table, StoreError> {
        if let Some(parts) = &self.parts {
            local::fetch_columns(self.mapping.buffer(), parts.as_ref(), None)?;
        }
        Ok(Table {
            meta: self.meta.clone(),
            batches: local::decode(self.mapping.buffer(), None, Some(rows))?,
            path: self.path.clone(),
        })
    }

    /// Every column decoded.
    pub fn into_table(self) -> Result<Table, StoreError> {
        let batches = self.batches(None)?;
        Ok(Table {
            meta: self.meta,
            batches,
            path: self.path,
        })
    }
}

/// Storage for table artifacts. Implementations are shared across threads; no method holds
/// a lock across file I/O.
pub trait ArtifactStore: Send + Sync {
    /// Starts a new table for `owner`. The write counts against the per-artifact byte cap
    /// and the owner's quota as it goes.
    fn create_table(
        &self,
        owner: &Principal,
        schema: SchemaRef,
        lineage: Lineage,
    ) -> Result<Box<dyn TableWriter>, StoreError>;

    /// Maps a live table of `owner`'s, no column decoded yet.
    fn map_table(&self, owner: &Principal, data_ref: &DataRef) -> Result<MappedTable, StoreError>;

    /// [`ArtifactStore::map_table`] for a reader of some columns (`run_sql`): when the
    /// table's bytes are kept elsewhere and not yet here, only the parts the columns it
    /// decodes read are fetched, when it decodes them, each checked against what was written.
    /// Such a table's `path` is where the whole file would be, not a file to hand on.
    fn map_columns(
        &self,
        owner: &Principal,
        data_ref: &DataRef,
    ) -> Result<MappedTable, StoreError> {
        self.map_table(owner, data_ref)
    }

    /// Opens a live table of `owner`'s, every column decoded.
    fn open_table(&self, owner: &Principal, data_ref: &DataRef) -> Result<Table, StoreError> {
        self.map_table(owner, data_ref)?.into_table()
    }

    /// The Arrow IPC file of a live table of `owner`'s, opened read-only and not mapped
    /// (for handing its descriptor on, e.g. to the Python sandbox).
    fn open_file(&self, owner: &Principal, data_ref: &DataRef)
    -> Result<std::fs::File, StoreError>;

    /// The index row of a live table of `owner`'s.
    fn meta(&self, owner: &Principal, data_ref: &DataRef) -> Result<ArtifactMeta, StoreError>;

    /// `owner`'s live artifacts, newest first, at most `limit`; and how many there are in all.
    fn list(&self, owner: &Principal, limit: usize)
    -> Result<(Vec<ArtifactMeta>, u64), StoreError>;

    /// Bytes of live artifacts `owner` holds.
    fn usage(&self, owner: &Principal) -> Result<u64, StoreError>;

    /// Removes expired artifacts (index row, then file).
    fn sweep(&self) -> Result<SweepReport, StoreError>;

    /// Live artifacts of every owner: how many, and their bytes; `None` from a store that
    /// does not count them. For the metrics, read at scrape time.
    fn totals(&self) -> Result<Option<(u64, u64)>, StoreError> {
        Ok(None)
    }
}

/// A table being written. Dropping it without `finish` aborts: the partial file is removed
/// and nothing is indexed.
pub trait TableWriter: Send {
    /// Appends a batch. Its schema must equal the table's. Crossing the byte cap or the
    /// owner's quota aborts the write with [`StoreError::TooLarge`] / [`StoreError::QuotaExceeded`].
    fn write(&mut self, batch: &RecordBatch) -> Result<(), StoreError>;

    /// Rows written so far.
    fn rows(&self) -> u64;

    /// Makes the table durable (fsync, rename) and indexes it.
    fn finish(self: Box<Self>) -> Result<ArtifactMeta, StoreError>;
}

#[cfg(test)]
mod name_tests {
    use super::{Lineage, NAME_CHARS};
    use serde_json::json;

    #[test]
    fn a_table_is_named_as_a_person_knows_it() {
        let name = |tool: &str, args| Lineage::new(tool, args).name();
        assert_eq!(
            name(
                "fetch_sales",
                json!({"since": "2025-01-01", "region": null})
            ),
            "sales since=2025-01-01"
        );
        assert_eq!(
            name("crm_orders", json!({"limit": 5})),
            "crm_orders limit=5"
        );
        assert_eq!(
            name(
                "load_file",
                json!({"path": "uploads/q3/targets.xlsx", "sheet": "EU"})
            ),
            "targets.xlsx [EU]"
        );
        assert_eq!(name("load_file", json!({"path": "t.csv"})), "t.csv");
        assert_eq!(
            name("run_python", json!({"code": "…", "output": "by_region"})),
            "by_region"
        );
        assert_eq!(
            name(
                "run_sql",
                json!({"sql": "SELECT line,\n  sum(revenue)\nFROM t"})
            ),
            "sql: SELECT line, sum(revenue) FROM t"
        );
        assert_eq!(
            name("query", json!({"source": "warehouse", "sql": "SELECT 1"})),
            "warehouse: SELECT 1"
        );
        let long = name("run_sql", json!({"sql": "x".repeat(500)}));
        assert_eq!(long.chars().count(), NAME_CHARS);
        assert!(long.ends_with('…'));
    }
}
