//! What runs in the background for as long as a server does: the store's sweep of expired
//! artifacts and the retention sweep of spill files. (The sandbox sweeps dead servers'
//! job cgroups and directories itself, when its pool starts.)

use std::sync::Arc;
use std::time::Duration;

use dataref_config::Config;
use dataref_store::{ArtifactStore, Clock};
use dataref_workspace::Workspace;

/// Whose spill files a server sweeps.
#[derive(Debug, Clone)]
pub enum SpillSweep {
    /// One workspace's (`serve` on stdio: the session's).
    Workspace(Arc<Workspace>),
    /// Every principal's under the data dir (`serve --http`).
    AllPrincipals,
}

/// Starts the sweepers of a server under `config`: expired artifacts every
/// `[store] sweep_interval`, and, when `[spill]` is on, spill files past their retention.
/// Must be called inside the server's async runtime.
pub fn spawn_sweepers(
    config: &Config,
    store: Arc<dyn ArtifactStore>,
    clock: Arc<dyn Clock>,
    spill: SpillSweep,
) {
    spawn_store_sweeper(store, config.store.sweep_interval);
    if config.spill.enabled {
        match spill {
            SpillSweep::Workspace(ws) => {
                dataref_tool::spawn_spill_sweeper(ws, clock, &config.spill);
            }
            SpillSweep::AllPrincipals => {
                dataref_tool::spawn_all_spill_sweeper(config.home.clone(), clock, &config.spill);
            }
        }
    }
}

/// Removes expired artifacts every `interval` for as long as the server runs (reads check
/// expiry themselves; the sweep gives the disk back).
pub fn spawn_store_sweeper(store: Arc<dyn ArtifactStore>, interval: Duration) {
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
