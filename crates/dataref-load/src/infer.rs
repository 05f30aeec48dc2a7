//! Column types from what the cells hold, the way a person reading the file would name
//! them, and the builders that turn cells into Arrow arrays.
//!
//! Every column starts as every type a cell could have and loses those a cell does not
//! fit, over all rows (not a sample), so a value on the millionth line cannot fail the load
//! after the type was chosen. What is kept as text, on purpose:
//! - numbers with leading zeros (`02134`, an ID or postcode, not 2134);
//! - whole numbers too large for a 64-bit integer, and more than 15 digits without a
//!   decimal point (a float would round them);
//! - timestamps with more precision than a microsecond, or some with a time zone and some
//!   without;
//! - dates in any layout but `YYYY-MM-DD` (`03/04/2024` is March or April).
//!
//! An empty cell is NULL. `NA`, `N/A`, `#N/A`, `NULL`, `null`, `NaN`, `nan` and `None`
//! are NULL in a column of numbers, booleans, dates or timestamps, and text in a text column.

use std::sync::Arc;

use arrow_array::builder::{
    BooleanBuilder, Date32Builder, Float64Builder, Int64Builder, StringBuilder,
    TimestampMicrosecondBuilder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use dataref_protocol::days_from_civil;
use serde::{Deserialize, Serialize};

use crate::LoadError;

/// A column's type, as the model and `describe_data` name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ColumnKind {
    #[serde(alias = "text")]
    String,
    Integer,
    Float,
    Boolean,
    Date,
    Timestamp,
}

impl ColumnKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::String => "string",
            Self::Integer => "integer",
            Self::Float => "float",
            Self::Boolean => "boolean",
            Self::Date => "date",
            Self::Timestamp => "timestamp",
        }
    }

    fn expected(self) -> &'static str {
        match self {
            Self::String => "text",
            Self::Integer => "an integer",
            Self::Float => "a number",
            Self::Boolean => "true or false",
            Self::Date => "a date (YYYY-MM-DD)",
            Self::Timestamp => "a timestamp (YYYY-MM-DD HH:MM:SS)",
        }
    }
}

/// One cell as a reader found it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Cell<'a> {
    Null,
    /// Text, to be parsed: a CSV field, a JSON string, a spreadsheet's text cell.
    Text(&'a str),
    Bool(bool),
    Int(i64),
    Float(f64),
    /// Days since 1970-01-01.
    Date(i32),
    /// Microseconds since 1970-01-01 00:00, no time zone.
    Timestamp(i64),
    /// Text that is only ever text: a JSON object or array, an integer too large for i64.
    Opaque(&'a str),
}

const BOOL: u8 = 1;
const INT: u8 = 2;
const FLOAT_DOT: u8 = 4;
const FLOAT_COMMA: u8 = 8;
const DATE: u8 = 16;
const TS_NAIVE: u8 = 32;
const TS_ZONED: u8 = 64;
const ALL: u8 = 127;

const NULL_TOKENS: &[&str] = &["NA", "N/A", "#N/A", "NULL", "null", "NaN", "nan", "None"];

fn is_null_token(t: &str) -> bool {
    NULL_TOKENS.contains(&t)
}

/// The decimal separator of a file's numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
pub enum Decimal {
    #[serde(rename = ".")]
    Dot,
    #[serde(rename = ",")]
    Comma,
}

/// The types a column's cells still allow.
#[derive(Debug, Clone)]
pub(crate) struct Guess {
    mask: u8,
    seen: bool,
}

impl Guess {
    pub(crate) fn new(decimal: Option<Decimal>) -> Self {
        let mask = match decimal {
            None => ALL,
            Some(Decimal::Dot) => ALL & !FLOAT_COMMA,
            Some(Decimal::Comma) => ALL & !FLOAT_DOT,
        };
        Self { mask, seen: false }
    }

    pub(crate) fn see(&mut self, cell: Cell<'_>) {
        // Already text: no later value can change that (a column's mask only narrows).
        if self.seen && self.mask == 0 {
            return;
        }
        let allowed = match cell {
            Cell::Null => return,
            Cell::Text(s) => {
                let t = trimmed(s);
                if t.is_empty() || is_null_token(t) {
                    return;
                }
                text_fits(t, self.mask)
            }
            Cell::Bool(_) => BOOL,
            Cell::Int(_) => INT | FLOAT_DOT | FLOAT_COMMA,
            Cell::Float(_) => FLOAT_DOT | FLOAT_COMMA,
            Cell::Date(_) => DATE | TS_NAIVE,
            Cell::Timestamp(_) => TS_NAIVE,
            Cell::Opaque(_) => 0,
        };
        self.seen = true;
        self.mask &= allowed;
    }

    /// Narrows to what `other` (the same column's guess over other rows) allows too.
    pub(crate) fn merge(&mut self, other: &Guess) {
        if other.seen {
            self.mask &= other.mask;
            self.seen = true;
        }
    }

    /// Whether `cell` would keep this column's type (for telling a header row from data).
    pub(crate) fn admits(&self, cell: Cell<'_>) -> bool {
        let mut g = self.clone();
        let before = g.resolve(false).kind;
        g.see(cell);
        g.resolve(false).kind == before
    }

    /// The narrowest type every cell fits; `prefer_comma` picks a decimal comma where both
    /// readings of the numbers hold (`1.234` is 1.234 or 1234).
    pub(crate) fn resolve(&self, prefer_comma: bool) -> Resolved {
        let m = self.mask;
        let (kind, comma, zoned) = if !self.seen {
            (ColumnKind::String, false, false)
        } else if m & BOOL != 0 {
            (ColumnKind::Boolean, false, false)
        } else if m & INT != 0 {
            (ColumnKind::Integer, false, false)
        } else if m & (FLOAT_DOT | FLOAT_COMMA) != 0 {
            let comma = m & FLOAT_DOT == 0 || (prefer_comma && m & FLOAT_COMMA != 0);
            (ColumnKind::Float, comma, false)
        } else if m & DATE != 0 {
            (ColumnKind::Date, false, false)
        } else if m & TS_NAIVE != 0 {
            (ColumnKind::Timestamp, false, false)
        } else if m & TS_ZONED != 0 {
            (ColumnKind::Timestamp, false, true)
        } else {
            (ColumnKind::String, false, false)
        };
        Resolved { kind, comma, zoned }
    }
}

/// A column's final type and how its text is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Resolved {
    pub(crate) kind: ColumnKind,
    /// Numbers written with a decimal comma.
    pub(crate) comma: bool,
    /// Timestamps written with a time zone (stored in UTC).
    pub(crate) zoned: bool,
}

impl Resolved {
    /// A declared type: text is read with the file's decimal separator; a timestamp column
    /// takes values with or without a zone only as the first one has it.
    pub(crate) fn declared(kind: ColumnKind, guess: &Guess, prefer_comma: bool) -> Self {
        let found = guess.resolve(prefer_comma);
        Self {
            kind,
            comma: if found.kind == ColumnKind::Float {
                found.comma
            } else {
                prefer_comma
            },
            zoned: found.kind == ColumnKind::Timestamp && found.zoned,
        }
    }

    pub(crate) fn data_type(self) -> DataType {
        match self.kind {
            ColumnKind::String => DataType::Utf8,
            ColumnKind::Integer => DataType::Int64,
            ColumnKind::Float => DataType::Float64,
            ColumnKind::Boolean => DataType::Boolean,
            ColumnKind::Date => DataType::Date32,
            ColumnKind::Timestamp => DataType::Timestamp(
                TimeUnit::Microsecond,
                self.zoned.then(|| Arc::<str>::from("UTC")),
            ),
        }
    }
}

fn text_fits(t: &str, mask: u8) -> u8 {
    let mut out = 0;
    if mask & BOOL != 0 && parse_bool(t).is_some() {
        out |= BOOL;
    }
    let numbers = mask & (INT | FLOAT_DOT | FLOAT_COMMA);
    if numbers != 0 {
        if parse_int(t).is_some() {
            // Digits alone, no leading zero: a float either way round, up to 15 digits.
            out |= INT & mask;
            if split_sign(t).1.len() <= 15 {
                out |= (FLOAT_DOT | FLOAT_COMMA) & mask;
            }
        } else {
            if mask & FLOAT_DOT != 0 && float_fits(t, false) {
                out |= FLOAT_DOT;
            }
            if mask & FLOAT_COMMA != 0 && float_fits(t, true) {
                out |= FLOAT_COMMA;
            }
        }
    }
    if mask & (DATE | TS_NAIVE | TS_ZONED) != 0 {
        if t.len() == 10 {
            // A date is also a naive timestamp (midnight); nothing else of ten bytes is
            // either.
            if parse_date(t).is_some() {
                out |= (DATE | TS_NAIVE) & mask;
            }
        } else if mask & (TS_NAIVE | TS_ZONED) != 0 {
            match parse_timestamp(t) {
                Some((_, false)) => out |= TS_NAIVE & mask,
                Some((_, true)) => out |= TS_ZONED & mask,
                None => {}
            }
        }
    }
    out
}

/// `t` without the white space around it; most cells have none.
pub(crate) fn trimmed(t: &str) -> &str {
    let b = t.as_bytes();
    match (b.first(), b.last()) {
        (Some(f), Some(l)) if f.is_ascii_graphic() && l.is_ascii_graphic() => t,
        _ => t.trim(),
    }
}

pub(crate) fn parse_bool(t: &str) -> Option<bool> {
    if t.eq_ignore_ascii_case("true") {
        Some(true)
    } else if t.eq_ignore_ascii_case("false") {
        Some(false)
    } else {
        None
    }
}

fn split_sign(t: &str) -> (bool, &str) {
    match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    }
}

/// Digits only, no leading zero (`0` itself is fine), within i64.
pub(crate) fn parse_int(t: &str) -> Option<i64> {
    let (_, digits) = split_sign(t);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if digits.len() > 1 && digits.starts_with('0') {
        return None;
    }
    t.parse().ok()
}

/// A decimal number: `-1234.5`, `1,234.5` (grouped), `.5`, `1e-3`; with `comma`, the
/// separators swap (`1.234,5`). Never `inf` or `nan`, never a leading zero before more
/// digits, never more than 15 digits without a fraction or exponent (a float would round
/// them).
pub(crate) fn parse_float(t: &str, comma: bool) -> Option<f64> {
    let syntax = float_syntax(t, comma)?;
    // Checked: what is left is Rust's own syntax once the group separators go and the
    // point is a dot. Most numbers already are, and are parsed where they lie.
    let v: f64 = if !syntax.grouped && (!comma || !syntax.point) {
        t.parse().ok()?
    } else {
        let (point, group) = if comma { (b',', b'.') } else { (b'.', b',') };
        let normalized: String = t
            .bytes()
            .filter(|&c| c != group)
            .map(|c| char::from(if c == point { b'.' } else { c }))
            .collect();
        normalized.parse().ok()?
    };
    v.is_finite().then_some(v)
}

/// Whether `t` is a number [`parse_float`] reads, without reading it: only an exponent or
/// hundreds of digits can make a float overflow.
fn float_fits(t: &str, comma: bool) -> bool {
    match float_syntax(t, comma) {
        Some(s) if !s.exponent && s.int_digits < 300 => true,
        Some(_) => parse_float(t, comma).is_some(),
        None => false,
    }
}

/// What the text of a decimal number holds.
struct FloatSyntax {
    grouped: bool,
    point: bool,
    exponent: bool,
    int_digits: usize,
}

/// The syntax of a number [`parse_float`] accepts, if `t` has it.
fn float_syntax(t: &str, comma: bool) -> Option<FloatSyntax> {
    let (point, group) = if comma { (b',', b'.') } else { (b'.', b',') };
    let (_, rest) = split_sign(t);
    let b = rest.as_bytes();
    let mut i = 0;
    let mut int_digits = 0usize;
    // The integer part: plain digits, or groups of three after a first group of 1–3.
    let mut grouped = false;
    while i < b.len() && (b[i].is_ascii_digit() || b[i] == group) {
        if b[i] == group {
            grouped = true;
        } else {
            int_digits += 1;
        }
        i += 1;
    }
    let int_part = &rest[..i];
    if grouped {
        let mut groups = int_part.split(char::from(group));
        let first = groups.next()?;
        if first.is_empty() || first.len() > 3 || first.starts_with('0') {
            return None;
        }
        if !groups.all(|g| g.len() == 3) {
            return None;
        }
    } else if int_part.len() > 1 && int_part.starts_with('0') {
        return None;
    }
    let mut frac_digits = 0usize;
    let has_point = i < b.len() && b[i] == point;
    if has_point {
        i += 1;
        while i < b.len() && b[i].is_ascii_digit() {
            frac_digits += 1;
            i += 1;
        }
        if frac_digits == 0 && int_digits == 0 {
            return None;
        }
    }
    if int_digits == 0 && frac_digits == 0 {
        return None;
    }
    let mut exponent = false;
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        i += 1;
        if i < b.len() && (b[i] == b'+' || b[i] == b'-') {
            i += 1;
        }
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return None;
        }
        exponent = true;
    }
    if i != b.len() {
        return None;
    }
    if !has_point && !exponent && int_digits > 15 {
        return None;
    }
    Some(FloatSyntax {
        grouped,
        point: has_point,
        exponent,
        int_digits,
    })
}

/// `YYYY-MM-DD`, a real day.
pub(crate) fn parse_date(t: &str) -> Option<i32> {
    let b = t.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let y = digits(&b[0..4])?;
    let m = digits(&b[5..7])?;
    let d = digits(&b[8..10])?;
    if !(1..=12).contains(&m) || d < 1 || d > days_in_month(y, m) {
        return None;
    }
    i32::try_from(days_from_civil(i64::from(y), m, d)).ok()
}

fn digits(b: &[u8]) -> Option<u32> {
    if b.is_empty() || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    b.iter().try_fold(0u32, |acc, &c| {
        acc.checked_mul(10)?.checked_add(u32::from(c - b'0'))
    })
}

fn days_in_month(y: u32, m: u32) -> u32 {
    match m {
        2 if (y.is_multiple_of(4) && !y.is_multiple_of(100)) || y.is_multiple_of(400) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

const MICROS_PER_DAY: i64 = 86_400_000_000;

/// `YYYY-MM-DD`, then `T` or a space and `HH:MM[:SS[.ffffff]]`, then optionally `Z` or an
/// offset (`+02:00`, `+0200`, `+02`). Microseconds since the epoch (in UTC when there is a
/// zone) and whether there was one. Digits past the microsecond must be zeros.
pub(crate) fn parse_timestamp(t: &str) -> Option<(i64, bool)> {
    if t.len() < 10 {
        return None;
    }
    let days = i64::from(parse_date(t.get(..10)?)?);
    let rest = &t.as_bytes()[10..];
    if rest.is_empty() {
        return Some((days * MICROS_PER_DAY, false));
    }
    if rest[0] != b'T' && rest[0] != b' ' {
        return None;
    }
    let r = &rest[1..];
    if r.len() < 5 || r[2] != b':' {
        return None;
    }
    let h = i64::from(digits(&r[0..2])?);
    let mi = i64::from(digits(&r[3..5])?);
    let mut i = 5;
    let mut s = 0;
    let mut micros = 0i64;
    if r.len() >= 8 && r[5] == b':' {
        s = i64::from(digits(&r[6..8])?);
        i = 8;
        if i < r.len() && r[i] == b'.' {
            i += 1;
            let start = i;
            while i < r.len() && r[i].is_ascii_digit() {
                i += 1;
            }
            let frac = &r[start..i];
            if frac.is_empty() || frac.len() > 9 {
                return None;
            }
            if frac.len() > 6 && frac[6..].iter().any(|&c| c != b'0') {
                return None;
            }
            let kept = &frac[..frac.len().min(6)];
            let v = i64::from(digits(kept)?);
            micros = v * 10i64.pow(u32::try_from(6 - kept.len()).ok()?);
        }
    }
    if h > 23 || mi > 59 || s > 59 {
        return None;
    }
    let zone = &r[i..];
    let offset_minutes = match zone {
        [] => None,
        [b'Z' | b'z'] => Some(0),
        [sign @ (b'+' | b'-'), tail @ ..] => {
            let (oh, om) = match tail {
                [a, b] => (digits(&[*a, *b])?, 0),
                [a, b, b':', c, d] | [a, b, c, d] => (digits(&[*a, *b])?, digits(&[*c, *d])?),
                _ => return None,
            };
            if oh > 18 || om > 59 {
                return None;
            }
            let m = i64::from(oh * 60 + om);
            Some(if *sign == b'-' { -m } else { m })
        }
        _ => return None,
    };
    let local = days * MICROS_PER_DAY + ((h * 60 + mi) * 60 + s) * 1_000_000 + micros;
    match offset_minutes {
        None => Some((local, false)),
        Some(m) => Some((local - m * 60_000_000, true)),
    }
}

/// The first row is a header when every cell is non-empty text and, where the other rows'
/// type is not text, at least one of its cells does not fit that type. When every column is
/// text, the first row is taken as the header, as spreadsheet programs do.
pub(crate) fn looks_like_header(first: &[Cell<'_>], guesses: &[Guess], prefer_comma: bool) -> bool {
    if !first
        .iter()
        .all(|c| matches!(c, Cell::Text(s) if !s.trim().is_empty()))
    {
        return false;
    }
    let mut typed = false;
    for (g, c) in guesses.iter().zip(first) {
        if g.resolve(prefer_comma).kind != ColumnKind::String {
            typed = true;
            if !g.admits(*c) {
                return true;
            }
        }
    }
    !typed
}

/// Builds one column of a batch from cells.
pub(crate) enum Builder {
    String(StringBuilder),
    Integer(Int64Builder),
    Float(Float64Builder, bool),
    Boolean(BooleanBuilder),
    Date(Date32Builder),
    Timestamp(TimestampMicrosecondBuilder, Resolved),
}

impl Builder {
    pub(crate) fn new(r: Resolved, rows: usize) -> Self {
        match r.kind {
            ColumnKind::String => Self::String(StringBuilder::with_capacity(rows, rows * 8)),
            ColumnKind::Integer => Self::Integer(Int64Builder::with_capacity(rows)),
            ColumnKind::Float => Self::Float(Float64Builder::with_capacity(rows), r.comma),
            ColumnKind::Boolean => Self::Boolean(BooleanBuilder::with_capacity(rows)),
            ColumnKind::Date => Self::Date(Date32Builder::with_capacity(rows)),
            ColumnKind::Timestamp => Self::Timestamp(
                TimestampMicrosecondBuilder::with_capacity(rows).with_data_type(r.data_type()),
                r,
            ),
        }
    }

    /// Appends `cell`; `Err` names the type it does not fit (for the caller's message).
    pub(crate) fn push(&mut self, cell: Cell<'_>) -> Result<(), &'static str> {
        // Text that means NULL in any column but text.
        let text = match cell {
            Cell::Text(s) => {
                let t = trimmed(s);
                if t.is_empty() {
                    self.push_null();
                    return Ok(());
                }
                if !matches!(self, Self::String(_)) && is_null_token(t) {
                    self.push_null();
                    return Ok(());
                }
                Some(t)
            }
            Cell::Null => {
                self.push_null();
                return Ok(());
            }
            _ => None,
        };
        match self {
            Self::String(b) => match cell {
                Cell::Text(s) | Cell::Opaque(s) => b.append_value(s),
                Cell::Bool(v) => b.append_value(if v { "true" } else { "false" }),
                Cell::Int(v) => b.append_value(v.to_string()),
                Cell::Float(v) => b.append_value(v.to_string()),
                Cell::Date(d) => b.append_value(dataref_store::format_date(i64::from(d))),
                Cell::Timestamp(us) => b.append_value(dataref_store::format_timestamp_micros(us)),
                Cell::Null => b.append_null(),
            },
            Self::Integer(b) => {
                let v = match (cell, text) {
                    (_, Some(t)) => parse_int(t),
                    (Cell::Int(v), _) => Some(v),
                    (Cell::Float(f), _) => whole(f),
                    _ => None,
                };
                b.append_value(v.ok_or(ColumnKind::Integer.expected())?);
            }
            Self::Float(b, comma) => {
                let v = match (cell, text) {
                    (_, Some(t)) => parse_float(t, *comma),
                    // Exact or refused: an integer a float cannot hold is not converted.
                    (Cell::Int(v), _) => exact_float(v),
                    (Cell::Float(f), _) => Some(f),
                    _ => None,
                };
                b.append_value(v.ok_or(ColumnKind::Float.expected())?);
            }
            Self::Boolean(b) => {
                let v = match (cell, text) {
                    (_, Some(t)) => parse_bool(t),
                    (Cell::Bool(v), _) => Some(v),
                    _ => None,
                };
                b.append_value(v.ok_or(ColumnKind::Boolean.expected())?);
            }
            Self::Date(b) => {
                let v = match (cell, text) {
                    (_, Some(t)) => parse_date(t),
                    (Cell::Date(d), _) => Some(d),
                    (Cell::Timestamp(us), _) if us.rem_euclid(MICROS_PER_DAY) == 0 => {
                        i32::try_from(us.div_euclid(MICROS_PER_DAY)).ok()
                    }
                    _ => None,
                };
                b.append_value(v.ok_or(ColumnKind::Date.expected())?);
            }
            Self::Timestamp(b, r) => {
                let v = match (cell, text) {
                    (_, Some(t)) => match parse_timestamp(t) {
                        Some((us, zoned)) if zoned == r.zoned => Some(us),
                        _ => None,
                    },
                    (Cell::Timestamp(us), _) if !r.zoned => Some(us),
                    (Cell::Date(d), _) if !r.zoned => Some(i64::from(d) * MICROS_PER_DAY),
                    _ => None,
                };
                b.append_value(v.ok_or(ColumnKind::Timestamp.expected())?);
            }
        }
        Ok(())
    }

    fn push_null(&mut self) {
        match self {
            Self::String(b) => b.append_null(),
            Self::Integer(b) => b.append_null(),
            Self::Float(b, _) => b.append_null(),
            Self::Boolean(b) => b.append_null(),
            Self::Date(b) => b.append_null(),
            Self::Timestamp(b, _) => b.append_null(),
        }
    }

    pub(crate) fn finish(&mut self) -> ArrayRef {
        match self {
            Self::String(b) => Arc::new(b.finish()),
            Self::Integer(b) => Arc::new(b.finish()),
            Self::Float(b, _) => Arc::new(b.finish()),
            Self::Boolean(b) => Arc::new(b.finish()),
            Self::Date(b) => Arc::new(b.finish()),
            Self::Timestamp(b, _) => Arc::new(b.finish()),
        }
    }
}

/// The schema of columns `names` of types `resolved`, every column nullable.
pub(crate) fn schema_of(names: &[String], resolved: &[Resolved]) -> SchemaRef {
    Arc::new(Schema::new(
        names
            .iter()
            .zip(resolved)
            .map(|(n, r)| Field::new(n, r.data_type(), true))
            .collect::<Vec<_>>(),
    ))
}

/// One builder per column, for a batch of up to `rows` rows.
pub(crate) fn builders(resolved: &[Resolved], rows: usize) -> Vec<Builder> {
    resolved.iter().map(|r| Builder::new(*r, rows)).collect()
}

/// The batch the builders hold, of `schema` (`label` names the format in an error).
pub(crate) fn finish_batch(
    schema: &SchemaRef,
    builders: &mut [Builder],
    label: &'static str,
) -> Result<RecordBatch, LoadError> {
    let columns = builders.iter_mut().map(Builder::finish).collect();
    RecordBatch::try_new(schema.clone(), columns).map_err(|e| LoadError::malformed(label, e))
}

/// `f` as an integer when it is one that both types hold exactly.
pub(crate) fn whole(f: f64) -> Option<i64> {
    const LIMIT: f64 = 9_007_199_254_740_992.0; // 2^53
    (f.fract() == 0.0 && f.abs() <= LIMIT).then_some(f as i64)
}

fn exact_float(v: i64) -> Option<f64> {
    const LIMIT: i64 = 1 << 53;
    (-LIMIT..=LIMIT).contains(&v).then_some(v as f64)
}

/// Column names from a header row: trimmed; an empty one becomes `column_N` (1-based);
/// a repeated one gets `_2`, `_3`.
pub(crate) fn column_names(header: Option<Vec<String>>, count: usize) -> Vec<String> {
    let raw = header.unwrap_or_default();
    let mut names: Vec<String> = Vec::with_capacity(count);
    for i in 0..count {
        let base = raw
            .get(i)
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| format!("column_{}", i + 1));
        let mut name = base.clone();
        let mut k = 2;
        while names.contains(&name) {
            name = format!("{base}_{k}");
            k += 1;
        }
        names.push(name);
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind_of(cells: &[&str]) -> Resolved {
        let mut g = Guess::new(None);
        for c in cells {
            g.see(Cell::Text(c));
        }
        g.resolve(false)
    }

    #[test]
    fn a_person_would_name_these_types() {
        assert_eq!(kind_of(&["1", "-2", "+3", ""]).kind, ColumnKind::Integer);
        assert_eq!(kind_of(&["1", "2.5", "NA"]).kind, ColumnKind::Float);
        assert_eq!(kind_of(&["02134", "10001"]).kind, ColumnKind::String);
        assert_eq!(kind_of(&["true", "FALSE"]).kind, ColumnKind::Boolean);
        assert_eq!(kind_of(&["2024-02-29", ""]).kind, ColumnKind::Date);
        assert_eq!(kind_of(&["2023-02-29"]).kind, ColumnKind::String);
        assert_eq!(
            kind_of(&["2024-01-01", "2024-01-02 10:30"]).kind,
            ColumnKind::Timestamp
        );
        let z = kind_of(&["2024-01-01T10:00:00Z", "2024-01-01T12:00:00+02:00"]);
        assert_eq!((z.kind, z.zoned), (ColumnKind::Timestamp, true));
        assert_eq!(
            kind_of(&["2024-01-01T10:00:00Z", "2024-01-01 10:00"]).kind,
            ColumnKind::String
        );
        assert_eq!(kind_of(&["12345678901234567890"]).kind, ColumnKind::String);
        assert_eq!(kind_of(&["1234567890123456"]).kind, ColumnKind::Integer);
        // As a float the long one would be rounded: the column stays text.
        assert_eq!(
            kind_of(&["1234567890123456789", "1.5"]).kind,
            ColumnKind::String
        );
        assert_eq!(kind_of(&["inf", "1"]).kind, ColumnKind::String);
        assert_eq!(kind_of(&["NA", "null"]).kind, ColumnKind::String);
        assert_eq!(kind_of(&[]).kind, ColumnKind::String);
    }

    #[test]
    fn decimal_commas_and_groups() {
        assert_eq!(parse_float("1.234,5", true), Some(1234.5));
        assert_eq!(parse_float("1,5", true), Some(1.5));
        assert_eq!(parse_float("1,234.5", false), Some(1234.5));
        assert_eq!(parse_float("1,5", false), None);
        assert_eq!(parse_float("12,34", false), None);
        assert_eq!(parse_float(".5", false), Some(0.5));
        assert_eq!(parse_float("-1e-3", false), Some(-0.001));
        assert_eq!(parse_float("1e400", false), None);
        assert_eq!(parse_float("0012.5", false), None);
        assert_eq!(parse_float("0.25", false), Some(0.25));
        // Parsed where they lie (no copy) or rewritten first: the same numbers.
        assert_eq!(parse_float("+1.5", false), Some(1.5));
        assert_eq!(parse_float("-1.5", true), None);
        assert_eq!(parse_float("-1,5", true), Some(-1.5));
        assert_eq!(parse_float("1.", false), Some(1.0));
        assert_eq!(parse_float("-.5", false), Some(-0.5));
        assert_eq!(parse_float("1.5E-3", false), Some(0.0015));
        assert_eq!(parse_float("1.234.567,8", true), Some(1_234_567.8));
        assert_eq!(parse_float("-1,234,567.8", false), Some(-1_234_567.8));
        assert_eq!(parse_float("29", true), Some(29.0));
        assert_eq!(parse_float("1234567890123456", false), None);
        assert_eq!(parse_float("inf", false), None);
        assert_eq!(parse_float("NaN", false), None);
        assert_eq!(parse_float("1_000", false), None);
        let r = kind_of(&["1,5", "2,25"]);
        assert_eq!((r.kind, r.comma), (ColumnKind::Float, true));
        // Both readings hold: the file's convention decides.
        let mut g = Guess::new(None);
        g.see(Cell::Text("1.234"));
        assert!(!g.resolve(false).comma);
        assert!(g.resolve(true).comma);
    }

    #[test]
    fn timestamps_are_exact_or_text() {
        assert_eq!(
            parse_timestamp("1970-01-01T00:00:01.5"),
            Some((1_500_000, false))
        );
        assert_eq!(parse_timestamp("1970-01-01 01:00+01:00"), Some((0, true)));
        assert_eq!(parse_timestamp("1970-01-01T00:00:00.000000100"), None);
        assert_eq!(
            parse_timestamp("1970-01-01T00:00:00.123456000Z"),
            Some((123_456, true))
        );
        assert_eq!(parse_timestamp("1970-01-01T24:00"), None);
        assert_eq!(
            parse_timestamp("1969-12-31T23:59:59"),
            Some((-1_000_000, false))
        );
    }

    #[test]
    fn builders_refuse_what_does_not_fit() {
        let r = Resolved {
            kind: ColumnKind::Integer,
            comma: false,
            zoned: false,
        };
        let mut b = Builder::new(r, 4);
        assert!(b.push(Cell::Text(" 42 ")).is_ok());
        assert!(b.push(Cell::Text("NA")).is_ok());
        assert_eq!(b.push(Cell::Text("4x")), Err("an integer"));
        let mut f = Builder::new(
            Resolved {
                kind: ColumnKind::Float,
                ..r
            },
            1,
        );
        assert!(f.push(Cell::Int(1 << 53)).is_ok());
        assert!(f.push(Cell::Int((1 << 53) + 1)).is_err());
        assert_eq!(
            column_names(Some(vec!["a".into(), "".into(), "a".into()]), 4),
            ["a", "column_2", "a_2", "column_4"]
        );
    }
}
