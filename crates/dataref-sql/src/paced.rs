//! A query stops when it is told to: the joins that compute without yielding are made to
//! yield.
//!
//! A query is stopped by dropping its task, which takes effect the next time the task
//! yields. DataFusion's operators yield when their input does (the scans spend tokio's
//! cooperative budget), but two joins can compute for minutes inside one poll
//! (apache/datafusion#19358):
//!
//! - a nested loop join (a join on an inequality, or a filtered cross join) compares each
//!   probe batch with every buffered row and returns only when it has a batch of matches:
//!   with a selective filter and a large buffered side, one poll never ends;
//! - a join whose output explodes (a low-cardinality key) hands batch after batch to a
//!   consumer that never has to wait, so nothing yields.
//!
//! So after planning, every join's output spends the cooperative budget
//! ([`CooperativeExec`]), and a nested loop join's probe side arrives in slices sized so a
//! slice against the whole buffered side is about a million comparisons, and yields when the
//! join has computed for [`SLICE`] since it last did.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Result, internal_err};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::joins::{
    CrossJoinExec, HashJoinExec, NestedLoopJoinExec, SortMergeJoinExec, SymmetricHashJoinExec,
};
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, RecordBatchStream,
    SendableRecordBatchStream,
};
use futures_util::{Stream, StreamExt};

/// The longest a paced join computes between yields (a slice may overrun it by one slice).
const SLICE: Duration = Duration::from_millis(5);
/// Comparisons one probe slice may cost against the buffered side.
const SLICE_COMPARISONS: usize = 1_000_000;
/// Probe rows per slice when the buffered side's size is not known.
const DEFAULT_SLICE_ROWS: usize = 64;

/// `plan` with every join made to yield (see the module's doc).
pub(crate) fn pace(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        if node.is::<NestedLoopJoinExec>() || node.is::<CrossJoinExec>() {
            let children: Vec<Arc<dyn ExecutionPlan>> =
                node.children().into_iter().cloned().collect();
            let [build, probe] = children.as_slice() else {
                return internal_err!("a join with {} inputs", children.len());
            };
            let rows = slice_rows(build);
            let paced = Arc::new(PacedExec::new(probe.clone(), rows)) as Arc<dyn ExecutionPlan>;
            #[expect(deprecated, reason = "DataFusion 55's way to replace children")]
            let node = node.with_new_children(vec![build.clone(), paced])?;
            return Ok(Transformed::yes(cooperative(node)));
        }
        if node.is::<HashJoinExec>()
            || node.is::<SortMergeJoinExec>()
            || node.is::<SymmetricHashJoinExec>()
        {
            return Ok(Transformed::yes(cooperative(node)));
        }
        Ok(Transformed::no(node))
    })
    .map(|t| t.data)
}

fn cooperative(node: Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
    Arc::new(CooperativeExec::new(node))
}

/// Probe rows per slice: [`SLICE_COMPARISONS`] over the buffered side's rows as the planner
/// estimates them.
fn slice_rows(build: &Arc<dyn ExecutionPlan>) -> usize {
    let rows = StatisticsContext::default()
        .compute(build.as_ref(), &StatisticsArgs::new())
        .ok()
        .and_then(|s| s.num_rows.get_value().copied());
    match rows {
        Some(n) if n > 0 => (SLICE_COMPARISONS / n).clamp(1, 8192),
        _ => DEFAULT_SLICE_ROWS,
    }
}

/// Its input's batches in slices of at most `rows` rows, yielding once [`SLICE`] has passed
/// since it last did.
#[derive(Debug)]
struct PacedExec {
    input: Arc<dyn ExecutionPlan>,
    rows: usize,
    properties: Arc<PlanProperties>,
}

impl PacedExec {
    fn new(input: Arc<dyn ExecutionPlan>, rows: usize) -> Self {
        let properties = input.properties().clone();
        Self {
            input,
            rows: rows.max(1),
            properties,
        }
    }
}

impl DisplayAs for PacedExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PacedExec: rows={}", self.rows)
    }
}

impl ExecutionPlan for PacedExec {
    fn name(&self) -> &str {
        "PacedExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match (children.pop(), children.is_empty()) {
            (Some(input), true) => Ok(Arc::new(Self::new(input, self.rows))),
            _ => internal_err!("PacedExec has one input"),
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        Ok(Box::pin(Paced {
            inner: self.input.execute(partition, context)?,
            rows: self.rows,
            current: None,
            offset: 0,
            since: Instant::now(),
        }))
    }
}

struct Paced {
    inner: SendableRecordBatchStream,
    rows: usize,
    current: Option<RecordBatch>,
    offset: usize,
    since: Instant,
}

impl Stream for Paced {
    type Item = Result<RecordBatch>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.since.elapsed() >= SLICE {
            // Computed long enough: let the task go (and be stopped, if it is being).
            this.since = Instant::now();
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        loop {
            if let Some(batch) = &this.current {
                if this.offset < batch.num_rows() {
                    let len = this.rows.min(batch.num_rows() - this.offset);
                    let slice = batch.slice(this.offset, len);
                    this.offset += len;
                    return Poll::Ready(Some(Ok(slice)));
                }
                this.current = None;
            }
            match this.inner.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok(batch))) => {
                    this.current = Some(batch);
                    this.offset = 0;
                }
                Poll::Pending => {
                    this.since = Instant::now();
                    return Poll::Pending;
                }
                other => return other,
            }
        }
    }
}

impl RecordBatchStream for Paced {
    fn schema(&self) -> SchemaRef {
        self.inner.schema()
    }
}
