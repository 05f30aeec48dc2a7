//! Upstream MCP servers mounted behind dataref (`[[upstream]]` in `dataref.toml`).
//!
//! [`connect`] starts every configured server (a child process speaking MCP on stdio, or a
//! Streamable HTTP endpoint), performs the MCP handshake, lists all its tools (following
//! `nextCursor`), keeps those of the `tools` allow-list, and makes one [`UpstreamTool`]
//! per upstream tool: a [`Tool`] named `prefix + name`, with the upstream's description
//! (marked as coming from that server), schemas and hints. Register them next to the
//! built-in tools; they go through `execute_tool_call` like any other, so a large result
//! is spilled to the workspace ([`Tool::result_is_synopsis`] stays false).
//!
//! A call is forwarded as `tools/call` with the upstream's own name. The client's
//! cancellation and the upstream's `timeout` abandon the request, which sends the
//! upstream `notifications/cancelled`. Text blocks become the model's text,
//! `structuredContent` the structured result, images and embedded documents
//! attachments for the person; an `isError` result, a refused call or a server that is
//! gone become errors the model can act on. A server that went away is started (or
//! connected to) again once, on the next call.
//!
//! `${NAME}` in `env` and `headers` values is replaced from dataref's environment when
//! connecting; an unset variable is an error naming the upstream and the variable.
//!
//! The registry is the caller's: this crate needs only the framework (`dataref-tool`), and
//! the built-in tools come from `dataref_builtins::builtin_registry_builder` in the host.
//!
//! ```no_run
//! # async fn demo(
//! #     config: dataref_config::Config,
//! #     mut builder: dataref_tool::ToolRegistryBuilder,
//! # ) -> Result<(), Box<dyn std::error::Error>> {
//! // `builder`: the built-in tools, registered but not built yet.
//! let upstreams = dataref_mcp::upstream::connect(&config.upstreams).await?;
//! for tool in upstreams.tools() {
//!     builder.register(tool);
//! }
//! let registry = builder.build()?;
//! # let _ = registry;
//! # Ok(())
//! # }
//! ```

mod connection;
pub(crate) mod env;
mod result;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dataref_config::UpstreamConfig;
use dataref_protocol::{ToolAnnotations, ToolSpec};
use dataref_tool::{RunContext, Tool, ToolError, ToolOutput};
use rmcp::model::CallToolRequestParams;
use rmcp::service::ServiceError;
use serde_json::{Map, Value};

use connection::Connection;

/// Longest tool name MCP hosts accept.
const MAX_TOOL_NAME: usize = 64;

/// Why an upstream server could not be mounted. Each names the upstream; [`Self::hint`]
/// says what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UpstreamError {
    #[error("upstream `{upstream}`: `{key}` uses `${{{variable}}}`, which is not set")]
    UnsetVariable {
        upstream: String,
        key: String,
        variable: String,
    },
    #[error("upstream `{upstream}`: `{key}`: {message}")]
    BadValue {
        upstream: String,
        key: String,
        message: String,
    },
    #[error("upstream `{upstream}`: cannot start `{program}`: {source}")]
    Spawn {
        upstream: String,
        program: String,
        source: std::io::Error,
    },
    #[error("upstream `{upstream}`: the MCP handshake failed: {detail}{}", stderr_note(.stderr))]
    Handshake {
        upstream: String,
        detail: String,
        /// The last lines the server wrote to stderr, for a child process.
        stderr: String,
    },
    #[error("upstream `{upstream}`: listing its tools failed: {detail}")]
    ListTools { upstream: String, detail: String },
    #[error("upstream `{upstream}` did not finish {what} within {}{}", human(*.timeout), stderr_note(.stderr))]
    Timeout {
        upstream: String,
        what: &'static str,
        timeout: Duration,
        stderr: String,
    },
    #[error("upstream `{upstream}` has no tool `{tool}` (named in `tools`); it has {}", list(.available))]
    UnknownTool {
        upstream: String,
        tool: String,
        available: Vec<String>,
    },
    #[error(
        "upstream `{upstream}`: its tool `{tool}` would be served as `{name}`, which is not a valid tool name (at most {MAX_TOOL_NAME} letters, digits, `_` and `-`)"
    )]
    BadToolName {
        upstream: String,
        tool: String,
        name: String,
    },
    #[error("upstream `{upstream}`: the input schema of its tool `{tool}` is not an object schema")]
    BadSchema { upstream: String, tool: String },
}

impl UpstreamError {
    /// The upstream server this is about.
    pub fn upstream(&self) -> &str {
        match self {
            Self::UnsetVariable { upstream, .. }
            | Self::BadValue { upstream, .. }
            | Self::Spawn { upstream, .. }
            | Self::Handshake { upstream, .. }
            | Self::ListTools { upstream, .. }
            | Self::Timeout { upstream, .. }
            | Self::UnknownTool { upstream, .. }
            | Self::BadToolName { upstream, .. }
            | Self::BadSchema { upstream, .. } => upstream,
        }
    }

    /// What the operator can do about it.
    pub fn hint(&self) -> String {
        match self {
            Self::UnsetVariable { variable, .. } => {
                format!("set `{variable}` in dataref's environment (it is read when dataref starts)")
            }
            Self::BadValue { .. } => {
                "fix this value of the `[[upstream]]` entry in dataref.toml".into()
            }
            Self::Spawn { .. } => {
                "check `command` of this `[[upstream]]` (the program must be on `PATH` or an absolute path) and `cwd`".into()
            }
            Self::Handshake { .. } | Self::ListTools { .. } => {
                "check that this `[[upstream]]`'s `url` answers MCP (the server runs, its `headers` are right) or that its `command` starts an MCP server on stdio; `DATAREF_LOG=dataref_mcp=debug` shows what a command writes to stderr".into()
            }
            Self::Timeout { .. } => {
                "check that the server starts on its own; raise `timeout` of this `[[upstream]]` if it is slow to start".into()
            }
            Self::UnknownTool { .. } => "fix `tools` of this `[[upstream]]`".into(),
            Self::BadToolName { tool, .. } => format!(
                "choose a shorter `prefix`, or leave `{tool}` out with `tools = [...]` of this `[[upstream]]`"
            ),
            Self::BadSchema { tool, .. } => {
                format!("leave `{tool}` out with `tools = [...]` of this `[[upstream]]`")
            }
        }
    }
}

fn stderr_note(stderr: &str) -> String {
    if stderr.is_empty() {
        String::new()
    } else {
        format!("; its last words on stderr:\n{stderr}")
    }
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        return "no tools".into();
    }
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

pub(crate) fn human(d: Duration) -> String {
    if d.as_secs() >= 1 && d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// Every configured upstream server, connected, with its tools.
#[derive(Debug, Default)]
pub struct Upstreams {
    servers: Vec<Upstream>,
}

impl Upstreams {
    /// Every mounted tool of every server, in configuration order, ready for
    /// [`ToolRegistryBuilder::register`](dataref_tool::ToolRegistryBuilder::register).
    pub fn tools(&self) -> impl Iterator<Item = Arc<dyn Tool>> + '_ {
        self.servers.iter().flat_map(Upstream::tools)
    }

    pub fn servers(&self) -> &[Upstream] {
        &self.servers
    }

    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// Ends every session: child processes are asked to exit (then killed), HTTP
    /// sessions are closed. Dropping does the same without waiting.
    pub async fn shutdown(self) {
        for s in self.servers {
            s.shutdown().await;
        }
    }
}

/// One connected upstream server and the tools mounted from it.
#[derive(Debug)]
pub struct Upstream {
    name: String,
    connection: Arc<Connection>,
    tools: Vec<Arc<UpstreamTool>>,
    /// How many tools the server lists, before the allow-list.
    listed: usize,
}

impl Upstream {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn tools(&self) -> impl Iterator<Item = Arc<dyn Tool>> + '_ {
        self.tools.iter().map(|t| t.clone() as Arc<dyn Tool>)
    }

    /// The mounted tools' names, prefixed.
    pub fn tool_names(&self) -> Vec<String> {
        self.tools.iter().map(|t| t.spec.name.clone()).collect()
    }

    /// How many tools the server lists (all of them, before `tools` chose).
    pub fn listed(&self) -> usize {
        self.listed
    }

    /// The server's name and version from its `initialize` answer, when it gave them.
    pub async fn server_info(&self) -> Option<String> {
        self.connection.server_info().await
    }

    pub async fn shutdown(self) {
        self.connection.shutdown().await;
    }
}

/// Connects every server of `configs` at once, reading `${NAME}` values from dataref's
/// environment. The first failure (in configuration order) is the error; the servers
/// already started are stopped.
pub async fn connect(configs: &[UpstreamConfig]) -> Result<Upstreams, UpstreamError> {
    connect_with_env(configs, &dataref_config::env::process).await
}

/// [`connect`] with `${NAME}` values looked up in `env` instead of the process
/// environment.
pub async fn connect_with_env(
    configs: &[UpstreamConfig],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Upstreams, UpstreamError> {
    // Every value is expanded before anything starts, so a missing variable fails fast.
    let targets = configs
        .iter()
        .map(|c| connection::Target::resolve(c, env))
        .collect::<Result<Vec<_>, _>>()?;
    let mut tasks = tokio::task::JoinSet::new();
    for (i, (config, target)) in configs.iter().zip(targets).enumerate() {
        let config = config.clone();
        tasks.spawn(async move { (i, mount(config, target).await) });
    }
    let mut results: Vec<Option<Result<Upstream, UpstreamError>>> =
        configs.iter().map(|_| None).collect();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((i, r)) => {
                if let Some(slot) = results.get_mut(i) {
                    *slot = Some(r);
                }
            }
            // `mount` does not panic; if it did, the slot stays empty and is reported below.
            Err(e) => tracing::error!("connecting an upstream server ended abnormally: {e}"),
        }
    }
    let mut servers = Vec::with_capacity(configs.len());
    let mut failure = None;
    for (config, r) in configs.iter().zip(results) {
        match r {
            Some(Ok(u)) => servers.push(u),
            Some(Err(e)) => {
                failure.get_or_insert(e);
            }
            None => {
                failure.get_or_insert(UpstreamError::Handshake {
                    upstream: config.name.clone(),
                    detail: "the connecting task ended abnormally".into(),
                    stderr: String::new(),
                });
            }
        }
    }
    match failure {
        None => Ok(Upstreams { servers }),
        Some(e) => {
            Upstreams { servers }.shutdown().await;
            Err(e)
        }
    }
}

/// Connects one server, reading `${NAME}` values from dataref's environment (`dataref
/// doctor` checks each server on its own).
pub async fn connect_one(config: &UpstreamConfig) -> Result<Upstream, UpstreamError> {
    let target = connection::Target::resolve(config, &dataref_config::env::process)?;
    mount(config.clone(), target).await
}

async fn mount(
    config: UpstreamConfig,
    target: connection::Target,
) -> Result<Upstream, UpstreamError> {
    tracing::info!(upstream = %config.name, target = %target, "connecting to upstream MCP server …");
    let (connection, listed) = Connection::open(&config, target).await?;
    let connection = Arc::new(connection);
    let tools = match choose(&config, &listed) {
        Ok(chosen) => chosen,
        Err(e) => {
            connection.shutdown().await;
            return Err(e);
        }
    };
    let mut mounted = Vec::with_capacity(tools.len());
    for tool in tools {
        match spec_for(&config, tool) {
            Ok(spec) => mounted.push(Arc::new(UpstreamTool {
                spec,
                upstream: config.name.clone(),
                upstream_tool: tool.name.to_string(),
                timeout: config.timeout,
                connection: connection.clone(),
            })),
            Err(e) => {
                connection.shutdown().await;
                return Err(e);
            }
        }
    }
    tracing::info!(
        upstream = %config.name,
        listed = listed.len(),
        mounted = mounted.len(),
        "upstream MCP server connected"
    );
    Ok(Upstream {
        name: config.name,
        connection,
        tools: mounted,
        listed: listed.len(),
    })
}

/// The listed tools that `tools` names (all when it is absent), in the server's order.
fn choose<'a>(
    config: &UpstreamConfig,
    listed: &'a [rmcp::model::Tool],
) -> Result<Vec<&'a rmcp::model::Tool>, UpstreamError> {
    let Some(allowed) = &config.tools else {
        return Ok(listed.iter().collect());
    };
    if let Some(missing) = allowed
        .iter()
        .find(|a| !listed.iter().any(|t| t.name == a.as_str()))
    {
        return Err(UpstreamError::UnknownTool {
            upstream: config.name.clone(),
            tool: missing.clone(),
            available: listed.iter().map(|t| t.name.to_string()).collect(),
        });
    }
    Ok(listed
        .iter()
        .filter(|t| allowed.iter().any(|a| t.name == a.as_str()))
        .collect())
}

/// How the model sees an upstream tool: prefixed, marked as coming from the upstream,
/// with its schemas and hints as given.
/// The upstream tool declares MCP Apps `visibility` without `"model"`.
fn app_only(tool: &rmcp::model::Tool) -> bool {
    let visibility = tool
        .meta
        .as_ref()
        .and_then(|m| m.get("ui"))
        .and_then(|ui| ui.get("visibility"))
        .and_then(Value::as_array);
    visibility.is_some_and(|v| !v.iter().any(|x| x.as_str() == Some("model")))
}

fn spec_for(config: &UpstreamConfig, tool: &rmcp::model::Tool) -> Result<ToolSpec, UpstreamError> {
    let name = format!("{}{}", config.prefix, tool.name);
    let valid = !name.is_empty()
        && name.len() <= MAX_TOOL_NAME
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !valid {
        return Err(UpstreamError::BadToolName {
            upstream: config.name.clone(),
            tool: tool.name.to_string(),
            name,
        });
    }
    if tool.input_schema.get("type").is_some_and(|t| t != "object") {
        return Err(UpstreamError::BadSchema {
            upstream: config.name.clone(),
            tool: tool.name.to_string(),
        });
    }
    let origin = format!("[from upstream `{}`]", config.name);
    let description = match tool.description.as_deref().map(str::trim) {
        Some(d) if !d.is_empty() => format!("{origin} {d}"),
        _ => format!("{origin} the tool `{}` of that MCP server", tool.name),
    };
    let hints = tool.annotations.as_ref();
    let annotations = ToolAnnotations {
        // MCP's defaults: not read-only, open world.
        read_only: hints.and_then(|a| a.read_only_hint).unwrap_or(false),
        open_world: hints.and_then(|a| a.open_world_hint).unwrap_or(true),
    };
    Ok(ToolSpec {
        name,
        title: tool
            .title
            .clone()
            .or_else(|| hints.and_then(|a| a.title.clone())),
        description,
        input_schema: Value::Object(tool.input_schema.as_ref().clone()),
        output_schema: tool
            .output_schema
            .as_ref()
            .map(|s| Value::Object(s.as_ref().clone())),
        annotations,
        // An upstream tool only its own view may call stays hidden from the model here too;
        // its view is not proxied, so no resource is named.
        ui: dataref_protocol::ToolUi {
            resource_uri: None,
            app_only: app_only(tool),
        },
    })
}

/// One tool of an upstream server, served under its prefixed name.
pub struct UpstreamTool {
    spec: ToolSpec,
    upstream: String,
    /// The name the upstream knows it by.
    upstream_tool: String,
    timeout: Duration,
    connection: Arc<Connection>,
}

impl std::fmt::Debug for UpstreamTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamTool")
            .field("name", &self.spec.name)
            .field("upstream", &self.upstream)
            .finish_non_exhaustive()
    }
}

impl UpstreamTool {
    fn unavailable(&self, why: &str) -> ToolError {
        ToolError::respond(
            format!(
                "the upstream server `{}` is not available: {why}",
                self.upstream
            ),
            Some(format!(
                "try again later; if it keeps failing, tell the person: an operator must check `[[upstream]]` `{}` (the server log has the details)",
                self.upstream
            )),
        )
    }

    fn service_error(&self, e: ServiceError, generation: u64) -> ToolError {
        match e {
            ServiceError::McpError(data) => ToolError::respond(
                format!(
                    "the upstream server `{}` refused the call: {}",
                    self.upstream, data.message
                ),
                Some(self.reported_hint()),
            ),
            ServiceError::TransportClosed => {
                self.transport_failed("the connection closed", generation);
                self.unavailable("it closed the connection during the call")
            }
            ServiceError::TransportSend(err) => {
                self.transport_failed(&connection::causes(err.error.as_ref()), generation);
                self.unavailable("the request could not be sent")
            }
            ServiceError::UnexpectedResponse => ToolError::respond(
                format!(
                    "the upstream server `{}` answered with something dataref cannot relay (it asked for more input or started a task)",
                    self.upstream
                ),
                Some(self.reported_hint()),
            ),
            ServiceError::Timeout { timeout } => self.timed_out(timeout),
            other => {
                tracing::warn!(upstream = %self.upstream, tool = %self.upstream_tool, error = %other, "upstream call failed");
                self.unavailable("the call failed")
            }
        }
    }

    fn transport_failed(&self, detail: &str, generation: u64) {
        tracing::warn!(
            upstream = %self.upstream,
            tool = %self.upstream_tool,
            detail,
            stderr = %self.connection.stderr_tail(),
            "the upstream server went away during a call; the next call starts it again"
        );
        self.connection.mark_broken(generation);
    }

    fn timed_out(&self, timeout: Duration) -> ToolError {
        ToolError::respond(
            format!(
                "`{}` of the upstream server `{}` did not answer within {} and was cancelled",
                self.upstream_tool,
                self.upstream,
                human(timeout)
            ),
            Some(format!(
                "narrow the request; if the person expects it to take longer, an operator can raise `timeout` of `[[upstream]]` `{}`",
                self.upstream
            )),
        )
    }

    fn reported_hint(&self) -> String {
        format!(
            "the upstream server `{}` reported this error",
            self.upstream
        )
    }
}

#[async_trait]
impl Tool for UpstreamTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    /// The upstream server's schemas, listed as it gives them.
    fn schemas_are_ours(&self) -> bool {
        false
    }

    async fn call(
        &self,
        args: Map<String, Value>,
        ctx: &RunContext,
    ) -> Result<ToolOutput, ToolError> {
        let cancelled = || ToolError::respond(format!("`{}` was cancelled", self.spec.name), None);
        let lease = tokio::select! {
            l = self.connection.peer() => l.map_err(|e| {
                tracing::warn!(upstream = %self.upstream, error = %e, hint = %e.hint(), "upstream server unavailable");
                self.unavailable("it could not be started again")
            })?,
            () = ctx.cancel.cancelled() => return Err(cancelled()),
        };
        let params = CallToolRequestParams::new(self.upstream_tool.clone()).with_arguments(args);
        // Dropping the request future (cancelled, timed out) makes rmcp send the
        // upstream `notifications/cancelled` for it.
        let request = lease.peer.call_tool(params);
        let result = tokio::select! {
            r = request => r,
            () = ctx.cancel.cancelled() => return Err(cancelled()),
            () = tokio::time::sleep(self.timeout) => return Err(self.timed_out(self.timeout)),
        };
        match result {
            Ok(r) => result::to_output(&self.upstream, r),
            Err(e) => Err(self.service_error(e, lease.generation)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use dataref_config::UpstreamTransport;
    use serde_json::json;

    use super::*;

    fn config(tools: Option<Vec<&str>>) -> UpstreamConfig {
        UpstreamConfig {
            name: "docs".into(),
            transport: UpstreamTransport::Http {
                url: "http://127.0.0.1:1/mcp".into(),
                headers: BTreeMap::new(),
            },
            prefix: "docs_".into(),
            tools: tools.map(|t| t.into_iter().map(str::to_owned).collect()),
            timeout: Duration::from_secs(5),
        }
    }

    fn tool(name: &str, schema: Value) -> rmcp::model::Tool {
        let Value::Object(o) = schema else {
            panic!("not an object")
        };
        rmcp::model::Tool::new_with_raw(name.to_owned(), None, Arc::new(o))
    }

    #[test]
    fn specs_are_prefixed_and_marked() {
        let mut t = tool("search", json!({"type": "object", "properties": {}}));
        t.description = Some("Searches the docs.".into());
        t.annotations = Some(rmcp::model::ToolAnnotations::new().read_only(true));
        let spec = spec_for(&config(None), &t).unwrap();
        assert_eq!(spec.name, "docs_search");
        assert_eq!(
            spec.description,
            "[from upstream `docs`] Searches the docs."
        );
        assert!(spec.annotations.read_only);
        assert!(spec.annotations.open_world, "MCP's default");
        assert_eq!(spec.output_schema, None);
    }

    #[test]
    fn bad_names_and_schemas_are_refused_with_a_hint() {
        let long = "x".repeat(60);
        for (name, schema) in [
            (long.as_str(), json!({"type": "object"})),
            ("a.b", json!({"type": "object"})),
            ("ok", json!({"type": "array"})),
        ] {
            let e = spec_for(&config(None), &tool(name, schema)).unwrap_err();
            assert!(e.hint().contains("tools = [...]"), "{e}: {}", e.hint());
            assert_eq!(e.upstream(), "docs");
        }
    }

    #[test]
    fn the_allow_list_keeps_order_and_names_what_is_missing() {
        let listed = vec![
            tool("a", json!({"type": "object"})),
            tool("b", json!({"type": "object"})),
            tool("c", json!({"type": "object"})),
        ];
        let chosen = choose(&config(Some(vec!["c", "a"])), &listed).unwrap();
        let names: Vec<&str> = chosen.iter().map(|t| t.name.as_ref()).collect();
        assert_eq!(names, ["a", "c"]);
        let e = choose(&config(Some(vec!["a", "zz"])), &listed).unwrap_err();
        assert_eq!(
            e.to_string(),
            "upstream `docs` has no tool `zz` (named in `tools`); it has `a`, `b`, `c`"
        );
    }
}
