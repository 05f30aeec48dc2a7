//! Approvals: a profile's policy says, per tool, allow, ask or deny; a call that asks waits
//! for an [`Approver`] (the terminal, the HTTP client) to say yes or no.

use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;

/// What the person is asked to approve: the call as it will really run (for `call_tool`,
/// its target with the arguments expanded from the file, overrides merged).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ApprovalRequest {
    pub call_id: String,
    pub tool: String,
    pub arguments: Value,
    /// `call_tool` when the model asked through it (the history keeps that short call).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
}

/// The person's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Approve,
    /// Refused; the reason, when one was given, goes to the model with the refusal.
    Deny(Option<String>),
}

/// Asks someone.
#[async_trait]
pub trait Approver: Send + Sync {
    async fn decide(&self, request: &ApprovalRequest) -> Decision;
}

/// For an interface where no one can be asked: every `ask` is a refusal that says so.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoOneToAsk;

#[async_trait]
impl Approver for NoOneToAsk {
    async fn decide(&self, _request: &ApprovalRequest) -> Decision {
        Decision::Deny(Some(
            "this tool needs a person's approval, and no one can be asked on this interface".into(),
        ))
    }
}

/// Approves everything (scripts that opted in, tests).
#[derive(Debug, Default, Clone, Copy)]
pub struct ApproveAll;

#[async_trait]
impl Approver for ApproveAll {
    async fn decide(&self, _request: &ApprovalRequest) -> Decision {
        Decision::Approve
    }
}
