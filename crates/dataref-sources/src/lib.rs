//! Producers: read a source under the caller's permissions and stream the rows into a table
//! artifact, batch by batch, never holding the whole result in memory.
//!
//! - [`Sources`] holds what lives as long as the server (a connection pool per PostgreSQL
//!   source, the principals' PostgreSQL roles); [`Sources::fetch`] runs one statement on
//!   any source and stores the result for the caller.
//! - [`postgres`]: the PostgreSQL producer (caller's role in a read-only transaction, rows
//!   decoded from the binary protocol into Arrow) and the `doctor` probe.
//! - [`adbc`]: any database with an ADBC driver (Snowflake, BigQuery, Flight SQL, …),
//!   the driver run in a worker process through the C ABI.
//! - [`mysql`]: the MySQL and MariaDB producer (the caller's own user in a read-only
//!   transaction, rows decoded from the binary protocol into Arrow).
//! - [`fetch`] runs one statement on a SQLite source and stores the result for the caller.
//! - [`bind_params`] checks a named query's arguments against its declared parameters and
//!   turns them into bound values (never spliced into SQL).
//! - [`ensure_sample`] generates the built-in sample sales database (deterministic).
//!
//! Every fetch opens the source read-only and behind an authorizer (no writes, no ATTACH,
//! no state-changing pragmas, one statement), is bounded by the source's `timeout` and
//! `max_rows`, and fixes each column's Arrow type before the first batch: declared in
//! config, else declared in SQLite, else inferred from the first rows. A value that does
//! not fit its column's type is an error ([`SourceError::TypeChange`]), never a NULL.
//!
//! ```no_run
//! use dataref_config::Config;
//! use dataref_sources::{FetchRequest, SqlPolicy, bind_params, ensure_sample, fetch};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let store: &dyn dataref_store::ArtifactStore = todo!();
//! let config = Config::builtin_sample("/var/lib/dataref".into(), 48_210);
//! if let Some(spec) = &config.sample {
//!     ensure_sample(spec, &|_rows| {})?;
//! }
//! let query = &config.queries["sales"];
//! let args = serde_json::json!({ "since": "2025-01-01" });
//! let req = FetchRequest {
//!     source: &config.sources[&query.source],
//!     sql: &query.sql,
//!     params: bind_params(query, args.as_object().ok_or("not an object")?)?,
//!     declared: &query.columns,
//!     policy: SqlPolicy::Configured,
//! };
//! let lineage = dataref_store::Lineage::new(query.tool_name(), args.clone());
//! let meta = fetch(&req, store, &config.principal, lineage, &|_rows| {}, &|| false)?;
//! println!("{} rows in {}", meta.rows, meta.data_ref.as_str());
//! # Ok(()) }
//! ```
//!
//! Owns: reading sources (rusqlite with the store, tokio-postgres and mysql_async alone), the sample
//! database, parameter binding. Must not import the sandbox, the exports, the charts, the
//! tools or any transport: a producer streams rows into the store and returns notes, nothing
//! about how the call arrived.

pub mod adbc;
mod civil;
mod error;
pub mod mysql;
pub mod postgres;
mod sample;
mod sources;
mod sqlite;

pub use error::{ConnectProblem, RoleProblem, SourceError};
pub use sample::{SAMPLE_ROWS_DEFAULT, SAMPLE_ROWS_MAX, ensure_sample, generate_sample};
pub use sources::{Fetched, Sources};
pub use sqlite::{FetchRequest, ParamValue, SqlPolicy, bind_params, fetch};
