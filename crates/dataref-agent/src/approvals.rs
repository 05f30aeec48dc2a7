//! Where a run's pending approvals wait for the person's answer.
//!
//! A run that needs an `ask` tool approved waits on the process that runs it, while the
//! answer (over HTTP: `POST /agent/sessions/{id}/approvals/{call_id}`, `dataref-http`) may
//! reach any replica. One server keeps them in memory ([`LocalApprovals`]); replicas behind
//! a load balancer share them through an [`ApprovalStore`] every replica reaches
//! (`dataref-replica`). Either way only a pending call of the same principal and session is
//! answered: another principal's call is the same "none pending" as an unknown one.
//!
//! It is the agent's concept ([`Decision`] is what a run waits for), so it lives here: the
//! HTTP server asks it, the shared backend implements it, neither depends on the other for it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use dataref_protocol::Principal;
use tokio::sync::oneshot;

use crate::Decision;

/// A call waiting for an answer, and who may give it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PendingCall {
    pub principal: Principal,
    pub session: String,
    pub call_id: String,
}

/// Why an approval could not be asked or answered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApprovalError {
    /// The shared index cannot be reached now; `detail` is for the log.
    #[error("the shared approvals are unavailable right now")]
    Unavailable { detail: String },
}

impl ApprovalError {
    pub fn hint(&self) -> &'static str {
        match self {
            Self::Unavailable { .. } => {
                "the server's shared index is out of reach; answer again in a moment"
            }
        }
    }
}

/// Pending approvals, answerable by their principal through any replica that shares them.
#[async_trait]
pub trait ApprovalStore: Send + Sync {
    /// Makes `call` pending for up to `timeout` and returns its wait. The call is
    /// answerable through every replica once this returns (the run's stream shows
    /// `approval_needed` only then), and stays so until the wait ends
    /// ([`ApprovalWait::end`], or dropped).
    async fn ask(
        &self,
        call: &PendingCall,
        timeout: Duration,
    ) -> Result<Box<dyn ApprovalWait>, ApprovalError>;

    /// Gives `decision` to `call` if it is pending: `false` when no such call of that
    /// principal and session is (unknown, another principal's, answered, or its wait
    /// ended).
    async fn answer(&self, call: &PendingCall, decision: Decision) -> Result<bool, ApprovalError>;
}

/// One pending call's wait ([`ApprovalStore::ask`]).
#[async_trait]
pub trait ApprovalWait: Send {
    /// The answer, once someone gives it; `None` when the call was withdrawn unanswered
    /// (its row removed under it). Cancel-safe: the caller bounds it with its timeout.
    async fn decided(&mut self) -> Option<Decision>;

    /// Withdraws the call (answered or not): nothing of it is left after this. A wait
    /// dropped without it withdraws its call in the background.
    async fn end(self: Box<Self>);
}

/// Who may answer which pending approval: principal, session, call id.
type ApprovalKey = (Principal, String, String);

type Pending = HashMap<ApprovalKey, oneshot::Sender<Decision>>;

/// The approvals of one server, in memory: each answered through this server.
#[derive(Default)]
pub struct LocalApprovals {
    pending: Arc<Mutex<Pending>>,
}

impl std::fmt::Debug for LocalApprovals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalApprovals")
            .field("pending", &self.pending())
            .finish()
    }
}

impl LocalApprovals {
    /// How many calls wait for an answer now.
    pub fn pending(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> MutexGuard<'_, Pending> {
        lock(&self.pending)
    }
}

fn lock(pending: &Mutex<Pending>) -> MutexGuard<'_, Pending> {
    // Inserts and removes only: nothing half done to see after a panic.
    pending.lock().unwrap_or_else(PoisonError::into_inner)
}

fn key(call: &PendingCall) -> ApprovalKey {
    (
        call.principal.clone(),
        call.session.clone(),
        call.call_id.clone(),
    )
}

#[async_trait]
impl ApprovalStore for LocalApprovals {
    async fn ask(
        &self,
        call: &PendingCall,
        _timeout: Duration,
    ) -> Result<Box<dyn ApprovalWait>, ApprovalError> {
        let (tx, rx) = oneshot::channel();
        let key = key(call);
        self.lock().insert(key.clone(), tx);
        Ok(Box::new(LocalWait {
            pending: self.pending.clone(),
            key,
            rx,
        }))
    }

    async fn answer(&self, call: &PendingCall, decision: Decision) -> Result<bool, ApprovalError> {
        Ok(match self.lock().remove(&key(call)) {
            Some(tx) => tx.send(decision).is_ok(),
            None => false,
        })
    }
}

/// Removes its pending approval when its wait ends, however it ends.
struct LocalWait {
    pending: Arc<Mutex<Pending>>,
    key: ApprovalKey,
    rx: oneshot::Receiver<Decision>,
}

#[async_trait]
impl ApprovalWait for LocalWait {
    async fn decided(&mut self) -> Option<Decision> {
        (&mut self.rx).await.ok()
    }

    async fn end(self: Box<Self>) {}
}

impl Drop for LocalWait {
    fn drop(&mut self) {
        lock(&self.pending).remove(&self.key);
    }
}
