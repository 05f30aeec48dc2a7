//! The receipts the built-in tools write with each table they store: what each knows of how
//! the table was made, filled where it is made (the source's version by the source itself,
//! `dataref_sources`).

use dataref_config::{SourceConfig, SourceKind};
use dataref_protocol::{Parent, Receipt, SourceRead};
use dataref_sources::ParamValue;
use dataref_store::ArtifactMeta;
use dataref_tool::RunContext;
use serde_json::Value;

/// A receipt of a call that starts now, with this dataref's version.
pub(crate) fn started(ctx: &RunContext) -> Receipt {
    Receipt::started(ctx.clock.now())
}

/// A producer's receipt: the source it reads, the SQL as it will be sent and the values
/// bound to it. The source adds its version as it reads.
pub(crate) fn producer(
    ctx: &RunContext,
    source: &SourceConfig,
    sql: &str,
    params: &[(String, ParamValue)],
) -> Receipt {
    let mut receipt = started(ctx);
    receipt.source = Some(SourceRead {
        name: source.name.clone(),
        kind: source_kind(&source.kind).to_owned(),
        version: None,
    });
    receipt.sql = Some(sql.to_owned());
    receipt.params = params
        .iter()
        .map(|(name, v)| (name.clone(), param_json(v)))
        .collect();
    if matches!(source.kind, SourceKind::Files { .. }) {
        receipt.engines.insert(
            "datafusion".into(),
            dataref_sql::DATAFUSION_VERSION.to_owned(),
        );
    }
    receipt
}

/// A stored table a derivation read, as its receipt names it.
pub(crate) fn parent(name: &str, meta: &ArtifactMeta) -> Parent {
    Parent {
        name: name.to_owned(),
        data_ref: meta.data_ref.clone(),
        checksum: meta.checksum.map(|c| c.to_string()),
    }
}

/// The name a receipt gives a source's kind.
pub(crate) fn source_kind(kind: &SourceKind) -> &'static str {
    match kind {
        SourceKind::Sqlite { .. } => "sqlite",
        SourceKind::Postgres { .. } => "postgres",
        SourceKind::Mysql { .. } => "mysql",
        SourceKind::Adbc { .. } => "adbc",
        SourceKind::Files { .. } => "files",
        // `SourceKind` is `#[non_exhaustive]`.
        _ => "other",
    }
}

fn param_json(v: &ParamValue) -> Value {
    match v {
        ParamValue::Null => Value::Null,
        ParamValue::Integer(i) => Value::from(*i),
        ParamValue::Real(f) => serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number),
        ParamValue::Text(s) => Value::String(s.clone()),
    }
}
