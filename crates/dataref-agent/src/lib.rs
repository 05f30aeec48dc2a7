//! dataref's agent runtime: the loop that makes dataref the agent, on the same
//! [`ToolRegistry`](dataref_tool::ToolRegistry) and
//! [`execute_tool_call`](dataref_tool::execute_tool_call) the MCP server uses.
//!
//! - [`llm`]: the gateway ([`ChatModel`](llm::ChatModel)) and its OpenAI-compatible client.
//! - [`tokens`], [`window`]: token counts with the model's tokenizer, and the context
//!   manager (repair, trimming that never splits a call from its result, the result cap).
//! - [`prompt`]: system prompt templates.
//! - [`event`]: what a run reports while it goes.
//! - [`ground`]: an answer's numbers matched to what the session's tools produced.
//! - [`record`]: a session as the record of its analysis (the built-in tools replay it).

pub mod budget;
pub mod event;
pub mod ground;
pub mod llm;
pub mod message;
pub mod prompt;
pub mod record;
pub mod tokens;
pub mod window;

pub use event::{AgentEvent, EventSink, NoEvents};
pub use message::{AssistantToolCall, Message, Role, Shown, StepOutcome, ToolDefinition, Usage};
pub mod approval;
pub mod approvals;
pub mod profile;
pub mod run;
pub mod session;

pub use approval::{ApprovalRequest, ApproveAll, Approver, Decision, NoOneToAsk};
pub use profile::{Agent, ProfileError, endpoint_client};
pub use run::{Checkpoint, RequestStats, RunInput, RunOutcome, Stopped};
pub use session::{
    NewRun, SessionBackend, SessionError, SessionInfo, SessionLock, SessionStore, StoredSession,
};
pub mod host;
pub mod scripted;

pub use host::{AgentHost, SendError, SendRequest, Sent, SessionClaim};
