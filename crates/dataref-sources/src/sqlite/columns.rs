//! SQLite values into Arrow arrays, one column builder per result column.
//!
//! SQLite types values, not columns, so each cell is converted to the column's fixed type
//! as it arrives. A conversion that loses nothing (an integer into a float column, a
//! number into a text column) happens silently; anything else is refused and becomes a
//! [`SourceError::TypeChange`](crate::SourceError::TypeChange), never a NULL or a guess.
//!
//! | column type | Arrow | accepted storage classes |
//! |---|---|---|
//! | integer | Int64 | integer; real with an integral value that fits |
//! | real | Float64 | real; integer exactly representable as f64 (\|i\| ≤ 2^53 and more) |
//! | text | Utf8 | text (valid UTF-8); integer and real as their decimal text |
//! | blob | Binary | blob; text as its UTF-8 bytes |
//! | boolean | Boolean | integer or real 0/1; text `true`/`false`/`1`/`0` (any case) |
//! | date | Date32 | text `YYYY-MM-DD`, or a timestamp text at midnight exactly |
//! | timestamp | Timestamp(µs) | text `YYYY-MM-DD[ T]HH:MM[:SS[.ffffff]][Z]` or a bare date; integer Unix seconds |
//!
//! Integers are not accepted as dates: SQLite has no convention for integer days, and the
//! common integer convention (Unix seconds) would silently be off by a factor of 86,400.
//! NULL is accepted everywhere; every column is nullable.

use std::io::Write as _;
use std::sync::Arc;

use arrow_array::builder::{
    BinaryBuilder, BooleanBuilder, Date32Builder, Float64Builder, Int64Builder,
    TimestampMicrosecondBuilder,
};
use arrow_array::{ArrayRef, StringArray};
use arrow_schema::{ArrowError, DataType, TimeUnit};
use dataref_config::ColumnType;
use rusqlite::types::ValueRef;

use crate::civil::{parse_date, parse_timestamp};

/// The Arrow type a column of `ty` is stored as.
pub(super) fn arrow_type(ty: ColumnType) -> DataType {
    match ty {
        ColumnType::Integer => DataType::Int64,
        ColumnType::Real => DataType::Float64,
        ColumnType::Text => DataType::Utf8,
        ColumnType::Blob => DataType::Binary,
        ColumnType::Boolean => DataType::Boolean,
        ColumnType::Date => DataType::Date32,
        ColumnType::Timestamp => DataType::Timestamp(TimeUnit::Microsecond, None),
    }
}

/// How the type is described in a [`TypeChange`](crate::SourceError::TypeChange) error.
pub(super) fn expected(ty: ColumnType) -> &'static str {
    match ty {
        ColumnType::Integer => "an integer",
        ColumnType::Real => "a real number",
        ColumnType::Text => "text",
        ColumnType::Blob => "a blob",
        ColumnType::Boolean => "a boolean (0/1 or `true`/`false`)",
        ColumnType::Date => "a date (text `YYYY-MM-DD`)",
        ColumnType::Timestamp => {
            "a timestamp (text `YYYY-MM-DD HH:MM:SS[.ffffff]` or integer Unix seconds)"
        }
    }
}

/// A value as the error message shows it: its storage class and a short excerpt.
pub(super) fn found(v: ValueRef<'_>) -> String {
    const MAX_CHARS: usize = 40;
    match v {
        ValueRef::Null => "NULL".into(),
        ValueRef::Integer(i) => format!("the integer `{i}`"),
        ValueRef::Real(r) => format!("the real number `{r:?}`"),
        ValueRef::Text(t) => match std::str::from_utf8(t) {
            Ok(s) if s.chars().count() > MAX_CHARS => {
                let cut: String = s.chars().take(MAX_CHARS).collect();
                format!("the text `{cut}…`")
            }
            Ok(s) => format!("the text `{s}`"),
            Err(_) => format!("text that is not valid UTF-8 ({} bytes)", t.len()),
        },
        ValueRef::Blob(b) => format!("a {}-byte blob", b.len()),
    }
}

/// The type of a column with no declared type, from the storage classes of its first rows.
pub(super) fn infer<'a>(values: impl Iterator<Item = ValueRef<'a>>) -> ColumnType {
    let (mut int, mut real, mut text, mut blob) = (false, false, false, false);
    for v in values {
        match v {
            ValueRef::Null => {}
            ValueRef::Integer(_) => int = true,
            ValueRef::Real(_) => real = true,
            ValueRef::Text(_) => text = true,
            ValueRef::Blob(_) => blob = true,
        }
    }
    if text {
        ColumnType::Text
    } else if blob {
        ColumnType::Blob
    } else if real {
        ColumnType::Real
    } else if int {
        ColumnType::Integer
    } else {
        // All NULL so far: text holds whatever comes later with the fewest refusals.
        ColumnType::Text
    }
}

/// The value could not be stored without loss; the caller knows the column and row.
#[derive(Debug, Clone, Copy)]
pub(super) struct Refused;

/// 2^53: every integer of at most this magnitude is exactly a f64.
const F64_EXACT: u64 = 1 << 53;

fn int_to_f64(i: i64) -> Option<f64> {
    let f = i as f64;
    // Beyond 2^53 only some integers survive the round trip; compare in i128 because
    // `f as i64` saturates and would call i64::MAX exact.
    (i.unsigned_abs() <= F64_EXACT || f as i128 == i128::from(i)).then_some(f)
}

fn f64_to_int(r: f64) -> Option<i64> {
    // 2^63 is the first value outside i64; the range check comes first because `as`
    // saturates.
    (r.fract() == 0.0 && (-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&r))
        .then_some(r as i64)
}

fn text_to_bool(t: &[u8]) -> Option<bool> {
    if t.eq_ignore_ascii_case(b"true") || t == b"1" {
        Some(true)
    } else if t.eq_ignore_ascii_case(b"false") || t == b"0" {
        Some(false)
    } else {
        None
    }
}

/// One growing Arrow array. The variant is chosen once, before the first row, so the
/// per-cell work is one match and one append.
///
/// Text is collected as bytes and checked for UTF-8 once per batch ([`Builder::finish`],
/// [`Builder::first_invalid_text`]): one pass over the batch's bytes instead of a call per
/// cell.
pub(super) enum Builder {
    Integer(Int64Builder),
    Real(Float64Builder),
    Text(BinaryBuilder),
    Blob(BinaryBuilder),
    Boolean(BooleanBuilder),
    Date(DateBuilder),
    Timestamp(TimestampMicrosecondBuilder),
}

/// Dates, remembering the last text parsed: results are often ordered by date, so most
/// cells repeat the one before.
pub(super) struct DateBuilder {
    b: Date32Builder,
    last: Option<([u8; 10], i32)>,
}

impl DateBuilder {
    #[inline]
    fn append_text(&mut self, t: &[u8]) -> Result<(), Refused> {
        if let Some((text, day)) = &self.last
            && text[..] == *t
        {
            self.b.append_value(*day);
            return Ok(());
        }
        let day = match parse_date(t) {
            Some(d) => {
                if let Ok(text) = <[u8; 10]>::try_from(t) {
                    self.last = Some((text, d));
                }
                d
            }
            None => midnight_date(t).ok_or(Refused)?,
        };
        self.b.append_value(day);
        Ok(())
    }
}

impl Builder {
    pub(super) fn new(ty: ColumnType, rows: usize) -> Self {
        match ty {
            ColumnType::Integer => Self::Integer(Int64Builder::with_capacity(rows)),
            ColumnType::Real => Self::Real(Float64Builder::with_capacity(rows)),
            ColumnType::Text => Self::Text(BinaryBuilder::with_capacity(rows, rows * 16)),
            ColumnType::Blob => Self::Blob(BinaryBuilder::with_capacity(rows, rows * 16)),
            ColumnType::Boolean => Self::Boolean(BooleanBuilder::with_capacity(rows)),
            ColumnType::Date => Self::Date(DateBuilder {
                b: Date32Builder::with_capacity(rows),
                last: None,
            }),
            ColumnType::Timestamp => {
                Self::Timestamp(TimestampMicrosecondBuilder::with_capacity(rows))
            }
        }
    }

    /// Appends one cell, converting it to the column's type or refusing it. Inlined into
    /// the row loop: a call per cell cost as much as the append.
    #[inline(always)]
    pub(super) fn append(&mut self, v: ValueRef<'_>) -> Result<(), Refused> {
        match self {
            Self::Integer(b) => match v {
                ValueRef::Integer(i) => b.append_value(i),
                ValueRef::Null => b.append_null(),
                ValueRef::Real(r) => b.append_value(f64_to_int(r).ok_or(Refused)?),
                ValueRef::Text(_) | ValueRef::Blob(_) => return Err(Refused),
            },
            Self::Real(b) => match v {
                ValueRef::Real(r) => b.append_value(r),
                ValueRef::Null => b.append_null(),
                ValueRef::Integer(i) => b.append_value(int_to_f64(i).ok_or(Refused)?),
                ValueRef::Text(_) | ValueRef::Blob(_) => return Err(Refused),
            },
            Self::Text(b) => match v {
                // Checked for UTF-8 when the batch closes.
                ValueRef::Text(t) => b.append_value(t),
                ValueRef::Null => b.append_null(),
                // Writing into the builder's value buffer, then closing the value with an
                // empty append, formats without a temporary String.
                ValueRef::Integer(i) => {
                    write!(b, "{i}").map_err(|_| Refused)?;
                    b.append_value(b"");
                }
                // `{:?}` is the shortest text that reads back as the same f64 and keeps
                // `2.0` distinguishable from the integer `2`.
                ValueRef::Real(r) => {
                    write!(b, "{r:?}").map_err(|_| Refused)?;
                    b.append_value(b"");
                }
                ValueRef::Blob(_) => return Err(Refused),
            },
            Self::Blob(b) => match v {
                ValueRef::Blob(x) | ValueRef::Text(x) => b.append_value(x),
                ValueRef::Null => b.append_null(),
                ValueRef::Integer(_) | ValueRef::Real(_) => return Err(Refused),
            },
            Self::Boolean(b) => match v {
                ValueRef::Integer(0) => b.append_value(false),
                ValueRef::Integer(1) => b.append_value(true),
                ValueRef::Real(r) if r == 0.0 || r == 1.0 => b.append_value(r == 1.0),
                ValueRef::Text(t) => b.append_value(text_to_bool(t).ok_or(Refused)?),
                ValueRef::Null => b.append_null(),
                ValueRef::Integer(_) | ValueRef::Real(_) | ValueRef::Blob(_) => {
                    return Err(Refused);
                }
            },
            Self::Date(d) => match v {
                ValueRef::Text(t) => d.append_text(t)?,
                ValueRef::Null => d.b.append_null(),
                ValueRef::Integer(_) | ValueRef::Real(_) | ValueRef::Blob(_) => {
                    return Err(Refused);
                }
            },
            Self::Timestamp(b) => match v {
                ValueRef::Text(t) => b.append_value(parse_timestamp(t).ok_or(Refused)?.micros),
                ValueRef::Integer(secs) => {
                    b.append_value(secs.checked_mul(1_000_000).ok_or(Refused)?);
                }
                ValueRef::Null => b.append_null(),
                ValueRef::Real(_) | ValueRef::Blob(_) => return Err(Refused),
            },
        }
        Ok(())
    }

    /// Bytes of text or blob values so far (0 for fixed-width columns).
    #[inline]
    pub(super) fn bytes(&self) -> usize {
        match self {
            Self::Text(b) | Self::Blob(b) => b.values_slice().len(),
            _ => 0,
        }
    }

    /// In a text column, the first cell so far that is not UTF-8: its index and how the
    /// error shows it.
    pub(super) fn first_invalid_text(&self) -> Option<(usize, String)> {
        let Self::Text(b) = self else {
            return None;
        };
        let (values, offsets) = (b.values_slice(), b.offsets_slice());
        // One pass over all the bytes; cell by cell only when that fails.
        if let Ok(all) = std::str::from_utf8(values)
            && offsets
                .iter()
                .all(|&o| usize::try_from(o).is_ok_and(|o| all.is_char_boundary(o)))
        {
            return None;
        }
        offsets.windows(2).enumerate().find_map(|(i, w)| {
            let cell = values.get(usize::try_from(w[0]).ok()?..usize::try_from(w[1]).ok()?)?;
            std::str::from_utf8(cell)
                .is_err()
                .then(|| (i, found(ValueRef::Text(cell))))
        })
    }

    /// The array so far; the builder starts over, sized for another `rows`. Text that is
    /// not UTF-8 is an error here: look for it first with [`Builder::first_invalid_text`].
    pub(super) fn finish(&mut self, rows: usize) -> Result<ArrayRef, ArrowError> {
        Ok(match self {
            Self::Integer(b) => Arc::new(b.finish()),
            Self::Real(b) => Arc::new(b.finish()),
            Self::Text(b) => {
                let a = b.finish();
                // Start the next batch with room for as many bytes as this one used, so a
                // text column does not regrow its buffer by doubling every batch (but no
                // more than a batch may hold: one huge cell must not size every batch).
                let bytes = a.values().len().min(super::BATCH_BYTES);
                *b = BinaryBuilder::with_capacity(rows, bytes);
                Arc::new(StringArray::try_from_binary(a)?)
            }
            Self::Blob(b) => {
                let a = b.finish();
                let bytes = a.values().len().min(super::BATCH_BYTES);
                *b = BinaryBuilder::with_capacity(rows, bytes);
                Arc::new(a)
            }
            Self::Boolean(b) => Arc::new(b.finish()),
            Self::Date(d) => Arc::new(d.b.finish()),
            Self::Timestamp(b) => Arc::new(b.finish()),
        })
    }
}

/// A timestamp text that falls exactly on midnight is a date written long-hand
/// (`2025-03-01 00:00:00`); anything later in the day would be lost.
fn midnight_date(t: &[u8]) -> Option<i32> {
    const MICROS_PER_DAY: i64 = 86_400_000_000;
    let ts = parse_timestamp(t)?;
    (ts.micros.rem_euclid(MICROS_PER_DAY) == 0)
        .then(|| i32::try_from(ts.micros.div_euclid(MICROS_PER_DAY)).ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Date32Type, Float64Type, Int64Type, TimestampMicrosecondType};
    use arrow_array::{Array, BooleanArray};

    use super::*;

    fn column(ty: ColumnType, values: &[ValueRef<'_>]) -> Result<ArrayRef, usize> {
        let mut b = Builder::new(ty, 4);
        for (i, v) in values.iter().enumerate() {
            b.append(*v).map_err(|_| i)?;
        }
        if let Some((i, _)) = b.first_invalid_text() {
            return Err(i);
        }
        Ok(b.finish(4).unwrap())
    }

    #[test]
    fn lossless_conversions_pass() {
        let a = column(
            ColumnType::Real,
            &[ValueRef::Integer(3), ValueRef::Real(0.5), ValueRef::Null],
        )
        .unwrap();
        let a = a.as_primitive::<Float64Type>();
        assert_eq!((a.value(0), a.value(1), a.is_null(2)), (3.0, 0.5, true));

        let a = column(
            ColumnType::Text,
            &[
                ValueRef::Integer(-7),
                ValueRef::Real(2.0),
                ValueRef::Text(b"x"),
            ],
        )
        .unwrap();
        let a = a.as_string::<i32>();
        assert_eq!((a.value(0), a.value(1), a.value(2)), ("-7", "2.0", "x"));

        let a = column(ColumnType::Integer, &[ValueRef::Real(4.0)]).unwrap();
        assert_eq!(a.as_primitive::<Int64Type>().value(0), 4);

        let a = column(
            ColumnType::Boolean,
            &[
                ValueRef::Integer(1),
                ValueRef::Text(b"FALSE"),
                ValueRef::Text(b"true"),
                ValueRef::Integer(0),
            ],
        )
        .unwrap();
        let a = a.as_any().downcast_ref::<BooleanArray>().unwrap();
        assert_eq!(
            (0..4).map(|i| a.value(i)).collect::<Vec<_>>(),
            [true, false, true, false]
        );

        let a = column(
            ColumnType::Date,
            &[
                ValueRef::Text(b"2025-01-02"),
                ValueRef::Text(b"2025-01-03 00:00:00"),
            ],
        )
        .unwrap();
        let a = a.as_primitive::<Date32Type>();
        assert_eq!((a.value(0), a.value(1)), (20_090, 20_091));

        let a = column(
            ColumnType::Timestamp,
            &[
                ValueRef::Integer(86_400),
                ValueRef::Text(b"1970-01-02T00:00:01Z"),
            ],
        )
        .unwrap();
        let a = a.as_primitive::<TimestampMicrosecondType>();
        assert_eq!((a.value(0), a.value(1)), (86_400_000_000, 86_401_000_000));
    }

    #[test]
    fn lossy_conversions_are_refused() {
        let cases: &[(ColumnType, ValueRef<'_>)] = &[
            (ColumnType::Integer, ValueRef::Real(1.5)),
            (ColumnType::Integer, ValueRef::Text(b"12")),
            (ColumnType::Integer, ValueRef::Real(1e300)),
            (ColumnType::Real, ValueRef::Integer(i64::MAX)),
            (ColumnType::Real, ValueRef::Text(b"1.0")),
            (ColumnType::Text, ValueRef::Blob(b"\x00")),
            (ColumnType::Text, ValueRef::Text(b"\xff\xfe")),
            (ColumnType::Blob, ValueRef::Integer(1)),
            (ColumnType::Boolean, ValueRef::Integer(2)),
            (ColumnType::Boolean, ValueRef::Text(b"yes")),
            (ColumnType::Date, ValueRef::Integer(20_000)),
            (ColumnType::Date, ValueRef::Text(b"2025-13-01")),
            (ColumnType::Date, ValueRef::Text(b"2025-01-01 10:00:00")),
            (ColumnType::Timestamp, ValueRef::Real(1.5)),
            (ColumnType::Timestamp, ValueRef::Text(b"yesterday")),
            (ColumnType::Timestamp, ValueRef::Integer(i64::MAX)),
        ];
        for (ty, v) in cases {
            assert_eq!(column(*ty, &[*v]).err(), Some(0), "{ty:?} accepted {v:?}");
        }
    }

    #[test]
    fn inference_prefers_the_widest_class() {
        use ValueRef::{Blob, Integer, Null, Real, Text};
        assert_eq!(infer([Integer(1), Null].into_iter()), ColumnType::Integer);
        assert_eq!(infer([Integer(1), Real(1.5)].into_iter()), ColumnType::Real);
        assert_eq!(infer([Real(1.5), Text(b"a")].into_iter()), ColumnType::Text);
        assert_eq!(infer([Blob(b"a"), Null].into_iter()), ColumnType::Blob);
        assert_eq!(infer([Null, Null].into_iter()), ColumnType::Text);
        assert_eq!(infer(std::iter::empty()), ColumnType::Text);
    }

    #[test]
    fn found_describes_the_value() {
        assert_eq!(
            found(ValueRef::Text(b"2025-13-01")),
            "the text `2025-13-01`"
        );
        assert_eq!(found(ValueRef::Blob(b"abc")), "a 3-byte blob");
        assert_eq!(found(ValueRef::Real(1.5)), "the real number `1.5`");
    }
}
