//! What the built-in tools share: specs from Rust types, results as JSON, blocking work off
//! the async threads, source errors as tool errors, and the CSV writer the spill layer is
//! given for flat records.

use std::io::Write;

use arrow_array::RecordBatch;
use dataref_export::{ExportOptions, Format, Formulas};
use dataref_protocol::ToolSpec;
use dataref_sources::SourceError;
use dataref_tool::{CsvWritten, RecordsCsv, ToolError, ToolOutput};

/// Makes a `ToolSpec` whose schemas come from Rust types, with annotations.
pub(crate) fn spec_for<I: schemars::JsonSchema, O: schemars::JsonSchema>(
    name: &str,
    description: &str,
    read_only: bool,
    open_world: bool,
) -> ToolSpec {
    let mut spec = ToolSpec::from_types::<I, O>(name, description);
    spec.annotations.read_only = read_only;
    spec.annotations.open_world = open_world;
    spec
}

/// A tool's result as JSON.
pub(crate) fn output<T: serde::Serialize>(value: T) -> Result<ToolOutput, ToolError> {
    serde_json::to_value(value)
        .map(ToolOutput::new)
        .map_err(|e| ToolError::Fatal(format!("serialising the result: {e}")))
}

/// Runs store and source work (file I/O, SQLite, statistics) off the async threads.
pub(crate) async fn blocking<T, F>(what: &'static str, f: F) -> Result<T, ToolError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, ToolError> + Send + 'static,
{
    // The work stays in the caller's span (the tool call's), so what it records (the
    // store's reads and writes, the sandbox job) is part of the same trace.
    let span = tracing::Span::current();
    tokio::task::spawn_blocking(move || span.in_scope(f))
        .await
        .map_err(|e| ToolError::Fatal(format!("{what} task ended abnormally: {e}")))?
}

/// A producer's error as the model or the operator must see it.
pub(crate) fn source_error(e: SourceError) -> ToolError {
    // A source query stopped by a limit counts with run_sql's, for the same alert.
    match &e {
        SourceError::Timeout { .. } => dataref_ops::metrics::sql_stopped("time"),
        SourceError::TooManyRows { .. } => dataref_ops::metrics::sql_stopped("rows"),
        _ => {}
    }
    // The rows were read; storing them failed because the shared store is out of reach:
    // the store's own words (it passes, nothing was stored), not the source's.
    if let SourceError::Store(store) = e {
        return ToolError::from(store);
    }
    if let SourceError::Connect {
        source_name,
        problem: dataref_sources::ConnectProblem::Busy,
        ..
    } = &e
    {
        // Not an outage: every connection is in use by other calls for now.
        return ToolError::respond(
            format!("the data source `{source_name}` is busy with other calls"),
            Some("try the call again in a few seconds".into()),
        );
    }
    if let SourceError::Connect { source_name, .. } = &e {
        // The operator's problem: logged in full (with the hint about `url`); the model
        // learns only that the source is down, never the URL or host names.
        tracing::warn!(error = %e, hint = e.hint().unwrap_or_default(), "source unavailable");
        return ToolError::respond(
            format!("the data source `{source_name}` is not available right now"),
            Some("tell the person; an operator must check the source (`dataref doctor`)".into()),
        );
    }
    if e.is_caller_error() {
        ToolError::respond(e.to_string(), e.hint())
    } else {
        match e.hint() {
            // A source that cannot be opened is the operator's problem, but saying so
            // (without host paths) lets the model tell the person.
            Some(_) => ToolError::respond(
                "the data source is not available right now",
                Some("tell the person; an operator must check the source configuration".into()),
            ),
            None => ToolError::Fatal(e.to_string()),
        }
    }
}

/// Flat records of a spilled result as CSV, by `dataref-export` (formulas kept: the file
/// is the result as it came, not an export for a spreadsheet).
#[derive(Debug, Default, Clone, Copy)]
pub struct ExportCsv;

impl RecordsCsv for ExportCsv {
    fn write_csv(
        &self,
        batch: &RecordBatch,
        out: &mut (dyn Write + Send),
    ) -> Result<CsvWritten, Box<dyn std::error::Error + Send + Sync>> {
        let options = ExportOptions {
            formulas: Formulas::Keep,
            ..ExportOptions::default()
        };
        let exported = dataref_export::export(
            Format::Csv,
            &batch.schema(),
            std::slice::from_ref(batch),
            &options,
            out,
            &|| false,
        )?;
        Ok(CsvWritten {
            rows: exported.rows,
            columns: exported.columns,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn said(e: SourceError) -> (String, Option<String>) {
        match source_error(e) {
            ToolError::RespondToModel { message, hint } => (message, hint),
            other => panic!("{other:?}"),
        }
    }

    /// A busy pool is the model's to retry; a source that is down is the operator's, and the
    /// model never sees why (the URL may name hosts).
    #[test]
    fn busy_pools_say_try_again_and_outages_hide_the_details() {
        let (message, hint) = said(SourceError::Connect {
            source_name: "warehouse".into(),
            message: "every connection of the pool was busy for 5000 ms".into(),
            problem: dataref_sources::ConnectProblem::Busy,
        });
        assert!(message.contains("busy"), "{message}");
        assert!(hint.is_some_and(|h| h.contains("again")));
        let (message, hint) = said(SourceError::Connect {
            source_name: "warehouse".into(),
            message: "connection refused at db.internal:5432".into(),
            problem: dataref_sources::ConnectProblem::Unreachable,
        });
        assert_eq!(
            message,
            "the data source `warehouse` is not available right now"
        );
        assert!(hint.is_some_and(|h| h.contains("dataref doctor")));
    }
}
