//! CSV and TSV: two passes over the file. The first finds the encoding, the delimiter, the
//! header and every column's type over all rows; the second builds batches. Memory holds a
//! few batches, whatever the file's size. A large UTF-8 file is read on every core (see
//! `parallel`), with the same result.

mod parallel;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;

use parallel::{ParallelBatches, Shape, Split, Stop};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use crate::infer::{
    Builder, Cell, ColumnKind, Decimal, Guess, Resolved, builders, column_names, finish_batch,
    looks_like_header, schema_of,
};
use crate::text::{self, Sniffed, TextEncoding};
use crate::{BATCH_ROWS, Batches, Format, LoadError, LoadOptions, Opened, resolve_columns};

/// Bytes read for sniffing the encoding and the delimiter.
const SAMPLE_BYTES: usize = 64 << 10;

pub(crate) fn open(
    file: File,
    format: Format,
    options: &LoadOptions,
    cancelled: &dyn Fn() -> bool,
) -> Result<Opened, LoadError> {
    open_split(file, format, options, cancelled, Split::of_machine())
}

/// [`open`], a large UTF-8 file cut as `split` says.
fn open_split(
    mut file: File,
    format: Format,
    options: &LoadOptions,
    cancelled: &dyn Fn() -> bool,
    split: Split,
) -> Result<Opened, LoadError> {
    let label = format.label();
    let mut head = Vec::with_capacity(SAMPLE_BYTES);
    (&mut file)
        .take(SAMPLE_BYTES as u64)
        .read_to_end(&mut head)?;
    if head.is_empty() {
        return Err(LoadError::Empty);
    }
    let complete = head.len() < SAMPLE_BYTES;
    let mut sniffed = text::sniff_encoding(&head, options.encoding, label)?;
    let version = crate::Version::of(&file)?;
    let mut plan = None;
    if sniffed.encoding == TextEncoding::Utf8 && split.applies(version.len() - sniffed.bom) {
        let delimiter = delimiter_of(&file, sniffed, &head, complete, format, options)?;
        let decimal = options.decimal;
        match parallel::first_pass(
            &file,
            sniffed.bom,
            version,
            delimiter,
            decimal,
            split,
            cancelled,
        ) {
            Ok((first, segments)) => plan = Some((first, segments)),
            // The sequential reader finds what stopped it, and names it.
            Err(Stop::Sequential) => {}
            Err(Stop::Cancelled) => return Err(LoadError::Cancelled),
            Err(Stop::Io(e)) => return Err(LoadError::Io(e)),
        }
    }
    let (first, plan) = match plan {
        Some((first, plan)) => (first, Some(plan)),
        // On one thread; a file guessed UTF-8 that is not is read again as Windows-1252.
        None => loop {
            let delimiter = delimiter_of(&file, sniffed, &head, complete, format, options)?;
            match first_pass(&file, sniffed, delimiter, options, cancelled) {
                Err(FirstPassError::NotUtf8) if sniffed.tentative => {
                    sniffed = Sniffed {
                        encoding: TextEncoding::Windows1252,
                        bom: 0,
                        tentative: false,
                    };
                }
                Err(FirstPassError::NotUtf8) => {
                    return Err(LoadError::Encoding {
                        at: "the file".into(),
                        encoding: "UTF-8",
                    });
                }
                Err(FirstPassError::Load(e)) => return Err(e),
                Ok(first) => break (first, None),
            }
        },
    };
    let FirstPass {
        delimiter,
        width,
        rows,
        first_row,
        guesses,
    } = first;
    let prefer_comma = match options.decimal {
        Some(d) => d == Decimal::Comma,
        None => delimiter == b';',
    };
    let header = match options.header {
        Some(h) => h,
        None => {
            let cells: Vec<Cell<'_>> = first_row.iter().map(|s| Cell::Text(s)).collect();
            looks_like_header(&cells, &guesses, prefer_comma)
        }
    };
    let mut guesses = guesses;
    if !header {
        for (g, v) in guesses.iter_mut().zip(&first_row) {
            g.see(Cell::Text(v));
        }
    }
    let names = column_names(header.then(|| first_row.clone()), width);
    let resolved = resolve_columns(&names, &guesses, &options.columns, prefer_comma)?;
    let schema = schema_of(&names, &resolved);
    let mut notes = Vec::new();
    let mut how = vec![match delimiter {
        b'\t' => "tab-delimited".to_owned(),
        d => format!("delimiter `{}`", char::from(d)),
    }];
    if sniffed.encoding != TextEncoding::Utf8 {
        how.push(format!("read as {}", sniffed.encoding.name()));
    }
    if resolved
        .iter()
        .any(|r| r.kind == ColumnKind::Float && r.comma)
    {
        how.push("decimal comma".into());
    }
    how.push(if header {
        "first line is the header".into()
    } else {
        "no header line".into()
    });
    notes.push(format!("{label}: {}", how.join(", ")));
    let data_rows = if header { rows - 1 } else { rows };
    let batches: Box<dyn Batches> = match plan {
        Some(plan) => {
            let shape = Shape::new(schema, resolved, names, delimiter);
            let segments = plan.segments(header);
            Box::new(ParallelBatches::start(
                file,
                segments,
                shape,
                split.threads,
            )?)
        }
        None => {
            let lines = lines_of(&file, sniffed);
            let reader: Box<dyn Read + Send> = text::utf8_reader(file, sniffed)?;
            let mut records = csv_reader(reader, delimiter);
            if header {
                let mut skip = csv::ByteRecord::new();
                records.read_byte_record(&mut skip).map_err(csv_error)?;
            }
            Box::new(DelimitedBatches {
                records,
                schema,
                resolved,
                names,
                width,
                record: csv::StringRecord::new(),
                lines,
            })
        }
    };
    Ok(Opened {
        format,
        rows: Some(data_rows),
        notes,
        batches,
    })
}

fn csv_reader<R: Read>(reader: R, delimiter: u8) -> csv::Reader<R> {
    csv::ReaderBuilder::new()
        .delimiter(delimiter)
        .has_headers(false)
        .flexible(true)
        .buffer_capacity(1 << 16)
        .from_reader(reader)
}

struct FirstPass {
    delimiter: u8,
    width: usize,
    rows: u64,
    first_row: Vec<String>,
    guesses: Vec<Guess>,
}

enum FirstPassError {
    NotUtf8,
    Load(LoadError),
}

impl From<LoadError> for FirstPassError {
    fn from(e: LoadError) -> Self {
        Self::Load(e)
    }
}

fn first_pass(
    file: &File,
    sniffed: Sniffed,
    delimiter: u8,
    options: &LoadOptions,
    cancelled: &dyn Fn() -> bool,
) -> Result<FirstPass, FirstPassError> {
    let lines = lines_of(file, sniffed);
    let file = file.try_clone().map_err(LoadError::Io)?;
    let reader = text::utf8_reader(file, sniffed).map_err(LoadError::Io)?;
    let mut records = csv_reader(reader, delimiter);
    let mut record = csv::ByteRecord::new();
    let mut rows = 0u64;
    let mut first_row = Vec::new();
    let mut guesses: Vec<Guess> = Vec::new();
    loop {
        match records.read_byte_record(&mut record) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => {
                if let csv::ErrorKind::Io(io) = e.kind()
                    && io.kind() == io::ErrorKind::InvalidData
                {
                    return Err(LoadError::Encoding {
                        at: format!("after line {}", line_of(&record)),
                        encoding: sniffed.encoding.name(),
                    }
                    .into());
                }
                return Err(csv_error(e).into());
            }
        }
        let not_utf8 = || match sniffed.tentative {
            true => FirstPassError::NotUtf8,
            false => LoadError::Encoding {
                at: format!("line {}", line_at(lines.as_ref(), record.position())),
                encoding: sniffed.encoding.name(),
            }
            .into(),
        };
        if rows == 0 {
            let fields = record_strs(&record).map_err(|_| not_utf8())?;
            first_row = fields.iter().map(|s| (*s).to_owned()).collect();
            guesses = vec![Guess::new(options.decimal); fields.len()];
        } else {
            if record.len() != first_row.len() {
                return Err(LoadError::Ragged {
                    at: format!("line {}", line_at(lines.as_ref(), record.position())),
                    found: record.len(),
                    expected: first_row.len(),
                }
                .into());
            }
            for (g, raw) in guesses.iter_mut().zip(record.iter()) {
                let v = std::str::from_utf8(raw).map_err(|_| not_utf8())?;
                g.see(Cell::Text(v));
            }
        }
        rows += 1;
        if rows.is_multiple_of(BATCH_ROWS as u64) && cancelled() {
            return Err(LoadError::Cancelled.into());
        }
    }
    if rows == 0 {
        return Err(LoadError::Empty.into());
    }
    Ok(FirstPass {
        delimiter,
        width: first_row.len(),
        rows,
        first_row,
        guesses,
    })
}

/// The delimiter: given, a tab for TSV, else sniffed from the head of the file.
fn delimiter_of(
    file: &File,
    sniffed: Sniffed,
    head: &[u8],
    complete: bool,
    format: Format,
    options: &LoadOptions,
) -> Result<u8, LoadError> {
    Ok(match (options.delimiter, format) {
        (Some(d), _) => d,
        (None, Format::Tsv) => b'\t',
        (None, _) => {
            let mut sample = String::new();
            let mut r = text::utf8_reader(file.try_clone()?, sniffed)?.take(head.len() as u64);
            // A cut multi-byte character at the end of the sample is dropped, not an error.
            let mut bytes = Vec::new();
            if r.read_to_end(&mut bytes).is_ok() {
                sample = match String::from_utf8(bytes) {
                    Ok(s) => s,
                    Err(e) => {
                        let valid = e.utf8_error().valid_up_to();
                        let mut b = e.into_bytes();
                        b.truncate(valid);
                        String::from_utf8(b).unwrap_or_default()
                    }
                };
            }
            text::sniff_delimiter(&sample, complete)
        }
    })
}

fn record_strs(record: &csv::ByteRecord) -> Result<Vec<&str>, std::str::Utf8Error> {
    record.iter().map(std::str::from_utf8).collect()
}

/// The line a record's first byte is on, from where the `csv` crate stood before reading it
/// (`at`, the byte in `file`, and `line`, the crate's line there). The crate counts the line
/// ends it skips before a record (the `\n` of the `\r\n` before it, blank lines) only as it
/// skips them, so its own position names the line before: in a CRLF file, every record but
/// the first. Read again only for an error; `line` as it is if the file cannot be read.
fn content_line(file: &File, mut at: u64, mut line: u64) -> u64 {
    let mut buf = [0u8; 512];
    loop {
        let n = match file.read_at(&mut buf, at) {
            Ok(0) | Err(_) => return line,
            Ok(n) => n,
        };
        for &b in &buf[..n] {
            match b {
                b'\n' => line += 1,
                b'\r' => {}
                _ => return line,
            }
        }
        at += n as u64;
    }
}

/// Where a record of a UTF-8 file read from `bom` on is, for [`content_line`]: `None` for
/// another encoding, whose positions are in its decoded bytes.
fn lines_of(file: &File, sniffed: Sniffed) -> Option<(File, u64)> {
    (sniffed.encoding == TextEncoding::Utf8)
        .then(|| file.try_clone().ok().map(|f| (f, sniffed.bom)))
        .flatten()
}

/// The line of a record at csv position `p` ([`content_line`] where the file can be read
/// again).
fn line_at(lines: Option<&(File, u64)>, p: Option<&csv::Position>) -> u64 {
    match (lines, p) {
        (Some((file, bom)), Some(p)) => content_line(file, bom + p.byte(), p.line()),
        (None, Some(p)) => p.line(),
        (_, None) => 0,
    }
}

fn line_of(record: &csv::ByteRecord) -> u64 {
    record.position().map_or(0, csv::Position::line)
}

fn csv_error(e: csv::Error) -> LoadError {
    csv_error_at(e, 1)
}

/// `e` as a load error, its line counted from `base` (the line its reader began on).
fn csv_error_at(e: csv::Error, base: u64) -> LoadError {
    let at = e.position().map_or_else(
        || "the file".to_owned(),
        |p| format!("line {}", base + p.line().saturating_sub(1)),
    );
    match e.into_kind() {
        csv::ErrorKind::Io(io) => LoadError::Io(io),
        csv::ErrorKind::Utf8 { .. } => LoadError::Encoding {
            at,
            encoding: "UTF-8",
        },
        other => LoadError::malformed("CSV", format!("{at}: {other:?}")),
    }
}

struct DelimitedBatches {
    records: csv::Reader<Box<dyn Read + Send>>,
    schema: SchemaRef,
    resolved: Vec<Resolved>,
    names: Vec<String>,
    width: usize,
    record: csv::StringRecord,
    /// The file again, to name a record's line in an error (UTF-8 only).
    lines: Option<(File, u64)>,
}

impl Batches for DelimitedBatches {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn next_batch(&mut self) -> Result<Option<RecordBatch>, LoadError> {
        let mut builders = builders(&self.resolved, BATCH_ROWS);
        let mut n = 0;
        while n < BATCH_ROWS {
            if !self
                .records
                .read_record(&mut self.record)
                .map_err(csv_error)?
            {
                break;
            }
            let (lines, at) = (self.lines.as_ref(), self.record.position());
            let line = || line_at(lines, at);
            push_record(&mut builders, &self.record, &self.names, self.width, line)?;
            n += 1;
        }
        if n == 0 {
            return Ok(None);
        }
        finish_batch(&self.schema, &mut builders, "CSV").map(Some)
    }
}

/// Appends one record to the batch's builders; `line` (asked only for an error) is the
/// line it is on.
fn push_record(
    builders: &mut [Builder],
    record: &csv::StringRecord,
    names: &[String],
    width: usize,
    line: impl Fn() -> u64,
) -> Result<(), LoadError> {
    push_fields(builders, record.iter(), record.len(), names, width, line)
}

/// Appends the `found` fields of one record to the batch's builders; `line` (asked only
/// for an error) is the line it is on.
fn push_fields<'a>(
    builders: &mut [Builder],
    fields: impl Iterator<Item = &'a str>,
    found: usize,
    names: &[String],
    width: usize,
    line: impl Fn() -> u64,
) -> Result<(), LoadError> {
    if found != width {
        return Err(LoadError::Ragged {
            at: format!("line {}", line()),
            found,
            expected: width,
        });
    }
    for (i, (b, value)) in builders.iter_mut().zip(fields).enumerate() {
        b.push(Cell::Text(value))
            .map_err(|expected| LoadError::Value {
                at: format!("line {}", line()),
                column: names[i].clone(),
                value: clip(value),
                expected,
            })?;
    }
    Ok(())
}

/// A value quoted in an error: at most 80 characters.
pub(crate) fn clip(value: &str) -> String {
    match value.char_indices().nth(80) {
        Some((i, _)) => format!("{}…", &value[..i]),
        None => value.to_owned(),
    }
}

/// Declared types by column name, checked against the file's columns.
pub(crate) fn declared_kinds<'a>(
    columns: &'a BTreeMap<String, ColumnKind>,
    names: &[String],
) -> Result<&'a BTreeMap<String, ColumnKind>, LoadError> {
    for c in columns.keys() {
        if !names.contains(c) {
            return Err(LoadError::UnknownColumn {
                column: c.clone(),
                available: names.to_vec(),
            });
        }
    }
    Ok(columns)
}
