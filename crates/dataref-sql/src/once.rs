//! What is the same on every row is computed once.
//!
//! A model asks for "the last quarter against the one before" by joining every row with a
//! one-row table of bounds and comparing: `FROM q CROSS JOIN (SELECT max(quarter) AS
//! last_q FROM q) … FILTER (WHERE quarter = last_q - INTERVAL '3 months')`. The engine
//! evaluates `last_q - INTERVAL '3 months'` on every joined row: a calendar computation per
//! row, the same value a million times (measured: 114 ms of a 1M-row query where DuckDB
//! takes 25; computed once, 31).
//!
//! An analyzer rule (after type coercion) finds, in an aggregate, projection or filter
//! directly over a cross join one of whose sides is one row (an aggregate without `GROUP
//! BY`), each largest expression that reads only that side's columns, and moves it into a
//! projection on that side: computed once, referred to by a column above.
//!
//! What is never moved: a bare column or literal (nothing to gain); anything volatile, an
//! aggregate, a window or a subquery; and nothing from inside a `CASE` or a function that
//! evaluates its arguments lazily (`coalesce`, `nvl`…): moved out, an expression the query
//! only evaluates under a condition would be evaluated always, and its error (an overflow,
//! a bad cast) would become the query's.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DFSchema, Result};
use datafusion::config::ConfigOptions;
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::{Expr, JoinType, LogicalPlan, LogicalPlanBuilder, Projection, col};
use datafusion::optimizer::AnalyzerRule;

#[derive(Debug)]
pub(crate) struct ComputeOnce;

impl AnalyzerRule for ComputeOnce {
    fn name(&self) -> &str {
        "dataref_compute_once"
    }

    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        let mut next = 0;
        plan.transform_up_with_subqueries(|p| hoist(p, &mut next))
            .map(|t| t.data)
    }
}

/// The prefix of the columns that carry a computed-once value.
const PREFIX: &str = "__dataref_once_";

fn hoist(plan: LogicalPlan, next: &mut usize) -> Result<Transformed<LogicalPlan>> {
    if !matches!(
        plan,
        LogicalPlan::Aggregate(_) | LogicalPlan::Projection(_) | LogicalPlan::Filter(_)
    ) {
        return Ok(Transformed::no(plan));
    }
    let [LogicalPlan::Join(join)] = plan.inputs()[..] else {
        return Ok(Transformed::no(plan));
    };
    if !(join.join_type == JoinType::Inner && join.on.is_empty() && join.filter.is_none()) {
        return Ok(Transformed::no(plan));
    }
    let right_is_one = one_row(&join.right);
    let (one, other) = if right_is_one {
        (join.right.as_ref(), join.left.as_ref())
    } else if one_row(&join.left) {
        (join.left.as_ref(), join.right.as_ref())
    } else {
        return Ok(Transformed::no(plan));
    };

    let mut moved: Vec<(Expr, String)> = Vec::new();
    let names = NamePreserver::new(&plan);
    let mut exprs = Vec::new();
    for e in plan.expressions() {
        let saved = names.save(&e);
        let t = e.transform_down(|e| visit(e, one.schema(), other.schema(), &mut moved, next))?;
        exprs.push(saved.restore(t.data));
    }
    if moved.is_empty() {
        return Ok(Transformed::no(plan));
    }

    // The one-row side with the moved expressions beside its own columns.
    let mut projected: Vec<Expr> = one
        .schema()
        .columns()
        .into_iter()
        .map(Expr::Column)
        .collect();
    projected.extend(moved.into_iter().map(|(e, name)| e.alias(name)));
    let one = LogicalPlan::Projection(Projection::try_new(projected, Arc::new(one.clone()))?);
    let other = other.clone();
    let (left, right) = if right_is_one {
        (other, one)
    } else {
        (one, other)
    };
    let join = LogicalPlanBuilder::from(left).cross_join(right)?.build()?;
    plan.with_new_exprs(exprs, vec![join]).map(Transformed::yes)
}

/// One step of the walk down an expression of the node over the join.
fn visit(
    e: Expr,
    one: &DFSchema,
    other: &DFSchema,
    moved: &mut Vec<(Expr, String)>,
    next: &mut usize,
) -> Result<Transformed<Expr>> {
    match &e {
        // Evaluated under a condition: left where it is, and so is all it holds.
        Expr::Case(_) => return Ok(Transformed::new(e, false, TreeNodeRecursion::Jump)),
        Expr::ScalarFunction(f) if f.func.short_circuits() => {
            return Ok(Transformed::new(e, false, TreeNodeRecursion::Jump));
        }
        Expr::Column(_) | Expr::Literal(..) | Expr::Alias(_) => return Ok(Transformed::no(e)),
        _ => {}
    }
    if !movable(&e, one, other) {
        return Ok(Transformed::no(e));
    }
    let name = match moved.iter().find(|(m, _)| *m == e) {
        Some((_, name)) => name.clone(),
        None => {
            *next += 1;
            let name = format!("{PREFIX}{next}");
            moved.push((e, name.clone()));
            name
        }
    };
    Ok(Transformed::new(
        col(Column::new_unqualified(name)),
        true,
        TreeNodeRecursion::Jump,
    ))
}

/// `e` reads columns of the one-row side only, and means the same computed there once.
fn movable(e: &Expr, one: &DFSchema, other: &DFSchema) -> bool {
    if e.is_volatile() {
        return false;
    }
    let per_row = e
        .exists(|e| {
            Ok(matches!(
                e,
                Expr::AggregateFunction(_)
                    | Expr::WindowFunction(_)
                    | Expr::ScalarSubquery(_)
                    | Expr::Exists(_)
                    | Expr::InSubquery(_)
                    | Expr::OuterReferenceColumn(..)
                    | Expr::Placeholder(_)
                    | Expr::Case(_)
            ) || matches!(e, Expr::ScalarFunction(f) if f.func.short_circuits()))
        })
        .unwrap_or(true);
    if per_row {
        return false;
    }
    let columns = e.column_refs();
    !columns.is_empty()
        && columns
            .iter()
            .all(|c| one.has_column(c) && !other.has_column(c))
}

/// `plan` gives exactly one row: an aggregate with no groups, seen through projections
/// and aliases.
fn one_row(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::Aggregate(a) => a.group_expr.is_empty(),
        LogicalPlan::Projection(p) => one_row(&p.input),
        LogicalPlan::SubqueryAlias(s) => one_row(&s.input),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Date32Array, Float64Array, Int64Array, RecordBatch, StringArray};
    use arrow_schema::{DataType, Field, Schema};

    use crate::{Input, QueryLimits};

    async fn optimized(sql: &str) -> String {
        let schema = Arc::new(Schema::new(vec![
            Field::new("d", DataType::Date32, false),
            Field::new("line", DataType::Utf8, false),
            Field::new("units", DataType::Int64, false),
            Field::new("revenue", DataType::Float64, false),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Date32Array::from(vec![20_000, 20_100])),
                Arc::new(StringArray::from(vec!["a", "b"])),
                Arc::new(Int64Array::from(vec![1, 2])),
                Arc::new(Float64Array::from(vec![1.5, 2.5])),
            ],
        )
        .unwrap();
        let ctx = crate::context(
            vec![Input::new("t", schema, vec![batch])],
            crate::lake::Stores::default(),
            &QueryLimits::default(),
        )
        .unwrap();
        let plan = ctx.sql(sql).await.unwrap().into_optimized_plan().unwrap();
        plan.display_indent().to_string()
    }

    /// The bounds' arithmetic is computed on the one-row side; the aggregate above the
    /// join compares columns.
    #[tokio::test]
    async fn the_one_row_sides_arithmetic_moves_below_the_join() {
        let plan = optimized(
            "WITH q AS (SELECT line, date_trunc('quarter', d) AS quarter, revenue FROM t), \
             b AS (SELECT max(quarter) AS last_q FROM q) \
             SELECT line, \
               sum(revenue) FILTER (WHERE quarter = last_q - INTERVAL '3 months') AS previous, \
               sum(revenue) FILTER (WHERE quarter = last_q - INTERVAL '3 months' AND revenue > 0) AS again \
             FROM q CROSS JOIN b GROUP BY line",
        )
        .await;
        // Computed once, on the one-row side, and compared with by both aggregates.
        assert!(
            plan.lines().any(|l| l
                .trim_start()
                .starts_with("Projection: b.last_q - Interval")
                && l.ends_with("AS __dataref_once_1")),
            "{plan}"
        );
        assert!(plan.contains("q.quarter = __dataref_once_1"), "{plan}");
        assert!(!plan.contains("__dataref_once_2"), "{plan}");
    }

    /// Nothing under a condition moves, nor what reads the other side, nor an aggregate.
    #[tokio::test]
    async fn conditional_and_per_row_expressions_stay() {
        let plan = optimized(
            "SELECT sum(CASE WHEN units > 0 THEN m * 2 END) AS a, \
               sum(coalesce(units, m + 1)) AS b, \
               sum(units + m) AS c, max(m) AS e \
             FROM t CROSS JOIN (SELECT max(units) AS m FROM t) s",
        )
        .await;
        assert!(!plan.contains("__dataref_once_"), "{plan}");
    }

    /// A join of two tables of many rows is left as it is.
    #[tokio::test]
    async fn a_join_of_many_rows_is_left_alone() {
        let plan = optimized(
            "SELECT sum(a.units) FILTER (WHERE a.d = b.d - 1) AS n FROM t a CROSS JOIN t b",
        )
        .await;
        assert!(!plan.contains("__dataref_once_"), "{plan}");
    }
}
