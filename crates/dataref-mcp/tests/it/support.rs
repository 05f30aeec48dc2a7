use std::sync::{Arc, Mutex};

use dataref_builtins::builtin_registry;
use dataref_config::Config;
use dataref_mcp::rmcp::model::{CallToolRequestParams, CallToolResult, ProgressNotificationParam};
use dataref_mcp::rmcp::service::NotificationContext;
use dataref_mcp::rmcp::{ClientHandler, RoleClient};
use dataref_mcp::{DatarefServer, InProcessSession, connect_in_process};
use dataref_protocol::Principal;
use dataref_store::{ArtifactStore, Clock, LocalStore, StoreLimits, SystemClock};
use dataref_tool::{NoProgress, RunContext, ToolRegistry};
use serde_json::Value;
use tempfile::TempDir;
use tokio_util::sync::CancellationToken;

/// A dataref home with the built-in sample of `rows` rows, one store and one registry,
/// shared by every session opened on it.
pub struct Env {
    pub home: TempDir,
    pub config: Config,
    pub store: Arc<dyn ArtifactStore>,
    pub registry: Arc<ToolRegistry>,
    clock: Arc<dyn Clock>,
}

impl Env {
    pub fn new(rows: u64) -> anyhow::Result<Self> {
        let home = tempfile::tempdir()?;
        let config = Config::builtin_sample(home.path().to_path_buf(), rows);
        let spec = config
            .sample
            .clone()
            .ok_or_else(|| anyhow::anyhow!("the sample config has no sample"))?;
        dataref_sources::ensure_sample(&spec, &|_| {})?;
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let store: Arc<dyn ArtifactStore> = Arc::new(LocalStore::open(
            home.path(),
            StoreLimits::default(),
            clock.clone(),
        )?);
        let registry = Arc::new(builtin_registry(&config)?);
        Ok(Self {
            home,
            config,
            store,
            registry,
            clock,
        })
    }

    pub fn server(&self, principal: &str) -> anyhow::Result<DatarefServer> {
        Ok(DatarefServer::new(
            self.registry.clone(),
            self.context(principal)?,
        ))
    }

    /// A session's base context, as a server builds it.
    pub fn context(&self, principal: &str) -> anyhow::Result<RunContext> {
        let principal = Principal::new(principal)?;
        let workspace = Arc::new(dataref_workspace::Workspace::for_principal(
            self.home.path(),
            &principal,
        )?);
        Ok(RunContext {
            principal,
            store: self.store.clone(),
            workspace,
            limits: self.config.limits.clone(),
            progress: Arc::new(NoProgress),
            cancel: CancellationToken::new(),
            clock: self.clock.clone(),
        })
    }

    pub async fn connect(&self, principal: &str) -> anyhow::Result<InProcessSession<Recorder>> {
        Ok(connect_in_process(self.server(principal)?, Recorder::default()).await?)
    }

    /// Files under `artifacts/` (finished and partial).
    pub fn artifact_files(&self) -> Vec<std::path::PathBuf> {
        fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
            let Ok(entries) = std::fs::read_dir(dir) else {
                return;
            };
            for e in entries.flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(&p, out);
                } else {
                    out.push(p);
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.home.path().join("artifacts"), &mut out);
        out
    }
}

/// A client that keeps every progress notification it receives.
#[derive(Debug, Clone, Default)]
pub struct Recorder {
    pub progress: Arc<Mutex<Vec<ProgressNotificationParam>>>,
}

impl ClientHandler for Recorder {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        if let Ok(mut seen) = self.progress.lock() {
            seen.push(params);
        }
    }
}

pub async fn call(
    session: &InProcessSession<Recorder>,
    name: &str,
    args: Value,
) -> anyhow::Result<CallToolResult> {
    let mut params = CallToolRequestParams::new(name.to_owned());
    if let Value::Object(o) = args {
        params = params.with_arguments(o);
    }
    Ok(session.client.call_tool(params).await?)
}

/// The text block every result starts with.
pub fn text(result: &CallToolResult) -> &str {
    result
        .content
        .first()
        .and_then(|c| c.as_text())
        .map_or("<no text block first>", |t| t.text.as_str())
}

pub fn is_error(result: &CallToolResult) -> bool {
    result.is_error == Some(true)
}
