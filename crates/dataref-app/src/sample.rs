//! [`Sample`]: the built-in sample served as `serve` serves it, to a principal of its own,
//! with the Python runtime installed first: what `dataref demo` and the model-facing
//! benchmarks (`dataref-bench context`, `first-run`) open an in-process MCP session on.

use std::path::PathBuf;
use std::sync::Arc;

use dataref_agent::AgentHost;
use dataref_agent::scripted::ScriptedAnalyst;
use dataref_config::Config;
use dataref_protocol::Principal;
use dataref_sandbox::pool::PythonSandbox;
use dataref_store::ArtifactStore;
use dataref_tool::{RunContext, ToolRegistry};

use crate::App;
use crate::error::{Error, Result};
use crate::setup::{progress_line, workspace};

/// The built-in sample under a data dir, served to one principal.
pub struct Sample {
    pub runtime: tokio::runtime::Runtime,
    pub registry: Arc<ToolRegistry>,
    /// The principal's context, in its own workspace.
    pub ctx: RunContext,
    pub store: Arc<dyn ArtifactStore>,
    /// Rows of the sample database.
    pub rows: u64,
    /// `run_python`'s sandbox (`bench first-run` watches its pool).
    pub python: Option<Arc<PythonSandbox>>,
    /// The sample's agent (`default`), answered by the scripted analyst unless
    /// `DATAREF_LLM_URL` names an endpoint.
    pub agents: Arc<AgentHost>,
}

impl std::fmt::Debug for Sample {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sample")
            .field("ctx", &self.ctx)
            .field("rows", &self.rows)
            .finish_non_exhaustive()
    }
}

impl Sample {
    /// The `rows`-row sample under `home` (generated on first use), its store and the
    /// Python runtime (installed on first use, progress on stderr).
    pub fn prepare(home: PathBuf, rows: u64, principal: &str) -> Result<Self> {
        Self::prepare_with(home, rows, principal, None)
    }

    /// [`Sample::prepare`] with `[python] pool_size` set (`bench first-run`'s baseline turns
    /// the pool off).
    pub fn prepare_with(
        home: PathBuf,
        rows: u64,
        principal: &str,
        pool_size: Option<usize>,
    ) -> Result<Self> {
        let mut config = Config::builtin_sample(home, rows);
        if let Some(n) = pool_size {
            config.python.pool_size = n;
        }
        config.principal = Principal::new(principal)?;
        let App {
            runtime,
            shared,
            upstreams,
            registry,
            python,
            agents,
            shared_backend: _,
        } = App::start(&config)?;
        // The built-in sample mounts no upstream servers.
        drop(upstreams);
        // Without an endpoint, the sample's agent is the scripted analyst (it says so).
        agents.set_fallback(Arc::new(ScriptedAnalyst));
        if let Some(sandbox) = &python {
            // The first run installs the runtime from PyPI: say so, step by step, on stderr.
            sandbox
                .runtime(&|step| progress_line(&format!("python runtime: {step}")))
                .map_err(|e| Error::PythonRuntime(Box::new(e)))?;
            // Installed just now: fill the pool (a no-op fill when it is filling already).
            sandbox.prewarm();
        }
        let workspace = workspace(None, &shared, &config.principal)?;
        let ctx = shared.context(config.principal.clone(), workspace);
        let rows = config.sample.as_ref().map_or(0, |s| s.rows);
        Ok(Self {
            runtime,
            registry,
            ctx,
            store: shared.store,
            rows,
            python,
            agents,
        })
    }
}
