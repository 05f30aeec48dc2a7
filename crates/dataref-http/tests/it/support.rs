#![expect(deprecated, reason = "MCP logging is what 2025-11-25 hosts use")]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dataref_builtins::builtin_registry;
use dataref_config::Config;
use dataref_mcp::rmcp::model::{
    LoggingLevel, LoggingMessageNotificationParam, ResourceUpdatedNotificationParam,
};
use dataref_mcp::rmcp::service::NotificationContext;
use dataref_mcp::rmcp::{ClientHandler, RoleClient};
use dataref_store::{ArtifactStore, Clock, LocalStore, StoreLimits, SystemClock};
use dataref_tool::ToolRegistry;
use serde_json::Value;
use tempfile::TempDir;

/// A dataref home with the built-in sample of `rows` rows, one store and one registry,
/// shared by every server made on it.
pub struct Env {
    pub home: TempDir,
    pub config: Config,
    pub store: Arc<dyn ArtifactStore>,
    pub registry: Arc<ToolRegistry>,
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
            clock,
        )?);
        let registry = Arc::new(builtin_registry(&config)?);
        Ok(Self {
            home,
            config,
            store,
            registry,
        })
    }
}

/// Every notification a session got, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Seen {
    ListChanged,
    Updated(String),
    Log(LoggingLevel, Value),
}

#[derive(Debug, Clone, Default)]
pub struct Watcher {
    pub seen: Arc<Mutex<Vec<Seen>>>,
}

impl Watcher {
    fn push(&self, s: Seen) {
        if let Ok(mut v) = self.seen.lock() {
            v.push(s);
        }
    }

    pub fn all(&self) -> Vec<Seen> {
        self.seen.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// Waits (a generous deadline, for liveness only) until `done` holds for what was seen.
    pub async fn until(&self, what: &str, done: impl Fn(&[Seen]) -> bool) -> Vec<Seen> {
        for _ in 0..1_500 {
            let seen = self.all();
            if done(&seen) {
                return seen;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("never saw {what}; saw {:?}", self.all());
    }
}

impl ClientHandler for Watcher {
    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.push(Seen::Log(params.level, params.data));
    }

    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.push(Seen::Updated(params.uri));
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.push(Seen::ListChanged);
    }
}
