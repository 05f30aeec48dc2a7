//! CSV per RFC 4180: comma separators, CRLF line ends, fields with `,` `"` CR or LF
//! quoted with `"` doubled; UTF-8, with a byte order mark when asked.

use std::io::{BufWriter, Write};

use crate::plan::Plan;
use crate::text::{Cell, cell};
use crate::{Bom, ExportError, Formulas};

const BOM: &[u8] = "\u{feff}".as_bytes();

pub(crate) fn write<W: Write>(
    plan: &Plan,
    out: W,
    bom: Bom,
    formulas: Formulas,
    interrupted: &dyn Fn() -> bool,
) -> Result<u64, ExportError> {
    let mut out = BufWriter::with_capacity(1 << 20, out);
    match bom {
        Bom::With => out.write_all(BOM)?,
        Bom::Without => {}
    }
    for (i, name) in plan.headers().iter().enumerate() {
        if i > 0 {
            out.write_all(b",")?;
        }
        // Headers are names a person chose; they are neutralised like any text.
        field(&mut out, name, formulas)?;
    }
    out.write_all(b"\r\n")?;
    let mut rows = 0u64;
    let mut scratch = Vec::with_capacity(64);
    for batch in plan.batches() {
        if interrupted() {
            return Err(ExportError::Cancelled);
        }
        let batch = batch?;
        let columns = batch.columns();
        for row in 0..batch.num_rows() {
            for (i, array) in columns.iter().enumerate() {
                if i > 0 {
                    out.write_all(b",")?;
                }
                match cell(array, row, &mut scratch) {
                    Cell::Null => {}
                    Cell::Text(s) => field(&mut out, s, formulas)?,
                    Cell::Scalar { .. } => out.write_all(&scratch)?,
                    Cell::Json(serde_json::Value::String(s)) => field(&mut out, &s, formulas)?,
                    Cell::Json(v) => field(&mut out, &v.to_string(), formulas)?,
                }
            }
            out.write_all(b"\r\n")?;
        }
        rows += batch.num_rows() as u64;
    }
    out.flush()?;
    Ok(rows)
}

/// Whether a spreadsheet would take text starting like this for a formula.
pub(crate) fn looks_like_formula(s: &str) -> bool {
    matches!(
        s.as_bytes().first(),
        Some(b'=' | b'+' | b'-' | b'@' | b'\t' | b'\r')
    )
}

/// One text field, neutralised and quoted as needed.
fn field<W: Write>(out: &mut W, s: &str, formulas: Formulas) -> std::io::Result<()> {
    let prefix: &[u8] = match formulas {
        Formulas::Neutralise if looks_like_formula(s) => b"'",
        Formulas::Neutralise | Formulas::Keep => b"",
    };
    let needs_quotes = s.bytes().any(|b| matches!(b, b',' | b'"' | b'\r' | b'\n'));
    if !needs_quotes {
        out.write_all(prefix)?;
        return out.write_all(s.as_bytes());
    }
    out.write_all(b"\"")?;
    out.write_all(prefix)?;
    let mut rest = s;
    while let Some(i) = rest.find('"') {
        out.write_all(&rest.as_bytes()[..=i])?;
        out.write_all(b"\"")?;
        rest = &rest[i + 1..];
    }
    out.write_all(rest.as_bytes())?;
    out.write_all(b"\"")
}
