use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::DataRef;

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
    /// counts the rest). `sample` rows list their values in this order.
    pub columns: Map<String, Value>,
    /// Columns left out of `columns`, `nulls` and `sample` (the table is wider than 50):
    /// `describe_data` with `columnOffset` pages through them all.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub more_columns: u64,
    /// Column name → number of NULLs, only for columns that have any.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub nulls: Map<String, Value>,
    /// The first rows, each an array of values in `columns` order (the source decides
    /// how many; absent when none are shown, e.g. for sensitive data).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "sample_rows")]
    pub sample: Vec<Vec<Value>>,
    /// Present when sample values were cut or the sample is withheld: says what and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_note: Option<String>,
    /// What the producer wants you to know about how the rows were stored (a column kept
    /// as text, values Arrow cannot hold stored as NULL, …). Absent when there is nothing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// Summary statistics per column as computed, bounded (wide tables page through columns
/// with `columnOffset`). `describe_data` answers with its compact form, [`StatsTable`].
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

// Made from `DataStats` by `From`: derived statistics (mean, std, p50) rounded to 4
// significant digits, values absent at the end of a row cut, the most frequent values
// (without their counts) only for low-cardinality text and booleans. Sized for the model's
// context: the sample's 7 columns in under 500 bytes. The doc below is the model's schema
// description, so it names no Rust items.
/// Summary statistics: one compact row per column, the field names said once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StatsTable {
    /// Rows in the table. Per column, non-null values = rows − nulls (− nonFinite).
    pub rows: u64,
    /// What each position of a `columns` row holds, in order.
    pub fields: Vec<String>,
    /// Column name → its statistics, positionally as `fields` says (null = not
    /// applicable; a shorter row leaves out the rest). min/max are values of the column
    /// (not given for text: see `values`); mean, std (ddof = 1) and p50 (the median) are for
    /// numbers only.
    #[schemars(schema_with = "stat_rows")]
    pub columns: Map<String, Value>,
    /// Text and boolean columns with at most 20 distinct values: their most frequent
    /// values, most frequent first (at most 5).
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    #[schemars(schema_with = "frequent_values")]
    pub values: Map<String, Value>,
    /// Columns whose `distinct` is an estimate (HyperLogLog, standard error about 0.8%).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub estimated: Vec<String>,
    /// Column name → what else is estimated or left out for it: `topIsEstimate`,
    /// `nonFinite` (NaN/±inf, not counted in the other statistics), `note`. Absent when
    /// there is nothing.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    #[schemars(schema_with = "column_flags")]
    pub exceptions: Map<String, Value>,
    /// Columns the table has in all, when more than are shown here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_columns: Option<usize>,
    /// Set when more columns remain: pass it as `columnOffset` to see them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_column_offset: Option<usize>,
}

/// The positions of a `columns` row.
pub const STATS_FIELDS: [&str; 8] = [
    "type", "nulls", "distinct", "min", "max", "mean", "std", "p50",
];

/// Frequent values are listed for text and booleans with at most this many distinct values.
pub const TOP_MAX_DISTINCT: u64 = 20;

impl From<&DataStats> for StatsTable {
    fn from(s: &DataStats) -> Self {
        let mut columns = Map::new();
        let mut values = Map::new();
        let mut estimated = Vec::new();
        let mut exceptions = Map::new();
        for c in &s.columns {
            let listed = !c.top.is_empty()
                && !c.top_is_estimate
                && !c.distinct_is_estimate
                && c.distinct <= TOP_MAX_DISTINCT
                && c.numeric.is_none();
            // Alphabetical extremes of text say little; its frequent values say more.
            let is_text = c.data_type == "string";
            let mut row: Vec<Option<Value>> = vec![
                Some(Value::String(c.data_type.clone())),
                Some(Value::from(c.nulls)),
                Some(Value::from(c.distinct)),
            ];
            if !is_text {
                row.push(c.min.clone());
                row.push(c.max.clone());
            }
            if let Some(n) = &c.numeric {
                row.extend([n.mean, n.std, n.p50].map(|x| Some(round4(x))));
            }
            while row.last().is_some_and(Option::is_none) {
                row.pop();
            }
            let row: Vec<Value> = row.into_iter().map(|v| v.unwrap_or(Value::Null)).collect();
            columns.insert(c.name.clone(), Value::Array(row));
            if listed {
                let listed: Vec<Value> = c.top.iter().map(|t| t.value.clone()).collect();
                values.insert(c.name.clone(), Value::Array(listed));
            }
            let mut flags = Map::new();
            if c.distinct_is_estimate {
                estimated.push(c.name.clone());
            }
            if c.top_is_estimate && listed {
                flags.insert("topIsEstimate".into(), Value::Bool(true));
            }
            if c.non_finite > 0 {
                flags.insert("nonFinite".into(), Value::from(c.non_finite));
            }
            if let Some(note) = &c.note {
                flags.insert("note".into(), Value::String(note.clone()));
            }
            if !flags.is_empty() {
                exceptions.insert(c.name.clone(), Value::Object(flags));
            }
        }
        Self {
            rows: s.rows,
            fields: STATS_FIELDS.map(str::to_owned).to_vec(),
            columns,
            values,
            estimated,
            exceptions,
            total_columns: (s.total_columns != s.columns.len() || s.next_column_offset.is_some())
                .then_some(s.total_columns),
            next_column_offset: s.next_column_offset,
        }
    }
}

/// `x` to 4 significant digits, as a JSON number (an integer when it is one).
fn round4(x: f64) -> Value {
    if !x.is_finite() {
        return Value::Null;
    }
    // Through decimal text, so 0.07476 stays 0.07476 (no binary tail).
    let r: f64 = format!("{x:.3e}").parse().unwrap_or(x);
    if r.fract() == 0.0 && r.abs() < 9.0e15 {
        #[expect(
            clippy::cast_possible_truncation,
            reason = "integral and below 2^53: exact"
        )]
        return Value::from(r as i64);
    }
    Value::from(r)
}

fn stat_rows(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "additionalProperties": {
            "type": "array",
            "items": { "type": ["string", "number", "null"] }
        }
    })
}

fn frequent_values(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "additionalProperties": {
            "type": "array",
            "items": { "type": ["string", "boolean"] }
        }
    })
}

fn column_flags(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "additionalProperties": {
            "type": "object",
            "properties": {
                "topIsEstimate": { "type": "boolean" },
                "nonFinite": { "type": "integer" },
                "note": { "type": "string" }
            }
        }
    })
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

/// A sample: rows of cell values (strings, numbers, booleans, nulls).
fn sample_rows(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "items": { "type": "array" }
    })
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

    /// One row per column with the field names once, derived numbers to 4 significant
    /// digits, trailing absent values cut, frequent values for low-cardinality text only,
    /// and what is estimated kept as an exception.
    #[test]
    fn stats_table_is_one_compact_row_per_column() {
        let text = |name: &str, distinct: u64, top: &[&str]| ColumnStats {
            name: name.into(),
            data_type: "string".into(),
            count: 10,
            nulls: 0,
            non_finite: 0,
            distinct,
            distinct_is_estimate: false,
            min: Some(serde_json::json!("a")),
            max: Some(serde_json::json!("z")),
            numeric: None,
            top: top
                .iter()
                .map(|v| TopValue {
                    value: serde_json::json!(v),
                    count: 2,
                })
                .collect(),
            top_is_estimate: false,
            note: None,
        };
        let price = ColumnStats {
            name: "price".into(),
            data_type: "float".into(),
            count: 9,
            nulls: 1,
            non_finite: 2,
            distinct: 90_000,
            distinct_is_estimate: true,
            min: Some(serde_json::json!(0.5)),
            max: Some(serde_json::json!(99.0)),
            numeric: Some(NumericStats {
                mean: 10.123_456,
                std: 0.074_756_3,
                p25: 3.0,
                p50: 1_234_567.0,
                p75: 20.0,
            }),
            top: Vec::new(),
            top_is_estimate: false,
            note: None,
        };
        let stats = DataStats {
            data_ref: DataRef::from_random_bytes([1; 16]),
            rows: 12,
            total_columns: 4,
            columns: vec![
                text("region", 2, &["north", "south"]),
                text("id", 500, &["x"]),
                price,
            ],
            next_column_offset: Some(3),
        };
        assert_eq!(
            serde_json::to_value(StatsTable::from(&stats)).unwrap(),
            serde_json::json!({
                "rows": 12,
                "fields": ["type", "nulls", "distinct", "min", "max", "mean", "std", "p50"],
                "columns": {
                    "region": ["string", 0, 2],
                    "id": ["string", 0, 500],
                    "price": ["float", 1, 90000, 0.5, 99.0, 10.12, 0.07476, 1235000],
                },
                "values": {"region": ["north", "south"]},
                "estimated": ["price"],
                "exceptions": {"price": {"nonFinite": 2}},
                "totalColumns": 4,
                "nextColumnOffset": 3,
            })
        );
        let schema = crate::object_schema::<StatsTable>();
        assert!(!schema.to_string().contains(":true"), "{schema}");
    }
}
