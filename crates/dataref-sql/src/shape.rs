//! How big and how deep a query may be, decided on the parsed statement before anything
//! plans it.
//!
//! Every later stage (the planner, the optimizer, the derived `Clone`, `Hash`, `Eq` and
//! `Drop` of plans and expressions) recurses over the query's structure, and some of them
//! are not protected against deep input: a 1,800-term `1+1+…+1` once ended the process
//! with a stack overflow. The parser bounds the nesting it recurses into itself
//! (parentheses, subqueries), but chains of one operator, `UNION ALL`s and chained CTEs it
//! builds in loops, as deep as the text is long. So the statement is measured here, by a
//! walk that itself stops descending at the limit, and the whole query runs on a thread
//! whose stack is sized for what passes (see `engine`).

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    Expr, Query, Select, Statement, TableFactor, Visit, Visitor,
};

/// Nesting of expressions and subqueries: `1+1+…+1` with N terms nests N levels.
/// ClickHouse's `max_parser_depth` is 1,000; a query a person or model writes rarely goes
/// past 20.
pub const MAX_DEPTH: usize = 256;
/// Table references (named tables, derived tables, CTE uses), each a scan or join to plan.
/// A 300-way join took DataFusion 43–54 s to plan.
pub const MAX_TABLES: usize = 64;
/// `SELECT` blocks: every branch of a set operation, every subquery and CTE.
pub const MAX_SELECTS: usize = 256;

/// What went over a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exceeded {
    /// Nests more than [`MAX_DEPTH`] levels (the walk stops there, so "more than").
    Depth,
    /// References more than [`MAX_TABLES`] tables.
    Tables,
    /// Has more than [`MAX_SELECTS`] `SELECT` blocks.
    Selects,
}

/// Checks `statement` against the limits; stops at the first one exceeded.
pub fn check(statement: &Statement) -> Result<(), Exceeded> {
    let mut shape = Shape::default();
    match statement.visit(&mut shape) {
        ControlFlow::Continue(()) => Ok(()),
        ControlFlow::Break(e) => Err(e),
    }
}

#[derive(Debug, Default)]
struct Shape {
    depth: usize,
    tables: usize,
    selects: usize,
}

impl Shape {
    fn enter(&mut self) -> ControlFlow<Exceeded> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return ControlFlow::Break(Exceeded::Depth);
        }
        ControlFlow::Continue(())
    }

    fn leave(&mut self) -> ControlFlow<Exceeded> {
        self.depth = self.depth.saturating_sub(1);
        ControlFlow::Continue(())
    }
}

impl Visitor for Shape {
    type Break = Exceeded;

    fn pre_visit_query(&mut self, _query: &Query) -> ControlFlow<Exceeded> {
        self.enter()
    }

    fn post_visit_query(&mut self, _query: &Query) -> ControlFlow<Exceeded> {
        self.leave()
    }

    fn pre_visit_select(&mut self, _select: &Select) -> ControlFlow<Exceeded> {
        self.selects += 1;
        if self.selects > MAX_SELECTS {
            return ControlFlow::Break(Exceeded::Selects);
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_table_factor(&mut self, _factor: &TableFactor) -> ControlFlow<Exceeded> {
        self.tables += 1;
        if self.tables > MAX_TABLES {
            return ControlFlow::Break(Exceeded::Tables);
        }
        self.enter()
    }

    fn post_visit_table_factor(&mut self, _factor: &TableFactor) -> ControlFlow<Exceeded> {
        self.leave()
    }

    fn pre_visit_expr(&mut self, _expr: &Expr) -> ControlFlow<Exceeded> {
        self.enter()
    }

    fn post_visit_expr(&mut self, _expr: &Expr) -> ControlFlow<Exceeded> {
        self.leave()
    }
}
