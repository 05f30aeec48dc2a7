//! The parallel reader against the sequential one on the same bytes: the same rows, types,
//! notes and errors, with chunks small enough that every cut falls somewhere awkward.

use std::collections::BTreeMap;
use std::io::{Seek, Write};

use arrow_array::Array;

use super::*;
use crate::delimited::open_split;
use crate::{ColumnKind, Format, LoadOptions};

fn file_of(bytes: &[u8]) -> File {
    let mut f = tempfile::tempfile().expect("temp file");
    f.write_all(bytes).expect("write");
    f.seek(std::io::SeekFrom::Start(0)).expect("seek");
    f
}

/// Tiny chunks on three threads.
fn tiny(chunk: u64) -> Split {
    Split { chunk, threads: 3 }
}

const ONE_THREAD: Split = Split {
    chunk: 8 << 20,
    threads: 1,
};

/// Everything a load yields, as text: its notes, row count, schema and every value.
fn load(bytes: &[u8], options: &LoadOptions, split: Split) -> Result<String, String> {
    let opened = open_split(file_of(bytes), Format::Csv, options, &|| false, split)
        .map_err(|e| e.to_string())?;
    let mut out = format!(
        "{:?}\n{:?}\n{:?}\n",
        opened.notes,
        opened.rows,
        opened.batches.schema()
    );
    let mut batches = opened.batches;
    let mut total = 0;
    while let Some(batch) = batches.next_batch().map_err(|e| e.to_string())? {
        total += batch.num_rows();
        for row in 0..batch.num_rows() {
            for col in batch.columns() {
                let v = if col.is_null(row) {
                    "∅".to_owned()
                } else {
                    arrow_cast::display::array_value_to_string(col, row).expect("display")
                };
                out.push_str(&v);
                out.push('|');
            }
            out.push('\n');
        }
    }
    out.push_str(&format!("{total} rows\n"));
    Ok(out)
}

/// The parallel reader (that really ran in parallel) equals the sequential one.
fn same(bytes: &[u8], options: &LoadOptions, chunk: u64) -> String {
    let one = load(bytes, options, ONE_THREAD);
    let many = load(bytes, options, tiny(chunk));
    if one != many {
        let text = |r: &Result<String, String>| match r {
            Ok(s) | Err(s) => s.clone(),
        };
        let (a, b) = (text(&one), text(&many));
        let diff = a.lines().zip(b.lines()).position(|(x, y)| x != y);
        let at = |s: &str| s.lines().nth(diff.unwrap_or(0)).unwrap_or("").to_owned();
        panic!(
            "chunks of {chunk} bytes: {} vs {}; first difference: {:?} vs {:?}",
            if one.is_ok() { "loaded" } else { "failed" },
            if many.is_ok() { "loaded" } else { "failed" },
            at(&a),
            at(&b)
        );
    }
    match one {
        Ok(s) | Err(s) => s,
    }
}

/// Asserts the first pass over `bytes` ran in parallel (nothing handed back).
fn parallel_ok(bytes: &[u8], chunk: u64) -> (FirstPass, Plan) {
    parallel_ok_with(bytes, chunk, b',')
}

fn parallel_ok_with(bytes: &[u8], chunk: u64, delimiter: u8) -> (FirstPass, Plan) {
    let f = file_of(bytes);
    let version = Version::of(&f).expect("version");
    match first_pass(&f, 0, version, delimiter, None, tiny(chunk), &|| false) {
        Ok(found) => found,
        Err(Stop::Sequential) => panic!("handed to the sequential reader"),
        Err(Stop::Cancelled) => panic!("cancelled"),
        Err(Stop::Io(e)) => panic!("{e}"),
    }
}

fn sales(rows: usize, newline: &str) -> Vec<u8> {
    let mut s = format!("id,region,revenue,day,note{newline}");
    for i in 0..rows {
        let region = ["EMEA", "APAC", "AMER"][i % 3];
        s.push_str(&format!(
            "{i},{region},{}.{:02},2025-{:02}-{:02},n{}{newline}",
            i * 7 % 1000,
            i % 100,
            i % 12 + 1,
            i % 28 + 1,
            i % 17
        ));
    }
    s.into_bytes()
}

#[test]
fn plain_files_read_the_same_on_every_cut() {
    let bytes = sales(3000, "\n");
    for chunk in [64, 100, 257, 4096] {
        let (first, plan) = parallel_ok(&bytes, chunk);
        assert_eq!(first.rows, 3001);
        assert!(plan.segments.len() > 1, "{chunk}: several segments");
        assert!(
            plan.segments.iter().all(|s| s.plain),
            "{chunk}: split where they lie"
        );
        same(&bytes, &LoadOptions::default(), chunk);
    }
}

#[test]
fn crlf_lines_and_blank_lines_read_the_same() {
    let bytes = sales(2000, "\r\n");
    let (_, plan) = parallel_ok(&bytes, 80);
    assert!(
        plan.segments.iter().all(|s| s.plain),
        "split where they lie"
    );
    for chunk in [64, 80, 333] {
        same(&bytes, &LoadOptions::default(), chunk);
    }
    // A late error names the line the CSV reader names.
    let text = String::from_utf8(bytes).expect("utf-8");
    let bad = text.replacen("\r\n1500,", "\r\nabc,", 1);
    let mut columns = BTreeMap::new();
    columns.insert("id".to_owned(), ColumnKind::Integer);
    let opts = LoadOptions {
        columns,
        ..LoadOptions::default()
    };
    for chunk in [64, 80, 333] {
        // Row 1500 is on line 1502 (the header is line 1), `\r\n` or not.
        let e = same(bad.as_bytes(), &opts, chunk);
        assert!(e.starts_with("line 1502, column `id`: `abc`"), "{e}");
    }
    // A quote in a line: that chunk goes to the CSV reader, the others are split.
    let odd = text.replacen(",n3\r\n", ",\"n\r\n3\"\r\n", 5);
    let (_, plan) = parallel_ok(odd.as_bytes(), 200);
    assert!(plan.segments.iter().any(|s| !s.plain));
    assert!(plan.segments.iter().any(|s| s.plain));
    same(odd.as_bytes(), &LoadOptions::default(), 200);
    // Blank lines anywhere, and no newline at the end.
    let mut s = String::from("a,b\n");
    for i in 0..2000 {
        s.push_str(&format!("{i},x{i}\n"));
        if i % 7 == 0 {
            s.push_str("\n\r\n");
        }
    }
    s.push_str("2000,last");
    let text = same(s.as_bytes(), &LoadOptions::default(), 64);
    assert!(text.ends_with("2000|last|\n2001 rows\n"), "{text}");
}

#[test]
fn plain_lines_with_blank_lines_semicolons_and_a_late_error() {
    // No quote and no carriage return: chunks are split where they lie. Blank lines fall
    // at and around the cuts; a record after blank lines is on the line the CSV reader
    // says.
    let mut s = String::from("id;amount;day\n");
    for i in 0..1500 {
        s.push_str(&format!(
            "{i};{},{:02};2025-03-{:02}\n",
            i * 3,
            i % 100,
            i % 28 + 1
        ));
        if i % 5 == 0 {
            s.push_str("\n\n");
        }
    }
    let text = same(s.as_bytes(), &LoadOptions::default(), 64);
    assert!(
        text.contains("delimiter `;`, decimal comma"),
        "{}",
        &text[..200]
    );
    for chunk in [50, 77, 128] {
        parallel_ok_with(s.as_bytes(), chunk, b';');
        same(s.as_bytes(), &LoadOptions::default(), chunk);
    }
    let bad = s.replacen("\n\n1201;", "\n\nx;", 1);
    let mut columns = BTreeMap::new();
    columns.insert("id".to_owned(), ColumnKind::Integer);
    let opts = LoadOptions {
        columns,
        ..LoadOptions::default()
    };
    for chunk in [50, 77, 128] {
        // Row 1201 is on line 2 + 1201 + 2 × 241 (two blank lines after every fifth row).
        let e = same(bad.as_bytes(), &opts, chunk);
        assert!(e.starts_with("line 1685, column `id`: `x`"), "{e}");
    }
}

#[test]
fn quoted_fields_that_span_cuts_read_the_same() {
    // Quoted newlines, delimiters and doubled quotes in every few records: many cuts fall
    // inside a quoted field and the chunk after is parsed again.
    let mut s = String::from("id,text,n\n");
    for i in 0..1500 {
        let text = match i % 5 {
            0 => format!("\"line one\nline two, {i}\n\"\"quoted\"\"\""),
            1 => format!("\"a,b,{i}\""),
            2 => "\"\n\n\n\"".to_owned(),
            _ => format!("plain{i}"),
        };
        s.push_str(&format!("{i},{text},{}\n", i * 3));
    }
    // One field longer than many chunks.
    s.push_str(&format!("1500,\"{}\",1\n", "x\ny,\n".repeat(2000)));
    for i in 1501..1600 {
        s.push_str(&format!("{i},t,{i}\n"));
    }
    for chunk in [64, 129, 1000] {
        parallel_ok(s.as_bytes(), chunk);
        same(s.as_bytes(), &LoadOptions::default(), chunk);
    }
}

#[test]
fn a_first_row_of_data_a_mark_and_batches_across_chunks() {
    // No header: the first record is data and joins the first batch. Rows of 4 bytes in
    // chunks of 300 KB: more than one batch of `BATCH_ROWS` in a chunk.
    let mut s = String::new();
    for i in 0..(2 * BATCH_ROWS + 4000) {
        s.push_str(&format!("{},{}\n", i % 10, i % 7));
    }
    let (first, plan) = parallel_ok(s.as_bytes(), 300_000);
    assert_eq!(first.rows as usize, 2 * BATCH_ROWS + 4000);
    assert!(plan.segments.iter().any(|s| s.rows == BATCH_ROWS));
    let text = same(s.as_bytes(), &LoadOptions::default(), 300_000);
    assert!(text.contains("no header line"), "{}", &text[..200]);
    let opts = LoadOptions {
        header: Some(true),
        ..LoadOptions::default()
    };
    same(s.as_bytes(), &opts, 300_000);
}

#[test]
fn a_byte_order_mark_and_a_tiny_file() {
    let mut bytes = vec![0xEF, 0xBB, 0xBF];
    bytes.extend(sales(500, "\n"));
    same(&bytes, &LoadOptions::default(), 64);
    // Two chunks' worth, one record each.
    same(b"a,b\n1,2\n", &LoadOptions::default(), 4);
    same(b"a,b\n", &LoadOptions::default(), 2);
}

#[test]
fn errors_name_the_same_line_as_the_sequential_reader() {
    let base = sales(2000, "\n");
    let text = String::from_utf8(base.clone()).expect("utf-8");
    // A ragged line late in the file.
    let ragged = text.replacen("1777,", "1777,extra,", 1);
    let e = same(ragged.as_bytes(), &LoadOptions::default(), 64);
    assert!(e.starts_with("line 1779 has 6 fields"), "{e}");
    // A value that does not fit a declared type, in the second pass.
    let bad = text.replacen("\n1500,", "\nabc,", 1);
    let mut columns = BTreeMap::new();
    columns.insert("id".to_owned(), ColumnKind::Integer);
    let opts = LoadOptions {
        columns,
        ..LoadOptions::default()
    };
    let e = same(bad.as_bytes(), &opts, 64);
    assert!(e.starts_with("line 1502, column `id`: `abc`"), "{e}");
    // Not UTF-8 late in the file: read again as Windows-1252, whole.
    let mut latin = base.clone();
    let at = latin.len() - 10;
    latin[at] = 0xE9;
    let text = same(&latin, &LoadOptions::default(), 64);
    assert!(text.contains("read as Windows-1252"), "{}", &text[..200]);
    assert!(text.contains('é'));
    // Declared UTF-8: the sequential reader's error.
    let opts = LoadOptions {
        encoding: Some(crate::TextEncoding::Utf8),
        ..LoadOptions::default()
    };
    let e = same(&latin, &opts, 64);
    assert!(e.contains("not valid UTF-8"), "{e}");
}

/// 3,000 rows opened (the first pass done) as [`crate::open`] opens them, then `edit`ed:
/// the refusal.
fn refused_after(edit: impl FnOnce(&File, &[u8])) -> LoadError {
    let bytes = sales(3000, "\n");
    let f = file_of(&bytes);
    let opened = crate::watched(f.try_clone().expect("clone"), |file| {
        open_split(
            file,
            Format::Csv,
            &LoadOptions::default(),
            &|| false,
            tiny(4096),
        )
    })
    .expect("opened");
    edit(&f, &bytes);
    let mut batches = opened.batches;
    let mut read = 0;
    loop {
        match batches.next_batch() {
            Ok(Some(b)) => read += b.num_rows(),
            Ok(None) => panic!("an edited file loaded whole ({read} rows)"),
            Err(e) => return e,
        }
    }
}

#[test]
fn a_file_that_changes_after_the_first_pass_is_refused() {
    let e = refused_after(|f, bytes| {
        f.set_len(bytes.len() as u64 / 2).expect("truncate");
    });
    assert!(matches!(e, LoadError::Changed), "{e}");
}

/// An edit that keeps the file's length and every line's place (a digit for a digit) is
/// caught too: its change time moved, so the end of the batches is refused and no table of
/// two versions is ever whole.
#[test]
fn a_same_length_edit_after_the_first_pass_is_refused() {
    use std::os::unix::fs::FileExt;
    let e = refused_after(|f, bytes| {
        // Past a tick of the kernel's clock, so the change time can move.
        std::thread::sleep(std::time::Duration::from_millis(50));
        let at = bytes.len() / 2;
        let digit = bytes[at..]
            .iter()
            .position(u8::is_ascii_digit)
            .expect("a digit")
            + at;
        let other = if bytes[digit] == b'7' { b"8" } else { b"7" };
        f.write_all_at(other, digit as u64).expect("edit");
        assert_eq!(f.metadata().expect("len").len(), bytes.len() as u64);
    });
    assert!(matches!(e, LoadError::Changed), "{e}");
}

#[test]
fn a_cancelled_first_pass_is_cancelled() {
    let bytes = sales(3000, "\n");
    let f = file_of(&bytes);
    let version = Version::of(&f).expect("version");
    let r = first_pass(&f, 0, version, b',', None, tiny(64), &|| true);
    assert!(matches!(r, Err(Stop::Cancelled)));
}

#[test]
fn dropping_the_batches_midway_stops_the_threads() {
    let bytes = sales(3000, "\n");
    let mut opened = open_split(
        file_of(&bytes),
        Format::Csv,
        &LoadOptions::default(),
        &|| false,
        tiny(64),
    )
    .expect("opened");
    assert!(opened.batches.next_batch().expect("batch").is_some());
    // Returns: every thread is joined.
    drop(opened);
}

#[test]
fn the_word_at_a_time_search_finds_what_a_byte_loop_finds() {
    // Every special byte at every offset of a word, after every kind of plain byte
    // (0x80 and 0xFF: a high bit must not look like a match).
    for special in [b',', b'\n', b'\r', b'"', b';'] {
        for at in 0..20 {
            for filler in [b'a', 0x80, 0xFF, 0x00, b',' ^ 0x80] {
                let mut bytes = vec![filler; 20];
                bytes[at] = special;
                let naive = |from: usize| {
                    (from..bytes.len())
                        .find(|&i| matches!(bytes[i], b',' | b'\n' | b'\r' | b'"'))
                        .unwrap_or(bytes.len())
                };
                for from in 0..=20 {
                    assert_eq!(
                        next_special(&bytes, from, b','),
                        naive(from),
                        "{special} at {at} after {filler:#x}, from {from}"
                    );
                }
            }
        }
    }
}
