//! The built-in sample sales database. Implementation: see the helper's brief.

use std::path::Path;

use dataref_config::SampleSpec;

use crate::SourceError;

/// Rows in the sample by default (as in the seed article).
pub const SAMPLE_ROWS_DEFAULT: u64 = 48_210;
/// The largest sample `--rows` accepts.
pub const SAMPLE_ROWS_MAX: u64 = 10_000_000;

/// Generates the sample database at `spec.path` unless it is already there.
pub fn ensure_sample(spec: &SampleSpec, progress: &dyn Fn(u64)) -> Result<(), SourceError> {
    let _ = (spec, progress);
    unimplemented!("sources helper")
}

/// Writes a new sample database with `rows` rows to `path` (via a temp file and rename).
pub fn generate_sample(path: &Path, rows: u64, progress: &dyn Fn(u64)) -> Result<(), SourceError> {
    let _ = (path, rows, progress);
    unimplemented!("sources helper")
}
