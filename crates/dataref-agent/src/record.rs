//! A session's history as the record of its analysis ([`dataref_protocol::record`]): the
//! questions, each call with how it ended, the remarks and the answers. No rows are added:
//! results are the text the model read.

use std::collections::HashMap;

use dataref_protocol::record::{Entry, RecordedCall, RecordedResult};

use crate::message::{Message, Role};

/// The record of `history`, in order.
pub fn record(history: &[Message]) -> Vec<Entry> {
    let mut out = Vec::new();
    for (i, m) in history.iter().enumerate() {
        match m.role {
            Role::User => out.push(Entry::Question(m.content.trim().to_owned())),
            Role::Assistant if m.tool_calls.is_empty() => {
                if !m.content.trim().is_empty() {
                    out.push(Entry::Answer(m.content.trim().to_owned()));
                }
            }
            Role::Assistant => {
                if !m.content.trim().is_empty() {
                    out.push(Entry::Remark(m.content.trim().to_owned()));
                }
                let results = results_after(history, i);
                for call in &m.tool_calls {
                    out.push(Entry::Call(RecordedCall {
                        tool: call.name.clone(),
                        arguments: call.arguments.clone(),
                        result: results.get(call.id.as_str()).map(|r| RecordedResult {
                            failed: failed(r),
                            text: r.content.clone(),
                        }),
                    }));
                }
            }
            Role::System | Role::Tool => {}
        }
    }
    out
}

/// The call behind tool message `m` failed. Sessions written before outcomes were kept
/// (they expire after [`SESSION_RETENTION`](crate::session::SESSION_RETENTION)) have only
/// the text, where every failure the loop and the framework report starts `error:`.
fn failed(m: &Message) -> bool {
    match m.outcome {
        Some(o) => o.is_error(),
        None => m.content.starts_with("error:"),
    }
}

/// The tool messages answering the calls of the assistant message at `at`: those after it,
/// up to the next assistant or user message (ids are only unique within a turn).
fn results_after(history: &[Message], at: usize) -> HashMap<&str, &Message> {
    let mut out = HashMap::new();
    for m in history.iter().skip(at + 1) {
        match m.role {
            Role::Tool => {
                if let Some(id) = m.tool_call_id.as_deref() {
                    out.entry(id).or_insert(m);
                }
            }
            Role::System => {}
            Role::User | Role::Assistant => break,
        }
    }
    out
}
