//! JSON records as an Arrow table: the flat rows inside a JSON document (a tool's result, a
//! spilled file) found and typed column by column, so they can be stored and exported like
//! any other table.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{ArrayRef, BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use serde_json::Value;

/// More columns than this is not a table a person reads (nor one worth building).
const MAX_COLUMNS: usize = 1_000;

/// The flat records inside a JSON value: the value itself when it is an array of objects,
/// or, for an object, its one field holding such an array (e.g. `{"rows": [...], "count": 3}`
/// → the `rows` array; two such fields → None). Empty arrays are not records.
pub fn find_records(value: &Value) -> Option<&[Value]> {
    match value {
        Value::Array(_) => as_records(value),
        Value::Object(fields) => {
            let mut found = fields.values().filter_map(as_records);
            let records = found.next()?;
            // Two candidates: which one is "the" table is a guess, and a guess is not made.
            found.next().is_none().then_some(records)
        }
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => None,
    }
}

/// `value` as records: a non-empty array whose items are all objects.
fn as_records(value: &Value) -> Option<&[Value]> {
    match value {
        Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_object) => {
            Some(items)
        }
        _ => None,
    }
}

/// One RecordBatch from flat records: columns in first-seen key order over all records,
/// every column nullable; a key missing in a record is null. Types: all non-null values
/// booleans → Boolean; all integers fitting i64 → Int64; all numbers → Float64; all strings
/// → Utf8; anything mixed → Utf8 (non-strings as their JSON text). None (not a table) when
/// any record is not an object, any value is an object or array, there are no columns, or
/// more than 1,000 columns.
pub fn records_to_batch(records: &[Value]) -> Option<RecordBatch> {
    let mut names: Vec<&str> = Vec::new();
    let mut index: HashMap<&str, usize> = HashMap::new();
    let mut seen: Vec<Seen> = Vec::new();
    for record in records {
        let Value::Object(fields) = record else {
            return None;
        };
        for (key, value) in fields {
            let column = match index.get(key.as_str()) {
                Some(&column) => column,
                None => {
                    if names.len() == MAX_COLUMNS {
                        return None;
                    }
                    index.insert(key, names.len());
                    names.push(key);
                    seen.push(Seen::default());
                    names.len() - 1
                }
            };
            seen.get_mut(column)?.note(value)?;
        }
    }
    if names.is_empty() {
        return None;
    }
    let mut fields = Vec::with_capacity(names.len());
    let mut columns = Vec::with_capacity(names.len());
    for (name, seen) in names.iter().zip(&seen) {
        let (data_type, column) = build_column(records, name, seen.kind());
        fields.push(Field::new(*name, data_type, true));
        columns.push(column);
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).ok()
}

/// The kinds of non-null value one column holds so far.
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    bools: bool,
    ints: bool,
    /// Numbers that are not integers fitting `i64` (fractions, exponents, huge `u64`s).
    floats: bool,
    strings: bool,
}

impl Seen {
    /// Counts `value` in; None when it is nested (an object or an array).
    fn note(&mut self, value: &Value) -> Option<()> {
        match value {
            Value::Null => {}
            Value::Bool(_) => self.bools = true,
            Value::Number(n) if n.is_i64() => self.ints = true,
            Value::Number(_) => self.floats = true,
            Value::String(_) => self.strings = true,
            Value::Array(_) | Value::Object(_) => return None,
        }
        Some(())
    }

    fn kind(self) -> Kind {
        match (self.bools, self.ints, self.floats, self.strings) {
            (true, false, false, false) => Kind::Boolean,
            (false, true, false, false) => Kind::Int64,
            (false, _, true, false) => Kind::Float64,
            // Strings only, nothing but nulls, or a mix.
            (false, false, false, _) => Kind::Utf8,
            _ => Kind::Mixed,
        }
    }
}

/// What one column becomes.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Boolean,
    Int64,
    Float64,
    Utf8,
    /// Text: strings as they are, anything else as its JSON text.
    Mixed,
}

fn build_column(records: &[Value], name: &str, kind: Kind) -> (DataType, ArrayRef) {
    let cells = || records.iter().map(|record| record.get(name));
    match kind {
        Kind::Boolean => (
            DataType::Boolean,
            Arc::new(BooleanArray::from_iter(
                cells().map(|v| v.and_then(Value::as_bool)),
            )),
        ),
        Kind::Int64 => (
            DataType::Int64,
            Arc::new(Int64Array::from_iter(
                cells().map(|v| v.and_then(Value::as_i64)),
            )),
        ),
        Kind::Float64 => (
            DataType::Float64,
            Arc::new(Float64Array::from_iter(
                cells().map(|v| v.and_then(Value::as_f64)),
            )),
        ),
        Kind::Utf8 => (
            DataType::Utf8,
            Arc::new(StringArray::from_iter(
                cells().map(|v| v.and_then(Value::as_str)),
            )),
        ),
        Kind::Mixed => (
            DataType::Utf8,
            Arc::new(StringArray::from_iter(cells().map(|v| match v {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) => Some(Cow::Borrowed(s.as_str())),
                Some(other) => Some(Cow::Owned(other.to_string())),
            }))),
        ),
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::Array;
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Float64Type, Int64Type};
    use serde_json::json;

    use super::*;

    fn batch(value: Value) -> Option<RecordBatch> {
        records_to_batch(value.as_array().unwrap())
    }

    fn types(b: &RecordBatch) -> Vec<(String, DataType)> {
        b.schema()
            .fields()
            .iter()
            .map(|f| (f.name().clone(), f.data_type().clone()))
            .collect()
    }

    #[test]
    fn each_column_gets_the_type_of_its_values() {
        let b = batch(json!([
            {"ok": true, "n": 1, "x": 1, "big": 1, "s": "a"},
            {"ok": false, "n": -2, "x": 2.5, "big": 18_446_744_073_709_551_615_u64, "s": "b"},
        ]))
        .unwrap();
        assert_eq!(
            types(&b),
            [
                ("ok".to_owned(), DataType::Boolean),
                ("n".to_owned(), DataType::Int64),
                ("x".to_owned(), DataType::Float64),
                ("big".to_owned(), DataType::Float64),
                ("s".to_owned(), DataType::Utf8),
            ]
        );
        assert!(b.schema().fields().iter().all(|f| f.is_nullable()));
        assert_eq!(b.num_rows(), 2);
        let ok = b.column(0).as_boolean();
        assert_eq!((ok.value(0), ok.value(1)), (true, false));
        let n = b.column(1).as_primitive::<Int64Type>();
        assert_eq!(n.values().to_vec(), [1, -2]);
        let x = b.column(2).as_primitive::<Float64Type>();
        assert_eq!(x.values().to_vec(), [1.0, 2.5]);
        let big = b.column(3).as_primitive::<Float64Type>();
        assert_eq!(big.value(1), 18_446_744_073_709_551_615_u64 as f64);
        let s = b.column(4).as_string::<i32>();
        assert_eq!((s.value(0), s.value(1)), ("a", "b"));
    }

    #[test]
    fn nulls_and_missing_keys_are_null() {
        let b = batch(json!([
            {"a": 1, "b": null},
            {"b": "x"},
            {"a": null},
        ]))
        .unwrap();
        assert_eq!(
            types(&b),
            [
                ("a".to_owned(), DataType::Int64),
                ("b".to_owned(), DataType::Utf8)
            ]
        );
        let a = b.column(0).as_primitive::<Int64Type>();
        assert_eq!(
            (0..3).map(|i| a.is_valid(i)).collect::<Vec<_>>(),
            [true, false, false]
        );
        assert_eq!(a.value(0), 1);
        let s = b.column(1).as_string::<i32>();
        assert_eq!(
            (0..3).map(|i| s.is_valid(i)).collect::<Vec<_>>(),
            [false, true, false]
        );
        assert_eq!(s.value(1), "x");
    }

    #[test]
    fn a_column_of_nulls_only_is_text() {
        let b = batch(json!([{"a": null}, {"a": null}])).unwrap();
        assert_eq!(types(&b), [("a".to_owned(), DataType::Utf8)]);
        assert_eq!(b.column(0).null_count(), 2);
    }

    #[test]
    fn mixed_values_become_text_with_json_for_non_strings() {
        let b = batch(json!([
            {"m": "a", "bn": true},
            {"m": 1, "bn": 2},
            {"m": 2.5, "bn": null},
            {"m": false},
            {"m": null},
        ]))
        .unwrap();
        assert_eq!(
            types(&b),
            [
                ("m".to_owned(), DataType::Utf8),
                ("bn".to_owned(), DataType::Utf8)
            ]
        );
        let m = b.column(0).as_string::<i32>();
        assert_eq!(
            (0..4).map(|i| m.value(i)).collect::<Vec<_>>(),
            ["a", "1", "2.5", "false"]
        );
        assert!(m.is_null(4));
        let bn = b.column(1).as_string::<i32>();
        assert_eq!((bn.value(0), bn.value(1)), ("true", "2"));
        assert!(bn.is_null(2) && bn.is_null(3));
    }

    #[test]
    fn nested_values_and_non_objects_are_not_a_table() {
        assert!(batch(json!([{"a": 1}, {"a": {"b": 2}}])).is_none());
        assert!(batch(json!([{"a": [1, 2]}])).is_none());
        assert!(batch(json!([{"a": []}])).is_none());
        assert!(batch(json!([{"a": 1}, 2])).is_none());
        assert!(batch(json!([{"a": 1}, null])).is_none());
    }

    #[test]
    fn columns_keep_first_seen_order() {
        let b = batch(json!([
            {"zeta": 1, "alpha": 2},
            {"mid": 3, "alpha": 4, "zeta": 5},
            {"last": 6},
        ]))
        .unwrap();
        let names: Vec<String> = types(&b).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["zeta", "alpha", "mid", "last"]);
    }

    #[test]
    fn no_rows_or_no_columns_is_not_a_table() {
        assert!(records_to_batch(&[]).is_none());
        assert!(batch(json!([{}, {}])).is_none());
    }

    #[test]
    fn more_than_a_thousand_columns_is_not_a_table() {
        let wide = |n: usize| {
            let record: serde_json::Map<String, Value> =
                (0..n).map(|i| (format!("c{i}"), json!(i))).collect();
            vec![Value::Object(record)]
        };
        assert_eq!(records_to_batch(&wide(1_000)).unwrap().num_columns(), 1_000);
        assert!(records_to_batch(&wide(1_001)).is_none());
    }

    #[test]
    fn records_are_found_in_an_array_or_in_the_one_field_holding_them() {
        let direct = json!([{"a": 1}, {"a": 2}]);
        assert_eq!(find_records(&direct).unwrap().len(), 2);

        let wrapped = json!({"rows": [{"a": 1}, {"a": 2}, {"a": 3}], "count": 3, "tags": ["x"]});
        let rows = find_records(&wrapped).unwrap();
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[2], json!({"a": 3}));

        let two = json!({"rows": [{"a": 1}], "more": [{"b": 2}]});
        assert!(find_records(&two).is_none());

        for not_records in [
            json!([]),
            json!({"rows": []}),
            json!([1, 2]),
            json!([{"a": 1}, 2]),
            json!({"count": 3}),
            json!("text"),
            json!(null),
            // Only one level down: a table nested deeper is not guessed at.
            json!({"data": {"rows": [{"a": 1}]}}),
        ] {
            assert!(find_records(&not_records).is_none(), "{not_records}");
        }
    }
}
