use std::path::PathBuf;
use std::sync::Arc;

use dataref_config::CallLimits;
use dataref_protocol::Principal;
use dataref_store::{ArtifactStore, Clock};
use dataref_workspace::{Mirror, Workspace, WorkspaceError};
use tokio_util::sync::CancellationToken;

/// Where a tool reports progress on long work (rows fetched so far, …). The MCP server
/// turns reports into `notifications/progress` when the client asked for them.
pub trait ProgressSink: Send + Sync {
    fn report(&self, progress: f64, total: Option<f64>, message: Option<String>);
}

/// A sink that drops every report.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoProgress;

impl ProgressSink for NoProgress {
    fn report(&self, _: f64, _: Option<f64>, _: Option<String>) {}
}

/// What the host injects into every tool call. Never part of the model's schema: the
/// principal comes from the transport (stdio user, bearer token), not from arguments.
#[derive(Clone)]
pub struct RunContext {
    pub principal: Principal,
    pub store: Arc<dyn ArtifactStore>,
    /// The caller's workspace: every file a tool reads or writes for the model is in it.
    pub workspace: Arc<Workspace>,
    pub limits: CallLimits,
    pub progress: Arc<dyn ProgressSink>,
    /// Cancelled when the client cancels the request or the call times out.
    pub cancel: CancellationToken,
    pub clock: Arc<dyn Clock>,
}

impl RunContext {
    /// The same context with another progress sink and a child cancellation token, for
    /// one call.
    pub fn for_call(&self, progress: Arc<dyn ProgressSink>, cancel: CancellationToken) -> Self {
        Self {
            progress,
            cancel,
            ..self.clone()
        }
    }
}

impl std::fmt::Debug for RunContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunContext")
            .field("principal", &self.principal)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// What every call's [`RunContext`] shares in one server (store, limits, clock, data dir),
/// and the one place a [`RunContext`] is made from them: for a fixed principal (stdio, the
/// demo, benchmarks) or per request (HTTP, each caller in its own workspace).
#[derive(Clone)]
pub struct SharedContext {
    /// The data directory; principal `p`'s own workspace is `<home>/workspaces/<p>`.
    pub home: PathBuf,
    pub store: Arc<dyn ArtifactStore>,
    pub limits: CallLimits,
    pub clock: Arc<dyn Clock>,
    /// Set when several replicas share each principal's workspace (`[shared]`): the local
    /// directory is then kept equal to the shared files through the principal's mirror.
    pub mirrors: Option<Arc<dyn WorkspaceMirrors>>,
}

/// Under the data dir, where a replica keeps its copies of the shared workspaces.
pub const SHARED_WORKSPACES: &str = "shared";

/// Each principal's [`Mirror`] when workspaces are shared by several replicas.
pub trait WorkspaceMirrors: Send + Sync + std::fmt::Debug {
    fn mirror(&self, principal: &Principal) -> Arc<dyn Mirror>;
}

impl SharedContext {
    /// The context of `principal`'s calls in `workspace`: no progress sink and a fresh
    /// cancellation token (a server replaces both per call with [`RunContext::for_call`]).
    pub fn context(&self, principal: Principal, workspace: Arc<Workspace>) -> RunContext {
        RunContext {
            principal,
            store: self.store.clone(),
            workspace,
            limits: self.limits.clone(),
            progress: Arc::new(NoProgress),
            cancel: CancellationToken::new(),
            clock: self.clock.clone(),
        }
    }

    /// `principal`'s own workspace under the data dir (created on first use), bounded by
    /// [`CallLimits::workspace_quota_bytes`]; with [`SharedContext::mirrors`], the local copy of
    /// the workspace the replicas share.
    pub fn principal_workspace(&self, principal: &Principal) -> Result<Workspace, WorkspaceError> {
        match &self.mirrors {
            // A directory of its own (`<home>/shared/workspaces/<p>`): syncing removes local
            // files the index does not have, and files a server wrote before `[shared]` was
            // turned on stay where they were instead.
            Some(m) => Ok(
                Workspace::for_principal(&self.home.join(SHARED_WORKSPACES), principal)?
                    .with_quota(self.limits.workspace_quota_bytes)?
                    .with_mirror(m.mirror(principal)),
            ),
            None => Workspace::for_principal(&self.home, principal)?
                .with_quota(self.limits.workspace_quota_bytes),
        }
    }
}

impl std::fmt::Debug for SharedContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedContext")
            .field("home", &self.home)
            .finish_non_exhaustive()
    }
}
