//! What a failed query says, and whose problem it is.

use datafusion::common::SchemaError;
use datafusion::error::DataFusionError;

use crate::Input;
use crate::shape::{Exceeded, MAX_DEPTH, MAX_SELECTS, MAX_TABLES};
use crate::traps::Trap;

/// A table of the query and its columns, for hints.
#[derive(Debug, Clone, PartialEq)]
pub struct TableColumns {
    pub name: String,
    pub columns: Vec<String>,
}

impl TableColumns {
    pub(crate) fn of(input: &Input) -> Self {
        Self {
            name: input.name.clone(),
            columns: input
                .schema
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect(),
        }
    }
}

/// Columns listed per table in a hint; the rest are counted.
const HINT_COLUMNS: usize = 24;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SqlError {
    /// Not a query: the kind of statement it is.
    #[error("`run_sql` runs one query (SELECT, WITH, VALUES); {kind} is not allowed")]
    Refused { kind: String },
    /// The query is wrong: the engine's message and, when it knows, where.
    #[error("{message}{}", at_text(*.at))]
    Invalid {
        message: String,
        /// Line and column (from 1) of what the message is about.
        at: Option<(u64, u64)>,
        tables: Vec<TableColumns>,
    },
    /// The SQL text is longer than [`crate::MAX_SQL_BYTES`].
    #[error("the query's text is {bytes} bytes; the limit is {limit}")]
    TooLong { bytes: usize, limit: usize },
    /// The query is deeper or larger than the engine plans.
    #[error("{}", too_complex_text(*.0))]
    TooComplex(Exceeded),
    /// A shape of SQL the engine would answer wrongly.
    #[error("{}", .0.what)]
    Unreliable(Trap),
    /// A lake's files cannot be listed or read.
    #[error("the files at `{location}` cannot be read: {message}")]
    Lake {
        location: String,
        message: String,
        hint: String,
    },
    /// Two or more result columns have one name.
    #[error("the result has more than one column named {}", quoted(.names))]
    DuplicateColumns { names: Vec<String> },
    /// The query needed more working memory than it may have.
    #[error(
        "the query needed more than {} of working memory",
        dataref_protocol::human_bytes(*.limit_bytes as u64)
    )]
    OutOfMemory { limit_bytes: usize },
    /// Ours, not the caller's.
    #[error("the SQL engine failed: {0}")]
    Engine(String),
}

fn too_complex_text(e: Exceeded) -> String {
    match e {
        Exceeded::Depth => format!(
            "the query nests more than {MAX_DEPTH} levels of expressions and subqueries; \
             the limit is {MAX_DEPTH}"
        ),
        Exceeded::Tables => {
            format!("the query reads more than {MAX_TABLES} tables; the limit is {MAX_TABLES}")
        }
        Exceeded::Selects => format!(
            "the query has more than {MAX_SELECTS} SELECT blocks; the limit is {MAX_SELECTS}"
        ),
    }
}

fn quoted(names: &[String]) -> String {
    let q: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    q.join(", ")
}

fn at_text(at: Option<(u64, u64)>) -> String {
    match at {
        Some((line, column)) => format!(" (at line {line}, column {column})"),
        None => String::new(),
    }
}

impl SqlError {
    /// Whether the caller can fix it (everything but [`SqlError::Engine`]).
    pub fn is_caller_error(&self) -> bool {
        !matches!(self, Self::Engine(_))
    }

    /// What to do next.
    pub fn hint(&self) -> Option<String> {
        match self {
            Self::Refused { .. } => Some(
                "write one SELECT over the tables named in `inputs`; results are stored for you"
                    .into(),
            ),
            Self::Invalid { tables, .. } => {
                if tables.is_empty() {
                    return None;
                }
                let listed: Vec<String> = tables.iter().map(table_text).collect();
                Some(format!("tables: {}", listed.join("; ")))
            }
            Self::TooLong { .. } => Some(
                "compute in steps: store each step with `run_sql` and read it by its dataRef"
                    .into(),
            ),
            Self::TooComplex(Exceeded::Depth) => Some(
                "write it flatter: nested subqueries as CTEs, nested CASEs as one CASE with \
                 several WHENs, a long sum over several steps"
                    .into(),
            ),
            Self::TooComplex(Exceeded::Tables | Exceeded::Selects) => Some(
                "split it: store a step with `run_sql` and use its dataRef as an input of the next"
                    .into(),
            ),
            Self::Unreliable(t) => Some(t.instead.to_owned()),
            Self::Lake { hint, .. } => Some(hint.clone()),
            Self::DuplicateColumns { .. } => {
                Some("give each column its own name with AS (e.g. `b.id AS b_id`)".into())
            }
            Self::OutOfMemory { .. } => Some(
                "filter or aggregate earlier, select fewer columns, or split the question".into(),
            ),
            Self::Engine(_) => None,
        }
    }

    /// Classifies an engine error by its variant (never by its text).
    pub(crate) fn from_engine(
        e: DataFusionError,
        sql: &str,
        tables: &[TableColumns],
        memory_bytes: usize,
    ) -> Self {
        let at = e
            .diagnostic()
            .and_then(|d| d.span)
            .filter(|s| s.start.line > 0 && !sql.is_empty())
            .map(|s| (s.start.line, s.start.column));
        let root = e.find_root();
        let invalid = |message: String| Self::Invalid {
            message,
            at,
            tables: tables.to_vec(),
        };
        // DataFusion leaves a CAST out of an expression's name, so `sum(x)` and
        // `sum(CAST(x AS BIGINT))` are both `sum(x)` to it (tried again with the CAST named;
        // this is what is left).
        if let DataFusionError::SchemaError(s, _) = root
            && let SchemaError::DuplicateUnqualifiedField { name } = s.as_ref()
        {
            return invalid(format!(
                "two expressions of the query are both named `{name}` (the engine leaves a \
                 CAST out of a name); compute one of them in a CTE or subquery"
            ));
        }
        match root {
            DataFusionError::SQL(p, _) => invalid(p.to_string()),
            DataFusionError::Plan(_)
            | DataFusionError::SchemaError(..)
            | DataFusionError::NotImplemented(_)
            | DataFusionError::Execution(_)
            | DataFusionError::ArrowError(..)
            | DataFusionError::Configuration(_) => invalid(root.message().into_owned()),
            // A regular expression in the query that does not compile.
            DataFusionError::External(e)
                if e.is::<regex::Error>() || e.is::<regex_syntax::Error>() =>
            {
                invalid(format!("invalid regular expression: {e}"))
            }
            DataFusionError::ResourcesExhausted(_) => {
                dataref_ops::metrics::sql_stopped("memory");
                Self::OutOfMemory {
                    limit_bytes: memory_bytes,
                }
            }
            _ => Self::Engine(root.to_string()),
        }
    }
}

fn table_text(t: &TableColumns) -> String {
    let shown: Vec<&str> = t
        .columns
        .iter()
        .take(HINT_COLUMNS)
        .map(String::as_str)
        .collect();
    let more = t.columns.len().saturating_sub(HINT_COLUMNS);
    let more = if more > 0 {
        format!(", … {more} more")
    } else {
        String::new()
    };
    format!("`{}` ({}{more})", t.name, shown.join(", "))
}

/// `e` is two expressions of one name, as DataFusion names them.
pub(crate) fn duplicate_name(e: &DataFusionError) -> bool {
    matches!(
        e.find_root(),
        DataFusionError::SchemaError(s, _)
            if matches!(s.as_ref(), SchemaError::DuplicateUnqualifiedField { .. })
    )
}
