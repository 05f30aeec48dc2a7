/// Why a file could not be loaded. The message names where (line, record or row; column;
/// value); [`LoadError::hint`] says what the caller can change.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    #[error("the file is empty")]
    Empty,
    #[error("this is not {format} text: {why}")]
    NotText { format: &'static str, why: String },
    #[error("cannot tell the file's format from its name or its first bytes")]
    UnknownFormat,
    #[error("{at}: the bytes are not valid {encoding}")]
    Encoding { at: String, encoding: &'static str },
    #[error(
        "{at} has {found} field{}; the first line has {expected}",
        if *found == 1 { "" } else { "s" }
    )]
    Ragged {
        at: String,
        found: usize,
        expected: usize,
    },
    #[error("{at}, column `{column}`: `{value}` is not {expected}")]
    Value {
        at: String,
        column: String,
        value: String,
        expected: &'static str,
    },
    #[error("no column `{column}` in the file")]
    UnknownColumn {
        column: String,
        available: Vec<String>,
    },
    #[error("no sheet {sheet} in the workbook")]
    UnknownSheet {
        sheet: String,
        available: Vec<String>,
    },
    #[error("{what} is {size} bytes; the limit is {limit}")]
    TooLarge { what: String, size: u64, limit: u64 },
    #[error("{format}: {detail}")]
    Malformed {
        format: &'static str,
        detail: String,
    },
    #[error("{0}")]
    Unsupported(String),
    #[error("`{option}` does not apply to {format} files")]
    Option {
        option: &'static str,
        format: &'static str,
    },
    #[error("the load was cancelled")]
    Cancelled,
    #[error("the file changed while it was being loaded")]
    Changed,
    #[error("reading the file: {0}")]
    Io(#[from] std::io::Error),
}

impl LoadError {
    pub(crate) fn malformed(format: &'static str, detail: impl std::fmt::Display) -> Self {
        Self::Malformed {
            format,
            detail: detail.to_string(),
        }
    }

    /// What to do next, for the model or the person.
    pub fn hint(&self) -> Option<String> {
        match self {
            Self::Empty => Some("the file has no bytes; check the path".into()),
            Self::NotText { .. } => Some(
                "pass `format` if the file is a spreadsheet, Parquet or Arrow file with another \
                 name"
                    .into(),
            ),
            Self::UnknownFormat => Some(
                "name the format: `format` is one of csv, tsv, xlsx, parquet, arrow, json, ndjson"
                    .into(),
            ),
            Self::Encoding { .. } => Some(
                "pass `encoding` (utf-8, utf-16, windows-1252); without it a file that is not \
                 UTF-8 is read as Windows-1252"
                    .into(),
            ),
            Self::Ragged { .. } => Some(
                "every line needs the same number of fields; check the delimiter (pass \
                 `delimiter`) or quote fields that contain it"
                    .into(),
            ),
            Self::Value { column, .. } => Some(format!(
                "declare the column as text (`columns: {{\"{column}\": \"string\"}}`), or fix \
                 the value"
            )),
            Self::UnknownColumn { column, available } => {
                Some(dataref_store::did_you_mean(column, available))
            }
            Self::UnknownSheet { available, .. } => Some(format!(
                "the sheets are {}; `sheet` takes a name or a 0-based index",
                available
                    .iter()
                    .map(|s| format!("`{s}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            Self::TooLarge { .. } => Some(
                "split the file, or save a spreadsheet as CSV, which is read as it streams".into(),
            ),
            Self::Malformed { .. } => Some(
                "the file is damaged or not in the format its name says; pass `format` if the \
                 name is wrong"
                    .into(),
            ),
            Self::Option { .. } => Some("leave that option out for this format".into()),
            Self::Changed => {
                Some("load it again once nothing is writing to it (or load a copy)".into())
            }
            Self::Unsupported(_) | Self::Cancelled | Self::Io(_) => None,
        }
    }

    /// A problem with the file or the request (as opposed to the machine).
    pub fn is_caller_error(&self) -> bool {
        !matches!(self, Self::Io(_))
    }
}
