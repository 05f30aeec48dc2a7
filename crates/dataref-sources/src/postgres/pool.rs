//! A small pool of PostgreSQL connections per source and login.
//!
//! A pool logs in either as the user of the source's `url` (the shared login of named
//! queries, which `SET LOCAL ROLE`s to each caller's role) or as one caller's own role
//! ([`RoleLogin`], for model-written SQL). A role login is checked on every new
//! connection: if the database says it can become another principal's role (or the shared
//! login, or read or signal other sessions), the connection is refused, because then a
//! statement could too.
//!
//! Invariant: a connection in `idle` is outside any transaction and carries no role,
//! setting, lock or cursor of a previous caller. A connection goes back to `idle` only
//! through [`Conn::give_back`], which the caller uses only after a call that succeeded, a
//! ROLLBACK the server acknowledged, and [`SESSION_RESET`]. Every other way out (an error,
//! a refused result, a timeout, a cancellation, a panic, a dropped future) drops the
//! connection, which closes it, so a late cancel request can only reach a closed session.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio_postgres::{Client, NoTls};

use crate::SourceError;
use crate::error::ConnectProblem;
use dataref_config::env::{ExpandError, expand};

/// How long a new connection may take before the attempt is abandoned.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Clears what a statement can leave behind in its session beyond a ROLLBACK: session
/// settings (`set_config(…, false)`), the role, cursors `WITH HOLD`, `LISTEN`, advisory
/// locks, cached plans, temporary tables and sequence state. `DISCARD ALL` would also
/// deallocate the prepared statements tokio-postgres caches for type lookups; the model
/// cannot prepare any (`PREPARE` returns no rows and is refused before it runs).
pub(crate) const SESSION_RESET: &str = "CLOSE ALL; SET SESSION AUTHORIZATION DEFAULT; \
    RESET ROLE; RESET ALL; UNLISTEN *; SELECT pg_catalog.pg_advisory_unlock_all(); \
    DISCARD PLANS; DISCARD TEMP; DISCARD SEQUENCES";

/// Where `${NAME}` in a URL is looked up: the process environment, or a map in tests.
pub type EnvLookup = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// The connections of one PostgreSQL source. Nothing connects until the first call, so a
/// server starts even when the database is briefly down.
pub struct PgPool {
    source: String,
    url: String,
    env: EnvLookup,
    size: usize,
    /// None: the user of `url`.
    login: Option<RoleLogin>,
    idle: Mutex<Vec<Client>>,
    slots: Semaphore,
}

/// Log in as one caller's own role (model-written SQL): host, port, database and options
/// come from the source's `url`, the user and password from here.
#[derive(Clone)]
pub struct RoleLogin {
    /// The principal whose calls use it (for messages).
    pub principal: String,
    pub role: String,
    /// `pg_password` of the principal, `${NAME}` expanded at each connect. None: no
    /// password is sent (`peer`, `cert`, `trust`).
    pub password: Option<String>,
    /// Roles this login must not be able to become: the other principals' roles and the
    /// source's shared login role. `pg_read_all_stats` and `pg_signal_backend` are
    /// always added (they read and cancel other sessions' statements).
    pub forbidden: Vec<String>,
}

impl std::fmt::Debug for RoleLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        f.debug_struct("RoleLogin")
            .field("principal", &self.principal)
            .field("role", &self.role)
            .field("forbidden", &self.forbidden)
            .finish_non_exhaustive()
    }
}

/// Built-in roles that see or signal every session: a login that reaches one could read
/// another principal's running statement or cancel it.
const SESSION_SPYING_ROLES: &[&str] = &["pg_read_all_stats", "pg_signal_backend"];

impl std::fmt::Debug for PgPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the URL: it may hold a password.
        f.debug_struct("PgPool")
            .field("source", &self.source)
            .field("login", &self.login)
            .field("size", &self.slots.available_permits())
            .finish_non_exhaustive()
    }
}

/// A checked-out connection. Dropping it closes the connection.
pub(crate) struct Conn<'p> {
    pool: &'p PgPool,
    client: Option<Client>,
    _slot: SemaphorePermit<'p>,
}

impl Conn<'_> {
    pub(crate) fn client(&mut self) -> Result<&mut Client, SourceError> {
        self.client.as_mut().ok_or_else(|| SourceError::Connect {
            source_name: self.pool.source.clone(),
            message: "internal: the connection was already returned".into(),
            problem: ConnectProblem::Other,
        })
    }

    /// Returns the connection to the pool. Call only after the transaction ended cleanly.
    pub(crate) fn give_back(mut self) {
        if let Some(client) = self.client.take()
            && !client.is_closed()
            && let Ok(mut idle) = self.pool.idle.lock()
        {
            idle.push(client);
        }
    }
}

impl PgPool {
    /// A pool of at most `size` connections to `url` (`${NAME}` expanded from the process
    /// environment at each connect).
    pub fn new(source: &str, url: &str, size: usize) -> Self {
        Self::with_env(source, url, size, Arc::new(dataref_config::env::process))
    }

    /// [`PgPool::new`] with `${NAME}` looked up by `env`.
    pub fn with_env(source: &str, url: &str, size: usize, env: EnvLookup) -> Self {
        Self {
            source: source.to_owned(),
            url: url.to_owned(),
            env,
            size: size.max(1),
            login: None,
            idle: Mutex::new(Vec::new()),
            slots: Semaphore::new(size.max(1)),
        }
    }

    /// A pool of the same source and size whose connections log in as `login.role`.
    pub fn for_role(&self, login: RoleLogin) -> Self {
        Self {
            source: self.source.clone(),
            url: self.url.clone(),
            env: self.env.clone(),
            size: self.size,
            login: Some(login),
            idle: Mutex::new(Vec::new()),
            slots: Semaphore::new(self.size),
        }
    }

    pub fn source_name(&self) -> &str {
        &self.source
    }

    /// The role login of this pool; None for the shared login of `url`.
    pub fn role_login(&self) -> Option<&RoleLogin> {
        self.login.as_ref()
    }

    /// The user named in `url` (the shared login role), if it names one.
    pub fn url_user(&self) -> Option<String> {
        let url = expand(&self.url, &*self.env).ok()?;
        let config: tokio_postgres::Config = url.parse().ok()?;
        config.get_user().map(str::to_owned)
    }

    /// The connection configuration, `${NAME}` expanded.
    pub(crate) fn config(&self) -> Result<tokio_postgres::Config, SourceError> {
        let fail = |problem: ConnectProblem, message: String| SourceError::Connect {
            source_name: self.source.clone(),
            message,
            problem,
        };
        let url = expand(&self.url, &*self.env).map_err(|e| match e {
            ExpandError::Unset(name) => fail(
                ConnectProblem::Env(name.clone()),
                format!("`url` uses `${{{name}}}`, which is not set"),
            ),
            ExpandError::Malformed(m) => fail(ConnectProblem::BadUrl, format!("`url`: {m}")),
        })?;
        let mut config: tokio_postgres::Config = url.parse().map_err(|e| {
            // The parser's message never repeats the URL (which may hold a password).
            fail(ConnectProblem::BadUrl, format!("`url` is not valid: {e}"))
        })?;
        if let Some(login) = &self.login {
            let password = match &login.password {
                None => None,
                Some(p) => Some(expand(p, &*self.env).map_err(|e| match e {
                    ExpandError::Unset(name) => fail(
                        ConnectProblem::Env(name.clone()),
                        format!(
                            "`pg_password` of principal `{}` uses `${{{name}}}`, which is not set",
                            login.principal
                        ),
                    ),
                    ExpandError::Malformed(m) => fail(
                        ConnectProblem::BadUrl,
                        format!("`pg_password` of principal `{}`: {m}", login.principal),
                    ),
                })?),
            };
            config = relogin(&config, &login.role, password.as_deref());
        }
        if config.get_application_name().is_none() {
            config.application_name("dataref");
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        Ok(config)
    }

    /// A connection: an idle one that is still open, or a new one. Waits at most `wait`
    /// for a free slot.
    pub(crate) async fn get(&self, wait: Duration) -> Result<Conn<'_>, SourceError> {
        let slot = match tokio::time::timeout(wait, self.slots.acquire()).await {
            Ok(Ok(slot)) => slot,
            Ok(Err(_)) | Err(_) => {
                return Err(SourceError::Connect {
                    source_name: self.source.clone(),
                    message: format!(
                        "every connection of the pool was busy for {} ms",
                        wait.as_millis()
                    ),
                    problem: ConnectProblem::Busy,
                });
            }
        };
        loop {
            let Some(client) = self.idle.lock().ok().and_then(|mut idle| idle.pop()) else {
                break;
            };
            if !client.is_closed() {
                return Ok(Conn {
                    pool: self,
                    client: Some(client),
                    _slot: slot,
                });
            }
        }
        let client = self.connect().await?;
        Ok(Conn {
            pool: self,
            client: Some(client),
            _slot: slot,
        })
    }

    /// A new connection whose I/O runs as a task on the current runtime; for a role login,
    /// refused when the role can become a forbidden one.
    pub(crate) async fn connect(&self) -> Result<Client, SourceError> {
        let client = self.open().await?;
        if let Some(login) = &self.login {
            let reach = reach(&client, login)
                .await
                .map_err(|e| super::connect_error(&self.source, &e))?;
            if !reach.is_empty() {
                // Dropping the client closes the connection before any statement ran.
                return Err(SourceError::Connect {
                    source_name: self.source.clone(),
                    message: format!(
                        "principal `{}` logs in as role `{}` for model-written SQL, and that \
                         role can become {}, so its SQL could read as them",
                        login.principal,
                        login.role,
                        reach
                            .iter()
                            .map(|r| format!("`{r}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    problem: ConnectProblem::SharedRole {
                        principal: login.principal.clone(),
                        role: login.role.clone(),
                    },
                });
            }
        }
        Ok(client)
    }

    /// A new connection, unchecked (for [`PgPool::connect`] and the `doctor` probe).
    pub(crate) async fn open(&self) -> Result<Client, SourceError> {
        let config = self.config()?;
        let connecting = config.connect(NoTls);
        let (client, connection) = match tokio::time::timeout(CONNECT_TIMEOUT, connecting).await {
            Ok(Ok(pair)) => pair,
            Ok(Err(e)) => {
                let mut err = super::connect_error(&self.source, &e);
                if let (
                    Some(login),
                    SourceError::Connect {
                        problem: problem @ ConnectProblem::Auth,
                        ..
                    },
                ) = (&self.login, &mut err)
                {
                    *problem = ConnectProblem::RoleLogin {
                        principal: login.principal.clone(),
                        role: login.role.clone(),
                    };
                }
                return Err(err);
            }
            Err(_) => {
                return Err(SourceError::Connect {
                    source_name: self.source.clone(),
                    message: format!("no answer within {}s", CONNECT_TIMEOUT.as_secs()),
                    problem: ConnectProblem::Unreachable,
                });
            }
        };
        let source = self.source.clone();
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(source = %source, error = %e, "postgres connection closed");
            }
        });
        Ok(client)
    }

    /// Idle connections (for tests of the pool's hygiene).
    pub fn idle_count(&self) -> usize {
        self.idle.lock().map_or(0, |idle| idle.len())
    }
}

/// What the login role of `client` can become that `login` forbids, as the database
/// answers it (`pg_has_role … 'MEMBER'`, direct or through other roles): the listed roles
/// and any other role that can log in (a principal not in the config runs as a role named
/// like it, and principals' roles log in); a superuser can become anyone.
pub(crate) async fn reach(
    client: &Client,
    login: &RoleLogin,
) -> Result<Vec<String>, tokio_postgres::Error> {
    let mut forbidden: Vec<String> = login
        .forbidden
        .iter()
        .filter(|r| **r != login.role)
        .cloned()
        .collect();
    forbidden.extend(SESSION_SPYING_ROLES.iter().map(|r| (*r).to_owned()));
    let row = client
        .query_one(
            "SELECT r.rolsuper, ARRAY(SELECT o.rolname::text FROM pg_catalog.pg_roles o \
             WHERE (o.rolname = ANY($1::text[]) OR o.rolcanlogin) AND o.rolname <> session_user \
             AND pg_catalog.pg_has_role(session_user, o.oid, 'MEMBER') ORDER BY 1) \
             FROM pg_catalog.pg_roles r WHERE r.rolname = session_user",
            &[&forbidden],
        )
        .await?;
    let superuser: bool = row.try_get(0)?;
    let mut reach: Vec<String> = row.try_get(1)?;
    if superuser {
        reach.insert(0, "every role (it is a superuser)".to_owned());
    }
    Ok(reach)
}

/// `base` with its user and password replaced: a fresh configuration with everything else
/// copied, so the password of `url` is never sent for another user.
fn relogin(
    base: &tokio_postgres::Config,
    user: &str,
    password: Option<&str>,
) -> tokio_postgres::Config {
    use tokio_postgres::config::Host;
    let mut c = tokio_postgres::Config::new();
    c.user(user);
    if let Some(p) = password {
        c.password(p);
    }
    // libpq's default database is the one named like the user: keep the url's.
    if let Some(db) = base.get_dbname().or(base.get_user()) {
        c.dbname(db);
    }
    if let Some(o) = base.get_options() {
        c.options(o);
    }
    if let Some(a) = base.get_application_name() {
        c.application_name(a);
    }
    for h in base.get_hosts() {
        match h {
            Host::Tcp(name) => c.host(name),
            Host::Unix(path) => c.host_path(path),
        };
    }
    for a in base.get_hostaddrs() {
        c.hostaddr(*a);
    }
    for p in base.get_ports() {
        c.port(*p);
    }
    if let Some(t) = base.get_connect_timeout() {
        c.connect_timeout(*t);
    }
    if let Some(t) = base.get_tcp_user_timeout() {
        c.tcp_user_timeout(*t);
    }
    c.ssl_mode(base.get_ssl_mode())
        .ssl_negotiation(base.get_ssl_negotiation())
        .keepalives(base.get_keepalives())
        .keepalives_idle(base.get_keepalives_idle())
        .target_session_attrs(base.get_target_session_attrs())
        .channel_binding(base.get_channel_binding())
        .load_balance_hosts(base.get_load_balance_hosts());
    if let Some(i) = base.get_keepalives_interval() {
        c.keepalives_interval(i);
    }
    if let Some(r) = base.get_keepalives_retries() {
        c.keepalives_retries(r);
    }
    c
}
