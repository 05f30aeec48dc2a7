//! SQLite producer. Implementation: see the contract in lib.rs and the helper's brief.

use std::collections::BTreeMap;

use dataref_config::{ColumnType, QueryConfig, SourceConfig};
use dataref_protocol::Principal;
use dataref_store::{ArtifactMeta, ArtifactStore, Lineage};
use serde_json::{Map, Value};

use crate::SourceError;

/// A bound parameter value.
#[derive(Debug, Clone, PartialEq)]
pub enum ParamValue {
    Null,
    Integer(i64),
    Real(f64),
    Text(String),
}

/// How much the SQL is trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SqlPolicy {
    /// SQL written by the operator in dataref.toml. Still read-only.
    Configured,
    /// SQL written by the model (`query` tool): read-only, no ATTACH, no state-changing
    /// pragmas, one statement.
    Generic,
}

/// One statement to run on a source.
#[derive(Debug, Clone)]
pub struct FetchRequest<'a> {
    pub source: &'a SourceConfig,
    pub sql: &'a str,
    pub params: Vec<(String, ParamValue)>,
    /// Declared column types, overriding what the source reports.
    pub declared: &'a BTreeMap<String, ColumnType>,
    pub policy: SqlPolicy,
}

/// Checks `args` against `query`'s parameters (required, types, `YYYY-MM-DD` dates,
/// timestamps) and fills in defaults. Unknown argument names are an error.
pub fn bind_params(
    query: &QueryConfig,
    args: &Map<String, Value>,
) -> Result<Vec<(String, ParamValue)>, SourceError> {
    let _ = (query, args);
    unimplemented!("sources helper")
}

/// Runs `req` and streams the rows into a new table artifact owned by `owner`.
/// `progress` is called with the rows so far after each batch; `is_cancelled` is polled
/// while the statement runs (cancellation removes the partial artifact).
pub fn fetch(
    req: &FetchRequest<'_>,
    store: &dyn ArtifactStore,
    owner: &Principal,
    lineage: Lineage,
    progress: &(dyn Fn(u64) + Sync),
    is_cancelled: &(dyn Fn() -> bool + Sync),
) -> Result<ArtifactMeta, SourceError> {
    let _ = (req, store, owner, lineage, progress, is_cancelled);
    unimplemented!("sources helper")
}
