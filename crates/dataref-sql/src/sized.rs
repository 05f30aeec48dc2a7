//! Functions that build text as large as they are asked to are refused before they build it.
//!
//! The memory pool bounds what operators hold (hash tables, sorts, buffers), but a scalar
//! function's result is not in it: `repeat('x', 1000000000)` grew the server by 3.9 GB
//! against a 512 MiB limit. The functions whose output is not bounded by their input
//! (`repeat`, `lpad`, `rpad`, and `replace` / `regexp_replace`, which can insert text
//! between every character) compute, for each call, the most bytes it could build, from
//! the lengths and counts it was given, and refuse a call over a quarter of the query's
//! memory as the query running out of memory.

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::compute::kernels::{cast::cast, length::length};
use datafusion::arrow::datatypes::FieldRef;
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::common::{Result, ScalarValue};
use datafusion::error::DataFusionError;
use datafusion::functions::regex::regexpreplace::RegexpReplaceFunc;
use datafusion::functions::string::repeat::RepeatFunc;
use datafusion::functions::string::replace::ReplaceFunc;
use datafusion::functions::unicode::lpad::LPadFunc;
use datafusion::functions::unicode::rpad::RPadFunc;
use datafusion::logical_expr::{
    ColumnarValue, Documentation, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl,
    Signature,
};

/// `functions` with the growing ones bounded by `memory_bytes` (see the module's doc).
pub(crate) fn bound(functions: Vec<Arc<ScalarUDF>>, memory_bytes: usize) -> Vec<Arc<ScalarUDF>> {
    let limit = (memory_bytes / 4).max(1);
    functions
        .into_iter()
        .map(|f| {
            let inner = f.inner();
            let grows = if inner.is::<RepeatFunc>() {
                Grows::Repeat
            } else if inner.is::<LPadFunc>() || inner.is::<RPadFunc>() {
                Grows::Pad
            } else if inner.is::<ReplaceFunc>() {
                Grows::Replace
            } else if inner.is::<RegexpReplaceFunc>() {
                Grows::Insert
            } else {
                return f;
            };
            Arc::new(ScalarUDF::new_from_impl(Bounded {
                inner: f,
                grows,
                limit,
            }))
        })
        .collect()
}

/// How a function's output may outgrow its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Grows {
    /// `repeat(text, n)`: `len(text) · n`.
    Repeat,
    /// `lpad(text, n [, fill])`: n characters of at most 4 bytes.
    Pad,
    /// `replace(text, from, to)`: `to` for every `from` in the text, or between every two
    /// characters when `from` is empty.
    Replace,
    /// `regexp_replace(text, pattern, to [, flags])`: a pattern may match between every two
    /// characters, and `$1`-style references in `to` bring the text again.
    Insert,
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct Bounded {
    inner: Arc<ScalarUDF>,
    grows: Grows,
    limit: usize,
}

impl Bounded {
    /// The most bytes this call could build.
    fn most(&self, args: &[ColumnarValue], rows: usize) -> Result<u128> {
        let mut total: u128 = 0;
        match (self.grows, args) {
            (Grows::Repeat, [text, n, ..]) => {
                let (text, n) = (Column::lengths(text)?, Column::ints(n)?);
                for i in 0..rows {
                    total += u128::from(text.at(i)) * u128::from(n.at(i));
                }
            }
            (Grows::Pad, [_, n, ..]) => {
                let n = Column::ints(n)?;
                for i in 0..rows {
                    total += 4 * u128::from(n.at(i));
                }
            }
            (Grows::Replace, [text, from, to, ..]) => {
                let (text, from, to) = (
                    Column::lengths(text)?,
                    Column::lengths(from)?,
                    Column::lengths(to)?,
                );
                for i in 0..rows {
                    let (t, f, r) = (
                        u128::from(text.at(i)),
                        u128::from(from.at(i)),
                        u128::from(to.at(i)),
                    );
                    let matches = t.checked_div(f).unwrap_or(t + 1);
                    total += t + matches * r;
                }
            }
            (Grows::Insert, [text, _, to, ..]) => {
                let refers = Column::mentions_group(to);
                let (text, to) = (Column::lengths(text)?, Column::lengths(to)?);
                for i in 0..rows {
                    let (t, r) = (u128::from(text.at(i)), u128::from(to.at(i)));
                    // `to` at every gap, and, when it names a group, the text again per
                    // reference (at most `r` of them).
                    let again = if refers { t * r } else { 0 };
                    total += t + (t + 1) * r + again;
                }
            }
            _ => {}
        }
        Ok(total)
    }
}

impl ScalarUDFImpl for Bounded {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }

    fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        self.inner.return_type(arg_types)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        self.inner.return_field_from_args(args)
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        self.inner.coerce_types(arg_types)
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.inner.documentation()
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let most = self.most(&args.args, args.number_rows)?;
        if most > self.limit as u128 {
            return Err(DataFusionError::ResourcesExhausted(format!(
                "`{}` could build {most} bytes in one call; the limit is {} (a quarter of the query's memory)",
                self.inner.name(),
                self.limit
            )));
        }
        self.inner.invoke_with_args(args)
    }
}

/// A column of non-negative numbers, or one number for every row.
enum Column {
    One(u64),
    Many(Vec<u64>),
}

impl Column {
    fn at(&self, i: usize) -> u64 {
        match self {
            Self::One(v) => *v,
            Self::Many(v) => v.get(i).copied().unwrap_or(0),
        }
    }

    /// Byte lengths of text (NULL: 0).
    fn lengths(v: &ColumnarValue) -> Result<Self> {
        match v {
            ColumnarValue::Scalar(s) => Ok(Self::One(
                s.try_as_str().flatten().map_or(0, |t| t.len() as u64),
            )),
            ColumnarValue::Array(a) => {
                let lengths = cast(&length(a)?, &DataType::Int64)?;
                Ok(Self::of_array(lengths.as_ref()))
            }
        }
    }

    /// Whether a replacement may name a group (`$1`, `${name}`, `\\1`): a scalar without
    /// `$` or `\\` cannot; a column might.
    fn mentions_group(v: &ColumnarValue) -> bool {
        match v {
            ColumnarValue::Scalar(s) => s
                .try_as_str()
                .flatten()
                .is_some_and(|t| t.contains('$') || t.contains('\\')),
            ColumnarValue::Array(_) => true,
        }
    }

    /// Counts (NULL and negative: 0).
    fn ints(v: &ColumnarValue) -> Result<Self> {
        match v {
            ColumnarValue::Scalar(s) => match s.cast_to(&DataType::Int64)? {
                ScalarValue::Int64(Some(n)) => Ok(Self::One(n.max(0) as u64)),
                _ => Ok(Self::One(0)),
            },
            ColumnarValue::Array(a) => Ok(Self::of_array(cast(a, &DataType::Int64)?.as_ref())),
        }
    }

    fn of_array(a: &dyn Array) -> Self {
        let a = a.as_primitive::<Int64Type>();
        Self::Many(a.iter().map(|v| v.map_or(0, |n| n.max(0) as u64)).collect())
    }
}
