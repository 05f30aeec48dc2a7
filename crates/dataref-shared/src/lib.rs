//! The shared backend: what lets several `dataref serve --http` replicas behind a load
//! balancer serve the same artifacts, workspace files, agent sessions and limits.
//!
//! - Bytes (artifact files, workspace files) live in an S3-compatible bucket, written
//!   create-only, read through a bounded local cache of whole files on each replica so
//!   memory maps and the descriptors handed to the sandbox keep working.
//! - Everything else that must be the same on every replica lives in PostgreSQL: the
//!   artifact index (owners, TTL, quotas, lineage), file metadata, agent sessions,
//!   signed-link keys, rate-limit counters.
//! - Each replica keeps its own data dir for what is local by nature: the cache, the Python
//!   runtime, sandbox jobs.
//!
//! [`Shared::connect`] checks both services and brings the index's schema up to date;
//! [`Shared::artifact_store`] is the store every tool uses, the same
//! [`LocalStore`](dataref_store::LocalStore) logic over [`PgIndex`] and [`ObjectBytes`].
//! [`Shared::session_store`] keeps the agent sessions (and holds a busy one on every
//! replica), [`Shared::approvals`] the approvals runs wait for, answered through any replica.
//!
//! Owns: `object_store` and the shared index's use of `tokio-postgres`. Credentials come
//! from the environment only and never reach the sandbox. Must not import the tools, the
//! MCP or HTTP layers' internals beyond the traits it implements.

mod approvals;
mod artifacts;
mod cache;
mod error;
mod files;
mod io;
mod keys;
mod limits;
mod locks;
mod objects;
mod pg;
mod schema;
mod sessions;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use dataref_config::SharedConfig;
use dataref_store::{Clock, LocalStore, StoreLimits};

pub use artifacts::{ObjectBytes, PgIndex};
pub use error::SharedError;
pub use files::SharedFiles;
pub use limits::LIMIT_TIMEOUT;

use crate::cache::Cache;
use crate::io::Io;
use crate::locks::Locks;
use crate::objects::Objects;
use crate::pg::Pg;

/// An object no index row names is removed once it is this old: younger ones may be an
/// upload whose row is being written right now.
pub const ORPHAN_AGE: Duration = Duration::from_secs(3600);

/// What every part of the shared backend uses: the runtime, the index, the bucket, the
/// cache.
#[derive(Debug)]
pub(crate) struct Backend {
    pub(crate) io: Io,
    pub(crate) pg: Arc<Pg>,
    pub(crate) objects: Arc<Objects>,
    pub(crate) cache: Cache,
    /// This replica's advisory locks (busy sessions, concurrency slots).
    pub(crate) locks: Locks,
}

/// A connection to the shared backend, made once per server.
#[derive(Debug, Clone)]
pub struct Shared {
    backend: Arc<Backend>,
    config: SharedConfig,
}

impl Shared {
    /// Connects to the index (making or migrating its tables) and checks the bucket can be
    /// listed. `home` is this replica's own data dir (the cache goes under `cache/`);
    /// `lookup` reads the environment (`${NAME}` in `index`, the object store's
    /// credentials).
    pub fn connect(
        config: &SharedConfig,
        home: &Path,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, SharedError> {
        let url = dataref_config::env::expand(&config.index, lookup).map_err(|e| {
            SharedError::Config {
                message: format!("`[shared] index`: {e:?}"),
                hint: "set the variable `index` names in the server's environment".into(),
            }
        })?;
        let io = Io::new(config.timeout)?;
        let pg = Pg::new(&url, config.index_pool)?;
        let objects = Arc::new(Objects::new(config, lookup)?);
        let cache = Cache::open(&home.join("cache").join("objects"), config.cache_bytes)?;
        {
            let pg = pg.clone();
            io.block("migrating the shared index", async move {
                let mut client = pg.connect().await?;
                schema::migrate(&mut client).await
            })?;
        }
        {
            let objects = objects.clone();
            io.block("listing the bucket", async move {
                objects.list(artifacts::ARTIFACTS).await.map(drop)
            })?;
        }
        tracing::info!(bucket = objects.shown(), "connected to the shared store");
        Ok(Self {
            backend: Arc::new(Backend {
                io,
                locks: Locks::new(pg.clone()),
                pg,
                objects,
                cache,
            }),
            config: config.clone(),
        })
    }

    /// The artifact store over the shared index and bucket.
    pub fn artifact_store(
        &self,
        limits: StoreLimits,
        clock: Arc<dyn Clock>,
    ) -> Result<LocalStore, dataref_store::StoreError> {
        let tmp = self.backend.cache.path(".store-tmp");
        LocalStore::with_backend(
            &tmp,
            Box::new(PgIndex::new(self.backend.clone())),
            Box::new(ObjectBytes::new(self.backend.clone())),
            limits,
            clock,
        )
    }

    /// The agent sessions in the shared index: every replica lists, reads and continues
    /// the same sessions, and a session answering a message through one replica is busy
    /// on all of them (until the run ends, or the replica dies).
    pub fn session_store(&self) -> dataref_agent::SessionStore {
        dataref_agent::SessionStore::with_backend(Box::new(sessions::PgSessions::new(
            self.backend.clone(),
        )))
    }

    /// The agent runs' pending approvals in the shared index: a run waits on the replica
    /// that runs it, the person's answer may come through any replica.
    pub fn approvals(&self) -> Arc<dyn dataref_http::ApprovalStore> {
        Arc::new(approvals::PgApprovals::new(self.backend.clone()))
    }

    /// What `serve --http` shares with the other replicas: its limits counted in the
    /// index, and (unless `[http] signing_key` is set, which wins) the download-link key
    /// every replica reads from the index, made by the first that needs it.
    pub async fn http(
        &self,
        http: &dataref_config::HttpConfig,
    ) -> Result<dataref_http::Replicated, SharedError> {
        let signing_key = match &http.signing_key {
            Some(_) => None,
            None => Some(keys::download_key(&self.backend).await?),
        };
        Ok(dataref_http::Replicated {
            limiter: Some(Arc::new(limits::PgLimiter::new(
                self.backend.clone(),
                dataref_http::LimitConfig::of(http),
                self.config.timeout,
            ))),
            signing_key,
        })
    }

    /// `principal`'s workspace files in the shared index and bucket, for
    /// [`Workspace::with_mirror`](dataref_workspace::Workspace::with_mirror): every replica's
    /// copy of the workspace is kept equal to them, within `quota` bytes in all.
    pub fn workspace_files(
        &self,
        principal: &dataref_protocol::Principal,
        quota: u64,
    ) -> SharedFiles {
        SharedFiles::new(self.backend.clone(), principal.clone(), quota)
    }

    /// Removes every principal's workspace files under `dir` (e.g. `.spill`) last written
    /// before `cutoff`, from the index (their local copies go at each replica's next look;
    /// their objects with the orphan sweep). Safe to run on every replica at once. Returns
    /// how many went.
    pub fn sweep_files(
        &self,
        dir: &str,
        cutoff: dataref_protocol::Timestamp,
    ) -> Result<u64, SharedError> {
        let pg = self.backend.pg.clone();
        let (from, to) = (format!("{dir}/"), format!("{dir}0"));
        self.backend
            .io
            .block("sweeping workspace files", async move {
                let c = pg.get().await?;
                Ok(c.execute(
                    "DELETE FROM dataref_files WHERE path >= $1 AND path < $2 AND modified < $3",
                    &[&from, &to, &cutoff.0],
                )
                .await?)
            })
    }

    /// The configuration this was connected with.
    pub fn config(&self) -> &SharedConfig {
        &self.config
    }

    /// Bytes this replica's cache holds now.
    pub fn cache_bytes(&self) -> u64 {
        self.backend.cache.total()
    }

    /// Removes objects no index row names that are older than `min_age`: artifact uploads
    /// whose replica died before the row was written or whose sweeper died before it
    /// deleted them, and workspace file versions that were replaced, removed or never
    /// indexed. Safe to run on every replica at once. Returns how many went.
    pub fn sweep_orphans(&self, min_age: Duration) -> Result<u64, SharedError> {
        let objects = self.backend.objects.clone();
        let pg = self.backend.pg.clone();
        self.backend
            .io
            .block("sweeping orphaned objects", async move {
                let mut removed = 0;
                for (dir, table, column, suffix) in [
                    (artifacts::ARTIFACTS, "dataref_artifacts", "ref", ".arrow"),
                    (files::FILES, "dataref_files", "version", ""),
                ] {
                    let old = old_objects(&objects, dir, suffix, min_age).await?;
                    if old.is_empty() {
                        continue;
                    }
                    let names: Vec<&str> = old.iter().map(|(_, n)| n.as_str()).collect();
                    let c = pg.get().await?;
                    let named: std::collections::HashSet<String> = c
                        .query(
                            &format!("SELECT {column} FROM {table} WHERE {column} = ANY($1)"),
                            &[&names],
                        )
                        .await?
                        .iter()
                        .map(|r| r.get(0))
                        .collect();
                    drop(c);
                    for (key, name) in &old {
                        if !named.contains(name) {
                            objects.delete(key).await?;
                            removed += 1;
                        }
                    }
                }
                Ok(removed)
            })
    }
}

/// The objects under `dir` older than `min_age`, with the name each row would use (the
/// key's last part without `suffix`).
async fn old_objects(
    objects: &Objects,
    dir: &str,
    suffix: &str,
    min_age: Duration,
) -> Result<Vec<(object_store::path::Path, String)>, SharedError> {
    let now = std::time::SystemTime::now();
    Ok(objects
        .list(dir)
        .await?
        .into_iter()
        .filter(|m| {
            now.duration_since(m.last_modified.into())
                .is_ok_and(|age| age >= min_age)
        })
        .filter_map(|m| {
            let rel = objects.rel(&m.location)?;
            let name = rel.strip_prefix(dir)?.strip_prefix('/')?;
            let name = name.strip_suffix(suffix)?.to_owned();
            Some((m.location.clone(), name))
        })
        .collect())
}

/// HTTPS to the object store goes through rustls with `ring` (reqwest is built without a
/// provider of its own): installed once per process, unless another part already did.
pub(crate) fn ensure_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
