//! Producers: read a source under the caller's permissions and stream the rows into a table
//! artifact, batch by batch, never holding the whole result in memory.
//!
//! - [`fetch`] runs one statement on a source and stores the result for the caller.
//! - [`bind_params`] checks a named query's arguments against its declared parameters and
//!   turns them into bound values (never spliced into SQL).
//! - [`ensure_sample`] generates the built-in sample sales database (deterministic).

mod error;
mod sample;
mod sqlite;

pub use error::SourceError;
pub use sample::{SAMPLE_ROWS_DEFAULT, SAMPLE_ROWS_MAX, ensure_sample, generate_sample};
pub use sqlite::{FetchRequest, ParamValue, SqlPolicy, bind_params, fetch};
