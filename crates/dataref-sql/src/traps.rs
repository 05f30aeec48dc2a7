//! Shapes of SQL the engine answers wrongly without an error, refused with the way around
//! them (each found by comparing answers with DuckDB on the same data).
//!
//! - **`IS [NOT] DISTINCT FROM` before `AND`, `OR` or a comparison.** The parser reads the
//!   whole rest of the condition as the right operand: `flag IS DISTINCT FROM TRUE AND g =
//!   1` became `flag IS DISTINCT FROM (TRUE AND g = 1)`, a different question
//!   (sqlparser 0.62; fixed upstream in datafusion-sqlparser-rs#2436). Written in
//!   parentheses it parses as meant, so only an unparenthesised operand of that kind is
//!   refused.
//! - **`op ANY (subquery)` and `op ALL (subquery)`.** Over the same table without an alias
//!   DataFusion compares each row with itself (`k = ANY (SELECT k FROM t WHERE k > 900)`
//!   kept every row; apache/datafusion#25258). `IN`, `EXISTS` and a scalar subquery
//!   (`k >= (SELECT max(k) …)`) say the same and are planned correctly.

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{BinaryOperator, Expr, Statement, Visit, Visitor};

/// A shape `check` refused: what it is and what to write instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trap {
    pub what: &'static str,
    pub instead: &'static str,
}

const DISTINCT_FROM: Trap = Trap {
    what: "`IS [NOT] DISTINCT FROM` followed by AND, OR or a comparison is misread by this engine's parser",
    instead: "put the comparison in parentheses: `(a IS DISTINCT FROM b) AND c`",
};

const QUANTIFIED: Trap = Trap {
    what: "`= ANY (SELECT …)` and `> ALL (SELECT …)` can give wrong answers in this engine",
    instead: "write `x IN (SELECT …)`, `EXISTS (…)`, or compare with a scalar subquery such as `x >= (SELECT max(…) …)`",
};

pub fn check(statement: &Statement) -> Result<(), Trap> {
    match statement.visit(&mut Traps) {
        ControlFlow::Continue(()) => Ok(()),
        ControlFlow::Break(t) => Err(t),
    }
}

struct Traps;

impl Visitor for Traps {
    type Break = Trap;

    fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<Trap> {
        match expr {
            Expr::IsDistinctFrom(_, right) | Expr::IsNotDistinctFrom(_, right)
                if swallowed(right) =>
            {
                ControlFlow::Break(DISTINCT_FROM)
            }
            Expr::AnyOp { right, .. } | Expr::AllOp { right, .. }
                if matches!(right.as_ref(), Expr::Subquery(_)) =>
            {
                ControlFlow::Break(QUANTIFIED)
            }
            _ => ControlFlow::Continue(()),
        }
    }
}

/// An operand the parser took past where `IS [NOT] DISTINCT FROM` ends: an unparenthesised
/// expression whose operator binds no tighter than the comparison itself.
fn swallowed(right: &Expr) -> bool {
    match right {
        Expr::BinaryOp { op, .. } => matches!(
            op,
            BinaryOperator::And
                | BinaryOperator::Or
                | BinaryOperator::Xor
                | BinaryOperator::Eq
                | BinaryOperator::NotEq
                | BinaryOperator::Lt
                | BinaryOperator::LtEq
                | BinaryOperator::Gt
                | BinaryOperator::GtEq
                | BinaryOperator::Spaceship
        ),
        Expr::IsNull(_)
        | Expr::IsNotNull(_)
        | Expr::IsTrue(_)
        | Expr::IsNotTrue(_)
        | Expr::IsFalse(_)
        | Expr::IsNotFalse(_)
        | Expr::IsUnknown(_)
        | Expr::IsNotUnknown(_)
        | Expr::IsDistinctFrom(..)
        | Expr::IsNotDistinctFrom(..)
        | Expr::InList { .. }
        | Expr::InSubquery { .. }
        | Expr::Between { .. }
        | Expr::Like { .. }
        | Expr::ILike { .. }
        | Expr::SimilarTo { .. }
        | Expr::AnyOp { .. }
        | Expr::AllOp { .. } => true,
        _ => false,
    }
}
