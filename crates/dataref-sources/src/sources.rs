//! [`Sources`]: the long-lived state of every configured source (one connection pool per
//! PostgreSQL source), built once with the tool registry, and the one entry point the
//! producer tools call.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use dataref_config::{Config, SourceKind};
use dataref_protocol::Principal;
use dataref_store::{ArtifactMeta, ArtifactStore, Lineage};

use crate::adbc::{AdbcLogin, AdbcSource};
use crate::error::ConnectProblem;
use crate::mysql::{Login, MysqlSource};
use crate::postgres::{PgPool, RoleLogin};
use crate::{FetchRequest, SourceError, SqlPolicy};

/// A stored result and what the model should know about how it was stored.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub meta: ArtifactMeta,
    /// Said once to the model: columns stored as text, values stored as NULL, ….
    pub notes: Vec<String>,
}

/// The pools of the PostgreSQL sources (none connects before its first call) and the
/// PostgreSQL role of each principal.
///
/// A source has one pool that logs in as the user of its `url` (named queries, and
/// model-written SQL where `allow_sql_shared_roles` is set) and, made at first use, one
/// pool per caller's role that logs in as that role (model-written SQL): a statement can
/// then only become roles that role is a member of, and each new connection is refused
/// when the database says those include another principal's role.
#[derive(Debug, Default)]
pub struct Sources {
    pools: BTreeMap<String, Arc<PgPool>>,
    roles: BTreeMap<Principal, String>,
    /// `pg_password` of each principal that has one (`${NAME}` not yet expanded).
    passwords: BTreeMap<Principal, String>,
    /// The roles of every configured principal and of the stdio principal.
    all_roles: BTreeSet<String>,
    /// Model-written SQL's pools, by source and login role.
    sql_pools: Mutex<BTreeMap<(String, String), Arc<PgPool>>>,
    /// The engine's working memory for a query on a `files` source (`[sql] memory`).
    sql_memory_bytes: u64,
    /// The MySQL sources.
    mysql: BTreeMap<String, Arc<MysqlSource>>,
    /// `mysql_user` and `mysql_password` of each principal that has one.
    mysql_logins: BTreeMap<Principal, (String, Option<String>)>,
    /// The server's own principal (stdio, or HTTP without auth): it may use the user of
    /// a MySQL source's `url`, and an ADBC source's own options.
    operator: Option<Principal>,
    /// Each principal's own options per ADBC source.
    adbc_logins: BTreeMap<(Principal, String), BTreeMap<String, String>>,
}

impl Sources {
    /// One pool per PostgreSQL source of `config`; roles from `[principals.NAME] pg_role`.
    pub fn new(config: &Config) -> Self {
        let pools = config
            .sources
            .values()
            .filter_map(|s| match &s.kind {
                SourceKind::Postgres { url, pool_size, .. } => Some((
                    s.name.clone(),
                    Arc::new(PgPool::new(&s.name, url, *pool_size)),
                )),
                // `SourceKind` is `#[non_exhaustive]`: nothing to keep for other kinds.
                _ => None,
            })
            .collect();
        let roles: BTreeMap<Principal, String> = config
            .principals
            .keys()
            .map(|p| (p.clone(), config.pg_role(p).to_owned()))
            .collect();
        let passwords = config
            .principals
            .keys()
            .filter_map(|p| Some((p.clone(), config.pg_password(p)?.to_owned())))
            .collect();
        let mysql = config
            .sources
            .values()
            .filter_map(|s| match &s.kind {
                SourceKind::Mysql { url, .. } => {
                    Some((s.name.clone(), Arc::new(MysqlSource::new(&s.name, url))))
                }
                _ => None,
            })
            .collect();
        let mysql_logins = config
            .principals
            .keys()
            .filter_map(|p| {
                let user = config.mysql_user(p)?.to_owned();
                Some((
                    p.clone(),
                    (user, config.mysql_password(p).map(str::to_owned)),
                ))
            })
            .collect();
        let mut all_roles: BTreeSet<String> = roles.values().cloned().collect();
        all_roles.insert(config.pg_role(&config.principal).to_owned());
        Self {
            pools,
            roles,
            passwords,
            all_roles,
            sql_pools: Mutex::new(BTreeMap::new()),
            sql_memory_bytes: config.sql.memory_bytes,
            mysql,
            mysql_logins,
            operator: Some(config.principal.clone()),
            adbc_logins: config
                .principals
                .iter()
                .flat_map(|(p, c)| {
                    c.adbc
                        .iter()
                        .map(move |(source, o)| ((p.clone(), source.clone()), o.clone()))
                })
                .collect(),
        }
    }

    /// Whose options a call of `principal` on ADBC source `source` uses.
    pub fn adbc_login(
        &self,
        source: &str,
        principal: &Principal,
        allow_shared_login: bool,
    ) -> Result<AdbcLogin, SourceError> {
        if let Some(options) = self
            .adbc_logins
            .get(&(principal.clone(), source.to_owned()))
        {
            return Ok(AdbcLogin {
                principal: principal.as_str().to_owned(),
                options: options.clone(),
            });
        }
        if allow_shared_login || self.operator.as_ref() == Some(principal) {
            return Ok(AdbcLogin {
                principal: principal.as_str().to_owned(),
                options: BTreeMap::new(),
            });
        }
        Err(SourceError::Connect {
            source_name: source.to_owned(),
            message: format!(
                "principal `{principal}` has no credentials of its own for this source"
            ),
            problem: ConnectProblem::NoAdbcLogin {
                principal: principal.as_str().to_owned(),
                source: source.to_owned(),
            },
        })
    }

    /// The executable ADBC workers run as: this program (`dataref adbc-worker`).
    pub fn adbc_worker(&self) -> Result<std::path::PathBuf, SourceError> {
        std::env::current_exe().map_err(|e| SourceError::Open {
            source_name: "adbc".into(),
            message: format!("cannot find this program to start the ADBC worker: {e}"),
        })
    }

    /// Uses `source` for its name (tests: a source with its own `${NAME}` lookup).
    pub fn with_mysql(mut self, source: MysqlSource) -> Self {
        self.mysql
            .insert(source.source_name().to_owned(), Arc::new(source));
        self
    }

    /// A MySQL source by name.
    pub fn mysql_source(&self, name: &str) -> Option<&Arc<MysqlSource>> {
        self.mysql.get(name)
    }

    /// Logs `principal` in to MySQL sources as `user` (tests, and callers that build
    /// `Sources` by hand).
    pub fn with_mysql_user(
        mut self,
        principal: Principal,
        user: &str,
        password: Option<&str>,
    ) -> Self {
        self.mysql_logins
            .insert(principal, (user.to_owned(), password.map(str::to_owned)));
        self
    }

    /// Who `principal` logs in to MySQL source `source` as: its own `mysql_user`, else the
    /// user of the source's `url` where that is allowed.
    pub fn mysql_login(
        &self,
        source: &str,
        principal: &Principal,
        allow_shared_login: bool,
    ) -> Result<Login, SourceError> {
        if let Some((user, password)) = self.mysql_logins.get(principal) {
            return Ok(Login {
                principal: principal.as_str().to_owned(),
                user: Some(user.clone()),
                password: password.clone(),
            });
        }
        if allow_shared_login || self.operator.as_ref() == Some(principal) {
            return Ok(Login {
                principal: principal.as_str().to_owned(),
                user: None,
                password: None,
            });
        }
        Err(SourceError::Connect {
            source_name: source.to_owned(),
            message: format!("principal `{principal}` has no MySQL user of its own"),
            problem: ConnectProblem::NoMysqlUser {
                principal: principal.as_str().to_owned(),
            },
        })
    }

    /// The engine's working memory for one query on a `files` source (`[sql] memory`).
    pub fn sql_memory_bytes(&self) -> u64 {
        if self.sql_memory_bytes == 0 {
            dataref_config::SqlConfig::default().memory_bytes
        } else {
            self.sql_memory_bytes
        }
    }

    /// Uses `pool` for its source (tests: a pool with its own `${NAME}` lookup).
    pub fn with_pool(mut self, pool: PgPool) -> Self {
        self.pools
            .insert(pool.source_name().to_owned(), Arc::new(pool));
        self
    }

    /// Also runs `principal` as `role` (tests, and callers that build `Sources` by hand).
    pub fn with_role(mut self, principal: Principal, role: &str, password: Option<&str>) -> Self {
        self.all_roles.insert(role.to_owned());
        self.roles.insert(principal.clone(), role.to_owned());
        if let Some(p) = password {
            self.passwords.insert(principal, p.to_owned());
        }
        self
    }

    /// The pool of a PostgreSQL source (its shared login).
    pub fn pool(&self, source: &str) -> Option<&Arc<PgPool>> {
        self.pools.get(source)
    }

    /// The pool model-written SQL of `principal` runs on: logged in as its own role.
    /// Made at first use; None for a source that is not PostgreSQL.
    pub fn sql_pool(&self, source: &str, principal: &Principal) -> Option<Arc<PgPool>> {
        let base = self.pools.get(source)?;
        let role = self.role(principal).to_owned();
        let mut pools = self.sql_pools.lock().ok()?;
        let key = (source.to_owned(), role.clone());
        if let Some(pool) = pools.get(&key) {
            return Some(pool.clone());
        }
        let mut forbidden: Vec<String> = self
            .all_roles
            .iter()
            .filter(|r| **r != role)
            .cloned()
            .collect();
        forbidden.extend(base.url_user().filter(|u| *u != role));
        let pool = Arc::new(base.for_role(RoleLogin {
            principal: principal.as_str().to_owned(),
            role,
            password: self.passwords.get(principal).cloned(),
            forbidden,
        }));
        pools.insert(key, pool.clone());
        Some(pool)
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
                let shared_ok = matches!(
                    req.source.kind,
                    SourceKind::Postgres {
                        allow_sql_shared_roles: true,
                        ..
                    }
                );
                let pool = match req.policy {
                    SqlPolicy::Generic if !shared_ok => self.sql_pool(&req.source.name, owner),
                    SqlPolicy::Generic | SqlPolicy::Configured => {
                        self.pools.get(&req.source.name).cloned()
                    }
                }
                .ok_or_else(|| unavailable("internal: no pool for this source"))?;
                let handle = tokio::runtime::Handle::try_current()
                    .map_err(|_| unavailable("internal: no async runtime to run the call on"))?;
                handle.block_on(crate::postgres::fetch(
                    &pool,
                    req,
                    self.role(owner),
                    store,
                    owner,
                    lineage,
                    progress,
                    is_cancelled,
                ))
            }
            SourceKind::Mysql {
                allow_shared_login, ..
            } => {
                let unavailable = |message: &str| SourceError::Connect {
                    source_name: req.source.name.clone(),
                    message: message.to_owned(),
                    problem: ConnectProblem::Other,
                };
                let source = self
                    .mysql
                    .get(&req.source.name)
                    .cloned()
                    .ok_or_else(|| unavailable("internal: this source was not set up"))?;
                let login = self.mysql_login(&req.source.name, owner, *allow_shared_login)?;
                let handle = tokio::runtime::Handle::try_current()
                    .map_err(|_| unavailable("internal: no async runtime to run the call on"))?;
                handle.block_on(crate::mysql::fetch(
                    &source,
                    &login,
                    req,
                    store,
                    owner,
                    lineage,
                    progress,
                    is_cancelled,
                ))
            }
            SourceKind::Adbc {
                allow_shared_login, ..
            } => {
                let source = AdbcSource::of(req.source).ok_or_else(|| SourceError::Open {
                    source_name: req.source.name.clone(),
                    message: "internal: not an adbc source".into(),
                })?;
                let login = self.adbc_login(&req.source.name, owner, *allow_shared_login)?;
                crate::adbc::fetch(
                    &self.adbc_worker()?,
                    &source,
                    &login,
                    req,
                    store,
                    owner,
                    lineage,
                    progress,
                    is_cancelled,
                    &dataref_config::env::process,
                )
            }
            other => Err(SourceError::Open {
                source_name: req.source.name.clone(),
                message: format!("this build cannot read {other:?} sources"),
            }),
        }
    }
}
