//! `dataref.toml`: the raw file, its resolution into a typed [`Config`], the names of the
//! environment variables dataref reads ([`env`](mod@env)), and the reference pages of both,
//! generated from their doc comments ([`reference`](mod@reference)).
//!
//! The raw structs mirror the file and refuse unknown keys; `Config::resolve` checks
//! everything that can be checked without opening a source (types, names, references
//! between queries and sources, units) and turns it into plain values. Bad config is an
//! error with a hint, never silently replaced by a default.
//!
//! ```
//! use dataref_config::Config;
//! let text = r#"
//! [sources.shop]
//! kind = "sqlite"
//! path = "/srv/shop.sqlite"
//!
//! [queries.orders]
//! source = "shop"
//! description = "Orders placed since a date."
//! sql = "SELECT * FROM orders WHERE placed >= :since"
//! params.since = { type = "date", required = true }
//! "#;
//! let config = Config::from_toml_str(text, "/etc/dataref".as_ref(), "/var/lib/dataref".into()).unwrap();
//! assert_eq!(config.queries["orders"].tool_name(), "fetch_orders");
//! ```
//!
//! Owns: the file format and its resolution, units (durations, sizes), every environment
//! variable name, and the process's TLS provider ([`tls`]). Must not import any dataref
//! crate but `dataref-protocol`, and nothing that opens a source, the store or the network:
//! resolution checks what can be checked from the text alone.

#![expect(
    clippy::disallowed_methods,
    reason = "this crate owns reading dataref.toml"
)]

mod access;
pub mod agent;
mod audit;
pub mod budget;
pub mod env;
mod error;
pub mod http_tool;
pub mod metrics;
mod raw;
pub mod reference;
mod resolve;
mod shared;
mod spill;
pub mod tls;
pub mod traces;
mod units;
mod upstream;

pub use access::{HttpConfig, JwtConfig, JwtKey, PrincipalConfig};
pub use agent::{AgentConfig, AgentLimits, Approval, ModelEndpoint, Prices, PromptSource};
pub use audit::AuditConfig;
pub use budget::{Budget, BudgetCap, BudgetConfig, BudgetScope, BudgetWindow};
pub use error::ConfigError;
pub use http_tool::{
    HttpAuth, HttpMethod, HttpParam, HttpToolConfig, JsonType, ParamLocation, PathPiece,
    UrlTemplate,
};
pub use resolve::{
    CallLimits, ColumnType, Config, FileFormat, ParamConfig, ParamType, PythonConfig, QOQ_SQL,
    QueryConfig, SampleSpec, SourceConfig, SourceKind, SqlConfig, StoreConfig,
};
pub use shared::SharedConfig;
pub use spill::{SpillConfig, ToolSpill};
pub use units::{parse_bytes, parse_duration};
pub use upstream::{UpstreamConfig, UpstreamTransport};
