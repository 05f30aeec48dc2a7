//! [`Error`]: what failed while building a server, each with the hint a person acts on, over
//! the error that caused it (printed as a chain, `{:#}` through anyhow in the binaries).

use std::path::PathBuf;

use dataref_config::env;
use dataref_mcp::upstream::UpstreamError;
use dataref_protocol::{Principal, PrincipalError};
use dataref_sandbox::pool::SandboxError;
use dataref_sources::SourceError;
use dataref_store::StoreError;
use dataref_tool::ToolsError;
use dataref_workspace::WorkspaceError;

/// A start-up failure of [`App`](crate::App) or one of its parts.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(
        "cannot find a data directory: none of `--home`, `{}`, `{}`, `{}` is set\nhint: pass `--home DIR`",
        env::DATAREF_HOME,
        env::XDG_DATA_HOME,
        env::HOME
    )]
    NoDataDir,
    #[error("resolving the data directory `{}`", path.display())]
    DataDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("generating the sample database at `{}`", path.display())]
    Sample {
        path: PathBuf,
        source: Box<SourceError>,
    },
    #[error(
        "opening the artifact store in `{}`\nhint: check that the directory is writable, or pass `--home DIR`",
        home.display()
    )]
    Store {
        home: PathBuf,
        source: Box<StoreError>,
    },
    #[error(
        "connecting to the shared store (`[shared]`: the object store and the PostgreSQL index)\nhint: check that both are reachable from this machine and that the credentials are set in the environment"
    )]
    Shared(#[source] Box<dataref_replica::SharedError>),
    #[error("opening the workspace `{}`", dir.display())]
    Workspace {
        dir: PathBuf,
        source: Box<WorkspaceError>,
    },
    #[error("creating the workspace of `{principal}`")]
    PrincipalWorkspace {
        principal: Principal,
        source: Box<WorkspaceError>,
    },
    #[error(transparent)]
    Principal(#[from] PrincipalError),
    #[error("preparing the Python runtime for `run_python`")]
    PythonRuntime(#[source] Box<SandboxError>),
    #[error("starting the async runtime")]
    AsyncRuntime(#[source] std::io::Error),
    /// An `[agents.NAME]` profile that cannot be resolved (an unknown tool ID or template
    /// variable, an unreadable prompt file), or the session database.
    #[error("{}{}", .0, .0.hint().map(|h| format!("\nhint: {h}")).unwrap_or_default())]
    Agents(Box<dataref_agent::SendError>),
    /// An `[[upstream]]` server that cannot be reached or listed.
    #[error("{0}\nhint: {hint}", hint = .0.hint())]
    Upstream(Box<UpstreamError>),
    #[error(
        "the tool `{tool}` of upstream `{upstream}` has the name of another tool\nhint: set `prefix` of `[[upstream]]` `{upstream}` in dataref.toml (e.g. `prefix = \"{upstream}_\"`), or leave the tool out with `tools = [...]`"
    )]
    UpstreamNameClash { tool: String, upstream: String },
    #[error(
        "{error}\nhint: leave it out with `tools = [...]` of `[[upstream]]` `{upstream}` in dataref.toml"
    )]
    UpstreamBadSchema {
        error: Box<ToolsError>,
        upstream: String,
    },
    #[error(transparent)]
    Tools(Box<ToolsError>),
    #[error("building the tool registry")]
    Registry(#[source] Box<Error>),
}

/// A result of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_context_is_printed_over_its_cause() {
        let e = Error::AsyncRuntime(std::io::Error::other("no threads"));
        assert_eq!(e.to_string(), "starting the async runtime");
        let source = std::error::Error::source(&e).map(ToString::to_string);
        assert_eq!(source.as_deref(), Some("no threads"));
    }
}
