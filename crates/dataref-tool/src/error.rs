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
        if e.is_transient() {
            tracing::warn!("{e}: {e:?}");
            Self::respond(e.to_string(), e.hint())
        } else if e.is_damage() {
            // Logged where it was found, with the owner; the caller must know which table.
            Self::respond(e.to_string(), e.hint())
        } else if e.is_caller_error() {
            Self::respond(e.to_string(), e.hint())
        } else {
            Self::Fatal(e.to_string())
        }
    }
}

impl From<WorkspacePathError> for ToolError {
    fn from(e: WorkspacePathError) -> Self {
        if e.is_caller_error() || e.is_transient() {
            Self::respond(e.to_string(), e.hint())
        } else {
            Self::Fatal(e.to_string())
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
