//! [`DatarefServer`]: the tool registry, the caller's artifacts and workspace files behind
//! rmcp's [`ServerHandler`].

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use dataref_config::Limits;
use dataref_protocol::Principal;
use dataref_store::{ArtifactStore, Clock};
use dataref_tools::{NoProgress, RunContext, ToolCall, ToolRegistry, execute_tool_call};
use dataref_workspace::{Workspace, WorkspaceError};
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

/// One MCP server's view of dataref: the tools of `registry`, run as the caller, and the
/// caller's artifacts and workspace files as resources.
///
/// Who the caller is depends on how it was built:
/// - [`DatarefServer::new`] (stdio, in-process): the principal of the base [`RunContext`],
///   fixed for the server's life;
/// - [`DatarefServer::per_request`] (HTTP): the [`Caller`] the authentication layer put
///   into the HTTP request's extensions (rmcp hands the request's [`http::request::Parts`]
///   to every handler), with that principal's workspace, opened once and kept. A request
///   without a [`Caller`] is refused with an internal error: there is no default principal.
///
/// Cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct DatarefServer {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Arc<ToolRegistry>,
    contexts: Contexts,
    /// Set by the HTTP layer: signed download URLs for the files a result links.
    links: OnceLock<Arc<dyn DownloadLinks>>,
    /// Converted once: the registry is immutable.
    tools: Vec<Tool>,
}

/// Where a request's [`RunContext`] comes from. Its `progress` and `cancel` are replaced
/// on every call by the request's own.
enum Contexts {
    Fixed(RunContext),
    PerRequest(PerPrincipal),
}

/// What every principal's context shares when one server serves many principals.
#[derive(Clone)]
pub struct SharedContext {
    /// The data directory; principal `p`'s workspace is `<home>/workspaces/<p>`.
    pub home: PathBuf,
    pub store: Arc<dyn ArtifactStore>,
    pub limits: Limits,
    pub clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for SharedContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedContext")
            .field("home", &self.home)
            .finish_non_exhaustive()
    }
}

struct PerPrincipal {
    shared: SharedContext,
    /// Opened on a principal's first request and kept (one directory fd each).
    workspaces: Mutex<HashMap<Principal, Arc<Workspace>>>,
}

/// Makes a signed download URL (and its expiry, Unix seconds) for a principal's
/// workspace file; `None` when it cannot.
pub(crate) trait DownloadLinks: Send + Sync {
    fn link(&self, principal: &Principal, path: &str) -> Option<(String, i64)>;
}

/// The authenticated principal of an HTTP request, put into the request's extensions by
/// the authentication layer ([`crate::http`]) and read by [`DatarefServer::per_request`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller(pub Principal);

impl DatarefServer {
    /// A server whose every call runs as the principal of `ctx`, in its workspace.
    pub fn new(registry: Arc<ToolRegistry>, ctx: RunContext) -> Self {
        Self::with_contexts(registry, Contexts::Fixed(ctx))
    }

    /// A server for many principals: each request runs as its [`Caller`], in that
    /// principal's workspace under `shared.home`.
    pub fn per_request(registry: Arc<ToolRegistry>, shared: SharedContext) -> Self {
        Self::with_contexts(
            registry,
            Contexts::PerRequest(PerPrincipal {
                shared,
                workspaces: Mutex::new(HashMap::new()),
            }),
        )
    }

    fn with_contexts(registry: Arc<ToolRegistry>, contexts: Contexts) -> Self {
        let tools = registry.specs().map(tools::to_mcp_tool).collect();
        Self {
            inner: Arc::new(Inner {
                registry,
                contexts,
                links: OnceLock::new(),
                tools,
            }),
        }
    }

    /// From now on, results that link workspace files for the person also carry a signed
    /// download URL for each (the first call wins).
    pub(crate) fn set_download_links(&self, links: Arc<dyn DownloadLinks>) {
        let _ = self.inner.links.set(links);
    }

    /// Who every call runs as, when that is fixed (`None` for a per-request server).
    pub fn principal(&self) -> Option<&Principal> {
        match &self.inner.contexts {
            Contexts::Fixed(ctx) => Some(&ctx.principal),
            Contexts::PerRequest(_) => None,
        }
    }

    /// The workspace of `principal`: the fixed one when it is this server's principal,
    /// else (per-request server) its own under the data dir, opened once. `None` when a
    /// fixed server is asked for another principal's.
    pub fn workspace_of(
        &self,
        principal: &Principal,
    ) -> Result<Option<Arc<Workspace>>, WorkspaceError> {
        match &self.inner.contexts {
            Contexts::Fixed(ctx) => {
                Ok((&ctx.principal == principal).then(|| ctx.workspace.clone()))
            }
            Contexts::PerRequest(p) => p.workspace(principal).map(Some),
        }
    }

    /// Closes the cached workspaces no call is using (they are opened again on the
    /// principal's next request), so the cache holds only principals active lately.
    pub(crate) fn forget_idle_workspaces(&self) {
        if let Contexts::PerRequest(p) = &self.inner.contexts {
            p.workspaces
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .retain(|_, w| Arc::strong_count(w) > 1);
        }
    }

    /// The context a request runs in.
    fn context(&self, request: &RequestContext<RoleServer>) -> Result<RunContext, McpError> {
        match &self.inner.contexts {
            Contexts::Fixed(ctx) => Ok(ctx.clone()),
            Contexts::PerRequest(p) => {
                let caller = request
                    .extensions
                    .get::<http::request::Parts>()
                    .and_then(|parts| parts.extensions.get::<Caller>());
                let Some(Caller(principal)) = caller else {
                    tracing::error!(
                        "a request reached the server without an authenticated principal"
                    );
                    return Err(McpError::internal_error(
                        "this request carries no authenticated principal; the details are in the server log",
                        None,
                    ));
                };
                let workspace = p.workspace(principal).map_err(|e| {
                    tracing::error!(%principal, error = %e, "opening a workspace failed");
                    McpError::internal_error(
                        "your workspace could not be opened; the details are in the server log",
                        None,
                    )
                })?;
                Ok(RunContext {
                    principal: principal.clone(),
                    store: p.shared.store.clone(),
                    workspace,
                    limits: p.shared.limits.clone(),
                    progress: Arc::new(NoProgress),
                    cancel: CancellationToken::new(),
                    clock: p.shared.clock.clone(),
                })
            }
        }
    }
}

impl PerPrincipal {
    fn workspace(&self, principal: &Principal) -> Result<Arc<Workspace>, WorkspaceError> {
        if let Some(w) = self.cached(principal) {
            return Ok(w);
        }
        // Opened outside the lock (a few syscalls); a racing open of the same principal's
        // workspace is harmless, the first one kept wins.
        let opened = Arc::new(
            Workspace::for_principal(&self.shared.home, principal)?
                .with_quota(self.shared.limits.workspace_quota_bytes)?,
        );
        let mut map = self
            .workspaces
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Ok(map.entry(principal.clone()).or_insert(opened).clone())
    }

    fn cached(&self, principal: &Principal) -> Option<Arc<Workspace>> {
        self.workspaces
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(principal)
            .cloned()
    }
}

impl std::fmt::Debug for DatarefServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatarefServer")
            .field("principal", &self.principal())
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
        let base = self.context(&context)?;
        let outcome = match context.meta.get_progress_token() {
            None => {
                let ctx = base.for_call(Arc::new(NoProgress), cancel);
                execute_tool_call(registry, call, &ctx).await
            }
            Some(token) => {
                let (sink, reports) = progress::channel();
                let ctx = base.for_call(sink, cancel);
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
        let mut result = tools::to_call_result(outcome);
        if let Some(links) = self.inner.links.get() {
            tools::add_download_links(&mut result, &base.principal, links.as_ref());
        }
        Ok(CallToolResponse::Complete(result))
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let ctx = self.context(&context)?;
        resources::list(&ctx, request.and_then(|r| r.cursor)).await
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
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let ctx = self.context(&context)?;
        resources::read(&ctx, request.uri)
            .await
            .map(ReadResourceResponse::Complete)
    }
}
