//! [`DatarefServer`]: the tool registry, the caller's artifacts and workspace files behind
//! rmcp's [`ServerHandler`].

mod workspaces;

use std::sync::{Arc, OnceLock};

use dataref_protocol::Principal;
use dataref_tool::{
    NoProgress, OutcomeKind, RunContext, SharedContext, ToolCall, ToolRegistry, execute_tool_call,
};
use dataref_workspace::{Workspace, WorkspaceError};
#[expect(
    deprecated,
    reason = "MCP logging is deprecated by SEP-2577 but still in 2025-11-25, which hosts speak"
)]
use rmcp::model::SetLevelRequestParams;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CompleteRequestParams, CompleteResult,
    GetPromptRequestParams, GetPromptResponse, Implementation, ListPromptsResult,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ServerCapabilities, ServerConfig,
    SubscribeRequestParams, SubscriptionFilter, Tool, UnsubscribeRequestParams,
};
use rmcp::service::{RequestContext, SubscriptionContext};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::host::{Caller, DownloadLinks};
use crate::notify::{Change, Level, LogSink, Session, Watch};
use crate::prompts::Prompts;
use crate::{completion, progress, resources, tools};

/// The `logger` of every log message dataref sends.
const LOGGER: &str = "dataref";

/// What a client (and through it, the model) is told at `initialize`. Worded to stay
/// true while only some of the tools it names are configured.
pub const INSTRUCTIONS: &str = "\
dataref keeps data on the server and gives you references to it. Never ask for raw rows, and \
never copy rows into messages or tool arguments.
- Producers (`fetch_*`, `query`) run a query, store the result and return a `dataRef` with the \
schema, row count, null counts and a tiny sample: enough to write code against, not the data.
- Inspect a stored table with `describe_data` (statistics per column); find earlier results \
with `list_artifacts`.
- Compute next to the data, passing dataRefs as inputs: `run_sql` for one SELECT (filter, join, \
group, pivot, window), `run_python` (when available) for what SQL cannot say.
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
///   to every handler), with that principal's workspace (a bounded cache keeps the
///   recently used ones open). A request
///   without a [`Caller`] is refused with an internal error: there is no default principal.
///
/// Cheap to clone (two `Arc`s). A clone is the same MCP session (its log level and
/// resource subscriptions); [`DatarefServer::for_session`] starts a new one.
#[derive(Clone)]
pub struct DatarefServer {
    inner: Arc<Inner>,
    session: Arc<Session>,
}

struct Inner {
    registry: Arc<ToolRegistry>,
    contexts: Contexts,
    /// Set by the HTTP layer: signed download URLs for the files a result links.
    links: OnceLock<Arc<dyn DownloadLinks>>,
    /// Converted once (the registry is immutable): what a host without MCP Apps lists,
    /// every tool the model may call, with no `_meta.ui`.
    tools: Vec<Tool>,
    /// What a host with MCP Apps lists: every tool, the view's own among them, with
    /// `_meta.ui` (the host keeps the `visibility: ["app"]` ones from the model).
    app_tools: Vec<Tool>,
    prompts: Prompts,
    /// Every principal's resources, watched while one of its sessions listens.
    watch: Arc<Watch>,
}

/// Where a request's [`RunContext`] comes from. Its `progress` and `cancel` are replaced
/// on every call by the request's own.
enum Contexts {
    Fixed(RunContext),
    PerRequest(PerPrincipal),
}

struct PerPrincipal {
    shared: SharedContext,
    /// Opened on a principal's request and kept while recently used (bounded).
    workspaces: workspaces::Cache,
}

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
                workspaces: workspaces::Cache::new(workspaces::CAP),
            }),
        )
    }

    fn with_contexts(registry: Arc<ToolRegistry>, contexts: Contexts) -> Self {
        let tools = registry
            .specs()
            .filter(|s| !s.ui.app_only)
            .map(tools::to_mcp_tool)
            .collect();
        let app_tools = registry.specs().map(tools::to_mcp_app_tool).collect();
        let prompts = Prompts::new(&registry);
        Self {
            inner: Arc::new(Inner {
                registry,
                contexts,
                links: OnceLock::new(),
                tools,
                app_tools,
                prompts,
                watch: Arc::default(),
            }),
            session: Arc::default(),
        }
    }

    /// The same server for a new MCP session: its own log level and subscriptions, the
    /// tools, principals and watched resources shared. The HTTP service makes one per
    /// session.
    pub fn for_session(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            session: Arc::default(),
        }
    }

    /// From now on, results that link workspace files for the person also carry a signed
    /// download URL for each (the first call wins).
    pub fn set_download_links(&self, links: Arc<dyn DownloadLinks>) {
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
    /// else (per-request server) its own under the data dir, from the cache. `None` when a
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
    pub fn forget_idle_workspaces(&self) {
        if let Contexts::PerRequest(p) = &self.inner.contexts {
            p.workspaces.forget_idle();
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
                Ok(p.shared.context(principal.clone(), workspace))
            }
        }
    }

    /// `tools/call`, inside its request's span.
    async fn call_tool_traced(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let args = request
            .arguments
            .map_or_else(|| Value::Object(Map::new()), Value::Object);
        let name = request.name.into_owned();
        let registry = &self.inner.registry;
        // The view's own tools are for a host that shows the view (it declared the
        // extension): to any other client they do not exist, called or listed.
        let app_only = registry.get(&name).is_some_and(|t| t.spec().ui.app_only);
        if app_only && !crate::view::host_shows_views(&context) {
            let outcome = dataref_tool::unknown_tool(registry, &name);
            return Ok(CallToolResponse::Complete(tools::to_call_result(outcome)));
        }
        // The request id names the call in the log and in its outcome.
        let call = ToolCall::new(name.clone(), args).with_id(context.id.to_string());
        // The request's token: `notifications/cancelled` cancels it, and the tool's
        // producer polls it and removes its partial artifact.
        let cancel = context.ct.clone();
        let base = self.context(&context)?;
        let log = LogSink::new(context.peer.clone(), self.session.level());
        let token = context.meta.get_progress_token();
        let outcome = if token.is_none() && !log.wants(Level::Debug) {
            let ctx = base.for_call(Arc::new(NoProgress), cancel);
            execute_tool_call(registry, call, &ctx).await
        } else {
            let (sink, reports, steps) =
                progress::channel(token.is_some(), log.wants(Level::Debug));
            let ctx = base.for_call(sink, cancel);
            let done = CancellationToken::new();
            let run = async {
                let outcome = execute_tool_call(registry, call, &ctx).await;
                done.cancel();
                outcome
            };
            let forward = async {
                if let Some(token) = token {
                    progress::forward(context.peer.clone(), token, reports, done.clone()).await;
                }
            };
            let log_steps = progress::log_steps(steps, &log, &name, LOGGER, done.clone());
            tokio::join!(run, forward, log_steps).0
        };
        if outcome.is_error() {
            let first = outcome.text.lines().next().unwrap_or_default();
            log.send(
                Level::Warning,
                LOGGER,
                json!({"tool": name, "message": format!("`{name}` failed: {}", first.trim_start_matches("error: "))}),
            )
            .await;
        } else if let (OutcomeKind::Spilled, Some(spilled)) =
            (outcome.kind, outcome.structured.as_ref())
        {
            let path = spilled
                .get("path")
                .and_then(Value::as_str)
                .unwrap_or_default();
            log.send(
                Level::Notice,
                LOGGER,
                json!({
                    "tool": name,
                    "spilled": path,
                    "bytes": spilled.get("bytes"),
                    "message": format!("the result of `{name}` was large and is in your workspace at `{path}`"),
                }),
            )
            .await;
        }
        self.inner.watch.refresh(&base.principal).await;
        let mut result = tools::to_call_result(outcome);
        if let Some(links) = self.inner.links.get() {
            tools::add_download_links(&mut result, &base.principal, links.as_ref());
        }
        Ok(CallToolResponse::Complete(result))
    }
}

impl PerPrincipal {
    fn workspace(&self, principal: &Principal) -> Result<Arc<Workspace>, WorkspaceError> {
        self.workspaces
            .get_or_open(principal, || self.shared.principal_workspace(principal))
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
    #[expect(
        deprecated,
        reason = "MCP logging is deprecated by SEP-2577 but still in 2025-11-25, which hosts speak"
    )]
    fn get_info(&self) -> ServerConfig {
        let mut capabilities = ServerCapabilities::builder()
            .enable_logging()
            .enable_completions()
            .enable_prompts()
            .enable_resources()
            .enable_tools()
            .enable_resources_subscribe()
            .enable_resources_list_changed()
            .build();
        capabilities.extensions = Some(crate::view::server_extensions());
        ServerConfig::new(capabilities)
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
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let tools = if crate::view::host_shows_views(&context) {
            &self.inner.app_tools
        } else {
            &self.inner.tools
        };
        Ok(ListToolsResult::with_all_items(tools.clone()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.inner
            .app_tools
            .iter()
            .find(|t| t.name == name)
            .cloned()
    }

    /// Every tool failure (unknown tool, bad arguments, expired reference, timeout, …) is
    /// an `isError` result the model reads; `execute_tool_call` owns those branches. This
    /// never returns a protocol error.
    ///
    /// Log messages about the call (at the session's level) go to the caller's own
    /// request: its progress steps (`debug`), a result spilled to the workspace
    /// (`notice`), a failed call (`warning`). Then the caller's resources are looked at
    /// again, so its listening sessions learn what the call added or changed.
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        // One trace per request (over stdio or HTTP): the tool call, the SQL, the sandbox
        // and the store below are its children.
        let span = tracing::info_span!(
            "mcp_request",
            otel.name = %format_args!("tools/call {}", request.name),
            otel.kind = "server",
            mcp.method.name = "tools/call",
            gen_ai.tool.name = %request.name,
            jsonrpc.request.id = %context.id,
        );
        self.call_tool_traced(request, context)
            .instrument(span)
            .await
    }

    /// Also starts sending this session its principal's `notifications/resources/list_changed`
    /// (and `updated` for what it subscribed to): a client that lists resources shows them.
    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let ctx = self.context(&context)?;
        self.session
            .forward(&self.inner.watch, &ctx, context.peer.clone())
            .await;
        let cursor = request.and_then(|r| r.cursor);
        let first_page = cursor.is_none();
        let mut listed = resources::list(&ctx, cursor).await?;
        // A host that shows views finds the view among the resources, first.
        if first_page && crate::view::host_shows_views(&context) {
            listed.resources.insert(0, crate::view::resource());
        }
        Ok(listed)
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
        // A trace of its own, as each tools/call has: the store read below is its child.
        let span = mcp_span("resources/read", &context);
        async {
            let ctx = self.context(&context)?;
            resources::read(&ctx, request.uri)
                .await
                .map(ReadResourceResponse::Complete)
        }
        .instrument(span)
        .await
    }

    /// `notifications/resources/updated` for `uri` from now on, to this session only, when
    /// the table goes away (expired) or the file is rewritten or removed. The resource
    /// need not exist yet; only the caller's own resources can be named at all.
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let ctx = self.context(&context)?;
        let uri = resources::subscribable(&request.uri)?;
        self.session.subscribe(uri);
        self.session
            .forward(&self.inner.watch, &ctx, context.peer.clone())
            .await;
        Ok(())
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.context(&context)?;
        if let Ok(uri) = resources::subscribable(&request.uri) {
            self.session.unsubscribe(&uri);
        }
        Ok(())
    }

    /// 2026-07-28 `subscriptions/listen`: the resource list of the caller and the
    /// caller's own resources among those requested.
    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        let mut accepted = SubscriptionFilter::new();
        accepted.resources_list_changed = requested.resources_list_changed;
        accepted.resource_subscriptions = requested.resource_subscriptions.as_ref().map(|uris| {
            uris.iter()
                .filter(|u| resources::subscribable(u).is_ok_and(|c| &c == *u))
                .cloned()
                .collect()
        });
        Some(accepted)
    }

    async fn listen(&self, subscription: SubscriptionContext) -> Result<(), McpError> {
        let ctx = self.context(subscription.request_context())?;
        let mut changes = self.inner.watch.subscribe(&ctx).await;
        let accepted = subscription.accepted().clone();
        loop {
            let change = tokio::select! {
                () = subscription.cancelled() => return Ok(()),
                c = changes.recv() => c,
            };
            let sent = match change {
                Ok(Change::ListChanged)
                | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    if accepted.resources_list_changed != Some(true) {
                        continue;
                    }
                    subscription.sink().notify_resource_list_changed().await
                }
                Ok(Change::Updated(uri)) => {
                    let wanted = accepted
                        .resource_subscriptions
                        .as_ref()
                        .is_some_and(|u| u.contains(&uri));
                    if !wanted {
                        continue;
                    }
                    subscription.sink().notify_resource_updated(uri).await
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return Ok(()),
            };
            if sent.is_err() {
                return Ok(());
            }
        }
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        Ok(self.inner.prompts.list())
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        let ctx = self.context(&context)?;
        self.inner
            .prompts
            .get(&request.name, request.arguments, &ctx)
            .await
            .map(GetPromptResponse::Complete)
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, McpError> {
        let ctx = self.context(&context)?;
        completion::complete(&self.inner.prompts, request, &ctx).await
    }

    /// This session's level from now on; other sessions keep theirs.
    #[expect(
        deprecated,
        reason = "MCP logging is deprecated by SEP-2577 but still in 2025-11-25, which hosts speak"
    )]
    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.context(&context)?;
        self.session.set_level(Level::from_mcp(request.level));
        Ok(())
    }
}

/// The root span of one MCP request other than `tools/call` (which names its tool too).
fn mcp_span(method: &'static str, context: &RequestContext<RoleServer>) -> tracing::Span {
    tracing::info_span!(
        "mcp_request",
        otel.name = method,
        otel.kind = "server",
        mcp.method.name = method,
        jsonrpc.request.id = %context.id,
    )
}
