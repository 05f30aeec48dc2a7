/// Why an export failed. [`ExportError::hint`] says what the caller can do;
/// [`ExportError::is_caller_error`] separates bad requests from faults of the machine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExportError {
    #[error("no column `{column}`")]
    UnknownColumn {
        column: String,
        available: Vec<String>,
    },
    #[error("two output columns would both be named `{name}`")]
    DuplicateName { name: String },
    #[error("`headers` names `{column}`, which is not an exported column")]
    UnknownHeader {
        column: String,
        exported: Vec<String>,
    },
    #[error("column `{column}` ({type_name}) cannot be sorted")]
    Unsortable { column: String, type_name: String },
    #[error("the table has {columns} columns; an XLSX sheet holds at most 16,384")]
    TooWideForXlsx { columns: usize },
    #[error(
        "a cell of column `{column}` has {chars} characters; an XLSX cell holds at most 32,767"
    )]
    CellTooLongForXlsx { column: String, chars: usize },
    #[error("row {row} is past the table's end ({rows} rows)")]
    NoSuchRow { row: u32, rows: u64 },
    #[error("the export was cancelled")]
    Cancelled,
    #[error("writing the file: {0}")]
    Io(#[from] std::io::Error),
    #[error("xlsx: {0}")]
    Xlsx(String),
    #[error("parquet: {0}")]
    Parquet(String),
    #[error("arrow: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
}

impl ExportError {
    /// What to do next, for the model or the person.
    pub fn hint(&self) -> Option<String> {
        match self {
            Self::UnknownColumn { column, available } => {
                Some(dataref_store::did_you_mean(column, available))
            }
            Self::DuplicateName { .. } => {
                Some("give each exported column its own name in `headers`".into())
            }
            Self::UnknownHeader { column, exported } => Some(format!(
                "`headers` maps column names to display names; {}",
                dataref_store::did_you_mean(column, exported)
            )),
            Self::Unsortable { .. } => {
                Some("sort by a number, text, date or boolean column".into())
            }
            Self::TooWideForXlsx { .. } => {
                Some("pick at most 16,384 `columns`, or export as `csv` or `parquet`".into())
            }
            Self::CellTooLongForXlsx { .. } => {
                Some("leave that column out (`columns`), or export as `csv` or `parquet`".into())
            }
            Self::NoSuchRow { .. }
            | Self::Cancelled
            | Self::Io(_)
            | Self::Xlsx(_)
            | Self::Parquet(_)
            | Self::Arrow(_) => None,
        }
    }

    /// True when the request was wrong (and a changed request can succeed).
    pub fn is_caller_error(&self) -> bool {
        match self {
            Self::UnknownColumn { .. }
            | Self::DuplicateName { .. }
            | Self::UnknownHeader { .. }
            | Self::Unsortable { .. }
            | Self::TooWideForXlsx { .. }
            | Self::CellTooLongForXlsx { .. }
            | Self::Cancelled => true,
            Self::NoSuchRow { .. }
            | Self::Io(_)
            | Self::Xlsx(_)
            | Self::Parquet(_)
            | Self::Arrow(_) => false,
        }
    }
}

impl From<rust_xlsxwriter::XlsxError> for ExportError {
    fn from(e: rust_xlsxwriter::XlsxError) -> Self {
        match e {
            rust_xlsxwriter::XlsxError::IoError(io) => Self::Io(io),
            other => Self::Xlsx(other.to_string()),
        }
    }
}

impl From<parquet::errors::ParquetError> for ExportError {
    fn from(e: parquet::errors::ParquetError) -> Self {
        match e {
            parquet::errors::ParquetError::External(inner) => {
                match inner.downcast::<std::io::Error>() {
                    Ok(io) => Self::Io(*io),
                    Err(other) => Self::Parquet(other.to_string()),
                }
            }
            other => Self::Parquet(other.to_string()),
        }
    }
}
