use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{DataRef, Timestamp};

/// At most this many columns are described (names, types, nulls, sample values): the
/// description of a table of any width stays bounded.
pub const DESCRIBED_COLUMNS: usize = 50;

/// What a producer returns instead of rows: the shape of the data, not its content.
///
/// For a 10-column table this stays under 1.5 KB (sample values are cut at a bounded
/// length, and the cut is marked). The field docs are the model's schema descriptions,
/// so they name no Rust items.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Description {
    /// Pass this to `run_python` inputs, `describe_data`, charts and exports.
    pub data_ref: DataRef,
    /// Number of rows stored.
    pub rows: u64,
    /// Column name → type, in table order: the first 50 of a wider table (`moreColumns`
    /// counts the rest).
    pub columns: Map<String, Value>,
    /// Columns left out of `columns`, `nulls` and `sample` (the table is wider than 50):
    /// `describe_data` with `columnOffset` pages through them all.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub more_columns: u64,
    /// Column name → number of NULLs, only for columns that have any.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub nulls: Map<String, Value>,
    /// The first rows (the source decides how many; may be none for sensitive data).
    pub sample: Vec<Map<String, Value>>,
    /// Present when sample values were cut or the sample is withheld: says what and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_note: Option<String>,
    /// What the producer wants you to know about how the rows were stored (a column kept
    /// as text, values Arrow cannot hold stored as NULL, …). Absent when there is nothing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
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
    /// Non-null values (for floats: non-null, finite values; see `nonFinite`).
    pub count: u64,
    pub nulls: u64,
    /// Floats only: NaN and ±infinity. They are left out of `count`, `distinct`, `min`,
    /// `max` and `numeric`, so `count + nulls + nonFinite` is the number of rows.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub non_finite: u64,
    /// Distinct non-null values (0 when `note` says they were not counted).
    pub distinct: u64,
    /// True when `distinct` is an estimate (HyperLogLog, standard error about 0.8%).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub distinct_is_estimate: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "number_or_string")]
    pub min: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "number_or_string")]
    pub max: Option<Value>,
    /// Numbers only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numeric: Option<NumericStats>,
    /// Strings (and booleans): the most frequent values with their counts, most frequent
    /// first. For strings, left out when no value occurs more than once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top: Vec<TopValue>,
    /// True when `top` comes from a bounded-memory summary (many distinct values): its
    /// counts are lower bounds, each at most rows / 65,537 below the true count.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub top_is_estimate: bool,
    /// Says which statistics were not computed and why (e.g. an unsupported type).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

// A `serde_json::Value` derives the schema `true` (any value), which hosts that map tool
// schemas onto a stricter dialect refuse; these name what the statistics really hold.

/// `min` and `max`: a number (numeric columns) or a string (text, dates, times).
fn number_or_string(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "anyOf": [{ "type": "number" }, { "type": "string" }] })
}

/// A `top` value: a string (text columns) or a boolean (boolean columns).
fn string_or_boolean(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "anyOf": [{ "type": "string" }, { "type": "boolean" }] })
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NumericStats {
    pub mean: f64,
    /// Sample standard deviation (ddof = 1, as pandas); 0 for a single value.
    pub std: f64,
    /// Quartiles, interpolated linearly between ranks (pandas' default).
    pub p25: f64,
    pub p50: f64,
    pub p75: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TopValue {
    #[schemars(schema_with = "string_or_boolean")]
    pub value: Value,
    pub count: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `min`, `max` and `top[].value` hold numbers, strings and booleans: their schemas say
    /// so instead of the bare `true` a `Value` derives, which stricter hosts refuse.
    #[test]
    fn stats_schema_names_what_values_hold() {
        let schema = crate::object_schema::<DataStats>();
        let column = &schema["properties"]["columns"]["items"]["properties"];
        for key in ["min", "max"] {
            assert_eq!(
                column[key],
                serde_json::json!({"anyOf": [{"type": "number"}, {"type": "string"}]}),
                "{key}"
            );
        }
        assert_eq!(
            column["top"]["items"]["properties"]["value"],
            serde_json::json!({"anyOf": [{"type": "string"}, {"type": "boolean"}]})
        );
        assert!(!schema.to_string().contains(":true"), "{schema}");
    }
}
