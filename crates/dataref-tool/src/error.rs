use dataref_sources::SourceError;
use dataref_store::StoreError;
use dataref_workspace::WorkspacePathError;

/// How a tool call failed, split by who must act.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ToolError {
    /// The model can fix this: it becomes an `isError` result with the message and hint.
    #[error("{message}")]
    RespondToModel {
        message: String,
        hint: Option<String>,
    },
    /// A fault of the server. Logged in full; the model gets a short notice without
    /// internals.
    #[error("internal error: {0}")]
    Fatal(String),
}

impl ToolError {
    pub fn respond(message: impl Into<String>, hint: Option<String>) -> Self {
        Self::RespondToModel {
            message: message.into(),
            hint,
        }
    }
}

impl From<StoreError> for ToolError {
    fn from(e: StoreError) -> Self {
        if e.is_caller_error() {
            Self::respond(e.to_string(), e.hint())
        } else {
            Self::Fatal(e.to_string())
        }
    }
}

impl From<WorkspacePathError> for ToolError {
    fn from(e: WorkspacePathError) -> Self {
        if e.is_caller_error() {
            Self::respond(e.to_string(), e.hint())
        } else {
            Self::Fatal(e.to_string())
        }
    }
}

impl From<SourceError> for ToolError {
    fn from(e: SourceError) -> Self {
        if let SourceError::Connect {
            source_name,
            problem: dataref_sources::ConnectProblem::Busy,
            ..
        } = &e
        {
            // Not an outage: every connection is in use by other calls for now.
            return Self::respond(
                format!("the data source `{source_name}` is busy with other calls"),
                Some("try the call again in a few seconds".into()),
            );
        }
        if let SourceError::Connect { source_name, .. } = &e {
            // The operator's problem: logged in full (with the hint about `url`); the model
            // learns only that the source is down, never the URL or host names.
            tracing::warn!(error = %e, hint = e.hint().unwrap_or_default(), "source unavailable");
            return Self::respond(
                format!("the data source `{source_name}` is not available right now"),
                Some(
                    "tell the person; an operator must check the source (`dataref doctor`)".into(),
                ),
            );
        }
        if e.is_caller_error() {
            Self::respond(e.to_string(), e.hint())
        } else {
            match e.hint() {
                // A source that cannot be opened is the operator's problem, but saying so
                // (without host paths) lets the model tell the person.
                Some(_) => Self::respond(
                    "the data source is not available right now",
                    Some("tell the person; an operator must check the source configuration".into()),
                ),
                None => Self::Fatal(e.to_string()),
            }
        }
    }
}

/// Building the registry failed: a configuration or programming error, reported at start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ToolsError {
    #[error("two tools are named `{0}`")]
    DuplicateName(String),
    #[error("tool `{name}` has an invalid input schema: {message}")]
    BadSchema { name: String, message: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn said(e: SourceError) -> (String, Option<String>) {
        match ToolError::from(e) {
            ToolError::RespondToModel { message, hint } => (message, hint),
            other => panic!("{other:?}"),
        }
    }

    /// A busy pool is the model's to retry; a source that is down is the operator's, and the
    /// model never sees why (the URL may name hosts).
    #[test]
    fn busy_pools_say_try_again_and_outages_hide_the_details() {
        let (message, hint) = said(SourceError::Connect {
            source_name: "warehouse".into(),
            message: "every connection of the pool was busy for 5000 ms".into(),
            problem: dataref_sources::ConnectProblem::Busy,
        });
        assert!(message.contains("busy"), "{message}");
        assert!(hint.is_some_and(|h| h.contains("again")));
        let (message, hint) = said(SourceError::Connect {
            source_name: "warehouse".into(),
            message: "connection refused at db.internal:5432".into(),
            problem: dataref_sources::ConnectProblem::Unreachable,
        });
        assert_eq!(
            message,
            "the data source `warehouse` is not available right now"
        );
        assert!(hint.is_some_and(|h| h.contains("dataref doctor")));
    }
}
