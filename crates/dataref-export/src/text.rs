//! Cells as text, written straight into a byte buffer (CSV and JSON share the scalar forms).

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Date64Type, Decimal128Type, Float16Type, Float32Type, Float64Type, Int8Type,
    Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrayRef};
use arrow_schema::DataType;

/// How one cell is to be written.
pub(crate) enum Cell<'a> {
    Null,
    /// Text the reader must see as text (quoted in JSON, maybe quoted in CSV).
    Text(&'a str),
    /// A number, boolean, date or timestamp, already written to the scratch buffer in a form
    /// that needs no quoting in CSV (dates and timestamps are quoted in JSON).
    Scalar {
        quote_in_json: bool,
    },
    /// Anything else, through the store's JSON form.
    Json(serde_json::Value),
}

/// `array[row]` as a [`Cell`]; scalars are appended to `scratch` (cleared first).
pub(crate) fn cell<'a>(array: &'a ArrayRef, row: usize, scratch: &mut Vec<u8>) -> Cell<'a> {
    scratch.clear();
    if array.is_null(row) {
        return Cell::Null;
    }
    let mut int = itoa::Buffer::new();
    let push_int = |scratch: &mut Vec<u8>, s: &str| scratch.extend_from_slice(s.as_bytes());
    match array.data_type() {
        DataType::Utf8 => return Cell::Text(array.as_string::<i32>().value(row)),
        DataType::LargeUtf8 => return Cell::Text(array.as_string::<i64>().value(row)),
        DataType::Utf8View => return Cell::Text(array.as_string_view().value(row)),
        DataType::Boolean => {
            let v = array.as_boolean().value(row);
            scratch.extend_from_slice(if v { b"true" } else { b"false" });
        }
        DataType::Int8 => push_int(
            scratch,
            int.format(array.as_primitive::<Int8Type>().value(row)),
        ),
        DataType::Int16 => push_int(
            scratch,
            int.format(array.as_primitive::<Int16Type>().value(row)),
        ),
        DataType::Int32 => push_int(
            scratch,
            int.format(array.as_primitive::<Int32Type>().value(row)),
        ),
        DataType::Int64 => push_int(
            scratch,
            int.format(array.as_primitive::<Int64Type>().value(row)),
        ),
        DataType::UInt8 => push_int(
            scratch,
            int.format(array.as_primitive::<UInt8Type>().value(row)),
        ),
        DataType::UInt16 => push_int(
            scratch,
            int.format(array.as_primitive::<UInt16Type>().value(row)),
        ),
        DataType::UInt32 => push_int(
            scratch,
            int.format(array.as_primitive::<UInt32Type>().value(row)),
        ),
        DataType::UInt64 => push_int(
            scratch,
            int.format(array.as_primitive::<UInt64Type>().value(row)),
        ),
        DataType::Float16 => float(
            scratch,
            f64::from(array.as_primitive::<Float16Type>().value(row).to_f32()),
        ),
        DataType::Float32 => float(
            scratch,
            f64::from(array.as_primitive::<Float32Type>().value(row)),
        ),
        DataType::Float64 => float(scratch, array.as_primitive::<Float64Type>().value(row)),
        DataType::Decimal128(_, scale) => decimal(
            scratch,
            array.as_primitive::<Decimal128Type>().value(row),
            *scale,
        ),
        DataType::Date32 => {
            date(
                scratch,
                i64::from(array.as_primitive::<Date32Type>().value(row)),
            );
            return Cell::Scalar {
                quote_in_json: true,
            };
        }
        DataType::Date64 => {
            let ms = array.as_primitive::<Date64Type>().value(row);
            date(scratch, ms.div_euclid(86_400_000));
            return Cell::Scalar {
                quote_in_json: true,
            };
        }
        DataType::Timestamp(unit, tz) => {
            let us = timestamp_micros(array, row, *unit);
            scratch.extend_from_slice(dataref_store::format_timestamp_micros(us).as_bytes());
            if tz.is_some() {
                // Arrow keeps zoned timestamps as UTC instants.
                scratch.push(b'Z');
            }
            return Cell::Scalar {
                quote_in_json: true,
            };
        }
        _ => return Cell::Json(dataref_store::cell_to_json(array, row, None).0),
    }
    Cell::Scalar {
        quote_in_json: false,
    }
}

pub(crate) use dataref_store::timestamp_micros;

/// Shortest round-trip form (`1814.9`, `2.0`); `NaN`, `inf`, `-inf` otherwise.
fn float(scratch: &mut Vec<u8>, v: f64) {
    if v.is_finite() {
        scratch.extend_from_slice(ryu::Buffer::new().format_finite(v).as_bytes());
    } else if v.is_nan() {
        scratch.extend_from_slice(b"NaN");
    } else if v > 0.0 {
        scratch.extend_from_slice(b"inf");
    } else {
        scratch.extend_from_slice(b"-inf");
    }
}

/// `YYYY-MM-DD`.
fn date(scratch: &mut Vec<u8>, days: i64) {
    let (y, m, d) = dataref_protocol::civil_from_days(days);
    if (0..=9999).contains(&y) {
        let y = y as u32;
        scratch.extend_from_slice(&[
            b'0' + (y / 1000) as u8,
            b'0' + (y / 100 % 10) as u8,
            b'0' + (y / 10 % 10) as u8,
            b'0' + (y % 10) as u8,
            b'-',
            b'0' + (m / 10) as u8,
            b'0' + (m % 10) as u8,
            b'-',
            b'0' + (d / 10) as u8,
            b'0' + (d % 10) as u8,
        ]);
    } else {
        scratch.extend_from_slice(dataref_store::format_date(days).as_bytes());
    }
}

/// A decimal's exact digits with its scale (`-12.50` for 1250 at scale 2).
fn decimal(scratch: &mut Vec<u8>, v: i128, scale: i8) {
    let digits = v.unsigned_abs().to_string();
    if v < 0 {
        scratch.push(b'-');
    }
    if scale <= 0 {
        scratch.extend_from_slice(digits.as_bytes());
        scratch.extend(std::iter::repeat_n(b'0', usize::from(scale.unsigned_abs())));
        return;
    }
    let scale = usize::from(scale.unsigned_abs());
    if digits.len() <= scale {
        scratch.extend_from_slice(b"0.");
        scratch.extend(std::iter::repeat_n(b'0', scale - digits.len()));
        scratch.extend_from_slice(digits.as_bytes());
    } else {
        let (int, frac) = digits.split_at(digits.len() - scale);
        scratch.extend_from_slice(int.as_bytes());
        scratch.push(b'.');
        scratch.extend_from_slice(frac.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dec(v: i128, scale: i8) -> String {
        let mut s = Vec::new();
        decimal(&mut s, v, scale);
        String::from_utf8(s).unwrap()
    }

    #[test]
    fn decimals_keep_their_digits() {
        assert_eq!(dec(1250, 2), "12.50");
        assert_eq!(dec(-5, 3), "-0.005");
        assert_eq!(dec(7, 0), "7");
        assert_eq!(dec(7, -2), "700");
    }

    #[test]
    fn dates_and_floats() {
        let mut s = Vec::new();
        date(&mut s, 0);
        assert_eq!(s, b"1970-01-01");
        s.clear();
        float(&mut s, 1814.9);
        assert_eq!(s, b"1814.9");
        s.clear();
        float(&mut s, f64::NAN);
        assert_eq!(s, b"NaN");
    }
}
