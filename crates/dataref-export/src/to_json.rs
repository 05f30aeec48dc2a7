//! JSON (one array of objects) and NDJSON (one object per line), written row by row:
//! the table never exists as one JSON value in memory.

use std::io::{BufWriter, Write};

use crate::ExportError;
use crate::plan::Plan;
use crate::text::{Cell, cell};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// `[\n{…},\n{…}\n]\n`
    Array,
    /// `{…}\n{…}\n`
    Lines,
}

pub(crate) fn write<W: Write>(
    plan: &Plan,
    out: W,
    layout: Layout,
    interrupted: &dyn Fn() -> bool,
) -> Result<u64, ExportError> {
    let mut out = BufWriter::with_capacity(1 << 20, out);
    // Each key once, already as JSON text with its colon.
    let keys: Vec<Vec<u8>> = plan
        .headers()
        .iter()
        .map(|h| {
            let mut k = serde_json::to_vec(h).unwrap_or_else(|_| b"\"\"".to_vec());
            k.push(b':');
            k
        })
        .collect();
    if layout == Layout::Array {
        out.write_all(b"[")?;
    }
    let mut rows = 0u64;
    let mut scratch = Vec::with_capacity(64);
    for batch in plan.batches() {
        if interrupted() {
            return Err(ExportError::Cancelled);
        }
        let batch = batch?;
        for row in 0..batch.num_rows() {
            match layout {
                Layout::Array if rows > 0 => out.write_all(b",\n")?,
                Layout::Array => out.write_all(b"\n")?,
                Layout::Lines => {}
            }
            out.write_all(b"{")?;
            for (i, (array, key)) in batch.columns().iter().zip(&keys).enumerate() {
                if i > 0 {
                    out.write_all(b",")?;
                }
                out.write_all(key)?;
                match cell(array, row, &mut scratch) {
                    Cell::Null => out.write_all(b"null")?,
                    Cell::Text(s) => serde_json::to_writer(&mut out, s).map_err(json_io)?,
                    Cell::Scalar {
                        quote_in_json: true,
                    } => {
                        out.write_all(b"\"")?;
                        out.write_all(&scratch)?;
                        out.write_all(b"\"")?;
                    }
                    Cell::Scalar {
                        quote_in_json: false,
                    } => {
                        // `NaN` and infinities are not JSON numbers.
                        if matches!(scratch.first(), Some(b'N' | b'i')) || scratch == b"-inf" {
                            out.write_all(b"\"")?;
                            out.write_all(&scratch)?;
                            out.write_all(b"\"")?;
                        } else {
                            out.write_all(&scratch)?;
                        }
                    }
                    Cell::Json(v) => serde_json::to_writer(&mut out, &v).map_err(json_io)?,
                }
            }
            out.write_all(b"}")?;
            if layout == Layout::Lines {
                out.write_all(b"\n")?;
            }
            rows += 1;
        }
    }
    if layout == Layout::Array {
        out.write_all(if rows > 0 { b"\n]\n" } else { b"]\n" })?;
    }
    out.flush()?;
    Ok(rows)
}

fn json_io(e: serde_json::Error) -> ExportError {
    ExportError::Io(std::io::Error::other(e))
}
