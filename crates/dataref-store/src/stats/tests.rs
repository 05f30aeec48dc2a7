//! `describe` and `describe_data` on in-memory tables.

use std::path::PathBuf;
use std::sync::Arc;

use arrow_array::{
    ArrayRef, BinaryArray, BooleanArray, Date32Array, Float64Array, Int64Array, NullArray,
    RecordBatch, StringArray, TimestampMicrosecondArray, TimestampMillisecondArray,
    TimestampNanosecondArray, TimestampSecondArray, UInt64Array,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use dataref_protocol::{
    ColumnStats, DataRef, NumericStats, Principal, Timestamp, TopValue, days_from_civil,
};
use serde_json::{Value, json};

use super::{SampleOptions, describe, describe_data};
use crate::{ArtifactMeta, Lineage, StoreError, Table};

/// A table from batches of columns (`name`, array); meta computed from them.
fn table(batches: Vec<Vec<(&str, ArrayRef)>>) -> Table {
    let fields: Vec<Field> = batches[0]
        .iter()
        .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
        .collect();
    let schema: SchemaRef = Arc::new(Schema::new(fields));
    table_with_schema(schema, batches)
}

fn table_with_schema(schema: SchemaRef, batches: Vec<Vec<(&str, ArrayRef)>>) -> Table {
    let batches: Vec<RecordBatch> = batches
        .into_iter()
        .map(|cols| {
            RecordBatch::try_new(schema.clone(), cols.into_iter().map(|(_, a)| a).collect())
                .unwrap()
        })
        .collect();
    table_from_batches(schema, batches)
}

/// A table of `batches`; meta (rows, nulls) computed from them.
pub(super) fn table_from_batches(schema: SchemaRef, batches: Vec<RecordBatch>) -> Table {
    let null_counts = (0..schema.fields().len())
        .map(|i| {
            batches
                .iter()
                .map(|b| b.column(i).logical_null_count() as u64)
                .sum()
        })
        .collect();
    Table {
        meta: ArtifactMeta {
            data_ref: DataRef::from_random_bytes([7; 16]),
            owner: Principal::new("alice").unwrap(),
            rows: batches.iter().map(|b| b.num_rows() as u64).sum(),
            bytes: 0,
            schema,
            null_counts,
            created_at: Timestamp(1_700_000_000),
            expires_at: Timestamp(1_700_086_400),
            lineage: Lineage::new("test", json!({})),
            checksum: None,
            quick_check: None,
        },
        batches,
        path: PathBuf::from("unused.arrow"),
    }
}

fn ints(v: &[Option<i64>]) -> ArrayRef {
    Arc::new(Int64Array::from(v.to_vec()))
}

fn floats(v: &[Option<f64>]) -> ArrayRef {
    Arc::new(Float64Array::from(v.to_vec()))
}

fn strs(v: &[Option<&str>]) -> ArrayRef {
    Arc::new(StringArray::from(v.to_vec()))
}

fn days(y: i64, m: u32, d: u32) -> i32 {
    days_from_civil(y, m, d) as i32
}

fn size(v: &dataref_protocol::Description) -> usize {
    serde_json::to_vec(v).unwrap().len()
}

fn col<'a>(stats: &'a dataref_protocol::DataStats, name: &str) -> &'a ColumnStats {
    stats.columns.iter().find(|c| c.name == name).unwrap()
}

fn sales() -> Table {
    table(vec![
        vec![
            (
                "date",
                Arc::new(Date32Array::from(vec![days(2024, 1, 2), days(2024, 1, 3)])) as ArrayRef,
            ),
            ("region", strs(&[Some("north"), None])),
            ("revenue", floats(&[Some(12.5), Some(7.0)])),
        ],
        vec![
            (
                "date",
                Arc::new(Date32Array::from(vec![days(2024, 1, 4)])) as ArrayRef,
            ),
            ("region", strs(&[Some("south")])),
            ("revenue", floats(&[None])),
        ],
    ])
}

/// The sample options the budget tests were written for: five rows.
fn five() -> SampleOptions {
    SampleOptions {
        rows: 5,
        max_value_chars: 80,
    }
}

/// Sample rows are arrays in `columns` order (the names are said once, in `columns`), and
/// no expiry is repeated to the model: the store enforces it, and an expired ref's error
/// says to fetch again.
#[test]
fn describe_small_table_exactly() {
    let t = sales();
    let d = describe(&t, five());
    assert_eq!(
        serde_json::to_value(&d).unwrap(),
        json!({
            "dataRef": t.meta.data_ref.as_str(),
            "rows": 3,
            "columns": {"date": "date", "region": "string", "revenue": "float"},
            "nulls": {"region": 1, "revenue": 1},
            "sample": [
                ["2024-01-02", "north", 12.5],
                ["2024-01-03", null, 7.0],
                ["2024-01-04", "south", null],
            ],
        })
    );
    // The default is two rows.
    assert_eq!(describe(&t, SampleOptions::default()).sample.len(), 2);
}

#[test]
fn sample_crosses_batch_boundaries_and_stops_at_rows() {
    let t = table(vec![
        vec![("n", ints(&[Some(1), Some(2)]))],
        vec![("n", ints(&[Some(3)]))],
        vec![("n", ints(&[Some(4), Some(5)]))],
    ]);
    let d = describe(
        &t,
        SampleOptions {
            rows: 4,
            max_value_chars: 80,
        },
    );
    let got: Vec<Value> = d.sample.iter().map(|r| r[0].clone()).collect();
    assert_eq!(got, vec![json!(1), json!(2), json!(3), json!(4)]);
    assert_eq!(d.sample_note, None);
}

#[test]
fn cut_values_are_said() {
    let long = "x".repeat(100);
    let t = table(vec![vec![("s", strs(&[Some(&long), Some("short")]))]]);
    let d = describe(&t, SampleOptions::default());
    assert_eq!(d.sample[0][0], json!(format!("{}…", "x".repeat(80))));
    assert_eq!(d.sample[1][0], json!("short"));
    assert_eq!(
        d.sample_note.as_deref(),
        Some("values longer than 80 characters are cut and end in …")
    );
}

#[test]
fn sample_withheld() {
    let t = sales();
    let d = describe(
        &t,
        SampleOptions {
            rows: 0,
            max_value_chars: 80,
        },
    );
    assert!(d.sample.is_empty());
    let note = d.sample_note.unwrap();
    assert!(note.contains("withholds"), "{note}");
    assert_eq!(d.rows, 3);
    assert_eq!(d.nulls.len(), 2);
}

#[test]
fn ten_columns_of_huge_strings_stay_under_budget() {
    let huge = "é".repeat(10_000);
    let cols: Vec<(String, ArrayRef)> = (0..10)
        .map(|i| {
            let v: Vec<Option<&str>> = vec![Some(huge.as_str()); 5];
            (format!("column_{i}"), strs(&v))
        })
        .collect();
    let t = table(vec![
        cols.iter().map(|(n, a)| (n.as_str(), a.clone())).collect(),
    ]);
    let d = describe(&t, five());
    let bytes = size(&d);
    assert!(bytes < 1_500, "{bytes}");
    assert!(!d.sample.is_empty(), "a shortened row still fits");
    let note = d.sample_note.unwrap();
    assert!(
        note.contains("values longer than 16 characters are cut"),
        "{note}"
    );
    assert!(note.contains("sample rows are shown"), "{note}");
    assert!(note.contains("1500 bytes"), "{note}");
    assert_eq!(d.sample[0][0], json!(format!("{}…", "é".repeat(16))));
}

#[test]
fn shorter_cut_alone_when_it_is_enough() {
    let long = "y".repeat(300);
    let v: Vec<Option<&str>> = vec![Some(long.as_str()); 5];
    let t = table(vec![vec![
        ("a", strs(&v)),
        ("b", strs(&v)),
        ("c", strs(&v)),
        ("d", strs(&v)),
    ]]);
    let d = describe(&t, five());
    assert!(size(&d) < 1_500);
    assert_eq!(d.sample.len(), 5);
    let note = d.sample_note.unwrap();
    assert!(
        note.starts_with("values longer than 40 characters are cut and end in … to keep"),
        "{note}"
    );
}

#[test]
fn wide_numbers_drop_rows_and_wide_tables_get_more_room() {
    let wide = [Some(-1.234_567_890_123_456_7e-300); 5];
    let ten: Vec<(String, ArrayRef)> = (0..10)
        .map(|i| (format!("measurement_{i}"), floats(&wide)))
        .collect();
    let t = table(vec![
        ten.iter().map(|(n, a)| (n.as_str(), a.clone())).collect(),
    ]);
    let d = describe(&t, five());
    assert!(size(&d) < 1_500, "{}", size(&d));
    assert!(d.sample.len() < 5);
    assert!(d.sample_note.unwrap().contains("sample rows are shown"));

    let forty: Vec<(String, ArrayRef)> = (0..40)
        .map(|i| (format!("c{i}"), ints(&[Some(i64::MIN); 5])))
        .collect();
    let t = table(vec![
        forty.iter().map(|(n, a)| (n.as_str(), a.clone())).collect(),
    ]);
    let d = describe(&t, five());
    assert!(size(&d) < 40 * 150, "{}", size(&d));
    assert!(!d.sample.is_empty());
}

#[test]
fn empty_table() {
    let schema: SchemaRef = Arc::new(Schema::new(vec![
        Field::new("n", DataType::Int64, true),
        Field::new("s", DataType::Utf8, true),
    ]));
    let t = table_with_schema(schema, vec![]);
    let d = describe(&t, SampleOptions::default());
    assert_eq!(d.rows, 0);
    assert!(d.sample.is_empty() && d.sample_note.is_none() && d.nulls.is_empty());

    let s = describe_data(&t, None, 0, 20).unwrap();
    assert_eq!(s.rows, 0);
    assert_eq!(s.columns.len(), 2);
    for c in &s.columns {
        assert_eq!((c.count, c.nulls, c.distinct), (0, 0, 0));
        assert!(c.min.is_none() && c.max.is_none() && c.numeric.is_none() && c.top.is_empty());
    }
}

#[test]
fn numeric_stats_match_pandas() {
    let t = table(vec![
        vec![
            ("n", ints(&[Some(1), None, Some(2)])),
            ("x", floats(&[Some(1.0), Some(f64::NAN), Some(2.0)])),
        ],
        vec![
            ("n", ints(&[Some(10), Some(3), Some(4)])),
            ("x", floats(&[Some(10.0), Some(f64::INFINITY), Some(3.0)])),
        ],
        vec![("n", ints(&[])), ("x", floats(&[]))],
        vec![("n", ints(&[None])), ("x", floats(&[Some(4.0)]))],
    ]);
    let s = describe_data(&t, None, 0, 20).unwrap();
    let n = col(&s, "n");
    assert_eq!((n.count, n.nulls, n.distinct, n.non_finite), (5, 2, 5, 0));
    assert_eq!(
        (n.min.clone(), n.max.clone()),
        (Some(json!(1)), Some(json!(10)))
    );
    let num = n.numeric.clone().unwrap();
    assert_eq!(num.mean, 4.0);
    // 3.5355339059327378 as pandas gives it, rounded for the model to 6 significant digits.
    assert_eq!(num.std, 3.53553);
    assert_eq!((num.p25, num.p50, num.p75), (2.0, 3.0, 4.0));

    // NaN and inf are counted apart and left out of the rest.
    let x = col(&s, "x");
    assert_eq!((x.count, x.nulls, x.non_finite, x.distinct), (5, 0, 2, 5));
    assert_eq!(x.numeric.clone().unwrap(), num);
    assert_eq!(
        (x.min.clone(), x.max.clone()),
        (Some(json!(1.0)), Some(json!(10.0)))
    );
    let text = serde_json::to_string(&s).unwrap();
    assert!(text.contains("\"nonFinite\":2"), "{text}");
    assert!(!text.contains("NaN") && !text.contains("inf"), "{text}");
}

#[test]
fn unsigned_extremes_are_exact() {
    let t = table(vec![vec![(
        "u",
        Arc::new(UInt64Array::from(vec![u64::MAX, 0, 7])) as ArrayRef,
    )]]);
    let s = describe_data(&t, None, 0, 20).unwrap();
    let u = col(&s, "u");
    assert_eq!(u.min, Some(json!(0)));
    assert_eq!(u.max, Some(json!(u64::MAX)));
    assert_eq!(u.distinct, 3);
}

#[test]
fn dates_and_timestamps() {
    let micros = |y, m, d, secs: i64| days_from_civil(y, m, d) * 86_400_000_000 + secs * 1_000_000;
    let ts_us = vec![
        Some(micros(2024, 3, 1, 3600)),
        None,
        Some(micros(1969, 12, 31, 86_399) + 500_000),
        Some(micros(2030, 1, 1, 0)),
    ];
    let t = table(vec![vec![
        (
            "d",
            Arc::new(Date32Array::from(vec![
                Some(days(2024, 2, 29)),
                Some(days(1999, 12, 31)),
                None,
                Some(days(2024, 2, 29)),
            ])) as ArrayRef,
        ),
        (
            "us",
            Arc::new(TimestampMicrosecondArray::from(ts_us.clone()).with_timezone("UTC")),
        ),
        (
            "ms",
            Arc::new(TimestampMillisecondArray::from(
                ts_us
                    .iter()
                    .map(|v| v.map(|v| v.div_euclid(1000)))
                    .collect::<Vec<_>>(),
            )),
        ),
        (
            "s",
            Arc::new(TimestampSecondArray::from(
                ts_us
                    .iter()
                    .map(|v| v.map(|v| v.div_euclid(1_000_000)))
                    .collect::<Vec<_>>(),
            )),
        ),
        (
            "ns",
            Arc::new(TimestampNanosecondArray::from(
                ts_us
                    .iter()
                    .map(|v| v.map(|v| v * 1000))
                    .collect::<Vec<_>>(),
            )),
        ),
    ]]);
    let s = describe_data(&t, None, 0, 20).unwrap();
    let d = col(&s, "d");
    assert_eq!((d.count, d.nulls, d.distinct), (3, 1, 2));
    assert_eq!(d.min, Some(json!("1999-12-31")));
    assert_eq!(d.max, Some(json!("2024-02-29")));
    assert!(d.numeric.is_none() && d.top.is_empty());

    let us = col(&s, "us");
    assert_eq!(us.data_type, "timestamp(UTC)");
    assert_eq!(us.min, Some(json!("1969-12-31T23:59:59.500000")));
    assert_eq!(us.max, Some(json!("2030-01-01T00:00:00")));
    assert_eq!(col(&s, "ns").min, us.min);
    assert_eq!(col(&s, "ms").min, us.min);
    assert_eq!(col(&s, "s").min, Some(json!("1969-12-31T23:59:59")));
    assert_eq!(col(&s, "s").max, Some(json!("2030-01-01T00:00:00")));
}

#[test]
fn top_values_strings_and_booleans() {
    let long = "z".repeat(200);
    let t = table(vec![
        vec![
            (
                "s",
                strs(&[Some("b"), Some("a"), Some("c"), None, Some("a")]),
            ),
            (
                "flag",
                Arc::new(BooleanArray::from(vec![
                    Some(true),
                    Some(false),
                    None,
                    Some(true),
                    Some(true),
                ])) as ArrayRef,
            ),
            (
                "id",
                strs(&[Some("1"), Some("2"), Some("3"), Some("4"), Some(&long)]),
            ),
        ],
        vec![
            (
                "s",
                strs(&[Some("b"), Some("a"), Some("d"), Some("e"), Some("f")]),
            ),
            (
                "flag",
                Arc::new(BooleanArray::from(vec![
                    None,
                    None,
                    None,
                    None,
                    Some(false),
                ])),
            ),
            (
                "id",
                strs(&[Some("5"), Some("6"), Some("7"), Some("8"), Some("9")]),
            ),
        ],
    ]);
    let s = describe_data(&t, None, 0, 20).unwrap();
    let strings = col(&s, "s");
    assert_eq!((strings.count, strings.nulls, strings.distinct), (9, 1, 6));
    assert_eq!(strings.min, Some(json!("a")));
    assert_eq!(strings.max, Some(json!("f")));
    let top = |v: &[(Value, u64)]| -> Vec<TopValue> {
        v.iter()
            .map(|(value, count)| TopValue {
                value: value.clone(),
                count: *count,
            })
            .collect()
    };
    assert_eq!(
        strings.top,
        top(&[
            (json!("a"), 3),
            (json!("b"), 2),
            (json!("c"), 1),
            (json!("d"), 1),
            (json!("e"), 1),
        ])
    );
    assert!(!strings.top_is_estimate && strings.numeric.is_none());

    let flag = col(&s, "flag");
    assert_eq!((flag.count, flag.nulls, flag.distinct), (5, 5, 2));
    assert_eq!(flag.top, top(&[(json!(true), 3), (json!(false), 2)]));

    // All values distinct: no top list; long values cut in min/max.
    let id = col(&s, "id");
    assert!(id.top.is_empty());
    assert_eq!(id.distinct, 10);
    assert_eq!(id.max, Some(json!(format!("{}…", "z".repeat(80)))));
}

#[test]
fn all_null_and_other_types() {
    let t = table(vec![vec![
        ("nothing", Arc::new(NullArray::new(3)) as ArrayRef),
        ("empty", ints(&[None, None, None])),
        ("words", strs(&[None, None, None])),
        (
            "blob",
            Arc::new(BinaryArray::from(vec![
                Some(b"ab".as_slice()),
                None,
                Some(b"ab".as_slice()),
            ])),
        ),
        (
            "list",
            Arc::new(arrow_array::ListArray::new_null(
                Arc::new(Field::new("item", DataType::Int32, true)),
                3,
            )),
        ),
    ]]);
    let s = describe_data(&t, None, 0, 20).unwrap();
    for name in ["nothing", "empty", "words"] {
        let c = col(&s, name);
        assert_eq!((c.count, c.nulls, c.distinct), (0, 3, 0), "{name}");
        assert!(c.min.is_none() && c.numeric.is_none() && c.top.is_empty() && c.note.is_none());
    }
    let blob = col(&s, "blob");
    assert_eq!((blob.count, blob.nulls, blob.distinct), (2, 1, 1));
    assert!(blob.min.is_none() && blob.top.is_empty());
    let list = col(&s, "list");
    assert_eq!((list.count, list.nulls), (0, 3));
    assert!(
        list.note
            .as_deref()
            .unwrap()
            .contains("only `count` and `nulls`")
    );
}

#[test]
fn paging_through_columns() {
    let cols: Vec<(String, ArrayRef)> = (0..5)
        .map(|i| (format!("c{i}"), ints(&[Some(i)])))
        .collect();
    let t = table(vec![
        cols.iter().map(|(n, a)| (n.as_str(), a.clone())).collect(),
    ]);
    let names = |s: &dataref_protocol::DataStats| -> Vec<String> {
        s.columns.iter().map(|c| c.name.clone()).collect()
    };

    let p1 = describe_data(&t, None, 0, 2).unwrap();
    assert_eq!(names(&p1), ["c0", "c1"]);
    assert_eq!((p1.total_columns, p1.next_column_offset), (5, Some(2)));
    let p2 = describe_data(&t, None, 2, 2).unwrap();
    assert_eq!(names(&p2), ["c2", "c3"]);
    assert_eq!(p2.next_column_offset, Some(4));
    let p3 = describe_data(&t, None, 4, 2).unwrap();
    assert_eq!(names(&p3), ["c4"]);
    assert_eq!(p3.next_column_offset, None);
    let past = describe_data(&t, None, 9, 2).unwrap();
    assert!(past.columns.is_empty() && past.next_column_offset.is_none());
    // A page of 0 still moves forward.
    assert_eq!(
        describe_data(&t, None, 0, 0).unwrap().next_column_offset,
        Some(1)
    );

    let chosen = [
        "c3".to_owned(),
        "c0".to_owned(),
        "c3".to_owned(),
        "c1".to_owned(),
    ];
    let s = describe_data(&t, Some(&chosen), 0, 2).unwrap();
    assert_eq!(names(&s), ["c3", "c0"]);
    assert_eq!(s.next_column_offset, Some(2));
    let s = describe_data(&t, Some(&chosen), 2, 2).unwrap();
    assert_eq!(names(&s), ["c1"]);
    assert_eq!(s.next_column_offset, None);
    assert_eq!(col(&s, "c1").min, Some(json!(1)));
}

#[test]
fn unknown_column_suggests_the_closest() {
    let t = sales();
    let err =
        describe_data(&t, Some(&["date".to_owned(), "revenu".to_owned()]), 0, 20).unwrap_err();
    assert!(matches!(&err, StoreError::UnknownColumn { column, .. } if column == "revenu"));
    let hint = err.hint().unwrap();
    assert!(hint.contains("did you mean `revenue`?"), "{hint}");
}

#[test]
fn distinct_is_exact_up_to_the_limit_and_estimated_above() {
    let exact: Vec<Option<i64>> = (0..65_536_i64).chain(0..1000).map(Some).collect();
    let t = table(vec![vec![("n", ints(&exact))]]);
    let n = describe_data(&t, None, 0, 20).unwrap().columns.remove(0);
    assert_eq!((n.distinct, n.distinct_is_estimate), (65_536, false));

    let million = 1_000_000_i64;
    let half: Vec<Option<i64>> = (0..million / 2).map(|i| Some(i * 3 - 7)).collect();
    let rest: Vec<Option<i64>> = (million / 2..million).map(|i| Some(i * 3 - 7)).collect();
    let words: Vec<String> = (0..million).map(|i| format!("customer-{i}")).collect();
    let w1: Vec<Option<&str>> = words[..500_000].iter().map(|s| Some(s.as_str())).collect();
    let w2: Vec<Option<&str>> = words[500_000..].iter().map(|s| Some(s.as_str())).collect();
    let t = table(vec![
        vec![("n", ints(&half)), ("w", strs(&w1))],
        vec![("n", ints(&rest)), ("w", strs(&w2))],
    ]);
    let s = describe_data(&t, None, 0, 20).unwrap();
    for c in &s.columns {
        assert!(c.distinct_is_estimate, "{}", c.name);
        let err = (c.distinct as f64 - million as f64).abs() / million as f64;
        assert!(err < 0.02, "{}: {}", c.name, c.distinct);
        assert_eq!(c.count, million as u64);
    }
    let n = col(&s, "n");
    assert_eq!(n.min, Some(json!(-7)));
    assert_eq!(n.max, Some(json!(2_999_990)));
    let NumericStats { mean, p50, .. } = n.numeric.clone().unwrap();
    assert!((mean - 1_499_991.5).abs() < 1e-6 && (p50 - 1_499_991.5).abs() < 1e-6);
    let w = col(&s, "w");
    assert_eq!(w.min, Some(json!("customer-0")));
    assert_eq!(w.max, Some(json!("customer-999999")));
    assert!(w.top.is_empty(), "every value occurs once");
}

/// Batches of uneven length with a column of every kind the statistics treat apart, nulls
/// throughout, and string, number and timestamp columns past the exact-count limit.
fn varied(rows: usize) -> Table {
    use arrow_array::{Decimal128Array, LargeStringArray};
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut batches = Vec::new();
    let mut done = 0;
    while done < rows {
        let n = (1 + next() as usize % 40_000).min(rows - done);
        let mut c: Vec<Vec<u64>> = (0..12).map(|_| Vec::with_capacity(n)).collect();
        for _ in 0..n {
            for v in &mut c {
                v.push(next());
            }
        }
        let null = |v: u64, percent: u64| v % 100 < percent;
        let days: Vec<Option<i32>> = c[0]
            .iter()
            .map(|&v| (!null(v, 3)).then_some(19_000 + (v >> 8) as i32 % 900))
            .collect();
        let regions = ["north", "south", "east", "west", "Nordics and Baltics"];
        let region: Vec<Option<&str>> = c[1]
            .iter()
            .map(|&v| (!null(v, 5)).then_some(regions[(v >> 8) as usize % regions.len()]))
            .collect();
        let ids: Vec<Option<String>> = c[2]
            .iter()
            .map(|&v| (!null(v, 1)).then(|| format!("order-{:x}", v >> 44)))
            .collect();
        let notes: Vec<Option<String>> = c[3]
            .iter()
            .map(|&v| (!null(v, 20)).then(|| format!("a longer note, number {} of many", v % 300)))
            .collect();
        let units: Vec<Option<i64>> = c[4]
            .iter()
            .map(|&v| (!null(v, 2)).then_some((v >> 8) as i64 % 41 - 10))
            .collect();
        let price: Vec<Option<f64>> = c[5]
            .iter()
            .map(|&v| match v % 1000 {
                0..=39 => None,
                40 => Some(f64::NAN),
                41 => Some(f64::INFINITY),
                42 => Some(-0.0),
                _ => Some(((v >> 11) % 2_000_000) as f64 / 100.0 - 5_000.0),
            })
            .collect();
        let discount: Vec<Option<f64>> = c[6]
            .iter()
            .map(|&v| (!null(v, 7)).then_some(((v >> 8) % 7) as f64 * 0.05))
            .collect();
        let amount: Vec<Option<i128>> = c[7]
            .iter()
            .map(|&v| (!null(v, 4)).then_some(((v >> 20) % 10_000_000) as i128 - 2_000_000))
            .collect();
        let at: Vec<Option<i64>> = c[8]
            .iter()
            .map(|&v| (!null(v, 10)).then_some(1_700_000_000_000_000 + (v >> 24) as i64))
            .collect();
        let flag: Vec<Option<bool>> = c[9]
            .iter()
            .map(|&v| (!null(v, 10)).then_some(v & 256 != 0))
            .collect();
        let blob: Vec<Option<Vec<u8>>> = c[10]
            .iter()
            .map(|&v| (!null(v, 10)).then(|| v.to_le_bytes()[..(v % 9) as usize].to_vec()))
            .collect();
        let big: Vec<Option<u64>> = c[11]
            .iter()
            .map(|&v| (!null(v, 10)).then_some(u64::MAX - v % 1000))
            .collect();
        let id_refs: Vec<Option<&str>> = ids.iter().map(|v| v.as_deref()).collect();
        let note_refs: Vec<Option<&str>> = notes.iter().map(|v| v.as_deref()).collect();
        let blob_refs: Vec<Option<&[u8]>> = blob.iter().map(|v| v.as_deref()).collect();
        batches.push(vec![
            ("day", Arc::new(Date32Array::from(days)) as ArrayRef),
            ("region", strs(&region)),
            ("id", strs(&id_refs)),
            (
                "note",
                Arc::new(LargeStringArray::from(note_refs)) as ArrayRef,
            ),
            ("units", ints(&units)),
            ("price", floats(&price)),
            ("discount", floats(&discount)),
            (
                "amount",
                Arc::new(
                    Decimal128Array::from(amount)
                        .with_precision_and_scale(12, 2)
                        .unwrap(),
                ) as ArrayRef,
            ),
            (
                "at",
                Arc::new(TimestampMicrosecondArray::from(at)) as ArrayRef,
            ),
            ("flag", Arc::new(BooleanArray::from(flag)) as ArrayRef),
            ("blob", Arc::new(BinaryArray::from(blob_refs)) as ArrayRef),
            ("big", Arc::new(UInt64Array::from(big)) as ArrayRef),
        ]);
        done += n;
    }
    table(batches)
}

/// Columns are computed whole, each by one thread: the answer is the same on one thread
/// as on several, in the order asked, whichever thread finished first.
#[test]
fn parallel_statistics_equal_sequential_ones() {
    let t = varied(150_000);
    assert!(t.batches.len() > 3);
    let all: Vec<usize> = (0..t.meta.schema.fields().len()).collect();
    let one = super::compute_on(&t, &all, 1).unwrap();
    // Every path is taken: estimates for the many-valued columns, exact counts for the rest.
    let estimated: Vec<&str> = one
        .iter()
        .filter(|c| c.distinct_is_estimate)
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(estimated, ["id", "price", "amount", "at", "blob"]);
    assert!(col_named(&one, "price").non_finite > 0);
    assert!(one.iter().all(|c| c.name == "flag" || c.nulls > 0));
    for threads in [2, 3, 5, 16] {
        assert_eq!(
            super::compute_on(&t, &all, threads).unwrap(),
            one,
            "{threads} threads"
        );
    }
    // Any order asked, any subset: each column as computed alone.
    let asked = [11, 3, 0, 7, 5, 1];
    let got = super::compute_on(&t, &asked, 2).unwrap();
    for (stats, &i) in got.iter().zip(&asked) {
        assert_eq!(stats, &one[i]);
    }
    assert_eq!(describe_data(&t, None, 0, 100).unwrap().columns, one);
}

fn col_named<'a>(columns: &'a [ColumnStats], name: &str) -> &'a ColumnStats {
    columns.iter().find(|c| c.name == name).unwrap()
}
