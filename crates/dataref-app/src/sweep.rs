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
    /// Every principal's in the index the replicas share (`serve --http` with `[shared]`);
    /// each replica's local copies follow at its next look. Also sweeps the bucket's
    /// objects no row names (after [`dataref_replica::ORPHAN_AGE`]).
    Shared(dataref_replica::Shared),
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
        match &spill {
            SpillSweep::Workspace(ws) => {
                dataref_tool::spawn_spill_sweeper(ws.clone(), clock, &config.spill);
            }
            SpillSweep::AllPrincipals => {
                dataref_tool::spawn_all_spill_sweeper(config.home.clone(), clock, &config.spill);
            }
            SpillSweep::Shared(backend) => {
                spawn_shared_spill_sweeper(backend.clone(), clock, &config.spill);
            }
        }
    }
    if let SpillSweep::Shared(backend) = spill {
        spawn_orphan_sweeper(backend, config.store.sweep_interval);
    }
}

/// Every `[spill] sweep_interval`, the spill files of every principal older than the
/// retention go from the shared index (any replica may do it; each row goes once).
fn spawn_shared_spill_sweeper(
    backend: dataref_replica::Shared,
    clock: Arc<dyn Clock>,
    spill: &dataref_config::SpillConfig,
) {
    let (interval, retention) = (spill.sweep_interval, spill.retention);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        loop {
            tick.tick().await;
            let cutoff = dataref_protocol::Timestamp(
                clock
                    .now()
                    .0
                    .saturating_sub(i64::try_from(retention.as_secs()).unwrap_or(i64::MAX)),
            );
            let b = backend.clone();
            match tokio::task::spawn_blocking(move || b.sweep_files(".spill", cutoff)).await {
                Ok(Ok(0)) => {}
                Ok(Ok(n)) => {
                    tracing::info!(removed = n, "swept old spill files of every workspace")
                }
                Ok(Err(e)) => tracing::warn!("sweeping the shared spill files failed: {e}"),
                Err(e) => tracing::warn!("spill sweeper task ended abnormally: {e}"),
            }
        }
    });
}

/// Every `interval`, the bucket's objects no index row names and older than
/// [`dataref_replica::ORPHAN_AGE`] go: uploads of a replica that died before indexing them,
/// replaced versions of workspace files.
fn spawn_orphan_sweeper(backend: dataref_replica::Shared, interval: Duration) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        loop {
            tick.tick().await;
            let b = backend.clone();
            match tokio::task::spawn_blocking(move || b.sweep_orphans(dataref_replica::ORPHAN_AGE))
                .await
            {
                Ok(Ok(0)) => {}
                Ok(Ok(n)) => tracing::info!(removed = n, "swept orphaned objects from the bucket"),
                Ok(Err(e)) => tracing::warn!("sweeping orphaned objects failed: {e}"),
                Err(e) => tracing::warn!("orphan sweeper task ended abnormally: {e}"),
            }
        }
    });
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
