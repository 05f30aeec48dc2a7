//! The error type of every producer.

use std::path::PathBuf;
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
    #[error("the query ran longer than {} and was stopped", human(*after))]
    Timeout { after: Duration },
    #[error("the query was cancelled")]
    Cancelled,
    /// `expected` reads like "a date (text `YYYY-MM-DD`)", `found` like "the text `2025-13-01`";
    /// `row` counts from 1.
    #[error("column `{column}` is {expected}, but row {row} holds {found}")]
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
    /// A file the producer writes itself (the sample database) could not be written.
    #[error("{context} `{}`: {source}", path.display())]
    Io {
        context: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// `200 ms`, `60s`, `1.5s`: sub-second source timeouts are common in tests and tight configs.
fn human(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{} ms", d.as_millis())
    } else if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
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
            Self::Io { .. } => None,
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
            Self::Open { .. } | Self::Io { .. } => false,
            Self::Store(e) => e.is_caller_error(),
        }
    }
}
