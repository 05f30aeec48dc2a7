//! `dataref serve`: MCP over stdio.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use dataref_mcp::DatarefServer;
use dataref_store::{ArtifactStore, SystemClock};
use dataref_tools::{NoProgress, RunContext, builtin_registry_with};
use tokio_util::sync::CancellationToken;

use crate::{Common, settings};

pub fn run(
    common: &Common,
    principal: Option<&str>,
    workspace: Option<&std::path::Path>,
) -> Result<ExitCode> {
    let config = settings::config(common)?;
    let principal = settings::principal(principal, &config)?;
    let workspace = settings::workspace(workspace, &config, &principal)?;
    settings::ensure_sample(&config)?;
    let store = settings::open_store(&config)?;
    let python = settings::python_sandbox(&config);
    let registry =
        Arc::new(builtin_registry_with(&config, python).context("building the tool registry")?);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        spawn_sweeper(store.clone(), config.store.sweep_interval);
        let ctx = RunContext {
            principal,
            store,
            workspace,
            limits: config.limits.clone(),
            progress: Arc::new(NoProgress),
            cancel: CancellationToken::new(),
            clock: Arc::new(SystemClock),
        };
        tracing::info!(tools = registry.len(), principal = %ctx.principal, "serving MCP on stdio");
        DatarefServer::new(registry, ctx).serve_stdio().await
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Removes expired artifacts every `interval` for as long as the server runs (reads check
/// expiry themselves; the sweep gives the disk back).
pub fn spawn_sweeper(store: Arc<dyn ArtifactStore>, interval: Duration) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        loop {
            tick.tick().await;
            let s = store.clone();
            match tokio::task::spawn_blocking(move || s.sweep()).await {
                Ok(Ok(r)) if r.removed > 0 => {
                    tracing::info!(
                        removed = r.removed,
                        bytes = r.bytes_freed,
                        "swept expired artifacts"
                    )
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!("sweeping expired artifacts failed: {e}"),
                Err(e) => tracing::warn!("sweeper task ended abnormally: {e}"),
            }
        }
    });
}
