//! The file as written. Every struct refuses unknown keys, so a typo is an error.

use std::collections::BTreeMap;

use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConfig {
    #[serde(default)]
    pub server: RawServer,
    #[serde(default)]
    pub store: RawStore,
    #[serde(default)]
    pub limits: RawLimits,
    #[serde(default)]
    pub sources: BTreeMap<String, RawSource>,
    #[serde(default)]
    pub queries: BTreeMap<String, RawQuery>,
    #[serde(default)]
    pub python: RawPython,
    #[serde(default)]
    pub sql: RawSql,
    #[serde(default)]
    pub spill: RawSpill,
    #[serde(default)]
    pub upstream: Vec<RawUpstream>,
    #[serde(default)]
    pub principals: BTreeMap<String, RawPrincipal>,
    /// `None` when the file has no `[http]` table.
    pub http: Option<RawHttp>,
    #[serde(default)]
    pub workspace: RawWorkspace,
    #[serde(default)]
    pub charts: RawCharts,
    #[serde(default)]
    pub tables: RawTables,
    #[serde(default)]
    pub agents: BTreeMap<String, RawAgent>,
    #[serde(default)]
    pub http_tools: BTreeMap<String, RawHttpTool>,
    /// `None` when the file has no `[shared]` table: one server, local store.
    pub shared: Option<RawShared>,
}

/// `[shared]`: the object store and PostgreSQL index replicas share.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawShared {
    pub objects: Option<String>,
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub index: Option<String>,
    pub index_ca: Option<String>,
    pub cache_bytes: Option<RawSize>,
    pub index_pool: Option<usize>,
    pub timeout: Option<RawDuration>,
}

/// `[http_tools.NAME]`: an HTTP API as a tool.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHttpTool {
    pub description: String,
    pub method: Option<String>,
    pub url: String,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    pub auth_header: Option<String>,
    pub auth_value: Option<String>,
    pub timeout: Option<RawDuration>,
    pub max_response_bytes: Option<RawSize>,
    pub read_only: Option<bool>,
    pub principal_header: Option<String>,
    #[serde(default)]
    pub params: BTreeMap<String, RawHttpParam>,
}

/// `[http_tools.NAME.params.P]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHttpParam {
    #[serde(rename = "in")]
    pub location: String,
    #[serde(rename = "type")]
    pub ty: Option<String>,
    pub description: Option<String>,
    pub required: Option<bool>,
    pub default: Option<toml::Value>,
    #[serde(rename = "enum")]
    pub values: Option<Vec<toml::Value>>,
}

/// `[agents.NAME]`: one agent profile.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAgent {
    pub url: Option<String>,
    pub model: Option<String>,
    pub api_key: Option<String>,
    pub timeout: Option<RawDuration>,
    pub max_retries: Option<u32>,
    pub encoding: Option<String>,
    pub temperature: Option<f32>,
    pub max_tokens: Option<u32>,
    pub stream: Option<bool>,
    pub prompt: Option<String>,
    pub prompt_file: Option<String>,
    #[serde(default)]
    pub vars: BTreeMap<String, String>,
    pub tools: Option<Vec<String>>,
    #[serde(default)]
    pub limits: RawAgentLimits,
    /// Tool or pattern → `allow`/`ask`/`deny`; `default` for the rest.
    #[serde(default)]
    pub approval: BTreeMap<String, String>,
}

/// `[agents.NAME.limits]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAgentLimits {
    pub max_turns: Option<u32>,
    pub max_tool_calls: Option<u32>,
    pub wall_time: Option<RawDuration>,
    pub context_tokens: Option<usize>,
    pub result_tokens: Option<usize>,
    pub answer_tokens: Option<usize>,
}

/// `[charts]`: what a `render_chart` result carries besides the link to the file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCharts {
    pub inline_image: Option<bool>,
}

/// `[tables]`: what a `render_table` result carries besides the link to the file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTables {
    pub inline: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawWorkspace {
    pub quota: Option<RawSize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPrincipal {
    /// SHA-256 of the bearer token(s), lower-case hex.
    #[serde(default)]
    pub token_sha256: Vec<String>,
    pub pg_role: Option<String>,
    pub pg_password: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHttp {
    pub listen: Option<String>,
    pub public_url: Option<String>,
    pub auth: Option<bool>,
    pub allowed_hosts: Option<Vec<String>>,
    pub allowed_origins: Option<Vec<String>>,
    pub max_concurrent: Option<usize>,
    pub rate_per_minute: Option<u32>,
    pub download_ttl: Option<RawDuration>,
    pub signing_key: Option<String>,
    pub max_downloads: Option<usize>,
    pub body_timeout: Option<RawDuration>,
    pub send_timeout: Option<RawDuration>,
    pub jwt: Option<RawJwt>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawJwt {
    pub algorithm: String,
    pub secret: Option<String>,
    pub jwks_file: Option<String>,
    pub principal_claim: Option<String>,
    pub issuer: Option<String>,
    pub audience: Option<String>,
    pub require_audience: Option<bool>,
    pub require_issuer: Option<bool>,
    pub leeway: Option<RawDuration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSpill {
    pub enabled: Option<bool>,
    pub threshold_chars: Option<usize>,
    pub preview_chars: Option<usize>,
    pub retention: Option<RawDuration>,
    pub sweep_interval: Option<RawDuration>,
    #[serde(default)]
    pub tools: BTreeMap<String, RawSpillTool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSpillTool {
    pub enabled: Option<bool>,
    pub threshold_chars: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawUpstream {
    pub name: String,
    pub command: Option<Vec<String>>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub cwd: Option<String>,
    pub url: Option<String>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    pub prefix: Option<String>,
    pub tools: Option<Vec<String>>,
    pub timeout: Option<RawDuration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPython {
    pub enabled: Option<bool>,
    pub interpreter: Option<String>,
    pub base_interpreter: Option<String>,
    pub pool_size: Option<usize>,
    pub timeout: Option<RawDuration>,
    pub max_timeout: Option<RawDuration>,
    pub memory: Option<RawSize>,
    pub cpus: Option<f64>,
    pub max_processes: Option<u64>,
    pub result_bytes: Option<usize>,
    pub require_cgroups: Option<bool>,
    pub max_concurrent: Option<usize>,
    pub out_size: Option<RawSize>,
}

/// `[sql]`: `run_sql`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSql {
    pub enabled: Option<bool>,
    pub timeout: Option<RawDuration>,
    pub memory: Option<RawSize>,
    pub value_rows: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawServer {
    pub principal: Option<String>,
}

/// A size: a number of bytes or a string with a unit.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum RawSize {
    Bytes(u64),
    Text(String),
}

/// A duration: a number of seconds or a string with a unit.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum RawDuration {
    Seconds(u64),
    Text(String),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawStore {
    pub ttl: Option<RawDuration>,
    pub max_artifact_bytes: Option<RawSize>,
    pub owner_quota_bytes: Option<RawSize>,
    pub sweep_interval: Option<RawDuration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLimits {
    pub max_result_chars: Option<usize>,
    pub tool_timeout: Option<RawDuration>,
    pub list_artifacts_max: Option<usize>,
    pub describe_max_columns: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSource {
    pub kind: String,
    pub path: Option<String>,
    pub url: Option<String>,
    pub pool_size: Option<usize>,
    pub sample_rows: Option<usize>,
    pub max_value_chars: Option<usize>,
    pub max_rows: Option<u64>,
    pub timeout: Option<RawDuration>,
    pub allow_sql: Option<bool>,
    pub allow_sql_shared_roles: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawQuery {
    pub source: String,
    pub description: String,
    pub sql: String,
    #[serde(default)]
    pub params: BTreeMap<String, RawParam>,
    #[serde(default)]
    pub columns: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawParam {
    #[serde(rename = "type")]
    pub ty: String,
    #[serde(default)]
    pub required: bool,
    pub default: Option<toml::Value>,
    pub description: Option<String>,
}
