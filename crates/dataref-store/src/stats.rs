//! `describe` (what a producer returns) and `describe_data` (summary statistics).
//! Implementation: see the module contract in lib.rs.

use dataref_protocol::{DataStats, Description};

use crate::{StoreError, Table};

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
            rows: 5,
            max_value_chars: 80,
        }
    }
}

/// The description a producer returns: ref, rows, columns, nulls, a sample, expiry.
pub fn describe(table: &Table, opts: SampleOptions) -> Description {
    let _ = (table, opts);
    unimplemented!("stats helper")
}

/// Per-column statistics for `columns` (all when `None`), at most `max_columns` from
/// `column_offset` on.
pub fn describe_data(
    table: &Table,
    columns: Option<&[String]>,
    column_offset: usize,
    max_columns: usize,
) -> Result<DataStats, StoreError> {
    let _ = (table, columns, column_offset, max_columns);
    unimplemented!("stats helper")
}
