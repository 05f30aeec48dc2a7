//! `export_data` through `execute_tool_call` on a real store and workspace: every format
//! read back and compared with the artifact it came from, formula injection, awkward
//! values (unicode, NULLs, dates), wide and empty tables, the refusals the model reads.

use std::io::{Cursor, Read};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{
    Array, ArrayRef, BooleanArray, Date32Array, Float64Array, Int64Array, RecordBatch, StringArray,
};
use calamine::{Data, Reader, Xlsx};
use dataref_store::{Lineage, Table};
use dataref_tool::{Attachment, CallOutcome, ToolCall};
use serde_json::{Value, json};

use super::{Fixture, error_text, fixture_with};

fn fixture() -> Fixture {
    fixture_with(|_| {})
}

async fn call(f: &Fixture, args: Value) -> CallOutcome {
    let o = super::run(f, ToolCall::new("export_data", args)).await;
    let home = f.home.path().to_str().unwrap();
    assert!(!o.text.contains(home), "leaked the host path: {}", o.text);
    o
}

fn ok(o: &CallOutcome) -> Value {
    assert!(!o.is_error(), "{}", o.text);
    o.structured.clone().unwrap()
}

/// The sample's sales since June (a few hundred rows), stored as the model would.
async fn sales(f: &Fixture) -> (String, Table) {
    let o = super::run(
        f,
        ToolCall::new("fetch_sales", json!({"since": "2025-06-01"})),
    )
    .await;
    let data_ref = ok(&o)["dataRef"].as_str().unwrap().to_owned();
    let table = f
        .ctx
        .store
        .open_table(
            &f.ctx.principal,
            &dataref_protocol::DataRef::parse(&data_ref).unwrap(),
        )
        .unwrap();
    (data_ref, table)
}

/// Stores `batches` as a table of the caller's.
fn store(f: &Fixture, batches: &[RecordBatch]) -> String {
    let mut w = f
        .ctx
        .store
        .create_table(
            &f.ctx.principal,
            batches[0].schema(),
            Lineage::new("test", json!({})),
        )
        .unwrap();
    for b in batches {
        w.write(b).unwrap();
    }
    w.finish().unwrap().data_ref.as_str().to_owned()
}

fn read(f: &Fixture, path: &str) -> Vec<u8> {
    let p = f.ctx.workspace.resolve(path).unwrap();
    let mut bytes = Vec::new();
    f.ctx
        .workspace
        .open_read(&p)
        .unwrap()
        .read_to_end(&mut bytes)
        .unwrap();
    bytes
}

/// RFC 4180 records (quoted fields may hold `,`, `"` doubled, CR and LF).
/// The column names of the file a result points at, as written: a CSV's header, a JSON
/// or NDJSON file's first record's keys (the result says only path, rows and bytes).
fn written_columns(f: &Fixture, v: &Value) -> Value {
    let path = v["path"].as_str().unwrap();
    let bytes = read(f, path);
    let text = std::str::from_utf8(&bytes).unwrap();
    if path.ends_with(".csv") {
        return json!(parse_csv(text)[0]);
    }
    let first: Value = if path.ends_with(".ndjson") {
        serde_json::from_str(text.lines().next().unwrap()).unwrap()
    } else {
        serde_json::from_str::<Value>(text).unwrap()[0].clone()
    };
    json!(first.as_object().unwrap().keys().collect::<Vec<_>>())
}

fn parse_csv(text: &str) -> Vec<Vec<String>> {
    let (mut records, mut record, mut field) = (Vec::new(), Vec::new(), String::new());
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
            (false, '"') => quoted = true,
            (false, ',') => record.push(std::mem::take(&mut field)),
            (false, '\r') => {
                assert_eq!(chars.next(), Some('\n'));
                record.push(std::mem::take(&mut field));
                records.push(std::mem::take(&mut record));
            }
            (false, c) => field.push(c),
        }
    }
    assert!(record.is_empty() && field.is_empty());
    records
}

/// The artifact's cells as the store renders them (what CSV must hold, NULL as empty).
fn expected_text(table: &Table) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    for b in &table.batches {
        for r in 0..b.num_rows() {
            rows.push(
                b.columns()
                    .iter()
                    .map(|a| match dataref_store::cell_to_json(a, r, None).0 {
                        Value::Null => String::new(),
                        Value::String(s) => s,
                        v => v.to_string(),
                    })
                    .collect(),
            );
        }
    }
    rows
}

#[tokio::test(flavor = "multi_thread")]
async fn csv_reads_back_as_the_artifact() {
    let f = fixture();
    let (data_ref, table) = sales(&f).await;
    let o = call(
        &f,
        json!({"source": data_ref, "format": "csv", "filename": "june"}),
    )
    .await;
    let v = ok(&o);
    assert_eq!(v["path"], "exports/june.csv");
    assert_eq!(v["rows"], table.meta.rows);
    assert_eq!(v.as_object().unwrap().len(), 3, "path, rows, bytes: {v}");
    assert_eq!(
        written_columns(&f, &v),
        json!([
            "date", "line", "region", "channel", "units", "revenue", "discount"
        ])
    );
    let bytes = read(&f, "exports/june.csv");
    assert_eq!(v["bytes"], bytes.len());
    let records = parse_csv(std::str::from_utf8(&bytes).unwrap());
    assert_eq!(records[0].len(), 7);
    assert_eq!(records[1..], expected_text(&table)[..]);
    // The content is the link alone (no text block repeats the JSON); the model reads
    // the path in it and path, rows and bytes in `structuredContent`.
    assert_eq!(o.text, "");
    assert_eq!(
        o.attachments,
        [Attachment::ResourceLink {
            uri: "dataref://files/exports/june.csv".into(),
            name: "june.csv".into(),
            mime_type: None,
            description: None,
        }]
    );

    // The same name again is never replaced.
    let again = ok(&call(
        &f,
        json!({"source": data_ref, "format": "csv", "filename": "june.csv"}),
    )
    .await);
    assert_eq!(again["path"], "exports/june-2.csv");
}

/// Six exports racing for one name all land, numbered: each picks the first free name
/// while writing, and one whose name was taken meanwhile takes the next at its commit.
#[tokio::test(flavor = "multi_thread")]
async fn same_name_exports_at_once_are_numbered() {
    let f = fixture();
    let (data_ref, _) = sales(&f).await;
    let args = json!({"source": data_ref, "format": "csv", "filename": "race"});
    let c = || call(&f, args.clone());
    let (a, b, d, e, g, h) = tokio::join!(c(), c(), c(), c(), c(), c());
    let mut paths: Vec<String> = [a, b, d, e, g, h]
        .iter()
        .map(|o| ok(o)["path"].as_str().unwrap().to_owned())
        .collect();
    paths.sort();
    assert_eq!(
        paths,
        [
            "exports/race-2.csv",
            "exports/race-3.csv",
            "exports/race-4.csv",
            "exports/race-5.csv",
            "exports/race-6.csv",
            "exports/race.csv",
        ]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn xlsx_reads_back_with_typed_cells() {
    let f = fixture();
    let (data_ref, table) = sales(&f).await;
    let v = ok(&call(
        &f,
        json!({"source": data_ref, "format": "xlsx", "columns": ["date", "line", "units", "discount"],
               "headers": {"line": "Product line"}}),
    )
    .await);
    let path = v["path"].as_str().unwrap();
    assert!(
        path.starts_with("exports/export-") && path.ends_with(".xlsx"),
        "{path}"
    );
    assert_eq!(v["sheets"], 1);
    let mut wb: Xlsx<_> = Xlsx::new(Cursor::new(read(&f, path))).unwrap();
    let range = wb.worksheet_range("Data").unwrap();
    let rows: Vec<&[Data]> = range.rows().collect();
    assert_eq!(
        rows[0],
        ["date", "Product line", "units", "discount"].map(|s| Data::String(s.into()))
    );
    assert_eq!(rows.len() as u64, table.meta.rows + 1);
    let mut i = 1;
    for b in &table.batches {
        let (date, line, units, discount) = (
            b.column(0).as_primitive::<arrow_array::types::Date32Type>(),
            b.column(1).as_string::<i32>(),
            b.column(4).as_primitive::<arrow_array::types::Int64Type>(),
            b.column(6)
                .as_primitive::<arrow_array::types::Float64Type>(),
        );
        for r in 0..b.num_rows() {
            match &rows[i][0] {
                Data::DateTime(d) => assert_eq!(d.as_f64(), f64::from(date.value(r)) + 25_569.0),
                other => panic!("row {i}: a date, not {other:?}"),
            }
            assert_eq!(rows[i][1], Data::String(line.value(r).into()));
            assert_eq!(rows[i][2], Data::Float(units.value(r) as f64));
            if discount.is_null(r) {
                assert_eq!(rows[i][3], Data::Empty);
            } else {
                assert_eq!(rows[i][3], Data::Float(discount.value(r)));
            }
            i += 1;
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn parquet_reads_back_equal() {
    let f = fixture();
    let (data_ref, table) = sales(&f).await;
    let v = ok(&call(
        &f,
        json!({"source": data_ref, "format": "parquet", "filename": "june"}),
    )
    .await);
    let bytes = read(&f, v["path"].as_str().unwrap());
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
        bytes::Bytes::from(bytes),
    )
    .unwrap()
    .with_batch_size(1 << 20)
    .build()
    .unwrap();
    let back: Vec<RecordBatch> = reader.collect::<Result<_, _>>().unwrap();
    // A few hundred rows: one batch each way.
    let (back, orig) = (&back[0], &table.batches[0]);
    assert_eq!(table.batches.len(), 1);
    assert_eq!(back.num_rows() as u64, table.meta.rows);
    assert_eq!(back.schema().fields().len(), 7);
    for i in 0..7 {
        assert_eq!(
            back.column(i).as_ref(),
            orig.column(i).as_ref(),
            "column {i}"
        );
    }
}

/// A table with what goes wrong in spreadsheets and encodings.
fn awkward() -> RecordBatch {
    RecordBatch::try_from_iter([
        (
            "text",
            Arc::new(StringArray::from(vec![
                Some("=HYPERLINK(\"http://evil\",\"click\")"),
                Some("+1+1"),
                Some("-2+3"),
                Some("@SUM(A1:A2)"),
                Some("Zoë · 北京 · 🚀, \"quoted\""),
                None,
            ])) as ArrayRef,
        ),
        (
            "n",
            Arc::new(Int64Array::from(vec![
                Some(-1),
                None,
                Some(0),
                Some(5),
                Some(7),
                Some(8),
            ])) as ArrayRef,
        ),
        (
            "x",
            Arc::new(Float64Array::from(vec![
                Some(0.1),
                Some(-2.5),
                None,
                Some(1e10),
                Some(3.0),
                None,
            ])) as ArrayRef,
        ),
        (
            "day",
            Arc::new(Date32Array::from(vec![
                Some(20_089),
                None,
                Some(0),
                Some(-1),
                Some(19_000),
                None,
            ])) as ArrayRef,
        ),
        (
            "flag",
            Arc::new(BooleanArray::from(vec![
                Some(true),
                Some(false),
                None,
                None,
                Some(true),
                None,
            ])) as ArrayRef,
        ),
    ])
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn formulas_are_neutralised_and_odd_values_survive() {
    let f = fixture();
    let data_ref = store(&f, &[awkward()]);

    let v = ok(&call(
        &f,
        json!({"source": data_ref, "format": "csv", "bom": true}),
    )
    .await);
    let bytes = read(&f, v["path"].as_str().unwrap());
    assert!(bytes.starts_with("\u{feff}".as_bytes()));
    let records = parse_csv(std::str::from_utf8(&bytes[3..]).unwrap());
    assert_eq!(
        records,
        [
            vec!["text", "n", "x", "day", "flag"],
            vec![
                "'=HYPERLINK(\"http://evil\",\"click\")",
                "-1",
                "0.1",
                "2025-01-01",
                "true"
            ],
            vec!["'+1+1", "", "-2.5", "", "false"],
            vec!["'-2+3", "0", "", "1970-01-01", ""],
            vec!["'@SUM(A1:A2)", "5", "10000000000.0", "1969-12-31", ""],
            vec![
                "Zoë · 北京 · 🚀, \"quoted\"",
                "7",
                "3.0",
                "2022-01-08",
                "true"
            ],
            vec!["", "8", "", "", ""],
        ]
    );

    let v = ok(&call(&f, json!({"source": data_ref, "format": "xlsx"})).await);
    let mut wb: Xlsx<_> = Xlsx::new(Cursor::new(read(&f, v["path"].as_str().unwrap()))).unwrap();
    assert!(
        wb.worksheet_formula("Data")
            .unwrap()
            .cells()
            .all(|(_, _, f)| f.is_empty()),
        "no cell may be a formula"
    );
    let range = wb.worksheet_range("Data").unwrap();
    let rows: Vec<&[Data]> = range.rows().collect();
    assert_eq!(
        rows[1][0],
        Data::String("=HYPERLINK(\"http://evil\",\"click\")".into())
    );
    assert_eq!(
        rows[5][0],
        Data::String("Zoë · 北京 · 🚀, \"quoted\"".into())
    );
    assert_eq!(rows[6][0], Data::Empty);
    assert_eq!(rows[2][1], Data::Empty);
    assert_eq!(rows[1][4], Data::Bool(true));

    let v = ok(&call(&f, json!({"source": data_ref, "format": "json", "sort_by": "n", "descending": true, "limit": 2})).await);
    let back: Value = serde_json::from_slice(&read(&f, v["path"].as_str().unwrap())).unwrap();
    assert_eq!(
        back,
        json!([
            {"text": null, "n": 8, "x": null, "day": null, "flag": null},
            {"text": "Zoë · 北京 · 🚀, \"quoted\"", "n": 7, "x": 3.0, "day": "2022-01-08", "flag": true},
        ])
    );

    let v = ok(&call(
        &f,
        json!({"source": data_ref, "format": "ndjson", "columns": ["day"], "offset": 4}),
    )
    .await);
    let text = String::from_utf8(read(&f, v["path"].as_str().unwrap())).unwrap();
    assert_eq!(text, "{\"day\":\"2022-01-08\"}\n{\"day\":null}\n");
    assert_eq!(v["rows"], 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn wide_and_empty_tables() {
    let f = fixture();
    let wide = RecordBatch::try_from_iter((0..300).map(|i| {
        (
            format!("c{i}"),
            Arc::new(Int64Array::from(vec![i, -i])) as ArrayRef,
        )
    }))
    .unwrap();
    let data_ref = store(&f, &[wide]);
    for format in ["csv", "xlsx", "parquet", "json", "ndjson"] {
        let v = ok(&call(&f, json!({"source": data_ref, "format": format})).await);
        assert_eq!(v["rows"], 2, "{format}");
        if matches!(format, "csv" | "json" | "ndjson") {
            assert_eq!(
                written_columns(&f, &v).as_array().unwrap().len(),
                300,
                "{format}"
            );
        }
    }

    let empty = awkward().slice(0, 0);
    let data_ref = store(&f, &[empty]);
    let v = ok(&call(&f, json!({"source": data_ref, "format": "csv"})).await);
    assert_eq!(v["rows"], 0);
    assert_eq!(
        read(&f, v["path"].as_str().unwrap()),
        b"text,n,x,day,flag\r\n"
    );
    let v = ok(&call(&f, json!({"source": data_ref, "format": "xlsx"})).await);
    let mut wb: Xlsx<_> = Xlsx::new(Cursor::new(read(&f, v["path"].as_str().unwrap()))).unwrap();
    assert_eq!(wb.worksheet_range("Data").unwrap().rows().count(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn more_rows_than_a_sheet_holds_make_two_sheets() {
    let f = fixture();
    let rows = 1_048_580_i64;
    let batches: Vec<RecordBatch> = (0..rows)
        .step_by(65_536)
        .map(|s| {
            RecordBatch::try_from_iter([(
                "n",
                Arc::new(Int64Array::from_iter_values(s..(s + 65_536).min(rows))) as ArrayRef,
            )])
            .unwrap()
        })
        .collect();
    let data_ref = store(&f, &batches);
    let v = ok(&call(
        &f,
        json!({"source": data_ref, "format": "xlsx", "filename": "big"}),
    )
    .await);
    assert_eq!(
        (v["rows"].as_i64(), v["sheets"].as_i64()),
        (Some(rows), Some(2))
    );
    let wb: Xlsx<_> = Xlsx::new(Cursor::new(read(&f, "exports/big.xlsx"))).unwrap();
    assert_eq!(wb.sheet_names(), ["Data", "Data 2"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_arrow_file_in_the_workspace_can_be_exported() {
    let f = fixture();
    let batch = awkward();
    let mut buf = Vec::new();
    {
        let mut w = arrow_ipc::writer::FileWriter::try_new(&mut buf, &batch.schema()).unwrap();
        w.write(&batch).unwrap();
        w.finish().unwrap();
    }
    f.ctx
        .workspace
        .write_atomic(
            "in/awkward.arrow",
            &buf,
            dataref_workspace::Overwrite::Refuse,
        )
        .unwrap();
    let v = ok(&call(
        &f,
        json!({"source": "in/awkward.arrow", "format": "ndjson", "columns": ["n"]}),
    )
    .await);
    assert_eq!(v["rows"], 6);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_csv_file_in_the_workspace_can_be_exported_with_inferred_types() {
    let f = fixture();
    let csv = "line,units,revenue,day\nKettle,3,12.5,2025-10-01\n\"Lamp, desk\",,7.25,2025-10-02\n";
    f.ctx
        .workspace
        .write_atomic(
            "reports/q4.csv",
            csv.as_bytes(),
            dataref_workspace::Overwrite::Refuse,
        )
        .unwrap();
    let v = ok(&call(
        &f,
        json!({"source": "reports/q4.csv", "format": "json", "sort_by": "revenue"}),
    )
    .await);
    assert_eq!(v["rows"], 2);
    assert_eq!(
        written_columns(&f, &v),
        json!(["line", "units", "revenue", "day"])
    );
    let written: Value = serde_json::from_slice(&read(&f, v["path"].as_str().unwrap())).unwrap();
    assert_eq!(
        written,
        json!([
            {"line": "Lamp, desk", "units": null, "revenue": 7.25, "day": "2025-10-02"},
            {"line": "Kettle", "units": 3, "revenue": 12.5, "day": "2025-10-01"},
        ])
    );
}

/// Writes `text` at `path` in the caller's workspace.
fn put(f: &Fixture, path: &str, text: &str) {
    f.ctx
        .workspace
        .write_atomic(path, text.as_bytes(), dataref_workspace::Overwrite::Refuse)
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn json_records_in_the_workspace_can_be_exported() {
    let f = fixture();
    // A tool's result as it was saved: the rows in one field, beside other fields.
    put(
        &f,
        "spill/orders.json",
        r#"{"count": 3, "rows": [
            {"id": 1, "customer": "Ada", "paid": true, "total": 12.5},
            {"id": 2, "customer": null, "paid": false, "total": 7},
            {"id": 3, "paid": true, "total": 1e3, "note": "=1+1"}
        ], "next": null}"#,
    );
    let v = ok(&call(
        &f,
        json!({"source": "spill/orders.json", "format": "csv", "filename": "orders"}),
    )
    .await);
    assert_eq!(v["rows"], 3, "{v}");
    assert_eq!(
        written_columns(&f, &v),
        json!(["id", "customer", "paid", "total", "note"])
    );
    let text = String::from_utf8(read(&f, "exports/orders.csv")).unwrap();
    assert_eq!(
        parse_csv(&text),
        [
            vec!["id", "customer", "paid", "total", "note"],
            vec!["1", "Ada", "true", "12.5", ""],
            vec!["2", "", "false", "7.0", ""],
            // Formula injection is neutralised here as for any other source.
            vec!["3", "", "true", "1000.0", "'=1+1"],
        ]
    );

    // A bare array is the table itself; typed cells survive into XLSX.
    put(
        &f,
        "spill/bare.JSON",
        r#"[{"n": 1, "x": 0.5}, {"n": 2, "x": null}]"#,
    );
    let v = ok(&call(
        &f,
        json!({"source": "spill/bare.JSON", "format": "xlsx", "filename": "bare"}),
    )
    .await);
    assert_eq!(v["rows"], 2, "{v}");
    let mut wb: Xlsx<_> = Xlsx::new(Cursor::new(read(&f, "exports/bare.xlsx"))).unwrap();
    let sheet = wb.worksheet_range("Data").unwrap();
    assert_eq!(sheet.get_value((1, 0)), Some(&Data::Float(1.0)));
    assert_eq!(sheet.get_value((1, 1)), Some(&Data::Float(0.5)));
}

#[tokio::test(flavor = "multi_thread")]
async fn ndjson_records_in_the_workspace_can_be_exported() {
    let f = fixture();
    // Blank lines and CRLF are tolerated; a key missing on a line is null; a column of
    // mixed kinds is text.
    let lines = "{\"day\": \"2025-10-01\", \"units\": 3, \"code\": \"A1\"}\r\n\
                 \n\
                 {\"day\": \"2025-10-02\", \"code\": 7}\n\
                 {\"units\": 5, \"day\": \"2025-10-03\", \"code\": true}\n";
    for path in ["logs/days.ndjson", "logs/days.jsonl"] {
        put(&f, path, lines);
        let v = ok(&call(
            &f,
            json!({"source": path, "format": "json", "sort_by": "units", "descending": true}),
        )
        .await);
        assert_eq!(v["rows"], 3, "{v}");
        assert_eq!(written_columns(&f, &v), json!(["day", "units", "code"]));
        let written: Value =
            serde_json::from_slice(&read(&f, v["path"].as_str().unwrap())).unwrap();
        assert_eq!(
            written,
            json!([
                {"day": "2025-10-03", "units": 5, "code": "true"},
                {"day": "2025-10-01", "units": 3, "code": "A1"},
                {"day": "2025-10-02", "units": null, "code": "7"},
            ]),
            "{path}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn what_the_model_reads_when_an_export_is_wrong() {
    let f = fixture();
    let (data_ref, _) = sales(&f).await;
    put(
        &f,
        "bad/nested.json",
        r#"{"rows": [{"id": 1, "tags": ["a", "b"]}]}"#,
    );
    put(
        &f,
        "bad/two.json",
        r#"{"orders": [{"id": 1}], "customers": [{"id": 2}]}"#,
    );
    put(&f, "bad/scalar.json", "42");
    put(&f, "bad/broken.json", r#"[{"id": 1}, {"id": 2"#);
    put(&f, "bad/lines.ndjson", "{\"id\": 1}\n[1, 2]\n");
    put(&f, "bad/broken.jsonl", "{\"id\": 1}\n{\"id\": 2\n");
    put(&f, "bad/empty.ndjson", "\n\n");
    let cases = [
        (
            "unknown_column",
            json!({"source": data_ref, "format": "csv", "columns": ["date", "Revenu"]}),
        ),
        (
            "unknown_sort_column",
            json!({"source": data_ref, "format": "csv", "sort_by": "regoin"}),
        ),
        (
            "unknown_header",
            json!({"source": data_ref, "format": "csv", "columns": ["date"], "headers": {"units": "Units"}}),
        ),
        (
            "bad_filename",
            json!({"source": data_ref, "format": "csv", "filename": "../etc/passwd"}),
        ),
        (
            "malformed_ref",
            json!({"source": "data_123", "format": "csv"}),
        ),
        (
            "unknown_ref",
            json!({"source": "data_AAAAAAAAAAAAAAAAAAAAAA", "format": "csv"}),
        ),
        (
            "unsupported_file_source",
            json!({"source": "reports/q3.xml", "format": "xlsx"}),
        ),
        (
            "missing_json_file",
            json!({"source": "reports/q3.json", "format": "xlsx"}),
        ),
        (
            "json_nested_not_a_table",
            json!({"source": "bad/nested.json", "format": "csv"}),
        ),
        (
            "json_two_arrays_not_a_table",
            json!({"source": "bad/two.json", "format": "csv"}),
        ),
        (
            "json_scalar_not_a_table",
            json!({"source": "bad/scalar.json", "format": "csv"}),
        ),
        (
            "json_broken",
            json!({"source": "bad/broken.json", "format": "csv"}),
        ),
        (
            "ndjson_not_objects",
            json!({"source": "bad/lines.ndjson", "format": "csv"}),
        ),
        (
            "ndjson_empty",
            json!({"source": "bad/empty.ndjson", "format": "csv"}),
        ),
        (
            "ndjson_broken_line",
            json!({"source": "bad/broken.jsonl", "format": "csv"}),
        ),
        (
            "missing_csv_file",
            json!({"source": "reports/q3.csv", "format": "xlsx"}),
        ),
        (
            "missing_arrow_file",
            json!({"source": "nope.arrow", "format": "csv"}),
        ),
        (
            "unknown_format",
            json!({"source": data_ref, "format": "xls"}),
        ),
    ];
    let mut all = String::new();
    for (name, args) in cases {
        let o = call(&f, args).await;
        all.push_str(&format!("## {name}\n{}\n\n", error_text(&o)));
    }
    insta::assert_snapshot!("export_refusals", all);
}

/// A valid Arrow IPC file of `batch`, then its footer's first record-batch block given a
/// negative body length: the Arrow reader panics on it if it is read unchecked.
pub(crate) fn negative_block_arrow(batch: &RecordBatch) -> Vec<u8> {
    let mut bytes = Vec::new();
    {
        let mut w = arrow_ipc::writer::FileWriter::try_new(&mut bytes, &batch.schema()).unwrap();
        w.write(batch).unwrap();
        w.finish().unwrap();
    }
    let n = bytes.len();
    let footer_len = i32::from_le_bytes(bytes[n - 10..n - 6].try_into().unwrap()) as usize;
    let footer = &bytes[n - 10 - footer_len..n - 10];
    let block = *arrow_ipc::root_as_footer(footer)
        .unwrap()
        .recordBatches()
        .unwrap()
        .get(0);
    // The Block struct as it sits in the footer: offset, metadata length, padding, body.
    let mut needle = block.offset().to_le_bytes().to_vec();
    needle.extend_from_slice(&block.metaDataLength().to_le_bytes());
    needle.extend_from_slice(&[0; 4]);
    needle.extend_from_slice(&block.bodyLength().to_le_bytes());
    let at = bytes
        .windows(needle.len())
        .rposition(|w| w == needle.as_slice())
        .unwrap();
    bytes[at + 16..at + 24].copy_from_slice(&(-1i64).to_le_bytes());
    bytes
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hostile_arrow_file_in_the_workspace_is_the_models_to_fix() {
    let f = fixture();
    let bytes = negative_block_arrow(&awkward());
    f.ctx
        .workspace
        .write_atomic(
            "in/evil.arrow",
            &bytes,
            dataref_workspace::Overwrite::Refuse,
        )
        .unwrap();
    let o = call(&f, json!({"source": "in/evil.arrow", "format": "csv"})).await;
    let text = error_text(&o);
    assert!(
        text.contains("your file `in/evil.arrow` is malformed")
            && text.contains("negative body length (-1)")
            && text.contains("hint:"),
        "{text}"
    );
    // Nothing was lost and the next call works.
    let (data_ref, _) = sales(&f).await;
    ok(&call(&f, json!({"source": data_ref, "format": "csv"})).await);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_export_over_the_workspace_quota_is_refused_and_names_what_to_delete() {
    let f = fixture_with(|limits| limits.workspace_quota_bytes = 1 << 20);
    put(&f, "old/notes.txt", &"x".repeat(1020 << 10));
    let (data_ref, _) = sales(&f).await;
    // Every format, those whose encoders wrap the I/O error (XLSX, Parquet) included.
    for format in ["json", "ndjson", "csv", "xlsx", "parquet"] {
        let text = error_text(&call(&f, json!({"source": data_ref, "format": format})).await);
        assert!(
            text.contains("would take your workspace over its quota of 1.0 MiB")
                && text.contains("`old/` (1020 KiB)"),
            "{format}: {text}"
        );
    }
    // The refused export left nothing behind.
    assert!(f.ctx.workspace.resolve("exports").map_or(true, |p| {
        f.ctx.workspace.list_dir(&p, 10).unwrap().entries.is_empty()
    }));
}
