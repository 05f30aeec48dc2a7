//! What a run tells the person while it goes: the CLI prints these, the HTTP agent API
//! sends them as SSE, the page shows them.

use serde::Serialize;
use serde_json::Value;

use crate::message::Shown;

/// One thing that happened in a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AgentEvent {
    /// Text of the model's answer, as it streams.
    TextDelta { text: String },
    /// A tool call is about to run (after its approval, when it needed one).
    ToolCallStarted {
        call_id: String,
        tool: String,
        /// One line: the tool and its main arguments.
        summary: String,
        /// The arguments as they will run (for a page that shows the SQL or the code).
        arguments: Value,
    },
    /// A tool call ended.
    ToolCallFinished {
        call_id: String,
        tool: String,
        /// `ok`, `spilled`, `tool_failed`, … ([`dataref_tool::OutcomeKind::as_str`]), or
        /// `denied`, `refused` for calls the loop did not run.
        outcome: String,
        /// One line: what came back (a dataRef and its rows, the error).
        summary: String,
        ms: u64,
        /// The table the call stored, when it stored one (for a page to open it).
        #[serde(skip_serializing_if = "Option::is_none")]
        data_ref: Option<String>,
        /// The workspace file the result names (a chart's PNG, an export), when it has one.
        #[serde(skip_serializing_if = "Option::is_none")]
        path: Option<String>,
    },
    /// A call waits for the person's yes or no. `arguments` are what will really be sent
    /// (for `call_tool`, the target's expanded arguments).
    ApprovalNeeded {
        call_id: String,
        tool: String,
        arguments: Value,
    },
    /// Tokens of one model request.
    Usage {
        turn: u32,
        prompt_tokens: u64,
        completion_tokens: u64,
        /// What the context manager counted for the request (our tokenizer).
        context_tokens: u64,
    },
    /// The run's answer. `stopped` says which limit ended it, when one did.
    Final {
        text: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        stopped: Option<String>,
        /// Every number of the answer matched a value a tool produced (or the person
        /// wrote); absent when the run ended without an answer of the model's.
        #[serde(skip_serializing_if = "Option::is_none")]
        grounded: Option<bool>,
        /// The answer's numbers and dates that match nothing, as written.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        unmatched: Vec<String>,
    },
    /// The model's answer held numbers that match nothing a tool produced: it is asked,
    /// once, to check them and answer again (the answer so far was a draft).
    Checked { unmatched: Vec<String> },
    /// A budget of `[budgets]` this run counts against is at or past 80% of its cap (once
    /// per budget and window in a run), or would go over its cap with the next model
    /// request (`stopped`: the run stops before that request, and its `final` says so).
    Budget {
        /// Its key in the config, e.g. `budgets.agents.analyst.tokens_per_day`.
        budget: String,
        /// `day` or `month` (UTC).
        window: String,
        /// `tokens`, or `micros` (millionths of the agents' price currency).
        unit: String,
        /// What the window's requests used so far (`percent` is of this).
        used: u64,
        /// What the request the run stopped before would have taken at most (its prompt
        /// plus its largest answer); 0 on a warning.
        estimate: u64,
        cap: u64,
        percent: u64,
        /// When the window starts again.
        resets: dataref_protocol::Timestamp,
        stopped: bool,
    },
    /// The run failed (the model could not be reached, …); the history is kept.
    Error {
        message: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        hint: Option<String>,
    },
}

/// Where a run's events go.
pub trait EventSink: Send + Sync {
    fn event(&self, event: AgentEvent);
}

/// Drops every event.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoEvents;

impl EventSink for NoEvents {
    fn event(&self, _event: AgentEvent) {}
}

impl EventSink for tokio::sync::mpsc::UnboundedSender<AgentEvent> {
    fn event(&self, event: AgentEvent) {
        let _ = self.send(event);
    }
}

impl AgentEvent {
    /// The call `call_id` of `tool` ended as `outcome`, the person shown `shown`.
    pub(crate) fn finished(call_id: &str, tool: &str, outcome: &str, shown: Shown) -> Self {
        Self::ToolCallFinished {
            call_id: call_id.to_owned(),
            tool: tool.to_owned(),
            outcome: outcome.to_owned(),
            summary: shown.summary,
            ms: shown.ms,
            data_ref: shown.data_ref,
            path: shown.path,
        }
    }
}
