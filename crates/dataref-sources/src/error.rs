//! The error type of every producer.

use std::path::PathBuf;
use std::time::Duration;

use dataref_store::StoreError;

/// What went wrong while producing. [`SourceError::hint`] says what the caller can do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    #[error("parameter `{name}`: {message}")]
    BadParam { name: String, message: String },
    #[error("SQL error: {message}")]
    Sql { message: String },
    #[error("not allowed: {what}")]
    NotAllowed { what: String },
    #[error("the query returned more than {max_rows} rows, the limit of this source")]
    TooManyRows { max_rows: u64 },
    #[error("the query ran longer than {} and was stopped", human(*after))]
    Timeout { after: Duration },
    #[error("the query was cancelled")]
    Cancelled,
    /// `expected` reads like "a date (text `YYYY-MM-DD`)", `found` like "the text `2025-13-01`";
    /// `row` counts from 1.
    #[error("column `{column}` is {expected}, but row {row} holds {found}")]
    TypeChange {
        column: String,
        row: u64,
        expected: String,
        found: String,
    },
    #[error("cannot open source `{source_name}`: {message}")]
    Open {
        source_name: String,
        message: String,
    },
    /// A file the producer writes itself (the sample database) could not be written.
    #[error("{context} `{}`: {source}", path.display())]
    Io {
        context: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A PostgreSQL source could not be reached or logged in to.
    #[error("cannot connect to source `{source_name}`: {message}")]
    Connect {
        source_name: String,
        message: String,
        problem: ConnectProblem,
    },
    /// The principal's PostgreSQL role cannot be used.
    #[error("principal `{principal}` cannot run as PostgreSQL role `{role}` on source `{source_name}`: {}", match problem {
        RoleProblem::Missing => "the role does not exist",
        RoleProblem::NotGranted => "the source's login role is not a member of it",
    })]
    Role {
        principal: String,
        role: String,
        source_name: String,
        problem: RoleProblem,
    },
    /// The caller's role lacks a grant (or a row-level security policy refused it).
    #[error("principal `{principal}` (PostgreSQL role `{role}`) has no access: {message}")]
    PermissionDenied {
        principal: String,
        role: String,
        message: String,
    },
    /// An error PostgreSQL reported for the statement.
    #[error("SQL error: {message}")]
    Postgres {
        message: String,
        server_hint: Option<String>,
    },
    /// The caller's MySQL user lacks a grant.
    #[error("principal `{principal}` (MySQL user `{user}`) has no access: {message}")]
    MysqlDenied {
        principal: String,
        user: String,
        message: String,
    },
    /// An error MySQL or MariaDB reported for the statement (`code` is the server's error
    /// number).
    #[error("SQL error: {message}")]
    Mysql { code: u16, message: String },
    /// An error an ADBC driver reported (`status` is ADBC's name for it).
    #[error("{message}")]
    Adbc {
        status: String,
        message: String,
        sqlstate: String,
    },
    /// A value that cannot become its column's Arrow type.
    #[error("column `{column}`: {message}")]
    Unsupported { column: String, message: String },
}

/// Why a PostgreSQL connection failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectProblem {
    /// Refused, no such socket, no such host, or no answer.
    Unreachable,
    /// The server refused the login (password, `pg_hba.conf`, unknown user).
    Auth,
    /// The database named in the URL does not exist.
    NoDatabase,
    /// The URL is not a connection string or `postgresql://` URL.
    BadUrl,
    /// The URL uses `${NAME}` and `NAME` is not set.
    Env(String),
    /// Every connection of the pool stayed busy.
    Busy,
    /// Model-written SQL logs in as the caller's own role, and that login was refused
    /// (the role is `NOLOGIN`, `pg_hba.conf`, or the password of `pg_password`).
    RoleLogin {
        principal: String,
        role: String,
    },
    /// The caller's own login role can become another principal's role (or the shared
    /// login, or a role that reads or cancels other sessions), so its SQL could too: the
    /// connection is refused before any statement runs.
    SharedRole {
        principal: String,
        role: String,
    },
    /// A MySQL source: the caller's own user (`mysql_user`) could not log in.
    MysqlLogin {
        principal: String,
        user: String,
    },
    /// A MySQL source: the login for model-written SQL holds global privileges beyond
    /// reading (its own or its enabled roles'), so a statement could reach past its grants.
    MysqlPrivileges {
        principal: String,
        user: String,
    },
    /// A MySQL source in a config with principals: this one has no `mysql_user`, and the
    /// source does not accept the shared login of its `url`.
    NoMysqlUser {
        principal: String,
    },
    /// An ADBC source in a config with principals: this one has no options of its own
    /// (`[principals.NAME.adbc.SOURCE]`), and the source does not accept the shared login.
    NoAdbcLogin {
        principal: String,
        source: String,
    },
    Other,
}

/// Why a principal's PostgreSQL role cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RoleProblem {
    Missing,
    NotGranted,
}

/// `200 ms`, `60s`, `1.5s`: sub-second source timeouts are common in tests and tight configs.
fn human(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{} ms", d.as_millis())
    } else if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

impl SourceError {
    /// What the model (or person) should do next.
    pub fn hint(&self) -> Option<String> {
        match self {
            Self::BadParam { .. } => None,
            Self::Sql { .. } => Some(
                "check table and column names; `SELECT name, sql FROM sqlite_schema` lists the tables"
                    .into(),
            ),
            Self::NotAllowed { .. } => {
                Some("only a single read-only SELECT (or WITH … SELECT) statement may run".into())
            }
            Self::TooManyRows { .. } => Some(
                "narrow the query: filter with WHERE, select fewer rows, or aggregate with GROUP BY"
                    .into(),
            ),
            Self::Timeout { .. } => Some(
                "narrow the query or aggregate in SQL; the source's `timeout` bounds every statement"
                    .into(),
            ),
            Self::Cancelled => None,
            Self::TypeChange { column, .. } => Some(format!(
                "declare the type of `{column}` (`columns.{column} = \"text\"` in the query's config) or CAST it in SQL"
            )),
            Self::Open { .. } => Some("check the source's `path` in dataref.toml".into()),
            Self::Io { .. } => None,
            Self::Store(e) => e.hint(),
            Self::Connect { problem, .. } => Some(match problem {
                ConnectProblem::Unreachable => "check the source's `url` (host, port or socket directory) and that the server is running".into(),
                ConnectProblem::Auth => "check the user and password in the source's `url` and the server's `pg_hba.conf`".into(),
                ConnectProblem::NoDatabase => "check the database name in the source's `url`".into(),
                ConnectProblem::BadUrl => "write `url` as `postgresql://user:${PGPASSWORD}@host/db` or `host=/run/postgresql dbname=db user=dataref`".into(),
                ConnectProblem::Env(name) => format!("set `{name}` in the environment of `dataref serve`"),
                ConnectProblem::Busy => "try again shortly; raise the source's `pool_size` if this is common".into(),
                ConnectProblem::RoleLogin { principal, role } => format!(
                    "model-written SQL logs in as the caller's own role: `ALTER ROLE \"{role}\" LOGIN`, allow it in `pg_hba.conf`, and set `pg_password` in `[principals.{principal}]` if it needs a password (or set `allow_sql_shared_roles = true` on the source to accept the shared login)"
                ),
                ConnectProblem::SharedRole { role, .. } => format!(
                    "`REVOKE` the roles listed from `{role}` (a principal's login role must be a member of no other principal's role), or set `allow_sql_shared_roles = true` on the source to accept it; `dataref doctor` lists them"
                ),
                ConnectProblem::MysqlLogin { principal, user } => format!(
                    "each principal logs in to MySQL as its own user: check that `{user}` exists and can log in from this host, and `mysql_password` in `[principals.{principal}]`"
                ),
                ConnectProblem::MysqlPrivileges { user, .. } => format!(
                    "model-written SQL must run as a user that can only read: `REVOKE` the privileges listed from `{user}` (and its default roles) and grant `SELECT` on what it may read; `dataref doctor` checks it"
                ),
                ConnectProblem::NoMysqlUser { principal } => format!(
                    "add `mysql_user` (and `mysql_password = \"${{NAME}}\"`) to `[principals.{principal}]`, or set `allow_shared_login = true` on the source to let every principal use the user of its `url`"
                ),
                ConnectProblem::NoAdbcLogin { principal, source } => format!(
                    "give the principal its own credentials in `[principals.{principal}.adbc.{source}]` (e.g. `username` and `password = \"${{NAME}}\"`), or set `allow_shared_login = true` on the source"
                ),
                ConnectProblem::Other => "run `dataref doctor` to check the source".into(),
            }),
            Self::Role { principal, role, problem, .. } => Some(match problem {
                RoleProblem::Missing => format!("an administrator must `CREATE ROLE \"{role}\"` (`LOGIN` if the principal uses `query`) and grant it to the source's login role, or set `pg_role` in `[principals.{principal}]`"),
                RoleProblem::NotGranted => format!("an administrator must `GRANT \"{role}\" TO` the source's login role"),
            }),
            Self::PermissionDenied { .. } => Some(
                "this principal's role may not read that; query only tables it is granted, or ask an administrator for a grant"
                    .into(),
            ),
            Self::Postgres { server_hint, .. } => Some(match server_hint {
                Some(h) => format!("{h}; `SELECT table_schema, table_name FROM information_schema.tables` lists the tables you can read"),
                None => "check table and column names; `SELECT table_schema, table_name FROM information_schema.tables` lists the tables you can read".into(),
            }),
            Self::MysqlDenied { user, .. } => Some(format!(
                "MySQL user `{user}` may not read that; query only what it is granted (`SHOW GRANTS` lists it), or ask an administrator for a grant"
            )),
            Self::Adbc { status, .. } => Some(match status.as_str() {
                "UNAUTHENTICATED" => "check the credentials in the source's `options` (and the principal's own)".into(),
                "UNAUTHORIZED" => "these credentials may not read that; query only what they are granted".into(),
                "IO" | "TIMEOUT" => "check that the database is reachable from this host; `dataref doctor` connects to it".into(),
                _ => "check the SQL (in the database's own dialect: table and column names) and the source's `options`".into(),
            }),
            Self::Mysql { .. } => Some(
                "check table and column names; `SELECT table_schema, table_name FROM information_schema.tables` lists the tables you can read"
                    .into(),
            ),
            Self::Unsupported { column, .. } => Some(format!(
                "cast `{column}` to text in SQL (`{column}::text` in PostgreSQL, `CAST({column} AS CHAR)` in MySQL) or select it differently"
            )),
        }
    }

    /// True for errors the caller caused and can fix.
    pub fn is_caller_error(&self) -> bool {
        match self {
            Self::BadParam { .. }
            | Self::Sql { .. }
            | Self::NotAllowed { .. }
            | Self::TooManyRows { .. }
            | Self::Timeout { .. }
            | Self::Cancelled
            | Self::TypeChange { .. } => true,
            Self::Role { .. }
            | Self::PermissionDenied { .. }
            | Self::Postgres { .. }
            | Self::MysqlDenied { .. }
            | Self::Mysql { .. }
            | Self::Adbc { .. }
            | Self::Unsupported { .. } => true,
            Self::Open { .. } | Self::Io { .. } | Self::Connect { .. } => false,
            Self::Store(e) => e.is_caller_error(),
        }
    }
}
