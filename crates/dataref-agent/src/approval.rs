//! Approvals: a profile's policy says, per tool, allow, ask or deny; a call that asks waits
//! for an [`Approver`] (the terminal, the HTTP client) to say yes or no.

use async_trait::async_trait;
use futures_util::future::BoxFuture;
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
///
/// The loop asks in two steps: [`Approver::ask`] puts the question where its answer can
/// reach it, then the person is told (`approval_needed`), then the loop waits for the
/// [`Asked`] answer. So an answer given the moment the person is told finds the question
/// pending, however long putting it took (a row in a shared index, on another replica).
#[async_trait]
pub trait Approver: Send + Sync {
    /// The answer to `request`, asked and waited for.
    async fn decide(&self, request: &ApprovalRequest) -> Decision;

    /// Makes `request` answerable and returns the wait for its answer, which the loop
    /// awaits after telling the person. The default waits in [`Approver::decide`] then: for
    /// an approver that asks the person itself (the terminal), nothing can answer before
    /// it asks.
    async fn ask<'a>(&'a self, request: &'a ApprovalRequest) -> Asked<'a> {
        Asked::Waiting(self.decide(request))
    }
}

/// A question [`Approver::ask`] put.
pub enum Asked<'a> {
    /// Answerable now: the person is told, and this is their answer.
    Waiting(BoxFuture<'a, Decision>),
    /// Decided without anyone to tell (the question could not be put).
    Decided(Decision),
}

impl Asked<'_> {
    /// The answer, once given.
    pub async fn decision(self) -> Decision {
        match self {
            Self::Waiting(answer) => answer.await,
            Self::Decided(decision) => decision,
        }
    }
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
