//! Plain value types shared by every dataref crate.
//!
//! This is the leaf of the workspace: it depends on serde, serde_json and schemars only, and
//! nothing of ours. Its main types are:
//!
//! - [`DataRef`]: the handle of a table artifact, `data_` + 22 base64url characters. It can
//!   only be made by parsing a string the model sent ([`DataRef::parse`]) or from 128 random
//!   bits ([`DataRef::from_random_bytes`], called by the store with bytes from the OS CSPRNG).
//! - [`Principal`]: who is calling. Every artifact belongs to exactly one.
//! - [`Description`]: what a producer returns instead of rows.
//! - [`record::Entry`]: a conversation as the record of an analysis, for its replay.
//! - [`Receipt`]: how a table was made (source and its version, SQL and bound values,
//!   parents, code, engines), kept with its index row.
//! - [`ToolSpec`]: a tool's name, description, input and output schemas.
//! - Small helpers both the MCP glue and the HTTP server use: [`percent_encode`] and
//!   [`percent_decode`] (workspace paths in URIs), [`mime_type`] (by extension),
//!   [`truncate_echo`] (bounded echoes of request values), [`Timestamp::now`].
//!
//! ```
//! use dataref_protocol::DataRef;
//! let r = DataRef::from_random_bytes([7; 16]);
//! assert_eq!(DataRef::parse(r.as_str()), Ok(r.clone()));
//! assert!(DataRef::parse("data_../../etc").is_err());
//! ```

mod data_ref;
mod describe;
mod receipt;
pub mod record;
mod text;
mod time;
mod tool;

pub use data_ref::{DataRef, DataRefError, Principal, PrincipalError};
pub use describe::{
    ColumnStats, DESCRIBED_COLUMNS, DataStats, Description, NumericStats, STATS_FIELDS, StatsTable,
    TOP_MAX_DISTINCT, TopValue,
};
pub use receipt::{FileRead, Parent, Receipt, SourceRead};
pub use text::{
    human_bytes, mime_type, percent_decode, percent_encode, truncate_chars, truncate_echo,
};
pub use time::{Timestamp, civil_from_days, days_from_civil};
pub use tool::{ToolAnnotations, ToolSpec, ToolUi, VIEW_URI, object_schema};

/// What kind of JSON value `v` is, as a message says it: "an object", "a string", ….
pub fn json_kind(v: &serde_json::Value) -> &'static str {
    use serde_json::Value;
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
