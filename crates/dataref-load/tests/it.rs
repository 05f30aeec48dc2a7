//! The readers on real files: CSV in the encodings and conventions people send, XLSX and
//! Parquet written by the exporter, Arrow IPC written by arrow-rs, JSON and NDJSON; and the
//! bad input each must refuse with a clear error (ragged rows, a binary file named `.csv`,
//! a zip bomb, damaged Parquet, nesting past the limit), never a panic.
#![expect(clippy::unwrap_used, reason = "tests fail by panicking")]

use std::collections::BTreeMap;
use std::io::{Seek, SeekFrom, Write};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Date32Type, Float64Type, Int64Type, TimestampMicrosecondType};
use arrow_array::{
    Array, ArrayRef, DictionaryArray, Float64Array, Int64Array, RecordBatch, StringArray,
};
use arrow_schema::{DataType, TimeUnit};
use dataref_load::{
    ColumnKind, Decimal, Format, LoadError, LoadOptions, Opened, Sheet, TextEncoding, open,
};

fn file_of(bytes: &[u8]) -> std::fs::File {
    let mut f = tempfile::tempfile().unwrap();
    f.write_all(bytes).unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    f
}

fn load(
    name: &str,
    bytes: &[u8],
    options: &LoadOptions,
) -> Result<(Opened, Vec<RecordBatch>), LoadError> {
    let mut opened = open(file_of(bytes), name, options, &|| false)?;
    let mut batches = Vec::new();
    while let Some(b) = opened.batches.next_batch()? {
        assert_eq!(b.schema(), opened.batches.schema());
        batches.push(b);
    }
    Ok((opened, batches))
}

fn one(name: &str, bytes: &[u8]) -> (Opened, RecordBatch) {
    let (o, mut b) = load(name, bytes, &LoadOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(b.len(), 1);
    (o, b.remove(0))
}

fn types(b: &RecordBatch) -> Vec<(String, DataType)> {
    b.schema()
        .fields()
        .iter()
        .map(|f| (f.name().clone(), f.data_type().clone()))
        .collect()
}

fn err(name: &str, bytes: &[u8], options: &LoadOptions) -> String {
    match load(name, bytes, options) {
        Ok(_) => panic!("{name} loaded"),
        Err(e) => format!("{e} | {}", e.hint().unwrap_or_default()),
    }
}

#[test]
fn a_csv_gets_the_types_a_person_would_give_it() {
    let csv = "order_id,zip,amount,paid,day,at,region\n\
               1,02134,12.50,true,2024-01-31,2024-01-31 09:15:00,EMEA\n\
               2,10001,NA,false,2024-02-29,2024-02-29T23:59:59.5,\"Asia, Pacific\"\n\
               3,94105,7,,2024-03-01,,\"say \"\"hi\"\"\nthere\"\n";
    let (o, b) = one("orders.csv", csv.as_bytes());
    assert_eq!(o.format, Format::Csv);
    assert_eq!(o.rows, Some(3));
    assert_eq!(o.notes, ["CSV: delimiter `,`, first line is the header"]);
    assert_eq!(
        types(&b),
        [
            ("order_id".into(), DataType::Int64),
            ("zip".into(), DataType::Utf8),
            ("amount".into(), DataType::Float64),
            ("paid".into(), DataType::Boolean),
            ("day".into(), DataType::Date32),
            (
                "at".into(),
                DataType::Timestamp(TimeUnit::Microsecond, None)
            ),
            ("region".into(), DataType::Utf8),
        ]
    );
    assert_eq!(b.column(1).as_string::<i32>().value(0), "02134");
    let amount = b.column(2).as_primitive::<Float64Type>();
    assert_eq!(
        (amount.value(0), amount.is_null(1), amount.value(2)),
        (12.5, true, 7.0)
    );
    assert!(b.column(3).is_null(2));
    assert_eq!(b.column(4).as_primitive::<Date32Type>().value(1), 19_782);
    let at = b.column(5).as_primitive::<TimestampMicrosecondType>();
    assert_eq!(at.value(1), 19_782 * 86_400_000_000 + 86_399_500_000);
    assert_eq!(b.column(6).as_string::<i32>().value(2), "say \"hi\"\nthere");
}

#[test]
fn european_csv_in_windows_1252_with_decimal_commas() {
    let bytes = b"Produkt;Preis;Menge\nCaf\xe9;1.234,50;3\nTh\xe9;0,99;12\n";
    let (o, b) = one("preise.csv", bytes);
    assert_eq!(
        o.notes,
        ["CSV: delimiter `;`, read as Windows-1252, decimal comma, first line is the header"]
    );
    assert_eq!(b.column(0).as_string::<i32>().value(0), "Café");
    let price = b.column(1).as_primitive::<Float64Type>();
    assert_eq!((price.value(0), price.value(1)), (1234.5, 0.99));
    assert_eq!(b.column(2).as_primitive::<Int64Type>().value(1), 12);
}

#[test]
fn utf16_and_utf8_with_bom_and_tabs() {
    let text = "name\tscore\nZoë\t3.5\n";
    let mut bytes = vec![0xFF, 0xFE];
    bytes.extend(text.encode_utf16().flat_map(u16::to_le_bytes));
    let (o, b) = one("scores.tsv", &bytes);
    assert_eq!(
        o.notes,
        ["TSV: tab-delimited, read as UTF-16LE, first line is the header"]
    );
    assert_eq!(b.column(0).as_string::<i32>().value(0), "Zoë");
    let mut bytes = vec![0xEF, 0xBB, 0xBF];
    bytes.extend(text.as_bytes());
    let (_, b) = one("scores.txt", &bytes);
    assert_eq!(b.schema().field(0).name(), "name");
}

#[test]
fn a_file_without_a_header_and_declared_types() {
    // Blank lines and a last line without a newline, as hand-edited files have them.
    let (_, b) = one("gaps.csv", b"a,b\r\n1,2\r\n\r\n3,4");
    assert_eq!(b.num_rows(), 2);
    assert_eq!(b.column(0).as_primitive::<Int64Type>().value(1), 3);
    let (o, b) = one("pairs.csv", b"1,2\n3,4\n");
    assert_eq!(o.notes, ["CSV: delimiter `,`, no header line"]);
    assert_eq!(b.num_rows(), 2);
    assert_eq!(b.schema().field(1).name(), "column_2");

    let options = LoadOptions {
        columns: BTreeMap::from([("id".into(), ColumnKind::String)]),
        ..LoadOptions::default()
    };
    let (_, batches) = load("ids.csv", b"id,n\n007,1\n8,2\n", &options).unwrap();
    assert_eq!(batches[0].column(0).as_string::<i32>().value(1), "8");

    let options = LoadOptions {
        columns: BTreeMap::from([("n".into(), ColumnKind::Integer)]),
        ..LoadOptions::default()
    };
    assert_eq!(
        err("ids.csv", b"id,n\n1,2\n2,3\n3,x4\n", &options),
        "line 4, column `n`: `x4` is not an integer | declare the column as text \
         (`columns: {\"n\": \"string\"}`), or fix the value"
    );
    let options = LoadOptions {
        columns: BTreeMap::from([("amount".into(), ColumnKind::Float)]),
        ..LoadOptions::default()
    };
    assert!(err("ids.csv", b"id,n\n1,2\n", &options).starts_with("no column `amount` in the file"));
    let options = LoadOptions {
        decimal: Some(Decimal::Comma),
        delimiter: Some(b';'),
        header: Some(true),
        ..LoadOptions::default()
    };
    let (_, batches) = load("x.csv", b"a;b\n1,5;2\n", &options).unwrap();
    assert_eq!(
        batches[0].column(0).as_primitive::<Float64Type>().value(0),
        1.5
    );
}

#[test]
fn bad_text_is_refused_with_where_and_what() {
    assert_eq!(
        err("r.csv", b"a,b\n1,2\n3,4,5\n", &LoadOptions::default()),
        "line 3 has 3 fields; the first line has 2 | every line needs the same number of \
         fields; check the delimiter (pass `delimiter`) or quote fields that contain it"
    );
    // Errors name the line the record is on, after `\r\n` line ends and blank lines too
    // (the csv crate's own position is the line before: where it stood).
    assert!(
        err(
            "r.csv",
            b"a,b\r\n1,2\r\n\r\n\r\n3,4,5\r\n",
            &LoadOptions::default()
        )
        .starts_with("line 5 has 3 fields")
    );
    let typed = LoadOptions {
        columns: BTreeMap::from([("a".to_owned(), ColumnKind::Integer)]),
        ..LoadOptions::default()
    };
    assert!(
        err("t.csv", b"a,b\r\n1,2\r\n3,4\r\nx,3\r\n", &typed)
            .starts_with("line 4, column `a`: `x`")
    );
    let utf8 = LoadOptions {
        encoding: Some(TextEncoding::Utf8),
        ..LoadOptions::default()
    };
    assert!(
        err("u.csv", b"a\r\nb\r\n\ncaf\xe9\r\n", &utf8)
            .starts_with("line 4: the bytes are not valid UTF-8")
    );
    assert!(err("e.csv", b"", &LoadOptions::default()).starts_with("the file is empty"));
    assert!(
        err(
            "bin.csv",
            b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0",
            &LoadOptions::default()
        )
        .starts_with("this is not CSV text: it holds NUL bytes")
    );
    let parquet = parquet_bytes();
    assert!(
        err("report.csv", &parquet, &LoadOptions::default())
            .starts_with("this is not CSV text: it is a Parquet file")
    );
    let options = LoadOptions {
        encoding: Some(TextEncoding::Utf8),
        ..LoadOptions::default()
    };
    assert!(
        err("latin.csv", b"a\ncaf\xe9\n", &options)
            .starts_with("line 2: the bytes are not valid UTF-8")
    );
    let options = LoadOptions {
        sheet: Some(Sheet::Index(1)),
        ..LoadOptions::default()
    };
    assert!(err("a.csv", b"a\n1\n", &options).starts_with("`sheet` does not apply to CSV files"));
    assert!(err("notes", b"hello there", &LoadOptions::default()).starts_with("cannot tell"));
}

#[test]
fn a_large_csv_streams_in_batches() {
    let mut csv = String::from("i,x\n");
    for i in 0..150_000u64 {
        csv.push_str(&format!("{i},{}.25\n", i % 977));
    }
    let (o, batches) = load("big.csv", csv.as_bytes(), &LoadOptions::default()).unwrap();
    assert_eq!(o.rows, Some(150_000));
    assert_eq!(
        batches
            .iter()
            .map(RecordBatch::num_rows)
            .collect::<Vec<_>>(),
        [65_536, 65_536, 18_928]
    );
    let sum: i64 = batches
        .iter()
        .map(|b| {
            b.column(0)
                .as_primitive::<Int64Type>()
                .iter()
                .flatten()
                .sum::<i64>()
        })
        .sum();
    assert_eq!(sum, 150_000 * 149_999 / 2);
    // A value late in the file that does not fit the early rows' type widens the column;
    // it never fails the load after the type was chosen.
    csv.push_str("150000,n/a\n");
    let (_, batches) = load("big.csv", csv.as_bytes(), &LoadOptions::default()).unwrap();
    assert_eq!(batches[0].schema().field(1).data_type(), &DataType::Utf8);
}

/// A file past two chunks of 8 MiB is read on every core: the same rows, in order, with a
/// quoted field spanning lines late in the file and a late value that widens a column.
#[test]
fn a_csv_past_16_mib_is_read_on_every_core_in_order() {
    let mut csv = String::from("id,region,amount,note\r\n");
    let rows = 600_000u64;
    for i in 0..rows {
        let note = if i == 533_333 {
            "\"two\r\nlines, \"\"quoted\"\"\"".to_owned()
        } else {
            format!("note {}", i % 13)
        };
        csv.push_str(&format!("{i},region {},{}.5,{note}\r\n", i % 7, i % 1000));
    }
    csv.push_str(&format!("{rows},late,n/a,last\r\n"));
    assert!(csv.len() > 16 << 20, "{} bytes", csv.len());
    let (o, batches) = load("big.csv", csv.as_bytes(), &LoadOptions::default()).unwrap();
    assert_eq!(o.rows, Some(rows + 1));
    let ids: Vec<i64> = batches
        .iter()
        .flat_map(|b| {
            let ids = b.column(0).as_primitive::<Int64Type>();
            ids.iter().flatten().collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(ids.len() as u64, rows + 1);
    assert!(
        ids.iter().enumerate().all(|(i, &id)| id == i as i64),
        "in order"
    );
    let schema = batches[0].schema();
    assert_eq!(
        schema.field(2).data_type(),
        &DataType::Utf8,
        "widened by `n/a`"
    );
    let note = |i: usize| {
        let mut at = i;
        for b in &batches {
            if at < b.num_rows() {
                return b.column(3).as_string::<i32>().value(at).to_owned();
            }
            at -= b.num_rows();
        }
        panic!("no row {i}")
    };
    assert_eq!(note(533_333), "two\r\nlines, \"quoted\"");
    assert_eq!(note(533_334), format!("note {}", 533_334 % 13));
}

#[test]
fn json_arrays_and_ndjson() {
    let json = r#" [ {"id": 1, "name": "a", "tags": ["x"], "at": "2024-05-01T10:00:00Z"},
                   {"id": 2, "big": 18446744073709551615, "price": 2.5},
                   {"id": 3, "name": null, "price": 3} ] "#;
    let (o, b) = one("items.json", json.as_bytes());
    assert_eq!(o.rows, Some(3));
    assert_eq!(
        types(&b),
        [
            ("id".into(), DataType::Int64),
            ("name".into(), DataType::Utf8),
            ("tags".into(), DataType::Utf8),
            (
                "at".into(),
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
            ),
            ("big".into(), DataType::Utf8),
            ("price".into(), DataType::Float64),
        ]
    );
    assert_eq!(b.column(2).as_string::<i32>().value(0), r#"["x"]"#);
    assert_eq!(
        b.column(4).as_string::<i32>().value(1),
        "18446744073709551615"
    );
    assert!(b.column(4).is_null(0));
    let ndjson = "{\"a\": 1}\n\n{\"a\": 2, \"b\": true}\n";
    let (o, b) = one("events.ndjson", ndjson.as_bytes());
    assert_eq!((o.format, b.num_rows()), (Format::Ndjson, 2));
    // Sniffed from the first byte when the name says nothing.
    let (o, _) = one("export", json.as_bytes());
    assert_eq!(o.format, Format::Json);

    let o = LoadOptions::default();
    assert!(err("x.json", b"[1, 2]", &o).contains("record 1 is a number"));
    assert!(err("x.json", br#"[{"a":1}] {"a":2}"#, &o).contains("after the array"));
    assert!(err("x.json", br#"[{"a":1} {"a":2}]"#, &o).contains("separated by `,`"));
    assert!(err("x.json", br#"[{"a":1},,{"a":2}]"#, &o).contains("no record before it"));
    let deep = format!(
        "[{{\"a\": {}1{}}}]",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    assert!(err("deep.json", deep.as_bytes(), &o).contains("recursion limit"));
}

/// The sample batch as our exporter writes it in `format`: real Parquet and XLSX files.
fn exported(format: dataref_export::Format) -> Vec<u8> {
    let batch = sample_batch();
    let mut out = std::io::Cursor::new(Vec::new());
    dataref_export::export(
        format,
        &batch.schema(),
        &[batch],
        &dataref_export::ExportOptions::default(),
        &mut out,
        &|| false,
    )
    .unwrap();
    out.into_inner()
}

fn parquet_bytes() -> Vec<u8> {
    exported(dataref_export::Format::Parquet)
}

fn sample_batch() -> RecordBatch {
    RecordBatch::try_from_iter([
        (
            "region",
            Arc::new(StringArray::from(vec!["EMEA", "APAC", "AMER"])) as ArrayRef,
        ),
        (
            "units",
            Arc::new(Int64Array::from(vec![3, 40, 7])) as ArrayRef,
        ),
        (
            "revenue",
            Arc::new(Float64Array::from(vec![12.5, 0.1, 1e9])) as ArrayRef,
        ),
    ])
    .unwrap()
}

#[test]
fn parquet_and_arrow_keep_their_types() {
    let (o, b) = one("sales.parquet", &parquet_bytes());
    assert_eq!((o.format, o.rows), (Format::Parquet, Some(3)));
    assert_eq!(b.column(2).as_primitive::<Float64Type>().value(2), 1e9);

    // Arrow IPC, file and stream formats, with a dictionary column stored plain.
    let dict: DictionaryArray<arrow_array::types::Int32Type> =
        vec!["a", "b", "a"].into_iter().collect();
    let batch = RecordBatch::try_from_iter([("k", Arc::new(dict) as ArrayRef)]).unwrap();
    let mut file = Vec::new();
    let mut w = arrow_ipc::writer::FileWriter::try_new(&mut file, &batch.schema()).unwrap();
    w.write(&batch).unwrap();
    w.finish().unwrap();
    drop(w);
    let (o, b) = one("k.feather", &file);
    assert_eq!(o.format, Format::Arrow);
    assert_eq!(b.schema().field(0).data_type(), &DataType::Utf8);
    assert_eq!(b.column(0).as_string::<i32>().value(2), "a");
    let mut stream = Vec::new();
    let mut w = arrow_ipc::writer::StreamWriter::try_new(&mut stream, &batch.schema()).unwrap();
    w.write(&batch).unwrap();
    w.finish().unwrap();
    drop(w);
    let (_, b) = one("k.arrows", &stream);
    assert_eq!(b.num_rows(), 3);
}

#[test]
fn damaged_columnar_files_are_refused() {
    let good = parquet_bytes();
    let o = LoadOptions::default();
    // Cut anywhere, or one byte flipped anywhere: an error or the right rows, never a panic.
    for cut in [4, 12, good.len() / 2, good.len() - 9, good.len() - 1] {
        let e = err("cut.parquet", &good[..cut], &o);
        assert!(e.starts_with("Parquet: "), "{cut}: {e}");
    }
    for i in (0..good.len()).step_by(7) {
        let mut bad = good.clone();
        bad[i] ^= 0x5A;
        if let Err(e) = load("flip.parquet", &bad, &o) {
            assert!(e.is_caller_error(), "{i}: {e}");
        }
    }
    let e = err("x.arrow", b"ARROW1\0\0garbage", &o);
    assert!(e.starts_with("Arrow: "), "{e}");
    assert!(err("old.xls", b"\xD0\xCF\x11\xE0\xA1\xB1\x1A\xE1", &o).contains("XLS (Excel 97"));
    assert!(
        err(
            "x.parquet",
            &good,
            &LoadOptions {
                columns: BTreeMap::from([("a".into(), ColumnKind::String)]),
                ..LoadOptions::default()
            }
        )
        .starts_with("`columns` does not apply to Parquet files")
    );
}

/// A file written to while it loads, even byte for byte in place, is refused at the end
/// in every format: a table is never half one version of a file and half another. (The
/// small CSV takes the one-thread reader, which reads the file twice.)
#[test]
fn a_file_written_to_while_it_loads_is_refused_in_every_format() {
    use std::os::unix::fs::FileExt;
    let mut csv = String::from("id,units\n");
    for i in 0..2000 {
        csv.push_str(&format!("{i},{}\n", i % 40));
    }
    let ndjson: String = (0..2000).map(|i| format!("{{\"id\": {i}}}\n")).collect();
    let json = format!(
        "[{}]",
        (0..2000)
            .map(|i| format!("{{\"id\": {i}}}"))
            .collect::<Vec<_>>()
            .join(",")
    );
    let cases: [(&str, Vec<u8>); 6] = [
        ("sales.csv", csv.into_bytes()),
        ("events.ndjson", ndjson.into_bytes()),
        ("items.json", json.into_bytes()),
        ("sales.parquet", parquet_bytes()),
        ("sales.xlsx", xlsx_bytes()),
        ("k.feather", {
            let batch = sample_batch();
            let mut file = Vec::new();
            let mut w = arrow_ipc::writer::FileWriter::try_new(&mut file, &batch.schema()).unwrap();
            w.write(&batch).unwrap();
            w.finish().unwrap();
            drop(w);
            file
        }),
    ];
    for (name, bytes) in cases {
        // Untouched, it loads.
        load(name, &bytes, &LoadOptions::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
        let f = file_of(&bytes);
        let mut opened = open(
            f.try_clone().unwrap(),
            name,
            &LoadOptions::default(),
            &|| false,
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        // Past a tick of the kernel's clock, so the change time moves; a digit for a digit
        // in text, one byte in the middle of a binary file.
        std::thread::sleep(std::time::Duration::from_millis(50));
        let at = bytes.len() / 2;
        let (at, byte) = match bytes[at..].iter().position(u8::is_ascii_digit) {
            Some(d)
                if !name.ends_with(".parquet")
                    && !name.ends_with(".xlsx")
                    && !name.ends_with(".feather") =>
            {
                let at = at + d;
                (at, if bytes[at] == b'7' { b'8' } else { b'7' })
            }
            _ => (at, bytes[at] ^ 0x01),
        };
        f.write_all_at(&[byte], at as u64).unwrap();
        assert_eq!(f.metadata().unwrap().len(), bytes.len() as u64);
        let end = loop {
            match opened.batches.next_batch() {
                Ok(Some(_)) => {}
                other => break other,
            }
        };
        assert!(matches!(end, Err(LoadError::Changed)), "{name}: {end:?}");
    }
}

fn xlsx_bytes() -> Vec<u8> {
    exported(dataref_export::Format::Xlsx)
}

#[test]
fn a_workbook_sheet_by_name_or_position() {
    let bytes = xlsx_bytes();
    let (o, b) = one("sales.xlsx", &bytes);
    assert_eq!(
        o.notes[0],
        "XLSX: sheet `Data` (1 of 1), first row is the header"
    );
    assert_eq!(
        types(&b),
        [
            ("region".into(), DataType::Utf8),
            ("units".into(), DataType::Int64),
            ("revenue".into(), DataType::Float64),
        ]
    );
    assert_eq!(b.column(1).as_primitive::<Int64Type>().value(1), 40);
    assert_eq!(b.column(2).as_primitive::<Float64Type>().value(1), 0.1);
    let by_name = LoadOptions {
        sheet: Some(Sheet::Name("Data".into())),
        ..LoadOptions::default()
    };
    assert_eq!(load("s.xlsx", &bytes, &by_name).unwrap().1[0].num_rows(), 3);
    let missing = LoadOptions {
        sheet: Some(Sheet::Name("Q4".into())),
        ..LoadOptions::default()
    };
    assert_eq!(
        err("s.xlsx", &bytes, &missing),
        "no sheet `Q4` in the workbook | the sheets are `Data`; `sheet` takes a name or a \
         0-based index"
    );
    // A zip bomb: refused by the sizes its directory declares, before anything is unpacked.
    let small = LoadOptions {
        max_unpacked_bytes: 1_000,
        ..LoadOptions::default()
    };
    assert!(err("s.xlsx", &bytes, &small).starts_with("the workbook, unpacked, is "));
    // Not a zip at all.
    assert!(err("s.xlsx", b"PK\x03\x04garbage", &LoadOptions::default()).starts_with("XLSX: "));
}
