//! Which bytes of a stored Arrow IPC file a read of some columns needs, for a table whose
//! bytes are fetched in parts ([`Parts`]): the trailer and footer, every record batch's
//! metadata, and the buffers of the columns read, batch by batch. Each step reads only
//! what the step before fetched. A file this cannot lay out (dictionaries, compressed
//! bodies, a type whose buffers it does not count) is fetched whole: never a guess.

use std::ops::Range;

use arrow_buffer::Buffer;
use arrow_ipc::{Block, root_as_footer, root_as_message};
use arrow_schema::DataType;

use crate::StoreError;
use crate::backend::Parts;

const TRAILER_LEN: u64 = 10;
const CONTINUATION: [u8; 4] = [0xff; 4];

/// Fetches into `parts` what decoding the columns of `projection` (every column without
/// one) of the file mapped as `buffer` reads.
pub(crate) fn fetch_columns(
    buffer: &Buffer,
    parts: &dyn Parts,
    projection: Option<&[usize]>,
) -> Result<(), StoreError> {
    let len = buffer.len() as u64;
    let whole = || parts.fetch(std::slice::from_ref(&(0..len)));
    let Some(projection) = projection else {
        return whole();
    };
    let Some(trailer_start) = len.checked_sub(TRAILER_LEN).filter(|&s| s >= 8) else {
        return whole();
    };
    parts.fetch(std::slice::from_ref(&(trailer_start..len)))?;
    let bytes = buffer.as_slice();
    let Some(footer) = footer_range(bytes, trailer_start) else {
        return whole();
    };
    parts.fetch(std::slice::from_ref(&footer))?;
    let Some(blocks) = layout(&bytes[to_usize(footer.start)..to_usize(footer.end)]) else {
        return whole();
    };
    let metas: Vec<Range<u64>> = blocks.iter().map(|b| b.meta.clone()).collect();
    if metas.iter().any(|m| m.end > len) {
        return whole();
    }
    parts.fetch(&metas)?;
    let mut needed = Vec::new();
    for block in &blocks {
        match block.buffers(bytes, projection) {
            Some(ranges) => needed.extend(ranges),
            None => return whole(),
        }
    }
    if needed.iter().any(|r| r.end > len) {
        return whole();
    }
    parts.fetch(&needed)
}

fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// Where the footer lies, from the trailer (`<footer length: i32><ARROW1>`).
fn footer_range(bytes: &[u8], trailer_start: u64) -> Option<Range<u64>> {
    let at = to_usize(trailer_start);
    let trailer = bytes.get(at..at + 10)?;
    if &trailer[4..] != b"ARROW1" {
        return None;
    }
    let footer_len = u64::try_from(i32::from_le_bytes(trailer[..4].try_into().ok()?)).ok()?;
    let start = trailer_start.checked_sub(footer_len)?;
    Some(start..trailer_start)
}

/// One record batch of the file: its metadata's bytes and its body's start, and how many
/// buffers each column has.
struct Batch {
    meta: Range<u64>,
    body: u64,
    counts: std::sync::Arc<[usize]>,
}

/// The record batches the footer lists, and how many buffers each column has; `None`
/// for a file this does not lay out.
fn layout(footer: &[u8]) -> Option<Vec<Batch>> {
    let footer = root_as_footer(footer).ok()?;
    if footer.dictionaries().is_some_and(|d| !d.is_empty()) {
        return None;
    }
    let schema = footer.schema()?;
    // arrow 59's conversion panics on a schema it cannot read: fetched whole, the decoder
    // then says what is wrong with it.
    let schema = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        arrow_ipc::convert::fb_to_schema(schema)
    }))
    .ok()?;
    let counts: std::sync::Arc<[usize]> = schema
        .fields()
        .iter()
        .map(|f| buffer_count(f.data_type()))
        .collect::<Option<Vec<usize>>>()?
        .into();
    footer
        .recordBatches()?
        .iter()
        .map(|b: &Block| {
            let offset = u64::try_from(b.offset()).ok()?;
            let meta_len = u64::try_from(b.metaDataLength()).ok()?;
            Some(Batch {
                meta: offset..offset.checked_add(meta_len)?,
                body: offset.checked_add(meta_len)?,
                counts: counts.clone(),
            })
        })
        .collect()
}

/// The buffers a column of `data_type` has in a record batch's body (validity first),
/// for the types whose count is fixed; `None` for the others.
fn buffer_count(data_type: &DataType) -> Option<usize> {
    use DataType::*;
    match data_type {
        Boolean | Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 | Float16
        | Float32 | Float64 | Timestamp(..) | Date32 | Date64 | Time32(_) | Time64(_)
        | Duration(_) | Interval(_) | FixedSizeBinary(_) | Decimal32(..) | Decimal64(..)
        | Decimal128(..) | Decimal256(..) => Some(2),
        Binary | LargeBinary | Utf8 | LargeUtf8 => Some(3),
        _ => None,
    }
}

impl Batch {
    /// The ranges of the file holding the buffers of `columns` in this batch; `None` when
    /// its metadata does not lay them out as the schema says.
    fn buffers(&self, bytes: &[u8], columns: &[usize]) -> Option<Vec<Range<u64>>> {
        let meta = bytes.get(to_usize(self.meta.start)..to_usize(self.meta.end))?;
        let meta = match meta.get(..4)? {
            m if m == CONTINUATION => meta.get(4..)?,
            _ => meta,
        };
        let len =
            to_usize(u64::try_from(i32::from_le_bytes(meta.get(..4)?.try_into().ok()?)).ok()?);
        let message = root_as_message(meta.get(4..4usize.checked_add(len)?)?).ok()?;
        let batch = message.header_as_record_batch()?;
        if batch.compression().is_some() {
            return None;
        }
        let buffers = batch.buffers()?;
        if buffers.len() != self.counts.iter().sum::<usize>() {
            return None;
        }
        let mut ranges = Vec::new();
        for &column in columns {
            let first: usize = self.counts.get(..column)?.iter().sum();
            for i in first..first + *self.counts.get(column)? {
                let b = buffers.get(i);
                let start = self.body.checked_add(u64::try_from(b.offset()).ok()?)?;
                let len = u64::try_from(b.length()).ok()?;
                if len > 0 {
                    ranges.push(start..start.checked_add(len)?);
                }
            }
        }
        Some(ranges)
    }
}

/// Refuses `batches` (decoded from the file mapped as `buffer`) if any of their buffers
/// lies where nothing was fetched: a column read from zeros is never an answer, whatever
/// the layout above got wrong. (A fault of ours, not of the bytes: a server error.)
pub(crate) fn check_fetched(
    buffer: &Buffer,
    parts: &dyn Parts,
    batches: &[arrow_array::RecordBatch],
    data_ref: &dataref_protocol::DataRef,
) -> Result<(), StoreError> {
    let base = buffer.as_ptr() as usize;
    let end = base + buffer.len();
    let mut unfetched = None;
    let mut check = |b: &Buffer| {
        let at = b.as_ptr() as usize;
        if b.is_empty() || at < base || at >= end || unfetched.is_some() {
            return;
        }
        let start = (at - base) as u64;
        let range = start..start + b.len() as u64;
        if !parts.holds(range.clone()) {
            unfetched = Some(range);
        }
    };
    for batch in batches {
        for column in batch.columns() {
            walk(&column.to_data(), &mut check);
        }
    }
    match unfetched {
        None => Ok(()),
        Some(range) => {
            tracing::error!(%data_ref, ?range, "a column was decoded from bytes never fetched");
            Err(StoreError::Arrow(arrow_schema::ArrowError::ExternalError(
                format!(
                    "`{}`: its bytes {}..{} were decoded before they were fetched",
                    data_ref, range.start, range.end
                )
                .into(),
            )))
        }
    }
}

fn walk(data: &arrow_data::ArrayData, check: &mut impl FnMut(&Buffer)) {
    for b in data.buffers() {
        check(b);
    }
    if let Some(nulls) = data.nulls() {
        check(nulls.buffer());
    }
    for child in data.child_data() {
        walk(child, check);
    }
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::os::unix::fs::FileExt;
    use std::sync::{Arc, Mutex};

    use arrow_array::{
        ArrayRef, BooleanArray, Date32Array, Decimal128Array, DictionaryArray, Float64Array,
        Int64Array, LargeStringArray, RecordBatch, StringArray, TimestampMicrosecondArray,
        types::Int32Type,
    };
    use arrow_ipc::writer::FileWriter;

    use super::*;
    use crate::local::mapped::{decode, map_file};

    /// Parts copied, exactly the ranges asked for, from a file's bytes into a file of
    /// holes.
    #[derive(Debug)]
    struct Copied {
        source: Vec<u8>,
        file: File,
        fetched: Mutex<Vec<Range<u64>>>,
    }

    impl Copied {
        fn new(source: Vec<u8>, dir: &std::path::Path) -> Arc<Self> {
            let file = File::options()
                .read(true)
                .write(true)
                .create_new(true)
                .open(dir.join("parts"))
                .unwrap();
            file.set_len(source.len() as u64).unwrap();
            Arc::new(Self {
                source,
                file,
                fetched: Mutex::default(),
            })
        }

        fn bytes(&self) -> u64 {
            let mut ranges = self.fetched.lock().unwrap().clone();
            ranges.sort_by_key(|r| r.start);
            let (mut total, mut end) = (0, 0);
            for r in ranges {
                let start = r.start.max(end);
                if r.end > start {
                    total += r.end - start;
                    end = r.end;
                }
            }
            total
        }
    }

    impl Parts for Copied {
        fn file(&self) -> &File {
            &self.file
        }

        fn fetch(&self, ranges: &[Range<u64>]) -> Result<(), StoreError> {
            for r in ranges {
                let (s, e) = (r.start as usize, r.end as usize);
                self.file.write_all_at(&self.source[s..e], r.start).unwrap();
                self.fetched.lock().unwrap().push(r.clone());
            }
            Ok(())
        }

        fn holds(&self, range: Range<u64>) -> bool {
            let fetched = self.fetched.lock().unwrap();
            (range.start..range.end).all(|at| fetched.iter().any(|r| r.contains(&at)))
        }
    }

    fn a_ref() -> dataref_protocol::DataRef {
        dataref_protocol::DataRef::from_random_bytes([7; 16])
    }

    fn file_of(batches: &[RecordBatch]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut w = FileWriter::try_new(&mut out, &batches[0].schema()).unwrap();
        for b in batches {
            w.write(b).unwrap();
        }
        w.finish().unwrap();
        drop(w);
        out
    }

    fn typed(b: i64) -> RecordBatch {
        let n = 3000;
        let cols: Vec<(&str, ArrayRef)> = vec![
            (
                "i",
                Arc::new(Int64Array::from_iter(
                    (0..n).map(|i| (i % 7 != 0).then_some(b * n + i)),
                )),
            ),
            (
                "s",
                Arc::new(StringArray::from_iter(
                    (0..n).map(|i| (i % 5 != 0).then(|| format!("s{b}-{i}"))),
                )),
            ),
            (
                "f",
                Arc::new(Float64Array::from_iter_values(
                    (0..n).map(|i| i as f64 / 3.0),
                )),
            ),
            (
                "t",
                Arc::new(BooleanArray::from_iter(
                    (0..n).map(|i| (i % 3 != 0).then_some(i % 2 == 0)),
                )),
            ),
            (
                "d",
                Arc::new(Date32Array::from_iter_values((0..n).map(|i| i as i32))),
            ),
            (
                "ts",
                Arc::new(
                    TimestampMicrosecondArray::from_iter_values((0..n).map(|i| i * 1_000_000))
                        .with_timezone("UTC"),
                ),
            ),
            (
                "m",
                Arc::new(
                    Decimal128Array::from_iter_values((0..n).map(i128::from))
                        .with_precision_and_scale(20, 2)
                        .unwrap(),
                ),
            ),
            (
                "l",
                Arc::new(LargeStringArray::from_iter_values(
                    (0..n).map(|i| format!("l{i}")),
                )),
            ),
        ];
        RecordBatch::try_from_iter(cols).unwrap()
    }

    /// Each column alone, and two together, from a file of holes filled with what
    /// `fetch_columns` asked for: the same values as from the whole file, and only a part
    /// of it fetched.
    #[test]
    fn the_columns_read_are_the_bytes_fetched() {
        let written: Vec<RecordBatch> = (0..4).map(typed).collect();
        let bytes = file_of(&written);
        let width = written[0].num_columns();
        let mut projections: Vec<Vec<usize>> = (0..width).map(|c| vec![c]).collect();
        projections.push(vec![5, 1]);
        projections.push(vec![]);
        for projection in projections {
            let dir = tempfile::tempdir().unwrap();
            let parts = Copied::new(bytes.clone(), dir.path());
            let buffer = map_file(parts.file()).unwrap();
            fetch_columns(&buffer, parts.as_ref(), Some(&projection)).unwrap();
            let read = decode(&buffer, Some(&projection), None).unwrap();
            check_fetched(&buffer, parts.as_ref(), &read, &a_ref()).unwrap();
            let whole: Vec<RecordBatch> = written
                .iter()
                .map(|b| b.project(&projection).unwrap())
                .collect();
            assert_eq!(read.len(), whole.len(), "{projection:?}");
            for (r, w) in read.iter().zip(&whole) {
                assert_eq!(r.columns(), w.columns(), "{projection:?}");
                assert_eq!(r.num_rows(), w.num_rows(), "{projection:?}");
            }
            assert!(
                parts.bytes() < bytes.len() as u64 / 2,
                "{projection:?}: {} of {} bytes",
                parts.bytes(),
                bytes.len()
            );
        }
    }

    /// A file this does not lay out (a dictionary column) is fetched whole; a column
    /// decoded from bytes never fetched is refused.
    #[test]
    fn what_cannot_be_laid_out_is_fetched_whole_and_holes_are_never_read() {
        let keys: DictionaryArray<Int32Type> = (0..500).map(|i| ["a", "b", "c"][i % 3]).collect();
        let batch = RecordBatch::try_from_iter([
            ("k", Arc::new(keys) as ArrayRef),
            (
                "i",
                Arc::new(Int64Array::from_iter_values(0..500)) as ArrayRef,
            ),
        ])
        .unwrap();
        let bytes = file_of(std::slice::from_ref(&batch));
        let dir = tempfile::tempdir().unwrap();
        let parts = Copied::new(bytes.clone(), dir.path());
        let buffer = map_file(parts.file()).unwrap();
        fetch_columns(&buffer, parts.as_ref(), Some(&[1])).unwrap();
        assert_eq!(parts.bytes(), bytes.len() as u64);

        let written: Vec<RecordBatch> = (0..2).map(typed).collect();
        let bytes = file_of(&written);
        let dir = tempfile::tempdir().unwrap();
        let parts = Copied::new(bytes.clone(), dir.path());
        let buffer = map_file(parts.file()).unwrap();
        fetch_columns(&buffer, parts.as_ref(), Some(&[0])).unwrap();
        // Column 2 was never fetched: decoding it reads zeros, which must not pass.
        let read = decode(&buffer, Some(&[2]), None).unwrap();
        let e = check_fetched(&buffer, parts.as_ref(), &read, &a_ref()).unwrap_err();
        assert!(e.to_string().contains("before they were fetched"), "{e}");
    }
}
