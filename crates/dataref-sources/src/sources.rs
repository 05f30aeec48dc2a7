//! [`Sources`]: the long-lived state of every configured source (one connection pool per
//! PostgreSQL source), built once with the tool registry, and the one entry point the
//! producer tools call.

use std::collections::BTreeMap;
use std::sync::Arc;

use dataref_config::{Config, SourceKind};
use dataref_protocol::Principal;
use dataref_store::{ArtifactMeta, ArtifactStore, Lineage};

use crate::error::ConnectProblem;
use crate::postgres::PgPool;
use crate::{FetchRequest, SourceError};

/// A stored result and what the model should know about how it was stored.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub meta: ArtifactMeta,
    /// Said once to the model: columns stored as text, values stored as NULL, ….
    pub notes: Vec<String>,
}

/// The pools of the PostgreSQL sources (none connects before its first call) and the
/// PostgreSQL role of each principal.
#[derive(Debug, Default)]
pub struct Sources {
    pools: BTreeMap<String, Arc<PgPool>>,
    roles: BTreeMap<Principal, String>,
}

impl Sources {
    /// One pool per PostgreSQL source of `config`; roles from `[principals.NAME] pg_role`.
    pub fn new(config: &Config) -> Self {
        let pools = config
            .sources
            .values()
            .filter_map(|s| match &s.kind {
                SourceKind::Postgres { url, pool_size } => Some((
                    s.name.clone(),
                    Arc::new(PgPool::new(&s.name, url, *pool_size)),
                )),
                // `SourceKind` is `#[non_exhaustive]`: nothing to keep for other kinds.
                _ => None,
            })
            .collect();
        let roles = config
            .principals
            .keys()
            .map(|p| (p.clone(), config.pg_role(p).to_owned()))
            .collect();
        Self { pools, roles }
    }

    /// Uses `pool` for its source (tests: a pool with its own `${NAME}` lookup).
    pub fn with_pool(mut self, pool: PgPool) -> Self {
        self.pools
            .insert(pool.source_name().to_owned(), Arc::new(pool));
        self
    }

    /// The pool of a PostgreSQL source.
    pub fn pool(&self, source: &str) -> Option<&Arc<PgPool>> {
        self.pools.get(source)
    }

    /// The PostgreSQL role `principal` runs as: its `pg_role`, else its name.
    pub fn role<'a>(&'a self, principal: &'a Principal) -> &'a str {
        self.roles
            .get(principal)
            .map_or(principal.as_str(), String::as_str)
    }

    /// Runs `req` for `owner` and stores the rows as a new table artifact of theirs.
    ///
    /// Blocking. A PostgreSQL source runs on the current tokio runtime
    /// (`Handle::block_on`), so call this from `spawn_blocking`, never from async code.
    pub fn fetch(
        &self,
        req: &FetchRequest<'_>,
        store: &dyn ArtifactStore,
        owner: &Principal,
        lineage: Lineage,
        progress: &(dyn Fn(u64) + Sync),
        is_cancelled: &(dyn Fn() -> bool + Sync),
    ) -> Result<Fetched, SourceError> {
        match &req.source.kind {
            SourceKind::Sqlite { .. } => {
                crate::fetch(req, store, owner, lineage, progress, is_cancelled).map(|meta| {
                    Fetched {
                        meta,
                        notes: Vec::new(),
                    }
                })
            }
            SourceKind::Postgres { .. } => {
                let unavailable = |message: &str| SourceError::Connect {
                    source_name: req.source.name.clone(),
                    message: message.to_owned(),
                    problem: ConnectProblem::Other,
                };
                let pool = self
                    .pools
                    .get(&req.source.name)
                    .ok_or_else(|| unavailable("internal: no pool for this source"))?;
                let handle = tokio::runtime::Handle::try_current()
                    .map_err(|_| unavailable("internal: no async runtime to run the call on"))?;
                handle.block_on(crate::postgres::fetch(
                    pool,
                    req,
                    self.role(owner),
                    store,
                    owner,
                    lineage,
                    progress,
                    is_cancelled,
                ))
            }
            other => Err(SourceError::Open {
                source_name: req.source.name.clone(),
                message: format!("this build cannot read {other:?} sources"),
            }),
        }
    }
}
