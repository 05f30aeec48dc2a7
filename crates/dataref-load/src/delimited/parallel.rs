//! Both passes of a large UTF-8 CSV on every core. The file is cut into chunks at line
//! starts; each chunk is parsed on its own, by offset (no shared cursor, no mapping a file
//! someone else may be writing). A cut can fall inside a quoted field that spans lines:
//! then the chunk before it ends somewhere else than where the next one began, and the next
//! chunk is parsed again from the right place. So the result is the sequential reader's,
//! whatever the file holds; the chunks only decide how much runs at once.
//!
//! A chunk of plain lines (no quote; a `\r` only before a `\n`), the usual export, is read
//! whole and split where it lies, eight bytes at a time, exactly as the `csv` crate would
//! split it; any other chunk is parsed by the `csv` crate.
//!
//! The first pass records where every batch of the second begins (its byte and line), so the
//! second builds batches apart and yields them in order. Anything unexpected in the first
//! pass (a ragged line, bytes that are not UTF-8, a CSV error) hands the file to the
//! sequential reader, which finds the same thing and names it as it always has.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use super::{FirstPass, content_line, csv_error_at, csv_reader, push_fields, push_record};
use crate::infer::{Cell, Decimal, Guess, Resolved, builders, finish_batch};
use crate::{BATCH_ROWS, Batches, LoadError, Version};

/// How a file is cut and how many threads read it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Split {
    /// Bytes per chunk of the first pass.
    pub(crate) chunk: u64,
    pub(crate) threads: usize,
}

impl Split {
    /// Chunks of 8 MiB, a thread per core (at most 8). A file under two chunks is read by
    /// the sequential reader.
    pub(crate) fn of_machine() -> Self {
        Self {
            chunk: 8 << 20,
            threads: std::thread::available_parallelism()
                .map_or(1, std::num::NonZeroUsize::get)
                .min(8),
        }
    }

    /// Whether a file of `len` bytes is worth cutting.
    pub(crate) fn applies(&self, len: u64) -> bool {
        self.threads > 1 && len >= 2 * self.chunk
    }
}

/// Reads a file from an offset on, by offset: threads read one file without sharing a
/// cursor.
struct At<'a> {
    file: &'a File,
    pos: u64,
}

impl Read for At<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

/// Why the parallel first pass stopped.
pub(crate) enum Stop {
    /// Something the sequential reader should look at (and name).
    Sequential,
    Cancelled,
    Io(io::Error),
}

/// What one chunk's parse found.
#[derive(Debug)]
struct Scanned {
    /// Where the reader stood after the last record: the chunk's end (where the next chunk
    /// begins) when the chunk's records end there, else past it, or the file's end.
    stop: u64,
    /// The CSV line at `stop`, counted from 1 at `start`.
    stop_line: u64,
    rows: u64,
    width: Option<usize>,
    /// The first chunk's first record, kept apart (it may be the header).
    first_row: Option<Vec<String>>,
    /// Where the first chunk's second record begins.
    after_first: Option<u64>,
    guesses: Vec<Guess>,
    /// Where every `BATCH_ROWS`-th record begins, and its line (from 1 at `start`): from
    /// the first record on, or the second in the first chunk.
    marks: Vec<(u64, u64)>,
    /// Read as plain lines (see [`PlainRecords`]): so are its segments.
    plain: bool,
}

impl Scanned {
    fn empty(start: u64) -> Self {
        Self {
            stop: start,
            stop_line: 1,
            rows: 0,
            width: None,
            first_row: None,
            after_first: None,
            guesses: Vec::new(),
            marks: Vec::new(),
            plain: false,
        }
    }
}

/// A chunk to parse and how: where it begins, where the next begins (none for the file's
/// last), whether it is the file's first, the delimiter and decimal separator, and the flag
/// that stops every chunk when the load is cancelled.
#[derive(Clone, Copy)]
struct Chunk<'a> {
    file: &'a File,
    start: u64,
    end: Option<u64>,
    first: bool,
    delimiter: u8,
    decimal: Option<Decimal>,
    stop: &'a AtomicBool,
}

/// Parses the records that begin in `[start, end)` (to the end of the file without `end`);
/// the last may run past `end` (see [`chunk_starts`]: a parse that stops at `end` has read
/// everything of the chunk that makes a record). A chunk of plain lines is split where it
/// lies; any other is parsed by the CSV reader.
fn scan(c: Chunk<'_>) -> Result<Scanned, Stop> {
    let Chunk {
        file,
        start,
        end,
        delimiter,
        ..
    } = c;
    let to = match end {
        Some(end) => end,
        None => file.metadata().map_err(Stop::Io)?.len(),
    };
    // Read whole only when that is a chunk's worth: a file of one enormous line streams.
    if plain_delimiter(delimiter) && to.saturating_sub(start) <= MAX_PLAIN_SPAN {
        let bytes = read_span(file, start, to).map_err(Stop::Io)?;
        let text = std::str::from_utf8(&bytes).map_err(|_| Stop::Sequential)?;
        if let Some(s) = scan_plain(text, c) {
            return s;
        }
    }
    scan_csv(c)
}

/// The most bytes of a chunk read into memory to be split where they lie.
const MAX_PLAIN_SPAN: u64 = 64 << 20;

/// A delimiter plain lines can be split at: ASCII, and not a quote or a line's end.
fn plain_delimiter(d: u8) -> bool {
    d.is_ascii() && !matches!(d, b'"' | b'\r' | b'\n')
}

/// `[start, to)` of `file`, read whole.
fn read_span(file: &File, start: u64, to: u64) -> io::Result<Vec<u8>> {
    let len = usize::try_from(to.saturating_sub(start)).map_err(io::Error::other)?;
    let mut bytes = vec![0u8; len];
    file.read_exact_at(&mut bytes, start)?;
    Ok(bytes)
}

/// Plain lines (no quote, no carriage return but at a line's end), read exactly as the CSV
/// reader reads them: line ends and blank lines are skipped, a record runs to the next `\r`
/// or `\n`, and the `\n` of a `\r\n` is left for the next read. Each record comes with
/// where the reader stood before reading it and the line there (counted from 1), as the
/// CSV reader reports a record's position. One pass over the bytes: the searches of the
/// standard library cost more than they save on fields this short. Ends early, with `mixed`
/// set, at a line that is not plain.
struct PlainRecords<'a> {
    text: &'a str,
    delimiter: u8,
    pos: usize,
    line: u64,
    mixed: bool,
    /// The last record's fields: where each begins and ends in `text`.
    bounds: Vec<(usize, usize)>,
    /// The line the last record's first byte is on.
    content_line: u64,
}

impl<'a> PlainRecords<'a> {
    fn new(text: &'a str, delimiter: u8) -> Self {
        Self {
            text,
            delimiter,
            pos: 0,
            line: 1,
            mixed: false,
            bounds: Vec::new(),
            content_line: 1,
        }
    }

    /// The next record's position and line; its fields are then [`PlainRecords::fields`].
    fn next_record(&mut self) -> Option<(usize, u64)> {
        let (at, line) = (self.pos, self.line);
        let b = self.text.as_bytes();
        let mut i = self.pos;
        while i < b.len() && matches!(b[i], b'\r' | b'\n') {
            self.line += u64::from(b[i] == b'\n');
            i += 1;
        }
        self.pos = i;
        if i >= b.len() {
            return None;
        }
        self.content_line = self.line;
        self.bounds.clear();
        let mut field = i;
        loop {
            i = next_special(b, i, self.delimiter);
            let Some(&c) = b.get(i) else {
                self.bounds.push((field, i));
                self.pos = i;
                break;
            };
            if c == self.delimiter {
                self.bounds.push((field, i));
                field = i + 1;
            } else if c == b'\n' {
                self.bounds.push((field, i));
                self.pos = i + 1;
                self.line += 1;
                break;
            } else if c == b'\r' && b.get(i + 1).is_none_or(|&n| n == b'\n') {
                self.bounds.push((field, i));
                self.pos = i + 1;
                break;
            } else if c == b'"' || c == b'\r' {
                self.mixed = true;
                return None;
            }
            i += 1;
        }
        Some((at, line))
    }

    /// The last record's fields (split at ASCII bytes, so each is whole text).
    fn fields(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.bounds
            .iter()
            .map(|&(a, b)| self.text.get(a..b).unwrap_or_default())
    }
}

/// The first byte at or after `i` that is the delimiter, a quote or a line's end (or the
/// length): eight bytes at a time while none of them is.
fn next_special(b: &[u8], mut i: usize, delimiter: u8) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    // The high bit of each byte of `x` that is zero (exactly: no borrow crosses bytes).
    let zeros = |x: u64| !(((x & LOW7) + LOW7) | x | LOW7);
    let [d, n, r, q] = [delimiter, b'\n', b'\r', b'"'].map(|c| ONES * u64::from(c));
    while let Some(word) = b.get(i..i + 8) {
        let Ok(word) = <[u8; 8]>::try_from(word) else {
            break;
        };
        let w = u64::from_le_bytes(word);
        let hits = zeros(w ^ d) | zeros(w ^ n) | zeros(w ^ r) | zeros(w ^ q);
        if hits != 0 {
            return i + (hits.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while let Some(&c) = b.get(i) {
        if c == delimiter || matches!(c, b'\n' | b'\r' | b'"') {
            return i;
        }
        i += 1;
    }
    i
}

/// [`scan_csv`] of a chunk of plain lines (`text`, all of it); `None` if it has other
/// lines.
fn scan_plain(text: &str, c: Chunk<'_>) -> Option<Result<Scanned, Stop>> {
    let (start, bounded, first, delimiter) = (c.start, c.end.is_some(), c.first, c.delimiter);
    let skip = u64::from(first);
    let mut s = Scanned::empty(start);
    s.plain = true;
    let mut records = PlainRecords::new(text, delimiter);
    loop {
        let (pos, line) = (records.pos, records.line);
        if bounded && pos >= text.len() {
            s.stop = start + pos as u64;
            s.stop_line = line;
            return Some(Ok(s));
        }
        if records.next_record().is_none() {
            if records.mixed {
                return None;
            }
            // Only line ends left: the next chunk begins at them.
            s.stop = start + pos as u64;
            s.stop_line = line;
            return Some(Ok(s));
        }
        if s.rows >= skip && (s.rows - skip).is_multiple_of(BATCH_ROWS as u64) {
            s.marks.push((start + pos as u64, line));
        }
        let width = records.bounds.len();
        match s.width {
            None => {
                s.width = Some(width);
                s.guesses = vec![Guess::new(c.decimal); width];
            }
            Some(w) if w != width => return Some(Err(Stop::Sequential)),
            Some(_) => {}
        }
        if first && s.rows == 0 {
            s.first_row = Some(records.fields().map(str::to_owned).collect());
            s.after_first = Some(start + records.pos as u64);
        } else {
            for (g, v) in s.guesses.iter_mut().zip(records.fields()) {
                g.see(Cell::Text(v));
            }
        }
        s.rows += 1;
        if s.rows.is_multiple_of(BATCH_ROWS as u64) && c.stop.load(Ordering::Relaxed) {
            return Some(Err(Stop::Cancelled));
        }
    }
}

/// The CSV reader's parse of a chunk (see [`scan`]).
fn scan_csv(c: Chunk<'_>) -> Result<Scanned, Stop> {
    let Chunk {
        file,
        start,
        end,
        first,
        delimiter,
        decimal,
        stop,
    } = c;
    let mut records = csv_reader(At { file, pos: start }, delimiter);
    let mut record = csv::StringRecord::new();
    let skip = u64::from(first);
    let mut s = Scanned::empty(start);
    loop {
        let at = records.position();
        let (pos, line) = (start + at.byte(), at.line());
        if end.is_some_and(|end| pos >= end) {
            s.stop = pos;
            s.stop_line = line;
            return Ok(s);
        }
        match records.read_record(&mut record) {
            Ok(true) => {}
            Ok(false) if end.is_none() => {
                s.stop = pos;
                s.stop_line = line;
                return Ok(s);
            }
            // A chunk cut short: the file shrank since it was measured.
            Ok(false) => return Err(Stop::Sequential),
            Err(e) => {
                return Err(match e.into_kind() {
                    csv::ErrorKind::Io(io) if io.kind() != io::ErrorKind::InvalidData => {
                        Stop::Io(io)
                    }
                    _ => Stop::Sequential,
                });
            }
        }
        if s.rows >= skip && (s.rows - skip).is_multiple_of(BATCH_ROWS as u64) {
            s.marks.push((pos, line));
        }
        match s.width {
            None => {
                s.width = Some(record.len());
                s.guesses = vec![Guess::new(decimal); record.len()];
            }
            Some(w) if w != record.len() => return Err(Stop::Sequential),
            Some(_) => {}
        }
        if first && s.rows == 0 {
            s.first_row = Some(record.iter().map(str::to_owned).collect());
            s.after_first = Some(start + records.position().byte());
        } else {
            for (g, v) in s.guesses.iter_mut().zip(record.iter()) {
                g.see(Cell::Text(v));
            }
        }
        s.rows += 1;
        if s.rows.is_multiple_of(BATCH_ROWS as u64) && stop.load(Ordering::Relaxed) {
            return Err(Stop::Cancelled);
        }
    }
}

/// Where each chunk begins: `data` (after a byte-order mark), then where the CSV reader
/// stands after the first line that ends at or after every `chunk` bytes: after its `\n`,
/// or at the `\n` of a `\r\n` (the reader stops after the `\r` and skips the `\n` as it
/// reads on, counting the line then; a chunk that begins there counts it the same way).
fn chunk_starts(file: &File, data: u64, len: u64, chunk: u64) -> io::Result<Vec<u64>> {
    let mut starts = vec![data];
    let mut buf = vec![0u8; 4096];
    let mut at = data + chunk;
    'chunks: while at < len {
        // From two bytes before: a line that ends just there is taken, `\r` and all.
        let mut from = at.saturating_sub(2).max(data);
        let mut before = None;
        loop {
            let n = file.read_at(&mut buf, from)?;
            if n == 0 {
                break 'chunks;
            }
            for (i, &b) in buf[..n].iter().enumerate() {
                let here = from + i as u64;
                if b == b'\n' && here + 1 >= at {
                    let next = if before == Some(b'\r') {
                        here
                    } else {
                        here + 1
                    };
                    if next >= len || next <= *starts.last().unwrap_or(&data) {
                        break 'chunks;
                    }
                    starts.push(next);
                    at = next + chunk;
                    continue 'chunks;
                }
                before = Some(b);
            }
            from += n as u64;
        }
    }
    Ok(starts)
}

/// One batch of the second pass: `rows` records from `start` (on line `line`), ending at
/// `end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment {
    start: u64,
    line: u64,
    rows: usize,
    end: u64,
    /// Plain lines: split where they lie.
    plain: bool,
}

/// The second pass's batches, once the header is decided.
#[derive(Debug)]
pub(crate) struct Plan {
    data: u64,
    after_first: u64,
    segments: Vec<Segment>,
}

impl Plan {
    /// The batches: after the first record when it is the header, else from it.
    pub(crate) fn segments(mut self, header: bool) -> Vec<Segment> {
        if header {
            return self.segments;
        }
        match self.segments.first_mut() {
            Some(s) if s.start == self.after_first => {
                s.start = self.data;
                s.line = 1;
                s.rows += 1;
            }
            _ => self.segments.insert(
                0,
                Segment {
                    start: self.data,
                    line: 1,
                    rows: 1,
                    end: self.after_first,
                    plain: false,
                },
            ),
        }
        self.segments
    }
}

/// The first pass over `data` to the end of `file` (as it was at `version`) on
/// `split.threads` threads: what the sequential first pass finds, and where each batch
/// begins.
pub(crate) fn first_pass(
    file: &File,
    data: u64,
    version: Version,
    delimiter: u8,
    decimal: Option<Decimal>,
    split: Split,
    cancelled: &dyn Fn() -> bool,
) -> Result<(FirstPass, Plan), Stop> {
    let starts = chunk_starts(file, data, version.len, split.chunk).map_err(Stop::Io)?;
    let end_of = |i: usize| starts.get(i + 1).copied();
    let stop = AtomicBool::new(false);
    let next = AtomicUsize::new(0);
    let (tx, rx) = mpsc::channel::<(usize, Result<Scanned, Stop>)>();
    let mut found: Vec<Option<Result<Scanned, Stop>>> = (0..starts.len()).map(|_| None).collect();
    std::thread::scope(|scope| {
        for _ in 0..split.threads.min(starts.len()) {
            let tx = tx.clone();
            let (next, stop, starts) = (&next, &stop, &starts);
            scope.spawn(move || {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&start) = starts.get(i) else { return };
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let s = scan(Chunk {
                        file,
                        start,
                        end: end_of(i),
                        first: i == 0,
                        delimiter,
                        decimal,
                        stop,
                    });
                    // A failed chunk need not stop the others: the chunk before it may end
                    // past its start, and then it is parsed again from there.
                    if tx.send((i, s)).is_err() {
                        return;
                    }
                }
            });
        }
        drop(tx);
        loop {
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok((i, s)) => found[i] = Some(s),
                Err(RecvTimeoutError::Timeout) => {
                    if cancelled() {
                        stop.store(true, Ordering::Relaxed);
                    }
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
    });
    if stop.load(Ordering::Relaxed) || cancelled() {
        return Err(Stop::Cancelled);
    }
    // Chained in order: each chunk must begin where the one before it ended.
    let mut at = (data, 1u64);
    let mut first: Option<Scanned> = None;
    let mut guesses: Vec<Guess> = Vec::new();
    let mut rows = 0u64;
    let mut segments = Vec::new();
    for (i, slot) in found.into_iter().enumerate() {
        let end = end_of(i);
        let s = match slot {
            Some(result) if starts[i] == at.0 => result?,
            _ if end.is_some_and(|end| at.0 >= end) => Scanned::empty(at.0),
            _ => scan(Chunk {
                file,
                start: at.0,
                end,
                first: i == 0,
                delimiter,
                decimal,
                stop: &stop,
            })?,
        };
        let line = |local: u64| at.1 + local - 1;
        if let Some(width) = s.width {
            let expected = first.as_ref().map_or(width, |f| f.width.unwrap_or(width));
            if width != expected {
                return Err(Stop::Sequential);
            }
        }
        for (g, h) in guesses.iter_mut().zip(&s.guesses) {
            g.merge(h);
        }
        if guesses.is_empty() {
            guesses.clone_from(&s.guesses);
        }
        let data_rows = s.rows - u64::from(i == 0 && s.rows > 0);
        rows += s.rows;
        for (k, &(pos, local)) in s.marks.iter().enumerate() {
            let (end, n) = match s.marks.get(k + 1) {
                Some(&(next, _)) => (next, BATCH_ROWS),
                None => (s.stop, (data_rows - (k * BATCH_ROWS) as u64) as usize),
            };
            segments.push(Segment {
                start: pos,
                line: line(local),
                rows: n,
                end,
                plain: s.plain,
            });
        }
        at = (s.stop, line(s.stop_line));
        if i == 0 {
            first = Some(s);
        }
    }
    let Some(first) = first else {
        return Err(Stop::Sequential);
    };
    let (Some(first_row), Some(width), Some(after_first)) =
        (first.first_row, first.width, first.after_first)
    else {
        return Err(Stop::Sequential);
    };
    Ok((
        FirstPass {
            delimiter,
            width,
            rows,
            first_row,
            guesses,
        },
        Plan {
            data,
            after_first,
            segments,
        },
    ))
}

/// What every thread of the second pass needs.
pub(crate) struct Shape {
    schema: SchemaRef,
    resolved: Vec<Resolved>,
    names: Vec<String>,
    width: usize,
    delimiter: u8,
}

impl Shape {
    /// Batches of `schema` (columns `names`, read as `resolved`).
    pub(crate) fn new(
        schema: SchemaRef,
        resolved: Vec<Resolved>,
        names: Vec<String>,
        delimiter: u8,
    ) -> Self {
        Self {
            schema,
            width: names.len(),
            resolved,
            names,
            delimiter,
        }
    }
}

/// One segment's records as a batch.
fn build(file: &File, seg: &Segment, shape: &Shape) -> Result<RecordBatch, LoadError> {
    if seg.plain {
        return build_plain(file, seg, shape);
    }
    let mut records = csv_reader(
        At {
            file,
            pos: seg.start,
        },
        shape.delimiter,
    );
    let mut record = csv::StringRecord::new();
    let mut builders = builders(&shape.resolved, seg.rows);
    for _ in 0..seg.rows {
        let more = records
            .read_record(&mut record)
            .map_err(|e| csv_error_at(e, seg.line))?;
        if !more {
            return Err(LoadError::Changed);
        }
        let at = record.position();
        let line = || {
            let (byte, local) = at.map_or((0, 1), |p| (p.byte(), p.line()));
            content_line(file, seg.start + byte, seg.line + local - 1)
        };
        push_record(&mut builders, &record, &shape.names, shape.width, line)?;
    }
    // The same records as the first pass found, or the file is not the one it read.
    if seg.start + records.position().byte() != seg.end {
        return Err(LoadError::Changed);
    }
    finish_batch(&shape.schema, &mut builders, "CSV")
}

/// [`build`] of a segment of plain lines: read whole, split where it lies.
fn build_plain(file: &File, seg: &Segment, shape: &Shape) -> Result<RecordBatch, LoadError> {
    let bytes = read_span(file, seg.start, seg.end)?;
    // What the first pass found, or the file is not the one it read.
    let Ok(text) = std::str::from_utf8(&bytes) else {
        return Err(LoadError::Changed);
    };
    let mut builders = builders(&shape.resolved, seg.rows);
    let mut records = PlainRecords::new(text, shape.delimiter);
    for _ in 0..seg.rows {
        if records.next_record().is_none() {
            return Err(LoadError::Changed);
        }
        // The line its first byte is on (see `content_line`).
        let line = seg.line + records.content_line - 1;
        let found = records.bounds.len();
        push_fields(
            &mut builders,
            records.fields(),
            found,
            &shape.names,
            shape.width,
            || line,
        )?;
    }
    if records.next_record().is_some() || records.mixed {
        return Err(LoadError::Changed);
    }
    finish_batch(&shape.schema, &mut builders, "CSV")
}

/// Batches built ahead, at most this many more than the threads.
const AHEAD: usize = 1;

/// Room for batches not yet taken: a thread waits for a slot before it builds one, so
/// memory holds at most threads + [`AHEAD`] batches whatever the file's size.
struct Slots {
    free: Mutex<usize>,
    freed: Condvar,
    done: AtomicBool,
}

impl Slots {
    /// Waits for a slot; `false` once the reader is gone.
    fn take(&self) -> bool {
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if self.done.load(Ordering::Relaxed) {
                return false;
            }
            if *free > 0 {
                *free -= 1;
                return true;
            }
            free = self
                .freed
                .wait(free)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn give(&self) {
        *self.free.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        self.freed.notify_one();
    }

    fn close(&self) {
        self.done.store(true, Ordering::Relaxed);
        let _held = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        self.freed.notify_all();
    }
}

/// The second pass: threads build the segments' batches, yielded in the file's order.
pub(crate) struct ParallelBatches {
    schema: SchemaRef,
    count: usize,
    next: usize,
    ready: BTreeMap<usize, Result<RecordBatch, LoadError>>,
    rx: Receiver<(usize, Result<RecordBatch, LoadError>)>,
    slots: Arc<Slots>,
    threads: Vec<JoinHandle<()>>,
}

impl ParallelBatches {
    /// Threads reading `segments` of `file` into batches of `shape`.
    pub(crate) fn start(
        file: File,
        segments: Vec<Segment>,
        shape: Shape,
        threads: usize,
    ) -> io::Result<Self> {
        let count = segments.len();
        let schema = shape.schema.clone();
        let shape = Arc::new(shape);
        let file = Arc::new(file);
        let segments = Arc::new(segments);
        let next = Arc::new(AtomicUsize::new(0));
        let slots = Arc::new(Slots {
            free: Mutex::new(threads + AHEAD),
            freed: Condvar::new(),
            done: AtomicBool::new(false),
        });
        let (tx, rx) = mpsc::channel();
        let mut handles = Vec::new();
        for _ in 0..threads.clamp(1, count.max(1)) {
            let (file, segments, next, slots, shape, tx) = (
                file.clone(),
                segments.clone(),
                next.clone(),
                slots.clone(),
                shape.clone(),
                tx.clone(),
            );
            let handle = std::thread::Builder::new()
                .name("dataref-load-csv".into())
                .spawn(move || {
                    while slots.take() {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(seg) = segments.get(i) else { return };
                        let batch = build(&file, seg, &shape);
                        let failed = batch.is_err();
                        if tx.send((i, batch)).is_err() || failed {
                            return;
                        }
                    }
                });
            match handle {
                Ok(h) => handles.push(h),
                Err(e) if handles.is_empty() => return Err(e),
                // Fewer threads than asked: the ones running read every segment.
                Err(_) => break,
            }
        }
        Ok(Self {
            schema,
            count,
            next: 0,
            ready: BTreeMap::new(),
            rx,
            slots,
            threads: handles,
        })
    }
}

impl Batches for ParallelBatches {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn next_batch(&mut self) -> Result<Option<RecordBatch>, LoadError> {
        if self.next >= self.count {
            return Ok(None);
        }
        let batch = loop {
            if let Some(b) = self.ready.remove(&self.next) {
                break b;
            }
            match self.rx.recv() {
                Ok((i, b)) => {
                    self.ready.insert(i, b);
                }
                // Every thread ended without this batch: one failed on an earlier one,
                // which was already returned, or could not start.
                Err(_) => {
                    return Err(LoadError::Io(io::Error::other(
                        "the CSV reader's threads ended early",
                    )));
                }
            }
        };
        self.next += 1;
        self.slots.give();
        batch.map(Some)
    }
}

impl Drop for ParallelBatches {
    fn drop(&mut self) {
        self.slots.close();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests;
