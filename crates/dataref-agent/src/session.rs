//! Sessions: each principal's conversations with an agent, resumable, listable, deletable,
//! swept after their retention. Token usage is kept per request. Sessions are keyed by
//! principal and id: another principal's session is not found, the same answer as an
//! unknown one.
//!
//! [`SessionStore`] is what callers use; where the rows live is its [`SessionBackend`]:
//! SQLite under the data dir (`agent/sessions.sqlite`, [`SessionStore::open`]) for one
//! server or several on one data dir, or the shared index of several replicas
//! (`dataref-replica`), which also holds a session against the other replicas while it
//! answers a message ([`SessionBackend::lock`]).

mod sqlite;

use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;
use dataref_protocol::{Principal, Timestamp};
use serde::Serialize;

use crate::message::{Message, Usage};
use crate::run::{RequestStats, RunOutcome};

/// Sessions not used for this long are deleted by [`sweep_sessions`].
pub const SESSION_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);
/// How often [`sweep_sessions`] looks.
pub const SESSION_SWEEP_INTERVAL: Duration = Duration::from_secs(3600);

/// Deletes sessions past [`SESSION_RETENTION`] every [`SESSION_SWEEP_INTERVAL`], for as long
/// as the server runs (spawn it on the server's runtime).
pub async fn sweep_sessions(
    store: std::sync::Arc<SessionStore>,
    clock: std::sync::Arc<dyn dataref_store::Clock>,
) {
    let mut tick = tokio::time::interval(SESSION_SWEEP_INTERVAL);
    loop {
        tick.tick().await;
        let now = clock.now();
        let before = Timestamp(now.0 - SESSION_RETENTION.as_secs() as i64);
        let s = store.clone();
        match tokio::task::spawn_blocking(move || s.sweep(before)).await {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => tracing::info!(removed = n, "swept old agent sessions"),
            Ok(Err(e)) => tracing::warn!("sweeping agent sessions failed: {e}"),
            Err(e) => tracing::warn!("session sweeper task ended abnormally: {e}"),
        }
    }
}

/// The longest session id accepted from a caller.
pub const MAX_SESSION_ID: usize = 64;

/// Why a session operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("no session `{0}`")]
    NotFound(String),
    #[error("`{0}` is not a session id: use 1 to {MAX_SESSION_ID} letters, digits, `-` and `_`")]
    BadId(String),
    #[error("the session database `{path}`: {detail}")]
    Database { path: String, detail: String },
    #[error("session `{id}` belongs to agent `{agent}`, not `{asked}`")]
    OtherAgent {
        id: String,
        agent: String,
        asked: String,
    },
    /// The shared index of several replicas (`[shared]`) cannot be reached now; `detail`
    /// is for the log, not for the person.
    #[error("the shared session index is unavailable right now; try again in a moment")]
    Unavailable { detail: String },
}

/// The longest session title, in characters.
const TITLE_CHARS: usize = 80;

/// A session's title from its first message: its words on one line, at most
/// [`TITLE_CHARS`] characters, the last of them `…` when it was cut.
fn title_of(message: &str) -> String {
    dataref_store::one_line(message, TITLE_CHARS)
}

/// Part of a run to append: all of it, or a piece kept as it went.
struct Piece<'a> {
    messages: &'a [Message],
    requests: &'a [RequestStats],
    usage: Usage,
    starts_run: bool,
    ungrounded: u32,
}

/// One session, as listed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionInfo {
    pub id: String,
    pub agent: String,
    /// The first message on one line, cut to 80 characters (the last `…` when cut).
    pub title: String,
    pub created: Timestamp,
    pub updated: Timestamp,
    pub runs: u32,
    pub messages: u32,
    pub usage: Usage,
    /// Answers whose numbers matched nothing a tool produced ([`crate::ground`]).
    pub ungrounded: u32,
}

/// A session's rows as a backend keeps them.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredSession {
    /// The agent the session belongs to.
    pub agent: String,
    /// Its messages as stored ([`Message`] as JSON), in order.
    pub messages: Vec<String>,
}

/// One run to append, ready to store.
#[derive(Debug, Clone, Copy)]
pub struct NewRun<'a> {
    /// The agent of the session (kept when the session exists already).
    pub agent: &'a str,
    /// The session's title when this run creates it.
    pub title: &'a str,
    pub now: Timestamp,
    /// The run's messages ([`Message`] as JSON), in order.
    pub messages: &'a [String],
    pub requests: &'a [RequestStats],
    /// The run's total usage, added to the session's.
    pub usage: Usage,
    /// Whether these messages begin a run (counted in the session's runs); otherwise they
    /// continue the session's last run (a run kept as it goes, in pieces).
    pub starts_run: bool,
    /// Answers of these messages not grounded (0 or 1), added to the session's count.
    pub ungrounded: u32,
}

/// Where sessions live. A backend keeps rows keyed by principal and id and decides
/// nothing else: ids are checked, messages encoded and agents compared by
/// [`SessionStore`]. Every method but [`SessionBackend::lock`] may block (a file, a round
/// trip to a server): async callers run them on the blocking pool.
#[async_trait]
pub trait SessionBackend: Send + Sync + std::fmt::Debug {
    /// `principal`'s session `id`: its agent and messages; `None` when the principal has
    /// no session of that id (another principal's included).
    fn load(&self, principal: &Principal, id: &str) -> Result<Option<StoredSession>, SessionError>;

    /// Appends one run to the session, creating it on its first: one transaction, and
    /// appends to one session serialised (each run's messages follow the last one's).
    fn append(&self, principal: &Principal, id: &str, run: &NewRun<'_>)
    -> Result<(), SessionError>;

    /// `principal`'s sessions (with `only`, that one or none), the most recently used
    /// first.
    fn list(
        &self,
        principal: &Principal,
        only: Option<&str>,
    ) -> Result<Vec<SessionInfo>, SessionError>;

    /// Deletes `principal`'s session `id` with its messages; `false` when there was none.
    fn delete(&self, principal: &Principal, id: &str) -> Result<bool, SessionError>;

    /// Deletes every session not used since `before`; how many. Several sweepers may run
    /// at once (replicas): each session goes once.
    fn sweep(&self, before: Timestamp) -> Result<usize, SessionError>;

    /// Holds `principal`'s session `id` against every other process sharing these
    /// sessions while it answers a message; `None` when one of them holds it. Within a
    /// process [`AgentHost`](crate::AgentHost) lets one message at a time through already,
    /// so a backend no other process answers messages from takes nothing (the default).
    async fn lock(
        &self,
        principal: &Principal,
        id: &str,
    ) -> Result<Option<Box<dyn SessionLock>>, SessionError> {
        let _ = (principal, id);
        Ok(Some(Box::new(NoLock)))
    }
}

/// A session held by [`SessionBackend::lock`].
#[async_trait]
pub trait SessionLock: Send + Sync + std::fmt::Debug {
    /// Lets the session go now (a run ended: the next message may come at once). Dropped
    /// without this, a lock is let go in the background.
    async fn release(self: Box<Self>);
}

/// What a backend only one process answers from holds: nothing.
#[derive(Debug)]
struct NoLock;

#[async_trait]
impl SessionLock for NoLock {
    async fn release(self: Box<Self>) {}
}

/// The sessions of every principal: the one type callers use, over its backend.
#[derive(Debug)]
pub struct SessionStore {
    backend: Box<dyn SessionBackend>,
    /// The usage ledger kept beside the sessions ([`crate::budget`]); `None` keeps none.
    ledger: Option<std::sync::Arc<dyn crate::budget::UsageLedger>>,
}

impl SessionStore {
    /// Opens (and creates) `<home>/agent/sessions.sqlite`.
    pub fn open(home: &Path) -> Result<Self, SessionError> {
        let sessions = sqlite::SqliteSessions::open(home)?;
        let ledger = sqlite::SqliteUsage::open(home)?;
        Ok(Self::with_backend(Box::new(sessions)).with_ledger(std::sync::Arc::new(ledger)))
    }

    /// Sessions kept by `backend` (the shared index of several replicas), with no usage
    /// ledger ([`SessionStore::with_ledger`] adds one).
    pub fn with_backend(backend: Box<dyn SessionBackend>) -> Self {
        Self {
            backend,
            ledger: None,
        }
    }

    /// These sessions with `ledger` as the usage ledger of the runs kept in them.
    pub fn with_ledger(mut self, ledger: std::sync::Arc<dyn crate::budget::UsageLedger>) -> Self {
        self.ledger = Some(ledger);
        self
    }

    /// The usage ledger of `<home>/agent/sessions.sqlite`, opened read-only to report it
    /// (`dataref usage`): `None` when no usage was recorded there yet. Creates nothing.
    pub fn read_ledger(
        home: &Path,
    ) -> Result<Option<std::sync::Arc<dyn crate::budget::UsageLedger>>, SessionError> {
        Ok(sqlite::SqliteUsage::open_read_only(home)?
            .map(|l| std::sync::Arc::new(l) as std::sync::Arc<dyn crate::budget::UsageLedger>))
    }

    /// The usage ledger kept beside these sessions, if any.
    pub fn ledger(&self) -> Option<std::sync::Arc<dyn crate::budget::UsageLedger>> {
        self.ledger.clone()
    }

    /// A new random session id (`s-` and 20 hex digits).
    pub fn new_id() -> String {
        let mut b = [0u8; 10];
        let _ = getrandom::fill(&mut b);
        let mut s = String::from("s-");
        for x in b {
            s.push_str(&format!("{x:02x}"));
        }
        s
    }

    /// Checks a caller's session id.
    pub fn check_id(id: &str) -> Result<(), SessionError> {
        let ok = !id.is_empty()
            && id.len() <= MAX_SESSION_ID
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if ok {
            Ok(())
        } else {
            Err(SessionError::BadId(id.chars().take(80).collect()))
        }
    }

    /// The session's history, or `NotFound` (also for another principal's). With `agent`,
    /// a session of another agent is an error naming it.
    pub fn history(
        &self,
        principal: &Principal,
        id: &str,
        agent: Option<&str>,
    ) -> Result<Vec<Message>, SessionError> {
        Self::check_id(id)?;
        let Some(stored) = self.backend.load(principal, id)? else {
            return Err(SessionError::NotFound(id.to_owned()));
        };
        if let Some(asked) = agent
            && asked != stored.agent
        {
            return Err(SessionError::OtherAgent {
                id: id.to_owned(),
                agent: stored.agent,
                asked: asked.to_owned(),
            });
        }
        let mut out = Vec::with_capacity(stored.messages.len());
        for text in &stored.messages {
            match serde_json::from_str::<Message>(text) {
                Ok(m) => out.push(m),
                Err(e) => {
                    tracing::warn!(session = id, error = %e, "a stored message cannot be read; skipped")
                }
            }
        }
        Ok(out)
    }

    /// Whether the principal has this session.
    pub fn exists(&self, principal: &Principal, id: &str) -> Result<bool, SessionError> {
        Self::check_id(id)?;
        Ok(!self.backend.list(principal, Some(id))?.is_empty())
    }

    /// Appends the end of one run to the session (its messages its checkpoint did not keep
    /// already, its requests and usage), creating the session on its first run; one
    /// transaction.
    pub fn append_run(
        &self,
        principal: &Principal,
        id: &str,
        agent: &str,
        now: Timestamp,
        run: &RunOutcome,
    ) -> Result<(), SessionError> {
        let saved = run.saved.min(run.messages.len());
        let piece = Piece {
            messages: &run.messages[saved..],
            requests: &run.requests,
            usage: run.usage,
            starts_run: saved == 0,
            ungrounded: u32::from(run.grounding.as_ref().is_some_and(|g| !g.grounded())),
        };
        self.append(principal, id, agent, now, &piece)
    }

    /// Appends messages of a run as it goes ([`crate::Checkpoint`]): `starts_run` for the
    /// first piece (the person's message), then the rest of the same run.
    pub fn append_messages(
        &self,
        principal: &Principal,
        id: &str,
        agent: &str,
        now: Timestamp,
        messages: &[Message],
        starts_run: bool,
    ) -> Result<(), SessionError> {
        let piece = Piece {
            messages,
            requests: &[],
            usage: Usage::default(),
            starts_run,
            ungrounded: 0,
        };
        self.append(principal, id, agent, now, &piece)
    }

    fn append(
        &self,
        principal: &Principal,
        id: &str,
        agent: &str,
        now: Timestamp,
        piece: &Piece<'_>,
    ) -> Result<(), SessionError> {
        Self::check_id(id)?;
        // The title of a session its first run creates: the person's message, on one line,
        // cut with an ellipsis.
        let title = piece
            .messages
            .first()
            .map_or_else(String::new, |m| title_of(&m.content));
        let messages: Vec<String> = piece
            .messages
            .iter()
            .map(|m| serde_json::to_string(m).unwrap_or_default())
            .collect();
        self.backend.append(
            principal,
            id,
            &NewRun {
                agent,
                title: &title,
                now,
                messages: &messages,
                requests: piece.requests,
                usage: piece.usage,
                starts_run: piece.starts_run,
                ungrounded: piece.ungrounded,
            },
        )
    }

    /// The principal's sessions, the most recently used first.
    pub fn list(&self, principal: &Principal) -> Result<Vec<SessionInfo>, SessionError> {
        self.backend.list(principal, None)
    }

    /// One session's listing, or `NotFound`.
    pub fn info(&self, principal: &Principal, id: &str) -> Result<SessionInfo, SessionError> {
        Self::check_id(id)?;
        self.backend
            .list(principal, Some(id))?
            .into_iter()
            .find(|s| s.id == id)
            .ok_or_else(|| SessionError::NotFound(id.to_owned()))
    }

    /// Deletes a session of the principal; `NotFound` when there is none.
    pub fn delete(&self, principal: &Principal, id: &str) -> Result<(), SessionError> {
        Self::check_id(id)?;
        if self.backend.delete(principal, id)? {
            Ok(())
        } else {
            Err(SessionError::NotFound(id.to_owned()))
        }
    }

    /// Deletes every session not used since `before`; returns how many.
    pub fn sweep(&self, before: Timestamp) -> Result<usize, SessionError> {
        self.backend.sweep(before)
    }

    /// Holds the session against the other processes sharing these sessions
    /// ([`SessionBackend::lock`]); `None` when one of them holds it.
    pub async fn lock(
        &self,
        principal: &Principal,
        id: &str,
    ) -> Result<Option<Box<dyn SessionLock>>, SessionError> {
        Self::check_id(id)?;
        self.backend.lock(principal, id).await
    }
}

#[cfg(test)]
mod tests {
    use super::{TITLE_CHARS, title_of};

    #[test]
    fn a_title_is_one_line_and_says_when_it_was_cut() {
        assert_eq!(
            title_of("  Which lines\nlost   revenue? "),
            "Which lines lost revenue?"
        );
        let long = title_of(&"word ".repeat(40));
        assert_eq!(long.chars().count(), TITLE_CHARS);
        assert!(long.ends_with('…'), "{long}");
        assert_eq!(title_of(&"é".repeat(TITLE_CHARS)), "é".repeat(TITLE_CHARS));
    }
}
