//! `completion/complete`: suggestions for a prompt's or a resource template's argument,
//! shown to the person in the host while they type.
//!
//! Suggestions come only from what is declared or what the caller owns, never from the
//! data: the caller's live dataRefs, the column names of the caller's table (the schema
//! the model sees anyway), the caller's workspace paths, and a named query's declared
//! values (`enum`, `default`, `true`/`false`). Distinct values of a column are never
//! offered, so typing into a prompt argument cannot read rows. Everything is matched by
//! prefix (case-insensitive), at most 100 values with `total` and `hasMore`. A reference
//! or argument the server does not know gets no values, not an error: completion is a
//! hint, the prompt or read that follows says what is wrong.

use dataref_protocol::DataRef;
use dataref_tool::RunContext;
use rmcp::ErrorData as McpError;
use rmcp::model::{CompleteRequestParams, CompleteResult, CompletionInfo, Reference};
use serde_json::Value;

use crate::prompts::{self, ANALYSE_TABLE, COMPARE_PERIODS, Prompts};
use crate::resources::{self, blocking, files};

/// Tables looked at for dataRef suggestions (newest first).
const MAX_TABLES: usize = 1_000;

enum Kind {
    Temporal,
    Numeric,
}

pub(crate) async fn complete(
    prompts: &Prompts,
    request: CompleteRequestParams,
    ctx: &RunContext,
) -> Result<CompleteResult, McpError> {
    let argument = request.argument.name.as_str();
    let typed = request.argument.value.as_str();
    let context_arg = |name: &str| {
        request
            .context
            .as_ref()
            .and_then(|c| c.get_argument(name))
            .cloned()
    };
    let candidates = match &request.r#ref {
        Reference::Prompt(p) => match (p.name.as_str(), argument) {
            (ANALYSE_TABLE | COMPARE_PERIODS, "dataRef") => data_refs(ctx).await?,
            (COMPARE_PERIODS, "dateColumn") => {
                columns(ctx, context_arg("dataRef"), Kind::Temporal).await?
            }
            (COMPARE_PERIODS, "measure") => {
                columns(ctx, context_arg("dataRef"), Kind::Numeric).await?
            }
            (name, arg) => prompts
                .query(name)
                .and_then(|spec| {
                    prompts::parameters(spec)
                        .find(|(p, _, _)| *p == arg)
                        .map(|(_, schema, _)| declared(schema))
                })
                .unwrap_or_default(),
        },
        Reference::Resource(r) => match (r.uri.as_str(), argument) {
            (resources::URI_TEMPLATE, "dataRef") => data_refs(ctx).await?,
            (files::URI_TEMPLATE, "path") => paths(ctx).await?,
            _ => Vec::new(),
        },
        // A kind of reference a newer protocol adds: nothing to suggest.
        _ => Vec::new(),
    };
    Ok(CompleteResult::new(matching(candidates, typed)))
}

/// Up to [`CompletionInfo::MAX_VALUES`] of `candidates` that start with `typed`, in order.
fn matching(candidates: Vec<String>, typed: &str) -> CompletionInfo {
    let typed = typed.to_lowercase();
    let all: Vec<String> = candidates
        .into_iter()
        .filter(|c| c.to_lowercase().starts_with(&typed))
        .collect();
    let total = u32::try_from(all.len()).unwrap_or(u32::MAX);
    let has_more = all.len() > CompletionInfo::MAX_VALUES;
    let mut values = all;
    values.truncate(CompletionInfo::MAX_VALUES);
    let mut info = CompletionInfo::default();
    info.values = values;
    info.total = Some(total);
    info.has_more = Some(has_more);
    info
}

async fn data_refs(ctx: &RunContext) -> Result<Vec<String>, McpError> {
    let store = ctx.store.clone();
    let owner = ctx.principal.clone();
    let (metas, _) = blocking(move || store.list(&owner, MAX_TABLES))
        .await?
        .map_err(resources::store_fault)?;
    Ok(metas.iter().map(|m| m.data_ref.to_string()).collect())
}

/// Column names of the caller's table `data_ref` of a kind (all of them when none fits).
async fn columns(
    ctx: &RunContext,
    data_ref: Option<String>,
    kind: Kind,
) -> Result<Vec<String>, McpError> {
    let Some(raw) = data_ref else {
        return Ok(Vec::new());
    };
    if DataRef::parse(&raw).is_err() {
        return Ok(Vec::new());
    }
    // Not the caller's (or unknown, or expired): nothing, the same for all three.
    let Ok(meta) = prompts::owned_table(ctx, &raw).await else {
        return Ok(Vec::new());
    };
    let fields = meta.schema.fields();
    let fitting: Vec<String> = fields
        .iter()
        .filter(|f| match kind {
            Kind::Temporal => f.data_type().is_temporal(),
            Kind::Numeric => f.data_type().is_numeric(),
        })
        .map(|f| f.name().clone())
        .collect();
    if fitting.is_empty() {
        // Dates kept as text are common: let the person pick any column.
        return Ok(fields.iter().map(|f| f.name().clone()).collect());
    }
    Ok(fitting)
}

async fn paths(ctx: &RunContext) -> Result<Vec<String>, McpError> {
    let workspace = ctx.workspace.clone();
    let listing = blocking(move || files::list(&workspace))
        .await?
        .map_err(|e| {
            tracing::error!(error = %e, "workspace listing failed while completing a path");
            McpError::internal_error(
                "the workspace could not be listed; the details are in the server log",
                None,
            )
        })?;
    Ok(listing
        .files
        .iter()
        .map(|f| f.path.as_str().to_owned())
        .collect())
}

/// The values a parameter's schema declares.
fn declared(schema: &Value) -> Vec<String> {
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let mut out: Vec<String> = Vec::new();
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        out.extend(values.iter().map(text));
    }
    if let Some(d) = schema.get("default") {
        out.push(text(d));
    }
    if schema.get("type").and_then(Value::as_str) == Some("boolean") {
        out.extend(["true".to_owned(), "false".to_owned()]);
    }
    let mut seen = std::collections::HashSet::new();
    out.retain(|v| seen.insert(v.clone()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn prefix_and_cap() {
        let many: Vec<String> = (0..150).map(|i| format!("v{i}")).collect();
        let info = matching(many, "V");
        assert_eq!(info.values.len(), 100);
        assert_eq!(info.total, Some(150));
        assert_eq!(info.has_more, Some(true));
        let info = matching(vec!["north".into(), "south".into()], "so");
        assert_eq!(info.values, vec!["south"]);
        assert_eq!(info.has_more, Some(false));
    }

    #[test]
    fn declared_values() {
        assert_eq!(
            declared(&json!({"type": "string", "enum": ["a", "b"], "default": "a"})),
            vec!["a", "b"]
        );
        assert_eq!(
            declared(&json!({"type": "boolean", "default": true})),
            vec!["true", "false"]
        );
        assert_eq!(
            declared(&json!({"type": "string", "format": "date"})),
            Vec::<String>::new()
        );
    }
}
