//! The composition of a dataref server: from a resolved [`Config`], everything a running
//! server needs, built in one place for every host (`dataref serve` on stdio and
//! `--http`, `dataref demo`, the benchmarks, and the agent's `chat` and the page to come).
//!
//! - [`App::start`]: the built-in sample (generated when the config is it), the artifact
//!   store, `run_python`'s sandbox (its warm pool starts filling at once, and its start
//!   sweeps dead servers' job cgroups and directories), the async runtime, the
//!   `[[upstream]]` MCP servers (connected, with progress on stderr), the tool registry
//!   (built-ins and upstream tools; a clash names the upstream and what to set) and the
//!   [`SharedContext`], the one factory of each call's
//!   [`RunContext`](dataref_tool::RunContext).
//! - [`spawn_sweepers`]: the store's sweep of expired artifacts and the spill retention
//!   sweep, of one workspace ([`SpillSweep::Workspace`]) or of every principal's.
//! - [`setup`]: the parts one by one: the data dir ([`home`]), the sample, the store, a
//!   workspace, the sandbox and the wait for its first warm sandbox, its shutdown, the
//!   open-files limit of an HTTP server.
//! - [`Sample`]: the built-in sample served to a principal of its own, the Python runtime
//!   installed first (`demo`, the model-facing benchmarks).
//!
//! Owns nothing a person types: argument parsing, config resolution (flag > environment >
//! file > default), tracing, exit codes and what each command prints are the binaries'
//! (`dataref`, `dataref-bench`). Must not import clap, anyhow, `dataref-http` (the HTTP
//! server is wrapped around what this builds, by the binary) or the test support.

mod error;
mod metrics;
mod sample;
pub mod setup;
mod sweep;
mod upstreams;

use std::sync::Arc;

use dataref_agent::AgentHost;
use dataref_builtins::builtin_registry_builder;
use dataref_config::Config;
use dataref_mcp::upstream::Upstreams;
use dataref_sandbox::pool::PythonSandbox;
use dataref_store::{ArtifactStore, SystemClock};
use dataref_tool::{SharedContext, ToolRegistry, WorkspaceMirrors};
use dataref_workspace::Mirror;

pub use error::{Error, Result};
pub use sample::Sample;
pub use setup::{
    connect_shared, ensure_sample, home, look_at_shared, open_store, progress_line, python_sandbox,
    shutdown_python, workspace,
};
pub use sweep::{SpillSweep, spawn_store_sweeper, spawn_sweepers};
pub use upstreams::{connect_upstreams, describe};

/// A server's parts, built by [`App::start`].
pub struct App {
    /// The async runtime the server, its upstream connections and its sweepers run on.
    pub runtime: tokio::runtime::Runtime,
    /// Store, limits, clock and data dir: makes each call's context.
    pub shared: SharedContext,
    /// Shut down with [`Upstreams::shutdown`] when the server stops.
    pub upstreams: Upstreams,
    pub registry: Arc<ToolRegistry>,
    /// Kept to shut it down before exiting ([`shutdown_python`]; the registry holds it too).
    pub python: Option<Arc<PythonSandbox>>,
    /// The `[agents.NAME]` profiles on this registry, and their sessions.
    pub agents: Arc<AgentHost>,
    /// The object store and index shared with other replicas (`[shared]`), if any.
    pub shared_backend: Option<dataref_replica::Shared>,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("shared", &self.shared)
            .field("registry", &self.registry)
            .finish_non_exhaustive()
    }
}

impl App {
    /// The sample, the store, the sandbox, the runtime, the upstream servers and the tool
    /// registry for `config`. A registry that cannot be built (an upstream tool named like
    /// another) shuts the upstream servers down again before the error is returned.
    pub fn start(config: &Config) -> Result<Self> {
        ensure_sample(config)?;
        let shared_backend = connect_shared(config)?;
        let store: Arc<dyn ArtifactStore> = open_store(config, shared_backend.as_ref())?;
        let python = python_sandbox(config);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(Error::AsyncRuntime)?;
        let upstreams = runtime.block_on(connect_upstreams(config))?;
        let mut builder = builtin_registry_builder(config, python.clone());
        for tool in upstreams.tools() {
            builder.register(tool);
        }
        let registry = match builder.build() {
            Ok(r) => Arc::new(r),
            Err(e) => {
                let e = upstreams::registry_error(e, &upstreams);
                runtime.block_on(upstreams.shutdown());
                return Err(Error::Registry(Box::new(e)));
            }
        };
        // With `[shared]`, every replica's sessions are the shared index's.
        let agents = match &shared_backend {
            Some(backend) => AgentHost::with_sessions(config, &registry, backend.session_store()),
            None => AgentHost::build(config, &registry),
        };
        let agents = match agents {
            Ok(a) => Arc::new(a),
            Err(e) => {
                runtime.block_on(upstreams.shutdown());
                return Err(Error::Agents(Box::new(e)));
            }
        };
        let shared = SharedContext {
            home: config.home.clone(),
            store,
            limits: config.limits.clone(),
            clock: Arc::new(SystemClock),
            mirrors: shared_backend.as_ref().map(|backend| {
                Arc::new(Mirrors {
                    backend: backend.clone(),
                    quota: config.limits.workspace_quota_bytes,
                }) as Arc<dyn WorkspaceMirrors>
            }),
        };
        // Every host's sessions past their retention go, as expired artifacts do.
        runtime.spawn(dataref_agent::session::sweep_sessions(
            agents.sessions.clone(),
            shared.clock.clone(),
        ));
        Ok(Self {
            runtime,
            shared,
            upstreams,
            registry,
            python,
            agents,
            shared_backend,
        })
    }
}

/// Each principal's workspace files in the shared backend, within the workspace quota.
#[derive(Debug)]
struct Mirrors {
    backend: dataref_replica::Shared,
    quota: u64,
}

impl WorkspaceMirrors for Mirrors {
    fn mirror(&self, principal: &dataref_protocol::Principal) -> Arc<dyn Mirror> {
        Arc::new(self.backend.workspace_files(principal, self.quota))
    }
}
