//! XLSX: one sheet (the first, or by name or position) of the used range. The zip's declared
//! sizes are checked before anything is unpacked, so a zip bomb is refused unread. Numbers
//! that are whole are integers; date cells at midnight are dates, others timestamps; error
//! cells (`#DIV/0!`) are NULL and counted in a note; wholly empty rows are left out.

use std::fs::File;
use std::io::{BufReader, Seek, SeekFrom};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use calamine::{Data, Range, Reader, Xlsx};
use dataref_protocol::days_from_civil;

use crate::delimited::clip;
use crate::infer::{
    Cell, Guess, Resolved, builders, column_names, finish_batch, looks_like_header, schema_of,
    whole,
};
use crate::{BATCH_ROWS, Batches, Format, LoadError, LoadOptions, Opened, Sheet, resolve_columns};

pub(crate) fn open(mut file: File, options: &LoadOptions) -> Result<Opened, LoadError> {
    check_unpacked_size(&mut file, options.max_unpacked_bytes)?;
    file.seek(SeekFrom::Start(0))?;
    let mut book: Xlsx<_> = Xlsx::new(BufReader::with_capacity(1 << 16, file))
        .map_err(|e| LoadError::malformed("XLSX", e))?;
    let sheets = book.sheet_names();
    let name = match &options.sheet {
        None => sheets.first().cloned(),
        Some(Sheet::Index(i)) => sheets.get(*i).cloned(),
        Some(Sheet::Name(n)) => sheets.iter().find(|s| *s == n).cloned(),
    };
    let Some(name) = name else {
        if sheets.is_empty() {
            return Err(LoadError::malformed("XLSX", "the workbook has no sheets"));
        }
        return Err(LoadError::UnknownSheet {
            sheet: match &options.sheet {
                Some(Sheet::Index(i)) => i.to_string(),
                Some(Sheet::Name(n)) => format!("`{n}`"),
                None => String::new(),
            },
            available: sheets,
        });
    };
    let range = book
        .worksheet_range(&name)
        .map_err(|e| LoadError::malformed("XLSX", e))?;
    let first_row = range.start().map_or(0, |(r, _)| r);
    let width = range.width();
    let mut scratch = String::new();
    let mut errors = 0u64;
    let mut kept: Vec<usize> = Vec::new();
    for (i, row) in range.rows().enumerate() {
        if row.iter().any(|c| !matches!(c, Data::Empty)) {
            kept.push(i);
        }
        errors += row.iter().filter(|c| matches!(c, Data::Error(_))).count() as u64;
    }
    if kept.is_empty() || width == 0 {
        return Err(LoadError::Empty);
    }
    let rows: Vec<&[Data]> = range.rows().collect();
    let mut guesses = vec![Guess::new(None); width];
    for &i in &kept[1..] {
        for (g, c) in guesses.iter_mut().zip(rows[i]) {
            g.see(cell(c, &mut scratch));
        }
    }
    // A header row is text in every cell.
    let header_texts: Vec<String> = rows[kept[0]]
        .iter()
        .map(|c| match c {
            Data::String(s) => s.trim().to_owned(),
            _ => String::new(),
        })
        .collect();
    let header = options.header.unwrap_or_else(|| {
        let cells: Vec<Cell<'_>> = header_texts.iter().map(|s| Cell::Text(s)).collect();
        looks_like_header(&cells, &guesses, false)
    });
    if !header {
        for (g, c) in guesses.iter_mut().zip(rows[kept[0]]) {
            g.see(cell(c, &mut scratch));
        }
    }
    let names = column_names(header.then_some(header_texts), width);
    let resolved = resolve_columns(&names, &guesses, &options.columns, false)?;
    let schema = schema_of(&names, &resolved);
    let data: Vec<usize> = if header {
        kept[1..].to_vec()
    } else {
        kept.clone()
    };
    let blank = range.height() - kept.len();
    let mut how = vec![format!(
        "sheet `{name}` ({} of {})",
        sheets.iter().position(|s| *s == name).map_or(1, |p| p + 1),
        sheets.len()
    )];
    how.push(if header {
        "first row is the header".into()
    } else {
        "no header row".into()
    });
    let mut notes = vec![format!("XLSX: {}", how.join(", "))];
    if errors > 0 {
        notes.push(format!(
            "{errors} cells held spreadsheet errors (such as #DIV/0!) and are empty"
        ));
    }
    if blank > 0 {
        notes.push(format!("{blank} blank rows were left out"));
    }
    Ok(Opened {
        format: Format::Xlsx,
        rows: Some(data.len() as u64),
        notes,
        batches: Box::new(XlsxBatches {
            range,
            data,
            next: 0,
            first_row,
            schema,
            resolved,
            names,
        }),
    })
}

/// The zip's parts, unpacked, at most `limit` bytes in all (by the sizes its directory
/// declares; the unpacker stops at a part's declared size).
fn check_unpacked_size(file: &mut File, limit: u64) -> Result<(), LoadError> {
    let mut zip = zip::ZipArchive::new(&mut *file).map_err(|e| LoadError::malformed("XLSX", e))?;
    let mut total = 0u64;
    for i in 0..zip.len() {
        let entry = zip
            .by_index_raw(i)
            .map_err(|e| LoadError::malformed("XLSX", e))?;
        total = total.saturating_add(entry.size());
    }
    if total > limit {
        return Err(LoadError::TooLarge {
            what: "the workbook, unpacked,".into(),
            size: total,
            limit,
        });
    }
    Ok(())
}

const MICROS_PER_DAY: i64 = 86_400_000_000;

fn cell<'a>(c: &'a Data, scratch: &'a mut String) -> Cell<'a> {
    match c {
        Data::Empty | Data::Error(_) => Cell::Null,
        Data::Int(i) => Cell::Int(*i),
        Data::Float(f) => whole(*f).map_or(Cell::Float(*f), Cell::Int),
        Data::String(s) | Data::DateTimeIso(s) => Cell::Text(s),
        Data::DurationIso(s) => Cell::Opaque(s),
        Data::Bool(b) => Cell::Bool(*b),
        Data::DateTime(dt) => {
            let (y, mo, d, h, mi, s, ms) = dt.to_ymd_hms_milli();
            // A time of day alone (serial < 1) or a duration is text: `08:30:00`.
            if !dt.is_datetime() || dt.as_f64() < 1.0 {
                let hours = if dt.is_datetime() {
                    i64::from(h)
                } else {
                    (dt.as_f64() * 24.0).floor() as i64
                };
                *scratch = format!("{hours:02}:{mi:02}:{s:02}");
                return Cell::Opaque(scratch);
            }
            let days = days_from_civil(i64::from(y), u32::from(mo), u32::from(d));
            let time = ((i64::from(h) * 60 + i64::from(mi)) * 60 + i64::from(s)) * 1_000_000
                + i64::from(ms) * 1_000;
            match (time, i32::try_from(days)) {
                (0, Ok(days)) => Cell::Date(days),
                _ => Cell::Timestamp(days * MICROS_PER_DAY + time),
            }
        }
    }
}

struct XlsxBatches {
    range: Range<Data>,
    /// Indexes (within the range) of the rows to load.
    data: Vec<usize>,
    next: usize,
    first_row: u32,
    schema: SchemaRef,
    resolved: Vec<Resolved>,
    names: Vec<String>,
}

impl Batches for XlsxBatches {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn next_batch(&mut self) -> Result<Option<RecordBatch>, LoadError> {
        let end = (self.next + BATCH_ROWS).min(self.data.len());
        if self.next >= end {
            return Ok(None);
        }
        let mut builders = builders(&self.resolved, end - self.next);
        let rows: Vec<&[Data]> = self.range.rows().collect();
        let mut scratch = String::new();
        for &i in &self.data[self.next..end] {
            for (col, (b, c)) in builders.iter_mut().zip(rows[i]).enumerate() {
                let value = cell(c, &mut scratch);
                b.push(value).map_err(|expected| LoadError::Value {
                    at: format!("row {}", u64::from(self.first_row) + i as u64 + 1),
                    column: self.names[col].clone(),
                    value: clip(&c.to_string()),
                    expected,
                })?;
            }
        }
        self.next = end;
        finish_batch(&self.schema, &mut builders, "XLSX").map(Some)
    }
}
