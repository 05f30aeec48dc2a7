//! JSON arrays of records and NDJSON: two passes, the first for the columns (every key, in
//! the order first seen) and their types, the second for batches. A nested object or array
//! is kept as its JSON text. Nesting deeper than serde_json's limit (128) is an error, not a
//! deep recursion.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use serde_json::Value;

use crate::delimited::clip;
use crate::infer::{Cell, Guess, Resolved, builders, column_names, finish_batch, schema_of};
use crate::{BATCH_ROWS, Batches, Format, LoadError, LoadOptions, Opened, resolve_columns};

/// More distinct keys than this is a map, not records.
const MAX_COLUMNS: usize = 4_096;

type Records = serde_json::StreamDeserializer<'static, serde_json::de::IoRead<Unwrap>, Value>;

fn records(file: &File, format: Format) -> Result<Records, LoadError> {
    let mut file = file.try_clone()?;
    file.seek(SeekFrom::Start(0))?;
    let mut reader = BufReader::with_capacity(1 << 16, file);
    let mut bom = [0u8; 3];
    let n = reader.read(&mut bom)?;
    let mut prefix = Vec::new();
    if bom[..n] != [0xEF, 0xBB, 0xBF] {
        prefix.extend_from_slice(&bom[..n]);
    }
    let unwrap = Unwrap {
        inner: io::Cursor::new(prefix).chain(reader),
        array: format == Format::Json,
        state: State::Before,
        depth: 0,
        in_string: false,
        escape: false,
    };
    Ok(serde_json::Deserializer::from_reader(unwrap).into_iter())
}

fn next_record(
    records: &mut Records,
    n: u64,
    label: &'static str,
) -> Result<Option<serde_json::Map<String, Value>>, LoadError> {
    match records.next() {
        None => Ok(None),
        Some(Ok(Value::Object(m))) => Ok(Some(m)),
        Some(Ok(other)) => Err(LoadError::malformed(
            label,
            format!(
                "record {} is {}, not an object of named values",
                n + 1,
                dataref_protocol::json_kind(&other)
            ),
        )),
        Some(Err(e)) => {
            if let Some(kind) = e.io_error_kind()
                && kind != io::ErrorKind::InvalidData
            {
                return Err(LoadError::Io(io::Error::new(kind, e.to_string())));
            }
            Err(LoadError::malformed(
                label,
                format!("record {}: {e}", n + 1),
            ))
        }
    }
}

/// A cell of `v`; `scratch` holds the text of a nested value.
fn cell<'a>(v: &'a Value, scratch: &'a mut String) -> Cell<'a> {
    match v {
        Value::Null => Cell::Null,
        Value::Bool(b) => Cell::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => Cell::Int(i),
            // Beyond i64 but whole (u64): kept as its exact digits.
            (None, _) if n.is_u64() => {
                *scratch = n.to_string();
                Cell::Opaque(scratch)
            }
            (None, Some(f)) => Cell::Float(f),
            (None, None) => {
                *scratch = n.to_string();
                Cell::Opaque(scratch)
            }
        },
        Value::String(s) => Cell::Text(s),
        Value::Array(_) | Value::Object(_) => {
            *scratch = v.to_string();
            Cell::Opaque(scratch)
        }
    }
}

pub(crate) fn open(
    file: File,
    format: Format,
    options: &LoadOptions,
    cancelled: &dyn Fn() -> bool,
) -> Result<Opened, LoadError> {
    let label = format.label();
    let mut names: Vec<String> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut guesses: Vec<Guess> = Vec::new();
    let mut rows = 0u64;
    let mut scratch = String::new();
    let mut stream = records(&file, format)?;
    while let Some(record) = next_record(&mut stream, rows, label)? {
        for (k, v) in &record {
            let i = match index.get(k) {
                Some(&i) => i,
                None => {
                    if names.len() == MAX_COLUMNS {
                        return Err(LoadError::Unsupported(format!(
                            "the records have more than {MAX_COLUMNS} different keys; a \
                             file like this is a map, not a table (read it with run_python)"
                        )));
                    }
                    index.insert(k.clone(), names.len());
                    names.push(k.clone());
                    guesses.push(Guess::new(None));
                    names.len() - 1
                }
            };
            guesses[i].see(cell(v, &mut scratch));
        }
        rows += 1;
        if rows.is_multiple_of(BATCH_ROWS as u64) && cancelled() {
            return Err(LoadError::Cancelled);
        }
    }
    if rows == 0 {
        return Err(LoadError::Empty);
    }
    // Keys are names as written; an empty key still needs a column name.
    let fixed = column_names(Some(names.clone()), names.len());
    let resolved = resolve_columns(&fixed, &guesses, &options.columns, false)?;
    let schema = schema_of(&fixed, &resolved);
    Ok(Opened {
        format,
        rows: Some(rows),
        notes: Vec::new(),
        batches: Box::new(JsonBatches {
            stream: records(&file, format)?,
            label,
            schema,
            resolved,
            keys: index,
            names: fixed,
            done: 0,
        }),
    })
}

struct JsonBatches {
    stream: Records,
    label: &'static str,
    schema: SchemaRef,
    resolved: Vec<Resolved>,
    keys: HashMap<String, usize>,
    names: Vec<String>,
    done: u64,
}

impl Batches for JsonBatches {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn next_batch(&mut self) -> Result<Option<RecordBatch>, LoadError> {
        let mut builders = builders(&self.resolved, BATCH_ROWS);
        let mut n = 0;
        let mut present = vec![false; self.names.len()];
        let mut scratch = String::new();
        while n < BATCH_ROWS {
            let Some(record) = next_record(&mut self.stream, self.done, self.label)? else {
                break;
            };
            self.done += 1;
            present.fill(false);
            for (k, v) in &record {
                let Some(&i) = self.keys.get(k) else {
                    return Err(LoadError::malformed(
                        self.label,
                        format!("the file changed while it was read (new key `{k}`)"),
                    ));
                };
                // A key written twice in one record: the last value, as JSON parsers do.
                present[i] = true;
                let c = cell(v, &mut scratch);
                builders[i].push(c).map_err(|expected| LoadError::Value {
                    at: format!("record {}", self.done),
                    column: self.names[i].clone(),
                    value: clip(&match v {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    }),
                    expected,
                })?;
            }
            for (i, seen) in present.iter().enumerate() {
                if !seen {
                    let _ = builders[i].push(Cell::Null);
                }
            }
            n += 1;
        }
        if n == 0 {
            return Ok(None);
        }
        finish_batch(&self.schema, &mut builders, self.label).map(Some)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before the array's `[` (or, for NDJSON, anywhere).
    Before,
    /// Inside the array, where an element may start.
    Element,
    /// Inside the array, after an element: a `,` or the `]`.
    Separator,
    /// After the array's `]`: only blanks.
    After,
}

/// A JSON array of records read as the records one after another: the array's own `[`, `,`
/// and `]` become blanks, so serde_json's stream reader (which holds one record at a time)
/// reads it. Anything but blanks around the array, or a missing or extra `,` between
/// records, is an `InvalidData` error.
struct Unwrap {
    inner: io::Chain<io::Cursor<Vec<u8>>, BufReader<File>>,
    array: bool,
    state: State,
    depth: usize,
    in_string: bool,
    escape: bool,
}

fn invalid(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.to_owned())
}

impl Read for Unwrap {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if !self.array {
            return Ok(n);
        }
        for b in &mut buf[..n] {
            if self.in_string {
                if self.escape {
                    self.escape = false;
                } else if *b == b'\\' {
                    self.escape = true;
                } else if *b == b'"' {
                    self.in_string = false;
                }
                continue;
            }
            if b.is_ascii_whitespace() {
                continue;
            }
            if self.depth > 0 {
                match *b {
                    b'"' => self.in_string = true,
                    b'[' | b'{' => self.depth += 1,
                    b']' | b'}' => {
                        self.depth -= 1;
                        if self.depth == 0 {
                            self.state = State::Separator;
                        }
                    }
                    _ => {}
                }
                continue;
            }
            match (self.state, *b) {
                (State::Before, b'[') => {
                    self.state = State::Element;
                    *b = b' ';
                }
                (State::Before, _) => return Err(invalid("the file does not start with `[`")),
                (State::Element, b']') | (State::Separator, b']') => {
                    self.state = State::After;
                    *b = b' ';
                }
                (State::Separator, b',') => {
                    self.state = State::Element;
                    *b = b' ';
                }
                (State::Separator, _) => {
                    return Err(invalid("records must be separated by `,`"));
                }
                (State::Element, b',') => return Err(invalid("a `,` with no record before it")),
                (State::Element, c) => {
                    if c == b'"' {
                        self.in_string = true;
                        self.state = State::Separator;
                    } else if c == b'[' || c == b'{' {
                        self.depth = 1;
                    } else {
                        // A bare number or literal: serde_json reports what it is.
                        self.state = State::Separator;
                    }
                }
                (State::After, _) => return Err(invalid("text after the array's closing `]`")),
            }
        }
        Ok(n)
    }
}
