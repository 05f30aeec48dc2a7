//! Readers from the files people bring — CSV and TSV, XLSX, Parquet, Arrow IPC (Feather),
//! JSON arrays of records and NDJSON — to Arrow record batches, for `load_file` to stream
//! into the store. Pure functions over an open [`File`]; where the file came from and where
//! the rows go are the caller's business. The mirror of `dataref-export`.
//!
//! - [`open`] decides the format (from `format`, the name's extension, then the first
//!   bytes, and refuses a binary file named `.csv`), reads what it must to know the schema,
//!   and returns an [`Opened`] whose [`Batches`] yields the rows in batches of
//!   [`BATCH_ROWS`].
//! - Text formats: the encoding is sniffed (UTF-8 with or without BOM, UTF-16, otherwise
//!   Windows-1252), so are a CSV's delimiter, header and decimal comma; every column's type
//!   is inferred over all rows (see [`ColumnKind`] and the rules in `infer.rs`) and can be
//!   declared per column. A value that does not fit a declared type is an error naming its
//!   line (record, row), column and value.
//! - Columnar formats keep the file's types; dictionary and view columns are stored plain.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::io::Write;
//! let mut f = tempfile::tempfile()?;
//! f.write_all("region;revenue\nEMEA;1.234,5\nAPAC;99,25\n".as_bytes())?;
//! let mut opened = dataref_load::open(f, "sales.csv", &Default::default(), &|| false)?;
//! let batch = opened.batches.next_batch()?.expect("one batch");
//! assert_eq!(batch.num_rows(), 2);
//! assert_eq!(opened.notes, ["CSV: delimiter `;`, decimal comma, first line is the header"]);
//! # Ok(()) }
//! ```
//!
//! Owns: `calamine`, `csv` and `encoding_rs`, and every file format a person uploads. Must
//! not import the workspace, the store's writers, the tools or any transport.

mod columnar;
mod delimited;
mod error;
mod infer;
mod json;
mod text;
mod xlsx;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use serde::{Deserialize, Serialize};

pub use error::LoadError;
pub use infer::{ColumnKind, Decimal};
pub use text::TextEncoding;

use infer::{Guess, Resolved};

/// Rows per batch the readers yield.
pub const BATCH_ROWS: usize = 65_536;

/// A file's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Csv,
    Tsv,
    Xlsx,
    Parquet,
    // Arrow IPC: the file format (Feather v2) or the stream format.
    #[serde(alias = "feather", alias = "ipc")]
    Arrow,
    // A JSON array of records.
    Json,
    // One JSON record per line.
    #[serde(alias = "jsonl")]
    Ndjson,
}

impl Format {
    /// The name the model passes as `format`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Csv => "csv",
            Self::Tsv => "tsv",
            Self::Xlsx => "xlsx",
            Self::Parquet => "parquet",
            Self::Arrow => "arrow",
            Self::Json => "json",
            Self::Ndjson => "ndjson",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Self::Csv => "CSV",
            Self::Tsv => "TSV",
            Self::Xlsx => "XLSX",
            Self::Parquet => "Parquet",
            Self::Arrow => "Arrow",
            Self::Json => "JSON",
            Self::Ndjson => "NDJSON",
        }
    }

    /// The format a file name's extension says, if it says one.
    pub fn from_name(name: &str) -> Option<Self> {
        let ext = name.rsplit_once('.')?.1.to_ascii_lowercase();
        Some(match ext.as_str() {
            "csv" | "txt" => Self::Csv,
            "tsv" | "tab" => Self::Tsv,
            "xlsx" | "xlsm" => Self::Xlsx,
            "parquet" | "pq" => Self::Parquet,
            "arrow" | "feather" | "ipc" | "arrows" => Self::Arrow,
            "json" => Self::Json,
            "ndjson" | "jsonl" => Self::Ndjson,
            _ => return None,
        })
    }

    fn is_text(self) -> bool {
        matches!(self, Self::Csv | Self::Tsv | Self::Json | Self::Ndjson)
    }
}

/// A sheet of a workbook: by name, or by 0-based position.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum Sheet {
    Index(usize),
    Name(String),
}

/// How to read a file; every field is optional (`Default` sniffs everything).
#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub format: Option<Format>,
    /// CSV only: the byte between fields.
    pub delimiter: Option<u8>,
    /// CSV and XLSX: whether the first row names the columns.
    pub header: Option<bool>,
    /// CSV only.
    pub encoding: Option<TextEncoding>,
    /// CSV only: the decimal separator of the numbers.
    pub decimal: Option<Decimal>,
    /// XLSX only; the first sheet by default.
    pub sheet: Option<Sheet>,
    /// Declared types by column name (text formats and XLSX).
    pub columns: BTreeMap<String, ColumnKind>,
    /// An XLSX file's parts, unpacked, at most this many bytes (a zip bomb is refused
    /// before it is unpacked). A sheet is read whole (calamine holds every cell, about
    /// 32 bytes each, plus its text), so this bounds the memory of one load: the default,
    /// 128 MiB, is a sheet of some 4M cells and a few hundred MB at most.
    pub max_unpacked_bytes: u64,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            format: None,
            delimiter: None,
            header: None,
            encoding: None,
            decimal: None,
            sheet: None,
            columns: BTreeMap::new(),
            max_unpacked_bytes: 128 << 20,
        }
    }
}

/// A file opened for reading: its format, what was decided about it, and its rows.
pub struct Opened {
    pub format: Format,
    /// Data rows, when the reader knows before reading them (for progress).
    pub rows: Option<u64>,
    /// One line each on what was sniffed (delimiter, encoding, header, sheet): the model
    /// can pass an option if a guess was wrong.
    pub notes: Vec<String>,
    pub batches: Box<dyn Batches>,
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opened")
            .field("format", &self.format)
            .field("rows", &self.rows)
            .field("notes", &self.notes)
            .finish_non_exhaustive()
    }
}

/// A file's rows, batch by batch, every batch of [`Batches::schema`].
pub trait Batches: Send {
    fn schema(&self) -> SchemaRef;
    /// The next batch; `None` at the end.
    fn next_batch(&mut self) -> Result<Option<RecordBatch>, LoadError>;
}

/// Opens `file` (named `name`, for its extension) from its start, for reading as `options`
/// say.
/// `cancelled` is polled during long scans.
///
/// A file written to from the moment `open` is called until the batches end is refused
/// ([`LoadError::Changed`], from the last `next_batch`): no table is ever read half from
/// one version of a file and half from another, whatever the format.
pub fn open(
    file: File,
    name: &str,
    options: &LoadOptions,
    cancelled: &dyn Fn() -> bool,
) -> Result<Opened, LoadError> {
    watched(file, |file| open_format(file, name, options, cancelled))
}

/// `open(file)`, watched: the version of `file` is taken before `open` reads a byte, and an
/// error from `open` or the end (or any error) of its batches, once the file is no longer
/// that version, is [`LoadError::Changed`].
pub(crate) fn watched(
    file: File,
    open: impl FnOnce(File) -> Result<Opened, LoadError>,
) -> Result<Opened, LoadError> {
    let version = Version::of(&file)?;
    let watch = file.try_clone()?;
    let opened = open(file).map_err(|e| {
        if changed(&watch, version) {
            LoadError::Changed
        } else {
            e
        }
    })?;
    Ok(Opened {
        batches: Box::new(Unchanged {
            batches: opened.batches,
            file: watch,
            version,
        }),
        ..opened
    })
}

/// One version of a file. Any write, even one that keeps its length, moves its change
/// time, which no call can set back (a write within the same tick of the kernel's clock as
/// the one before it is the exception).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Version {
    len: u64,
    changed_ns: i128,
    ino: u64,
}

impl Version {
    pub(crate) fn of(file: &File) -> std::io::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let m = file.metadata()?;
        Ok(Self {
            len: m.len(),
            changed_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
            ino: m.ino(),
        })
    }

    pub(crate) fn len(&self) -> u64 {
        self.len
    }
}

/// Whether `file` is no longer what it was at `version` (or cannot say).
fn changed(file: &File, version: Version) -> bool {
    Version::of(file).map_or(true, |now| now != version)
}

/// A reader's batches, ended by proof that the file is still the version [`open`] saw: the
/// end (and any error) of a file written to meanwhile is [`LoadError::Changed`].
struct Unchanged {
    batches: Box<dyn Batches>,
    file: File,
    version: Version,
}

impl Batches for Unchanged {
    fn schema(&self) -> SchemaRef {
        self.batches.schema()
    }

    fn next_batch(&mut self) -> Result<Option<RecordBatch>, LoadError> {
        match self.batches.next_batch() {
            Ok(Some(batch)) => Ok(Some(batch)),
            Err(LoadError::Cancelled) => Err(LoadError::Cancelled),
            Ok(None) | Err(_) if changed(&self.file, self.version) => Err(LoadError::Changed),
            other => other,
        }
    }
}

/// [`open`] without the watch on the file's version.
fn open_format(
    mut file: File,
    name: &str,
    options: &LoadOptions,
    cancelled: &dyn Fn() -> bool,
) -> Result<Opened, LoadError> {
    file.seek(SeekFrom::Start(0))?;
    let mut magic = [0u8; 8];
    let n = read_up_to(&mut file, &mut magic)?;
    file.seek(SeekFrom::Start(0))?;
    if n == 0 {
        return Err(LoadError::Empty);
    }
    let sniffed = from_magic(&magic[..n]);
    let format = match options.format.or_else(|| Format::from_name(name)) {
        Some(f) => f,
        None => match sniffed {
            Some(Magic::Format(f)) => f,
            Some(Magic::Xls) => return Err(xls()),
            None => first_text_byte(&mut file)?.ok_or(LoadError::UnknownFormat)?,
        },
    };
    if format.is_text() {
        match sniffed {
            Some(Magic::Format(f)) if !f.is_text() => {
                return Err(LoadError::NotText {
                    format: format.label(),
                    why: format!("it is {} file", article(f.label())),
                });
            }
            Some(Magic::Xls) => {
                return Err(LoadError::NotText {
                    format: format.label(),
                    why: "it is an XLS (Excel 97–2003) workbook".into(),
                });
            }
            _ => {}
        }
    }
    check_options(format, options)?;
    match format {
        Format::Csv | Format::Tsv => delimited::open(file, format, options, cancelled),
        Format::Json | Format::Ndjson => json::open(file, format, options, cancelled),
        Format::Xlsx => {
            if sniffed == Some(Magic::Xls) {
                return Err(xls());
            }
            xlsx::open(file, options)
        }
        Format::Parquet => columnar::parquet(file),
        Format::Arrow => columnar::arrow(file),
    }
}

fn article(label: &str) -> String {
    if label.starts_with(['A', 'E', 'I', 'O', 'U', 'X', 'N']) {
        format!("an {label}")
    } else {
        format!("a {label}")
    }
}

fn xls() -> LoadError {
    LoadError::Unsupported(
        "XLS (Excel 97–2003) workbooks are not read; save the sheet as XLSX or CSV".into(),
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Magic {
    Format(Format),
    Xls,
}

fn from_magic(b: &[u8]) -> Option<Magic> {
    Some(match b {
        [b'P', b'A', b'R', b'1', ..] => Magic::Format(Format::Parquet),
        [b'A', b'R', b'R', b'O', b'W', b'1', ..] | [0xFF, 0xFF, 0xFF, 0xFF, ..] => {
            Magic::Format(Format::Arrow)
        }
        [b'P', b'K', 3, 4, ..] => Magic::Format(Format::Xlsx),
        [0xD0, 0xCF, 0x11, 0xE0, ..] => Magic::Xls,
        _ => return None,
    })
}

/// JSON by its first non-blank byte: `[` an array, `{` one record per line.
fn first_text_byte(file: &mut File) -> Result<Option<Format>, LoadError> {
    let mut head = [0u8; 4096];
    let n = read_up_to(file, &mut head)?;
    file.seek(SeekFrom::Start(0))?;
    let start = match head[..n] {
        [0xEF, 0xBB, 0xBF, ..] => 3,
        _ => 0,
    };
    Ok(
        match head[start..n].iter().find(|b| !b.is_ascii_whitespace()) {
            Some(b'[') => Some(Format::Json),
            Some(b'{') => Some(Format::Ndjson),
            _ => None,
        },
    )
}

fn read_up_to(file: &mut File, buf: &mut [u8]) -> Result<usize, LoadError> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

fn check_options(format: Format, o: &LoadOptions) -> Result<(), LoadError> {
    let csv = matches!(format, Format::Csv | Format::Tsv);
    let checks: [(&'static str, bool, bool); 6] = [
        ("delimiter", o.delimiter.is_some(), csv),
        ("encoding", o.encoding.is_some(), csv),
        ("decimal", o.decimal.is_some(), csv),
        ("header", o.header.is_some(), csv || format == Format::Xlsx),
        ("sheet", o.sheet.is_some(), format == Format::Xlsx),
        (
            "columns",
            !o.columns.is_empty(),
            !matches!(format, Format::Parquet | Format::Arrow),
        ),
    ];
    for (option, given, applies) in checks {
        if given && !applies {
            return Err(LoadError::Option {
                option,
                format: format.label(),
            });
        }
    }
    Ok(())
}

/// Each column's type: declared, else inferred.
fn resolve_columns(
    names: &[String],
    guesses: &[Guess],
    declared: &BTreeMap<String, ColumnKind>,
    prefer_comma: bool,
) -> Result<Vec<Resolved>, LoadError> {
    let declared = delimited::declared_kinds(declared, names)?;
    Ok(names
        .iter()
        .zip(guesses)
        .map(|(n, g)| match declared.get(n) {
            Some(kind) => Resolved::declared(*kind, g, prefer_comma),
            None => g.resolve(prefer_comma),
        })
        .collect())
}
