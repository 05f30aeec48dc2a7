use std::path::PathBuf;

/// What went wrong in the store. [`StoreError::hint`] says what the caller can do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Unknown, expired and someone else's reference: deliberately the same answer.
    #[error("dataRef `{data_ref}` is unknown or expired")]
    NotFound { data_ref: String },
    #[error("the result is larger than the {limit}-byte cap for one artifact")]
    TooLarge { limit: u64 },
    #[error("storing this would exceed your quota: {used} of {quota} bytes already in use")]
    QuotaExceeded { quota: u64, used: u64 },
    #[error("batch schema does not match the table's schema")]
    SchemaMismatch,
    #[error("no column `{column}`")]
    UnknownColumn {
        column: String,
        available: Vec<String>,
    },
    #[error("{context} `{}`: {source}", path.display())]
    Io {
        context: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("artifact index: {0}")]
    Index(String),
    /// The shared index or object store could not be reached (or answered with an error):
    /// nothing was stored or changed, and the same call may work in a moment. `detail`
    /// (addresses, the service's words) is for the log, not in the message.
    #[error("the shared artifact store is unavailable right now")]
    Unavailable { detail: String },
    #[error("arrow: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
    /// The stored bytes are not the bytes that were written (a flipped bit, a truncated or
    /// swapped file, an object deleted under its row): nothing of them is served.
    #[error("the table `{data_ref}` is damaged: {detail}; none of it is served")]
    Damaged { data_ref: String, detail: String },
}

impl StoreError {
    /// What the model (or person) should do next.
    pub fn hint(&self) -> Option<String> {
        match self {
            Self::NotFound { .. } => Some(
                "references expire and belong to the caller who made them; fetch the data again"
                    .into(),
            ),
            Self::TooLarge { .. } => Some(
                "narrow the query (filter rows, select fewer columns, or aggregate in SQL)".into(),
            ),
            Self::QuotaExceeded { .. } => Some(
                "wait for older artifacts to expire, or narrow the query so the result is smaller"
                    .into(),
            ),
            Self::UnknownColumn { column, available } => {
                Some(crate::value::did_you_mean(column, available))
            }
            Self::Unavailable { .. } => Some(
                "nothing was lost; try the same call again in a moment (if it keeps failing, \
                 the operator should check the object store and the PostgreSQL index)"
                    .into(),
            ),
            Self::Damaged { .. } => Some(
                "its stored bytes changed after it was written; fetch the data again from its \
                 source (the operator can check every table with `dataref store verify`)"
                    .into(),
            ),
            Self::SchemaMismatch | Self::Io { .. } | Self::Index(_) | Self::Arrow(_) => None,
        }
    }

    /// True when the shared store could not be reached: not the caller's doing, but worth
    /// telling them (it passes, and nothing was lost).
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unavailable { .. })
    }

    /// True when stored bytes failed their check: not the caller's doing, but they must be
    /// told which table and why (it is logged as an error too).
    pub fn is_damage(&self) -> bool {
        matches!(self, Self::Damaged { .. })
    }

    /// True for errors the caller caused and can fix (as opposed to faults of the server).
    pub fn is_caller_error(&self) -> bool {
        match self {
            Self::NotFound { .. }
            | Self::TooLarge { .. }
            | Self::QuotaExceeded { .. }
            | Self::UnknownColumn { .. } => true,
            Self::SchemaMismatch
            | Self::Io { .. }
            | Self::Index(_)
            | Self::Unavailable { .. }
            | Self::Damaged { .. }
            | Self::Arrow(_) => false,
        }
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        Self::Index(e.to_string())
    }
}
