//! Pending approvals shared by every replica (`dataref_approvals`): the replica running a
//! run writes the pending call and polls its row; the person's answer, through whichever
//! replica the load balancer picks, is recorded in that row only if a call of that
//! principal and session is pending there — another principal's call is not found, as an
//! unknown one is.
//!
//! A row lives while its wait does: the wait removes it when it ends (answered, timed out,
//! cancelled), in the background if it is dropped. A replica that dies mid-wait leaves its
//! row; it stops being answerable at its `expires_at` and the next call asked anywhere
//! removes it.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dataref_agent::Decision;
use dataref_agent::approvals::{ApprovalError, ApprovalStore, ApprovalWait, PendingCall};

use crate::Backend;
use crate::error::SharedError;

/// How soon a wait first looks for its answer: a client may answer the moment it sees
/// the question.
const FIRST_POLL: Duration = Duration::from_millis(50);

/// How often a wait looks for its answer once the question has waited a while (a person
/// reading it): each pause is half again the last, up to this, so a wait costs the index
/// two reads a second and an answer is seen within half a second.
const POLL: Duration = Duration::from_millis(500);

/// How long past its wait's own timeout a row stays answerable: the wait ends first, and
/// its end removes the row.
const SLACK: Duration = Duration::from_secs(60);

/// The pending approvals in the shared index.
pub(crate) struct PgApprovals {
    backend: Arc<Backend>,
}

impl PgApprovals {
    pub(crate) fn new(backend: Arc<Backend>) -> Self {
        Self { backend }
    }
}

fn approval_error(e: SharedError) -> ApprovalError {
    ApprovalError::Unavailable {
        detail: e.to_string(),
    }
}

/// The row's key, owned (for the backend's tasks).
#[derive(Debug, Clone)]
struct Key {
    principal: String,
    session: String,
    call_id: String,
}

impl From<&PendingCall> for Key {
    fn from(call: &PendingCall) -> Self {
        Self {
            principal: call.principal.as_str().to_owned(),
            session: call.session.clone(),
            call_id: call.call_id.clone(),
        }
    }
}

#[async_trait]
impl ApprovalStore for PgApprovals {
    async fn ask(
        &self,
        call: &PendingCall,
        timeout: Duration,
    ) -> Result<Box<dyn ApprovalWait>, ApprovalError> {
        let key = Key::from(call);
        let pg = self.backend.pg.clone();
        let answerable = (timeout + SLACK).as_secs_f64();
        let k = key.clone();
        self.backend
            .io
            .run("asking for an approval", async move {
                let c = pg.get().await?;
                // Rows of waits whose replica died: past answering, nobody reads them.
                c.execute(
                    "DELETE FROM dataref_approvals WHERE expires_at < now()",
                    &[],
                )
                .await?;
                // A row left under this key by such a replica is replaced: the session is
                // held by this run, so nobody else waits on it.
                c.execute(
                    "INSERT INTO dataref_approvals (principal, session, call_id, expires_at) \
                     VALUES ($1, $2, $3, now() + make_interval(secs => $4)) \
                     ON CONFLICT (principal, session, call_id) DO UPDATE \
                     SET expires_at = EXCLUDED.expires_at, approved = NULL, reason = NULL",
                    &[&k.principal, &k.session, &k.call_id, &answerable],
                )
                .await?;
                Ok(())
            })
            .await
            .map_err(approval_error)?;
        Ok(Box::new(PgWait {
            backend: self.backend.clone(),
            key: Some(key),
        }))
    }

    async fn answer(&self, call: &PendingCall, decision: Decision) -> Result<bool, ApprovalError> {
        let key = Key::from(call);
        let (approved, reason) = match decision {
            Decision::Approve => (true, None),
            Decision::Deny(reason) => (false, reason),
        };
        let pg = self.backend.pg.clone();
        self.backend
            .io
            .run("answering an approval", async move {
                let c = pg.get().await?;
                let n = c
                    .execute(
                        "UPDATE dataref_approvals SET approved = $4, reason = $5 \
                         WHERE principal = $1 AND session = $2 AND call_id = $3 \
                         AND approved IS NULL AND expires_at > now()",
                        &[
                            &key.principal,
                            &key.session,
                            &key.call_id,
                            &approved,
                            &reason,
                        ],
                    )
                    .await?;
                Ok(n == 1)
            })
            .await
            .map_err(approval_error)
    }
}

/// A pending call's row, polled until answered and removed when the wait ends.
struct PgWait {
    backend: Arc<Backend>,
    /// `None` once ended.
    key: Option<Key>,
}

/// What a poll found.
enum Polled {
    Waiting,
    Decided(Decision),
    Gone,
}

impl PgWait {
    async fn poll(&self, key: &Key) -> Result<Polled, SharedError> {
        let pg = self.backend.pg.clone();
        let key = key.clone();
        self.backend
            .io
            .run("waiting for an approval", async move {
                let c = pg.get().await?;
                let row = c
                    .query_opt(
                        "SELECT approved, reason FROM dataref_approvals \
                         WHERE principal = $1 AND session = $2 AND call_id = $3",
                        &[&key.principal, &key.session, &key.call_id],
                    )
                    .await?;
                let Some(row) = row else {
                    return Ok(Polled::Gone);
                };
                let read = |e: tokio_postgres::Error| SharedError::Index(e.to_string());
                let approved: Option<bool> = row.try_get(0).map_err(read)?;
                let reason: Option<String> = row.try_get(1).map_err(read)?;
                Ok(match approved {
                    None => Polled::Waiting,
                    Some(true) => Polled::Decided(Decision::Approve),
                    Some(false) => Polled::Decided(Decision::Deny(reason)),
                })
            })
            .await
    }
}

#[async_trait]
impl ApprovalWait for PgWait {
    async fn decided(&mut self) -> Option<Decision> {
        let key = self.key.clone()?;
        let mut failing = false;
        let mut pause = FIRST_POLL;
        loop {
            match self.poll(&key).await {
                Ok(Polled::Decided(decision)) => return Some(decision),
                Ok(Polled::Gone) => return None,
                Ok(Polled::Waiting) => failing = false,
                // The index may come back before the wait's timeout; say so once.
                Err(e) if !failing => {
                    tracing::warn!("waiting for an approval: {e}");
                    failing = true;
                }
                Err(_) => {}
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 3 / 2).min(POLL);
        }
    }

    async fn end(mut self: Box<Self>) {
        let Some(key) = self.key.take() else {
            return;
        };
        let pg = self.backend.pg.clone();
        let removed = self
            .backend
            .io
            .run("withdrawing an approval", remove(pg, key))
            .await;
        if let Err(e) = removed {
            tracing::warn!("withdrawing an approval: {e}; its row expires on its own");
        }
    }
}

impl Drop for PgWait {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            let pg = self.backend.pg.clone();
            self.backend.io.spawn(async move {
                if let Err(e) = remove(pg, key).await {
                    tracing::warn!("withdrawing an approval: {e}; its row expires on its own");
                }
            });
        }
    }
}

async fn remove(pg: Arc<crate::pg::Pg>, key: Key) -> Result<(), SharedError> {
    let c = pg.get().await?;
    c.execute(
        "DELETE FROM dataref_approvals WHERE principal = $1 AND session = $2 AND call_id = $3",
        &[&key.principal, &key.session, &key.call_id],
    )
    .await?;
    Ok(())
}
