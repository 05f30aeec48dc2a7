//! Reading Arrow IPC files that come from outside the store (a sandbox's `outputs`, a
//! workspace `.arrow` file): the one way such a file is read.
//!
//! The Arrow reader trusts the file's footer: a block with a negative length makes it
//! panic, a buffer past the end of its block makes it slice out of bounds. So before the
//! reader sees a byte, [`UntrustedIpc::open`] checks the file's structure itself — magic
//! bytes, footer length, the footer flatbuffer (verified), the schema, and for every
//! dictionary and record-batch block that its offset and lengths lie inside the file and
//! that each buffer its message names lies inside the block's body. And every call into
//! the reader still runs under `catch_unwind`, so a case the checks miss is reported as a
//! malformed file, never as a dead thread.
//!
//! ```no_run
//! # fn main() -> Result<(), dataref_store::MalformedIpc> {
//! let file = std::fs::File::open("out.arrow").map_err(|e| dataref_store::MalformedIpc::new(e.to_string()))?;
//! let table = dataref_store::UntrustedIpc::open(file)?;
//! for batch in table.batches()? {
//!     let batch = batch?;
//! #   let _ = batch;
//! }
//! # Ok(()) }
//! ```

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::panic::{AssertUnwindSafe, catch_unwind};

use arrow_array::RecordBatch;
use arrow_ipc::reader::FileReader;
use arrow_schema::SchemaRef;

const MAGIC: &[u8; 6] = b"ARROW1";
/// `ARROW1` plus two bytes of padding.
const HEADER_BYTES: u64 = 8;
/// The footer length (i32) and `ARROW1`.
const TRAILER_BYTES: u64 = 10;
const CONTINUATION: [u8; 4] = [0xff; 4];
/// A footer or one message's metadata larger than this is refused unread: a real one is a
/// few kilobytes, even for thousands of columns.
const MAX_METADATA_BYTES: u64 = 64 << 20;

/// Why a file is not a readable Arrow IPC file. The message says what is wrong in terms
/// the writer of the file can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct MalformedIpc {
    reason: String,
}

impl MalformedIpc {
    pub fn new(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
        }
    }

    pub fn reason(&self) -> &str {
        &self.reason
    }
}

fn bad(reason: impl Into<String>) -> MalformedIpc {
    MalformedIpc::new(reason)
}

/// An Arrow IPC file whose structure has been checked.
#[derive(Debug)]
pub struct UntrustedIpc {
    file: File,
    schema: SchemaRef,
    batches: usize,
}

impl UntrustedIpc {
    /// Checks the file's structure (see the module docs) and its schema.
    pub fn open(file: File) -> Result<Self, MalformedIpc> {
        let mut file = file;
        let batches = check_structure(&mut file)?;
        rewind(&mut file)?;
        let schema = guarded(|| {
            FileReader::try_new(&mut file, None)
                .map(|r| r.schema())
                .map_err(|e| bad(e.to_string()))
        })?;
        Ok(Self {
            file,
            schema,
            batches,
        })
    }

    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// Record batches the footer lists.
    pub fn batch_count(&self) -> usize {
        self.batches
    }

    /// The batches, one at a time; every step of the reader runs under `catch_unwind`.
    pub fn batches(self) -> Result<UntrustedBatches, MalformedIpc> {
        let mut file = self.file;
        rewind(&mut file)?;
        let reader = guarded(|| FileReader::try_new(file, None).map_err(|e| bad(e.to_string())))?;
        Ok(UntrustedBatches {
            reader: Some(reader),
        })
    }

    /// Reads every batch (so a corrupt body is found now, not by a later reader) and returns
    /// the schema, the row count and the file, rewound.
    pub fn validate(self) -> Result<(SchemaRef, u64, File), MalformedIpc> {
        let schema = self.schema.clone();
        // A second descriptor of the same open file (it shares the offset, rewound below).
        let mut file = self.file.try_clone().map_err(|e| bad(e.to_string()))?;
        let mut rows = 0u64;
        for batch in self.batches()? {
            rows += batch?.num_rows() as u64;
        }
        rewind(&mut file)?;
        Ok((schema, rows, file))
    }
}

/// Record batches of an [`UntrustedIpc`]. After the first error it yields nothing more.
pub struct UntrustedBatches {
    reader: Option<FileReader<File>>,
}

impl std::fmt::Debug for UntrustedBatches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UntrustedBatches").finish_non_exhaustive()
    }
}

impl Iterator for UntrustedBatches {
    type Item = Result<RecordBatch, MalformedIpc>;

    fn next(&mut self) -> Option<Self::Item> {
        let reader = self.reader.as_mut()?;
        let step = catch_unwind(AssertUnwindSafe(|| reader.next()));
        let item = match step {
            Ok(Some(Ok(batch))) => return Some(Ok(batch)),
            Ok(None) => None,
            Ok(Some(Err(e))) => Some(Err(bad(e.to_string()))),
            Err(panic) => Some(Err(bad(panic_reason(&*panic)))),
        };
        // A reader that failed or panicked is in no state to go on.
        self.reader = None;
        item
    }
}

/// Runs `f`, turning a panic into [`MalformedIpc`].
fn guarded<T>(f: impl FnOnce() -> Result<T, MalformedIpc>) -> Result<T, MalformedIpc> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|panic| Err(bad(panic_reason(&*panic))))
}

fn panic_reason(panic: &(dyn std::any::Any + Send)) -> String {
    let detail = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    format!("the Arrow reader rejected its structure ({detail})")
}

fn rewind(file: &mut File) -> Result<(), MalformedIpc> {
    file.seek(SeekFrom::Start(0))
        .map(drop)
        .map_err(|e| bad(format!("could not be read: {e}")))
}

fn read_at(file: &mut File, offset: u64, len: u64) -> Result<Vec<u8>, MalformedIpc> {
    file.seek(SeekFrom::Start(offset))
        .map_err(|e| bad(format!("could not be read: {e}")))?;
    let mut buf = Vec::new();
    file.take(len)
        .read_to_end(&mut buf)
        .map_err(|e| bad(format!("could not be read: {e}")))?;
    if buf.len() as u64 != len {
        return Err(bad("the file ends early"));
    }
    Ok(buf)
}

/// The structural checks; returns the number of record batches.
fn check_structure(file: &mut File) -> Result<usize, MalformedIpc> {
    let len = file
        .metadata()
        .map_err(|e| bad(format!("could not be read: {e}")))?
        .len();
    if len < HEADER_BYTES + TRAILER_BYTES {
        return Err(bad(format!(
            "{len} bytes is too short for an Arrow IPC file (is it the stream format? write it with `pyarrow.ipc.new_file` or `df.to_feather(..., compression=\"uncompressed\")`)"
        )));
    }
    let head = read_at(file, 0, 6)?;
    let trailer = read_at(file, len - TRAILER_BYTES, TRAILER_BYTES)?;
    if head != MAGIC || trailer[4..] != MAGIC[..] {
        return Err(bad(
            "no `ARROW1` magic at its start and end: not an Arrow IPC file (the stream format and Parquet are not read here)",
        ));
    }
    let footer_len = i32::from_le_bytes([trailer[0], trailer[1], trailer[2], trailer[3]]);
    let footer_len = u64::try_from(footer_len).map_err(|_| {
        bad(format!(
            "its footer declares a negative length ({footer_len})"
        ))
    })?;
    let body_end = (len - TRAILER_BYTES)
        .checked_sub(footer_len)
        .filter(|end| *end >= HEADER_BYTES)
        .ok_or_else(|| {
            bad(format!(
                "its footer declares {footer_len} bytes, more than the file holds"
            ))
        })?;
    if footer_len > MAX_METADATA_BYTES {
        return Err(bad(format!("its footer is {footer_len} bytes")));
    }
    let footer_bytes = read_at(file, body_end, footer_len)?;
    let footer = arrow_ipc::root_as_footer(&footer_bytes)
        .map_err(|e| bad(format!("its footer is not valid: {e}")))?;
    let schema = footer
        .schema()
        .ok_or_else(|| bad("its footer has no schema"))?;
    guarded(|| {
        // arrow 59's conversion panics on what it cannot read; `guarded` makes that an error.
        drop(arrow_ipc::convert::fb_to_schema(schema));
        Ok(())
    })?;
    let dictionaries: Vec<arrow_ipc::Block> = footer
        .dictionaries()
        .map(|d| d.iter().copied().collect())
        .unwrap_or_default();
    let batches: Vec<arrow_ipc::Block> = footer
        .recordBatches()
        .map(|b| b.iter().copied().collect())
        .unwrap_or_default();
    for (kind, blocks) in [("dictionary", &dictionaries), ("record batch", &batches)] {
        for (i, block) in blocks.iter().enumerate() {
            check_block(file, block, body_end)
                .map_err(|reason| bad(format!("{kind} block {i} in its footer {reason}")))?;
        }
    }
    Ok(batches.len())
}

/// One block: inside the file, and its message's buffers inside its body.
fn check_block(file: &mut File, block: &arrow_ipc::Block, end: u64) -> Result<(), String> {
    let (offset, meta_len, body_len) = (block.offset(), block.metaDataLength(), block.bodyLength());
    let offset = u64::try_from(offset).map_err(|_| format!("has a negative offset ({offset})"))?;
    let meta_len = u64::try_from(meta_len)
        .map_err(|_| format!("declares a negative metadata length ({meta_len})"))?;
    let body_len = u64::try_from(body_len)
        .map_err(|_| format!("declares a negative body length ({body_len})"))?;
    if offset < HEADER_BYTES {
        return Err(format!("starts at byte {offset}, inside the file header"));
    }
    if !(8..=MAX_METADATA_BYTES).contains(&meta_len) {
        return Err(format!("declares a metadata length of {meta_len} bytes"));
    }
    offset
        .checked_add(meta_len)
        .and_then(|n| n.checked_add(body_len))
        .filter(|n| *n <= end)
        .ok_or_else(|| {
            format!(
                "reaches past the data ({offset} + {meta_len} + {body_len} bytes, the data ends at {end})"
            )
        })?;
    let meta = read_at(file, offset, meta_len).map_err(|e| e.to_string())?;
    let flatbuffer = if meta[..4] == CONTINUATION {
        &meta[8..]
    } else {
        &meta[4..]
    };
    let message = arrow_ipc::root_as_message(flatbuffer)
        .map_err(|e| format!("holds a message that is not valid: {e}"))?;
    let batch = match message.header_type() {
        arrow_ipc::MessageHeader::RecordBatch => message.header_as_record_batch(),
        arrow_ipc::MessageHeader::DictionaryBatch => {
            message.header_as_dictionary_batch().and_then(|d| d.data())
        }
        other => return Err(format!("holds a {other:?} message, not a batch")),
    }
    .ok_or_else(|| "holds a batch message without its header".to_owned())?;
    let declared = message.bodyLength();
    if u64::try_from(declared).ok() != Some(body_len) {
        return Err(format!(
            "declares a body of {body_len} bytes but its message says {declared}"
        ));
    }
    if batch.length() < 0 {
        return Err(format!("has a negative row count ({})", batch.length()));
    }
    for (i, buffer) in batch.buffers().into_iter().flatten().enumerate() {
        let (start, len) = (buffer.offset(), buffer.length());
        let fits = u64::try_from(start)
            .ok()
            .zip(u64::try_from(len).ok())
            .and_then(|(s, l)| s.checked_add(l))
            .is_some_and(|e| e <= body_len);
        if !fits {
            return Err(format!(
                "names buffer {i} at {start}..+{len}, outside its {body_len}-byte body"
            ));
        }
    }
    for node in batch.nodes().into_iter().flatten() {
        if node.length() < 0 || node.null_count() < 0 {
            return Err("has a column with a negative length or null count".to_owned());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::Arc;

    use arrow_array::{Int64Array, StringArray};
    use arrow_schema::{DataType, Field, Schema};

    use super::*;

    fn valid_file() -> Vec<u8> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("n", DataType::Int64, false),
            Field::new("s", DataType::Utf8, true),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(vec![1, 2, 3])),
                Arc::new(StringArray::from(vec![Some("a"), None, Some("c")])),
            ],
        )
        .unwrap();
        let mut bytes = Vec::new();
        let mut w = arrow_ipc::writer::FileWriter::try_new(&mut bytes, &schema).unwrap();
        w.write(&batch).unwrap();
        w.write(&batch).unwrap();
        w.finish().unwrap();
        drop(w);
        bytes
    }

    /// The footer's first record-batch block as `(offset, meta, body)` and where its 24
    /// bytes sit in the file.
    fn first_block(bytes: &[u8]) -> (usize, arrow_ipc::Block) {
        let n = bytes.len();
        let footer_len = i32::from_le_bytes(bytes[n - 10..n - 6].try_into().unwrap()) as usize;
        let footer = &bytes[n - 10 - footer_len..n - 10];
        let block = arrow_ipc::root_as_footer(footer)
            .unwrap()
            .recordBatches()
            .unwrap()
            .get(0);
        let mut needle = Vec::new();
        needle.extend_from_slice(&block.offset().to_le_bytes());
        needle.extend_from_slice(&block.metaDataLength().to_le_bytes());
        needle.extend_from_slice(&[0; 4]);
        needle.extend_from_slice(&block.bodyLength().to_le_bytes());
        let at = bytes
            .windows(needle.len())
            .rposition(|w| w == needle.as_slice())
            .unwrap();
        (at, *block)
    }

    fn file_of(bytes: &[u8]) -> File {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(bytes).unwrap();
        f.seek(SeekFrom::Start(0)).unwrap();
        f
    }

    #[test]
    fn a_valid_file_reads() {
        let (schema, rows, _) = UntrustedIpc::open(file_of(&valid_file()))
            .unwrap()
            .validate()
            .unwrap();
        assert_eq!(rows, 6);
        assert_eq!(schema.fields().len(), 2);
    }

    #[test]
    fn a_negative_body_length_is_malformed_not_a_panic() {
        let mut bytes = valid_file();
        let (at, _) = first_block(&bytes);
        bytes[at + 16..at + 24].copy_from_slice(&(-1i64).to_le_bytes());
        let err = UntrustedIpc::open(file_of(&bytes)).unwrap_err();
        assert!(err.reason().contains("negative body length (-1)"), "{err}");
    }

    #[test]
    fn a_negative_metadata_length_and_an_offset_past_the_end_are_malformed() {
        let good = valid_file();
        let (at, _) = first_block(&good);
        let mut bytes = good.clone();
        bytes[at + 8..at + 12].copy_from_slice(&(-8i32).to_le_bytes());
        let err = UntrustedIpc::open(file_of(&bytes)).unwrap_err();
        assert!(err.reason().contains("negative metadata length"), "{err}");
        let mut bytes = good;
        bytes[at..at + 8].copy_from_slice(&(1i64 << 40).to_le_bytes());
        let err = UntrustedIpc::open(file_of(&bytes)).unwrap_err();
        assert!(err.reason().contains("reaches past the data"), "{err}");
    }

    #[test]
    fn a_buffer_outside_its_body_is_malformed() {
        let mut bytes = valid_file();
        let (_, block) = first_block(&bytes);
        // The first buffer descriptor in the message (offset 0, some length): make its
        // length larger than the body. Buffers are (i64 offset, i64 length) structs.
        let start = block.offset() as usize;
        let meta = &bytes[start..start + block.metaDataLength() as usize];
        let body = block.bodyLength();
        let message = arrow_ipc::root_as_message(&meta[8..]).unwrap();
        let rb = message.header_as_record_batch().unwrap();
        let b0 = rb.buffers().unwrap().get(1);
        let mut needle = b0.offset().to_le_bytes().to_vec();
        needle.extend_from_slice(&b0.length().to_le_bytes());
        let rel = meta
            .windows(16)
            .position(|w| w == needle.as_slice())
            .unwrap();
        let at = start + rel + 8;
        bytes[at..at + 8].copy_from_slice(&(body * 4).to_le_bytes());
        let err = UntrustedIpc::open(file_of(&bytes)).unwrap_err();
        assert!(err.reason().contains("outside its"), "{err}");
    }

    #[test]
    fn truncated_and_foreign_files_are_malformed() {
        let good = valid_file();
        for bytes in [
            &good[..good.len() / 2],
            b"PAR1 not arrow at all PAR1".as_slice(),
            b"",
        ] {
            assert!(UntrustedIpc::open(file_of(bytes)).is_err());
        }
    }
}
