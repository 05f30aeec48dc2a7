//! The result cap (`limits.max_result_chars`): the last resort when a result is still too
//! long after the tool bounded its own lists and the spill layer had its turn.
//!
//! A cut JSON document is no JSON at all, and a client that checks `structuredContent`
//! against the tool's output schema (the official Python SDK does) refuses a result
//! without it. So a structured result over the cap is replaced whole by a **truncation
//! object**, one of the alternatives every output schema lists ([`widen_output_schema`]):
//! `{"truncated": true, "characters", "maxCharacters", "path"?, "dataRef"?, "preview",
//! "hint"}`. The whole result is written to the caller's workspace first (as a spill file,
//! records also as CSV and a table artifact), and `path` says where. Its JSON text is
//! never longer than the cap, by construction: the preview shrinks until it fits.
//!
//! Error results and results without structured content are plain text: those are cut
//! with a note saying how much was cut.

use serde_json::{Value, json};

use crate::{CallOutcome, OutcomeKind, RunContext, ToolRegistry, spill};

/// Room the cut note of a plain-text result takes.
const NOTE_CHARS: usize = 200;

/// The output schema one of our tools lists: its own result, the spill synopsis when its
/// results may be spilled and the truncation object, folded into one object schema
/// ([`crate::listed`]).
pub(crate) fn listed_output_schema(own: Value, spilled: bool) -> Value {
    crate::listed::listed_output(own, spilled, truncation_schema(), spill::synopsis_schema())
}

/// The output schema an upstream server's tool lists: its own schema untouched, as one of
/// the alternatives beside the spill synopsis (when its results may be spilled) and the
/// truncation object.
pub(crate) fn widen_output_schema(own: Value, spilled: bool) -> Value {
    let mut alternatives = vec![own];
    if spilled {
        alternatives.push(spill::synopsis_schema());
    }
    alternatives.push(truncation_schema());
    json!({"type": "object", "anyOf": alternatives})
}

fn truncation_schema() -> Value {
    json!({
        "type": "object",
        "description": "The result was longer than `limits.max_result_chars`; the whole is in the workspace file `path`.",
        "properties": {
            "truncated": {"const": true},
            "characters": {"type": "integer"},
            "maxCharacters": {"type": "integer"},
            "path": {"type": "string"},
            "dataRef": {"type": "string"},
            "preview": {"type": "string"},
            "hint": {"type": "string"}
        },
        "required": ["truncated", "characters", "maxCharacters", "preview", "hint"]
    })
}

/// Bounds what goes back to the model; a cut is always said, with the sizes.
pub(crate) async fn cap(
    outcome: CallOutcome,
    tool: &str,
    max_chars: usize,
    structured_text: bool,
    ctx: &RunContext,
    registry: &ToolRegistry,
) -> CallOutcome {
    if outcome.text.len() <= max_chars {
        return outcome;
    }
    let total = outcome.text.chars().count();
    if total <= max_chars {
        return outcome;
    }
    if outcome.is_error() || outcome.structured.is_none() {
        return cut_text(outcome, total, max_chars);
    }
    // The whole goes to the workspace first, so the cut loses nothing (a spill synopsis
    // already says where its whole is).
    let is_synopsis = |o: &CallOutcome| {
        o.structured
            .as_ref()
            .is_some_and(|s| s.get("spilled") == Some(&Value::Bool(true)))
    };
    let written = if is_synopsis(&outcome) {
        outcome.clone()
    } else {
        spill::spill(outcome.clone(), tool, 0, structured_text, registry, ctx).await
    };
    let field = |name: &str| {
        written
            .structured
            .as_ref()
            .filter(|s| s.get("spilled") == Some(&Value::Bool(true)))
            .and_then(|s| s.get(name).cloned())
    };
    let path = field("path").and_then(|p| p.as_str().map(str::to_owned));
    let data_ref =
        field("table").and_then(|t| t.get("dataRef").and_then(Value::as_str).map(str::to_owned));
    let truncated = truncation(&outcome.text, total, max_chars, path, data_ref);
    CallOutcome {
        call_id: outcome.call_id,
        kind: OutcomeKind::TooLarge,
        text: truncated.to_string(),
        structured: Some(truncated),
        attachments: outcome.attachments,
    }
}

/// The truncation object for a result `text` of `total` characters, its JSON text at most
/// `max_chars` characters long.
fn truncation(
    text: &str,
    total: usize,
    max_chars: usize,
    path: Option<String>,
    data_ref: Option<String>,
) -> Value {
    let hint = match (&path, &data_ref) {
        (Some(p), Some(r)) => format!(
            "the whole result is in `{p}`, its records in `{r}`: read parts with read_file, compute with run_python; ask for less next time"
        ),
        (Some(p), None) => format!(
            "the whole result is in `{p}`: read parts with read_file or load it in run_python; ask for less next time"
        ),
        (None, _) => {
            "the workspace refused the whole result; ask for less (fewer columns, a smaller page)"
                .to_owned()
        }
    };
    let mut object = json!({
        "truncated": true,
        "characters": total,
        "maxCharacters": max_chars,
        "preview": "",
        "hint": hint,
    });
    if let Some(p) = path {
        object["path"] = Value::String(p);
    }
    if let Some(r) = data_ref {
        object["dataRef"] = Value::String(r);
    }
    // A tiny cap (200 at least) leaves room for no hint, then for no dataRef.
    if object.to_string().chars().count() > max_chars {
        object["hint"] = Value::String("see `path`".into());
    }
    if object.to_string().chars().count() > max_chars
        && let Some(o) = object.as_object_mut()
    {
        o.remove("dataRef");
    }
    let fixed = object.to_string().chars().count();
    // Escapes can make the preview up to six times longer as JSON; halve until it fits.
    let mut room = max_chars.saturating_sub(fixed);
    loop {
        let preview: String = text.chars().take(room).collect();
        object["preview"] = Value::String(preview);
        if room == 0 || object.to_string().chars().count() <= max_chars {
            return object;
        }
        room /= 2;
    }
}

fn cut_text(mut outcome: CallOutcome, total: usize, max_chars: usize) -> CallOutcome {
    let keep = max_chars.saturating_sub(NOTE_CHARS);
    let mut text: String = outcome.text.chars().take(keep).collect();
    text.push_str(&format!(
        "\n[cut: this result has {total} characters and only the first {keep} are shown; \
         ask for less (fewer columns, a smaller page) — data belongs in artifacts, not in results]"
    ));
    outcome.text = text;
    outcome.structured = None;
    // A failed call stays what it was; a result that was cut is too large.
    if !outcome.is_error() {
        outcome.kind = OutcomeKind::TooLarge;
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_truncation_object_is_json_within_the_cap_and_fits_the_schema() {
        let own = json!({"type": "object", "properties": {"files": {"type": "array"}}, "required": ["files"], "additionalProperties": false});
        // Ours fold the truncation object in; an upstream tool's schema is one alternative.
        let listed = jsonschema::validator_for(&listed_output_schema(own.clone(), true)).unwrap();
        let validator = jsonschema::validator_for(&widen_output_schema(own, false)).unwrap();
        // Quotes and control characters grow when escaped.
        let text = format!("{{\"files\":[{}]}}", "\"\\u0001\\\"x\\\"\",".repeat(5_000));
        let total = text.chars().count();
        for max in [200, 1_000, 16_000] {
            for (path, data_ref) in [
                (None, None),
                (
                    Some(".spill/20261201T170912-run_python-12345.json".to_owned()),
                    Some("data_AAAAAAAAAAAAAAAAAAAAAA".to_owned()),
                ),
            ] {
                let t = truncation(&text, total, max, path.clone(), data_ref);
                let s = t.to_string();
                assert!(s.chars().count() <= max, "{max}: {}", s.len());
                let back: Value = serde_json::from_str(&s).unwrap();
                assert_eq!(back["truncated"], true);
                assert_eq!(back["characters"], total);
                assert_eq!(back.get("path").is_some(), path.is_some());
                assert!(validator.is_valid(&back), "{back}");
                assert!(listed.is_valid(&back), "{back}");
            }
        }
    }

    #[test]
    fn plain_text_is_cut_with_a_note() {
        let o = CallOutcome {
            call_id: "call-1".into(),
            kind: OutcomeKind::ToolFailed,
            structured: None,
            text: "x".repeat(1000),
            attachments: vec![],
        };
        let c = cut_text(o, 1000, 500);
        assert!(c.text.chars().count() <= 500, "{}", c.text.len());
        assert!(c.text.contains("1000 characters"));
        assert!(c.structured.is_none());
        assert_eq!(
            c.kind,
            OutcomeKind::ToolFailed,
            "an error stays the error it was"
        );
    }
}
