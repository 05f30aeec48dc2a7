//! `describe` (what a producer returns) and `describe_data` (summary statistics).
//!
//! - [`describe()`] gives the shape of a table: names and types, null counts, a few sample
//!   rows. It is what the model reads instead of rows, so its serialized size is bounded
//!   (see `sample.rs`: 1,500 bytes up to 10 columns, 150 bytes per column beyond).
//! - [`describe_data`] gives per-column statistics, pandas-like, with bounded memory and
//!   output: distinct counts are exact up to 65,536 values and HyperLogLog estimates
//!   above, top values exact up to the same point and a Misra–Gries summary above, both
//!   flagged when estimated. Columns are computed in parallel on two threads, reading
//!   typed Arrow arrays (no JSON per cell).

mod column;
mod distinct;
mod frequent;
mod hash;
mod hll;
mod numeric;
#[cfg(test)]
mod perf;
mod sample;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicUsize, Ordering};

use arrow_array::ArrayRef;
use dataref_protocol::{ColumnStats, DataStats, Description};

use crate::{ArtifactMeta, MappedTable, StoreError, Table};

/// Threads `describe_data` computes columns on. Two, not one per core: the server runs
/// many calls at once, and two already bring a 1M-row table well under a second.
const STATS_THREADS: usize = 2;

/// How the sample in a description is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampleOptions {
    /// Rows in the sample (0 = none).
    pub rows: usize,
    /// Longer values are cut and end in `…`.
    pub max_value_chars: usize,
}

impl Default for SampleOptions {
    fn default() -> Self {
        Self {
            rows: 2,
            max_value_chars: 80,
        }
    }
}

/// The description a producer returns: ref, rows, columns, nulls, a sample.
///
/// The serialized JSON stays under 1,500 bytes for up to 10 columns (150 bytes per
/// column for wider tables): if the sample does not fit, its values are cut shorter
/// (down to 16 characters) and then rows are dropped, and `sampleNote` says so. With
/// `opts.rows == 0` the sample is withheld and `sampleNote` says that instead.
///
/// The sample reads only the first rows: `table` may be a [`MappedTable::head`] of
/// `opts.rows` rows, which is how producers describe what they just wrote (the nulls come
/// from the write itself, so nothing is read twice).
///
/// [`MappedTable::head`]: crate::MappedTable::head
pub fn describe(table: &Table, opts: SampleOptions) -> Description {
    sample::describe(table, opts)
}

/// Per-column statistics for `columns` (all, in table order, when `None`; otherwise in
/// the order asked, repeats ignored), at most `max_columns` (at least 1) from
/// `column_offset` on. `nextColumnOffset` is an offset into that same list of columns;
/// `totalColumns` counts the table's columns.
///
/// An unknown name is [`StoreError::UnknownColumn`], whose hint suggests the closest.
pub fn describe_data(
    table: &dyn ColumnSource,
    columns: Option<&[String]>,
    column_offset: usize,
    max_columns: usize,
) -> Result<DataStats, StoreError> {
    let meta = table.meta();
    let fields = meta.schema.fields();
    let selected: Vec<usize> = match columns {
        None => (0..fields.len()).collect(),
        Some(wanted) => {
            let mut selected = Vec::with_capacity(wanted.len());
            for name in wanted {
                let Some(i) = fields.iter().position(|f| f.name() == name) else {
                    return Err(StoreError::UnknownColumn {
                        column: name.clone(),
                        available: fields.iter().map(|f| f.name().clone()).collect(),
                    });
                };
                if !selected.contains(&i) {
                    selected.push(i);
                }
            }
            selected
        }
    };
    // A page of 0 would hand back the same offset forever.
    let page: Vec<usize> = selected
        .iter()
        .skip(column_offset)
        .take(max_columns.max(1))
        .copied()
        .collect();
    let end = column_offset.saturating_add(page.len());
    Ok(DataStats {
        data_ref: meta.data_ref.clone(),
        rows: meta.rows,
        total_columns: fields.len(),
        columns: compute(table, &page)?,
        next_column_offset: (end < selected.len()).then_some(end),
    })
}

/// Statistics of the columns at `indices`, in that order, on [`STATS_THREADS`] threads.
fn compute(table: &dyn ColumnSource, indices: &[usize]) -> Result<Vec<ColumnStats>, StoreError> {
    compute_on(table, indices, STATS_THREADS)
}

/// [`compute`] on at most `threads` threads (the calling one included). The costliest
/// columns are started first and each thread takes the next column as it finishes one,
/// so the last column to finish is a cheap one and no thread waits long for another. The
/// answer does not depend on the number of threads: each column is computed whole by
/// one of them.
fn compute_on(
    table: &dyn ColumnSource,
    indices: &[usize],
    threads: usize,
) -> Result<Vec<ColumnStats>, StoreError> {
    let fields = table.meta().schema.fields();
    // Reading the column (for a mapped table: decoding and validating it) happens on the
    // thread that computes it, so that is parallel too.
    let one = |i: usize| -> Option<Result<ColumnStats, StoreError>> {
        let field = fields.get(i)?;
        Some(table.column(i).map(|arrays| {
            let arrays: Vec<&ArrayRef> = arrays.iter().collect();
            column::column_stats(field, &arrays)
        }))
    };
    let threads = threads.clamp(1, indices.len().max(1));
    if threads == 1 {
        return indices.iter().filter_map(|&i| one(i)).collect();
    }
    // Positions into `indices`, costliest column first (stable: ties keep their order).
    let mut order: Vec<usize> = (0..indices.len()).collect();
    order.sort_by_key(|&k| {
        let cost = indices
            .get(k)
            .and_then(|&i| fields.get(i))
            .map_or(0, |f| column::relative_cost(f.data_type()));
        std::cmp::Reverse(cost)
    });
    let next = AtomicUsize::new(0);
    let work = || {
        let mut done = Vec::new();
        loop {
            let Some(&k) = order.get(next.fetch_add(1, Ordering::Relaxed)) else {
                return done;
            };
            if let Some(&i) = indices.get(k) {
                done.extend(one(i).map(|stats| (k, stats)));
            }
        }
    };
    let mut results: Vec<(usize, Result<ColumnStats, StoreError>)> = std::thread::scope(|scope| {
        // If a thread cannot be started, the others do its share.
        let helpers: Vec<_> = (1..threads)
            .filter_map(|_| {
                std::thread::Builder::new()
                    .name("describe-data".into())
                    .spawn_scoped(scope, work)
                    .ok()
            })
            .collect();
        let mut all = work();
        for helper in helpers {
            match helper.join() {
                Ok(done) => all.extend(done),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        all
    });
    // In the order asked; the first column that could not be read is the error.
    results.sort_by_key(|(k, _)| *k);
    results.into_iter().map(|(_, stats)| stats).collect()
}

/// A table whose columns [`describe_data`] reads one at a time: a decoded [`Table`], or a
/// [`MappedTable`], which decodes (and validates) only the columns asked for, each on the
/// thread that computes its statistics.
pub trait ColumnSource: Sync {
    fn meta(&self) -> &ArtifactMeta;
    /// Column `index` of every batch, in order.
    fn column(&self, index: usize) -> Result<Vec<ArrayRef>, StoreError>;
}

impl ColumnSource for Table {
    fn meta(&self) -> &ArtifactMeta {
        &self.meta
    }

    fn column(&self, index: usize) -> Result<Vec<ArrayRef>, StoreError> {
        Ok(self
            .batches
            .iter()
            .filter_map(|b| b.columns().get(index).cloned())
            .collect())
    }
}

impl ColumnSource for MappedTable {
    fn meta(&self) -> &ArtifactMeta {
        &self.meta
    }

    fn column(&self, index: usize) -> Result<Vec<ArrayRef>, StoreError> {
        Ok(self
            .batches(Some(&[index]))?
            .into_iter()
            .filter_map(|b| b.columns().first().cloned())
            .collect())
    }
}
