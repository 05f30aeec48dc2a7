//! Reading a stored Arrow IPC file without copying it: the file is memory-mapped and the
//! batches' buffers point into the mapping.

use std::fs::File;
use std::io;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, PoisonError};

use arrow_array::{ArrayRef, RecordBatch, RecordBatchOptions, make_array};
use arrow_buffer::Buffer;
use arrow_buffer::{BooleanBuffer, NullBuffer};
use arrow_data::ArrayData;
use arrow_ipc::reader::{FileDecoder, read_footer_length};
use arrow_ipc::{Block, convert::fb_to_schema, root_as_footer};
use arrow_schema::{ArrowError, SchemaRef};

/// `ARROW1` + padding at the start, footer length + `ARROW1` at the end: nothing shorter
/// can be an IPC file, and checking first keeps the slicing below in bounds.
const MIN_FILE_LEN: usize = 8 + 4 + 6;
const TRAILER_LEN: usize = 10;

/// Maps `file` read-only and wraps the mapping in an arrow [`Buffer`] that keeps it alive.
#[expect(
    unsafe_code,
    reason = "memory-mapping a file and lending the mapping to arrow has no safe API"
)]
pub(super) fn map_file(file: &File) -> io::Result<Buffer> {
    // SAFETY: a mapped file must not be changed while mapped. Artifact files are written
    // under `.tmp/`, renamed into `artifacts/` once complete, and never opened for writing
    // again; the store only ever unlinks them (sweep, reconcile), which leaves existing
    // mappings intact. Only a process outside dataref truncating the file could break
    // this, and that is outside what the store can guard against. A file filled in parts
    // ([`crate::Parts`]) is written while mapped, but only where nothing was fetched yet,
    // once per part, before any reader is told the part is there: no byte a reader may
    // read ever changes.
    let mmap = unsafe { memmap2::Mmap::map(file) }?;
    let len = mmap.len();
    let ptr = NonNull::new(mmap.as_ptr().cast_mut())
        .ok_or_else(|| io::Error::other("memory map returned a null pointer"))?;
    // SAFETY: `ptr` is valid for `len` bytes for as long as `mmap` lives. The `Arc` owner
    // moves the `Mmap` handle (not the mapped pages, which stay where they are) into the
    // buffer, and arrow drops it only when the last buffer slice referencing it is gone.
    // Arrow never writes through an immutable `Buffer`, matching the read-only mapping.
    Ok(unsafe { Buffer::from_custom_allocation(ptr, len, Arc::new(mmap)) })
}

/// One artifact file, mapped, with the columns decoded (and so validated) from it so far.
/// The store keeps recent ones ([`LocalStore`](super::LocalStore)'s cache) and every reader
/// of the artifact shares them, so a table queried again is neither faulted in nor
/// validated again: a column is decoded once per mapping, whoever asks. The arrays are
/// slices of the mapping, so keeping them costs no memory of its own.
#[derive(Debug)]
pub(crate) struct Mapping {
    buffer: Buffer,
    decoded: Mutex<Decoded>,
}

#[derive(Debug, Default)]
struct Decoded {
    /// The file's schema, once a column has been decoded.
    schema: Option<SchemaRef>,
    /// Per column of the file's schema, its array in each batch once decoded.
    columns: Vec<Option<Arc<[ArrayRef]>>>,
}

impl Mapping {
    pub(crate) fn new(buffer: Buffer) -> Self {
        Self {
            buffer,
            decoded: Mutex::default(),
        }
    }

    pub(crate) fn buffer(&self) -> &Buffer {
        &self.buffer
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Decoded> {
        // Only ever written after a decode succeeded: a panic cannot leave it half done.
        self.decoded.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The batches with the columns of `projection` (every column without one), decoding
    /// only those not decoded before. A column that fails to decode is not kept, so it
    /// fails for its next reader too, and the others still serve theirs.
    pub(crate) fn batches(
        &self,
        projection: Option<&[usize]>,
    ) -> Result<Vec<RecordBatch>, ArrowError> {
        // No columns (`count(*)`): only the row counts, which cost nothing to read.
        if projection.is_some_and(<[usize]>::is_empty) {
            return decode(&self.buffer, projection, None);
        }
        let known = self.lock().schema.as_ref().map(|s| s.fields().len());
        let width = match known {
            Some(width) => width,
            None => {
                let schema = decode_parts(&self.buffer, Some(&[]), Some(0))?.0;
                let width = schema.fields().len();
                let mut decoded = self.lock();
                if decoded.schema.is_none() {
                    decoded.schema = Some(schema);
                    decoded.columns = vec![None; width];
                }
                width
            }
        };
        let all: Vec<usize>;
        let wanted = match projection {
            Some(p) => p,
            None => {
                all = (0..width).collect();
                &all
            }
        };
        let mut missing: Vec<usize> = {
            let decoded = self.lock();
            wanted
                .iter()
                .copied()
                .filter(|&i| decoded.columns.get(i).is_none_or(Option::is_none))
                .collect()
        };
        missing.sort_unstable();
        missing.dedup();
        if !missing.is_empty() {
            // Decoded without the lock (it faults pages in and validates), so readers of
            // columns already decoded do not wait; a column two readers decoded at once is
            // kept once. Out-of-range indices are refused here, with the decoder's error.
            let (_, batches) = decode_parts(&self.buffer, Some(&missing), None)?;
            let mut decoded = self.lock();
            for (k, &i) in missing.iter().enumerate() {
                if decoded.columns[i].is_none() {
                    decoded.columns[i] =
                        Some(batches.iter().map(|b| b.column(k).clone()).collect());
                }
            }
        }
        let decoded = self.lock();
        let schema = match &decoded.schema {
            Some(schema) => Arc::new(schema.project(wanted)?),
            None => return Err(ArrowError::ParseError("no schema decoded".into())),
        };
        let columns: Vec<&[ArrayRef]> = wanted
            .iter()
            .map(|&i| decoded.columns[i].as_deref().unwrap_or_default())
            .collect();
        let batch_count = columns.first().map_or(0, |c| c.len());
        (0..batch_count)
            .map(|b| {
                let arrays = columns.iter().map(|c| c[b].clone()).collect();
                RecordBatch::try_new(schema.clone(), arrays)
            })
            .collect()
    }
}

/// Decodes the record batches of the IPC file in `buffer`, only the columns of `projection`
/// (in its order) when there is one: the others are neither read nor validated. With
/// `head`, decoding stops at the first batch that brings the rows to at least that many,
/// and later batches are not read either. The batches' buffers point into `buffer`
/// (64-byte aligned by our writer, so arrow does not realign by copying), each one its
/// own allocation (see [`own_allocations`]).
pub(crate) fn decode(
    buffer: &Buffer,
    projection: Option<&[usize]>,
    head: Option<usize>,
) -> Result<Vec<RecordBatch>, ArrowError> {
    decode_parts(buffer, projection, head).map(|(_, batches)| batches)
}

/// [`decode`], and the file's whole schema.
fn decode_parts(
    buffer: &Buffer,
    projection: Option<&[usize]>,
    head: Option<usize>,
) -> Result<(SchemaRef, Vec<RecordBatch>), ArrowError> {
    let corrupt = |what: &str| ArrowError::ParseError(format!("corrupt artifact file: {what}"));
    let len = buffer.len();
    if len < MIN_FILE_LEN {
        return Err(corrupt("too short"));
    }
    let trailer_start = len - TRAILER_LEN;
    let trailer: [u8; TRAILER_LEN] = buffer
        .as_slice()
        .get(trailer_start..)
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| corrupt("no trailer"))?;
    let footer_len = read_footer_length(trailer)?;
    let footer_bytes = trailer_start
        .checked_sub(footer_len)
        .and_then(|start| buffer.as_slice().get(start..trailer_start))
        .ok_or_else(|| corrupt("footer length out of range"))?;
    let footer = root_as_footer(footer_bytes)
        .map_err(|e| ArrowError::ParseError(format!("corrupt artifact footer: {e}")))?;
    let ipc_schema = footer.schema().ok_or_else(|| corrupt("no schema"))?;
    if !ipc_schema.endianness().equals_to_target_endianness() {
        return Err(corrupt("written on a machine of the other endianness"));
    }
    // arrow 59's conversion panics on a schema it cannot read: a damaged file is an error.
    let schema =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fb_to_schema(ipc_schema)))
            .map_err(|_| corrupt("its schema cannot be read"))?;
    if let Some(bad) = projection.and_then(|p| p.iter().find(|&&i| i >= schema.fields().len())) {
        return Err(ArrowError::SchemaError(format!(
            "column {bad} asked for, the table has {}",
            schema.fields().len()
        )));
    }
    let schema = Arc::new(schema);
    let mut decoder = FileDecoder::new(schema.clone(), footer.version());
    if let Some(p) = projection {
        decoder = decoder.with_projection(p.to_vec());
    }

    for block in footer.dictionaries().iter().flatten() {
        decoder.read_dictionary(block, &block_data(buffer, block)?)?;
    }
    let blocks = footer
        .recordBatches()
        .ok_or_else(|| corrupt("no record batch index"))?;
    let mut batches = Vec::with_capacity(blocks.len());
    let mut rows = 0usize;
    for block in blocks {
        if head.is_some_and(|head| rows >= head) {
            break;
        }
        let data = block_data(buffer, block)?;
        // arrow 59 asserts and unwraps on some buffer counts that do not match the schema
        // (a skipped column's, for one): a damaged file is an error here, not a panic.
        let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            decoder.read_record_batch(block, &data)
        }))
        .map_err(|_| corrupt("a record batch does not match the schema"))?;
        if let Some(batch) = read? {
            rows = rows.saturating_add(batch.num_rows());
            batches.push(own_allocations(&batch)?);
        }
    }
    Ok((schema, batches))
}

/// The bytes of one block, checked to lie inside the file: `Buffer::slice_with_length`
/// panics on a range outside it, and a damaged file must give an error, not a panic.
fn block_data(buffer: &Buffer, block: &Block) -> Result<Buffer, ArrowError> {
    let out_of_range =
        || ArrowError::ParseError("corrupt artifact file: block out of range".into());
    let offset = usize::try_from(block.offset()).map_err(|_| out_of_range())?;
    let meta_len = usize::try_from(block.metaDataLength()).map_err(|_| out_of_range())?;
    let body_len = usize::try_from(block.bodyLength()).map_err(|_| out_of_range())?;
    let block_len = meta_len.checked_add(body_len).ok_or_else(out_of_range)?;
    let end = offset.checked_add(block_len).ok_or_else(out_of_range)?;
    if end > buffer.len() || meta_len < 8 {
        return Err(out_of_range());
    }
    Ok(buffer.slice_with_length(offset, block_len))
}

/// `batch` with each buffer of each column an allocation of its own over the same bytes.
///
/// Engines count a batch's memory by its buffers' capacity, buffer by buffer: as decoded,
/// every buffer is a slice of the mapping and reports all of it, so each batch an operator
/// keeps would weigh the whole file (a sort's top rows of a 10M-row table "needed"
/// gigabytes). Nothing is copied.
fn own_allocations(batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
    let columns = batch
        .columns()
        .iter()
        .map(|c| make_array(own_data(c.to_data())))
        .collect();
    let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    RecordBatch::try_new_with_options(batch.schema(), columns, &options)
}

#[expect(
    unsafe_code,
    reason = "the same validated array over re-wrapped buffers has no safe constructor"
)]
fn own_data(data: ArrayData) -> ArrayData {
    let buffers: Vec<Buffer> = data.buffers().iter().map(own_buffer).collect();
    let children: Vec<ArrayData> = data.child_data().iter().cloned().map(own_data).collect();
    let nulls = data.nulls().map(|n| {
        NullBuffer::new(BooleanBuffer::new(
            own_buffer(n.buffer()),
            n.offset(),
            n.len(),
        ))
    });
    let builder = data
        .into_builder()
        .buffers(buffers)
        .child_data(children)
        .nulls(nulls);
    // SAFETY: the same bytes, lengths and offsets as the array the decoder built and
    // validated; only the owner each buffer reports changed.
    unsafe { builder.build_unchecked() }
}

#[expect(
    unsafe_code,
    reason = "bytes lent to arrow as their own allocation have no safe API"
)]
fn own_buffer(buffer: &Buffer) -> Buffer {
    let Some(ptr) = NonNull::new(buffer.as_ptr().cast_mut()) else {
        return buffer.clone();
    };
    // SAFETY: `ptr` points to `buffer.len()` readable bytes, and the owner handed to arrow
    // is a clone of `buffer`, which holds them (the mapping) alive for as long as any
    // buffer made from this one exists. Nothing writes to a mapped artifact file (see
    // `map_file`), and arrow never writes through an immutable `Buffer`.
    unsafe { Buffer::from_custom_allocation(ptr, buffer.len(), Arc::new(buffer.clone())) }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use arrow_array::{ArrayRef, Int64Array, StringArray};
    use arrow_ipc::writer::FileWriter;

    use super::*;

    fn sample_file(dir: &std::path::Path) -> (std::path::PathBuf, Vec<RecordBatch>) {
        let batches: Vec<RecordBatch> = (0..3)
            .map(|b| {
                let ints: ArrayRef = Arc::new(Int64Array::from_iter(
                    (0..1000).map(|i| (i % 7 != 0).then_some(b * 1000 + i)),
                ));
                let strs: ArrayRef = Arc::new(StringArray::from_iter(
                    (0..1000).map(|i| (i % 5 != 0).then(|| format!("v{b}-{i}"))),
                ));
                RecordBatch::try_from_iter([("n", ints), ("s", strs)]).unwrap()
            })
            .collect();
        let path = dir.join("t.arrow");
        let mut w =
            FileWriter::try_new(File::create(&path).unwrap(), &batches[0].schema()).unwrap();
        for b in &batches {
            w.write(b).unwrap();
        }
        w.finish().unwrap();
        (path, batches)
    }

    /// Makes the second byte of the first occurrence of `text` in the file invalid UTF-8
    /// and maps the damaged file.
    fn with_invalid_utf8(path: &std::path::Path, text: &[u8]) -> Buffer {
        let mut bytes = std::fs::read(path).unwrap();
        let at = bytes
            .windows(text.len())
            .position(|w| w == text)
            .expect("the text in the file");
        bytes[at + 1] = 0xff;
        std::fs::write(path, &bytes).unwrap();
        map_file(&File::open(path).unwrap()).unwrap()
    }

    #[test]
    fn batches_point_into_the_mapping() {
        let dir = tempfile::tempdir().unwrap();
        let (path, written) = sample_file(dir.path());
        let buffer = map_file(&File::open(&path).unwrap()).unwrap();
        let range = buffer.as_ptr() as usize..buffer.as_ptr() as usize + buffer.len();
        let read = decode(&buffer, None, None).unwrap();
        assert_eq!(read, written);
        let mut checked = 0;
        for batch in &read {
            for column in batch.columns() {
                let data = column.to_data();
                let nulls = data.nulls().map(|n| n.buffer().clone());
                for buf in data.buffers().iter().chain(nulls.iter()) {
                    let p = buf.as_ptr() as usize;
                    assert!(range.contains(&p), "buffer copied out of the mapping");
                    checked += 1;
                }
            }
        }
        // 3 batches × (n: values + nulls, s: offsets + values + nulls)
        assert_eq!(checked, 15);
    }

    #[test]
    fn a_batch_counts_its_own_block_not_the_whole_mapping() {
        // Engines budget memory by `get_array_memory_size` (buffer capacity, once per
        // buffer): were each block a slice of one file-sized buffer, every batch would
        // weigh the whole file and a sort over a large table would run out of budget.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("many.arrow");
        let batch = |b: i64| {
            let ints: ArrayRef = Arc::new(Int64Array::from_iter_values(b * 1000..b * 1000 + 1000));
            let long: ArrayRef = Arc::new(StringArray::from_iter_values(
                (0..1000).map(|i| format!("{i:0>100}")),
            ));
            RecordBatch::try_from_iter([("n", ints), ("long", long)]).unwrap()
        };
        let mut w = FileWriter::try_new(File::create(&path).unwrap(), &batch(0).schema()).unwrap();
        for b in 0..40 {
            w.write(&batch(b)).unwrap();
        }
        w.finish().unwrap();
        let buffer = map_file(&File::open(&path).unwrap()).unwrap();
        let read = decode(&buffer, None, None).unwrap();
        assert_eq!(read.len(), 40);
        let file_len = buffer.len();
        for batch in &read {
            let size = batch.get_array_memory_size();
            assert!(
                size * 10 < file_len,
                "one batch of 40 weighs {size} of the file's {file_len} bytes"
            );
            // Nor does a narrow column weigh its batch's wide one.
            let ints = batch.column(0).get_array_memory_size();
            assert!(ints < 8_000 + 1_000, "1,000 integers weigh {ints} bytes");
        }
    }

    #[test]
    fn damaged_files_are_errors_not_panics() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = sample_file(dir.path());
        let good = std::fs::read(&path).unwrap();
        let len = good.len();
        let mut cases: Vec<Vec<u8>> = vec![
            vec![],
            b"ARROW1".to_vec(),
            good[..len / 2].to_vec(),
            good[len / 2..].to_vec(),
        ];
        // A footer length pointing before the start of the file.
        let mut huge_footer = good.clone();
        huge_footer[len - 10..len - 6].copy_from_slice(&i32::MAX.to_le_bytes());
        cases.push(huge_footer);
        // Garbage everywhere except the trailer.
        let mut scrambled = good.clone();
        for b in &mut scrambled[8..len - 10] {
            *b = b.wrapping_mul(31).wrapping_add(7);
        }
        cases.push(scrambled);
        for (i, bytes) in cases.iter().enumerate() {
            let p = dir.path().join(format!("bad{i}.arrow"));
            File::create(&p).unwrap().write_all(bytes).unwrap();
            let file = File::open(&p).unwrap();
            let result = map_file(&file)
                .map_err(ArrowError::from)
                .and_then(|b| decode(&b, None, None));
            assert!(result.is_err(), "case {i} decoded");
            // Skipping a column reads the file along another path: still an error.
            let projected = map_file(&file)
                .map_err(ArrowError::from)
                .and_then(|b| decode(&b, Some(&[1]), None));
            assert!(projected.is_err(), "case {i} decoded with a projection");
        }
    }

    #[test]
    fn a_projection_decodes_only_its_columns_in_its_order() {
        let dir = tempfile::tempdir().unwrap();
        let (path, written) = sample_file(dir.path());
        let buffer = map_file(&File::open(&path).unwrap()).unwrap();
        let swapped = decode(&buffer, Some(&[1, 0]), None).unwrap();
        let only_s = decode(&buffer, Some(&[1]), None).unwrap();
        let none = decode(&buffer, Some(&[]), None).unwrap();
        for (i, w) in written.iter().enumerate() {
            assert_eq!(swapped[i], w.project(&[1, 0]).unwrap());
            assert_eq!(only_s[i], w.project(&[1]).unwrap());
            // No column, still the row count (`SELECT count(*)`).
            assert_eq!(none[i].num_columns(), 0);
            assert_eq!(none[i].num_rows(), w.num_rows());
        }
        let err = decode(&buffer, Some(&[0, 2]), None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("column 2 asked for, the table has 2"), "{err}");
    }

    #[test]
    fn an_unread_column_is_not_validated() {
        // Invalid UTF-8 in `s`: an error when `s` is read, none when only `n` is.
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = sample_file(dir.path());
        let buffer = with_invalid_utf8(&path, b"v0-1v0");
        let err = decode(&buffer, None, None).unwrap_err().to_string();
        assert!(err.contains("utf"), "{err}");
        assert_eq!(decode(&buffer, Some(&[0]), None).unwrap().len(), 3);
    }

    #[test]
    fn a_head_decodes_only_the_batches_that_hold_it() {
        // Invalid UTF-8 in the last batch: read whole, an error; its head, not read at all.
        let dir = tempfile::tempdir().unwrap();
        let (path, written) = sample_file(dir.path());
        let buffer = with_invalid_utf8(&path, b"v2-1v2");
        assert!(decode(&buffer, None, None).is_err());
        for (head, batches) in [(0, 0), (1, 1), (1000, 1), (1001, 2), (2000, 2)] {
            let read = decode(&buffer, None, Some(head)).unwrap();
            assert_eq!(read, written[..batches], "head {head}");
        }
        assert!(decode(&buffer, None, Some(2001)).is_err());
    }
}
