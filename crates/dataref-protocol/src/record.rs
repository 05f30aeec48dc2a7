//! A conversation as the record of an analysis: what the person asked, each tool call with
//! its arguments and how it ended, what the agent said and answered. The agent makes it from
//! a session; the built-in tools replay it as a notebook or a script (each tool knows how
//! its own call is written again).

/// One entry of the record, in the order it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A message of the person.
    Question(String),
    /// What the agent said before the calls of one turn.
    Remark(String),
    /// One tool call.
    Call(RecordedCall),
    /// The agent's answer (a turn with no calls).
    Answer(String),
}

/// One tool call as the model made it, and its result when it had one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedCall {
    pub tool: String,
    /// The arguments as the model wrote them (JSON text, possibly broken).
    pub arguments: String,
    /// `None` when the run ended before the call answered.
    pub result: Option<RecordedResult>,
}

/// What a call returned: the text the model read, and whether the call failed (decided by
/// its outcome kind where the session kept one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedResult {
    pub failed: bool,
    pub text: String,
}
