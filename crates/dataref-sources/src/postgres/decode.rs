//! PostgreSQL binary values into Arrow builders.
//!
//! Each result column gets a [`Plan`] from its type and type modifier before the first
//! row, and each cell is decoded from the raw bytes of the binary protocol straight into
//! that column's builder: no intermediate Rust value, no text parsing.
//!
//! | PostgreSQL | Arrow |
//! |---|---|
//! | `int2` / `int4` / `int8` | Int16 / Int32 / Int64 |
//! | `float4` / `float8` | Float32 / Float64 |
//! | `numeric(p,s)`, p ≤ 38, s ≥ 0 | Decimal128(p, s) (NaN, ±Infinity → NULL, noted) |
//! | `numeric` otherwise (unconstrained, e.g. `sum(…)`) | Utf8, the exact decimal text (noted) |
//! | `text`, `varchar`, `bpchar`, `name`, `"char"`, `citext`, enums | Utf8 |
//! | `json`, `jsonb` | Utf8 (the JSON text) |
//! | `bool` | Boolean |
//! | `date` | Date32 (±infinity → NULL, noted) |
//! | `timestamp` | Timestamp(µs) (±infinity → NULL, noted) |
//! | `timestamptz` | Timestamp(µs, "UTC") (±infinity → NULL, noted) |
//! | `time` | Time64(µs) |
//! | `interval` | Interval(MonthDayNano) |
//! | `uuid` | Utf8, canonical `8-4-4-4-12` lower-case hex |
//! | `bytea` | Binary |
//! | a 1-D array of any of these | List of it (a multi-dimensional value is an error) |
//! | domains | as their base type |
//! | anything else (`inet`, `money`, ranges, composites, …) | Utf8, cast to `text` by the server (noted) |

use std::sync::Arc;

use arrow_array::ArrayRef;
use arrow_array::ListArray;
use arrow_array::builder::{
    BinaryBuilder, BooleanBuilder, Date32Builder, Decimal128Builder, Float32Builder,
    Float64Builder, Int16Builder, Int32Builder, Int64Builder, IntervalMonthDayNanoBuilder,
    StringBuilder, Time64MicrosecondBuilder, TimestampMicrosecondBuilder,
};
use arrow_buffer::{IntervalMonthDayNano, NullBufferBuilder, OffsetBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field, FieldRef, IntervalUnit, TimeUnit};
use tokio_postgres::types::{Kind, Type};

/// Days from 1970-01-01 to 2000-01-01, PostgreSQL's epoch.
const PG_EPOCH_DAYS: i32 = 10_957;
const PG_EPOCH_MICROS: i64 = PG_EPOCH_DAYS as i64 * 86_400_000_000;

/// How a column's cells are decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scalar {
    Bool,
    Int2,
    Int4,
    Int8,
    Float4,
    Float8,
    Decimal { precision: u8, scale: i8 },
    NumericText,
    Text,
    Jsonb,
    Date,
    Timestamp,
    TimestampTz,
    Time,
    Interval,
    Uuid,
    Bytea,
}

/// What to do with a column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    Scalar(Scalar),
    List(Scalar),
    /// No binary decoder: the server casts it to `text`.
    CastToText,
}

/// The plan for a column of type `ty` with type modifier `typmod` (-1 when none).
pub(crate) fn plan(ty: &Type, typmod: i32) -> Plan {
    if let Kind::Array(elem) = ty.kind() {
        return match scalar(elem, typmod) {
            Some(s) => Plan::List(s),
            None => Plan::CastToText,
        };
    }
    scalar(ty, typmod).map_or(Plan::CastToText, Plan::Scalar)
}

fn scalar(ty: &Type, typmod: i32) -> Option<Scalar> {
    match ty.kind() {
        Kind::Enum(_) => return Some(Scalar::Text),
        Kind::Domain(base) => return scalar(base, -1),
        _ => {}
    }
    Some(match *ty {
        Type::BOOL => Scalar::Bool,
        Type::INT2 => Scalar::Int2,
        Type::INT4 => Scalar::Int4,
        Type::INT8 => Scalar::Int8,
        Type::FLOAT4 => Scalar::Float4,
        Type::FLOAT8 => Scalar::Float8,
        Type::NUMERIC => numeric(typmod),
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::CHAR | Type::JSON => {
            Scalar::Text
        }
        Type::JSONB => Scalar::Jsonb,
        Type::DATE => Scalar::Date,
        Type::TIMESTAMP => Scalar::Timestamp,
        Type::TIMESTAMPTZ => Scalar::TimestampTz,
        Type::TIME => Scalar::Time,
        Type::INTERVAL => Scalar::Interval,
        Type::UUID => Scalar::Uuid,
        Type::BYTEA => Scalar::Bytea,
        // An extension type whose binary form is its text.
        _ if ty.name() == "citext" => Scalar::Text,
        _ => return None,
    })
}

/// `numeric(p,s)` from its type modifier: `((p << 16) | s) + 4`, s an 11-bit signed field.
fn numeric(typmod: i32) -> Scalar {
    if typmod < 4 {
        return Scalar::NumericText;
    }
    let t = typmod - 4;
    let precision = (t >> 16) & 0xffff;
    let scale = ((t & 0x7ff) ^ 1024) - 1024;
    match (u8::try_from(precision), i8::try_from(scale)) {
        (Ok(p), Ok(s)) if (1..=38).contains(&p) && s >= 0 && i32::from(s) <= precision => {
            Scalar::Decimal {
                precision: p,
                scale: s,
            }
        }
        _ => Scalar::NumericText,
    }
}

impl Scalar {
    pub(crate) fn data_type(self) -> DataType {
        match self {
            Self::Bool => DataType::Boolean,
            Self::Int2 => DataType::Int16,
            Self::Int4 => DataType::Int32,
            Self::Int8 => DataType::Int64,
            Self::Float4 => DataType::Float32,
            Self::Float8 => DataType::Float64,
            Self::Decimal { precision, scale } => DataType::Decimal128(precision, scale),
            Self::NumericText | Self::Text | Self::Jsonb | Self::Uuid => DataType::Utf8,
            Self::Date => DataType::Date32,
            Self::Timestamp => DataType::Timestamp(TimeUnit::Microsecond, None),
            Self::TimestampTz => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            Self::Time => DataType::Time64(TimeUnit::Microsecond),
            Self::Interval => DataType::Interval(IntervalUnit::MonthDayNano),
            Self::Bytea => DataType::Binary,
        }
    }
}

impl Plan {
    pub(crate) fn data_type(self) -> DataType {
        match self {
            Self::Scalar(s) => s.data_type(),
            Self::List(s) => DataType::List(list_field(s)),
            Self::CastToText => DataType::Utf8,
        }
    }
}

fn list_field(s: Scalar) -> FieldRef {
    Arc::new(Field::new_list_field(s.data_type(), true))
}

enum Builder {
    Bool(BooleanBuilder),
    I16(Int16Builder),
    I32(Int32Builder),
    I64(Int64Builder),
    F32(Float32Builder),
    F64(Float64Builder),
    Dec(Decimal128Builder),
    Str(StringBuilder),
    Bin(BinaryBuilder),
    Date(Date32Builder),
    Ts(TimestampMicrosecondBuilder),
    Time(Time64MicrosecondBuilder),
    Interval(IntervalMonthDayNanoBuilder),
}

/// One column of scalars being filled.
pub(crate) struct ScalarColumn {
    kind: Scalar,
    builder: Builder,
    /// Values stored as NULL because Arrow has no such value (±infinity dates and
    /// timestamps, NaN and ±Infinity numerics in a decimal column).
    pub(crate) nulled: u64,
}

fn be<const N: usize>(raw: &[u8]) -> Result<[u8; N], String> {
    <[u8; N]>::try_from(raw).map_err(|_| format!("expected {N} bytes, got {}", raw.len()))
}

fn utf8(raw: &[u8]) -> Result<&str, String> {
    std::str::from_utf8(raw).map_err(|_| "text that is not valid UTF-8".to_owned())
}

impl ScalarColumn {
    pub(crate) fn new(kind: Scalar, capacity: usize) -> Result<Self, String> {
        let builder = match kind {
            Scalar::Bool => Builder::Bool(BooleanBuilder::with_capacity(capacity)),
            Scalar::Int2 => Builder::I16(Int16Builder::with_capacity(capacity)),
            Scalar::Int4 => Builder::I32(Int32Builder::with_capacity(capacity)),
            Scalar::Int8 => Builder::I64(Int64Builder::with_capacity(capacity)),
            Scalar::Float4 => Builder::F32(Float32Builder::with_capacity(capacity)),
            Scalar::Float8 => Builder::F64(Float64Builder::with_capacity(capacity)),
            Scalar::Decimal { precision, scale } => Builder::Dec(
                Decimal128Builder::with_capacity(capacity)
                    .with_precision_and_scale(precision, scale)
                    .map_err(|e| e.to_string())?,
            ),
            Scalar::NumericText | Scalar::Text | Scalar::Jsonb | Scalar::Uuid => {
                Builder::Str(StringBuilder::with_capacity(capacity, capacity * 16))
            }
            Scalar::Bytea => Builder::Bin(BinaryBuilder::with_capacity(capacity, capacity * 16)),
            Scalar::Date => Builder::Date(Date32Builder::with_capacity(capacity)),
            Scalar::Timestamp => Builder::Ts(TimestampMicrosecondBuilder::with_capacity(capacity)),
            Scalar::TimestampTz => Builder::Ts(
                TimestampMicrosecondBuilder::with_capacity(capacity).with_timezone("UTC"),
            ),
            Scalar::Time => Builder::Time(Time64MicrosecondBuilder::with_capacity(capacity)),
            Scalar::Interval => {
                Builder::Interval(IntervalMonthDayNanoBuilder::with_capacity(capacity))
            }
        };
        Ok(Self {
            kind,
            builder,
            nulled: 0,
        })
    }

    /// Appends one cell (`None` is SQL NULL). An error says what was wrong with the bytes.
    #[inline]
    pub(crate) fn append(&mut self, raw: Option<&[u8]>) -> Result<(), String> {
        let Some(raw) = raw else {
            self.append_null();
            return Ok(());
        };
        match (&mut self.builder, self.kind) {
            (Builder::Bool(b), _) => b.append_value(be::<1>(raw)?[0] != 0),
            (Builder::I16(b), _) => b.append_value(i16::from_be_bytes(be(raw)?)),
            (Builder::I32(b), _) => b.append_value(i32::from_be_bytes(be(raw)?)),
            (Builder::I64(b), _) => b.append_value(i64::from_be_bytes(be(raw)?)),
            (Builder::F32(b), _) => b.append_value(f32::from_be_bytes(be(raw)?)),
            (Builder::F64(b), _) => b.append_value(f64::from_be_bytes(be(raw)?)),
            (Builder::Dec(b), Scalar::Decimal { scale, .. }) => {
                match Numeric::parse(raw)?.scaled(scale)? {
                    Some(v) => b.append_value(v),
                    None => {
                        self.nulled += 1;
                        b.append_null();
                    }
                }
            }
            (Builder::Str(b), Scalar::NumericText) => b.append_value(Numeric::parse(raw)?.text()),
            (Builder::Str(b), Scalar::Jsonb) => match raw.split_first() {
                Some((1, json)) => b.append_value(utf8(json)?),
                _ => return Err("a jsonb value of an unknown binary version".into()),
            },
            (Builder::Str(b), Scalar::Uuid) => b.append_value(utf8(&uuid_text(&be::<16>(raw)?))?),
            (Builder::Str(b), _) => b.append_value(utf8(raw)?),
            (Builder::Bin(b), _) => b.append_value(raw),
            (Builder::Date(b), _) => match i32::from_be_bytes(be(raw)?) {
                i32::MAX | i32::MIN => {
                    self.nulled += 1;
                    b.append_null();
                }
                d => b.append_value(d.checked_add(PG_EPOCH_DAYS).ok_or("date out of range")?),
            },
            (Builder::Ts(b), _) => match i64::from_be_bytes(be(raw)?) {
                i64::MAX | i64::MIN => {
                    self.nulled += 1;
                    b.append_null();
                }
                us => b.append_value(
                    us.checked_add(PG_EPOCH_MICROS)
                        .ok_or("timestamp out of range")?,
                ),
            },
            (Builder::Time(b), _) => b.append_value(i64::from_be_bytes(be(raw)?)),
            (Builder::Interval(b), _) => {
                let raw = be::<16>(raw)?;
                let [
                    u0,
                    u1,
                    u2,
                    u3,
                    u4,
                    u5,
                    u6,
                    u7,
                    d0,
                    d1,
                    d2,
                    d3,
                    m0,
                    m1,
                    m2,
                    m3,
                ] = raw;
                let micros = i64::from_be_bytes([u0, u1, u2, u3, u4, u5, u6, u7]);
                let days = i32::from_be_bytes([d0, d1, d2, d3]);
                let months = i32::from_be_bytes([m0, m1, m2, m3]);
                match micros.checked_mul(1000) {
                    Some(nanos) => b.append_value(IntervalMonthDayNano::new(months, days, nanos)),
                    // Infinite intervals (PostgreSQL 17) and ones beyond ±292 years of time.
                    None => {
                        self.nulled += 1;
                        b.append_null();
                    }
                }
            }
            (Builder::Dec(_), _) => return Err("internal: decimal builder without a scale".into()),
        }
        Ok(())
    }

    fn append_null(&mut self) {
        match &mut self.builder {
            Builder::Bool(b) => b.append_null(),
            Builder::I16(b) => b.append_null(),
            Builder::I32(b) => b.append_null(),
            Builder::I64(b) => b.append_null(),
            Builder::F32(b) => b.append_null(),
            Builder::F64(b) => b.append_null(),
            Builder::Dec(b) => b.append_null(),
            Builder::Str(b) => b.append_null(),
            Builder::Bin(b) => b.append_null(),
            Builder::Date(b) => b.append_null(),
            Builder::Ts(b) => b.append_null(),
            Builder::Time(b) => b.append_null(),
            Builder::Interval(b) => b.append_null(),
        }
    }

    fn len(&self) -> usize {
        use arrow_array::builder::ArrayBuilder;
        match &self.builder {
            Builder::Bool(b) => b.len(),
            Builder::I16(b) => b.len(),
            Builder::I32(b) => b.len(),
            Builder::I64(b) => b.len(),
            Builder::F32(b) => b.len(),
            Builder::F64(b) => b.len(),
            Builder::Dec(b) => b.len(),
            Builder::Str(b) => b.len(),
            Builder::Bin(b) => b.len(),
            Builder::Date(b) => b.len(),
            Builder::Ts(b) => b.len(),
            Builder::Time(b) => b.len(),
            Builder::Interval(b) => b.len(),
        }
    }

    pub(crate) fn finish(&mut self) -> ArrayRef {
        match &mut self.builder {
            Builder::Bool(b) => Arc::new(b.finish()),
            Builder::I16(b) => Arc::new(b.finish()),
            Builder::I32(b) => Arc::new(b.finish()),
            Builder::I64(b) => Arc::new(b.finish()),
            Builder::F32(b) => Arc::new(b.finish()),
            Builder::F64(b) => Arc::new(b.finish()),
            Builder::Dec(b) => Arc::new(b.finish()),
            Builder::Str(b) => Arc::new(b.finish()),
            Builder::Bin(b) => Arc::new(b.finish()),
            Builder::Date(b) => Arc::new(b.finish()),
            Builder::Ts(b) => Arc::new(b.finish()),
            Builder::Time(b) => Arc::new(b.finish()),
            Builder::Interval(b) => Arc::new(b.finish()),
        }
    }
}

/// A column of 1-D arrays: offsets and validity here, the elements in a scalar column.
pub(crate) struct ListColumn {
    field: FieldRef,
    offsets: Vec<i32>,
    validity: NullBufferBuilder,
    pub(crate) items: ScalarColumn,
}

impl ListColumn {
    fn new(kind: Scalar, capacity: usize) -> Result<Self, String> {
        let mut offsets = Vec::with_capacity(capacity + 1);
        offsets.push(0);
        Ok(Self {
            field: list_field(kind),
            offsets,
            validity: NullBufferBuilder::new(capacity),
            items: ScalarColumn::new(kind, capacity)?,
        })
    }

    /// The binary array format: ndim, has-null flag, element OID, (length, lower bound)
    /// per dimension, then each element as a length (-1 for NULL) and its bytes.
    fn append(&mut self, raw: Option<&[u8]>) -> Result<(), String> {
        let Some(raw) = raw else {
            self.validity.append_null();
            self.push_offset()?;
            return Ok(());
        };
        let short = || "a truncated array".to_owned();
        let word = |at: usize| -> Result<i32, String> {
            raw.get(at..at + 4)
                .and_then(|b| <[u8; 4]>::try_from(b).ok())
                .map(i32::from_be_bytes)
                .ok_or_else(short)
        };
        let ndim = word(0)?;
        let mut at = 12;
        let count = match ndim {
            0 => 0,
            1 => {
                at += 8;
                usize::try_from(word(12)?).map_err(|_| "a negative array length".to_owned())?
            }
            n => {
                return Err(format!(
                    "a {n}-dimensional array; only 1-dimensional arrays become lists"
                ));
            }
        };
        for _ in 0..count {
            let len = word(at)?;
            at += 4;
            if len < 0 {
                self.items.append(None)?;
            } else {
                let end = at + len as usize;
                self.items
                    .append(Some(raw.get(at..end).ok_or_else(short)?))?;
                at = end;
            }
        }
        self.validity.append_non_null();
        self.push_offset()
    }

    fn push_offset(&mut self) -> Result<(), String> {
        let end =
            i32::try_from(self.items.len()).map_err(|_| "too many list items in one batch")?;
        self.offsets.push(end);
        Ok(())
    }

    fn finish(&mut self) -> Result<ArrayRef, String> {
        let offsets = std::mem::replace(&mut self.offsets, vec![0]);
        let values = self.items.finish();
        let nulls = self.validity.finish();
        ListArray::try_new(
            self.field.clone(),
            OffsetBuffer::new(ScalarBuffer::from(offsets)),
            values,
            nulls,
        )
        .map(|a| Arc::new(a) as ArrayRef)
        .map_err(|e| e.to_string())
    }
}

/// One result column's builder.
pub(crate) enum Column {
    Scalar(ScalarColumn),
    List(ListColumn),
}

impl Column {
    pub(crate) fn new(plan: Plan, capacity: usize) -> Result<Self, String> {
        match plan {
            Plan::Scalar(s) => ScalarColumn::new(s, capacity).map(Self::Scalar),
            Plan::List(s) => ListColumn::new(s, capacity).map(Self::List),
            Plan::CastToText => ScalarColumn::new(Scalar::Text, capacity).map(Self::Scalar),
        }
    }

    #[inline]
    pub(crate) fn append(&mut self, raw: Option<&[u8]>) -> Result<(), String> {
        match self {
            Self::Scalar(c) => c.append(raw),
            Self::List(c) => c.append(raw),
        }
    }

    pub(crate) fn finish(&mut self) -> Result<ArrayRef, String> {
        match self {
            Self::Scalar(c) => Ok(c.finish()),
            Self::List(c) => c.finish(),
        }
    }

    /// Values stored as NULL because Arrow cannot hold them.
    pub(crate) fn nulled(&self) -> u64 {
        match self {
            Self::Scalar(c) => c.nulled,
            Self::List(c) => c.items.nulled,
        }
    }
}

/// `numeric` in its binary form: base-10000 digits with a weight (the power of 10000 of
/// the first digit), a sign and the display scale.
struct Numeric<'a> {
    digits: &'a [u8],
    weight: i32,
    sign: u16,
    dscale: u16,
}

const NUMERIC_NEG: u16 = 0x4000;
const NUMERIC_NAN: u16 = 0xC000;
const NUMERIC_PINF: u16 = 0xD000;
const NUMERIC_NINF: u16 = 0xF000;

impl<'a> Numeric<'a> {
    fn parse(raw: &'a [u8]) -> Result<Self, String> {
        let bad = || "a malformed numeric".to_owned();
        let h = raw.get(..8).ok_or_else(bad)?;
        let ndigits = usize::try_from(i16::from_be_bytes([h[0], h[1]])).map_err(|_| bad())?;
        let digits = raw.get(8..8 + 2 * ndigits).ok_or_else(bad)?;
        Ok(Self {
            digits,
            weight: i32::from(i16::from_be_bytes([h[2], h[3]])),
            sign: u16::from_be_bytes([h[4], h[5]]),
            dscale: u16::from_be_bytes([h[6], h[7]]),
        })
    }

    fn digit(&self, i: usize) -> i128 {
        match self.digits.get(2 * i..2 * i + 2) {
            Some(d) => i128::from(i16::from_be_bytes([d[0], d[1]])),
            None => 0,
        }
    }

    /// The value times 10^scale, exactly; `None` for NaN and ±Infinity. A value with more
    /// fraction digits than `scale` cannot come from a `numeric(p,s)` column.
    fn scaled(&self, scale: i8) -> Result<Option<i128>, String> {
        if matches!(self.sign, NUMERIC_NAN | NUMERIC_PINF | NUMERIC_NINF) {
            return Ok(None);
        }
        let n = self.digits.len() / 2;
        let overflow = || "a numeric too large for a decimal column".to_owned();
        let mut acc: i128 = 0;
        for i in 0..n {
            acc = acc
                .checked_mul(10_000)
                .and_then(|a| a.checked_add(self.digit(i)))
                .ok_or_else(overflow)?;
        }
        // acc = value · 10^(4·(n − 1 − weight)); we want value · 10^scale.
        let shift = i32::from(scale) - 4 * (n as i32 - 1 - self.weight);
        if n == 0 {
            acc = 0;
        } else if shift >= 0 {
            acc = 10i128
                .checked_pow(shift as u32)
                .and_then(|p| acc.checked_mul(p))
                .ok_or_else(overflow)?;
        } else {
            let p = 10i128.checked_pow((-shift) as u32).ok_or_else(overflow)?;
            if acc % p != 0 {
                return Err("a numeric with more fraction digits than its column's scale".into());
            }
            acc /= p;
        }
        Ok(Some(if self.sign == NUMERIC_NEG { -acc } else { acc }))
    }

    /// The text PostgreSQL itself prints: no exponent, `dscale` fraction digits.
    fn text(&self) -> String {
        match self.sign {
            NUMERIC_NAN => return "NaN".into(),
            NUMERIC_PINF => return "Infinity".into(),
            NUMERIC_NINF => return "-Infinity".into(),
            _ => {}
        }
        let mut s = String::with_capacity(self.digits.len() * 2 + 4);
        if self.sign == NUMERIC_NEG {
            s.push('-');
        }
        if self.weight < 0 {
            s.push('0');
        } else {
            for w in 0..=self.weight {
                let d = self.digit(w as usize);
                if w == 0 {
                    s.push_str(&d.to_string());
                } else {
                    s.push_str(&format!("{d:04}"));
                }
            }
        }
        if self.dscale > 0 {
            s.push('.');
            let mut frac = String::with_capacity(usize::from(self.dscale) + 4);
            let mut i = self.weight + 1;
            while frac.len() < usize::from(self.dscale) {
                let d = if i >= 0 { self.digit(i as usize) } else { 0 };
                frac.push_str(&format!("{d:04}"));
                i += 1;
            }
            frac.truncate(usize::from(self.dscale));
            s.push_str(&frac);
        }
        s
    }
}

/// `8-4-4-4-12` lower-case hex, the form PostgreSQL prints and Python's `uuid` parses.
fn uuid_text(b: &[u8; 16]) -> [u8; 36] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [b'-'; 36];
    let mut at = 0;
    for (i, byte) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            at += 1;
        }
        out[at] = HEX[usize::from(byte >> 4)];
        out[at + 1] = HEX[usize::from(byte & 0xf)];
        at += 2;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numeric_bytes(weight: i16, sign: u16, dscale: u16, digits: &[i16]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&(digits.len() as i16).to_be_bytes());
        v.extend_from_slice(&weight.to_be_bytes());
        v.extend_from_slice(&sign.to_be_bytes());
        v.extend_from_slice(&dscale.to_be_bytes());
        for d in digits {
            v.extend_from_slice(&d.to_be_bytes());
        }
        v
    }

    #[test]
    fn numerics_scale_exactly_and_print_like_postgres() {
        // 12345.67 = [1, 2345, 6700], weight 1
        let b = numeric_bytes(1, 0, 2, &[1, 2345, 6700]);
        let n = Numeric::parse(&b).unwrap();
        assert_eq!(n.scaled(2).unwrap(), Some(1_234_567));
        assert_eq!(n.scaled(4).unwrap(), Some(123_456_700));
        assert_eq!(n.text(), "12345.67");
        // -0.005 = [50], weight -1, dscale 3
        let b = numeric_bytes(-1, NUMERIC_NEG, 3, &[50]);
        let n = Numeric::parse(&b).unwrap();
        assert_eq!(n.scaled(3).unwrap(), Some(-5));
        assert_eq!(n.text(), "-0.005");
        // 10000 = [1], weight 1 (trailing zero groups are dropped)
        let b = numeric_bytes(1, 0, 0, &[1]);
        let n = Numeric::parse(&b).unwrap();
        assert_eq!(n.scaled(2).unwrap(), Some(1_000_000));
        assert_eq!(n.text(), "10000");
        // 0.00 and NaN
        let b = numeric_bytes(0, 0, 2, &[]);
        assert_eq!(Numeric::parse(&b).unwrap().text(), "0.00");
        assert_eq!(Numeric::parse(&b).unwrap().scaled(2).unwrap(), Some(0));
        let b = numeric_bytes(0, NUMERIC_NAN, 0, &[]);
        assert_eq!(Numeric::parse(&b).unwrap().scaled(2).unwrap(), None);
        assert_eq!(Numeric::parse(&b).unwrap().text(), "NaN");
    }

    #[test]
    fn uuids_print_canonically() {
        let b: [u8; 16] = [
            0xa0, 0xee, 0xbc, 0x99, 0x9c, 0x0b, 0x4e, 0xf8, 0xbb, 0x6d, 0x6b, 0xb9, 0xbd, 0x38,
            0x0a, 0x11,
        ];
        assert_eq!(
            std::str::from_utf8(&uuid_text(&b)).unwrap(),
            "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
        );
    }

    #[test]
    fn numeric_type_modifiers() {
        let tm = |p: i32, s: i32| ((p << 16) | (s & 0x7ff)) + 4;
        assert_eq!(
            numeric(tm(12, 2)),
            Scalar::Decimal {
                precision: 12,
                scale: 2
            }
        );
        assert_eq!(numeric(-1), Scalar::NumericText);
        assert_eq!(numeric(tm(40, 2)), Scalar::NumericText);
        assert_eq!(numeric(tm(5, -2)), Scalar::NumericText);
    }
}
