use std::time::Duration;

use dataref_store::StoreError;

/// What went wrong while producing. [`SourceError::hint`] says what the caller can do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    #[error("parameter `{name}`: {message}")]
    BadParam { name: String, message: String },
    #[error("SQL error: {message}")]
    Sql { message: String },
    #[error("not allowed: {what}")]
    NotAllowed { what: String },
    #[error("the query returned more than {max_rows} rows, the limit of this source")]
    TooManyRows { max_rows: u64 },
    #[error("the query ran longer than {}s and was stopped", after.as_secs())]
    Timeout { after: Duration },
    #[error("the query was cancelled")]
    Cancelled,
    #[error("column `{column}` holds a {found} value at row {row}, but its type is {expected}")]
    TypeChange {
        column: String,
        row: u64,
        expected: String,
        found: String,
    },
    #[error("cannot open source `{source_name}`: {message}")]
    Open {
        source_name: String,
        message: String,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl SourceError {
    /// What the model (or person) should do next.
    pub fn hint(&self) -> Option<String> {
        match self {
            Self::BadParam { .. } => None,
            Self::Sql { .. } => Some(
                "check table and column names; `SELECT name, sql FROM sqlite_schema` lists the tables"
                    .into(),
            ),
            Self::NotAllowed { .. } => {
                Some("only a single read-only SELECT (or WITH … SELECT) statement may run".into())
            }
            Self::TooManyRows { .. } => Some(
                "narrow the query: filter with WHERE, select fewer rows, or aggregate with GROUP BY"
                    .into(),
            ),
            Self::Timeout { .. } => Some(
                "narrow the query or aggregate in SQL; the source's `timeout` bounds every statement"
                    .into(),
            ),
            Self::Cancelled => None,
            Self::TypeChange { column, .. } => Some(format!(
                "declare the type of `{column}` (`columns.{column} = \"text\"` in the query's config) or CAST it in SQL"
            )),
            Self::Open { .. } => Some("check the source's `path` in dataref.toml".into()),
            Self::Store(e) => e.hint(),
        }
    }

    /// True for errors the caller caused and can fix.
    pub fn is_caller_error(&self) -> bool {
        match self {
            Self::BadParam { .. }
            | Self::Sql { .. }
            | Self::NotAllowed { .. }
            | Self::TooManyRows { .. }
            | Self::Timeout { .. }
            | Self::Cancelled
            | Self::TypeChange { .. } => true,
            Self::Open { .. } => false,
            Self::Store(e) => e.is_caller_error(),
        }
    }
}
