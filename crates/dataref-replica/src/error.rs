use std::time::Duration;

use dataref_store::StoreError;

/// What went wrong talking to the shared object store or index.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SharedError {
    /// The index could not be reached or lost its connection.
    #[error("the shared index (PostgreSQL) is unreachable: {0}")]
    IndexUnreachable(String),
    /// The index answered a statement with an error.
    #[error("the shared index (PostgreSQL) refused a statement: {0}")]
    Index(String),
    /// The object store could not be reached or answered with an error.
    #[error("the object store is unavailable: {0}")]
    Objects(String),
    /// A request took longer than `[shared] timeout`.
    #[error("{what} took longer than {after:?}")]
    TimedOut { what: &'static str, after: Duration },
    /// A local file of the cache.
    #[error("{context} `{path}`: {source}")]
    Local {
        context: &'static str,
        path: String,
        source: std::io::Error,
    },
    /// The configuration cannot be used (an unset variable, a malformed URL).
    #[error("{message}\nhint: {hint}")]
    Config { message: String, hint: String },
    #[error("the shared backend's runtime: {0}")]
    Runtime(String),
}

impl SharedError {
    pub(crate) fn local(context: &'static str, path: &std::path::Path, e: std::io::Error) -> Self {
        Self::Local {
            context,
            path: path.display().to_string(),
            source: e,
        }
    }

    /// Counts it in the metrics (`dataref_shared_store_errors_total`), by kind.
    pub(crate) fn count(&self) {
        dataref_ops::metrics::shared_store_error(match self {
            Self::IndexUnreachable(_) => "unreachable",
            Self::Index(_) => "index",
            Self::Objects(_) => "objects",
            Self::TimedOut { .. } => "timed_out",
            Self::Local { .. } => "local",
            Self::Config { .. } => "config",
            Self::Runtime(_) => "runtime",
        });
    }

    /// True when the store is (for now) out of reach, as opposed to a fault of ours.
    pub fn is_unavailable(&self) -> bool {
        match self {
            Self::IndexUnreachable(_) | Self::Objects(_) | Self::TimedOut { .. } => true,
            Self::Index(_) | Self::Local { .. } | Self::Config { .. } | Self::Runtime(_) => false,
        }
    }
}

impl From<SharedError> for StoreError {
    fn from(e: SharedError) -> Self {
        match e {
            SharedError::Local {
                context,
                path,
                source,
            } => StoreError::Io {
                context,
                path: path.into(),
                source,
            },
            e if e.is_unavailable() => StoreError::Unavailable {
                detail: e.to_string(),
            },
            e => StoreError::Index(e.to_string()),
        }
    }
}

impl From<tokio_postgres::Error> for SharedError {
    fn from(e: tokio_postgres::Error) -> Self {
        // A statement the server answered (a constraint, a syntax error) is ours; anything
        // else (no connection, a closed one, an I/O error) means the index is out of reach.
        match e.as_db_error() {
            Some(db) => Self::Index(format!("{}: {}", db.code().code(), db.message())),
            None => Self::IndexUnreachable(causes(&e)),
        }
    }
}

impl From<object_store::Error> for SharedError {
    fn from(e: object_store::Error) -> Self {
        Self::Objects(causes(&e))
    }
}

/// An error and its sources on one line.
pub(crate) fn causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}
