//! Parquet and Arrow IPC: the file's own types, read a batch at a time. Both readers trust
//! more of a file than a stranger's file deserves, so each call into them runs under
//! `catch_unwind` (an Arrow IPC file's structure is checked first by the store's
//! [`UntrustedIpc`]). Dictionary and view columns are stored as plain columns.

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use arrow_array::{RecordBatch, RecordBatchReader};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use dataref_store::{UntrustedBatches, UntrustedIpc};
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};

use crate::{BATCH_ROWS, Batches, Format, LoadError, Opened};

fn guarded<T>(
    format: &'static str,
    f: impl FnOnce() -> Result<T, LoadError>,
) -> Result<T, LoadError> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        Err(LoadError::malformed(
            format,
            "the file's structure is inconsistent (the reader gave up on it)",
        ))
    })
}

pub(crate) fn parquet(file: File) -> Result<Opened, LoadError> {
    let (reader, rows) = guarded("Parquet", || {
        let builder = ParquetRecordBatchReaderBuilder::try_new(file)
            .map_err(|e| LoadError::malformed("Parquet", e))?;
        let rows = u64::try_from(builder.metadata().file_metadata().num_rows()).ok();
        let reader = builder
            .with_batch_size(BATCH_ROWS)
            .build()
            .map_err(|e| LoadError::malformed("Parquet", e))?;
        Ok((reader, rows))
    })?;
    let (schema, plain) = plain_schema(&reader.schema());
    Ok(Opened {
        format: Format::Parquet,
        rows,
        notes: Vec::new(),
        batches: Box::new(Columnar {
            source: Source::Parquet(reader),
            schema,
            plain,
        }),
    })
}

pub(crate) fn arrow(mut file: File) -> Result<Opened, LoadError> {
    let mut magic = [0u8; 6];
    let is_file = file.read_exact(&mut magic).is_ok() && &magic == b"ARROW1";
    file.seek(SeekFrom::Start(0))?;
    let (source, schema) = if is_file {
        let ipc = UntrustedIpc::open(file).map_err(|e| LoadError::malformed("Arrow", e))?;
        let schema = ipc.schema();
        let batches = ipc
            .batches()
            .map_err(|e| LoadError::malformed("Arrow", e))?;
        (Source::File(batches), schema)
    } else {
        let reader = guarded("Arrow", || {
            arrow_ipc::reader::StreamReader::try_new(BufReader::with_capacity(1 << 16, file), None)
                .map_err(|e| LoadError::malformed("Arrow", e))
        })?;
        let schema = reader.schema();
        (Source::Stream(Box::new(reader)), schema)
    };
    let (schema, plain) = plain_schema(&schema);
    Ok(Opened {
        format: Format::Arrow,
        rows: None,
        notes: Vec::new(),
        batches: Box::new(Columnar {
            source,
            schema,
            plain,
        }),
    })
}

/// The schema with dictionary and view columns as their plain types, and whether any
/// column changed.
fn plain_schema(schema: &SchemaRef) -> (SchemaRef, bool) {
    let mut changed = false;
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| {
            let plain = match f.data_type() {
                DataType::Dictionary(_, value) => Some(value.as_ref().clone()),
                DataType::Utf8View => Some(DataType::Utf8),
                DataType::BinaryView => Some(DataType::Binary),
                _ => None,
            };
            match plain {
                Some(t) => {
                    changed = true;
                    f.as_ref().clone().with_data_type(t)
                }
                None => f.as_ref().clone(),
            }
        })
        .collect();
    if !changed {
        return (schema.clone(), false);
    }
    (
        Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone())),
        true,
    )
}

enum Source {
    Parquet(ParquetRecordBatchReader),
    File(UntrustedBatches),
    Stream(Box<arrow_ipc::reader::StreamReader<BufReader<File>>>),
}

struct Columnar {
    source: Source,
    schema: SchemaRef,
    plain: bool,
}

impl Batches for Columnar {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn next_batch(&mut self) -> Result<Option<RecordBatch>, LoadError> {
        let (label, next) = match &mut self.source {
            Source::Parquet(r) => (
                "Parquet",
                guarded("Parquet", || {
                    r.next()
                        .transpose()
                        .map_err(|e| LoadError::malformed("Parquet", e))
                })?,
            ),
            Source::File(r) => (
                "Arrow",
                r.next()
                    .transpose()
                    .map_err(|e| LoadError::malformed("Arrow", e))?,
            ),
            Source::Stream(r) => (
                "Arrow",
                guarded("Arrow", || {
                    r.next()
                        .transpose()
                        .map_err(|e| LoadError::malformed("Arrow", e))
                })?,
            ),
        };
        let Some(batch) = next else {
            return Ok(None);
        };
        // Every array's buffers checked against its type before the store keeps them.
        guarded(label, || {
            batch
                .columns()
                .iter()
                .try_for_each(|c| c.to_data().validate_full())
                .map_err(|e| LoadError::malformed(label, e))
        })?;
        if !self.plain {
            return Ok(Some(batch));
        }
        let columns = batch
            .columns()
            .iter()
            .zip(self.schema.fields())
            .map(|(c, f)| arrow_cast::cast(c, f.data_type()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| LoadError::malformed(label, e))?;
        Ok(Some(
            RecordBatch::try_new(self.schema.clone(), columns)
                .map_err(|e| LoadError::malformed(label, e))?,
        ))
    }
}
