//! The description a producer returns, kept within its byte budget.
//!
//! The budget is [`MIN_BUDGET_BYTES`] for up to 10 columns and
//! [`BUDGET_BYTES_PER_COLUMN`] per column beyond: the fixed part (names, types, nulls)
//! grows with the width, and a wide table still gets room for a row or two of sample.
//! If the first attempt is over, sample values are cut shorter (halving, down to
//! [`MIN_CUT_CHARS`]), then sample rows are dropped from the end, and the note says so.
//! The fixed part is never cut: a table whose names and types alone exceed the budget
//! gets an empty sample (and a note), nothing more. It is bounded all the same: only the
//! first [`DESCRIBED_COLUMNS`] columns are described, `moreColumns` counts the rest.

use dataref_protocol::{DESCRIBED_COLUMNS, Description};
use serde_json::{Map, Value};

use super::SampleOptions;
use crate::Table;
use crate::value::{cell_to_json, type_name};

/// The serialized description stays under this many bytes for up to 10 columns.
pub(super) const MIN_BUDGET_BYTES: usize = 1_500;
/// … and under this many bytes per column for wider tables.
pub(super) const BUDGET_BYTES_PER_COLUMN: usize = 150;
/// Shrinking never cuts values shorter than this; it drops rows instead.
const MIN_CUT_CHARS: usize = 16;

/// The byte budget of the description of a table with `columns` columns.
pub(super) fn budget(columns: usize) -> usize {
    MIN_BUDGET_BYTES.max(BUDGET_BYTES_PER_COLUMN.saturating_mul(columns))
}

pub(super) fn describe(table: &Table, opts: SampleOptions) -> Description {
    let meta = &table.meta;
    // A wide table is described by its first columns and a count of the rest.
    let all = meta.schema.fields();
    let fields = &all[..all.len().min(DESCRIBED_COLUMNS)];
    let columns: Map<String, Value> = fields
        .iter()
        .map(|f| (f.name().clone(), Value::String(type_name(f.data_type()))))
        .collect();
    let nulls: Map<String, Value> = fields
        .iter()
        .zip(&meta.null_counts)
        .filter(|&(_, &n)| n > 0)
        .map(|(f, &n)| (f.name().clone(), Value::from(n)))
        .collect();
    let mut desc = Description {
        data_ref: meta.data_ref.clone(),
        rows: meta.rows,
        columns,
        more_columns: (all.len() - fields.len()) as u64,
        nulls,
        sample: Vec::new(),
        sample_note: None,
        notes: Vec::new(),
    };
    // Rows at hand for the sample: all of them, or the head a `MappedTable` decoded.
    let stored: usize = table.batches.iter().map(|b| b.num_rows()).sum();
    if opts.rows == 0 {
        if meta.rows > 0 {
            desc.sample_note = Some(
                "no sample: this source withholds sample rows; `describe_data` gives column \
                 statistics"
                    .into(),
            );
        }
        return desc;
    }
    let wanted = opts.rows.min(stored);
    if wanted == 0 {
        return desc;
    }
    let budget = budget(fields.len());

    // Shorter cuts first, while that can still shorten something.
    let mut attempt = Attempt::new(table, wanted, opts.max_value_chars);
    loop {
        if attempt.apply(&mut desc, wanted, wanted, opts, budget) {
            return desc;
        }
        let next = (attempt.cut / 2).max(MIN_CUT_CHARS);
        if next >= attempt.cut || attempt.longest <= next {
            break;
        }
        attempt = Attempt::new(table, wanted, next);
    }

    // Then fewer rows: the most that fit (the size grows with the rows shown).
    let (mut lo, mut hi) = (0, wanted - 1);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if attempt.apply(&mut desc, mid, wanted, opts, budget) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    attempt.apply(&mut desc, lo, wanted, opts, budget);
    desc
}

/// The sample rows made with one cut length.
struct Attempt {
    /// Each row and whether a value in it was cut.
    rows: Vec<(Vec<Value>, bool)>,
    cut: usize,
    /// Characters in the longest string value (after the cut): a shorter cut only helps
    /// if it is below this.
    longest: usize,
}

impl Attempt {
    fn new(table: &Table, wanted: usize, cut: usize) -> Self {
        let mut rows = Vec::with_capacity(wanted);
        let mut longest = 0;
        'batches: for batch in &table.batches {
            for row in 0..batch.num_rows() {
                if rows.len() == wanted {
                    break 'batches;
                }
                let mut any_cut = false;
                // In `columns` order: the names are said once, there.
                let mut obj = Vec::with_capacity(batch.num_columns().min(DESCRIBED_COLUMNS));
                for array in batch.columns().iter().take(DESCRIBED_COLUMNS) {
                    let (v, was_cut) = cell_to_json(array, row, Some(cut));
                    if let Value::String(s) = &v {
                        longest = longest.max(s.chars().count());
                    }
                    any_cut |= was_cut;
                    obj.push(v);
                }
                rows.push((obj, any_cut));
            }
        }
        Self { rows, cut, longest }
    }

    /// Puts the first `shown` rows and their note into `desc`; true when it fits `budget`.
    fn apply(
        &self,
        desc: &mut Description,
        shown: usize,
        wanted: usize,
        opts: SampleOptions,
        budget: usize,
    ) -> bool {
        let rows = &self.rows[..shown.min(self.rows.len())];
        let any_cut = rows.iter().any(|(_, c)| *c);
        desc.sample = rows.iter().map(|(r, _)| r.clone()).collect();
        desc.sample_note = note(any_cut, self.cut, shown, wanted, opts, budget);
        serde_json::to_vec(desc).map_or(usize::MAX, |v| v.len()) < budget
    }
}

fn note(
    any_cut: bool,
    cut: usize,
    shown: usize,
    wanted: usize,
    opts: SampleOptions,
    budget: usize,
) -> Option<String> {
    let shrunk_cut = cut < opts.max_value_chars;
    let dropped = shown < wanted;
    let why = format!("to keep this description under {budget} bytes");
    let mut parts = Vec::new();
    if any_cut {
        let mut s = format!("values longer than {cut} characters are cut and end in …");
        if shrunk_cut && !dropped {
            s = format!("{s} {why}");
        }
        parts.push(s);
    }
    if dropped {
        parts.push(if shown == 0 {
            format!("no sample rows are shown {why}")
        } else {
            format!("only {shown} of {wanted} sample rows are shown {why}")
        });
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}
