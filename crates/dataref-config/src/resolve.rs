use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use dataref_protocol::Principal;
use serde_json::Value;

use crate::access::{HttpConfig, PrincipalConfig, resolve_http, resolve_principals};
use crate::agent::{AgentConfig, default_agents, resolve_agents};
use crate::error::{ConfigError, invalid, is_identifier};
use crate::http_tool::{HttpToolConfig, resolve_http_tools};
use crate::raw::{RawConfig, RawParam, RawPython, RawQuery, RawSource, RawSql};
use crate::shared::{SharedConfig, resolve_shared};
use crate::spill::{SpillConfig, resolve_spill};
use crate::units::{duration, size};
use crate::upstream::{UpstreamConfig, resolve_upstreams};

/// The built-in sample's question (which product lines lost the most revenue from the
/// previous quarter to the latest?) in SQL, for `run_sql`: the latest quarter's first day,
/// the rows of that quarter and the one before, revenue per product line in each (a pivot
/// with `FILTER`), the change, and the five that lost most.
///
/// The rows are bounded by date before grouping, as one writes it by hand. An earlier form
/// truncated every row's date to its quarter and summed every row under the two filters:
/// the same answer, but DataFusion took 2.6–3.2× DuckDB's time on it (DataFusion evaluates
/// each aggregate's `FILTER` over every row; DuckDB less so), where on this form they are
/// level (`dataref bench sql`). Standard enough to run unchanged in DuckDB, the
/// benchmark's baseline (no CTE named `pivot`: a reserved word there).
pub const QOQ_SQL: &str = "\
WITH bounds AS (
  SELECT CAST(date_trunc('quarter', max(date)) AS DATE) AS last_q FROM sales
), by_line AS (
  SELECT line,
    coalesce(sum(revenue) FILTER (WHERE date < last_q), 0) AS previous,
    coalesce(sum(revenue) FILTER (WHERE date >= last_q), 0) AS latest
  FROM sales CROSS JOIN bounds
  WHERE date >= last_q - INTERVAL '3 months'
  GROUP BY line
)
SELECT line, previous, latest, latest - previous AS delta,
  round(100 * (latest - previous) / nullif(previous, 0), 1) AS pct
FROM by_line
ORDER BY delta, line
LIMIT 5
";

/// Everything dataref needs to run, resolved and checked.
#[derive(Debug, Clone)]
pub struct Config {
    /// The data directory: artifacts, index, workspaces.
    pub home: PathBuf,
    /// The principal of a stdio session.
    pub principal: Principal,
    pub store: StoreConfig,
    pub limits: CallLimits,
    pub sources: BTreeMap<String, SourceConfig>,
    pub queries: BTreeMap<String, QueryConfig>,
    /// Set when this config is the built-in sample: the database must be generated first.
    pub sample: Option<SampleSpec>,
    pub python: PythonConfig,
    pub sql: SqlConfig,
    /// Large tool results written to the caller's workspace (`[spill]`).
    pub spill: SpillConfig,
    /// Other MCP servers whose tools dataref serves behind its own (`[[upstream]]`).
    pub upstreams: Vec<UpstreamConfig>,
    /// Who may call over HTTP, and as which PostgreSQL role (`[principals.NAME]`).
    pub principals: BTreeMap<Principal, PrincipalConfig>,
    /// `dataref serve --http` (`[http]`).
    pub http: HttpConfig,
    /// Agent profiles by name (`[agents.NAME]`); a file without `[agents]` (and the
    /// built-in sample) has the one profile `default`, its endpoint from the environment.
    pub agents: BTreeMap<String, AgentConfig>,
    /// HTTP APIs declared as tools (`[http_tools.NAME]`), by tool name.
    pub http_tools: BTreeMap<String, HttpToolConfig>,
    /// The object store and index several replicas share (`[shared]`); `None`: this
    /// server's own data dir holds everything.
    pub shared: Option<SharedConfig>,
    /// Caps on agents' model use (`[budgets]`); empty when none.
    pub budgets: crate::budget::BudgetConfig,
    /// The Prometheus endpoint (`[metrics]`); `None`: none.
    pub metrics: Option<crate::metrics::MetricsConfig>,
    /// Where spans are exported (`[traces]`); `None`: nowhere.
    pub traces: Option<crate::traces::TracesConfig>,
    /// The audit trail (`[audit]`).
    pub audit: crate::audit::AuditConfig,
}

/// `run_sql`: queries over dataRefs in the embedded engine (`[sql]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqlConfig {
    /// Register `run_sql`. Default true.
    pub enabled: bool,
    /// A query is stopped after this long. Default 60 s.
    pub timeout: Duration,
    /// The engine's working memory per query (the inputs are mapped files and do not
    /// count); a query that needs more is refused with a hint. Default 1 GiB.
    pub memory_bytes: u64,
    /// The most rows `store_as = "value"` returns in the result instead of storing a
    /// table. Default 100.
    pub value_rows: usize,
}

impl Default for SqlConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            timeout: Duration::from_secs(60),
            memory_bytes: 1 << 30,
            value_rows: 100,
        }
    }
}

/// `run_python`: the runtime, the warm pool and each job's limits (`[python]`).
#[derive(Debug, Clone, PartialEq)]
pub struct PythonConfig {
    /// Register `run_python`. Default true.
    pub enabled: bool,
    /// An operator-managed interpreter with pandas and pyarrow installed; dataref never
    /// installs into it. Default: none, dataref provisions its own venv in the data dir.
    pub interpreter: Option<PathBuf>,
    /// The Python the managed venv is made from. Default: `python3` on `PATH`, or
    /// `/usr/bin/python3` when that one is not reachable by the jail uid.
    pub base_interpreter: Option<PathBuf>,
    /// Warm sandboxes kept ready. Default 2; 0 starts every job cold.
    pub pool_size: usize,
    /// A job's wall clock when the call names none. Default 60 s.
    pub timeout: Duration,
    /// The most a call may ask for with `timeout_s`. Default 10 min.
    pub max_timeout: Duration,
    /// Memory of one job, swap included. Default 2 GiB.
    pub memory_bytes: u64,
    /// CPU cores one job may use. Default 1.
    pub cpus: f64,
    /// Processes and threads of one job. Default 64.
    pub max_processes: u64,
    /// `result` as JSON. Default 4 KiB.
    pub result_bytes: usize,
    /// Refuse to run jobs when cgroups cannot enforce memory, process and CPU limits
    /// (instead of falling back to rlimits with a warning). Default false.
    pub require_cgroups: bool,
    /// Jobs running at once on this server; more calls wait in line for a free sandbox.
    /// Default 4.
    pub max_concurrent: usize,
    /// Size of a job's `out/` (a tmpfs: the cap holds while the job runs, and it counts
    /// against `memory`). Default 256 MiB.
    pub out_bytes: u64,
}

impl Default for PythonConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            interpreter: None,
            base_interpreter: None,
            pool_size: 2,
            timeout: Duration::from_secs(60),
            max_timeout: Duration::from_secs(600),
            memory_bytes: 2 << 30,
            cpus: 1.0,
            max_processes: 64,
            result_bytes: 4096,
            require_cgroups: false,
            max_concurrent: 4,
            out_bytes: 256 << 20,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// How long an artifact lives. Default 24 h.
    pub ttl: Duration,
    /// Crossing this while writing aborts the write. Default 1 GiB.
    pub max_artifact_bytes: u64,
    /// Total live bytes one principal may hold. Default 10 GiB.
    pub owner_quota_bytes: u64,
    /// How often expired artifacts are removed. Default 10 min.
    pub sweep_interval: Duration,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(24 * 3600),
            max_artifact_bytes: 1 << 30,
            owner_quota_bytes: 10 << 30,
            sweep_interval: Duration::from_secs(600),
        }
    }
}

/// Bounds on what goes back to the model and on how long a call may run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallLimits {
    /// The text of one tool result is cut beyond this many characters (and the cut is said).
    pub max_result_chars: usize,
    /// A tool call is cancelled after this long.
    pub tool_timeout: Duration,
    /// At most this many artifacts in one `list_artifacts` answer.
    pub list_artifacts_max: usize,
    /// At most this many columns in one `describe_data` answer.
    pub describe_max_columns: usize,
    /// Bytes of files one principal's workspace under the data directory may hold (`[workspace]
    /// quota`); every writer counts (`run_python`'s files and logs, exports, charts, copies,
    /// spill files). Default 1 GiB. A `--workspace DIR` chosen by the operator has none.
    pub workspace_quota_bytes: u64,
    /// `[charts] inline_image`: `render_chart` also sends the PNG inline as an image
    /// block. Default false: the result links the file, and a host that passes every
    /// block to the model does not spend ~90 KB of its context on pixels.
    pub inline_chart_image: bool,
    /// `[tables] inline`: `render_table` also sends the table inline (Markdown, and the
    /// HTML document when asked for). Default false: the rows stay in the linked file.
    pub inline_table: bool,
}

impl Default for CallLimits {
    fn default() -> Self {
        Self {
            max_result_chars: 16_000,
            tool_timeout: Duration::from_secs(600),
            list_artifacts_max: 50,
            describe_max_columns: 20,
            workspace_quota_bytes: 1 << 30,
            inline_chart_image: false,
            inline_table: false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SourceKind {
    Sqlite {
        path: PathBuf,
    },
    /// A PostgreSQL server. Every producer call runs in a read-only transaction as the
    /// caller's role ([`Config::pg_role`]), so grants and row-level security decide what
    /// comes back.
    Postgres {
        /// A libpq connection string or `postgresql://` URL for the login (authenticator)
        /// role, which must be granted the callers' roles. `${NAME}` is expanded from the
        /// environment when dataref connects, so the password stays out of the file.
        url: String,
        /// Connections kept open for reuse. Default 4 (per login: the shared one of named
        /// queries, and each caller's own role for model-written SQL).
        pool_size: usize,
        /// Let model-written SQL (`query`) run on the shared login role of `url`, which can
        /// become several principals' roles, instead of logging in as the caller's own
        /// role. Default false: the operator must accept that a statement may then reach
        /// another principal's role.
        allow_sql_shared_roles: bool,
    },
    /// A MySQL or MariaDB server. Every producer call logs in as the caller's own user
    /// ([`Config::mysql_user`]) in a read-only transaction, so grants decide what comes
    /// back.
    Mysql {
        /// `mysql://user:${PASSWORD}@host:3306/db`: host, port, database and options of
        /// every login, and the user of principals without `mysql_user`. `${NAME}` is
        /// expanded from the environment when dataref connects.
        url: String,
        /// Principals without `mysql_user` log in as the user of `url` (they then share its
        /// grants). Default false: only the server's own principal (stdio, or HTTP without
        /// auth) uses it.
        allow_shared_login: bool,
    },
    /// Any database with an ADBC driver (Snowflake, BigQuery, Databricks, Flight SQL,
    /// PostgreSQL, SQLite, DuckDB, …). The driver runs in a worker process.
    Adbc {
        /// The driver's shared library, absolute.
        driver: PathBuf,
        /// The driver's init function.
        entrypoint: String,
        /// Database options (`${NAME}` not yet expanded).
        options: BTreeMap<String, String>,
        /// `:name` placeholders become `?` (false) or `$1…` (true).
        dollar_placeholders: bool,
        /// Principals without their own options use the source's.
        allow_shared_login: bool,
    },
    /// Files of one table (a data lake): Parquet, CSV or NDJSON under a local directory
    /// or glob, or under an `s3://bucket/prefix/`, with Hive-style `key=value` folders as
    /// partition columns. Queried in DataFusion, which reads only the files, columns and
    /// row groups a query needs.
    Files {
        /// `s3://bucket/prefix/`, or a local directory or glob as an absolute path.
        location: String,
        /// The files' format; `None` takes it from the extension of the files found.
        format: Option<FileFormat>,
        /// The table's name in SQL. Default: the source's name.
        table: String,
        /// S3: an S3-compatible endpoint (`http://minio:9000`); `None` is AWS itself.
        endpoint: Option<String>,
        /// S3: the bucket's region. Default `us-east-1`.
        region: String,
    },
}

/// The format of a `files` source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileFormat {
    Parquet,
    Csv,
    Ndjson,
}

impl FileFormat {
    /// `parquet`, `csv`, `ndjson` (also `jsonl`, `json`).
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s.to_ascii_lowercase().as_str() {
            "parquet" | "pq" => Self::Parquet,
            "csv" => Self::Csv,
            "ndjson" | "jsonl" | "json" => Self::Ndjson,
            _ => return None,
        })
    }

    /// The name used in config and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Parquet => "parquet",
            Self::Csv => "csv",
            Self::Ndjson => "ndjson",
        }
    }

    /// The usual file extension (without the dot).
    pub fn extension(self) -> &'static str {
        match self {
            Self::Parquet => "parquet",
            Self::Csv => "csv",
            Self::Ndjson => "ndjson",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceConfig {
    pub name: String,
    pub kind: SourceKind,
    /// Rows in the sample a producer returns. 0 for sensitive data. Default 2.
    pub sample_rows: usize,
    /// Sample values longer than this are cut (and marked). Default 80.
    pub max_value_chars: usize,
    /// A result with more rows is refused, never silently cut. Default 10,000,000.
    pub max_rows: u64,
    /// A statement running longer is interrupted. Default 60 s.
    pub timeout: Duration,
    /// Whether the generic `query(source, sql)` tool may run SQL on this source.
    pub allow_sql: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct QueryConfig {
    pub name: String,
    pub source: String,
    pub description: String,
    pub sql: String,
    pub params: Vec<ParamConfig>,
    /// Declared result column types, overriding what the source reports.
    pub columns: BTreeMap<String, ColumnType>,
}

impl QueryConfig {
    /// The tool this query becomes.
    pub fn tool_name(&self) -> String {
        format!("fetch_{}", self.name)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ParamConfig {
    pub name: String,
    pub ty: ParamType,
    pub required: bool,
    /// Already checked against `ty`.
    pub default: Option<Value>,
    pub description: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamType {
    String,
    Integer,
    Number,
    Boolean,
    /// `YYYY-MM-DD`.
    Date,
    /// `YYYY-MM-DD HH:MM:SS` or RFC 3339.
    Timestamp,
}

impl ParamType {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "string" | "text" => Self::String,
            "integer" | "int" => Self::Integer,
            "number" | "float" | "real" => Self::Number,
            "boolean" | "bool" => Self::Boolean,
            "date" => Self::Date,
            "timestamp" | "datetime" => Self::Timestamp,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::String => "string",
            Self::Integer => "integer",
            Self::Number => "number",
            Self::Boolean => "boolean",
            Self::Date => "date",
            Self::Timestamp => "timestamp",
        }
    }
}

/// A column type declared in config (`columns.date = "date"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnType {
    Integer,
    Real,
    Text,
    Blob,
    Boolean,
    Date,
    Timestamp,
}

impl ColumnType {
    /// Also used for SQLite declared types (`CREATE TABLE t (d DATE)`), with SQLite's
    /// affinity rules for the names it does not know.
    pub fn from_decl(s: &str) -> Option<Self> {
        let up = s.trim().to_ascii_uppercase();
        Some(match up.as_str() {
            "DATE" => Self::Date,
            "TIMESTAMP" | "DATETIME" | "TIMESTAMPTZ" => Self::Timestamp,
            "BOOLEAN" | "BOOL" => Self::Boolean,
            _ if up.contains("INT") => Self::Integer,
            _ if up.contains("CHAR") || up.contains("CLOB") || up.contains("TEXT") => Self::Text,
            _ if up.contains("BLOB") => Self::Blob,
            _ if up.contains("REAL")
                || up.contains("FLOA")
                || up.contains("DOUB")
                || up.contains("NUMERIC")
                || up.contains("DECIMAL") =>
            {
                Self::Real
            }
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Integer => "integer",
            Self::Real => "real",
            Self::Text => "text",
            Self::Blob => "blob",
            Self::Boolean => "boolean",
            Self::Date => "date",
            Self::Timestamp => "timestamp",
        }
    }
}

/// The built-in sample database: where it lives and how many rows it has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleSpec {
    pub path: PathBuf,
    pub rows: u64,
}

impl Config {
    /// Reads and resolves a config file. Relative source paths are taken from the file's
    /// directory.
    pub fn load(path: &Path, home: PathBuf) -> Result<Self, ConfigError> {
        Self::load_with_env(path, home, &crate::env::process)
    }

    /// [`Config::load`] with the environment read through `env` (`DATAREF_LLM_*` for the
    /// agent profiles' defaults) instead of the process's.
    pub fn load_with_env(
        path: &Path,
        home: PathBuf,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        Self::from_toml_str_with_env(&text, base, home, env).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.to_owned(),
                message,
            },
            other => other,
        })
    }

    /// Resolves config text; `base` is the directory relative paths are taken from.
    pub fn from_toml_str(text: &str, base: &Path, home: PathBuf) -> Result<Self, ConfigError> {
        Self::from_toml_str_with_env(text, base, home, &crate::env::process)
    }

    /// [`Config::from_toml_str`] with the environment read through `env` instead of the
    /// process's (resolution reads only `DATAREF_LLM_*`, for the agent profiles' defaults;
    /// `${NAME}` in values is expanded later, where each value is used).
    pub fn from_toml_str_with_env(
        text: &str,
        base: &Path,
        home: PathBuf,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: PathBuf::from("dataref.toml"),
            message: e.to_string(),
        })?;
        Self::resolve(raw, base, home, env)
    }

    /// The built-in sample: one SQLite source `sample` and the query `sales` (tool
    /// `fetch_sales(since)`), used when no config file is given.
    pub fn builtin_sample(home: PathBuf, rows: u64) -> Self {
        Self::builtin_sample_with_env(home, rows, &crate::env::process)
    }

    /// [`Config::builtin_sample`] with the agent profile's endpoint from `env`.
    pub fn builtin_sample_with_env(
        home: PathBuf,
        rows: u64,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Self {
        let path = home.join("sample").join(format!("sales-{rows}.sqlite"));
        let source = SourceConfig {
            name: "sample".into(),
            kind: SourceKind::Sqlite { path: path.clone() },
            sample_rows: 2,
            max_value_chars: 80,
            max_rows: 10_000_000,
            timeout: Duration::from_secs(120),
            allow_sql: true,
        };
        let query = QueryConfig {
            name: "sales".into(),
            source: "sample".into(),
            description: "Load sales (one row per order line: date, line, region, channel, \
                units, revenue, discount) on or after a date."
                .into(),
            sql: "SELECT date, line, region, channel, units, revenue, discount \
                  FROM sales WHERE date >= :since ORDER BY date, id"
                .into(),
            params: vec![ParamConfig {
                name: "since".into(),
                ty: ParamType::Date,
                required: true,
                default: None,
                description: Some("First day to include, `YYYY-MM-DD`.".into()),
            }],
            columns: BTreeMap::new(),
        };
        let audit = crate::audit::AuditConfig::default_in(&home);
        Self {
            home,
            principal: default_principal(),
            store: StoreConfig::default(),
            limits: CallLimits::default(),
            sources: BTreeMap::from([("sample".into(), source)]),
            queries: BTreeMap::from([("sales".into(), query)]),
            sample: Some(SampleSpec { path, rows }),
            python: PythonConfig::default(),
            sql: SqlConfig::default(),
            spill: SpillConfig::default(),
            upstreams: Vec::new(),
            principals: BTreeMap::new(),
            http: HttpConfig::default(),
            agents: default_agents(env),
            http_tools: BTreeMap::new(),
            shared: None,
            audit,
            budgets: crate::budget::BudgetConfig::default(),
            metrics: None,
            traces: None,
        }
    }

    /// The PostgreSQL role `principal` runs as: `pg_role` of `[principals.NAME]`, else the
    /// principal's own name.
    pub fn pg_role<'a>(&'a self, principal: &'a Principal) -> &'a str {
        self.principals
            .get(principal)
            .and_then(|p| p.pg_role.as_deref())
            .unwrap_or(principal.as_str())
    }

    /// The password `principal` logs in to PostgreSQL with as its role (model-written SQL),
    /// `${NAME}` not yet expanded: `pg_password` of `[principals.NAME]`.
    pub fn pg_password(&self, principal: &Principal) -> Option<&str> {
        self.principals
            .get(principal)
            .and_then(|p| p.pg_password.as_deref())
    }

    /// The MySQL user `principal` logs in as: `mysql_user` of `[principals.NAME]`.
    pub fn mysql_user(&self, principal: &Principal) -> Option<&str> {
        self.principals
            .get(principal)
            .and_then(|p| p.mysql_user.as_deref())
    }

    /// The options `principal` lays over ADBC source `source`'s (`${NAME}` not yet
    /// expanded); None when it has none of its own.
    pub fn adbc_options(
        &self,
        principal: &Principal,
        source: &str,
    ) -> Option<&BTreeMap<String, String>> {
        self.principals.get(principal)?.adbc.get(source)
    }

    /// The password of [`Config::mysql_user`], `${NAME}` not yet expanded.
    pub fn mysql_password(&self, principal: &Principal) -> Option<&str> {
        self.principals
            .get(principal)
            .and_then(|p| p.mysql_password.as_deref())
    }

    fn resolve(
        raw: RawConfig,
        base: &Path,
        home: PathBuf,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let principal = match &raw.server.principal {
            None => default_principal(),
            Some(p) => Principal::new(p).map_err(|e| {
                invalid(
                    "server.principal",
                    e.to_string(),
                    "use letters, digits and `._@-`",
                )
            })?,
        };
        let d = StoreConfig::default();
        let store = StoreConfig {
            ttl: duration("store.ttl", &raw.store.ttl, d.ttl)?,
            max_artifact_bytes: size(
                "store.max_artifact_bytes",
                &raw.store.max_artifact_bytes,
                d.max_artifact_bytes,
            )?,
            owner_quota_bytes: size(
                "store.owner_quota_bytes",
                &raw.store.owner_quota_bytes,
                d.owner_quota_bytes,
            )?,
            sweep_interval: duration(
                "store.sweep_interval",
                &raw.store.sweep_interval,
                d.sweep_interval,
            )?,
        };
        if store.ttl.is_zero() {
            return Err(invalid(
                "store.ttl",
                "must be longer than zero",
                "the default is `24h`",
            ));
        }
        if store.sweep_interval.is_zero() {
            return Err(invalid(
                "store.sweep_interval",
                "must be longer than zero",
                "the default is `10m`",
            ));
        }
        let dl = CallLimits::default();
        let limits = CallLimits {
            max_result_chars: raw.limits.max_result_chars.unwrap_or(dl.max_result_chars),
            tool_timeout: duration(
                "limits.tool_timeout",
                &raw.limits.tool_timeout,
                dl.tool_timeout,
            )?,
            list_artifacts_max: raw
                .limits
                .list_artifacts_max
                .unwrap_or(dl.list_artifacts_max),
            describe_max_columns: raw
                .limits
                .describe_max_columns
                .unwrap_or(dl.describe_max_columns),
            workspace_quota_bytes: size(
                "workspace.quota",
                &raw.workspace.quota,
                dl.workspace_quota_bytes,
            )?,
            inline_chart_image: raw.charts.inline_image.unwrap_or(dl.inline_chart_image),
            inline_table: raw.tables.inline.unwrap_or(dl.inline_table),
        };
        if limits.workspace_quota_bytes < 1 << 20 {
            return Err(invalid(
                "workspace.quota",
                "must be at least 1MiB",
                "the default is `1GiB`",
            ));
        }
        if limits.max_result_chars < 200 {
            return Err(invalid(
                "limits.max_result_chars",
                "must be at least 200",
                "the default is 16000",
            ));
        }
        let mut sources = BTreeMap::new();
        for (name, s) in raw.sources {
            let source = resolve_source(&name, s, base)?;
            sources.insert(name, source);
        }
        let mut queries = BTreeMap::new();
        for (name, q) in raw.queries {
            let query = resolve_query(&name, q, &sources)?;
            queries.insert(name, query);
        }
        let python = resolve_python(&raw.python, base)?;
        let sql = resolve_sql(&raw.sql)?;
        let spill = resolve_spill(&raw.spill)?;
        let upstreams = resolve_upstreams(raw.upstream, base)?;
        let principals = resolve_principals(raw.principals)?;
        let http = match raw.http {
            Some(h) => resolve_http(h, base)?,
            None => HttpConfig::default(),
        };
        let agents = resolve_agents(raw.agents, base, env)?;
        let query_tools: Vec<String> = queries.values().map(QueryConfig::tool_name).collect();
        let http_tools = resolve_http_tools(raw.http_tools, &query_tools)?;
        let shared = raw.shared.map(|s| resolve_shared(s, base)).transpose()?;
        let audit = crate::audit::resolve_audit(raw.audit, base, &home)?;
        let budgets = crate::budget::resolve_budgets(raw.budgets, &agents)?;
        let metrics = crate::metrics::resolve_metrics(raw.metrics)?;
        let traces = crate::traces::resolve_traces(raw.traces)?;
        Ok(Self {
            home,
            principal,
            store,
            limits,
            sources,
            queries,
            sample: None,
            python,
            sql,
            spill,
            upstreams,
            principals,
            http,
            agents,
            http_tools,
            shared,
            budgets,
            metrics,
            traces,
            audit,
        })
    }
}

fn resolve_sql(raw: &RawSql) -> Result<SqlConfig, ConfigError> {
    let d = SqlConfig::default();
    let sql = SqlConfig {
        enabled: raw.enabled.unwrap_or(d.enabled),
        timeout: duration("sql.timeout", &raw.timeout, d.timeout)?,
        memory_bytes: size("sql.memory", &raw.memory, d.memory_bytes)?,
        value_rows: raw.value_rows.unwrap_or(d.value_rows),
    };
    if sql.timeout.is_zero() {
        return Err(invalid(
            "sql.timeout",
            "must be longer than zero",
            "the default is 60s",
        ));
    }
    if sql.memory_bytes < 16 << 20 {
        return Err(invalid(
            "sql.memory",
            "must be at least 16MiB",
            "the default is 1GiB; the inputs are mapped files and do not count",
        ));
    }
    if !(1..=10_000).contains(&sql.value_rows) {
        return Err(invalid(
            "sql.value_rows",
            "must be between 1 and 10000",
            "the default is 100; larger results are stored as a table",
        ));
    }
    Ok(sql)
}

fn resolve_python(raw: &RawPython, base: &Path) -> Result<PythonConfig, ConfigError> {
    let d = PythonConfig::default();
    let path = |p: &Option<String>| p.as_ref().map(|p| base.join(p));
    let python = PythonConfig {
        enabled: raw.enabled.unwrap_or(d.enabled),
        interpreter: path(&raw.interpreter),
        base_interpreter: path(&raw.base_interpreter),
        pool_size: raw.pool_size.unwrap_or(d.pool_size),
        timeout: duration("python.timeout", &raw.timeout, d.timeout)?,
        max_timeout: duration("python.max_timeout", &raw.max_timeout, d.max_timeout)?,
        memory_bytes: size("python.memory", &raw.memory, d.memory_bytes)?,
        cpus: raw.cpus.unwrap_or(d.cpus),
        max_processes: raw.max_processes.unwrap_or(d.max_processes),
        result_bytes: raw.result_bytes.unwrap_or(d.result_bytes),
        require_cgroups: raw.require_cgroups.unwrap_or(d.require_cgroups),
        max_concurrent: raw.max_concurrent.unwrap_or(d.max_concurrent),
        out_bytes: size("python.out_size", &raw.out_size, d.out_bytes)?,
    };
    if !(1..=256).contains(&python.max_concurrent) {
        return Err(invalid(
            "python.max_concurrent",
            "must be between 1 and 256",
            "the default is 4; each running job may use `python.memory`",
        ));
    }
    if python.out_bytes < 1 << 20 || python.out_bytes >= python.memory_bytes {
        return Err(invalid(
            "python.out_size",
            "must be at least 1MiB and less than `python.memory` (the files are kept in the job's memory)",
            "the default is `256MiB`",
        ));
    }
    if python.interpreter.is_some() && python.base_interpreter.is_some() {
        return Err(invalid(
            "python.interpreter",
            "`interpreter` and `base_interpreter` exclude each other",
            "set `interpreter` for a Python you manage, or `base_interpreter` for the one dataref's venv is made from",
        ));
    }
    if python.pool_size > 32 {
        return Err(invalid(
            "python.pool_size",
            "must be at most 32",
            "the default is 2",
        ));
    }
    if python.timeout.is_zero() || python.timeout > python.max_timeout {
        return Err(invalid(
            "python.timeout",
            "must be longer than zero and at most `python.max_timeout`",
            "the defaults are `60s` and `10m`",
        ));
    }
    if python.memory_bytes < 64 << 20 {
        return Err(invalid(
            "python.memory",
            "must be at least 64MiB",
            "the default is `2GiB`",
        ));
    }
    if !(python.cpus.is_finite() && python.cpus > 0.0 && python.cpus <= 1024.0) {
        return Err(invalid(
            "python.cpus",
            "must be a number of cores above 0",
            "the default is 1",
        ));
    }
    if python.max_processes < 4 {
        return Err(invalid(
            "python.max_processes",
            "must be at least 4",
            "the default is 64",
        ));
    }
    if !(256..=1 << 20).contains(&python.result_bytes) {
        return Err(invalid(
            "python.result_bytes",
            "must be between 256 and 1048576",
            "the default is 4096; put tables in `outputs`, not in `result`",
        ));
    }
    Ok(python)
}

fn default_principal() -> Principal {
    // "local" is a valid name by construction.
    Principal::new("local").unwrap_or_else(|_| unreachable!())
}

fn resolve_source(name: &str, s: RawSource, base: &Path) -> Result<SourceConfig, ConfigError> {
    let what = format!("sources.{name}");
    if !is_identifier(name) {
        return Err(invalid(
            &what,
            "source names must be lower-case identifiers",
            "e.g. `[sources.shop]`",
        ));
    }
    let kind = match s.kind.as_str() {
        "sqlite" => {
            let path = s.path.clone().ok_or_else(|| {
                invalid(
                    &what,
                    "a sqlite source needs `path`",
                    "add `path = \"shop.sqlite\"` (relative to this file)",
                )
            })?;
            SourceKind::Sqlite {
                path: base.join(path),
            }
        }
        "postgres" | "postgresql" => {
            let url = s.url.clone().ok_or_else(|| {
                invalid(
                    &what,
                    "a postgres source needs `url`",
                    "add e.g. `url = \"postgresql://dataref:${PGPASSWORD}@db.internal/shop\"` or `url = \"host=/run/postgresql dbname=shop user=dataref\"`",
                )
            })?;
            let pool_size = s.pool_size.unwrap_or(4);
            if !(1..=64).contains(&pool_size) {
                return Err(invalid(
                    format!("{what}.pool_size"),
                    "must be between 1 and 64",
                    "the default is 4",
                ));
            }
            SourceKind::Postgres {
                url,
                pool_size,
                allow_sql_shared_roles: s.allow_sql_shared_roles.unwrap_or(false),
            }
        }
        "files" => files_source(&what, name, &s, base)?,
        "mysql" | "mariadb" => {
            let url = s.url.clone().ok_or_else(|| {
                invalid(
                    &what,
                    "a mysql source needs `url`",
                    "add e.g. `url = \"mysql://dataref:${MYSQL_PASSWORD}@db.internal:3306/shop\"`",
                )
            })?;
            if !url.starts_with("mysql://") {
                return Err(invalid(
                    format!("{what}.url"),
                    "must start with `mysql://`",
                    "e.g. `mysql://dataref:${MYSQL_PASSWORD}@db.internal:3306/shop` (`?socket=/run/mysqld/mysqld.sock` for a Unix socket)",
                ));
            }
            SourceKind::Mysql {
                url,
                allow_shared_login: s.allow_shared_login.unwrap_or(false),
            }
        }
        "adbc" => {
            let driver = s.driver.clone().ok_or_else(|| {
                invalid(
                    &what,
                    "an adbc source needs `driver`",
                    "add e.g. `driver = \"drivers/libadbc_driver_snowflake.so\"` (pip install adbc-driver-snowflake ships it)",
                )
            })?;
            let dollar_placeholders = match s.placeholders.as_deref() {
                None | Some("question") => false,
                Some("dollar") => true,
                Some(other) => {
                    return Err(invalid(
                        format!("{what}.placeholders"),
                        format!("unknown placeholder style `{other}`"),
                        "`question` (`?`, the default) or `dollar` (`$1`, PostgreSQL's driver)",
                    ));
                }
            };
            SourceKind::Adbc {
                driver: base.join(driver),
                entrypoint: s
                    .entrypoint
                    .clone()
                    .unwrap_or_else(|| "AdbcDriverInit".into()),
                options: s.options.clone().unwrap_or_default(),
                dollar_placeholders,
                allow_shared_login: s.allow_shared_login.unwrap_or(false),
            }
        }
        other => {
            return Err(invalid(
                format!("{what}.kind"),
                format!("unknown source kind `{other}`"),
                "supported kinds: `sqlite`, `postgres`, `mysql`, `adbc`, `files`",
            ));
        }
    };
    if s.allow_shared_login.is_some()
        && !matches!(kind, SourceKind::Mysql { .. } | SourceKind::Adbc { .. })
    {
        return Err(invalid(
            format!("{what}.allow_shared_login"),
            "`allow_shared_login` is for mysql and adbc sources",
            "a postgres source has `allow_sql_shared_roles`",
        ));
    }
    if (s.driver.is_some()
        || s.entrypoint.is_some()
        || s.options.is_some()
        || s.placeholders.is_some())
        && !matches!(kind, SourceKind::Adbc { .. })
    {
        return Err(invalid(
            &what,
            "`driver`, `entrypoint`, `options` and `placeholders` are for adbc sources",
            "write `kind = \"adbc\"` with the driver's shared library in `driver`",
        ));
    }
    if (s.format.is_some() || s.table.is_some() || s.endpoint.is_some() || s.region.is_some())
        && !matches!(kind, SourceKind::Files { .. })
    {
        return Err(invalid(
            &what,
            "`format`, `table`, `endpoint` and `region` are for files sources",
            "a files source reads `path` or `url` with `kind = \"files\"`",
        ));
    }
    if s.path.is_some() && !matches!(kind, SourceKind::Sqlite { .. } | SourceKind::Files { .. }) {
        return Err(invalid(
            format!("{what}.path"),
            "`path` is for sqlite sources",
            "a postgres source takes `url`",
        ));
    }
    if !matches!(kind, SourceKind::Postgres { .. })
        && (s.pool_size.is_some()
            || s.allow_sql_shared_roles.is_some()
            || (s.url.is_some()
                && !matches!(kind, SourceKind::Files { .. } | SourceKind::Mysql { .. })))
    {
        return Err(invalid(
            &what,
            "`url`, `pool_size` and `allow_sql_shared_roles` are for postgres sources",
            "a sqlite source takes `path`",
        ));
    }
    Ok(SourceConfig {
        name: name.to_owned(),
        kind,
        sample_rows: s.sample_rows.unwrap_or(2).min(100),
        max_value_chars: s.max_value_chars.unwrap_or(80).max(8),
        max_rows: s.max_rows.unwrap_or(10_000_000),
        timeout: duration(
            &format!("{what}.timeout"),
            &s.timeout,
            Duration::from_secs(60),
        )?,
        allow_sql: s.allow_sql.unwrap_or(false),
    })
}

/// `kind = "files"`: `url = "s3://bucket/prefix/"`, or `path` (a directory or a glob,
/// relative to the config file).
fn files_source(
    what: &str,
    name: &str,
    s: &RawSource,
    base: &Path,
) -> Result<SourceKind, ConfigError> {
    let location = match (&s.path, &s.url) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                what,
                "a files source takes `path` or `url`, not both",
                "`path` for a local directory or glob, `url` for `s3://bucket/prefix/`",
            ));
        }
        (Some(path), None) => {
            let joined = base.join(path);
            joined
                .to_str()
                .ok_or_else(|| {
                    invalid(
                        format!("{what}.path"),
                        "the path is not valid UTF-8",
                        "rename the directory",
                    )
                })?
                .to_owned()
        }
        (None, Some(url)) => {
            let rest = url.strip_prefix("s3://").ok_or_else(|| {
                invalid(
                    format!("{what}.url"),
                    format!("`{url}` is not an `s3://` URL"),
                    "use `url = \"s3://bucket/prefix/\"`, or `path` for a local directory",
                )
            })?;
            if rest.split('/').next().is_none_or(str::is_empty) {
                return Err(invalid(
                    format!("{what}.url"),
                    "the URL names no bucket",
                    "e.g. `url = \"s3://lake/sales/\"`",
                ));
            }
            url.clone()
        }
        (None, None) => {
            return Err(invalid(
                what,
                "a files source needs `path` or `url`",
                "add e.g. `path = \"lake/sales/\"` (relative to this file) or `url = \"s3://lake/sales/\"`",
            ));
        }
    };
    let format = match &s.format {
        None => None,
        Some(f) => Some(FileFormat::parse(f).ok_or_else(|| {
            invalid(
                format!("{what}.format"),
                format!("unknown format `{f}`"),
                "use `parquet`, `csv` or `ndjson`",
            )
        })?),
    };
    let table = s.table.clone().unwrap_or_else(|| name.to_owned());
    if !is_identifier(&table) {
        return Err(invalid(
            format!("{what}.table"),
            "a table name must be a lower-case identifier",
            "e.g. `table = \"sales\"`",
        ));
    }
    if (s.endpoint.is_some() || s.region.is_some()) && s.url.is_none() {
        return Err(invalid(
            what,
            "`endpoint` and `region` are for files on S3 (`url = \"s3://…\"`)",
            "a local `path` needs neither",
        ));
    }
    Ok(SourceKind::Files {
        location,
        format,
        table,
        endpoint: s.endpoint.clone(),
        region: s.region.clone().unwrap_or_else(|| "us-east-1".to_owned()),
    })
}

fn resolve_query(
    name: &str,
    q: RawQuery,
    sources: &BTreeMap<String, SourceConfig>,
) -> Result<QueryConfig, ConfigError> {
    let what = format!("queries.{name}");
    if !is_identifier(name) {
        return Err(invalid(
            &what,
            "query names must be lower-case identifiers",
            "e.g. `[queries.orders]` becomes the tool `fetch_orders`",
        ));
    }
    if !sources.contains_key(&q.source) {
        let known: Vec<_> = sources.keys().map(|k| format!("`{k}`")).collect();
        return Err(invalid(
            format!("{what}.source"),
            format!("no source named `{}`", q.source),
            if known.is_empty() {
                "declare it under `[sources.NAME]`".to_owned()
            } else {
                format!("declared sources: {}", known.join(", "))
            },
        ));
    }
    let mut params = Vec::new();
    for (pname, p) in q.params {
        params.push(resolve_param(&format!("{what}.params.{pname}"), &pname, p)?);
        if !q.sql.contains(&format!(":{pname}")) {
            return Err(invalid(
                format!("{what}.params.{pname}"),
                "the SQL never uses this parameter",
                format!("refer to it as `:{pname}` in `sql`"),
            ));
        }
    }
    let mut columns = BTreeMap::new();
    for (col, ty) in q.columns {
        let t = ColumnType::from_decl(&ty).ok_or_else(|| {
            invalid(
                format!("{what}.columns.{col}"),
                format!("unknown column type `{ty}`"),
                "use one of `integer`, `real`, `text`, `blob`, `boolean`, `date`, `timestamp`",
            )
        })?;
        columns.insert(col, t);
    }
    Ok(QueryConfig {
        name: name.to_owned(),
        source: q.source,
        description: q.description,
        sql: q.sql,
        params,
        columns,
    })
}

fn resolve_param(what: &str, name: &str, p: RawParam) -> Result<ParamConfig, ConfigError> {
    if !is_identifier(name) {
        return Err(invalid(
            what,
            "parameter names must be lower-case identifiers",
            "e.g. `params.since`",
        ));
    }
    let ty = ParamType::parse(&p.ty).ok_or_else(|| {
        invalid(
            format!("{what}.type"),
            format!("unknown parameter type `{}`", p.ty),
            "use one of `string`, `integer`, `number`, `boolean`, `date`, `timestamp`",
        )
    })?;
    let default = match p.default {
        None => None,
        Some(v) => Some(check_default(what, ty, v)?),
    };
    if p.required && default.is_some() {
        return Err(invalid(
            what,
            "a required parameter cannot have a default",
            "drop `required` or `default`",
        ));
    }
    Ok(ParamConfig {
        name: name.to_owned(),
        ty,
        required: p.required,
        default,
        description: p.description,
    })
}

fn check_default(what: &str, ty: ParamType, v: toml::Value) -> Result<Value, ConfigError> {
    let bad = || {
        invalid(
            format!("{what}.default"),
            format!("a {} is not a {}", v.type_str(), ty.as_str()),
            "give a default of the declared type",
        )
    };
    Ok(match (ty, &v) {
        (ParamType::String | ParamType::Date | ParamType::Timestamp, toml::Value::String(s)) => {
            Value::String(s.clone())
        }
        (ParamType::Date | ParamType::Timestamp, toml::Value::Datetime(d)) => {
            Value::String(d.to_string())
        }
        (ParamType::Integer, toml::Value::Integer(i)) => Value::from(*i),
        (ParamType::Number, toml::Value::Integer(i)) => Value::from(*i as f64),
        (ParamType::Number, toml::Value::Float(f)) => Value::from(*f),
        (ParamType::Boolean, toml::Value::Boolean(b)) => Value::Bool(*b),
        _ => return Err(bad()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::from_toml_str(text, Path::new("/cfg"), PathBuf::from("/home"))
    }

    /// Charts and tables are linked, not sent inline, unless a switch says so; a misspelt
    /// switch is refused, not ignored.
    #[test]
    fn inline_display_is_off_unless_switched_on() {
        let c = parse("").unwrap();
        assert!(!c.limits.inline_chart_image && !c.limits.inline_table);
        let c = parse("[charts]\ninline_image = true\n[tables]\ninline = true").unwrap();
        assert!(c.limits.inline_chart_image && c.limits.inline_table);
        for bad in ["[charts]\ninline = true", "[tables]\ninline_image = true"] {
            let err = parse(bad).unwrap_err().to_string();
            assert!(err.contains("unknown field"), "{bad}: {err}");
        }
    }

    #[test]
    fn python_section_has_defaults_and_checks_its_values() {
        let c = parse("").unwrap();
        assert_eq!(c.python, PythonConfig::default());
        let c = parse(
            "[python]\npool_size = 0\ntimeout = \"5s\"\nmemory = \"512MiB\"\ninterpreter = \"venv/bin/python\"\ncpus = 0.5",
        )
        .unwrap();
        assert_eq!(c.python.pool_size, 0);
        assert_eq!(c.python.timeout, Duration::from_secs(5));
        assert_eq!(c.python.memory_bytes, 512 << 20);
        assert_eq!(
            c.python.interpreter,
            Some(PathBuf::from("/cfg/venv/bin/python"))
        );
        for bad in [
            "timeout = \"20m\"",
            "memory = \"1MB\"",
            "cpus = 0",
            "result_bytes = 10",
            "pool_size = 1000",
            "interpreter = \"a\"\nbase_interpreter = \"b\"",
            "pool = 2",
        ] {
            let err = parse(&format!("[python]\n{bad}")).unwrap_err().to_string();
            assert!(
                err.contains("python") || err.contains("unknown field"),
                "{bad}: {err}"
            );
        }
    }

    const GOOD: &str = r#"
        [server]
        principal = "eu_analyst"
        [store]
        ttl = "2h"
        max_artifact_bytes = "10MB"
        [sources.shop]
        kind = "sqlite"
        path = "shop.sqlite"
        sample_rows = 0
        allow_sql = true
        [queries.orders]
        source = "shop"
        description = "Orders."
        sql = "SELECT * FROM orders WHERE placed >= :since AND n < :limit"
        columns = { placed = "date" }
        [queries.orders.params]
        since = { type = "date", required = true, description = "first day" }
        limit = { type = "integer", default = 100 }
    "#;

    #[test]
    fn resolves_a_full_file() -> Result<(), ConfigError> {
        let c = parse(GOOD)?;
        assert_eq!(c.principal.as_str(), "eu_analyst");
        assert_eq!(c.store.ttl, Duration::from_secs(7200));
        assert_eq!(c.store.max_artifact_bytes, 10_000_000);
        let s = &c.sources["shop"];
        assert_eq!(
            s.kind,
            SourceKind::Sqlite {
                path: PathBuf::from("/cfg/shop.sqlite")
            }
        );
        assert_eq!(s.sample_rows, 0);
        let q = &c.queries["orders"];
        assert_eq!(q.params.len(), 2);
        assert_eq!(q.columns["placed"], ColumnType::Date);
        let limit = q.params.iter().find(|p| p.name == "limit");
        assert_eq!(
            limit.and_then(|p| p.default.clone()),
            Some(Value::from(100))
        );
        Ok(())
    }

    #[test]
    fn errors_name_the_key_and_hint() {
        let cases = [
            ("[store]\nttl = \"forever\"", "store.ttl"),
            (
                "[sources.a]\nkind = \"oracle\"\npath = \"x\"",
                "unknown source kind `oracle`",
            ),
            ("[sources.a]\nkind = \"sqlite\"", "needs `path`"),
            (
                "[queries.q]\nsource = \"nope\"\ndescription = \"d\"\nsql = \"select 1\"",
                "no source named `nope`",
            ),
            ("[bogus]\nx = 1", "unknown field `bogus`"),
            (
                "[sources.a]\nkind = \"sqlite\"\npath = \"x\"\n[queries.q]\nsource = \"a\"\ndescription = \"d\"\nsql = \"select 1\"\nparams.p = { type = \"date\" }",
                "never uses this parameter",
            ),
            (
                "[sources.a]\nkind = \"sqlite\"\npath = \"x\"\n[queries.q]\nsource = \"a\"\ndescription = \"d\"\nsql = \"select :p\"\nparams.p = { type = \"integer\", default = \"x\" }",
                "is not a integer",
            ),
            ("[sources.l]\nkind = \"files\"", "needs `path` or `url`"),
            (
                "[sources.l]\nkind = \"files\"\npath = \"a\"\nurl = \"s3://b/\"",
                "not both",
            ),
            (
                "[sources.l]\nkind = \"files\"\nurl = \"https://b/x\"",
                "is not an `s3://` URL",
            ),
            (
                "[sources.l]\nkind = \"files\"\nurl = \"s3:///x\"",
                "names no bucket",
            ),
            (
                "[sources.l]\nkind = \"files\"\npath = \"a\"\nformat = \"xls\"",
                "unknown format `xls`",
            ),
            (
                "[sources.l]\nkind = \"files\"\npath = \"a\"\ntable = \"Sales Data\"",
                "lower-case identifier",
            ),
            (
                "[sources.l]\nkind = \"files\"\npath = \"a\"\nendpoint = \"http://m\"",
                "are for files on S3",
            ),
            (
                "[sources.a]\nkind = \"sqlite\"\npath = \"x\"\ntable = \"t\"",
                "are for files sources",
            ),
        ];
        for (text, want) in cases {
            match parse(text) {
                Ok(_) => panic!("accepted: {text}"),
                Err(e) => assert!(e.to_string().contains(want), "{e} should mention {want}"),
            }
        }
    }

    #[test]
    fn files_sources_resolve_their_location_format_and_table() {
        let c = parse(
            "[sources.lake]\nkind = \"files\"\nurl = \"s3://analytics/sales/\"\n\
             endpoint = \"http://minio:9000\"\nformat = \"jsonl\"\n\
             [sources.exports]\nkind = \"files\"\npath = \"exports/*.csv\"\ntable = \"monthly\"",
        )
        .unwrap();
        assert_eq!(
            c.sources["lake"].kind,
            SourceKind::Files {
                location: "s3://analytics/sales/".into(),
                format: Some(FileFormat::Ndjson),
                table: "lake".into(),
                endpoint: Some("http://minio:9000".into()),
                region: "us-east-1".into(),
            }
        );
        let SourceKind::Files {
            location, table, ..
        } = &c.sources["exports"].kind
        else {
            panic!("a files source: {:?}", c.sources["exports"].kind)
        };
        assert!(location.ends_with("/exports/*.csv"), "{location}");
        assert_eq!(table, "monthly");
    }

    #[test]
    fn postgres_sources_take_the_shared_login_opt_out() {
        let c = parse(
            "[sources.w]\nkind = \"postgres\"\nurl = \"host=/run/postgresql user=dataref\"\n\
             allow_sql = true\nallow_sql_shared_roles = true\n\
             [sources.v]\nkind = \"postgres\"\nurl = \"host=/run/postgresql user=dataref\"",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let opt_out = |name: &str| match &c.sources[name].kind {
            SourceKind::Postgres {
                allow_sql_shared_roles,
                ..
            } => *allow_sql_shared_roles,
            other => panic!("{other:?}"),
        };
        assert!(opt_out("w"));
        assert!(!opt_out("v"));
        let e =
            parse("[sources.s]\nkind = \"sqlite\"\npath = \"x\"\nallow_sql_shared_roles = true")
                .unwrap_err()
                .to_string();
        assert!(e.contains("for postgres sources"), "{e}");
    }

    #[test]
    fn mysql_sources_take_a_url_and_principals_their_own_users() {
        let c = parse(
            "[sources.shop]\nkind = \"mysql\"\nurl = \"mysql://dataref:${PW}@db:3306/shop\"\n\
             allow_sql = true\n\
             [sources.legacy]\nkind = \"mariadb\"\nurl = \"mysql://r@db/legacy\"\n\
             allow_shared_login = true\n\
             [principals.eu]\nmysql_user = \"eu_analyst\"\nmysql_password = \"${EU_PW}\"",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            c.sources["shop"].kind,
            SourceKind::Mysql {
                url: "mysql://dataref:${PW}@db:3306/shop".into(),
                allow_shared_login: false,
            }
        );
        assert!(matches!(
            c.sources["legacy"].kind,
            SourceKind::Mysql {
                allow_shared_login: true,
                ..
            }
        ));
        let eu = Principal::new("eu").unwrap();
        assert_eq!(c.mysql_user(&eu), Some("eu_analyst"));
        assert_eq!(c.mysql_password(&eu), Some("${EU_PW}"));
        for (text, says) in [
            ("[sources.s]\nkind = \"mysql\"", "needs `url`"),
            (
                "[sources.s]\nkind = \"mysql\"\nurl = \"postgresql://x\"",
                "must start with `mysql://`",
            ),
            (
                "[sources.s]\nkind = \"postgres\"\nurl = \"host=x\"\nallow_shared_login = true",
                "for mysql and adbc sources",
            ),
            (
                "[sources.s]\nkind = \"mysql\"\nurl = \"mysql://x\"\npool_size = 2",
                "for postgres sources",
            ),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn adbc_sources_name_a_driver_and_principals_lay_their_options_over() {
        let c = parse(
            "[sources.wh]\nkind = \"adbc\"\ndriver = \"drivers/libadbc_driver_snowflake.so\"\n\
             options = { \"adbc.snowflake.sql.account\" = \"acme\" }\nplaceholders = \"dollar\"\n\
             [principals.anna.adbc.wh]\nusername = \"ANNA\"\npassword = \"${PW}\"",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        match &c.sources["wh"].kind {
            SourceKind::Adbc {
                driver,
                entrypoint,
                options,
                dollar_placeholders,
                allow_shared_login,
            } => {
                assert_eq!(
                    driver,
                    Path::new("/cfg/drivers/libadbc_driver_snowflake.so")
                );
                assert_eq!(entrypoint, "AdbcDriverInit");
                assert_eq!(options["adbc.snowflake.sql.account"], "acme");
                assert!(*dollar_placeholders);
                assert!(!*allow_shared_login);
            }
            other => panic!("{other:?}"),
        }
        let anna = Principal::new("anna").unwrap();
        assert_eq!(
            c.adbc_options(&anna, "wh").map(|o| o["password"].as_str()),
            Some("${PW}")
        );
        for (text, says) in [
            ("[sources.s]\nkind = \"adbc\"", "needs `driver`"),
            (
                "[sources.s]\nkind = \"adbc\"\ndriver = \"x.so\"\nplaceholders = \"colon\"",
                "unknown placeholder style",
            ),
            (
                "[sources.s]\nkind = \"sqlite\"\npath = \"x\"\ndriver = \"x.so\"",
                "for adbc sources",
            ),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn declared_types_follow_sqlite_affinity() {
        assert_eq!(ColumnType::from_decl("DATE"), Some(ColumnType::Date));
        assert_eq!(ColumnType::from_decl("varchar(20)"), Some(ColumnType::Text));
        assert_eq!(ColumnType::from_decl("BIGINT"), Some(ColumnType::Integer));
        assert_eq!(
            ColumnType::from_decl("DECIMAL(10,2)"),
            Some(ColumnType::Real)
        );
        assert_eq!(ColumnType::from_decl(""), None);
    }
}
