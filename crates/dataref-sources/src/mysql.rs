//! The MySQL and MariaDB producer: one statement run as the caller's own database user,
//! streamed over the binary protocol into a table artifact.
//!
//! Every call opens its own connection, logged in as the caller's user
//! ([`Login`]), and runs:
//!
//! ```sql
//! SET SESSION time_zone = '+00:00';            -- TIMESTAMP values arrive in UTC
//! SET SESSION max_statement_time = <timeout>;  -- MariaDB (MySQL: max_execution_time)
//! START TRANSACTION READ ONLY;
//! -- the statement, prepared (one statement; it must return rows), then executed
//! ROLLBACK;
//! ```
//!
//! so the database's grants decide what comes back, and the transaction refuses writes.
//! There is no `SET ROLE` to another user in MySQL: the boundary between principals is the
//! login. For model-written SQL the login's global privileges (its own and its enabled
//! roles') are checked before the statement runs, and a login that holds more than
//! reading (`FILE` reads the server's files, `PROCESS` other sessions' statements, `SUPER`
//! and the admin privileges reach past the transaction) is refused. A statement that
//! prepares to no result columns (`CALL`, `SET ROLE`, `SELECT … INTO OUTFILE`, any write)
//! is refused before it runs.
//!
//! The source's timeout is enforced twice: by the server's statement limit and by a
//! client-side deadline that sends `KILL QUERY` on a second connection, as cancellation
//! does. A connection serves one call and is closed, so nothing a statement leaves in its
//! session reaches another call.

mod decode;
mod sql;

use std::sync::Arc;
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_schema::{Field, Schema, SchemaRef};
use dataref_config::env::{ExpandError, expand};
use dataref_protocol::Principal;
use dataref_store::{ArtifactStore, Lineage, TableWriter};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, OptsBuilder, Value};
use tokio::time::Instant;

use self::decode::{Column, Plan};
use crate::error::ConnectProblem;
use crate::postgres::EnvLookup;
use crate::sqlite::unique_names;
use crate::{FetchRequest, Fetched, ParamValue, SourceError, SqlPolicy};

/// Rows per Arrow batch written to the store.
const BATCH_ROWS: usize = 65_536;
/// Bytes of text and binary values per batch: a batch is cut earlier when its values
/// reach this, far below the 2 GiB an Arrow string column's offsets can address.
const BATCH_BYTES: usize = 256 << 20;
/// How often a running call asks whether it was cancelled.
const POLL: Duration = Duration::from_millis(20);
/// How long a new connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `KILL QUERY`, or the ROLLBACK, may take before the connection is given up.
const GRACE: Duration = Duration::from_secs(5);

/// Global privileges a login for model-written SQL may hold: reading, and seeing names.
const READ_PRIVILEGES: [&str; 4] = ["USAGE", "SELECT", "SHOW VIEW", "SHOW DATABASES"];

/// Who a call logs in as.
#[derive(Clone)]
pub struct Login {
    /// The principal the call is for (for messages).
    pub principal: String,
    /// `mysql_user` of the principal; None: the user of the source's `url`.
    pub user: Option<String>,
    /// `mysql_password` of the principal, `${NAME}` not yet expanded.
    pub password: Option<String>,
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        f.debug_struct("Login")
            .field("principal", &self.principal)
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// A MySQL or MariaDB source: its URL (`${NAME}` expanded at each connect).
pub struct MysqlSource {
    name: String,
    url: String,
    env: EnvLookup,
}

impl std::fmt::Debug for MysqlSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MysqlSource")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Why a call stopped before its statement finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Cancelled,
    Timeout,
}

/// A failed step: the server's (or the driver's) error, ours, or a stop.
enum Failure {
    Db(mysql_async::Error),
    Ours(SourceError),
    Stopped(Stop),
}

impl From<mysql_async::Error> for Failure {
    fn from(e: mysql_async::Error) -> Self {
        Self::Db(e)
    }
}

impl From<dataref_store::StoreError> for Failure {
    fn from(e: dataref_store::StoreError) -> Self {
        Self::Ours(e.into())
    }
}

impl From<SourceError> for Failure {
    fn from(e: SourceError) -> Self {
        Self::Ours(e)
    }
}

impl MysqlSource {
    /// `url`: `mysql://user:${PASSWORD}@host:3306/db` (`?socket=/run/mysqld/mysqld.sock`
    /// for a Unix socket).
    pub fn new(name: &str, url: &str) -> Self {
        Self::with_env(name, url, Arc::new(dataref_config::env::process))
    }

    /// [`MysqlSource::new`] with its own `${NAME}` lookup (tests).
    pub fn with_env(name: &str, url: &str, env: EnvLookup) -> Self {
        Self {
            name: name.to_owned(),
            url: url.to_owned(),
            env,
        }
    }

    pub fn source_name(&self) -> &str {
        &self.name
    }

    fn connect_error(&self, message: String, problem: ConnectProblem) -> SourceError {
        SourceError::Connect {
            source_name: self.name.clone(),
            message,
            problem,
        }
    }

    fn expand(&self, value: &str) -> Result<String, SourceError> {
        expand(value, &|k| (self.env)(k)).map_err(|e| match e {
            ExpandError::Unset(name) => self.connect_error(
                format!("`${{{name}}}` in the source's settings is not set"),
                ConnectProblem::Env(name),
            ),
            ExpandError::Malformed(m) => self.connect_error(m, ConnectProblem::BadUrl),
        })
    }

    /// The connection options of `login`: host, port, database and options from the
    /// source's `url`; user and password from the login when it has its own.
    fn opts(&self, login: &Login) -> Result<Opts, SourceError> {
        let url = self.expand(&self.url)?;
        let base = Opts::from_url(&url).map_err(|e| {
            self.connect_error(
                format!("the `url` is not a MySQL URL: {e}"),
                ConnectProblem::BadUrl,
            )
        })?;
        let mut b = OptsBuilder::from_opts(base)
            .prefer_socket(false)
            .stmt_cache_size(0);
        if let Some(user) = &login.user {
            let password = login
                .password
                .as_deref()
                .map(|p| self.expand(p))
                .transpose()?;
            b = b.user(Some(user.clone())).pass(password);
        }
        Ok(b.into())
    }

    async fn connect(
        &self,
        opts: Opts,
        login: &Login,
        within: Duration,
    ) -> Result<Conn, SourceError> {
        match tokio::time::timeout(within.min(CONNECT_TIMEOUT), Conn::new(opts)).await {
            Err(_) => Err(self.connect_error(
                "no answer from the server".into(),
                ConnectProblem::Unreachable,
            )),
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) => Err(self.classify_connect(&e, login)),
        }
    }

    /// A connection attempt's error, by the server's error code, never by its message.
    fn classify_connect(&self, e: &mysql_async::Error, login: &Login) -> SourceError {
        let problem = match e {
            mysql_async::Error::Server(s) => match s.code {
                // ER_ACCESS_DENIED_ERROR, ER_DBACCESS_DENIED_ERROR
                1045 | 1044 if login.user.is_some() => ConnectProblem::MysqlLogin {
                    principal: login.principal.clone(),
                    user: login.user.clone().unwrap_or_default(),
                },
                1045 | 1044 => ConnectProblem::Auth,
                // ER_BAD_DB_ERROR
                1049 => ConnectProblem::NoDatabase,
                _ => ConnectProblem::Other,
            },
            mysql_async::Error::Io(_) => ConnectProblem::Unreachable,
            _ => ConnectProblem::Other,
        };
        let message = match e {
            mysql_async::Error::Server(s) => s.message.clone(),
            other => other.to_string(),
        };
        self.connect_error(message, problem)
    }
}

/// Runs `req` on `source`, logged in as `login`, and streams the rows into a new table
/// artifact owned by `owner`. `progress` gets the rows so far after each batch;
/// `is_cancelled` is polled while the call runs.
#[expect(
    clippy::too_many_arguments,
    reason = "the producer contract, as for PostgreSQL"
)]
pub async fn fetch(
    source: &MysqlSource,
    login: &Login,
    req: &FetchRequest<'_>,
    store: &dyn ArtifactStore,
    owner: &Principal,
    lineage: Lineage,
    progress: &(dyn Fn(u64) + Sync),
    is_cancelled: &(dyn Fn() -> bool + Sync),
) -> Result<Fetched, SourceError> {
    let started = Instant::now();
    let deadline = started + req.source.timeout;
    // Only operator SQL has named parameters; model SQL is sent as written.
    let (sql, params) = match req.policy {
        SqlPolicy::Configured => {
            let p = sql::positional_params(req.sql, true);
            let values = req.bind(&p.names, param)?;
            (p.sql, values)
        }
        SqlPolicy::Generic => (req.sql.to_owned(), Vec::new()),
    };
    if is_cancelled() {
        return Err(SourceError::Cancelled);
    }
    let opts = source.opts(login)?;
    let mut conn = source
        .connect(
            opts.clone(),
            login,
            deadline.saturating_duration_since(Instant::now()),
        )
        .await?;
    let id = conn.id();
    let user = login
        .user
        .clone()
        .or_else(|| opts.user().map(str::to_owned))
        .unwrap_or_default();
    let call = Call {
        req,
        login,
        user: &user,
        owner,
        source_name: source.source_name(),
        check_privileges: req.policy == SqlPolicy::Generic,
    };
    let work = call.run(
        &mut conn,
        &sql,
        params,
        store,
        lineage,
        progress,
        is_cancelled,
        deadline,
    );
    let outcome = tokio::select! {
        biased;
        r = work => r,
        stop = watch(is_cancelled, deadline) => Err(Failure::Stopped(stop)),
    };
    match outcome {
        Ok(fetched) => {
            let closed = async {
                conn.query_drop("ROLLBACK").await?;
                conn.disconnect().await
            };
            if tokio::time::timeout(GRACE, closed).await.is_err() {
                tracing::debug!(source = %source.source_name(), "closing a MySQL connection timed out");
            }
            tracing::debug!(
                source = %source.source_name(),
                user,
                rows = fetched.meta.rows,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "fetched"
            );
            Ok(fetched)
        }
        Err(f) => {
            // The statement may still be running or sending rows: stop it on the server
            // (a user may kill its own statements), then close the connection.
            let killed = async {
                let mut killer = Conn::new(opts).await?;
                killer.query_drop(format!("KILL QUERY {id}")).await?;
                killer.disconnect().await
            };
            // A server error ended the statement already; anything else may not have.
            if !matches!(f, Failure::Db(mysql_async::Error::Server(_))) {
                let _ = tokio::time::timeout(GRACE, killed).await;
            }
            drop(conn);
            Err(call.error(f))
        }
    }
}

/// `:name` → `?`: the SQL and the name bound to each `?` in order. `backslash_escapes`:
/// a backslash in a string literal escapes the next character (MySQL), or is a character
/// (standard SQL: SQLite, Snowflake, DuckDB).
pub(crate) fn positional(sql: &str, backslash_escapes: bool) -> (String, Vec<String>) {
    let p = sql::positional_params(sql, backslash_escapes);
    (p.sql, p.names)
}

fn param(v: &ParamValue) -> Value {
    match v {
        ParamValue::Null => Value::NULL,
        ParamValue::Integer(i) => Value::Int(*i),
        ParamValue::Real(r) => Value::Double(*r),
        ParamValue::Text(s) => Value::Bytes(s.as_bytes().to_vec()),
    }
}

async fn watch(is_cancelled: &(dyn Fn() -> bool + Sync), deadline: Instant) -> Stop {
    loop {
        if is_cancelled() {
            return Stop::Cancelled;
        }
        let now = Instant::now();
        if now >= deadline {
            return Stop::Timeout;
        }
        tokio::time::sleep(POLL.min(deadline - now)).await;
    }
}

struct Call<'r, 'a> {
    req: &'r FetchRequest<'a>,
    login: &'r Login,
    user: &'r str,
    owner: &'r Principal,
    source_name: &'r str,
    check_privileges: bool,
}

impl Call<'_, '_> {
    /// Classifies by the server's error code, never by the message text.
    fn error(&self, f: Failure) -> SourceError {
        let e = match f {
            Failure::Stopped(Stop::Cancelled) => return SourceError::Cancelled,
            Failure::Stopped(Stop::Timeout) => {
                return SourceError::Timeout {
                    after: self.req.source.timeout,
                };
            }
            Failure::Ours(e) => return e,
            Failure::Db(e) => e,
        };
        let s = match e {
            mysql_async::Error::Server(s) => s,
            mysql_async::Error::Io(e) => {
                return SourceError::Connect {
                    source_name: self.source_name.to_owned(),
                    message: format!("the connection failed during the call: {e}"),
                    problem: ConnectProblem::Other,
                };
            }
            // The driver's own checks (a `?` placeholder in model SQL, a malformed packet).
            other => {
                return SourceError::Mysql {
                    code: 0,
                    message: other.to_string(),
                };
            }
        };
        match s.code {
            // ER_QUERY_INTERRUPTED, MariaDB's ER_STATEMENT_TIMEOUT, MySQL's
            // ER_QUERY_TIMEOUT: the server's statement limit.
            1317 | 1969 | 3024 => SourceError::Timeout {
                after: self.req.source.timeout,
            },
            // ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION
            1792 => SourceError::NotAllowed {
                what: "a statement that writes to the database".into(),
            },
            // ER_DBACCESS_DENIED, ER_TABLEACCESS_DENIED, ER_COLUMNACCESS_DENIED,
            // ER_SPECIFIC_ACCESS_DENIED, ER_PROCACCESS_DENIED, ER_ACCESS_DENIED_NO_PASSWORD
            1044 | 1142 | 1143 | 1227 | 1370 | 1698 => SourceError::MysqlDenied {
                principal: self.owner.as_str().to_owned(),
                user: self.user.to_owned(),
                message: s.message,
            },
            code => SourceError::Mysql {
                code,
                message: s.message,
            },
        }
    }

    #[expect(clippy::too_many_arguments, reason = "one call's state, passed once")]
    async fn run(
        &self,
        conn: &mut Conn,
        sql: &str,
        params: Vec<Value>,
        store: &dyn ArtifactStore,
        mut lineage: Lineage,
        progress: &(dyn Fn(u64) + Sync),
        is_cancelled: &(dyn Fn() -> bool + Sync),
        deadline: Instant,
    ) -> Result<Fetched, Failure> {
        conn.query_drop("SET SESSION time_zone = '+00:00'").await?;
        let left = deadline.saturating_duration_since(Instant::now());
        // MariaDB's limit is in seconds; where it is an unknown variable
        // (ER_UNKNOWN_SYSTEM_VARIABLE), this is MySQL, whose limit is in milliseconds.
        let mariadb = format!(
            "SET SESSION max_statement_time = {:.3}",
            left.as_secs_f64().max(0.001)
        );
        match conn.query_drop(mariadb).await {
            Err(mysql_async::Error::Server(s)) if s.code == 1193 => {
                let mysql = format!(
                    "SET SESSION max_execution_time = {}",
                    left.as_millis().max(1)
                );
                conn.query_drop(mysql).await?;
            }
            other => other?,
        }
        conn.query_drop("START TRANSACTION READ ONLY").await?;
        if self.check_privileges {
            self.check_login(conn).await?;
        }
        lineage.set_source_version(gtid_executed(conn).await);

        let stmt = conn.prep(sql).await?;
        if stmt.num_columns() == 0 {
            return Err(SourceError::NotAllowed {
                what: "a statement that returns no rows (send one SELECT)".into(),
            }
            .into());
        }
        let mut result = conn.exec_iter(&stmt, params).await?;
        let cols = result.columns().unwrap_or_else(|| stmt.columns());
        let owned: Vec<String> = cols.iter().map(|c| c.name_str().into_owned()).collect();
        let names = unique_names(owned.iter().map(String::as_str));
        let plans = cols
            .iter()
            .zip(&names)
            .map(|(c, name)| {
                decode::plan(c).map_err(|message| SourceError::Unsupported {
                    column: name.clone(),
                    message,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut notes = Vec::new();
        for (name, plan) in names.iter().zip(&plans) {
            if *plan == Plan::DecimalText {
                notes.push(format!(
                    "column `{name}` is a DECIMAL of more than 38 digits, so it is stored as exact \
                     decimal text; cast in SQL for numbers (`CAST({name} AS DECIMAL(38,2))` or \
                     `CAST({name} AS DOUBLE)`)"
                ));
            }
        }
        let schema: SchemaRef = Arc::new(Schema::new(
            names
                .iter()
                .zip(&plans)
                .map(|(name, plan)| Field::new(name, plan.data_type(), true))
                .collect::<Vec<_>>(),
        ));
        let columns = plans
            .iter()
            .zip(&names)
            .map(|(plan, name)| {
                Column::new(*plan, BATCH_ROWS).map_err(|message| SourceError::Unsupported {
                    column: name.clone(),
                    message,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let writer = store.create_table(self.owner, schema.clone(), lineage)?;
        let mut sink = Sink {
            names,
            columns,
            schema,
            writer,
            in_batch: 0,
            in_batch_bytes: 0,
            total: 0,
            max_rows: self.req.source.max_rows,
            progress,
        };
        while let Some(row) = result.next().await? {
            sink.push(row.unwrap())?;
            if sink.in_batch == BATCH_ROWS || sink.in_batch_bytes >= BATCH_BYTES {
                sink.flush()?;
                if is_cancelled() {
                    return Err(Failure::Stopped(Stop::Cancelled));
                }
                if Instant::now() >= deadline {
                    return Err(Failure::Stopped(Stop::Timeout));
                }
            }
        }
        drop(result);
        let meta = sink.finish()?;
        Ok(Fetched { meta, notes })
    }

    /// Refuses a login whose global privileges, or its enabled roles', go past reading.
    async fn check_login(&self, conn: &mut Conn) -> Result<(), Failure> {
        let beyond = beyond_reading(conn).await?;
        if beyond.is_empty() {
            return Ok(());
        }
        Err(SourceError::Connect {
            source_name: self.source_name.to_owned(),
            message: format!(
                "MySQL user `{}` holds global privileges beyond reading: {}",
                self.user,
                beyond.join(", ")
            ),
            problem: ConnectProblem::MysqlPrivileges {
                principal: self.login.principal.clone(),
                user: self.user.to_owned(),
            },
        }
        .into())
    }
}

/// The global privileges of the session's user and of its enabled roles that go past
/// reading, sorted; empty for a login that can only read.
/// The server's executed GTID set (MySQL's `gtid_executed`, MariaDB's `gtid_current_pos`)
/// as the read starts: the source's version in a receipt. `None` where the server keeps
/// none (GTIDs off: an empty set) or will not say.
async fn gtid_executed(conn: &mut Conn) -> Option<String> {
    for asked in [
        "SELECT @@GLOBAL.gtid_executed",
        "SELECT @@GLOBAL.gtid_current_pos",
    ] {
        match conn.query_first::<Option<String>, _>(asked).await {
            Ok(Some(Some(set))) if !set.trim().is_empty() => {
                return Some(format!(
                    "gtid {}",
                    set.split_whitespace().collect::<String>()
                ));
            }
            Ok(_) => return None,
            Err(e) => tracing::debug!(error = %e, "no GTID set from this server"),
        }
    }
    None
}

async fn beyond_reading(conn: &mut Conn) -> Result<Vec<String>, mysql_async::Error> {
    // Every value read as `Option`: the driver's conversion panics on a NULL where a
    // `String` was asked for (ENABLED_ROLES holds one NULL row when no role is enabled).
    // Only the session's own account: a login that may read the `mysql` schema (a global
    // SELECT grants it) sees every account's rows here.
    let mut held: Vec<String> = texts(
        conn.query::<Option<Vec<u8>>, _>(
            "SELECT PRIVILEGE_TYPE FROM information_schema.USER_PRIVILEGES WHERE GRANTEE = \
             CONCAT(QUOTE(LEFT(CURRENT_USER(), CHAR_LENGTH(CURRENT_USER()) - \
             CHAR_LENGTH(SUBSTRING_INDEX(CURRENT_USER(), '@', -1)) - 1)), '@', \
             QUOTE(SUBSTRING_INDEX(CURRENT_USER(), '@', -1)))",
        )
        .await?,
    );
    let roles = texts(
        conn.query::<Option<Vec<u8>>, _>("SELECT ROLE_NAME FROM information_schema.ENABLED_ROLES")
            .await?,
    );
    for role in roles {
        // A role name from the catalog, quoted as a string literal.
        let quoted = role.replace('\\', "\\\\").replace('\'', "''");
        let grants = texts(
            conn.query::<Option<Vec<u8>>, _>(format!("SHOW GRANTS FOR '{quoted}'"))
                .await?,
        );
        held.extend(grants.iter().flat_map(|g| global_privileges(g)));
    }
    let mut beyond: Vec<String> = held
        .into_iter()
        .map(|p| p.trim().to_ascii_uppercase())
        .filter(|p| !READ_PRIVILEGES.contains(&p.as_str()))
        .collect();
    beyond.sort();
    beyond.dedup();
    Ok(beyond)
}

/// A column of catalog text: NULLs dropped, bytes read as (lossy) UTF-8, so neither a
/// NULL nor a server's non-UTF-8 names can make the driver's conversion panic.
fn texts(rows: Vec<Option<Vec<u8>>>) -> Vec<String> {
    rows.into_iter()
        .flatten()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .collect()
}

/// What `dataref doctor` reports about one login of a MySQL source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// `VERSION()`.
    pub server_version: String,
    /// `CURRENT_USER()`: the account the server matched.
    pub account: String,
    /// Global privileges past reading (its own and its enabled roles'): model-written
    /// SQL is refused on such a login.
    pub beyond_reading: Vec<String>,
}

/// Logs in as `login` and reports what the server says about it.
pub async fn probe(source: &MysqlSource, login: &Login) -> Result<Probe, SourceError> {
    let opts = source.opts(login)?;
    let mut conn = source.connect(opts, login, CONNECT_TIMEOUT).await?;
    let asked = async {
        let row: Option<(Option<String>, Option<String>)> =
            conn.query_first("SELECT VERSION(), CURRENT_USER()").await?;
        let row = row.map(|(v, u)| (v.unwrap_or_default(), u.unwrap_or_default()));
        let beyond = beyond_reading(&mut conn).await?;
        Ok::<_, mysql_async::Error>((row.unwrap_or_default(), beyond))
    };
    let ((server_version, account), beyond_reading) = tokio::time::timeout(GRACE, asked)
        .await
        .map_err(|_| {
            source.connect_error(
                "no answer from the server".into(),
                ConnectProblem::Unreachable,
            )
        })?
        .map_err(|e| source.classify_connect(&e, login))?;
    let _ = tokio::time::timeout(GRACE, conn.disconnect()).await;
    Ok(Probe {
        server_version,
        account,
        beyond_reading,
    })
}

/// The privileges of a `GRANT … ON *.* TO …` line of `SHOW GRANTS` (none for a grant on a
/// database, table or routine, or of a role).
fn global_privileges(grant: &str) -> Vec<String> {
    let Some(rest) = grant.strip_prefix("GRANT ") else {
        return Vec::new();
    };
    let Some(at) = rest.find(" ON *.* TO ") else {
        return Vec::new();
    };
    rest[..at].split(',').map(|p| p.trim().to_owned()).collect()
}

/// Appends rows to the column builders and writes a batch to the store when one is full.
struct Sink<'p> {
    names: Vec<String>,
    columns: Vec<Column>,
    schema: SchemaRef,
    writer: Box<dyn TableWriter>,
    in_batch: usize,
    /// Bytes of text and binary values in the batch being built.
    in_batch_bytes: usize,
    total: u64,
    max_rows: u64,
    progress: &'p (dyn Fn(u64) + Sync),
}

impl Sink<'_> {
    fn push(&mut self, row: Vec<Value>) -> Result<(), SourceError> {
        if self.total >= self.max_rows {
            return Err(SourceError::TooManyRows {
                max_rows: self.max_rows,
            });
        }
        for (i, (col, v)) in self.columns.iter_mut().zip(row).enumerate() {
            if let Value::Bytes(b) = &v {
                self.in_batch_bytes += b.len();
            }
            col.append(v).map_err(|message| SourceError::Unsupported {
                column: self.names[i].clone(),
                message: format!("row {} holds {message}", self.total + 1),
            })?;
        }
        self.total += 1;
        self.in_batch += 1;
        Ok(())
    }

    fn flush(&mut self) -> Result<(), SourceError> {
        let arrays = self.columns.iter_mut().map(Column::finish).collect();
        let batch = RecordBatch::try_new(self.schema.clone(), arrays)
            .map_err(|e| SourceError::Store(e.into()))?;
        self.writer.write(&batch)?;
        self.in_batch = 0;
        self.in_batch_bytes = 0;
        (self.progress)(self.total);
        Ok(())
    }

    fn finish(mut self) -> Result<dataref_store::ArtifactMeta, SourceError> {
        if self.in_batch > 0 {
            self.flush()?;
        }
        Ok(self.writer.finish()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_global_grants_count() {
        assert_eq!(
            global_privileges("GRANT FILE, PROCESS ON *.* TO `filer`"),
            ["FILE", "PROCESS"]
        );
        assert_eq!(
            global_privileges("GRANT BACKUP_ADMIN,BINLOG_ADMIN ON *.* TO `r`@`%`"),
            ["BACKUP_ADMIN", "BINLOG_ADMIN"]
        );
        assert!(global_privileges("GRANT SELECT ON `shop`.* TO `r`").is_empty());
        assert!(global_privileges("GRANT `filer` TO `eu`@`%`").is_empty());
    }
}
