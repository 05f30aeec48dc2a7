use std::collections::BTreeMap;

/// A file format to export to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// RFC 4180: comma-separated, `"` quoting, CRLF line ends, UTF-8.
    Csv,
    /// Excel workbook with typed cells.
    Xlsx,
    /// Parquet, Snappy-compressed.
    Parquet,
    /// One JSON array of objects.
    Json,
    /// One JSON object per line.
    Ndjson,
}

impl Format {
    /// The file name extension, without the dot.
    pub fn extension(self) -> &'static str {
        match self {
            Self::Csv => "csv",
            Self::Xlsx => "xlsx",
            Self::Parquet => "parquet",
            Self::Json => "json",
            Self::Ndjson => "ndjson",
        }
    }

    /// The MIME type of the file.
    pub fn mime_type(self) -> &'static str {
        match self {
            Self::Csv => "text/csv",
            Self::Xlsx => "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
            Self::Parquet => "application/vnd.apache.parquet",
            Self::Json => "application/json",
            Self::Ndjson => "application/x-ndjson",
        }
    }
}

/// Sort direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Order {
    #[default]
    Ascending,
    Descending,
}

/// Rows in the order of one column (NULLs last either way; ties keep the table's order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SortBy {
    pub column: String,
    pub order: Order,
}

impl SortBy {
    /// By `column`, largest first when `descending`.
    pub fn new(column: impl Into<String>, descending: bool) -> Self {
        Self {
            column: column.into(),
            order: if descending {
                Order::Descending
            } else {
                Order::Ascending
            },
        }
    }
}

/// Whether a CSV file starts with a UTF-8 byte order mark (which Excel needs to read
/// UTF-8 rather than the local code page).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Bom {
    #[default]
    Without,
    With,
}

/// What happens to text cells that a spreadsheet would run as a formula.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Formulas {
    /// A CSV text cell starting with `=`, `+`, `-`, `@`, a tab or a carriage return gets a
    /// leading `'`, so a spreadsheet shows it as text instead of evaluating it.
    #[default]
    Neutralise,
    /// Text is written exactly as stored.
    Keep,
}

/// Which rows and columns to export, and how.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExportOptions {
    /// These columns, in this order (default: all, in table order).
    pub columns: Option<Vec<String>>,
    /// Display names by column name; columns not named keep their own.
    pub headers: BTreeMap<String, String>,
    pub sort: Option<SortBy>,
    /// These rows of the table (numbered across its batches from 0), in this order,
    /// instead of all of them: a view's filter and sort, decided elsewhere (it takes the
    /// place of `sort`). A number past the table's end is [`crate::ExportError::NoSuchRow`].
    pub rows: Option<Vec<u32>>,
    /// Rows to skip (after sorting).
    pub offset: u64,
    /// Rows to write at most (after the offset).
    pub limit: Option<u64>,
    /// CSV only.
    pub bom: Bom,
    /// CSV only: XLSX always writes text as text.
    pub formulas: Formulas,
}
