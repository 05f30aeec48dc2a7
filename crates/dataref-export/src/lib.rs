//! Writers from stored Arrow tables to the files a person opens: CSV, XLSX, Parquet, JSON
//! and NDJSON. Pure functions over [`RecordBatch`]es and any [`std::io::Write`]; where the
//! file goes is the caller's business.
//!
//! - [`export`]: one call for every [`Format`], with [`ExportOptions`] (columns and their
//!   order, display headers, a sort, an offset and a limit).
//! - Rows stream batch by batch wherever the format allows: CSV, JSON and NDJSON hold one
//!   batch at a time, XLSX streams rows to a temporary file (constant-memory mode), Parquet
//!   buffers one row group. A sort holds the row order (4 bytes a row) and the sort column.
//! - Spreadsheet formula injection is neutralised by default: a CSV text cell that starts
//!   with `=`, `+`, `-`, `@`, a tab or a carriage return gets a leading `'`; XLSX writes
//!   text as text cells, never as formulas.
//!
//! ```
//! use std::sync::Arc;
//! use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
//! use dataref_export::{ExportOptions, Format, export};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let batch = RecordBatch::try_from_iter([
//!     ("region", Arc::new(StringArray::from(vec!["EMEA", "=1+1"])) as ArrayRef),
//!     ("units", Arc::new(Int64Array::from(vec![3, 4])) as ArrayRef),
//! ])?;
//! let mut out = std::io::Cursor::new(Vec::new());
//! let done = export(Format::Csv, &batch.schema(), &[batch], &ExportOptions::default(), &mut out, &|| false)?;
//! assert_eq!(done.rows, 2);
//! assert_eq!(String::from_utf8(out.into_inner())?, "region,units\r\nEMEA,3\r\n'=1+1,4\r\n");
//! # Ok(()) }
//! ```
//!
//! Owns: `parquet` and `rust_xlsxwriter`, and every file format a person downloads. Must
//! not import the workspace, the tools or any transport, and takes its bytes' destination
//! from the caller.

mod error;
mod options;
mod plan;
mod text;
mod to_csv;
mod to_json;
mod to_parquet;
mod to_xlsx;

use std::io::Write;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

pub use error::ExportError;
pub use options::{Bom, ExportOptions, Format, Formulas, Order, SortBy};
pub use plan::sort_order;
pub use to_xlsx::MAX_DATA_ROWS_PER_SHEET;

/// What was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exported {
    /// Data rows written (headers not counted).
    pub rows: u64,
    /// The column names as written (display headers where given), in order.
    pub columns: Vec<String>,
    /// Worksheets written (XLSX only; 0 for the other formats).
    pub sheets: usize,
}

/// Writes the rows of a table (`schema` + `batches`) chosen by `options` to `out` as
/// `format`. `interrupted` is asked between batches; when it says `true` the export stops
/// with [`ExportError::Cancelled`] (what was written to `out` is then incomplete).
pub fn export<W: Write + Send>(
    format: Format,
    schema: &SchemaRef,
    batches: &[RecordBatch],
    options: &ExportOptions,
    out: W,
    interrupted: &dyn Fn() -> bool,
) -> Result<Exported, ExportError> {
    let plan = plan::Plan::new(schema, batches, options)?;
    let columns = plan.headers();
    let (rows, sheets) = match format {
        Format::Csv => (
            to_csv::write(&plan, out, options.bom, options.formulas, interrupted)?,
            0,
        ),
        Format::Json => (
            to_json::write(&plan, out, to_json::Layout::Array, interrupted)?,
            0,
        ),
        Format::Ndjson => (
            to_json::write(&plan, out, to_json::Layout::Lines, interrupted)?,
            0,
        ),
        Format::Parquet => (to_parquet::write(&plan, out, interrupted)?, 0),
        Format::Xlsx => to_xlsx::write(&plan, out, interrupted)?,
    };
    Ok(Exported {
        rows,
        columns,
        sheets,
    })
}

#[cfg(test)]
mod tests;
