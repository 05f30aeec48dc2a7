//! Arrow cells as JSON values, type names as the model reads them, and "did you mean".

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Date64Type, Decimal128Type, DurationMicrosecondType, DurationMillisecondType,
    DurationNanosecondType, DurationSecondType, Float32Type, Float64Type, Int8Type, Int16Type,
    Int32Type, Int64Type, IntervalDayTimeType, IntervalMonthDayNanoType, IntervalYearMonthType,
    Time32MillisecondType, Time32SecondType, Time64MicrosecondType, Time64NanosecondType,
    TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType,
    TimestampSecondType, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrayRef};
use arrow_schema::{DataType, IntervalUnit, TimeUnit};
use dataref_protocol::civil_from_days;
use serde_json::Value;

/// The type of a column as the model reads it in a description.
pub fn type_name(dt: &DataType) -> String {
    match dt {
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => "integer".into(),
        DataType::UInt8 | DataType::UInt16 | DataType::UInt32 | DataType::UInt64 => {
            "integer".into()
        }
        DataType::Float16 | DataType::Float32 | DataType::Float64 => "float".into(),
        DataType::Decimal128(p, s) | DataType::Decimal256(p, s) => format!("decimal({p},{s})"),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "string".into(),
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => "binary".into(),
        DataType::Boolean => "boolean".into(),
        DataType::Date32 | DataType::Date64 => "date".into(),
        DataType::Timestamp(_, None) => "timestamp".into(),
        DataType::Timestamp(_, Some(tz)) => format!("timestamp({tz})"),
        DataType::Time32(_) | DataType::Time64(_) => "time".into(),
        DataType::Interval(_) => "interval".into(),
        DataType::Duration(_) => "duration".into(),
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            format!("list<{}>", type_name(f.data_type()))
        }
        DataType::Null => "null".into(),
        other => other.to_string().to_lowercase(),
    }
}

/// Formats days since the epoch as `YYYY-MM-DD`.
pub fn format_date(days: i64) -> String {
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Formats microseconds since the epoch as `YYYY-MM-DDTHH:MM:SS[.ffffff]`.
pub fn format_timestamp_micros(us: i64) -> String {
    let secs = us.div_euclid(1_000_000);
    let frac = us.rem_euclid(1_000_000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let date = format_date(days);
    let (h, m, s) = (sod / 3600, sod % 3600 / 60, sod % 60);
    if frac == 0 {
        format!("{date}T{h:02}:{m:02}:{s:02}")
    } else {
        format!("{date}T{h:02}:{m:02}:{s:02}.{frac:06}")
    }
}

/// Microseconds since the epoch of a timestamp cell (floored, so instants before 1970 stay
/// on the right side of a second).
pub fn timestamp_micros(array: &ArrayRef, row: usize, unit: TimeUnit) -> i64 {
    match unit {
        TimeUnit::Second => array
            .as_primitive::<TimestampSecondType>()
            .value(row)
            .saturating_mul(1_000_000),
        TimeUnit::Millisecond => array
            .as_primitive::<TimestampMillisecondType>()
            .value(row)
            .saturating_mul(1000),
        TimeUnit::Microsecond => array.as_primitive::<TimestampMicrosecondType>().value(row),
        TimeUnit::Nanosecond => array
            .as_primitive::<TimestampNanosecondType>()
            .value(row)
            .div_euclid(1000),
    }
}

fn cut(s: &str, max_chars: Option<usize>) -> (Value, bool) {
    match max_chars {
        Some(max) if s.chars().count() > max => {
            let kept: String = s.chars().take(max).collect();
            (Value::String(format!("{kept}…")), true)
        }
        _ => (Value::String(s.to_owned()), false),
    }
}

/// Microseconds since midnight as `HH:MM:SS[.ffffff]`.
pub fn format_time_micros(us: i64) -> String {
    let secs = us.div_euclid(1_000_000);
    let frac = us.rem_euclid(1_000_000);
    let (h, m, s) = (secs / 3600, secs % 3600 / 60, secs % 60);
    if frac == 0 {
        format!("{h:02}:{m:02}:{s:02}")
    } else {
        format!("{h:02}:{m:02}:{s:02}.{frac:06}")
    }
}

/// Microseconds since midnight of a time cell.
pub fn time_micros(array: &ArrayRef, row: usize, unit: TimeUnit) -> i64 {
    match unit {
        TimeUnit::Second => {
            i64::from(array.as_primitive::<Time32SecondType>().value(row)) * 1_000_000
        }
        TimeUnit::Millisecond => {
            i64::from(array.as_primitive::<Time32MillisecondType>().value(row)) * 1000
        }
        TimeUnit::Microsecond => array.as_primitive::<Time64MicrosecondType>().value(row),
        TimeUnit::Nanosecond => array.as_primitive::<Time64NanosecondType>().value(row) / 1000,
    }
}

/// An interval as an ISO 8601 duration (`P1Y2M3DT4H5M6.5S`, `P-1D`, `PT0S`): what pandas,
/// JavaScript libraries and people read. Each part keeps its own sign, as PostgreSQL's do.
pub fn format_interval(months: i64, days: i64, nanos: i64) -> String {
    let mut s = String::from("P");
    let (y, mo) = (months / 12, months % 12);
    if y != 0 {
        s.push_str(&format!("{y}Y"));
    }
    if mo != 0 {
        s.push_str(&format!("{mo}M"));
    }
    if days != 0 {
        s.push_str(&format!("{days}D"));
    }
    if nanos != 0 {
        s.push('T');
        let sign = if nanos < 0 { "-" } else { "" };
        let n = nanos.unsigned_abs();
        let (h, rest) = (n / 3_600_000_000_000, n % 3_600_000_000_000);
        let (m, rest) = (rest / 60_000_000_000, rest % 60_000_000_000);
        let (sec, frac) = (rest / 1_000_000_000, rest % 1_000_000_000);
        if h != 0 {
            s.push_str(&format!("{sign}{h}H"));
        }
        if m != 0 {
            s.push_str(&format!("{sign}{m}M"));
        }
        if sec != 0 || frac != 0 {
            let frac = if frac == 0 {
                String::new()
            } else {
                format!(".{frac:09}").trim_end_matches('0').to_owned()
            };
            s.push_str(&format!("{sign}{sec}{frac}S"));
        }
    }
    if s == "P" {
        s.push_str("T0S");
    }
    s
}

/// A decimal as a JSON number when it has at most 15 significant digits (then the f64 is
/// the nearest to the decimal and prints as exactly it), else as its exact text.
fn decimal_json(v: i128, scale: i8) -> Value {
    // A whole number (an exact integer sum) as an integer: `123`, not `123.0`.
    if scale == 0
        && let Ok(n) = i64::try_from(v)
    {
        return Value::from(n);
    }
    if scale >= 0 && v.unsigned_abs() < 1_000_000_000_000_000 && scale <= 22 {
        let f = v as f64 / 10f64.powi(i32::from(scale));
        if let Some(n) = serde_json::Number::from_f64(f) {
            return Value::Number(n);
        }
    }
    Value::String(format_decimal(v, scale))
}

/// The exact decimal text of `v · 10^-scale`.
pub fn format_decimal(v: i128, scale: i8) -> String {
    if scale <= 0 {
        let zeros = "0".repeat(usize::from(scale.unsigned_abs()));
        return if v == 0 {
            "0".into()
        } else {
            format!("{v}{zeros}")
        };
    }
    let scale = usize::from(scale.unsigned_abs());
    let digits = v.unsigned_abs().to_string();
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (int, frac) = padded.split_at(padded.len() - scale);
    let sign = if v < 0 { "-" } else { "" };
    format!("{sign}{int}.{frac}")
}

/// List elements shown in a cut cell (a sample); the rest is counted.
const LIST_SHOWN: usize = 10;

fn float(v: f64) -> Value {
    serde_json::Number::from_f64(v)
        .map(Value::Number)
        .unwrap_or_else(|| Value::String(v.to_string()))
}

/// The first `max_rows` rows of `batches` as JSON records (`[{"col": value, …}, …]`) and how
/// many rows that was: what the naive pattern sends the model, for measuring what returning
/// rows would cost (`dataref demo`, the benchmarks).
pub fn records_json(batches: &[arrow_array::RecordBatch], max_rows: usize) -> (String, usize) {
    let mut records = Vec::new();
    'outer: for batch in batches {
        let schema = batch.schema();
        for row in 0..batch.num_rows() {
            if records.len() >= max_rows {
                break 'outer;
            }
            let mut m = serde_json::Map::new();
            for (i, field) in schema.fields().iter().enumerate() {
                m.insert(
                    field.name().clone(),
                    cell_to_json(batch.column(i), row, None).0,
                );
            }
            records.push(Value::Object(m));
        }
    }
    let n = records.len();
    (Value::Array(records).to_string(), n)
}

/// One cell as JSON. Strings (and hex-encoded binary) longer than `max_chars` are cut and
/// end in `…`, and lists show their first ten elements; the bool says whether that
/// happened. Dates are `YYYY-MM-DD`, timestamps ISO 8601, times `HH:MM:SS[.ffffff]`,
/// intervals ISO 8601 durations, decimals numbers (text past 15 significant digits),
/// lists arrays, non-finite floats strings.
pub fn cell_to_json(array: &ArrayRef, row: usize, max_chars: Option<usize>) -> (Value, bool) {
    if array.is_null(row) {
        return (Value::Null, false);
    }
    let v = match array.data_type() {
        DataType::Boolean => Value::Bool(array.as_boolean().value(row)),
        DataType::Int8 => Value::from(array.as_primitive::<Int8Type>().value(row)),
        DataType::Int16 => Value::from(array.as_primitive::<Int16Type>().value(row)),
        DataType::Int32 => Value::from(array.as_primitive::<Int32Type>().value(row)),
        DataType::Int64 => Value::from(array.as_primitive::<Int64Type>().value(row)),
        DataType::UInt8 => Value::from(array.as_primitive::<UInt8Type>().value(row)),
        DataType::UInt16 => Value::from(array.as_primitive::<UInt16Type>().value(row)),
        DataType::UInt32 => Value::from(array.as_primitive::<UInt32Type>().value(row)),
        DataType::UInt64 => Value::from(array.as_primitive::<UInt64Type>().value(row)),
        DataType::Float32 => float(f64::from(array.as_primitive::<Float32Type>().value(row))),
        DataType::Float64 => float(array.as_primitive::<Float64Type>().value(row)),
        DataType::Date32 => Value::String(format_date(i64::from(
            array.as_primitive::<Date32Type>().value(row),
        ))),
        DataType::Date64 => Value::String(format_date(
            array
                .as_primitive::<Date64Type>()
                .value(row)
                .div_euclid(86_400_000),
        )),
        // A zoned timestamp is a UTC instant; its type (`timestamp(UTC)`) says so.
        DataType::Timestamp(unit, _) => {
            Value::String(format_timestamp_micros(timestamp_micros(array, row, *unit)))
        }
        DataType::Time32(unit) | DataType::Time64(unit) => {
            Value::String(format_time_micros(time_micros(array, row, *unit)))
        }
        DataType::Decimal128(_, scale) => {
            decimal_json(array.as_primitive::<Decimal128Type>().value(row), *scale)
        }
        DataType::Interval(IntervalUnit::MonthDayNano) => {
            let v = array.as_primitive::<IntervalMonthDayNanoType>().value(row);
            Value::String(format_interval(
                i64::from(v.months),
                i64::from(v.days),
                v.nanoseconds,
            ))
        }
        DataType::Interval(IntervalUnit::DayTime) => {
            let v = array.as_primitive::<IntervalDayTimeType>().value(row);
            Value::String(format_interval(
                0,
                i64::from(v.days),
                i64::from(v.milliseconds) * 1_000_000,
            ))
        }
        DataType::Interval(IntervalUnit::YearMonth) => Value::String(format_interval(
            i64::from(array.as_primitive::<IntervalYearMonthType>().value(row)),
            0,
            0,
        )),
        DataType::Duration(unit) => {
            Value::String(format_interval(0, 0, duration_nanos(array, row, *unit)))
        }
        DataType::List(_) | DataType::LargeList(_) => {
            let items = match array.data_type() {
                DataType::LargeList(_) => array.as_list::<i64>().value(row),
                _ => array.as_list::<i32>().value(row),
            };
            // Only a cut cell (a sample) shows the first elements; exports get them all.
            let shown = match max_chars {
                Some(_) => items.len().min(LIST_SHOWN),
                None => items.len(),
            };
            let mut cut_any = shown < items.len();
            let mut out: Vec<Value> = (0..shown)
                .map(|i| {
                    let (v, cut) = cell_to_json(&items, i, max_chars);
                    cut_any |= cut;
                    v
                })
                .collect();
            if shown < items.len() {
                out.push(Value::String(format!("… {} more", items.len() - shown)));
            }
            return (Value::Array(out), cut_any);
        }
        DataType::Utf8 => return cut(array.as_string::<i32>().value(row), max_chars),
        DataType::LargeUtf8 => return cut(array.as_string::<i64>().value(row), max_chars),
        // What the SQL engine's casts and string functions give.
        DataType::Utf8View => return cut(array.as_string_view().value(row), max_chars),
        DataType::Binary => return cut(&hex(array.as_binary::<i32>().value(row)), max_chars),
        DataType::LargeBinary => return cut(&hex(array.as_binary::<i64>().value(row)), max_chars),
        DataType::BinaryView => return cut(&hex(array.as_binary_view().value(row)), max_chars),
        // Everything else (structs, maps, unions…) as Arrow writes it: a value, never a
        // placeholder in its place.
        _ => {
            let text = arrow_cast::display::ArrayFormatter::try_new(
                array.as_ref(),
                &arrow_cast::display::FormatOptions::default(),
            )
            .map(|f| f.value(row).to_string())
            .unwrap_or_else(|_| format!("<{}>", type_name(array.data_type())));
            return cut(&text, max_chars);
        }
    };
    (v, false)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A duration cell in nanoseconds (saturating: ±292 years).
fn duration_nanos(array: &ArrayRef, row: usize, unit: TimeUnit) -> i64 {
    match unit {
        TimeUnit::Second => array
            .as_primitive::<DurationSecondType>()
            .value(row)
            .saturating_mul(1_000_000_000),
        TimeUnit::Millisecond => array
            .as_primitive::<DurationMillisecondType>()
            .value(row)
            .saturating_mul(1_000_000),
        TimeUnit::Microsecond => array
            .as_primitive::<DurationMicrosecondType>()
            .value(row)
            .saturating_mul(1_000),
        TimeUnit::Nanosecond => array.as_primitive::<DurationNanosecondType>().value(row),
    }
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The candidates closest to `wanted` (case-insensitive edit distance of at most a third of
/// its length, or a prefix/substring match), best first.
pub fn closest<'a>(wanted: &str, candidates: &'a [String]) -> Vec<&'a str> {
    let w = wanted.to_lowercase();
    let mut scored: Vec<(usize, &str)> = candidates
        .iter()
        .filter_map(|c| {
            let lc = c.to_lowercase();
            let d = edit_distance(&w, &lc);
            let close = d <= (w.chars().count() / 3).max(1) || lc.contains(&w) || w.contains(&lc);
            close.then_some((d, c.as_str()))
        })
        .collect();
    scored.sort();
    scored.into_iter().take(3).map(|(_, c)| c).collect()
}

/// "did you mean `revenue`?" plus the list of what exists (bounded).
pub fn did_you_mean(wanted: &str, available: &[String]) -> String {
    let close = closest(wanted, available);
    let listed: Vec<String> = available
        .iter()
        .take(50)
        .map(|c| format!("`{c}`"))
        .collect();
    let more = available.len().saturating_sub(50);
    let mut s = String::new();
    if let Some(best) = close.first() {
        s.push_str(&format!("did you mean `{best}`? "));
    }
    s.push_str("available: ");
    s.push_str(&listed.join(", "));
    if more > 0 {
        s.push_str(&format!(" and {more} more"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggestions() {
        let cols: Vec<String> = ["date", "revenue", "region"].map(String::from).to_vec();
        assert_eq!(closest("revenu", &cols), vec!["revenue"]);
        assert_eq!(
            did_you_mean("Revenue", &cols),
            "did you mean `revenue`? available: `date`, `revenue`, `region`"
        );
        assert!(closest("zzzzzz", &cols).is_empty());
    }

    #[test]
    fn decimals_intervals_and_times_read_naturally() {
        assert_eq!(format_decimal(1_234_567, 2), "12345.67");
        assert_eq!(format_decimal(-5, 3), "-0.005");
        assert_eq!(format_decimal(7, 0), "7");
        assert_eq!(format_decimal(7, -2), "700");
        assert_eq!(decimal_json(1050, 2), serde_json::json!(10.5));
        assert_eq!(
            decimal_json(12_345_678_901_234_567_890, 2),
            serde_json::json!("123456789012345678.90")
        );
        let nanos = ((4 * 3600 + 5 * 60 + 6) * 1_000_000 + 500_000) * 1000;
        assert_eq!(format_interval(14, 3, nanos), "P1Y2M3DT4H5M6.5S");
        assert_eq!(format_interval(0, -1, 0), "P-1D");
        assert_eq!(format_interval(0, 0, 0), "PT0S");
        assert_eq!(format_interval(0, 0, -90 * 1_000_000_000), "PT-1M-30S");
        assert_eq!(
            format_time_micros(13 * 3_600_000_000 + 500_000),
            "13:00:00.500000"
        );
    }

    #[test]
    fn dates() {
        assert_eq!(format_date(0), "1970-01-01");
        assert_eq!(
            format_timestamp_micros(1_500_000),
            "1970-01-01T00:00:01.500000"
        );
        assert_eq!(format_timestamp_micros(-1), "1969-12-31T23:59:59.999999");
    }
}
