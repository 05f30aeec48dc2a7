//! Exact or an error: where DataFusion's answer would be silently wrong, the plan is
//! rewritten so it is exact, or fails saying why.
//!
//! One analyzer rule, run after type coercion (every operand's type is final there):
//!
//! - **Integer `+`, `-`, `*` and unary `-` are checked**: DataFusion wraps them
//!   (`9223372036854775807 + 1` is negative); here they fail naming the overflow, as in
//!   PostgreSQL and DuckDB. Division and `%` are checked by the engine already.
//! - **`SUM` of 64-bit integers is exact**: it sums in `DECIMAL(38,0)` and comes back as
//!   the column's own type, or fails when the total does not fit it (DataFusion wraps: a sum
//!   past 2^63 came back as -1). Narrower integers sum into 64 bits, which no table the
//!   store holds can overflow.
//! - **`INTERSECT ALL` and `EXCEPT ALL` keep multiset semantics**: a row that is m times on
//!   the left and n times on the right is min(m, n) times in `INTERSECT ALL` and max(m − n,
//!   0) times in `EXCEPT ALL` (the standard's and DuckDB's answer; DataFusion's semi and anti
//!   joins kept all m or none). Each side numbers its copies of a row, and the number joins
//!   with the row.

use std::sync::Arc;

use datafusion::arrow::compute::CastOptions;
use datafusion::arrow::compute::kernels::numeric;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, DFSchema, NullEquality, Result, TableReference};
use datafusion::config::ConfigOptions;
use datafusion::error::DataFusionError;
use datafusion::functions_aggregate::sum::Sum;
use datafusion::functions_window::expr_fn::row_number;
use datafusion::logical_expr::expr::{AggregateFunction, Alias, ScalarFunction, WindowFunction};
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::{
    Aggregate, BinaryExpr, ColumnarValue, Expr, ExprFunctionExt, ExprSchemable, Join, JoinType,
    LogicalPlan, LogicalPlanBuilder, Operator, Projection, ReturnFieldArgs, ScalarFunctionArgs,
    ScalarUDF, ScalarUDFImpl, Signature, Volatility, Window, WindowFunctionDefinition, cast,
};
use datafusion::optimizer::AnalyzerRule;
use datafusion::physical_expr_common::datum::apply;

/// The rule, for [`datafusion::execution::session_state::SessionStateBuilder::with_analyzer_rule`].
#[derive(Debug)]
pub(crate) struct Exact;

impl AnalyzerRule for Exact {
    fn name(&self) -> &str {
        "dataref_exact"
    }

    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        plan.transform_up_with_subqueries(|p| {
            checked_arithmetic(p)?
                .transform_data(exact_sums)?
                .transform_data(multiset_semantics)
        })
        .map(|t| t.data)
    }
}

/// The type a 64-bit integer `SUM` is computed in: 38 digits hold 2^63 · 2^62 rows.
const WIDE: DataType = DataType::Decimal128(38, 0);

// ---------------------------------------------------------------------------------------
// Checked integer arithmetic

fn checked_arithmetic(plan: LogicalPlan) -> Result<Transformed<LogicalPlan>> {
    rewrite_expressions(plan, checked)
}

/// `plan`'s expressions rewritten bottom-up by `f`, which gets the schema of the node's
/// inputs (every operand's type is known there), each expression keeping its name.
pub(crate) fn rewrite_expressions(
    plan: LogicalPlan,
    f: fn(Expr, &DFSchema) -> Result<Transformed<Expr>>,
) -> Result<Transformed<LogicalPlan>> {
    let mut schema = DFSchema::empty();
    for input in plan.inputs() {
        schema.merge(input.schema());
    }
    let names = NamePreserver::new(&plan);
    let t = plan.map_expressions(|e| {
        let saved = names.save(&e);
        let t = e.transform_up(|e| f(e, &schema))?;
        Ok(t.update_data(|e| saved.restore(e)))
    })?;
    if t.transformed {
        t.map_data(LogicalPlan::recompute_schema)
    } else {
        Ok(t)
    }
}

fn checked(e: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    match e {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            let arith = match op {
                Operator::Plus => Some(Arith::Add),
                Operator::Minus => Some(Arith::Sub),
                Operator::Multiply => Some(Arith::Mul),
                _ => None,
            };
            let integer =
                left.get_type(schema)?.is_integer() && right.get_type(schema)?.is_integer();
            match arith {
                Some(arith) if integer => Ok(Transformed::yes(call(arith, vec![*left, *right]))),
                _ => Ok(Transformed::no(Expr::BinaryExpr(BinaryExpr {
                    left,
                    op,
                    right,
                }))),
            }
        }
        Expr::Negative(inner) if inner.get_type(schema)?.is_signed_integer() => {
            Ok(Transformed::yes(call(Arith::Neg, vec![*inner])))
        }
        e => Ok(Transformed::no(e)),
    }
}

fn call(arith: Arith, args: Vec<Expr>) -> Expr {
    Expr::ScalarFunction(ScalarFunction::new_udf(
        Arc::new(ScalarUDF::new_from_impl(Checked::new(arith))),
        args,
    ))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Arith {
    Add,
    Sub,
    Mul,
    Neg,
}

impl Arith {
    fn symbol(self) -> &'static str {
        match self {
            Self::Add => "+",
            Self::Sub | Self::Neg => "-",
            Self::Mul => "*",
        }
    }
}

/// An integer operator that fails on overflow. It names itself as the operator it
/// replaces, so column names and messages read as the query was written.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Checked {
    arith: Arith,
    name: String,
    signature: Signature,
}

impl Checked {
    fn new(arith: Arith) -> Self {
        let arity = if arith == Arith::Neg { 1 } else { 2 };
        Self {
            arith,
            name: format!("checked {}", arith.symbol()),
            signature: Signature::any(arity, Volatility::Immutable),
        }
    }

    fn written(&self, args: &[Expr], show: impl Fn(&Expr) -> String) -> String {
        match (self.arith, args) {
            (Arith::Neg, [a]) => format!("(- {})", show(a)),
            (_, [a, b]) => format!("{} {} {}", show(a), self.arith.symbol(), show(b)),
            _ => self.name.clone(),
        }
    }
}

impl ScalarUDFImpl for Checked {
    fn name(&self) -> &str {
        &self.name
    }

    fn display_name(&self, args: &[Expr]) -> Result<String> {
        Ok(self.written(args, |e| e.to_string()))
    }

    fn schema_name(&self, args: &[Expr]) -> Result<String> {
        Ok(self.written(args, |e| e.schema_name().to_string()))
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        arg_types
            .first()
            .cloned()
            .ok_or_else(|| DataFusionError::Internal(format!("`{}` without arguments", self.name)))
    }

    /// NULL when an operand is, as the operator it replaces: the schema is unchanged.
    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let first = args.arg_fields.first().ok_or_else(|| {
            DataFusionError::Internal(format!("`{}` without arguments", self.name))
        })?;
        let nullable = args.arg_fields.iter().any(|f| f.is_nullable());
        Ok(Arc::new(Field::new(
            self.name(),
            first.data_type().clone(),
            nullable,
        )))
    }

    fn is_strict(&self) -> bool {
        true
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let out = match (self.arith, args.args.as_slice()) {
            (Arith::Neg, [a]) => match a {
                ColumnarValue::Array(a) => ColumnarValue::Array(numeric::neg(a)?),
                ColumnarValue::Scalar(s) => ColumnarValue::Scalar(s.arithmetic_negate()?),
            },
            (Arith::Add, [a, b]) => apply(a, b, numeric::add)?,
            (Arith::Sub, [a, b]) => apply(a, b, numeric::sub)?,
            (Arith::Mul, [a, b]) => apply(a, b, numeric::mul)?,
            _ => {
                return Err(DataFusionError::Internal(format!(
                    "`{}` with {} arguments",
                    self.name,
                    args.args.len()
                )));
            }
        };
        Ok(out)
    }
}

// ---------------------------------------------------------------------------------------
// Exact sums

/// `sum(x)` over a 64-bit integer in an aggregate or a window: the sum in [`WIDE`] under
/// the same name, and a projection above casting it back (failing on overflow).
fn exact_sums(plan: LogicalPlan) -> Result<Transformed<LogicalPlan>> {
    match plan {
        LogicalPlan::Aggregate(agg) => {
            let schema = agg.input.schema().clone();
            if !agg.aggr_expr.iter().any(|e| wide_sum(e, &schema).is_some()) {
                return Ok(Transformed::no(LogicalPlan::Aggregate(agg)));
            }
            let first = agg.schema.fields().len() - agg.aggr_expr.len();
            let (exprs, widened) = widen_all(agg.aggr_expr, &agg.schema, first, &schema)?;
            let wide = Aggregate::try_new(agg.input, agg.group_expr, exprs)?;
            cast_back(LogicalPlan::Aggregate(wide), &agg.schema, &widened)
        }
        LogicalPlan::Window(w) => {
            let schema = w.input.schema().clone();
            if !w.window_expr.iter().any(|e| wide_sum(e, &schema).is_some()) {
                return Ok(Transformed::no(LogicalPlan::Window(w)));
            }
            let first = w.schema.fields().len() - w.window_expr.len();
            let (exprs, widened) = widen_all(w.window_expr, &w.schema, first, &schema)?;
            let wide = Window::try_new(exprs, w.input)?;
            cast_back(LogicalPlan::Window(wide), &w.schema, &widened)
        }
        other => Ok(Transformed::no(other)),
    }
}

/// Each expression widened where it is a 64-bit integer sum, aliased to the field it made
/// (at `first + i` of `output`), and which were.
fn widen_all(
    exprs: Vec<Expr>,
    output: &DFSchema,
    first: usize,
    input: &DFSchema,
) -> Result<(Vec<Expr>, Vec<bool>)> {
    let mut widened = vec![false; output.fields().len()];
    let mut out = Vec::with_capacity(exprs.len());
    for (i, e) in exprs.into_iter().enumerate() {
        match wide_sum(&e, input) {
            Some(wide) => {
                let (qualifier, field) = output.qualified_field(first + i);
                out.push(wide?.alias_qualified(qualifier.cloned(), field.name()));
                if let Some(w) = widened.get_mut(first + i) {
                    *w = true;
                }
            }
            None => out.push(e),
        }
    }
    Ok((out, widened))
}

/// `plan`'s fields as `before` had them: the widened ones cast back to their type.
fn cast_back(
    plan: LogicalPlan,
    before: &DFSchema,
    widened: &[bool],
) -> Result<Transformed<LogicalPlan>> {
    let exprs = before
        .iter()
        .zip(widened)
        .map(|((qualifier, field), &wide)| {
            let column = Expr::Column(Column::new(qualifier.cloned(), field.name()));
            if wide {
                let back = Narrow::new(field.name(), field.data_type().clone());
                Expr::ScalarFunction(ScalarFunction::new_udf(
                    Arc::new(ScalarUDF::new_from_impl(back)),
                    vec![column],
                ))
                .alias_qualified(qualifier.cloned(), field.name())
            } else {
                column
            }
        })
        .collect();
    Ok(Transformed::yes(LogicalPlan::Projection(
        Projection::try_new(exprs, Arc::new(plan))?,
    )))
}

/// An exact sum back in its column's type, or an error that says it does not fit and
/// how to get it whole.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Narrow {
    sum: String,
    to: DataType,
    signature: Signature,
}

impl Narrow {
    fn new(sum: &str, to: DataType) -> Self {
        Self {
            sum: sum.to_owned(),
            to,
            signature: Signature::any(1, Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for Narrow {
    fn name(&self) -> &str {
        "exact sum"
    }

    fn schema_name(&self, args: &[Expr]) -> Result<String> {
        Ok(args
            .first()
            .map_or_else(|| self.sum.clone(), |a| a.schema_name().to_string()))
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(self.to.clone())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let [value] = args.args.as_slice() else {
            return Err(DataFusionError::Internal(
                "`exact sum` takes one argument".into(),
            ));
        };
        let options = CastOptions {
            safe: false,
            ..CastOptions::default()
        };
        value.cast_to(&self.to, Some(&options)).map_err(|e| {
            DataFusionError::Execution(format!(
                "`{}` does not fit in {} ({}); `sum(CAST(x AS DECIMAL(38,0)))` gives it exactly",
                self.sum,
                self.to,
                e.find_root().message()
            ))
        })
    }
}

/// The widened form of `e` when it is `sum` of a 64-bit integer (aliased or not).
fn wide_sum(e: &Expr, input: &DFSchema) -> Option<Result<Expr>> {
    let inner = match e {
        Expr::Alias(Alias { expr, .. }) => expr.as_ref(),
        e => e,
    };
    let is_sum = |f: &datafusion::logical_expr::AggregateUDF| f.inner().is::<Sum>();
    let wide_arg = |args: &[Expr]| -> Option<Result<Vec<Expr>>> {
        let [arg] = args else { return None };
        match arg.get_type(input) {
            Ok(DataType::Int64 | DataType::UInt64) => Some(Ok(vec![cast(arg.clone(), WIDE)])),
            Ok(_) => None,
            Err(e) => Some(Err(e)),
        }
    };
    match inner {
        Expr::AggregateFunction(AggregateFunction { func, params }) if is_sum(func) => {
            let args = wide_arg(&params.args)?;
            Some(args.map(|args| {
                let mut params = params.clone();
                params.args = args;
                Expr::AggregateFunction(AggregateFunction {
                    func: func.clone(),
                    params,
                })
            }))
        }
        Expr::WindowFunction(w) => {
            let WindowFunctionDefinition::AggregateUDF(func) = &w.fun else {
                return None;
            };
            if !is_sum(func) {
                return None;
            }
            let args = wide_arg(&w.params.args)?;
            Some(args.map(|args| {
                let mut wide: WindowFunction = w.as_ref().clone();
                wide.params.args = args;
                Expr::WindowFunction(Box::new(wide))
            }))
        }
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------
// INTERSECT ALL / EXCEPT ALL

/// Before the optimizer, a semi or anti join whose keys match NULL with NULL comes only
/// from `INTERSECT` or `EXCEPT` (a written join's keys never do; `IN` and `EXISTS` become
/// joins later, in the optimizer).
fn multiset_semantics(plan: LogicalPlan) -> Result<Transformed<LogicalPlan>> {
    let LogicalPlan::Join(join) = plan else {
        return Ok(Transformed::no(plan));
    };
    let set_operation = matches!(join.join_type, JoinType::LeftSemi | JoinType::LeftAnti)
        && join.null_equality == NullEquality::NullEqualsNull
        && join.filter.is_none()
        && !join.null_aware;
    if !set_operation {
        return Ok(Transformed::no(LogicalPlan::Join(join)));
    }
    let Join {
        left,
        right,
        mut on,
        join_type,
        join_constraint,
        schema,
        ..
    } = join;
    let (left, l_n) = numbered(left, "__dataref_l")?;
    let (right, r_n) = numbered(right, "__dataref_r")?;
    on.push((l_n, r_n));
    let joined = Join::try_new(
        Arc::new(left),
        Arc::new(right),
        on,
        None,
        join_type,
        join_constraint,
        NullEquality::NullEqualsNull,
        false,
    )?;
    // The join's own output, without the copy numbers.
    let output: Vec<Expr> = schema.columns().into_iter().map(Expr::Column).collect();
    Ok(Transformed::yes(LogicalPlan::Projection(
        Projection::try_new(output, Arc::new(LogicalPlan::Join(joined)))?,
    )))
}

/// `plan` with a column numbering the copies of each distinct row (1, 2, …), and that
/// column.
fn numbered(plan: Arc<LogicalPlan>, qualifier: &str) -> Result<(LogicalPlan, Expr)> {
    let rows: Vec<Expr> = plan
        .schema()
        .columns()
        .into_iter()
        .map(Expr::Column)
        .collect();
    let relation = TableReference::bare(qualifier);
    let n = row_number()
        .partition_by(rows)
        .build()?
        .alias_qualified(Some(relation.clone()), "n");
    let plan = LogicalPlanBuilder::from(plan).window(vec![n])?.build()?;
    Ok((plan, Expr::Column(Column::new(Some(relation), "n"))))
}
