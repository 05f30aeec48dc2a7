//! MySQL binary-protocol values into Arrow builders.
//!
//! Each result column gets a [`Plan`] from its type, flags, length and character set
//! before the first row; every cell must fit it, or the call fails naming the column and
//! row (exact or refused: nothing is rounded, wrapped or turned into NULL).
//!
//! | MySQL / MariaDB | Arrow |
//! |---|---|
//! | `TINYINT` / `SMALLINT` / `MEDIUMINT`, `INT` / `BIGINT` | Int8 / Int16 / Int32 / Int64 |
//! | the same `UNSIGNED` | UInt8 / UInt16 / UInt32 / UInt64 |
//! | `YEAR` | Int16 |
//! | `FLOAT` / `DOUBLE` | Float32 / Float64 |
//! | `DECIMAL(p,s)`, p ≤ 38 | Decimal128(p, s) |
//! | `DECIMAL(p,s)`, p > 38 | Utf8, the exact decimal text (noted) |
//! | `DATE` | Date32 (a zero date such as `0000-00-00` is an error) |
//! | `DATETIME` | Timestamp(µs), no time zone: the wall-clock value as stored |
//! | `TIMESTAMP` | Timestamp(µs, "UTC"): the session's time zone is `+00:00` |
//! | `TIME` | Duration(µs) (it spans −838:59:59 to 838:59:59) |
//! | `BIT(1)` / `BIT(n)` | Boolean / UInt64 |
//! | `CHAR`, `VARCHAR`, `TEXT`, `ENUM`, `SET`, `JSON` | Utf8 (invalid UTF-8 is an error) |
//! | `BINARY`, `VARBINARY`, `BLOB`, geometry | Binary |

use std::sync::Arc;

use arrow_array::ArrayRef;
use arrow_array::builder::{
    BinaryBuilder, BooleanBuilder, Date32Builder, Decimal128Builder, DurationMicrosecondBuilder,
    Float32Builder, Float64Builder, Int8Builder, Int16Builder, Int32Builder, Int64Builder,
    StringBuilder, TimestampMicrosecondBuilder, UInt8Builder, UInt16Builder, UInt32Builder,
    UInt64Builder,
};
use arrow_schema::{DataType, TimeUnit};
use mysql_async::Value;
use mysql_async::consts::{ColumnFlags, ColumnType};

/// The `binary` character set: the bytes are not text.
const BINARY_CHARSET: u16 = 63;

/// How a column's cells are decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    Bool,
    Int8,
    Int16,
    Int32,
    Int64,
    UInt8,
    UInt16,
    UInt32,
    UInt64,
    /// `BIT(n)`, n > 1: big-endian bytes.
    Bits,
    Float32,
    Float64,
    Decimal {
        precision: u8,
        scale: i8,
    },
    DecimalText,
    Text,
    Binary,
    Date,
    DateTime,
    Timestamp,
    Time,
}

/// The plan for a column, or what makes it unsupported.
pub(crate) fn plan(col: &mysql_async::Column) -> Result<Plan, String> {
    let unsigned = col.flags().contains(ColumnFlags::UNSIGNED_FLAG);
    let text_or_binary = if col.character_set() == BINARY_CHARSET {
        Plan::Binary
    } else {
        Plan::Text
    };
    Ok(match col.column_type() {
        ColumnType::MYSQL_TYPE_TINY if unsigned => Plan::UInt8,
        ColumnType::MYSQL_TYPE_TINY => Plan::Int8,
        ColumnType::MYSQL_TYPE_SHORT if unsigned => Plan::UInt16,
        ColumnType::MYSQL_TYPE_SHORT | ColumnType::MYSQL_TYPE_YEAR => Plan::Int16,
        ColumnType::MYSQL_TYPE_INT24 | ColumnType::MYSQL_TYPE_LONG if unsigned => Plan::UInt32,
        ColumnType::MYSQL_TYPE_INT24 | ColumnType::MYSQL_TYPE_LONG => Plan::Int32,
        ColumnType::MYSQL_TYPE_LONGLONG if unsigned => Plan::UInt64,
        ColumnType::MYSQL_TYPE_LONGLONG => Plan::Int64,
        ColumnType::MYSQL_TYPE_FLOAT => Plan::Float32,
        ColumnType::MYSQL_TYPE_DOUBLE => Plan::Float64,
        ColumnType::MYSQL_TYPE_NEWDECIMAL | ColumnType::MYSQL_TYPE_DECIMAL => {
            decimal(col.column_length(), col.decimals(), unsigned)
        }
        ColumnType::MYSQL_TYPE_DATE | ColumnType::MYSQL_TYPE_NEWDATE => Plan::Date,
        ColumnType::MYSQL_TYPE_DATETIME | ColumnType::MYSQL_TYPE_DATETIME2 => Plan::DateTime,
        ColumnType::MYSQL_TYPE_TIMESTAMP | ColumnType::MYSQL_TYPE_TIMESTAMP2 => Plan::Timestamp,
        ColumnType::MYSQL_TYPE_TIME | ColumnType::MYSQL_TYPE_TIME2 => Plan::Time,
        ColumnType::MYSQL_TYPE_BIT if col.column_length() == 1 => Plan::Bool,
        ColumnType::MYSQL_TYPE_BIT => Plan::Bits,
        // MySQL sends JSON with the binary character set; it is always UTF-8 text.
        ColumnType::MYSQL_TYPE_JSON => Plan::Text,
        ColumnType::MYSQL_TYPE_STRING
        | ColumnType::MYSQL_TYPE_VAR_STRING
        | ColumnType::MYSQL_TYPE_VARCHAR
        | ColumnType::MYSQL_TYPE_ENUM
        | ColumnType::MYSQL_TYPE_SET
        | ColumnType::MYSQL_TYPE_TINY_BLOB
        | ColumnType::MYSQL_TYPE_MEDIUM_BLOB
        | ColumnType::MYSQL_TYPE_LONG_BLOB
        | ColumnType::MYSQL_TYPE_BLOB => text_or_binary,
        ColumnType::MYSQL_TYPE_GEOMETRY | ColumnType::MYSQL_TYPE_VECTOR => Plan::Binary,
        // `SELECT NULL`: a column of nothing but NULLs.
        ColumnType::MYSQL_TYPE_NULL => Plan::Text,
        other => return Err(format!("the MySQL type {other:?} has no Arrow type here")),
    })
}

/// `DECIMAL(p,s)` from the column's display length: p digits, a point when s > 0 and a
/// sign unless unsigned.
fn decimal(length: u32, scale: u8, unsigned: bool) -> Plan {
    let precision = length
        .saturating_sub(u32::from(scale > 0))
        .saturating_sub(u32::from(!unsigned));
    match (u8::try_from(precision), i8::try_from(scale)) {
        (Ok(p), Ok(s)) if (1..=38).contains(&p) && s >= 0 && s.unsigned_abs() <= p => {
            Plan::Decimal {
                precision: p,
                scale: s,
            }
        }
        _ => Plan::DecimalText,
    }
}

impl Plan {
    pub(crate) fn data_type(self) -> DataType {
        match self {
            Self::Bool => DataType::Boolean,
            Self::Int8 => DataType::Int8,
            Self::Int16 => DataType::Int16,
            Self::Int32 => DataType::Int32,
            Self::Int64 => DataType::Int64,
            Self::UInt8 => DataType::UInt8,
            Self::UInt16 => DataType::UInt16,
            Self::UInt32 => DataType::UInt32,
            Self::UInt64 | Self::Bits => DataType::UInt64,
            Self::Float32 => DataType::Float32,
            Self::Float64 => DataType::Float64,
            Self::Decimal { precision, scale } => DataType::Decimal128(precision, scale),
            Self::DecimalText | Self::Text => DataType::Utf8,
            Self::Binary => DataType::Binary,
            Self::Date => DataType::Date32,
            Self::DateTime => DataType::Timestamp(TimeUnit::Microsecond, None),
            Self::Timestamp => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            Self::Time => DataType::Duration(TimeUnit::Microsecond),
        }
    }
}

/// One column's builder.
pub(crate) enum Column {
    Bool(BooleanBuilder),
    Int8(Int8Builder),
    Int16(Int16Builder),
    Int32(Int32Builder),
    Int64(Int64Builder),
    UInt8(UInt8Builder),
    UInt16(UInt16Builder),
    UInt32(UInt32Builder),
    UInt64(UInt64Builder, bool),
    Float32(Float32Builder),
    Float64(Float64Builder),
    Decimal(Decimal128Builder, u8, i8),
    Text(StringBuilder),
    Binary(BinaryBuilder),
    Date(Date32Builder),
    Timestamp(TimestampMicrosecondBuilder),
    Time(DurationMicrosecondBuilder),
}

impl Column {
    pub(crate) fn new(plan: Plan, rows: usize) -> Result<Self, String> {
        Ok(match plan {
            Plan::Bool => Self::Bool(BooleanBuilder::with_capacity(rows)),
            Plan::Int8 => Self::Int8(Int8Builder::with_capacity(rows)),
            Plan::Int16 => Self::Int16(Int16Builder::with_capacity(rows)),
            Plan::Int32 => Self::Int32(Int32Builder::with_capacity(rows)),
            Plan::Int64 => Self::Int64(Int64Builder::with_capacity(rows)),
            Plan::UInt8 => Self::UInt8(UInt8Builder::with_capacity(rows)),
            Plan::UInt16 => Self::UInt16(UInt16Builder::with_capacity(rows)),
            Plan::UInt32 => Self::UInt32(UInt32Builder::with_capacity(rows)),
            Plan::UInt64 => Self::UInt64(UInt64Builder::with_capacity(rows), false),
            Plan::Bits => Self::UInt64(UInt64Builder::with_capacity(rows), true),
            Plan::Float32 => Self::Float32(Float32Builder::with_capacity(rows)),
            Plan::Float64 => Self::Float64(Float64Builder::with_capacity(rows)),
            Plan::Decimal { precision, scale } => Self::Decimal(
                Decimal128Builder::with_capacity(rows)
                    .with_precision_and_scale(precision, scale)
                    .map_err(|e| e.to_string())?,
                precision,
                scale,
            ),
            Plan::DecimalText | Plan::Text => {
                Self::Text(StringBuilder::with_capacity(rows, rows * 16))
            }
            Plan::Binary => Self::Binary(BinaryBuilder::with_capacity(rows, rows * 16)),
            Plan::Date => Self::Date(Date32Builder::with_capacity(rows)),
            Plan::DateTime => Self::Timestamp(TimestampMicrosecondBuilder::with_capacity(rows)),
            Plan::Timestamp => Self::Timestamp(
                TimestampMicrosecondBuilder::with_capacity(rows).with_timezone("UTC"),
            ),
            Plan::Time => Self::Time(DurationMicrosecondBuilder::with_capacity(rows)),
        })
    }

    /// Appends one cell; the error says what the value was and why it does not fit.
    pub(crate) fn append(&mut self, v: Value) -> Result<(), String> {
        if matches!(v, Value::NULL) {
            self.append_null();
            return Ok(());
        }
        match self {
            Self::Bool(b) => match &v {
                Value::Bytes(bytes) if bytes.len() <= 1 => {
                    b.append_value(bytes.first().is_some_and(|&x| x != 0));
                }
                Value::Int(i) => b.append_value(*i != 0),
                Value::UInt(u) => b.append_value(*u != 0),
                _ => return Err(unexpected(&v, "a bit")),
            },
            Self::Int8(b) => b.append_value(int(&v)?),
            Self::Int16(b) => b.append_value(int(&v)?),
            Self::Int32(b) => b.append_value(int(&v)?),
            Self::Int64(b) => b.append_value(int(&v)?),
            Self::UInt8(b) => b.append_value(uint(&v)?),
            Self::UInt16(b) => b.append_value(uint(&v)?),
            Self::UInt32(b) => b.append_value(uint(&v)?),
            Self::UInt64(b, false) => b.append_value(uint(&v)?),
            Self::UInt64(b, true) => match &v {
                Value::Bytes(bytes) if bytes.len() <= 8 => {
                    b.append_value(bytes.iter().fold(0u64, |a, &x| (a << 8) | u64::from(x)));
                }
                _ => return Err(unexpected(&v, "at most 64 bits")),
            },
            Self::Float32(b) => match v {
                Value::Float(f) => b.append_value(f),
                _ => return Err(unexpected(&v, "a FLOAT")),
            },
            Self::Float64(b) => match v {
                Value::Double(f) => b.append_value(f),
                Value::Float(f) => b.append_value(f64::from(f)),
                _ => return Err(unexpected(&v, "a DOUBLE")),
            },
            Self::Decimal(b, precision, scale) => match &v {
                Value::Bytes(text) => b.append_value(
                    parse_decimal(text, *precision, *scale)
                        .ok_or_else(|| unexpected(&v, "a decimal of its column's precision"))?,
                ),
                _ => return Err(unexpected(&v, "a decimal")),
            },
            Self::Text(b) => match v {
                Value::Bytes(bytes) => match std::str::from_utf8(&bytes) {
                    Ok(s) => b.append_value(s),
                    Err(e) => {
                        return Err(format!(
                            "bytes that are not UTF-8 text (at byte {})",
                            e.valid_up_to()
                        ));
                    }
                },
                Value::Int(i) => b.append_value(i.to_string()),
                Value::UInt(u) => b.append_value(u.to_string()),
                other => return Err(unexpected(&other, "text")),
            },
            Self::Binary(b) => match &v {
                Value::Bytes(bytes) => b.append_value(bytes),
                _ => return Err(unexpected(&v, "bytes")),
            },
            Self::Date(b) => match v {
                Value::Date(y, m, d, 0, 0, 0, 0) => {
                    b.append_value(days_from_civil(y, m, d).ok_or_else(|| zero_date(y, m, d))?)
                }
                other => return Err(unexpected(&other, "a date")),
            },
            Self::Timestamp(b) => match v {
                Value::Date(y, m, d, h, mi, s, us) => {
                    let days = days_from_civil(y, m, d).ok_or_else(|| zero_date(y, m, d))?;
                    let secs = i64::from(days) * 86_400
                        + i64::from(h) * 3_600
                        + i64::from(mi) * 60
                        + i64::from(s);
                    b.append_value(secs * 1_000_000 + i64::from(us));
                }
                other => return Err(unexpected(&other, "a date and time")),
            },
            Self::Time(b) => match v {
                Value::Time(negative, days, h, m, s, us) => {
                    let secs = i64::from(days) * 86_400
                        + i64::from(h) * 3_600
                        + i64::from(m) * 60
                        + i64::from(s);
                    let micros = secs * 1_000_000 + i64::from(us);
                    b.append_value(if negative { -micros } else { micros });
                }
                other => return Err(unexpected(&other, "a time")),
            },
        }
        Ok(())
    }

    fn append_null(&mut self) {
        match self {
            Self::Bool(b) => b.append_null(),
            Self::Int8(b) => b.append_null(),
            Self::Int16(b) => b.append_null(),
            Self::Int32(b) => b.append_null(),
            Self::Int64(b) => b.append_null(),
            Self::UInt8(b) => b.append_null(),
            Self::UInt16(b) => b.append_null(),
            Self::UInt32(b) => b.append_null(),
            Self::UInt64(b, _) => b.append_null(),
            Self::Float32(b) => b.append_null(),
            Self::Float64(b) => b.append_null(),
            Self::Decimal(b, ..) => b.append_null(),
            Self::Text(b) => b.append_null(),
            Self::Binary(b) => b.append_null(),
            Self::Date(b) => b.append_null(),
            Self::Timestamp(b) => b.append_null(),
            Self::Time(b) => b.append_null(),
        }
    }

    pub(crate) fn finish(&mut self) -> ArrayRef {
        match self {
            Self::Bool(b) => Arc::new(b.finish()),
            Self::Int8(b) => Arc::new(b.finish()),
            Self::Int16(b) => Arc::new(b.finish()),
            Self::Int32(b) => Arc::new(b.finish()),
            Self::Int64(b) => Arc::new(b.finish()),
            Self::UInt8(b) => Arc::new(b.finish()),
            Self::UInt16(b) => Arc::new(b.finish()),
            Self::UInt32(b) => Arc::new(b.finish()),
            Self::UInt64(b, _) => Arc::new(b.finish()),
            Self::Float32(b) => Arc::new(b.finish()),
            Self::Float64(b) => Arc::new(b.finish()),
            Self::Decimal(b, ..) => Arc::new(b.finish()),
            Self::Text(b) => Arc::new(b.finish()),
            Self::Binary(b) => Arc::new(b.finish()),
            Self::Date(b) => Arc::new(b.finish()),
            Self::Timestamp(b) => Arc::new(b.finish()),
            Self::Time(b) => Arc::new(b.finish()),
        }
    }
}

fn int<T: TryFrom<i64> + TryFrom<u64>>(v: &Value) -> Result<T, String> {
    let fits = match v {
        Value::Int(i) => T::try_from(*i).ok(),
        Value::UInt(u) => T::try_from(*u).ok(),
        _ => None,
    };
    fits.ok_or_else(|| unexpected(v, "an integer of its column's size"))
}

fn uint<T: TryFrom<u64> + TryFrom<i64>>(v: &Value) -> Result<T, String> {
    int(v)
}

fn unexpected(v: &Value, expected: &str) -> String {
    let shown = match v {
        Value::Bytes(b) if b.len() > 40 => format!("{} bytes", b.len()),
        Value::Bytes(b) => format!("`{}`", String::from_utf8_lossy(b)),
        other => format!("{other:?}"),
    };
    format!("{shown}, not {expected}")
}

fn zero_date(y: u16, m: u8, d: u8) -> String {
    format!(
        "the date {y:04}-{m:02}-{d:02}, which is not on the calendar (MySQL's zero date); \
         select `NULLIF(col, '0000-00-00')` to read it as NULL, or `CAST(col AS CHAR)` for the text"
    )
}

/// Days since 1970-01-01, or None for a month or day that is not on the calendar.
fn days_from_civil(y: u16, m: u8, d: u8) -> Option<i32> {
    let (y, m, d) = (i32::from(y), i32::from(m), i32::from(d));
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let month_days = match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return None,
    };
    if d < 1 || d > month_days {
        return None;
    }
    // Howard Hinnant's days_from_civil.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    Some(era * 146_097 + doe - 719_468)
}

/// `-123.4500` as the unscaled integer of a Decimal128(precision, scale), exactly.
fn parse_decimal(text: &[u8], precision: u8, scale: i8) -> Option<i128> {
    let (negative, digits) = match text.split_first()? {
        (b'-', rest) => (true, rest),
        (b'+', rest) => (false, rest),
        _ => (false, text),
    };
    let (int_part, frac_part) = match digits.iter().position(|&c| c == b'.') {
        Some(at) => (&digits[..at], &digits[at + 1..]),
        None => (digits, &digits[..0]),
    };
    let scale = usize::from(scale.unsigned_abs());
    if frac_part.len() > scale
        || (int_part.is_empty() && frac_part.is_empty())
        || !int_part.iter().chain(frac_part).all(u8::is_ascii_digit)
    {
        return None;
    }
    let mut n: i128 = 0;
    for &c in int_part.iter().chain(frac_part) {
        n = n.checked_mul(10)?.checked_add(i128::from(c - b'0'))?;
    }
    for _ in frac_part.len()..scale {
        n = n.checked_mul(10)?;
    }
    if n >= 10i128.checked_pow(u32::from(precision))? {
        return None;
    }
    Some(if negative { -n } else { n })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_are_read_exactly() {
        assert_eq!(parse_decimal(b"-123.45", 10, 2), Some(-12_345));
        assert_eq!(parse_decimal(b"7", 10, 3), Some(7_000));
        assert_eq!(parse_decimal(b"0.005", 4, 3), Some(5));
        assert_eq!(parse_decimal(b"1.234", 10, 2), None);
        assert_eq!(parse_decimal(b"12345", 4, 0), None);
        assert_eq!(parse_decimal(b"1e5", 10, 0), None);
        assert_eq!(
            parse_decimal(b"99999999999999999999999999999999999999", 38, 0),
            Some(99_999_999_999_999_999_999_999_999_999_999_999_999)
        );
    }

    #[test]
    fn dates_follow_the_calendar() {
        assert_eq!(days_from_civil(1970, 1, 1), Some(0));
        assert_eq!(days_from_civil(2000, 3, 1), Some(11_017));
        assert_eq!(days_from_civil(2024, 2, 29), Some(19_782));
        assert_eq!(days_from_civil(2023, 2, 29), None);
        assert_eq!(days_from_civil(0, 0, 0), None);
        assert_eq!(days_from_civil(2024, 0, 10), None);
    }

    #[test]
    fn decimal_precision_comes_from_the_display_length() {
        assert_eq!(
            decimal(14, 2, false),
            Plan::Decimal {
                precision: 12,
                scale: 2
            }
        );
        assert_eq!(
            decimal(10, 0, true),
            Plan::Decimal {
                precision: 10,
                scale: 0
            }
        );
        assert_eq!(decimal(67, 10, false), Plan::DecimalText);
    }
}
