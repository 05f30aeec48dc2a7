//! Parquet with Snappy compression, one batch at a time (the writer buffers a row group).

use std::io::Write;

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
    let mut writer = ArrowWriter::try_new(out, plan.schema().clone(), Some(props))?;
    let mut rows = 0u64;
    for batch in plan.batches() {
        if interrupted() {
            return Err(ExportError::Cancelled);
        }
        let batch = batch?;
        writer.write(&batch)?;
        rows += batch.num_rows() as u64;
    }
    writer.close()?;
    Ok(rows)
}
