//! [`DatarefServer`]: the tool registry, the caller's artifacts and workspace files behind
//! rmcp's [`ServerHandler`].

use std::sync::Arc;

use dataref_protocol::Principal;
use dataref_tools::{NoProgress, RunContext, ToolCall, ToolRegistry, execute_tool_call};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, ListResourceTemplatesResult,
    ListResourcesResult, ListToolsResult, PaginatedRequestParams, ReadResourceRequestParams,
    ReadResourceResponse, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use crate::{progress, resources, tools};

/// What a client (and through it, the model) is told at `initialize`. Worded to stay
/// true while only some of the tools it names are configured.
pub const INSTRUCTIONS: &str = "\
dataref keeps data on the server and gives you references to it. Never ask for raw rows, and \
never copy rows into messages or tool arguments.
- Producers (`fetch_*`, `query`) run a query, store the result and return a `dataRef` with the \
schema, row count, null counts and a tiny sample: enough to write code against, not the data.
- Inspect a stored table with `describe_data` (statistics per column); find earlier results \
with `list_artifacts`.
- Compute with `run_python` (when available), passing dataRefs as inputs.
- Show the person data with `render_chart`, `render_table` or `export_data` (when available); \
they take a dataRef, so the rows reach the person without passing through you.
- A large result of any other tool is written to a file in your workspace (`.spill/…`) and you \
get its path, size, a preview and, for a list of records, a CSV and a dataRef. Pass the path or \
the dataRef on (`run_python` `files`/`inputs`, `export_data` `source`, `read_file` for a part); \
never copy data into arguments: write a tool's arguments to a file with `run_python` and use \
`call_tool`.
References expire and belong to the caller who made them. If one is unknown or expired, fetch \
the data again instead of guessing.";

/// One MCP session's view of dataref: the tools of `registry`, run as the principal of the
/// base [`RunContext`], and that principal's artifacts and workspace files as resources.
///
/// Cheap to clone (one `Arc`). Build one per session: the principal is fixed for its life.
#[derive(Clone)]
pub struct DatarefServer {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Arc<ToolRegistry>,
    /// The session's principal, store, workspace, limits and clock. Its `progress` and
    /// `cancel` are replaced on every call by the request's own.
    ctx: RunContext,
    /// Converted once: the registry is immutable.
    tools: Vec<Tool>,
}

impl DatarefServer {
    pub fn new(registry: Arc<ToolRegistry>, ctx: RunContext) -> Self {
        let tools = registry.specs().map(tools::to_mcp_tool).collect();
        Self {
            inner: Arc::new(Inner {
                registry,
                ctx,
                tools,
            }),
        }
    }

    /// Who this session runs as.
    pub fn principal(&self) -> &Principal {
        &self.inner.ctx.principal
    }
}

impl std::fmt::Debug for DatarefServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatarefServer")
            .field("principal", &self.inner.ctx.principal)
            .field("tools", &self.inner.registry)
            .finish_non_exhaustive()
    }
}

impl ServerHandler for DatarefServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .build(),
        )
        .with_server_info(
            Implementation::new("dataref", env!("CARGO_PKG_VERSION"))
                .with_title("dataref")
                .with_description(
                    "Query results stay on the server as artifacts; the model works with \
                     references.",
                ),
        )
        .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(self.inner.tools.clone()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.inner.tools.iter().find(|t| t.name == name).cloned()
    }

    /// Every tool failure (unknown tool, bad arguments, expired reference, timeout, …) is
    /// an `isError` result the model reads; `execute_tool_call` owns those branches. This
    /// never returns a protocol error.
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let args = request
            .arguments
            .map_or_else(|| Value::Object(Map::new()), Value::Object);
        let call = ToolCall::new(request.name.into_owned(), args);
        let registry = &self.inner.registry;
        // The request's token: `notifications/cancelled` cancels it, and the tool's
        // producer polls it and removes its partial artifact.
        let cancel = context.ct.clone();
        let outcome = match context.meta.get_progress_token() {
            None => {
                let ctx = self.inner.ctx.for_call(Arc::new(NoProgress), cancel);
                execute_tool_call(registry, call, &ctx).await
            }
            Some(token) => {
                let (sink, reports) = progress::channel();
                let ctx = self.inner.ctx.for_call(sink, cancel);
                let done = CancellationToken::new();
                let run = async {
                    let outcome = execute_tool_call(registry, call, &ctx).await;
                    done.cancel();
                    outcome
                };
                let forward = progress::forward(context.peer.clone(), token, reports, done.clone());
                tokio::join!(run, forward).0
            }
        };
        Ok(CallToolResponse::Complete(tools::to_call_result(outcome)))
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        resources::list(&self.inner.ctx, request.and_then(|r| r.cursor)).await
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        Ok(resources::templates())
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        resources::read(&self.inner.ctx, request.uri)
            .await
            .map(ReadResourceResponse::Complete)
    }
}
