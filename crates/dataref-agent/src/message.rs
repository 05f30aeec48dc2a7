//! The conversation as the loop keeps it and as a Chat Completions provider reads it.

use dataref_tool::OutcomeKind;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Who said a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

/// One tool call an assistant message asks for, with its arguments as the model wrote them
/// (JSON text, possibly broken: the loop's `execute_tool_call` says so as an observation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssistantToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    /// The text; empty for an assistant message that only calls tools.
    #[serde(default)]
    pub content: String,
    /// An assistant message's tool calls, in the order the model gave them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<AssistantToolCall>,
    /// A tool message: the id of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A tool message: how the call ended. `None` in sessions written before outcomes were
    /// kept. Never sent to the model (the provider reads role, content and ids only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<StepOutcome>,
    /// A tool message: what the person was shown as the call finished (the step's line,
    /// its time, the table or file it made), so a resumed session shows what the live run
    /// did. `None` in sessions written before it was kept. Never sent to the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shown: Option<Shown>,
    /// An assistant's answer: the numbers in it that match nothing a tool produced
    /// ([`crate::ground`]). Never sent to the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grounding: Option<crate::ground::Grounding>,
}

/// One tool call as the person saw it end: what [`crate::AgentEvent::ToolCallFinished`]
/// told them, kept with the tool message.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Shown {
    /// One line: what came back (a dataRef and its rows, the error).
    pub summary: String,
    /// How long the call took.
    pub ms: u64,
    /// The table the call stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_ref: Option<String>,
    /// The workspace file the result names (a chart's PNG, an export).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// How one tool call of a run ended: the framework's [`OutcomeKind`] when it ran (or was
/// answered by the framework), or the loop's own refusal before it ran. Kept with the tool
/// message, so what reads a session later (the page, the export) decides by the kind, never
/// by the text. Stored as its name (`ok`, `tool_failed`, `refused`, …).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StepOutcome {
    Ran(OutcomeKind),
    /// Not run: a limit of the run (tool calls) or a repeated identical call.
    Refused,
    /// Not run: the profile's approval policy or the person said no.
    Denied,
}

impl StepOutcome {
    /// The call did not give a result to build on.
    pub fn is_error(self) -> bool {
        match self {
            Self::Ran(k) => k.is_error(),
            Self::Refused | Self::Denied => true,
        }
    }

    /// `ok`, `refused`, …: the name events, logs, the page and the session rows use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ran(k) => k.as_str(),
            Self::Refused => "refused",
            Self::Denied => "denied",
        }
    }

    /// The outcome [`as_str`](Self::as_str) names `name`.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "refused" => Some(Self::Refused),
            "denied" => Some(Self::Denied),
            _ => OutcomeKind::parse(name).map(Self::Ran),
        }
    }
}

impl From<OutcomeKind> for StepOutcome {
    fn from(k: OutcomeKind) -> Self {
        Self::Ran(k)
    }
}

impl Serialize for StepOutcome {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for StepOutcome {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        Self::parse(&name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown outcome `{name}`")))
    }
}

impl Message {
    pub fn system(content: impl Into<String>) -> Self {
        Self::text(Role::System, content)
    }

    pub fn user(content: impl Into<String>) -> Self {
        Self::text(Role::User, content)
    }

    pub fn assistant(content: impl Into<String>) -> Self {
        Self::text(Role::Assistant, content)
    }

    /// An assistant message that calls tools (and may say something first).
    pub fn assistant_calls(content: impl Into<String>, calls: Vec<AssistantToolCall>) -> Self {
        Self {
            role: Role::Assistant,
            content: content.into(),
            tool_calls: calls,
            tool_call_id: None,
            outcome: None,
            shown: None,
            grounding: None,
        }
    }

    /// The observation answering call `call_id`, which ended as `outcome`.
    pub fn tool(
        call_id: impl Into<String>,
        content: impl Into<String>,
        outcome: StepOutcome,
    ) -> Self {
        Self {
            role: Role::Tool,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: Some(call_id.into()),
            outcome: Some(outcome),
            shown: None,
            grounding: None,
        }
    }

    /// The same message, with what the person was shown of its call.
    pub fn with_shown(mut self, shown: Shown) -> Self {
        self.shown = Some(shown);
        self
    }

    fn text(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            outcome: None,
            shown: None,
            grounding: None,
        }
    }
}

/// A tool as the model is offered it (Chat Completions' `tools[].function`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDefinition {
    pub name: String,
    pub description: String,
    /// The input JSON Schema.
    pub parameters: Value,
}

/// Tokens a provider counted for one request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

impl Usage {
    pub fn total(&self) -> u64 {
        self.prompt_tokens + self.completion_tokens
    }

    pub fn add(&mut self, other: Usage) {
        self.prompt_tokens += other.prompt_tokens;
        self.completion_tokens += other.completion_tokens;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_is_stored_by_its_name_and_read_back() {
        let all = OutcomeKind::ALL
            .into_iter()
            .map(StepOutcome::Ran)
            .chain([StepOutcome::Refused, StepOutcome::Denied]);
        for o in all {
            let m = Message::tool("c", "x", o);
            let text = serde_json::to_string(&m).unwrap();
            assert!(
                text.contains(&format!("\"outcome\":\"{}\"", o.as_str())),
                "{text}"
            );
            assert_eq!(serde_json::from_str::<Message>(&text).unwrap(), m);
        }
        let old = r#"{"role":"tool","content":"error: x","tool_call_id":"c"}"#;
        assert_eq!(serde_json::from_str::<Message>(old).unwrap().outcome, None);
        let bad = r#"{"role":"tool","content":"x","outcome":"exploded"}"#;
        assert!(serde_json::from_str::<Message>(bad).is_err());
    }

    #[test]
    fn what_the_person_was_shown_is_kept_and_optional() {
        let m = Message::tool("c", "{\"dataRef\":\"data_x\"}", OutcomeKind::Ok.into()).with_shown(
            Shown {
                summary: "data_x · 12 rows".into(),
                ms: 41,
                data_ref: Some("data_x".into()),
                path: None,
            },
        );
        let text = serde_json::to_string(&m).unwrap();
        assert!(
            text.ends_with(
                r#""shown":{"summary":"data_x · 12 rows","ms":41,"data_ref":"data_x"}}"#
            ),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<Message>(&text).unwrap(), m);
        let old = r#"{"role":"tool","content":"x","tool_call_id":"c","outcome":"ok"}"#;
        assert_eq!(serde_json::from_str::<Message>(old).unwrap().shown, None);
    }
}
