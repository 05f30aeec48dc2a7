//! Statistics of one column, computed on typed Arrow arrays.
//!
//! The hot loops read native values (`&[i64]`, `&str` borrowed from the array) and never
//! build JSON per cell; JSON is made once per column at the end.

use std::marker::PhantomData;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    ArrowPrimitiveType, BinaryViewType, Date32Type, Date64Type, Decimal128Type, Float16Type,
    Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, StringViewType,
    Time32MillisecondType, Time32SecondType, Time64MicrosecondType, Time64NanosecondType,
    TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType,
    TimestampSecondType, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrayRef, OffsetSizeTrait, PrimitiveArray};
use arrow_schema::{DataType, Field, TimeUnit};
use dataref_protocol::{ColumnStats, TopValue};
use serde_json::Value;

use super::distinct::Distinct;
use super::frequent::StringFrequencies;
use super::numeric::{FirstPass, KeySource, for_the_model, sort_key, summarize_column};
use crate::value::{format_date, format_time_micros, format_timestamp_micros, type_name};

/// Most frequent values listed per column.
const TOP_VALUES: usize = 5;
/// String min/max/top values longer than this are cut and end in `…`.
const MAX_VALUE_CHARS: usize = 80;

/// Statistics of the column `field`, whose values are `arrays` (one per batch).
pub(super) fn column_stats(field: &Field, arrays: &[&ArrayRef]) -> ColumnStats {
    let total: usize = arrays.iter().map(|a| a.len()).sum();
    // Logical nulls: a `Null`-typed array has no validity buffer but is all null.
    let nulls: usize = arrays.iter().map(|a| a.logical_null_count()).sum();
    let mut s = ColumnStats {
        name: field.name().clone(),
        data_type: type_name(field.data_type()),
        count: (total - nulls) as u64,
        nulls: nulls as u64,
        non_finite: 0,
        distinct: 0,
        distinct_is_estimate: false,
        min: None,
        max: None,
        numeric: None,
        top: Vec::new(),
        top_is_estimate: false,
        note: None,
    };
    match field.data_type() {
        DataType::Int8 => ints::<Int8Type>(&mut s, arrays),
        DataType::Int16 => ints::<Int16Type>(&mut s, arrays),
        DataType::Int32 => ints::<Int32Type>(&mut s, arrays),
        DataType::Int64 => ints::<Int64Type>(&mut s, arrays),
        DataType::UInt8 => ints::<UInt8Type>(&mut s, arrays),
        DataType::UInt16 => ints::<UInt16Type>(&mut s, arrays),
        DataType::UInt32 => ints::<UInt32Type>(&mut s, arrays),
        DataType::UInt64 => ints::<UInt64Type>(&mut s, arrays),
        DataType::Float16 => floats::<Float16Type>(&mut s, arrays),
        DataType::Float32 => floats::<Float32Type>(&mut s, arrays),
        DataType::Float64 => floats::<Float64Type>(&mut s, arrays),
        DataType::Decimal128(_, scale) => decimals(&mut s, arrays, *scale),
        DataType::Date32 => temporal::<Date32Type>(&mut s, arrays, format_date),
        DataType::Date64 => {
            temporal::<Date64Type>(&mut s, arrays, |ms| format_date(ms.div_euclid(86_400_000)))
        }
        DataType::Timestamp(unit, _) => timestamps(&mut s, arrays, *unit),
        DataType::Time32(TimeUnit::Second) => {
            temporal::<Time32SecondType>(&mut s, arrays, |v| format_time_micros(v * 1_000_000))
        }
        DataType::Time32(TimeUnit::Millisecond) => {
            temporal::<Time32MillisecondType>(&mut s, arrays, |v| format_time_micros(v * 1000))
        }
        DataType::Time64(TimeUnit::Microsecond) => {
            temporal::<Time64MicrosecondType>(&mut s, arrays, format_time_micros)
        }
        DataType::Time64(TimeUnit::Nanosecond) => {
            temporal::<Time64NanosecondType>(&mut s, arrays, |v| format_time_micros(v / 1000))
        }
        DataType::Utf8 => utf8::<i32>(&mut s, arrays),
        DataType::LargeUtf8 => utf8::<i64>(&mut s, arrays),
        DataType::Utf8View => strings(
            &mut s,
            arrays
                .iter()
                .map(|a| a.as_byte_view::<StringViewType>().iter()),
        ),
        DataType::Boolean => booleans(&mut s, arrays),
        DataType::Binary => bytes(&mut s, arrays.iter().map(|a| a.as_binary::<i32>().iter())),
        DataType::LargeBinary => {
            bytes(&mut s, arrays.iter().map(|a| a.as_binary::<i64>().iter()));
        }
        DataType::BinaryView => bytes(
            &mut s,
            arrays
                .iter()
                .map(|a| a.as_byte_view::<BinaryViewType>().iter()),
        ),
        DataType::FixedSizeBinary(_) => bytes(
            &mut s,
            arrays.iter().map(|a| a.as_fixed_size_binary().iter()),
        ),
        // Nothing to count beyond the nulls.
        DataType::Null => {}
        other => {
            s.note = Some(format!(
                "only `count` and `nulls` are computed for type `{}`",
                type_name(other)
            ));
        }
    }
    s
}

/// How long a column of type `ty` takes next to others of the same length, roughly (for
/// starting the slow ones first): 0 for what is only counted, up to 3.
pub(super) fn relative_cost(ty: &DataType) -> u8 {
    match ty {
        DataType::Utf8
        | DataType::LargeUtf8
        | DataType::Utf8View
        | DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView
        | DataType::FixedSizeBinary(_) => 3,
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::UInt64
        | DataType::Float16
        | DataType::Float32
        | DataType::Float64
        | DataType::Decimal128(..) => 2,
        DataType::Date32
        | DataType::Date64
        | DataType::Timestamp(..)
        | DataType::Time32(_)
        | DataType::Time64(_) => 1,
        _ => 0,
    }
}

/// Calls `f` with every non-null value, reading the values slice directly.
fn for_each_valid<T: ArrowPrimitiveType>(array: &PrimitiveArray<T>, mut f: impl FnMut(T::Native)) {
    let values = array.values();
    match array.nulls().filter(|n| n.null_count() > 0) {
        None => values.iter().for_each(|&v| f(v)),
        Some(nulls) => {
            for i in nulls.valid_indices() {
                if let Some(&v) = values.get(i) {
                    f(v);
                }
            }
        }
    }
}

/// The values of a numeric column for [`summarize_column`]'s later passes: read from the
/// arrays again each time, converted as the first pass converted them (`None`: left out).
struct Values<'a, T, F> {
    arrays: &'a [&'a ArrayRef],
    convert: F,
    of: PhantomData<T>,
}

impl<'a, T, F> Values<'a, T, F>
where
    T: ArrowPrimitiveType,
    F: Fn(T::Native) -> Option<f64>,
{
    fn new(arrays: &'a [&'a ArrayRef], convert: F) -> Self {
        Self {
            arrays,
            convert,
            of: PhantomData,
        }
    }
}

impl<T, F> KeySource for Values<'_, T, F>
where
    T: ArrowPrimitiveType,
    F: Fn(T::Native) -> Option<f64>,
{
    fn each_key(&self, mut f: impl FnMut(u64)) {
        for a in self.arrays {
            for_each_valid(a.as_primitive::<T>(), |v| {
                if let Some(x) = (self.convert)(v) {
                    f(sort_key(x));
                }
            });
        }
    }
}

/// Each distinct value's sort key and count, when there are few enough (at most one per
/// 16 values) that sorting them beats reading the column again for the quartiles.
/// `value` turns a distinct key back into the value the first pass added.
fn counted<K: Copy + Eq + std::hash::Hash + super::hash::Hash64>(
    distinct: &Distinct<K>,
    first: &FirstPass,
    value: impl Fn(K) -> f64,
) -> Option<Vec<(u64, u64)>> {
    let counts = distinct.counts()?;
    (counts.len().saturating_mul(16) <= first.len()).then(|| {
        counts
            .iter()
            .map(|(&k, &c)| (sort_key(value(k)), c))
            .collect()
    })
}

fn set_distinct(s: &mut ColumnStats, (distinct, is_estimate): (u64, bool)) {
    s.distinct = distinct;
    s.distinct_is_estimate = is_estimate;
}

fn number(x: f64) -> Option<Value> {
    serde_json::Number::from_f64(x).map(Value::Number)
}

fn int_json(x: i128) -> Option<Value> {
    i64::try_from(x)
        .map(Value::from)
        .or_else(|_| u64::try_from(x).map(Value::from))
        .ok()
}

fn cut_chars(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &s[..end]),
        None => s.to_owned(),
    }
}

fn ints<T>(s: &mut ColumnStats, arrays: &[&ArrayRef])
where
    T: ArrowPrimitiveType,
    T::Native: Into<i128>,
{
    let mut distinct = Distinct::<u64>::new();
    let mut first = FirstPass::new();
    let (mut min, mut max) = (i128::MAX, i128::MIN);
    for a in arrays {
        for_each_valid(a.as_primitive::<T>(), |v| {
            let v: i128 = v.into();
            // Every integer type is at most 64 bits wide, so the low 64 bits identify the value.
            distinct.insert(v as u64);
            min = min.min(v);
            max = max.max(v);
            first.push(v as f64);
        });
    }
    set_distinct(s, distinct.finish());
    if !first.is_empty() {
        s.min = int_json(min);
        s.max = int_json(max);
    }
    let signed = T::DATA_TYPE.is_signed_integer();
    let counted = counted(&distinct, &first, |k| {
        if signed { k as i64 as f64 } else { k as f64 }
    });
    let source = Values::<T, _>::new(arrays, |v| Some(v.into() as f64));
    s.numeric = summarize_column(&first, &source, counted).map(for_the_model);
}

/// NaN and ±inf are counted in `non_finite` and left out of everything else: JSON has no
/// way to write them, and one infinity would turn the mean and std into infinities.
fn floats<T>(s: &mut ColumnStats, arrays: &[&ArrayRef])
where
    T: ArrowPrimitiveType,
    T::Native: Into<f64>,
{
    let mut distinct = Distinct::<u64>::new();
    let mut first = FirstPass::new();
    let (mut min, mut max) = (f64::INFINITY, f64::NEG_INFINITY);
    let mut non_finite = 0_u64;
    for a in arrays {
        for_each_valid(a.as_primitive::<T>(), |v| {
            let x: f64 = v.into();
            if !x.is_finite() {
                non_finite += 1;
                return;
            }
            // Adding +0.0 turns -0.0 into 0.0: equal values must have equal bits.
            let x = x + 0.0;
            distinct.insert(x.to_bits());
            min = min.min(x);
            max = max.max(x);
            first.push(x);
        });
    }
    s.non_finite = non_finite;
    s.count -= non_finite;
    set_distinct(s, distinct.finish());
    if !first.is_empty() {
        s.min = number(min);
        s.max = number(max);
    }
    let counted = counted(&distinct, &first, f64::from_bits);
    let source = Values::<T, _>::new(arrays, |v| {
        let x: f64 = v.into();
        x.is_finite().then_some(x + 0.0)
    });
    s.numeric = summarize_column(&first, &source, counted).map(for_the_model);
}

fn decimals(s: &mut ColumnStats, arrays: &[&ArrayRef], scale: i8) {
    let unit = 10_f64.powi(i32::from(scale));
    let mut distinct = Distinct::<u128>::new();
    let mut first = FirstPass::new();
    let (mut min, mut max) = (i128::MAX, i128::MIN);
    for a in arrays {
        for_each_valid(a.as_primitive::<Decimal128Type>(), |v| {
            distinct.insert(v as u128);
            min = min.min(v);
            max = max.max(v);
            first.push(v as f64 / unit);
        });
    }
    set_distinct(s, distinct.finish());
    if !first.is_empty() {
        s.min = number(min as f64 / unit);
        s.max = number(max as f64 / unit);
    }
    let counted = counted(&distinct, &first, |k| k as i128 as f64 / unit);
    let source = Values::<Decimal128Type, _>::new(arrays, |v| Some(v as f64 / unit));
    s.numeric = summarize_column(&first, &source, counted).map(for_the_model);
}

/// Dates and timestamps: distinct and min/max (formatted), no numeric summary.
fn temporal<T>(s: &mut ColumnStats, arrays: &[&ArrayRef], format: impl Fn(i64) -> String)
where
    T: ArrowPrimitiveType,
    T::Native: Into<i64>,
{
    let mut distinct = Distinct::<u64>::new();
    let (mut min, mut max) = (i64::MAX, i64::MIN);
    let mut any = false;
    for a in arrays {
        for_each_valid(a.as_primitive::<T>(), |v| {
            let v: i64 = v.into();
            distinct.insert(v as u64);
            min = min.min(v);
            max = max.max(v);
            any = true;
        });
    }
    set_distinct(s, distinct.finish());
    if any {
        s.min = Some(Value::String(format(min)));
        s.max = Some(Value::String(format(max)));
    }
}

/// The same conversion as `cell_to_json`, so min/max read like the sample.
fn timestamps(s: &mut ColumnStats, arrays: &[&ArrayRef], unit: TimeUnit) {
    let format = format_timestamp_micros;
    match unit {
        TimeUnit::Second => {
            temporal::<TimestampSecondType>(s, arrays, |v| format(v.saturating_mul(1_000_000)))
        }
        TimeUnit::Millisecond => {
            temporal::<TimestampMillisecondType>(s, arrays, |v| format(v.saturating_mul(1000)))
        }
        TimeUnit::Microsecond => temporal::<TimestampMicrosecondType>(s, arrays, format),
        TimeUnit::Nanosecond => {
            temporal::<TimestampNanosecondType>(s, arrays, |v| format(v.div_euclid(1000)))
        }
    }
}

/// `Utf8` and `LargeUtf8`: each value's head is read straight from the array's data.
fn utf8<O: OffsetSizeTrait>(s: &mut ColumnStats, arrays: &[&ArrayRef]) {
    // No run detection here (as numbers have): with few distinct values in random order, a
    // guessed branch on "same as the last one" costs more than the lookup it saves.
    let mut freq = StringFrequencies::new();
    for a in arrays {
        let a = a.as_string::<O>();
        let data = a.value_data();
        let offsets = a.value_offsets();
        let mut add = |i: usize| {
            let start = offsets.get(i).map_or(0, |o| o.as_usize());
            freq.add(a.value(i), Some((data, start)));
        };
        match a.nulls().filter(|n| n.null_count() > 0) {
            None => {
                for i in 0..a.len() {
                    add(i);
                }
            }
            Some(nulls) => {
                for i in nulls.valid_indices() {
                    add(i);
                }
            }
        }
    }
    string_summary(s, &freq);
}

fn strings<'a, I>(s: &mut ColumnStats, parts: impl Iterator<Item = I>)
where
    I: Iterator<Item = Option<&'a str>>,
{
    let mut freq = StringFrequencies::new();
    for part in parts {
        for v in part.flatten() {
            freq.add(v, None);
        }
    }
    string_summary(s, &freq);
}

fn string_summary(s: &mut ColumnStats, freq: &StringFrequencies<'_>) {
    let summary = freq.finish(TOP_VALUES);
    set_distinct(s, (summary.distinct, summary.distinct_is_estimate));
    s.min = summary
        .min
        .map(|v| Value::String(cut_chars(v, MAX_VALUE_CHARS)));
    s.max = summary
        .max
        .map(|v| Value::String(cut_chars(v, MAX_VALUE_CHARS)));
    // A list of values seen once each (ids, free text) says nothing `distinct` does not.
    if summary.top.first().is_some_and(|&(_, c)| c > 1) {
        s.top = summary
            .top
            .into_iter()
            .map(|(v, count)| TopValue {
                value: Value::String(cut_chars(v, MAX_VALUE_CHARS)),
                count,
            })
            .collect();
        s.top_is_estimate = summary.top_is_estimate;
    }
}

fn booleans(s: &mut ColumnStats, arrays: &[&ArrayRef]) {
    let (mut trues, mut falses) = (0_u64, 0_u64);
    for a in arrays {
        let b = a.as_boolean();
        trues += b.true_count() as u64;
        falses += b.false_count() as u64;
    }
    s.distinct = u64::from(trues > 0) + u64::from(falses > 0);
    // Most frequent first; on a tie `false` first, as in value order.
    let mut top = vec![(false, falses), (true, trues)];
    top.sort_by_key(|&(_, count)| std::cmp::Reverse(count));
    s.top = top
        .into_iter()
        .filter(|&(_, c)| c > 0)
        .map(|(value, count)| TopValue {
            value: Value::Bool(value),
            count,
        })
        .collect();
}

fn bytes<'a, I>(s: &mut ColumnStats, parts: impl Iterator<Item = I>)
where
    I: Iterator<Item = Option<&'a [u8]>>,
{
    let mut distinct = Distinct::<&'a [u8]>::new();
    for part in parts {
        for v in part.flatten() {
            distinct.insert(v);
        }
    }
    set_distinct(s, distinct.finish());
}
