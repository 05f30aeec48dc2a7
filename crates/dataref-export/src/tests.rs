//! Every format written and read back (CSV by a strict RFC 4180 reading, XLSX with
//! calamine, Parquet with the parquet crate, JSON with serde_json) and compared with the
//! table it came from.

use std::collections::BTreeMap;
use std::io::Cursor;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int8Type;
use arrow_array::{
    Array, ArrayRef, BooleanArray, Date32Array, DictionaryArray, Float64Array, Int32Array,
    Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use calamine::{Data, DataType as _, Reader, Xlsx};
use serde_json::{Value, json};

use super::*;

fn table() -> (SchemaRef, Vec<RecordBatch>) {
    let b1 = RecordBatch::try_from_iter([
        (
            "name",
            Arc::new(StringArray::from(vec![
                Some("Zoë, \"the\" 北京"),
                Some("=HYPERLINK(\"http://x\")"),
                None,
            ])) as ArrayRef,
        ),
        (
            "units",
            Arc::new(Int64Array::from(vec![Some(3), None, Some(-7)])) as ArrayRef,
        ),
        (
            "revenue",
            Arc::new(Float64Array::from(vec![Some(1814.9), Some(0.5), None])) as ArrayRef,
        ),
        (
            "day",
            // 2025-01-01, NULL, 1999-12-31
            Arc::new(Date32Array::from(vec![Some(20_089), None, Some(10_956)])) as ArrayRef,
        ),
        (
            "at",
            Arc::new(TimestampMicrosecondArray::from(vec![
                Some(1_735_734_896_000_000), // 2025-01-01T12:34:56
                Some(0),
                None,
            ])) as ArrayRef,
        ),
        (
            "ok",
            Arc::new(BooleanArray::from(vec![Some(true), Some(false), None])) as ArrayRef,
        ),
    ])
    .unwrap();
    let b2 = RecordBatch::try_new(
        b1.schema(),
        vec![
            Arc::new(StringArray::from(vec![Some("+1"), Some("line\nbreak")])),
            Arc::new(Int64Array::from(vec![Some(1), Some(9_007_199_254_740_993)])),
            Arc::new(Float64Array::from(vec![Some(-2.25), Some(f64::NAN)])),
            Arc::new(Date32Array::from(vec![Some(0), Some(20_088)])),
            Arc::new(TimestampMicrosecondArray::from(vec![None, Some(1_500_000)])),
            Arc::new(BooleanArray::from(vec![None, Some(true)])),
        ],
    )
    .unwrap();
    (b1.schema(), vec![b1, b2])
}

fn run(format: Format, options: &ExportOptions) -> (Exported, Vec<u8>) {
    let (schema, batches) = table();
    run_on(format, &schema, &batches, options)
}

fn run_on(
    format: Format,
    schema: &SchemaRef,
    batches: &[RecordBatch],
    options: &ExportOptions,
) -> (Exported, Vec<u8>) {
    let mut out = Cursor::new(Vec::new());
    let done = export(format, schema, batches, options, &mut out, &|| false).unwrap();
    (done, out.into_inner())
}

/// A strict RFC 4180 reader: fields separated by `,`, records by CRLF, `"` quoting.
fn parse_csv(text: &str) -> Vec<Vec<String>> {
    let mut records = Vec::new();
    let mut record = Vec::new();
    let mut field = String::new();
    let mut chars = text.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => field.push(c),
            (false, '"') => {
                assert!(
                    field.is_empty(),
                    "a quote inside an unquoted field: {field}"
                );
                quoted = true;
            }
            (false, ',') => record.push(std::mem::take(&mut field)),
            (false, '\r') => {
                assert_eq!(chars.next(), Some('\n'), "CR without LF");
                record.push(std::mem::take(&mut field));
                records.push(std::mem::take(&mut record));
            }
            (false, c) => {
                assert_ne!(c, '\n', "a bare LF ends no record");
                field.push(c);
            }
        }
    }
    assert!(
        record.is_empty() && field.is_empty(),
        "the last record has no CRLF"
    );
    records
}

#[test]
fn csv_is_rfc_4180_with_formulas_neutralised() {
    let (done, bytes) = run(Format::Csv, &ExportOptions::default());
    assert_eq!(done.rows, 5);
    let text = String::from_utf8(bytes).unwrap();
    let records = parse_csv(&text);
    assert_eq!(records[0], ["name", "units", "revenue", "day", "at", "ok"]);
    assert_eq!(
        records[1],
        [
            "Zoë, \"the\" 北京",
            "3",
            "1814.9",
            "2025-01-01",
            "2025-01-01T12:34:56",
            "true"
        ]
    );
    assert_eq!(
        records[2],
        [
            "'=HYPERLINK(\"http://x\")",
            "",
            "0.5",
            "",
            "1970-01-01T00:00:00",
            "false"
        ]
    );
    // A negative number is a number, not a formula.
    assert_eq!(records[3], ["", "-7", "", "1999-12-31", "", ""]);
    assert_eq!(records[4][0], "'+1");
    assert_eq!(
        records[5],
        [
            "line\nbreak",
            "9007199254740993",
            "NaN",
            "2024-12-31",
            "1970-01-01T00:00:01.500000",
            "true"
        ]
    );
    assert_eq!(records.len(), 6);
}

#[test]
fn csv_can_keep_formulas_and_start_with_a_bom() {
    let options = ExportOptions {
        bom: Bom::With,
        formulas: Formulas::Keep,
        columns: Some(vec!["name".into()]),
        ..ExportOptions::default()
    };
    let (_, bytes) = run(Format::Csv, &options);
    assert!(bytes.starts_with("\u{feff}".as_bytes()));
    let text = String::from_utf8(bytes[3..].to_vec()).unwrap();
    let records = parse_csv(&text);
    assert_eq!(records[2], ["=HYPERLINK(\"http://x\")"]);
    assert_eq!(records[4], ["+1"]);
}

#[test]
fn every_formula_trigger_is_neutralised() {
    let cells = [
        "=1+1", "+1", "-1", "@SUM(A1)", "\tx", "\r=1", "ok", "", "a=b",
    ];
    let batch = RecordBatch::try_from_iter([(
        "c",
        Arc::new(StringArray::from(cells.to_vec())) as ArrayRef,
    )])
    .unwrap();
    let (_, bytes) = run_on(
        Format::Csv,
        &batch.schema(),
        &[batch],
        &ExportOptions::default(),
    );
    let records = parse_csv(&String::from_utf8(bytes).unwrap());
    let got: Vec<&str> = records[1..].iter().map(|r| r[0].as_str()).collect();
    assert_eq!(
        got,
        [
            "'=1+1",
            "'+1",
            "'-1",
            "'@SUM(A1)",
            "'\tx",
            "'\r=1",
            "ok",
            "",
            "a=b"
        ]
    );
}

#[test]
fn columns_headers_sort_offset_and_limit() {
    let options = ExportOptions {
        columns: Some(vec!["units".into(), "name".into()]),
        headers: BTreeMap::from([("units".to_owned(), "Units sold".to_owned())]),
        sort: Some(SortBy {
            column: "units".into(),
            order: Order::Descending,
        }),
        offset: 1,
        limit: Some(3),
        ..ExportOptions::default()
    };
    let (done, bytes) = run(Format::Csv, &options);
    assert_eq!(done.columns, ["Units sold", "name"]);
    assert_eq!(done.rows, 3);
    let records = parse_csv(&String::from_utf8(bytes).unwrap());
    // Descending: 9007199254740993, 3, 1, -7, NULL (last); offset 1, limit 3.
    let units: Vec<&str> = records[1..].iter().map(|r| r[0].as_str()).collect();
    assert_eq!(units, ["3", "1", "-7"]);
}

/// A view's rows, chosen and ordered elsewhere, across batches; a row past the end is an
/// error, never a silently shorter file.
#[test]
fn given_rows_go_out_in_their_order() {
    let options = ExportOptions {
        columns: Some(vec!["units".into()]),
        rows: Some(vec![4, 0, 2]),
        // `rows` takes the place of a sort.
        sort: Some(SortBy::new("units", false)),
        offset: 1,
        ..ExportOptions::default()
    };
    let (done, bytes) = run(Format::Csv, &options);
    assert_eq!(done.rows, 2);
    assert_eq!(String::from_utf8(bytes).unwrap(), "units\r\n3\r\n-7\r\n");
    let (done, _) = run(
        Format::Parquet,
        &ExportOptions {
            rows: Some(Vec::new()),
            ..ExportOptions::default()
        },
    );
    assert_eq!(done.rows, 0);
    let (schema, batches) = table();
    let e = export(
        Format::Csv,
        &schema,
        &batches,
        &ExportOptions {
            rows: Some(vec![1, 5]),
            ..ExportOptions::default()
        },
        Cursor::new(Vec::new()),
        &|| false,
    )
    .unwrap_err();
    assert_eq!(e.to_string(), "row 5 is past the table's end (5 rows)");
    assert!(!e.is_caller_error());
}

#[test]
fn sorting_is_stable_with_nulls_last() {
    let batch = RecordBatch::try_from_iter([
        (
            "k",
            Arc::new(Int32Array::from(vec![
                Some(2),
                None,
                Some(1),
                Some(2),
                Some(1),
            ])) as ArrayRef,
        ),
        (
            "i",
            Arc::new(Int32Array::from(vec![0, 1, 2, 3, 4])) as ArrayRef,
        ),
    ])
    .unwrap();
    for (order, want) in [
        (Order::Ascending, ["2", "4", "0", "3", "1"]),
        (Order::Descending, ["0", "3", "2", "4", "1"]),
    ] {
        let options = ExportOptions {
            sort: Some(SortBy {
                column: "k".into(),
                order,
            }),
            ..ExportOptions::default()
        };
        let (_, bytes) = run_on(
            Format::Csv,
            &batch.schema(),
            std::slice::from_ref(&batch),
            &options,
        );
        let records = parse_csv(&String::from_utf8(bytes).unwrap());
        let got: Vec<&str> = records[1..].iter().map(|r| r[1].as_str()).collect();
        assert_eq!(got, want, "{order:?}");
    }
}

/// The first rows by a column, as `render_table` shows them: exact for integers a float
/// cannot tell apart, NaN after every number, NULLs last either way, ties in stored order,
/// across batches; the same rows as the whole order's first.
#[test]
fn the_first_rows_by_a_column_are_the_whole_orders_first() {
    let big = 1i64 << 53;
    let batches: Vec<RecordBatch> = [
        (
            vec![Some(big + 1), None, Some(i64::MAX)],
            vec![1.5, f64::NAN, -0.0],
        ),
        (
            vec![Some(big), Some(i64::MIN), Some(big + 1)],
            vec![0.0, 2.0, f64::NAN],
        ),
        (vec![], vec![]),
        (vec![None, Some(7)], vec![1.5, -1.0]),
    ]
    .into_iter()
    .map(|(k, f)| {
        RecordBatch::try_from_iter([
            ("k", Arc::new(Int64Array::from(k)) as ArrayRef),
            ("f", Arc::new(Float64Array::from(f)) as ArrayRef),
        ])
        .unwrap()
    })
    .collect();
    let by = |column: &str, order| SortBy {
        column: column.into(),
        order,
    };
    for (column, c, order, want) in [
        ("k", 0, Order::Ascending, vec![4, 7, 3, 0, 5, 2, 1, 6]),
        ("k", 0, Order::Descending, vec![2, 0, 5, 3, 7, 4, 1, 6]),
        ("f", 1, Order::Ascending, vec![7, 2, 3, 0, 6, 4, 1, 5]),
        ("f", 1, Order::Descending, vec![1, 5, 4, 0, 6, 3, 2, 7]),
    ] {
        let sort = by(column, order);
        let all = sort_order(&batches, c, &sort, None).unwrap();
        assert_eq!(all, want, "{column} {order:?}");
        for limit in 0..=9 {
            let first = sort_order(&batches, c, &sort, Some(limit)).unwrap();
            assert_eq!(
                first,
                all[..limit.min(all.len())],
                "{column} {order:?} {limit}"
            );
        }
    }
}

#[test]
fn unknown_names_are_errors_with_hints() {
    let (schema, batches) = table();
    let bad = |options: ExportOptions| {
        export(
            Format::Csv,
            &schema,
            &batches,
            &options,
            Cursor::new(Vec::new()),
            &|| false,
        )
        .unwrap_err()
    };
    let e = bad(ExportOptions {
        columns: Some(vec!["revenu".into()]),
        ..ExportOptions::default()
    });
    assert_eq!(e.to_string(), "no column `revenu`");
    assert_eq!(
        e.hint().unwrap(),
        "did you mean `revenue`? available: `name`, `units`, `revenue`, `day`, `at`, `ok`"
    );
    assert!(e.is_caller_error());
    let e = bad(ExportOptions {
        sort: Some(SortBy {
            column: "Day".into(),
            order: Order::Ascending,
        }),
        ..ExportOptions::default()
    });
    assert!(
        e.hint().unwrap().starts_with("did you mean `day`?"),
        "{e:?}"
    );
    let e = bad(ExportOptions {
        columns: Some(vec!["units".into()]),
        headers: BTreeMap::from([("name".to_owned(), "Name".to_owned())]),
        ..ExportOptions::default()
    });
    assert_eq!(
        e.to_string(),
        "`headers` names `name`, which is not an exported column"
    );
    let e = bad(ExportOptions {
        headers: BTreeMap::from([("name".to_owned(), "units".to_owned())]),
        ..ExportOptions::default()
    });
    assert_eq!(
        e.to_string(),
        "two output columns would both be named `units`"
    );
}

#[test]
fn json_and_ndjson_read_back() {
    let (done, bytes) = run(Format::Json, &ExportOptions::default());
    assert_eq!(done.rows, 5);
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        v[0],
        json!({"name": "Zoë, \"the\" 北京", "units": 3, "revenue": 1814.9, "day": "2025-01-01",
               "at": "2025-01-01T12:34:56", "ok": true})
    );
    assert_eq!(v[2]["name"], Value::Null);
    assert_eq!(v[4]["units"], json!(9_007_199_254_740_993_i64));
    assert_eq!(v[4]["revenue"], "NaN");
    assert_eq!(v.as_array().unwrap().len(), 5);

    let (_, bytes) = run(Format::Ndjson, &ExportOptions::default());
    let text = String::from_utf8(bytes).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines, *v.as_array().unwrap());
}

#[test]
fn parquet_reads_back_equal() {
    let (schema, batches) = table();
    let (done, bytes) = run(Format::Parquet, &ExportOptions::default());
    assert_eq!(done.rows, 5);
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
        bytes::Bytes::from(bytes),
    )
    .unwrap();
    let meta = reader.metadata().clone();
    let back: Vec<RecordBatch> = reader.build().unwrap().collect::<Result<_, _>>().unwrap();
    let back = arrow_select::concat::concat_batches(&back[0].schema(), &back).unwrap();
    let orig = arrow_select::concat::concat_batches(&schema, &batches).unwrap();
    assert_eq!(back.num_rows(), 5);
    for (i, field) in schema.fields().iter().enumerate() {
        assert_eq!(back.schema().field(i).name(), field.name());
        assert_eq!(back.column(i).data_type(), field.data_type());
        // NaN != NaN, so compare the float column by its bits.
        if field.name() == "revenue" {
            let a = back
                .column(i)
                .as_primitive::<arrow_array::types::Float64Type>();
            let b = orig
                .column(i)
                .as_primitive::<arrow_array::types::Float64Type>();
            for r in 0..5 {
                assert_eq!(a.is_null(r), b.is_null(r));
                if !a.is_null(r) {
                    assert_eq!(a.value(r).to_bits(), b.value(r).to_bits());
                }
            }
        } else {
            assert_eq!(back.column(i), orig.column(i), "{}", field.name());
        }
    }
    let column = meta.row_group(0).column(0);
    assert_eq!(column.compression(), parquet::basic::Compression::SNAPPY);
}

fn read_xlsx(bytes: Vec<u8>) -> Vec<(String, calamine::Range<Data>)> {
    let mut wb: Xlsx<_> = Xlsx::new(Cursor::new(bytes)).unwrap();
    let names = wb.sheet_names();
    names
        .into_iter()
        .map(|n| {
            let range = wb.worksheet_range(&n).unwrap();
            (n, range)
        })
        .collect()
}

#[test]
fn xlsx_has_typed_cells_and_a_header() {
    let (done, bytes) = run(Format::Xlsx, &ExportOptions::default());
    assert_eq!((done.rows, done.sheets), (5, 1));
    let sheets = read_xlsx(bytes);
    assert_eq!(sheets.len(), 1);
    let (name, range) = &sheets[0];
    assert_eq!(name, "Data");
    let rows: Vec<&[Data]> = range.rows().collect();
    assert_eq!(
        rows[0],
        ["name", "units", "revenue", "day", "at", "ok"].map(|s| Data::String(s.into()))
    );
    assert_eq!(rows[1][0], Data::String("Zoë, \"the\" 北京".into()));
    assert_eq!(rows[1][1], Data::Float(3.0));
    assert_eq!(rows[1][2], Data::Float(1814.9));
    match &rows[1][3] {
        Data::DateTime(d) => {
            assert!(d.is_datetime());
            assert_eq!(d.as_f64(), 45_658.0); // 2025-01-01
        }
        other => panic!("a date cell, not {other:?}"),
    }
    match &rows[1][4] {
        Data::DateTime(d) => assert!((d.as_f64() - (45_658.0 + 45_296.0 / 86_400.0)).abs() < 1e-9),
        other => panic!("a timestamp cell, not {other:?}"),
    }
    assert_eq!(rows[1][5], Data::Bool(true));
    // Text that looks like a formula stays text: no formula in the file.
    assert_eq!(rows[2][0], Data::String("=HYPERLINK(\"http://x\")".into()));
    assert_eq!(rows[2][1], Data::Empty);
    assert_eq!(rows[3][1], Data::Float(-7.0));
    // Past 2^53 an integer is kept exactly, as text.
    assert_eq!(rows[5][1], Data::String("9007199254740993".into()));
    assert_eq!(rows[5][2], Data::String("NaN".into()));
    assert_eq!(rows.len(), 6);
}

#[test]
fn xlsx_never_contains_a_formula() {
    let (_, bytes) = run(Format::Xlsx, &ExportOptions::default());
    let mut wb: Xlsx<_> = Xlsx::new(Cursor::new(bytes)).unwrap();
    let formulas = wb.worksheet_formula("Data").unwrap();
    assert!(formulas.cells().all(|(_, _, f)| f.is_empty()));
}

#[test]
fn empty_and_wide_tables() {
    let schema: SchemaRef = Arc::new(Schema::new(vec![
        Field::new("a", DataType::Int64, true),
        Field::new("b", DataType::Utf8, true),
    ]));
    for format in [
        Format::Csv,
        Format::Json,
        Format::Ndjson,
        Format::Parquet,
        Format::Xlsx,
    ] {
        let (done, bytes) = run_on(format, &schema, &[], &ExportOptions::default());
        assert_eq!(done.rows, 0, "{format:?}");
        match format {
            Format::Csv => assert_eq!(bytes, b"a,b\r\n"),
            Format::Json => assert_eq!(bytes, b"[]\n"),
            Format::Ndjson => assert!(bytes.is_empty()),
            Format::Xlsx => {
                let sheets = read_xlsx(bytes);
                let rows: Vec<&[Data]> = sheets[0].1.rows().collect();
                assert_eq!(rows, [[Data::String("a".into()), Data::String("b".into())]]);
            }
            Format::Parquet => {
                let reader =
                    parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
                        bytes::Bytes::from(bytes),
                    )
                    .unwrap();
                assert_eq!(reader.schema().fields().len(), 2);
            }
        }
    }

    let wide: Vec<(String, ArrayRef)> = (0..500)
        .map(|i| {
            (
                format!("c{i}"),
                Arc::new(Int64Array::from(vec![i, i * 2])) as ArrayRef,
            )
        })
        .collect();
    let batch = RecordBatch::try_from_iter(wide).unwrap();
    let (done, bytes) = run_on(
        Format::Xlsx,
        &batch.schema(),
        std::slice::from_ref(&batch),
        &ExportOptions::default(),
    );
    assert_eq!(done.columns.len(), 500);
    let sheets = read_xlsx(bytes);
    let rows: Vec<&[Data]> = sheets[0].1.rows().collect();
    assert_eq!(rows[2][499], Data::Float(998.0));
    let (_, bytes) = run_on(
        Format::Csv,
        &batch.schema(),
        &[batch],
        &ExportOptions::default(),
    );
    let records = parse_csv(&String::from_utf8(bytes).unwrap());
    assert_eq!(records[0].len(), 500);
    assert_eq!(records[2][499], "998");
}

#[test]
fn dictionary_columns_are_written_as_their_values() {
    let dict: DictionaryArray<Int8Type> = vec![Some("b"), None, Some("a"), Some("b")]
        .into_iter()
        .collect();
    let batch = RecordBatch::try_from_iter([("cat", Arc::new(dict) as ArrayRef)]).unwrap();
    let options = ExportOptions {
        sort: Some(SortBy {
            column: "cat".into(),
            order: Order::Ascending,
        }),
        ..ExportOptions::default()
    };
    let (_, bytes) = run_on(
        Format::Csv,
        &batch.schema(),
        std::slice::from_ref(&batch),
        &options,
    );
    assert_eq!(
        String::from_utf8(bytes).unwrap(),
        "cat\r\na\r\nb\r\nb\r\n\r\n"
    );
    let (_, bytes) = run_on(
        Format::Parquet,
        &batch.schema(),
        &[batch],
        &ExportOptions::default(),
    );
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
        bytes::Bytes::from(bytes),
    )
    .unwrap();
    assert_eq!(reader.schema().field(0).data_type(), &DataType::Utf8);
}

#[test]
fn an_interrupted_export_stops() {
    let (schema, batches) = table();
    let e = export(
        Format::Csv,
        &schema,
        &batches,
        &ExportOptions::default(),
        Cursor::new(Vec::new()),
        &|| true,
    )
    .unwrap_err();
    assert!(matches!(e, ExportError::Cancelled));
}

#[test]
fn more_rows_than_a_sheet_holds_continue_on_the_next() {
    let rows = MAX_DATA_ROWS_PER_SHEET as i64 + 3;
    let batches: Vec<RecordBatch> = (0..rows)
        .step_by(65_536)
        .map(|start| {
            let end = (start + 65_536).min(rows);
            RecordBatch::try_from_iter([(
                "n",
                Arc::new(Int64Array::from_iter_values(start..end)) as ArrayRef,
            )])
            .unwrap()
        })
        .collect();
    let (done, bytes) = run_on(
        Format::Xlsx,
        &batches[0].schema(),
        &batches,
        &ExportOptions::default(),
    );
    assert_eq!((done.rows, done.sheets), (rows as u64, 2));
    let sheets = read_xlsx(bytes);
    let names: Vec<&str> = sheets.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["Data", "Data 2"]);
    let first: Vec<&[Data]> = sheets[0].1.rows().collect();
    assert_eq!(first.len(), 1_048_576);
    assert_eq!(
        first[1_048_575][0],
        Data::Float((MAX_DATA_ROWS_PER_SHEET - 1) as f64)
    );
    let second: Vec<&[Data]> = sheets[1].1.rows().collect();
    assert_eq!(second[0][0], Data::String("n".into()));
    let rest: Vec<f64> = second[1..].iter().map(|r| r[0].as_f64().unwrap()).collect();
    let want: Vec<f64> = (MAX_DATA_ROWS_PER_SHEET as i64..rows)
        .map(|n| n as f64)
        .collect();
    assert_eq!(rest, want);
}
