use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{DataRef, Timestamp};

/// What a producer returns instead of rows: the shape of the data, not its content.
///
/// For a 10-column table this stays under 1.5 KB (sample values are cut at a bounded
/// length, and the cut is marked).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Description {
    /// Pass this to `run_python` inputs, `describe_data`, charts and exports.
    pub data_ref: DataRef,
    /// Number of rows stored.
    pub rows: u64,
    /// Column name → type, in table order.
    pub columns: Map<String, Value>,
    /// Column name → number of NULLs, only for columns that have any.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub nulls: Map<String, Value>,
    /// The first rows (the source decides how many; may be none for sensitive data).
    pub sample: Vec<Map<String, Value>>,
    /// Present when sample values were cut or the sample is withheld: says what and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_note: Option<String>,
    /// After this instant the reference is gone; fetch again.
    pub expires_at: Timestamp,
}

/// `describe_data`: summary statistics per column, bounded (wide tables page through
/// columns with `columnOffset`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataStats {
    pub data_ref: DataRef,
    pub rows: u64,
    /// How many columns the table has in all.
    pub total_columns: usize,
    pub columns: Vec<ColumnStats>,
    /// Set when more columns remain: pass it as `columnOffset` to see them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_column_offset: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ColumnStats {
    pub name: String,
    #[serde(rename = "type")]
    pub data_type: String,
    /// Non-null values.
    pub count: u64,
    pub nulls: u64,
    /// Distinct non-null values.
    pub distinct: u64,
    /// True when `distinct` is an estimate (HyperLogLog, about 1% error).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub distinct_is_estimate: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<Value>,
    /// Numbers only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numeric: Option<NumericStats>,
    /// Strings (and booleans): the most frequent values with their counts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top: Vec<TopValue>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NumericStats {
    pub mean: f64,
    pub std: f64,
    pub p25: f64,
    pub p50: f64,
    pub p75: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TopValue {
    pub value: Value,
    pub count: u64,
}
