//! The scripted analyst: a [`ChatModel`] without a model, which plays the seed's canonical
//! analysis through the loop (fetch → `run_python` → `render_chart` + `export_data` → the
//! answer), deciding each step from the observations in the request as a model would. It
//! answers `dataref demo` and the benchmarks when no endpoint is configured, and it says so
//! in its answer. It never reads rows: only the dataRefs and the small `result` in the
//! observations, as a model must.

use async_trait::async_trait;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::llm::{ChatModel, ChatRequest, ChatResponse, LlmError, TextSink};
use crate::message::{AssistantToolCall, Message, Role, StepOutcome};

/// The seed's question.
pub const QUESTION: &str = "Which product lines lost the most revenue from the previous \
quarter to the latest one? Show me a chart and give me the table as a file.";

/// The seed's arithmetic, where the data is: quarter-over-quarter revenue per product line.
/// The full delta table is stored as an artifact; only the top five come back.
pub const QOQ_CODE: &str = "\
q = sales.assign(quarter=sales['date'].dt.to_period('Q').astype(str))
pivot = q.pivot_table(index='line', columns='quarter', values='revenue', aggfunc='sum', fill_value=0.0)
prev, last = pivot.columns[-2], pivot.columns[-1]
delta = pd.DataFrame({'line': pivot.index, 'previous': pivot[prev].values, 'latest': pivot[last].values})
delta['delta'] = delta['latest'] - delta['previous']
delta['pct'] = delta['delta'] / delta['previous'].where(delta['previous'] != 0)
delta = delta.sort_values('delta').reset_index(drop=True)
outputs['qoq_delta'] = delta
outputs['biggest_losers'] = delta.head(10)
for by in ('region', 'channel'):
    outputs[f'revenue_by_{by}'] = q.pivot_table(index=by, columns='quarter', values='revenue', aggfunc='sum').reset_index()
top = delta.head(5)
result = {'from': prev, 'to': last, 'lost_most': [
    {'line': r.line, 'delta': round(r.delta, 2), 'pct': round(r.pct * 100, 1)} for r in top.itertuples()]}
";

/// The same question in SQL, for `run_sql` (kept with the built-in sample it is about).
pub use dataref_config::QOQ_SQL;

/// The endpoint name the scripted analyst reports.
pub const SCRIPTED_ENDPOINT: &str = "scripted (no model endpoint configured)";

/// Plays the canonical analysis; see the module docs.
#[derive(Debug, Default, Clone, Copy)]
pub struct ScriptedAnalyst;

#[async_trait]
impl ChatModel for ScriptedAnalyst {
    fn endpoint(&self) -> &str {
        SCRIPTED_ENDPOINT
    }

    async fn complete(
        &self,
        request: &ChatRequest,
        sink: &dyn TextSink,
        cancel: &CancellationToken,
    ) -> Result<ChatResponse, LlmError> {
        if cancel.is_cancelled() {
            return Err(LlmError::Cancelled);
        }
        let message = next_step(&request.messages);
        for piece in chunks(&message.content) {
            sink.text(piece);
        }
        let finish = if message.tool_calls.is_empty() {
            "stop"
        } else {
            "tool_calls"
        };
        Ok(ChatResponse {
            message,
            usage: None,
            finish_reason: Some(finish.to_owned()),
        })
    }
}

fn chunks(text: &str) -> impl Iterator<Item = &str> {
    text.split_inclusive(' ')
}

fn call(n: usize, name: &str, args: Value) -> AssistantToolCall {
    AssistantToolCall {
        id: format!("call_{n}_{name}"),
        name: name.to_owned(),
        arguments: args.to_string(),
    }
}

/// The next assistant message, from what the run has seen since the person's last message.
fn next_step(messages: &[Message]) -> Message {
    let start = messages
        .iter()
        .rposition(|m| m.role == Role::User)
        .unwrap_or(0);
    let since = &messages[start..];
    let steps = since
        .iter()
        .filter(|m| m.role == Role::Assistant && !m.tool_calls.is_empty())
        .count();
    let results: Vec<&Message> = since.iter().filter(|m| m.role == Role::Tool).collect();
    if let Some(failed) = results
        .iter()
        .find(|m| m.outcome.is_some_and(StepOutcome::is_error))
    {
        return Message::assistant(format!(
            "I could not finish the analysis: a step failed.\n{}\n\n(Answered by the scripted \
             analyst: no model endpoint is configured.)",
            failed
                .content
                .lines()
                .take(2)
                .collect::<Vec<_>>()
                .join("\n")
        ));
    }
    let last = results.last().map(|m| parse(&m.content));
    match steps {
        0 => Message::assistant_calls(
            "I'll fetch the sales into an artifact, then compute the change per product line where the data is.",
            vec![call(1, "fetch_sales", json!({"since": "2025-01-01"}))],
        ),
        1 => {
            let Some(data_ref) = last.as_ref().and_then(|v| str_at(v, "/dataRef")) else {
                return gave_up("fetch_sales returned no dataRef");
            };
            Message::assistant_calls(
                "",
                vec![call(
                    2,
                    "run_python",
                    json!({"code": QOQ_CODE, "inputs": {"sales": data_ref}}),
                )],
            )
        }
        2 => {
            let Some(v) = last else {
                return gave_up("run_python returned nothing");
            };
            let (Some(delta), Some(losers)) = (
                str_at(&v, "/outputs/qoq_delta/dataRef"),
                str_at(&v, "/outputs/biggest_losers/dataRef"),
            ) else {
                return gave_up("run_python stored no `qoq_delta` and `biggest_losers` tables");
            };
            Message::assistant_calls(
                "",
                vec![
                    call(
                        3,
                        "render_chart",
                        json!({
                            "dataRef": losers,
                            "x": "line",
                            "y": ["delta"],
                            "kind": "bar",
                            "sort": "ascending",
                            "width": 1400,
                            "title": "Revenue change from the previous quarter: the ten biggest losers",
                        }),
                    ),
                    call(
                        4,
                        "export_data",
                        json!({"source": delta, "format": "csv", "filename": "qoq-delta"}),
                    ),
                ],
            )
        }
        _ => Message::assistant(answer(since)),
    }
}

fn gave_up(why: &str) -> Message {
    Message::assistant(format!(
        "I could not finish the analysis: {why}.\n\n(Answered by the scripted analyst: no \
         model endpoint is configured.)"
    ))
}

/// A result's JSON: the whole text, or its first line (a result whose content is all for
/// the person reads as its structured result, then a line per file it made).
fn parse(text: &str) -> Value {
    serde_json::from_str(text)
        .or_else(|_| serde_json::from_str(text.lines().next().unwrap_or_default()))
        .unwrap_or(Value::Null)
}

fn str_at(v: &Value, pointer: &str) -> Option<String> {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// The answer, from the `result` of `run_python` and the files the consumers made.
fn answer(since: &[Message]) -> String {
    let results: Vec<Value> = since
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| parse(&m.content))
        .collect();
    let python = results
        .iter()
        .find(|v| v.pointer("/result/lost_most").is_some());
    let mut text = String::new();
    match python.and_then(|v| v.get("result")) {
        Some(r) => {
            let from = r.get("from").and_then(Value::as_str).unwrap_or("?");
            let to = r.get("to").and_then(Value::as_str).unwrap_or("?");
            text.push_str(&format!(
                "From {from} to {to}, these product lines lost the most revenue:\n"
            ));
            for l in r
                .get("lost_most")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let line = l.get("line").and_then(Value::as_str).unwrap_or("?");
                let delta = l.get("delta").and_then(Value::as_f64).unwrap_or(0.0);
                let pct = l
                    .get("pct")
                    .and_then(Value::as_f64)
                    .map(|p| format!(" ({p:+.1}%)"))
                    .unwrap_or_default();
                text.push_str(&format!("- {line}: {delta:+.2}{pct}\n"));
            }
        }
        None => text.push_str("The computation gave no result.\n"),
    }
    let files: Vec<&str> = results
        .iter()
        .filter_map(|v| v.get("path").and_then(Value::as_str))
        .collect();
    if !files.is_empty() {
        text.push_str(&format!(
            "\nThe chart and the full table are in your workspace: {}.\n",
            files.join(", ")
        ));
    }
    text.push_str("\n(Answered by the scripted analyst: no model endpoint is configured.)");
    text
}
