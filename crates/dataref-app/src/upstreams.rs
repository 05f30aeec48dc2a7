//! The `[[upstream]]` MCP servers, connected at start with a line of progress each, and the
//! registry errors that name an upstream.

use dataref_config::{Config, UpstreamTransport};
use dataref_mcp::upstream::{self, Upstreams};
use dataref_tool::ToolsError;

use crate::error::{Error, Result};
use crate::setup::progress_line;

/// Connects every `[[upstream]]` server, with a line of progress for each on stderr. A
/// server that cannot be reached stops the start: serving without its tools would leave
/// the model and the person wondering where they went.
pub async fn connect_upstreams(config: &Config) -> Result<Upstreams> {
    if config.upstreams.is_empty() {
        return Ok(Upstreams::default());
    }
    for u in &config.upstreams {
        progress_line(&format!(
            "connecting to upstream MCP server `{}` ({}) …",
            u.name,
            describe(&u.transport)
        ));
    }
    let upstreams = upstream::connect(&config.upstreams)
        .await
        .map_err(|e| Error::Upstream(Box::new(e)))?;
    for s in upstreams.servers() {
        progress_line(&format!(
            "upstream `{}`: {} of {} tools mounted",
            s.name(),
            s.tool_names().len(),
            s.listed()
        ));
    }
    Ok(upstreams)
}

/// The command or URL of an upstream, for people (never `env` or header values).
pub fn describe(transport: &UpstreamTransport) -> String {
    match transport {
        UpstreamTransport::Stdio { command, .. } => format!("`{}`", command.join(" ")),
        UpstreamTransport::Http { url, .. } => format!("`{url}`"),
        other => format!("{other:?}"),
    }
}

/// A registry error that involves an upstream tool says which upstream and what to set.
pub(crate) fn registry_error(e: ToolsError, upstreams: &Upstreams) -> Error {
    let owner = |name: &str| {
        upstreams
            .servers()
            .iter()
            .find(|s| s.tool_names().iter().any(|n| n == name))
            .map(|s| s.name().to_owned())
    };
    match &e {
        ToolsError::DuplicateName(name) => match owner(name) {
            Some(upstream) => Error::UpstreamNameClash {
                tool: name.clone(),
                upstream,
            },
            None => Error::Tools(Box::new(e)),
        },
        ToolsError::BadSchema { name, .. } => match owner(name) {
            Some(upstream) => Error::UpstreamBadSchema {
                error: Box::new(e),
                upstream,
            },
            None => Error::Tools(Box::new(e)),
        },
        // `ToolsError` is non-exhaustive across crates.
        _ => Error::Tools(Box::new(e)),
    }
}
