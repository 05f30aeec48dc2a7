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
//! [`LocalStore`] logic over [`PgIndex`] and [`ObjectBytes`].
//! [`Shared::session_store`] keeps the agent sessions (and holds a busy one on every
//! replica), [`Shared::approvals`] the approvals runs wait for, answered through any replica.
//!
//! Owns: `object_store` and the shared index's use of `tokio-postgres`. Credentials come
//! from the environment only and never reach the sandbox. Must not import the tools, the
//! MCP or HTTP layers' internals beyond the traits it implements.

mod approvals;
mod artifacts;
mod audit;
mod cache;
mod error;
mod files;
mod io;
mod keys;
mod limits;
mod locks;
mod objects;
mod parts;
mod pg;
mod schema;
mod sessions;
mod tls;
mod usage;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use dataref_config::SharedConfig;
use dataref_store::{Clock, LocalStore, StoreLimits};
use futures_util::StreamExt;

pub use artifacts::{ObjectBytes, PgIndex};
pub use error::SharedError;
pub use files::SharedFiles;
pub use limits::LIMIT_TIMEOUT;

use crate::cache::Cache;
use crate::io::Io;
use crate::locks::Locks;
use crate::objects::Objects;
use crate::pg::Pg;
use crate::schema::Migrations;

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
    /// Tables being fetched in parts (see [`parts`]).
    pub(crate) parts: parts::PartFiles,
    /// This replica's advisory locks (busy sessions, concurrency slots).
    pub(crate) locks: Locks,
    /// The exclusive `flock` on the data dir of a server using it (see [`lock_home`]).
    _home_lock: Option<std::fs::File>,
}

/// What `GET /ready` checks on a replica: the index answers a statement and the bucket a
/// request, each within `[shared] timeout` (at most [`READY_BOUND`]).
struct Ready(Arc<Backend>);

/// The longest `/ready` waits for either answer: a balancer's check gives up soon too.
pub const READY_BOUND: Duration = Duration::from_secs(5);

#[async_trait::async_trait]
impl dataref_http::Readiness for Ready {
    async fn check(&self) -> Result<(), String> {
        let b = &self.0;
        let bound = b.io.timeout().min(READY_BOUND);
        let index = {
            let pg = b.pg.clone();
            b.io.run("asking the index", async move {
                pg.get().await?.simple_query("SELECT 1").await?;
                Ok(())
            })
        };
        let objects = {
            let objects = b.objects.clone();
            b.io.run("asking the object store", async move {
                objects.reachable().await
            })
        };
        // The answer names what is out of reach; how (addresses, the error) goes to the log.
        let bounded = |what: &'static str, r: Result<Result<(), SharedError>, _>| match r {
            Ok(Ok(())) => None,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "not ready: {what} is out of reach");
                Some(format!("{what} is out of reach"))
            }
            Err(_) => {
                tracing::warn!("not ready: {what} did not answer within {bound:?}");
                Some(format!("{what} did not answer within {bound:?}"))
            }
        };
        let (index, objects) = tokio::join!(
            tokio::time::timeout(bound, index),
            tokio::time::timeout(bound, objects)
        );
        let problems: Vec<String> = [
            bounded("the shared index (PostgreSQL)", index),
            bounded("the object store", objects),
        ]
        .into_iter()
        .flatten()
        .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }
}

/// A connection to the shared backend, made once per server.
#[derive(Debug, Clone)]
pub struct Shared {
    backend: Arc<Backend>,
    config: SharedConfig,
    /// What [`Shared::connect_without_migrating`] found missing in the index.
    pending: Vec<&'static str>,
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
        Self::open(config, home, lookup, Migrations::Apply)
    }

    /// [`Shared::connect`] for a tool that only looks (`dataref doctor`, `dataref
    /// sessions`): the index's schema is not changed; [`Shared::pending_migrations`] says
    /// what the next server to start will apply.
    pub fn connect_without_migrating(
        config: &SharedConfig,
        home: &Path,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, SharedError> {
        Self::open(config, home, lookup, Migrations::Check)
    }

    fn open(
        config: &SharedConfig,
        home: &Path,
        lookup: &dyn Fn(&str) -> Option<String>,
        migrations: Migrations,
    ) -> Result<Self, SharedError> {
        let url = dataref_config::env::expand(&config.index, lookup).map_err(|e| {
            SharedError::Config {
                message: format!("`[shared] index`: {e:?}"),
                hint: "set the variable `index` names in the server's environment".into(),
            }
        })?;
        // A server owns its data dir's copies of the shared workspaces (which version each
        // local file holds is known per process): a second one on the same dir would undo
        // the first's writes. A command that only looks takes no lock.
        let home_lock = match migrations {
            Migrations::Apply => Some(lock_home(home)?),
            Migrations::Check => None,
        };
        let io = Io::new(config.timeout)?;
        let pg = Pg::new(
            &url,
            config.index_ca.as_deref(),
            config.index_pool,
            config.timeout,
        )?;
        let objects = Arc::new(Objects::new(config, lookup)?);
        let cache = Cache::open(&home.join("cache").join("objects"), config.cache_bytes)?;
        let pending = {
            let pg = pg.clone();
            io.block("migrating the shared index", async move {
                let mut client = pg.connect().await?;
                schema::migrate(&mut client, migrations).await
            })?
        };
        {
            let objects = objects.clone();
            io.block("listing the bucket", async move {
                objects
                    .list_stream(artifacts::ARTIFACTS)
                    .next()
                    .await
                    .transpose()
                    .map(drop)
                    .map_err(SharedError::from)
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
                parts: parts::PartFiles::default(),
                _home_lock: home_lock,
            }),
            config: config.clone(),
            pending,
        })
    }

    /// The index's migrations this build would apply (only after
    /// [`Shared::connect_without_migrating`]; a server applies them as it connects).
    pub fn pending_migrations(&self) -> &[&'static str] {
        &self.pending
    }

    /// The artifact store over the shared index and bucket.
    pub fn artifact_store(
        &self,
        limits: StoreLimits,
        clock: Arc<dyn Clock>,
    ) -> Result<LocalStore, dataref_store::StoreError> {
        // Staged beside the cache's downloads: renamed into the cache when published, and
        // removed when a crash left them (`Cache::open` clears old files there).
        let tmp = self.backend.cache.path(".tmp");
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
        .with_ledger(self.usage_ledger())
    }

    /// The usage ledger in the shared index: every replica's model requests, which
    /// `[budgets]` count and `dataref usage` reports.
    pub fn usage_ledger(&self) -> Arc<dyn dataref_agent::budget::UsageLedger> {
        Arc::new(usage::PgUsage::new(self.backend.clone()))
    }

    /// A copy of each line of this process's audit trail (`trail`, its id) into the index's
    /// `dataref_audit`, written in the background; lines that cannot be kept are dropped
    /// and counted (`dataref_ops::audit::dropped`), and a line whose seq the index holds
    /// with another hash is counted ([`audit_conflicts`](Self::audit_conflicts)) and
    /// logged. `dataref_ops::audit::flush` waits for its queue at exit.
    pub fn audit_forward(&self, trail: &str) -> Box<dyn dataref_ops::audit::Forward> {
        Box::new(audit::PgAudit::start(
            self.backend.clone(),
            trail.to_owned(),
        ))
    }

    /// The index's copy of trail `trail`'s lines, by seq (for `dataref audit verify` and the
    /// tests).
    pub fn audit_lines(&self, trail: &str) -> Result<Vec<(u64, String)>, SharedError> {
        audit::lines(&self.backend, trail)
    }

    /// Lines the index already held under their seq with another hash, since the process
    /// started: two trails with one id, or a trail rewritten. Each is logged.
    pub fn audit_conflicts(&self) -> u64 {
        audit::conflicts()
    }

    /// The agent runs' pending approvals in the shared index: a run waits on the replica
    /// that runs it, the person's answer may come through any replica.
    pub fn approvals(&self) -> Arc<dyn dataref_agent::approvals::ApprovalStore> {
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
            readiness: Some(Arc::new(Ready(self.backend.clone()))),
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
        self.backend.io.block_for(
            "sweeping workspace files",
            Duration::from_secs(3600),
            async move {
                // In batches, so a backlog neither holds one long statement nor times out
                // whole; rows another sweeper holds are skipped (it removes them).
                let mut removed = 0;
                loop {
                    let n = pg
                        .get()
                        .await?
                        .execute(
                            "DELETE FROM dataref_files WHERE (principal, path) IN ( \
                               SELECT principal, path FROM dataref_files \
                               WHERE path >= $1 AND path < $2 AND modified < $3 \
                               LIMIT 1000 FOR UPDATE SKIP LOCKED)",
                            &[&from, &to, &cutoff.0],
                        )
                        .await?;
                    removed += n;
                    if n < 1000 {
                        return Ok(removed);
                    }
                }
            },
        )
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
        // A listing of a large bucket takes a while: bounded by an hour, not the timeout.
        self.backend.io.block_for(
            "sweeping orphaned objects",
            Duration::from_secs(3600),
            async move {
                // Ages by the index's clock, the one every replica shares: a replica whose
                // own clock runs fast must not take a fresh upload for an old one.
                let now: i64 = pg
                    .get()
                    .await?
                    .query_one("SELECT extract(epoch FROM now())::BIGINT", &[])
                    .await?
                    .get(0);
                let cutoff =
                    now.saturating_sub(i64::try_from(min_age.as_secs()).unwrap_or(i64::MAX));
                let mut removed = 0;
                for kind in [Orphans::Artifacts, Orphans::Files] {
                    let mut listed = objects.list_stream(kind.dir());
                    let mut page = Vec::new();
                    loop {
                        let next = listed.next().await.transpose()?;
                        let done = next.is_none();
                        if let Some(meta) = next {
                            let old = meta.last_modified.timestamp() <= cutoff;
                            if old
                                && let Some(name) =
                                    objects.rel(&meta.location).and_then(|r| kind.name(r))
                            {
                                page.push((meta.location.clone(), name.to_owned()));
                            }
                            if page.len() < ORPHAN_PAGE {
                                continue;
                            }
                        }
                        removed += remove_unnamed(&pg, &objects, kind, &page).await?;
                        page.clear();
                        if done {
                            break;
                        }
                    }
                }
                Ok(removed)
            },
        )
    }
}

/// Objects are checked against the index this many at a time.
const ORPHAN_PAGE: usize = 1000;

/// The two kinds of objects the index names.
#[derive(Debug, Clone, Copy)]
enum Orphans {
    /// `artifacts/<ref>.arrow` (and its piece hashes, `<ref>.arrow.b3`), named by
    /// `dataref_artifacts.ref`.
    Artifacts,
    /// `files/<version>`, named by `dataref_files.version`.
    Files,
}

impl Orphans {
    fn dir(self) -> &'static str {
        match self {
            Self::Artifacts => artifacts::ARTIFACTS,
            Self::Files => files::FILES,
        }
    }

    fn query(self) -> &'static str {
        match self {
            Self::Artifacts => "SELECT ref FROM dataref_artifacts WHERE ref = ANY($1)",
            Self::Files => "SELECT version FROM dataref_files WHERE version = ANY($1)",
        }
    }

    /// The name a row would use for the object at `rel` (relative to the deployment's
    /// prefix), only if it is exactly such a name: a key under another deployment's prefix
    /// nested below this one's (`files/team-b/...`) is never this deployment's to remove.
    fn name(self, rel: &str) -> Option<&str> {
        let name = rel.strip_prefix(self.dir())?.strip_prefix('/')?;
        match self {
            Self::Artifacts => {
                // The object, or the piece hashes kept beside it.
                let name = name.strip_suffix(".b3").unwrap_or(name);
                let r = name.strip_suffix(".arrow")?;
                dataref_protocol::DataRef::parse(r).is_ok().then_some(r)
            }
            Self::Files => files::is_version(name).then_some(name),
        }
    }
}

/// Removes the objects of `page` no row names; how many went.
async fn remove_unnamed(
    pg: &Arc<Pg>,
    objects: &Objects,
    kind: Orphans,
    page: &[(object_store::path::Path, String)],
) -> Result<u64, SharedError> {
    if page.is_empty() {
        return Ok(0);
    }
    let names: Vec<&str> = page.iter().map(|(_, n)| n.as_str()).collect();
    let named: std::collections::HashSet<String> = pg
        .get()
        .await?
        .query(kind.query(), &[&names])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut removed = 0;
    for (key, name) in page {
        if !named.contains(name) {
            objects.delete(key).await?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// Takes `<home>/shared.lock` for this process alone, or says which data dir is taken.
#[expect(
    clippy::disallowed_methods,
    reason = "the lock file of the data dir, outside every workspace"
)]
fn lock_home(home: &Path) -> Result<std::fs::File, SharedError> {
    use rustix::fs::{FlockOperation, flock};
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o711)
        .create(home)
        .map_err(|e| SharedError::local("cannot create directory", home, e))?;
    let path = home.join("shared.lock");
    let file = std::fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| SharedError::local("cannot open", &path, e))?;
    match flock(&file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(file),
        Err(rustix::io::Errno::WOULDBLOCK) => Err(SharedError::Config {
            message: format!(
                "another dataref process serves the data dir `{}` with `[shared]`",
                home.display()
            ),
            hint: "give each replica (and each `dataref chat`) a data dir of its own: `--home DIR`"
                .into(),
        }),
        Err(e) => Err(SharedError::local("cannot lock", &path, e.into())),
    }
}
