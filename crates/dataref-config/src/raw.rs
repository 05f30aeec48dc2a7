//! The file as written. Every struct refuses unknown keys, so a typo is an error.
//!
//! Every field's doc comment is the user's documentation of its key (meaning, default,
//! unit): the configuration reference page is generated from them ([`crate::reference`]),
//! and a test fails when a key has none. Each table's text on that page is the doc comment
//! of the field that holds it; the structs' own doc comments are for this code only.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::Deserialize;

/// `dataref.toml`, in the order of the reference page.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConfig {
    /// The server itself.
    #[serde(default)]
    pub server: RawServer,
    /// Artifacts: the query results and files the tools store and the model refers to by
    /// `dataRef`.
    #[serde(default)]
    pub store: RawStore,
    /// Bounds on what goes back to the model and on how long a call may run.
    #[serde(default)]
    pub limits: RawLimits,
    /// Each principal's workspace: the files `run_python`, exports, charts and spilled
    /// results write.
    #[serde(default)]
    pub workspace: RawWorkspace,
    /// What a `render_chart` result carries besides the link to the file.
    #[serde(default)]
    pub charts: RawCharts,
    /// What a `render_table` result carries besides the link to the file.
    #[serde(default)]
    pub tables: RawTables,
    /// Large tool results are written to the caller's workspace (`.spill/`) and the model
    /// gets the path and a preview instead.
    #[serde(default)]
    pub spill: RawSpill,
    /// `run_python`: the runtime, the warm pool and each run's limits.
    #[serde(default)]
    pub python: RawPython,
    /// `run_sql`: SQL over dataRefs in the embedded engine.
    #[serde(default)]
    pub sql: RawSql,
    /// A database the tools read, by name (a lower-case identifier). A config file serves
    /// only its own sources, never the built-in sample.
    #[serde(default)]
    pub sources: BTreeMap<String, RawSource>,
    /// A named query: SQL the operator wrote, served as the tool `fetch_NAME` (NAME a
    /// lower-case identifier), its parameters bound, never spliced.
    #[serde(default)]
    pub queries: BTreeMap<String, RawQuery>,
    /// Another MCP server whose tools dataref serves next to its own (prefixed, their large
    /// results spilled): a `command` speaking MCP on stdin/stdout, or a Streamable HTTP
    /// `url`, exactly one of the two.
    #[serde(default)]
    pub upstream: Vec<RawUpstream>,
    /// An HTTP API as a tool named NAME (a lower-case identifier, not a built-in tool's or a
    /// named query's name); its parameters become the tool's input schema.
    #[serde(default)]
    pub http_tools: BTreeMap<String, RawHttpTool>,
    /// An agent profile: which model, prompt, tools, limits and approvals. A file without
    /// `[agents]` has one profile, `default`, with every default and its endpoint from
    /// `DATAREF_LLM_URL`, `DATAREF_LLM_MODEL` and `DATAREF_LLM_API_KEY`.
    #[serde(default)]
    pub agents: BTreeMap<String, RawAgent>,
    /// A principal (the stdio session's, an HTTP token's or a JWT's; letters, digits and
    /// `._@-`): the tokens that authenticate as it and the PostgreSQL role it runs as.
    #[serde(default)]
    pub principals: BTreeMap<String, RawPrincipal>,
    /// `dataref serve --http`. A file with this table is meant for HTTP: `dataref doctor`
    /// then fails what the server would refuse.
    // `None` when the file has no `[http]` table.
    pub http: Option<RawHttp>,
    /// Several `serve --http` replicas behind a load balancer: the S3-compatible bucket and
    /// the PostgreSQL index they share. Without it, this server's data directory holds
    /// everything.
    // `None` when the file has no `[shared]` table: one server, local store.
    pub shared: Option<RawShared>,
    /// Caps on what agents spend on models: tokens and money per UTC day and month, per
    /// agent profile, per principal and per group of principals. A run that would go over
    /// one stops, saying which; a warning comes at 80%.
    #[serde(default)]
    pub budgets: crate::budget::RawBudgets,
    /// The Prometheus metrics endpoint, on a port of its own. Without `listen` there is
    /// none.
    #[serde(default)]
    pub metrics: crate::metrics::RawMetrics,
    /// OpenTelemetry traces over OTLP/HTTP: one trace per MCP request or agent run, with
    /// spans for model calls, tool calls, the sandbox, SQL and the store. Without
    /// `endpoint` none are exported.
    #[serde(default)]
    pub traces: crate::traces::RawTraces,
    /// The audit trail: an append-only, hash-chained JSON-lines record of every data
    /// access, never row values. On by default, under `<data dir>/audit`.
    #[serde(default)]
    pub audit: crate::audit::RawAudit,
}

/// `[server]`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawServer {
    /// The principal of stdio sessions: who owns what they store (letters, digits and
    /// `._@-`). `--principal` and `DATAREF_PRINCIPAL` win. Default `local`.
    pub principal: Option<String>,
}

/// `[store]`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawStore {
    /// How long an artifact lives; after that the model is told to fetch it again.
    /// Default `24h`.
    pub ttl: Option<RawDuration>,
    /// A write that crosses this size is aborted, with a hint to narrow the query.
    /// Default `1GiB`.
    pub max_artifact_bytes: Option<RawSize>,
    /// Total live bytes of artifacts one principal may hold. Default `10GiB`.
    pub owner_quota_bytes: Option<RawSize>,
    /// How often expired artifacts are removed. Default `10m`.
    pub sweep_interval: Option<RawDuration>,
}

/// `[limits]`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLimits {
    /// The last resort on one tool result's text, in characters: a longer result is kept
    /// whole in `.spill/` and cut to valid JSON, saying so. Default 16000, at least 200.
    pub max_result_chars: Option<usize>,
    /// A tool call is cancelled after this long. Default `600s`.
    pub tool_timeout: Option<RawDuration>,
    /// At most this many artifacts in one `list_artifacts` answer. Default 50.
    pub list_artifacts_max: Option<usize>,
    /// At most this many columns in one `describe_data` answer. Default 20.
    pub describe_max_columns: Option<usize>,
}

/// `[workspace]`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawWorkspace {
    /// Bytes of files one principal's workspace under the data directory may hold; every
    /// writer counts. Default `1GiB`, at least `1MiB`. A `--workspace DIR` has none.
    pub quota: Option<RawSize>,
}

/// `[charts]`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCharts {
    /// `true`: `render_chart` also sends the PNG inline as an image block (~90 KB of base64
    /// in the model's context). Default false: the result links the file.
    pub inline_image: Option<bool>,
}

/// `[tables]`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTables {
    /// `true`: `render_table` also sends the table inline (Markdown, and the HTML document
    /// when asked for). Default false: the rows stay in the linked file.
    pub inline: Option<bool>,
}

/// `[spill]`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSpill {
    /// `false` never spills. Default true.
    pub enabled: Option<bool>,
    /// A result whose text has more characters than this is spilled. Default 1000, above
    /// zero.
    pub threshold_chars: Option<usize>,
    /// Characters of a spilled result shown to the model beside its path. Default 300, at
    /// most `threshold_chars`.
    pub preview_chars: Option<usize>,
    /// Spill files older than this are removed. Default `7d`.
    pub retention: Option<RawDuration>,
    /// How often old spill files are looked for. Default `6h`.
    pub sweep_interval: Option<RawDuration>,
    /// One tool's own settings, by tool name, over the ones above.
    #[serde(default)]
    #[schemars(extend("x-key" = "TOOL"))]
    pub tools: BTreeMap<String, RawSpillTool>,
}

/// `[spill.tools.TOOL]`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSpillTool {
    /// `false` never spills this tool; `true` spills it even when its result is already a
    /// synopsis (the built-in producers', which spill only when named). Default: the tool's.
    pub enabled: Option<bool>,
    /// This tool's threshold, in characters. Default `spill.threshold_chars`.
    pub threshold_chars: Option<usize>,
}

/// `[python]`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPython {
    /// `false` leaves `run_python` out. Default true.
    pub enabled: Option<bool>,
    /// A Python you manage, with pandas and pyarrow installed (dataref never installs into
    /// it), relative to this file. Default: dataref's own venv in the data directory.
    pub interpreter: Option<String>,
    /// The Python dataref's own venv is made from, relative to this file; not with
    /// `interpreter`. Default: `python3` on `PATH`, else `/usr/bin/python3` for a jail
    /// user who cannot reach that one.
    pub base_interpreter: Option<String>,
    /// Warm sandboxes kept ready; 0 starts every run cold. Default 2, at most 32.
    pub pool_size: Option<usize>,
    /// A run's wall clock when the call asks for none (`timeout_s`). Default `60s`, at most
    /// `max_timeout`.
    pub timeout: Option<RawDuration>,
    /// The most a call may ask for with `timeout_s`. Default `10m`.
    pub max_timeout: Option<RawDuration>,
    /// Memory of one run, swap included. Default `2GiB`, at least `64MiB`.
    pub memory: Option<RawSize>,
    /// CPU cores one run may use. Default 1.
    pub cpus: Option<f64>,
    /// Processes and threads of one run. Default 64, at least 4.
    pub max_processes: Option<u64>,
    /// The most bytes a run's `result` may take as JSON (tables go in `outputs`).
    /// Default 4096, from 256 to 1048576.
    pub result_bytes: Option<usize>,
    /// `true`: refuse runs where cgroups cannot enforce the memory, process and CPU limits,
    /// instead of falling back to rlimits with a warning. Default false.
    pub require_cgroups: Option<bool>,
    /// Runs at once on this server; more wait in line for a free sandbox. Default 4, from 1
    /// to 256.
    pub max_concurrent: Option<usize>,
    /// The size of one run's `out/` (a tmpfs: it counts against `memory`). Default
    /// `256MiB`, at least `1MiB` and less than `memory`.
    pub out_size: Option<RawSize>,
}

/// `[sql]`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSql {
    /// `false` leaves `run_sql` out. Default true.
    pub enabled: Option<bool>,
    /// A query is stopped after this long. Default `60s`.
    pub timeout: Option<RawDuration>,
    /// Working memory per query (the inputs are mapped files and do not count); a query
    /// that needs more is refused with a hint. Default `1GiB`, at least `16MiB`.
    pub memory: Option<RawSize>,
    /// The most rows `store_as = "value"` returns instead of storing a table. Default 100,
    /// from 1 to 10000.
    pub value_rows: Option<usize>,
}

/// `[sources.NAME]`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSource {
    /// `sqlite`, `postgres` (also `postgresql`), `mysql` (also `mariadb`), `adbc` (any
    /// database with an ADBC driver), or `files` (Parquet, CSV or NDJSON files of one
    /// table, on disk or S3).
    pub kind: String,
    /// SQLite: the database file, relative to this file; opened read-only. Required there.
    /// Files: a directory or glob (`lake/sales/`, `exports/*.csv`), relative to this file.
    pub path: Option<String>,
    /// PostgreSQL: a libpq connection string or `postgresql://` URL of the shared login;
    /// `${NAME}` is read from the environment when connecting. Required there. Files:
    /// `s3://bucket/prefix/`, with credentials from the server's environment
    /// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`; without them, unsigned requests for
    /// a public bucket). MySQL: `mysql://user:${PASSWORD}@host:3306/db` (`?socket=PATH`
    /// for a Unix socket), the login of principals without `mysql_user`.
    pub url: Option<String>,
    /// Files: `parquet`, `csv` or `ndjson`. Default: from the files' extension.
    pub format: Option<String>,
    /// Files: the table's name in SQL. Default: the source's name.
    pub table: Option<String>,
    /// Files on S3: an S3-compatible endpoint (e.g. `http://minio.internal:9000`). Default:
    /// AWS.
    pub endpoint: Option<String>,
    /// Files on S3: the bucket's region. Default `us-east-1`.
    pub region: Option<String>,
    /// PostgreSQL: connections kept open per login (the shared one, and each caller's own
    /// role for `query`); none before the first call. Default 4, from 1 to 64.
    pub pool_size: Option<usize>,
    /// ADBC: the driver's shared library (`libadbc_driver_snowflake.so`), relative to this
    /// file. Required there.
    pub driver: Option<String>,
    /// ADBC: the driver's init function. Default `AdbcDriverInit`.
    pub entrypoint: Option<String>,
    /// ADBC: the database options the driver takes (`uri`, `username`, `password`,
    /// `adbc.snowflake.sql.warehouse`, …); `${NAME}` is read from the environment at each
    /// call. A principal's own `[principals.NAME.adbc.SOURCE]` options are laid over them.
    pub options: Option<BTreeMap<String, String>>,
    /// ADBC: how `:name` placeholders of named queries are sent: `question` (`?`, the
    /// default) or `dollar` (`$1`, PostgreSQL's driver).
    pub placeholders: Option<String>,
    /// Rows of a result's sample the model sees; 0 for sensitive data (the schema only).
    /// Default 2, at most 100.
    pub sample_rows: Option<usize>,
    /// Sample values longer than this many characters are cut, and marked. Default 80, at
    /// least 8.
    pub max_value_chars: Option<usize>,
    /// A result with more rows is an error with a hint, never a silent cut. Default
    /// 10000000.
    pub max_rows: Option<u64>,
    /// A statement running longer is interrupted (PostgreSQL: its `statement_timeout` and
    /// dataref's own deadline). Default `60s`.
    pub timeout: Option<RawDuration>,
    /// `true` offers the generic `query(source, sql)` tool, SQL the model writes, on this
    /// source. Default false.
    pub allow_sql: Option<bool>,
    /// PostgreSQL: run `query` on the shared login of `url`, which can become several
    /// principals' roles, instead of as the caller's own role. Default false.
    pub allow_sql_shared_roles: Option<bool>,
    /// MySQL and ADBC: let principals without their own login (`mysql_user`, or
    /// `[principals.NAME.adbc.SOURCE]`) use the source's (they then share its grants). Default false: only the server's own principal (stdio, or HTTP
    /// without auth) logs in as it.
    pub allow_shared_login: Option<bool>,
}

/// `[queries.NAME]`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawQuery {
    /// The `[sources.NAME]` the SQL runs on.
    pub source: String,
    /// The tool's description: the model picks tools by it.
    pub description: String,
    /// The statement, each parameter written `:P`.
    pub sql: String,
    /// A parameter of the tool, bound to `:P` in `sql` (a parameter the SQL never uses is
    /// an error).
    #[serde(default)]
    #[schemars(extend("x-key" = "P"))]
    pub params: BTreeMap<String, RawParam>,
    /// Declared result types by column name (`integer`, `real`, `text`, `blob`, `boolean`,
    /// `date`, `timestamp`), over what the source reports. SQLite sources only.
    #[serde(default)]
    pub columns: BTreeMap<String, String>,
}

/// `[queries.NAME.params.P]`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawParam {
    /// `string`, `integer`, `number`, `boolean`, `date` (`YYYY-MM-DD`) or `timestamp`
    /// (`YYYY-MM-DD HH:MM:SS` or RFC 3339).
    #[serde(rename = "type")]
    pub ty: String,
    /// The call must give it; then it has no `default`. Default false.
    #[serde(default)]
    pub required: bool,
    /// The value when the call gives none, of the declared type.
    #[schemars(with = "Option<serde_json::Value>")]
    pub default: Option<toml::Value>,
    /// What the model is told the parameter means.
    pub description: Option<String>,
}

/// `[[upstream]]`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawUpstream {
    /// A lower-case identifier, unique among the upstreams; in logs and the default
    /// `prefix`.
    pub name: String,
    /// The program and its arguments, speaking MCP on stdin/stdout.
    pub command: Option<Vec<String>>,
    /// Variables added to dataref's environment for `command`; `${NAME}` in a value is
    /// read from dataref's environment at start.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The working directory of `command`, relative to this file.
    pub cwd: Option<String>,
    /// A Streamable HTTP endpoint (`http://` or `https://`).
    pub url: Option<String>,
    /// Headers sent with every request to `url`; `${NAME}` in a value is read from
    /// dataref's environment at start.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Put before each upstream tool's name (letters, digits, `_`, `-`; at most 32).
    /// Default the name and `_`.
    pub prefix: Option<String>,
    /// Only these tools, by their upstream names; a name the server lacks is an error.
    /// Default: all.
    pub tools: Option<Vec<String>>,
    /// One call is cancelled after this long; the handshake at start gets at least 60 s.
    /// Default `120s`.
    pub timeout: Option<RawDuration>,
}

/// `[http_tools.NAME]`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHttpTool {
    /// The tool's description: the model picks tools by it.
    pub description: String,
    /// `GET`, `POST`, `PUT`, `PATCH` or `DELETE`. Default `GET`.
    pub method: Option<String>,
    /// The endpoint; `{P}` in its path stands for the path parameter P (nowhere else, and
    /// no `user@`).
    pub url: String,
    /// Headers sent on every call; `${NAME}` in a value is read from dataref's environment
    /// at each call.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The header that carries the credential, e.g. `Authorization`; with `auth_value`.
    pub auth_header: Option<String>,
    /// The credential, e.g. `Bearer ${CRM_TOKEN}`: read from the environment at each call,
    /// never logged; with `auth_header`.
    pub auth_value: Option<String>,
    /// How long one call may take, reading the answer included. Default `30s`.
    pub timeout: Option<RawDuration>,
    /// A larger answer is refused. Default `10MiB`, at most `1GiB`.
    pub max_response_bytes: Option<RawSize>,
    /// The tool's read-only hint (an agent profile can ask before other calls). Default
    /// true for `GET`, false otherwise.
    pub read_only: Option<bool>,
    /// A header that carries the calling principal's name on every call.
    pub principal_header: Option<String>,
    /// A parameter of the tool (P: letters, digits and `_`).
    #[serde(default)]
    #[schemars(extend("x-key" = "P"))]
    pub params: BTreeMap<String, RawHttpParam>,
}

/// `[http_tools.NAME.params.P]`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHttpParam {
    /// Where it goes: `path`, `query`, `header` (named P, `_` as `-`) or `body` (the body
    /// parameters make one JSON object).
    #[serde(rename = "in")]
    pub location: String,
    /// `string`, `integer`, `number`, `boolean`, `array` (query or body) or `object` (body
    /// only). Default `string`.
    #[serde(rename = "type")]
    pub ty: Option<String>,
    /// What the model is told the parameter means.
    pub description: Option<String>,
    /// The call must give it; then it has no `default`. Default true for a path parameter
    /// (which is always required), false otherwise.
    pub required: Option<bool>,
    /// The value when the call gives none, of the parameter's `type` (and one of `enum`).
    #[schemars(with = "Option<serde_json::Value>")]
    pub default: Option<toml::Value>,
    /// The values allowed, each of the parameter's `type`.
    #[serde(rename = "enum")]
    #[schemars(with = "Option<Vec<serde_json::Value>>")]
    pub values: Option<Vec<toml::Value>>,
}

/// `[agents.NAME]`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAgent {
    /// The OpenAI-compatible base URL (e.g. `https://api.openai.com/v1`). Default
    /// `DATAREF_LLM_URL`.
    pub url: Option<String>,
    /// The model's name (e.g. `gpt-4o-mini`). Default `DATAREF_LLM_MODEL`.
    pub model: Option<String>,
    /// The API key; `${NAME}` in it is read from the environment when the model is called.
    /// Default `DATAREF_LLM_API_KEY`.
    pub api_key: Option<String>,
    /// One model request. Default `120s`.
    pub timeout: Option<RawDuration>,
    /// Retries of a request that failed in a way worth retrying; 0 never retries. Default
    /// 4, at most 20.
    pub max_retries: Option<u32>,
    /// The tokenizer: `o200k_base`, `cl100k_base`, `p50k_base` or `r50k_base`. Default:
    /// chosen from the model's name.
    pub encoding: Option<String>,
    /// From 0 to 2. Default: the model's.
    pub temperature: Option<f32>,
    /// The most tokens the model may write in one request, above zero. Default: the
    /// model's.
    pub max_tokens: Option<u32>,
    /// Stream the answer. Default true.
    pub stream: Option<bool>,
    /// What the model's provider charges per million input (prompt) tokens, in your
    /// currency (e.g. `0.15`): `dataref eval` reports a run's cost from it. Default: no
    /// cost reported. Set with `price_output`.
    pub price_input: Option<f64>,
    /// What the provider charges per million output (completion) tokens (e.g. `0.60`).
    /// Set with `price_input`.
    pub price_output: Option<f64>,
    /// The system prompt's template, inline; not with `prompt_file`. Default: dataref's own
    /// prompt.
    pub prompt: Option<String>,
    /// The system prompt's template in a file, relative to this file, read when the profile
    /// is used; not with `prompt`.
    pub prompt_file: Option<String>,
    /// Values for the prompt template, by variable name (letters, digits and `_`).
    #[serde(default)]
    pub vars: BTreeMap<String, String>,
    /// The tools the agent may call: names or patterns (`fetch_*`), checked when the agent
    /// starts. Default `["*"]`: all.
    pub tools: Option<Vec<String>>,
    /// Add `read_file` to `tools` when one of them can spill (a large result becomes a
    /// workspace file and a synopsis), so the model can read the parts it needs. `false`
    /// keeps the tools exactly as listed: the model then sees only a spilled result's
    /// synopsis. Default true.
    pub read_spilled: Option<bool>,
    /// Bounds on one agent run; each above zero.
    #[serde(default)]
    pub limits: RawAgentLimits,
    /// Tool name or pattern → `allow`, `ask` (a person confirms each call) or `deny`; exact
    /// names first, then patterns longest first. `default`: any other tool (`allow`).
    #[serde(default)]
    pub approval: BTreeMap<String, String>,
}

/// `[agents.NAME.limits]`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAgentLimits {
    /// Model requests per run. Default 16.
    pub max_turns: Option<u32>,
    /// Tool calls per run. Default 50.
    pub max_tool_calls: Option<u32>,
    /// A run's wall clock. Default `10m`.
    pub wall_time: Option<RawDuration>,
    /// The model's context window, in tokens. Default 128000.
    pub context_tokens: Option<usize>,
    /// One tool result at most, in tokens; at most `context_tokens` minus `answer_tokens`.
    /// Default 50000.
    pub result_tokens: Option<usize>,
    /// Tokens kept free for the answer, below `context_tokens`. Default 4096.
    pub answer_tokens: Option<usize>,
}

/// `[principals.NAME]`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPrincipal {
    /// SHA-256 digests of its bearer tokens (64 hex digits, `sha256:` before them
    /// optional); `dataref token new NAME` prints the line. A token names one principal.
    #[serde(default)]
    pub token_sha256: Vec<String>,
    /// The PostgreSQL role its calls run as. Default: its name.
    pub pg_role: Option<String>,
    /// The password `query` logs in to PostgreSQL with as `pg_role`; `${NAME}` is read from
    /// the environment when connecting. Default none (`peer`, `cert` or `trust`).
    pub pg_password: Option<String>,
    /// The MySQL user its calls on `mysql` sources log in as. Without it, calls are
    /// refused unless the source sets `allow_shared_login`.
    pub mysql_user: Option<String>,
    /// The password of `mysql_user`; `${NAME}` is read from the environment when
    /// connecting.
    pub mysql_password: Option<String>,
    /// Its own options for each ADBC source, by source name (`username`, `password =
    /// "${NAME}"`, a `uri`, a token), laid over the source's `options`.
    #[serde(default)]
    pub adbc: BTreeMap<String, BTreeMap<String, String>>,
}

/// `[http]`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHttp {
    /// Address and port to listen on when `--http` gives none. Default `127.0.0.1:8750`.
    pub listen: Option<String>,
    /// The URL clients reach this server at (signed download links, metadata). Default
    /// `http://` and the listen address.
    pub public_url: Option<String>,
    /// Require a bearer token or JWT. Default true; `false` is allowed on loopback only,
    /// and every caller is then `server.principal`.
    pub auth: Option<bool>,
    /// Accepted `Host` values (names, or `name:port`). Default: loopback names and the host
    /// of `public_url`.
    pub allowed_hosts: Option<Vec<String>>,
    /// Accepted `Origin` values (`scheme://host[:port]`); a request without `Origin` passes.
    /// Default: the origin of `public_url`.
    pub allowed_origins: Option<Vec<String>>,
    /// Requests one principal may have in flight; more get 429. Default 8, from 1 to 1024.
    pub max_concurrent: Option<usize>,
    /// Requests one principal may make per minute (bursts up to a tenth, at least 10); more
    /// get 429 with `Retry-After`. Default 600.
    pub rate_per_minute: Option<u32>,
    /// How long a signed download link stays valid. Default `15m`, at most 7 days.
    pub download_ttl: Option<RawDuration>,
    /// The HMAC key of signed download links; `${NAME}` is read at start. Default: random
    /// per process (links die with a restart), or with `[shared]` one kept in the index.
    pub signing_key: Option<String>,
    /// Downloads one principal may have in flight, apart from `max_concurrent`; more get
    /// 429. Default 8, from 1 to 1024.
    pub max_downloads: Option<usize>,
    /// A request body must have arrived whole within this, or gets 408. An upload
    /// (`PUT /files/…`) may take longer, but not this long without a byte. Default `30s`, at
    /// most `1h`.
    pub body_timeout: Option<RawDuration>,
    /// The largest file one upload (`PUT /files/…`) may be; the workspace quota still
    /// holds. Default `256MiB`.
    pub max_upload: Option<RawSize>,
    /// A response the client stops reading for this long is abandoned. Default `30s`, at
    /// most `1h`.
    pub send_timeout: Option<RawDuration>,
    /// Also accept JWTs from an identity provider as bearer tokens: `exp` required, `nbf`,
    /// `iss` and `aud` checked.
    pub jwt: Option<RawJwt>,
}

/// `[http.jwt]`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawJwt {
    /// `HS256` (with `secret`) or `RS256` (with `jwks_file`).
    pub algorithm: String,
    /// HS256: the shared secret, at least 32 bytes; `${NAME}` is read at start.
    pub secret: Option<String>,
    /// RS256: a JWKS file of the provider's RSA keys (chosen by `kid`), relative to this
    /// file.
    pub jwks_file: Option<String>,
    /// The claim that names the principal. Default `sub`.
    pub principal_claim: Option<String>,
    /// The `iss` every token must carry; required for RS256 unless `require_issuer =
    /// false`.
    pub issuer: Option<String>,
    /// A value every token's `aud` must carry; required unless `require_audience = false`.
    pub audience: Option<String>,
    /// `false`: accept tokens for any audience. Default true.
    pub require_audience: Option<bool>,
    /// `false`: accept RS256 tokens of any issuer the keys sign for. Default true.
    pub require_issuer: Option<bool>,
    /// Clock skew allowed on `exp` and `nbf`. Default `60s`.
    pub leeway: Option<RawDuration>,
}

/// `[shared]`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawShared {
    /// The bucket and an optional key prefix, `s3://BUCKET[/PREFIX]`. Its keys come from
    /// `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` only.
    // `Option` so that a missing key is an error with a hint, not serde's.
    #[schemars(required)]
    pub objects: Option<String>,
    /// An S3-compatible server's base URL. Default: AWS S3 for `region`.
    pub endpoint: Option<String>,
    /// The S3 region. Default `us-east-1`.
    pub region: Option<String>,
    /// The PostgreSQL URL of the shared index, usually `${NAME}` (it holds a password).
    /// TLS unless the host is this machine or the URL says `sslmode=disable`.
    #[schemars(required)]
    pub index: Option<String>,
    /// A PEM file of the CAs the index's certificate is checked against, relative to this
    /// file. Default: the system's trust store.
    pub index_ca: Option<String>,
    /// This replica's cache of artifact files; the least recently used are evicted beyond
    /// it. Default `10GiB`.
    pub cache_bytes: Option<RawSize>,
    /// Connections to the index from one replica. Default 8, at least 1.
    pub index_pool: Option<usize>,
    /// A request to the bucket or the index that takes longer counts as the shared store
    /// being unavailable. Default `30s`.
    pub timeout: Option<RawDuration>,
}

/// A number of bytes, or a string with a unit, in any case: `kB`, `MB`, `GB`, `TB`
/// (also `k`, `M`, `G`, `T`: powers of 1000), `KiB`, `MiB`, `GiB`, `TiB` (powers of 1024)
/// or `B`, e.g. `"512MiB"`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(untagged)]
#[schemars(rename = "size")]
pub(crate) enum RawSize {
    Bytes(u64),
    Text(String),
}

/// A number of seconds, or a string with a unit: `ms`, `s`, `m` (or `min`),
/// `h` or `d`, e.g. `"30s"`, `"10m"`, `"7d"`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(untagged)]
#[schemars(rename = "duration")]
pub(crate) enum RawDuration {
    Seconds(u64),
    Text(String),
}
