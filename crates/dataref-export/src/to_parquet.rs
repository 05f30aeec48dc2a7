//! Parquet with Snappy compression, one batch at a time (the writer buffers a row group).
//!
//! Parquet has no month-day-nanosecond interval (PostgreSQL's `interval`), so such a column
//! (or a list of them) is written as text: the ISO 8601 duration the sample shows
//! (`P1Y2M3DT4H5M6.5S`), or a JSON array of them.

use std::io::Write;
use std::sync::Arc;

use arrow_array::builder::StringBuilder;
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, IntervalUnit, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;

use crate::ExportError;
use crate::plan::Plan;

pub(crate) fn write<W: Write + Send>(
    plan: &Plan,
    out: W,
    interrupted: &dyn Fn() -> bool,
) -> Result<u64, ExportError> {
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_created_by(concat!("dataref ", env!("CARGO_PKG_VERSION")).to_owned())
        .build();
    let as_text: Vec<bool> = plan
        .schema()
        .fields()
        .iter()
        .map(|f| has_nano_interval(f.data_type()))
        .collect();
    let schema: SchemaRef = if as_text.contains(&true) {
        Arc::new(Schema::new_with_metadata(
            plan.schema()
                .fields()
                .iter()
                .zip(&as_text)
                .map(|(f, text)| match text {
                    true => Arc::new(Field::new(f.name(), DataType::Utf8, true)),
                    false => f.clone(),
                })
                .collect::<Vec<_>>(),
            plan.schema().metadata().clone(),
        ))
    } else {
        plan.schema().clone()
    };
    let mut writer = ArrowWriter::try_new(out, schema.clone(), Some(props))?;
    let mut rows = 0u64;
    for batch in plan.batches() {
        if interrupted() {
            return Err(ExportError::Cancelled);
        }
        let mut batch = batch?;
        if as_text.contains(&true) {
            let columns: Vec<ArrayRef> = batch
                .columns()
                .iter()
                .zip(&as_text)
                .map(|(c, text)| if *text { to_text(c) } else { c.clone() })
                .collect();
            batch = RecordBatch::try_new(schema.clone(), columns)?;
        }
        writer.write(&batch)?;
        rows += batch.num_rows() as u64;
    }
    writer.close()?;
    Ok(rows)
}

fn has_nano_interval(t: &DataType) -> bool {
    match t {
        DataType::Interval(IntervalUnit::MonthDayNano) => true,
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            has_nano_interval(f.data_type())
        }
        _ => false,
    }
}

/// Each cell in the store's JSON form, strings unquoted.
fn to_text(array: &ArrayRef) -> ArrayRef {
    let mut b = StringBuilder::with_capacity(array.len(), array.len() * 16);
    for row in 0..array.len() {
        match dataref_store::cell_to_json(array, row, None).0 {
            serde_json::Value::Null => b.append_null(),
            serde_json::Value::String(s) => b.append_value(s),
            other => b.append_value(other.to_string()),
        }
    }
    Arc::new(b.finish())
}
