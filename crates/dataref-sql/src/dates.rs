//! `date_trunc` of a `DATE` column, computed on days.
//!
//! DataFusion's `date_trunc` takes timestamps only: a `DATE` is cast to nanoseconds and each
//! row goes through a calendar conversion (about 40 ms per million rows, where DuckDB takes
//! 30). A model writes `date_trunc('quarter', date)` on a date column all the time. For the
//! granularities a date has (`day`, `week`, `month`, `quarter`, `year`) an analyzer rule
//! (after type coercion) replaces `date_trunc(g, CAST(d AS TIMESTAMP))` by
//! `CAST(date_trunc_days(g, d) AS TIMESTAMP)`: the same value and type, computed on the day
//! numbers, and only once per distinct day in a run of equal days (a date column is mostly
//! runs: orders of one day, a table sorted by date).

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, Date32Array};
use datafusion::arrow::datatypes::{DataType, Date32Type, Field, FieldRef, TimeUnit};
use datafusion::common::tree_node::Transformed;
use datafusion::common::{DFSchema, Result, ScalarValue};
use datafusion::config::ConfigOptions;
use datafusion::error::DataFusionError;
use datafusion::functions::datetime::date_trunc::DateTruncFunc;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{
    Cast, ColumnarValue, Expr, ExprSchemable, LogicalPlan, ReturnFieldArgs, ScalarFunctionArgs,
    ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::optimizer::AnalyzerRule;
use dataref_protocol::{civil_from_days, days_from_civil};

#[derive(Debug)]
pub(crate) struct DateTruncOnDays;

impl AnalyzerRule for DateTruncOnDays {
    fn name(&self) -> &str {
        "dataref_date_trunc_on_days"
    }

    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        plan.transform_up_with_subqueries(|p| crate::exact::rewrite_expressions(p, on_days))
            .map(|t| t.data)
    }
}

/// What a date can be truncated to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Unit {
    Day,
    Week,
    Month,
    Quarter,
    Year,
}

impl Unit {
    fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "day" => Some(Self::Day),
            "week" => Some(Self::Week),
            "month" => Some(Self::Month),
            "quarter" => Some(Self::Quarter),
            "year" => Some(Self::Year),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Day => "day",
            Self::Week => "week",
            Self::Month => "month",
            Self::Quarter => "quarter",
            Self::Year => "year",
        }
    }

    /// The first day of the unit `day` is in (weeks start on Monday, as DataFusion's do).
    fn trunc(self, day: i32) -> i32 {
        let first_of = |month_of: fn(u32) -> u32| {
            let (y, m, _) = civil_from_days(i64::from(day));
            i32::try_from(days_from_civil(y, month_of(m), 1)).unwrap_or(day)
        };
        match self {
            Self::Day => day,
            // 1970-01-01 was a Thursday: three days after a Monday.
            Self::Week => day - (day + 3).rem_euclid(7),
            Self::Month => first_of(|m| m),
            Self::Quarter => first_of(|m| (m - 1) / 3 * 3 + 1),
            Self::Year => first_of(|_| 1),
        }
    }
}

/// `date_trunc(g, CAST(d AS TIMESTAMP(ns)))` with `d` a `DATE` and `g` a literal a date has,
/// as the same value computed on days.
fn on_days(e: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    let Expr::ScalarFunction(f) = &e else {
        return Ok(Transformed::no(e));
    };
    if !f.func.inner().is::<DateTruncFunc>() {
        return Ok(Transformed::no(e));
    }
    let [granularity, value] = f.args.as_slice() else {
        return Ok(Transformed::no(e));
    };
    let unit = match granularity {
        Expr::Literal(
            ScalarValue::Utf8(Some(g))
            | ScalarValue::Utf8View(Some(g))
            | ScalarValue::LargeUtf8(Some(g)),
            _,
        ) => Unit::parse(g),
        _ => None,
    };
    let to = DataType::Timestamp(TimeUnit::Nanosecond, None);
    let (Some(unit), Expr::Cast(Cast { expr, field })) = (unit, value) else {
        return Ok(Transformed::no(e));
    };
    if *field.data_type() != to || expr.get_type(schema)? != DataType::Date32 {
        return Ok(Transformed::no(e));
    }
    let days = Expr::ScalarFunction(ScalarFunction::new_udf(
        Arc::new(ScalarUDF::new_from_impl(TruncDays::new(unit))),
        vec![expr.as_ref().clone()],
    ));
    Ok(Transformed::yes(Expr::Cast(Cast::new_from_field(
        Box::new(days),
        field.clone(),
    ))))
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct TruncDays {
    unit: Unit,
    name: String,
    signature: Signature,
}

impl TruncDays {
    fn new(unit: Unit) -> Self {
        Self {
            unit,
            name: format!("date_trunc_days_{}", unit.name()),
            signature: Signature::exact(vec![DataType::Date32], Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for TruncDays {
    fn name(&self) -> &str {
        &self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Date32)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let nullable = args.arg_fields.iter().any(|f| f.is_nullable());
        Ok(Arc::new(Field::new(
            self.name(),
            DataType::Date32,
            nullable,
        )))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let [value] = args.args.as_slice() else {
            return Err(DataFusionError::Internal(format!(
                "`{}` takes one argument",
                self.name
            )));
        };
        let unit = self.unit;
        match value {
            ColumnarValue::Scalar(ScalarValue::Date32(d)) => Ok(ColumnarValue::Scalar(
                ScalarValue::Date32(d.map(|d| unit.trunc(d))),
            )),
            ColumnarValue::Array(a) => {
                let days = a.as_primitive::<Date32Type>();
                // The last day seen and its answer: a run of one day costs one look-up.
                let mut last = (i32::MIN, i32::MIN);
                let values: Vec<i32> = days
                    .values()
                    .iter()
                    .map(|&d| {
                        if d != last.0 {
                            last = (d, unit.trunc(d));
                        }
                        last.1
                    })
                    .collect();
                let out = Date32Array::new(values.into(), days.nulls().cloned());
                Ok(ColumnarValue::Array(Arc::new(out) as Arc<dyn Array>))
            }
            other => Err(DataFusionError::Internal(format!(
                "`{}` of a {}",
                self.name,
                other.data_type()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every day from 1900 to 2100 against the calendar, by walking it.
    #[test]
    fn every_day_truncates_to_the_first_day_of_its_unit() {
        let start = days_from_civil(1900, 1, 1);
        let end = days_from_civil(2100, 12, 31);
        let mut monday = start - (start + 3).rem_euclid(7);
        for day in start..=end {
            let (y, m, _) = civil_from_days(day);
            if (day + 3).rem_euclid(7) == 0 {
                monday = day;
            }
            let d = i32::try_from(day).unwrap_or_default();
            let want = [
                (Unit::Day, day),
                (Unit::Week, monday),
                (Unit::Month, days_from_civil(y, m, 1)),
                (Unit::Quarter, days_from_civil(y, (m - 1) / 3 * 3 + 1, 1)),
                (Unit::Year, days_from_civil(y, 1, 1)),
            ];
            for (unit, first) in want {
                assert_eq!(i64::from(unit.trunc(d)), first, "{unit:?} of day {day}");
            }
        }
    }
}
