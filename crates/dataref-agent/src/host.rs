//! [`AgentHost`]: the agents of one server (every `[agents.NAME]` resolved against the
//! registry) and their sessions, and [`AgentHost::send`], the one way a person's message
//! reaches an agent — the CLI's `chat` and `ask`, the HTTP agent API and the
//! `/v1/chat/completions` facade all go through it: history loaded, the run, the run
//! appended to the session.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use dataref_config::Config;
use dataref_protocol::{Principal, Timestamp};
use dataref_tool::{RunContext, ToolRegistry};
use tokio_util::sync::CancellationToken;

use crate::approval::Approver;
use crate::event::EventSink;
use crate::llm::ChatModel;
use crate::message::Message;
use crate::profile::{Agent, ProfileError};
use crate::run::{Checkpoint, RunInput, RunOutcome};
use crate::session::{SessionError, SessionLock, SessionStore};

/// Why a message could not be sent (the run itself never fails: its failures are in its
/// outcome).
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error(transparent)]
    Agent(#[from] ProfileError),
    #[error(transparent)]
    Session(#[from] SessionError),
    #[error("session `{0}` is answering another message; wait for it to finish")]
    Busy(String),
}

impl SendError {
    pub fn hint(&self) -> Option<String> {
        match self {
            Self::Agent(e) => e.hint(),
            Self::Session(SessionError::NotFound(_)) => {
                Some("list your sessions, or leave the session out to start a new one".into())
            }
            Self::Session(SessionError::Unavailable { .. }) => {
                Some("the server's shared index is out of reach; send the message again".into())
            }
            Self::Session(_) => None,
            Self::Busy(_) => Some("send one message at a time per session".into()),
        }
    }
}

/// One message to an agent.
pub struct SendRequest<'a> {
    pub ctx: RunContext,
    /// The profile; `None` is the default one.
    pub agent: Option<&'a str>,
    /// The session to continue; `None` starts a new one. An id the principal has no session
    /// of starts a session with that id.
    pub session: Option<String>,
    pub message: String,
    pub events: &'a dyn EventSink,
    pub approver: &'a dyn Approver,
    pub cancel: CancellationToken,
}

/// What a send did.
#[derive(Debug, Clone, PartialEq)]
pub struct Sent {
    pub session: String,
    pub agent: String,
    pub run: RunOutcome,
}

/// The agents of a server and their sessions.
pub struct AgentHost {
    agents: BTreeMap<String, Arc<Agent>>,
    default: String,
    pub sessions: Arc<SessionStore>,
    /// The model of an agent whose profile names no endpoint (the scripted analyst, for
    /// the demo); `None`: such an agent answers that it has no endpoint.
    fallback: OnceLock<Arc<dyn ChatModel>>,
    /// Sessions answering a message in this process: one message at a time per session
    /// (and the sessions' backend holds them against other processes sharing it).
    busy: Arc<Mutex<HashSet<(Principal, String)>>>,
}

impl std::fmt::Debug for AgentHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentHost")
            .field("agents", &self.agents.keys().collect::<Vec<_>>())
            .field("default", &self.default)
            .finish_non_exhaustive()
    }
}

impl AgentHost {
    /// Every profile of `config`, resolved against `registry`; sessions under `home`.
    pub fn build(config: &Config, registry: &ToolRegistry) -> Result<Self, SendError> {
        let sessions = SessionStore::open(&config.home)?;
        Self::with_sessions(config, registry, sessions)
    }

    /// [`AgentHost::build`] with the sessions kept in `sessions` (the shared index of
    /// several replicas).
    pub fn with_sessions(
        config: &Config,
        registry: &ToolRegistry,
        sessions: SessionStore,
    ) -> Result<Self, SendError> {
        let mut agents = BTreeMap::new();
        // Every run of every agent is kept in the sessions' usage ledger and counted
        // against `[budgets]`.
        let metering = sessions.ledger().map(|ledger| crate::budget::Metering {
            ledger,
            budgets: Arc::new(config.budgets.clone()),
        });
        for profile in config.agents.values() {
            let mut agent = Agent::resolve(profile, config, registry)?;
            agent.metering = metering.clone();
            agents.insert(profile.name.clone(), Arc::new(agent));
        }
        let default =
            if agents.contains_key(dataref_config::agent::DEFAULT_AGENT) || agents.len() != 1 {
                dataref_config::agent::DEFAULT_AGENT.to_owned()
            } else {
                agents.keys().next().cloned().unwrap_or_default()
            };
        Ok(Self {
            agents,
            default,
            sessions: Arc::new(sessions),
            fallback: OnceLock::new(),
            busy: Arc::default(),
        })
    }

    /// Agents without an endpoint use `model` (the demo's scripted analyst); set once.
    pub fn set_fallback(&self, model: Arc<dyn ChatModel>) {
        let _ = self.fallback.set(model);
    }

    /// The model that answers for `agent`: its endpoint, else the fallback.
    pub fn model_of(&self, agent: &Agent) -> Option<Arc<dyn ChatModel>> {
        agent.model.clone().or_else(|| self.fallback.get().cloned())
    }

    /// The profile named `name`, or the default one.
    pub fn agent(&self, name: Option<&str>) -> Result<&Arc<Agent>, ProfileError> {
        let name = name.unwrap_or(&self.default);
        self.agents.get(name).ok_or_else(|| {
            ProfileError::NoSuchAgent(
                name.to_owned(),
                self.agents
                    .keys()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", "),
            )
        })
    }

    /// The profiles' names.
    pub fn names(&self) -> Vec<String> {
        self.agents.keys().cloned().collect()
    }

    /// The default profile's name.
    pub fn default_name(&self) -> &str {
        &self.default
    }

    /// Whether `agent` can answer: it has an endpoint, or the host a fallback.
    pub fn has_model(&self, agent: &Agent) -> bool {
        agent.model.is_some() || self.fallback.get().is_some()
    }

    /// Sends one message: the session claimed (refused while it answers another message),
    /// its history loaded (a new session when none is named), the run, and the run
    /// appended to the session in one transaction.
    pub async fn send(&self, send: SendRequest<'_>) -> Result<Sent, SendError> {
        let id = send.session.clone().unwrap_or_else(SessionStore::new_id);
        let claim = self.claim(&send.ctx.principal, &id).await?;
        self.send_claimed(claim, send).await
    }

    /// Marks `principal`'s session `id` busy until the claim is released
    /// ([`SessionClaim::release`]) or dropped; `Busy` when it already is, in this process
    /// or (with a shared backend) in another replica. A host that must refuse a second
    /// message before it answers (the HTTP agent API, with a 409 before its stream) claims
    /// first and then calls [`AgentHost::send_claimed`].
    pub async fn claim(&self, principal: &Principal, id: &str) -> Result<SessionClaim, SendError> {
        SessionStore::check_id(id)?;
        let key = (principal.clone(), id.to_owned());
        if !self
            .busy
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key.clone())
        {
            return Err(SendError::Busy(id.to_owned()));
        }
        // From here a failure drops the claim, which takes the key out again.
        let mut claim = SessionClaim {
            busy: self.busy.clone(),
            key,
            lock: None,
        };
        // Only after this process's own mark: a shared backend's locks count per
        // connection, and a second claim here would be let through there.
        match self.sessions.lock(principal, id).await? {
            Some(lock) => {
                claim.lock = Some(lock);
                Ok(claim)
            }
            None => Err(SendError::Busy(id.to_owned())),
        }
    }

    /// [`AgentHost::send`] for a session claimed already: the claim's session, whatever
    /// `send.session` says, and the claim's principal must be the context's. The claim is
    /// released once the run is stored (or failed): the next message may come at once.
    pub async fn send_claimed(
        &self,
        claim: SessionClaim,
        send: SendRequest<'_>,
    ) -> Result<Sent, SendError> {
        let sent = self.send_holding(&claim, send).await;
        claim.release().await;
        sent
    }

    async fn send_holding(
        &self,
        claim: &SessionClaim,
        send: SendRequest<'_>,
    ) -> Result<Sent, SendError> {
        let agent = self.agent(send.agent)?.clone();
        let principal = send.ctx.principal.clone();
        let id = claim.key.1.clone();
        if claim.key.0 != principal {
            return Err(SendError::Session(SessionError::NotFound(id)));
        }
        let store = self.sessions.clone();
        let (p, i, a) = (principal.clone(), id.clone(), agent.name.clone());
        // SQLite waits (fsync, another process's lock) off the async workers.
        let history: Vec<Message> = match blocking(move || store.history(&p, &i, Some(&a))).await? {
            Ok(h) => h,
            Err(SessionError::NotFound(_)) => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        let now = send.ctx.clock.now();
        let checkpoint = SessionCheckpoint {
            store: self.sessions.clone(),
            principal: principal.clone(),
            id: id.clone(),
            agent: agent.name.clone(),
            now,
            started: AtomicBool::new(false),
        };
        let run = agent
            .run(RunInput {
                ctx: send.ctx,
                history,
                message: send.message,
                model: self.fallback.get().cloned(),
                events: send.events,
                approver: send.approver,
                cancel: send.cancel,
                checkpoint: Some(&checkpoint),
            })
            .await;
        let store = self.sessions.clone();
        let (i, a, r) = (id.clone(), agent.name.clone(), run.clone());
        blocking(move || store.append_run(&principal, &i, &a, now, &r)).await??;
        Ok(Sent {
            session: id,
            agent: agent.name.clone(),
            run,
        })
    }
}

/// A run kept in its session as it goes: a process killed mid-run keeps the question and
/// every finished round of tool calls.
struct SessionCheckpoint {
    store: Arc<SessionStore>,
    principal: Principal,
    id: String,
    agent: String,
    now: Timestamp,
    /// Whether the run's first piece is kept (the next ones continue it).
    started: AtomicBool,
}

#[async_trait::async_trait]
impl Checkpoint for SessionCheckpoint {
    async fn save(&self, messages: &[Message]) -> Result<(), String> {
        let store = self.store.clone();
        let (p, i, a, now) = (
            self.principal.clone(),
            self.id.clone(),
            self.agent.clone(),
            self.now,
        );
        let messages = messages.to_vec();
        let starts_run = !self.started.load(Ordering::SeqCst);
        blocking(move || store.append_messages(&p, &i, &a, now, &messages, starts_run))
            .await
            .and_then(|r| r.map_err(SendError::from))
            .map_err(|e| e.to_string())?;
        self.started.store(true, Ordering::SeqCst);
        Ok(())
    }

    fn session(&self) -> Option<&str> {
        Some(&self.id)
    }
}

/// `f` on the blocking pool; a task that died is a database error.
async fn blocking<T: std::marker::Send + 'static>(
    f: impl FnOnce() -> T + std::marker::Send + 'static,
) -> Result<T, SendError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        SendError::Session(SessionError::Database {
            path: "agent/sessions.sqlite".into(),
            detail: format!("the session task ended abnormally: {e}"),
        })
    })
}

/// A session marked busy until released or dropped ([`AgentHost::claim`]).
#[derive(Debug)]
pub struct SessionClaim {
    busy: Arc<Mutex<HashSet<(Principal, String)>>>,
    key: (Principal, String),
    /// What the sessions' backend holds against other processes; `None` once released.
    lock: Option<Box<dyn SessionLock>>,
}

impl SessionClaim {
    /// The claimed session's id.
    pub fn session(&self) -> &str {
        &self.key.1
    }

    /// Lets the session go, and waits until every replica may claim it (a message sent
    /// right after this one's answer is not refused). Dropping a claim lets it go too,
    /// the backend's part in the background.
    pub async fn release(mut self) {
        if let Some(lock) = self.lock.take() {
            lock.release().await;
        }
    }
}

impl Drop for SessionClaim {
    fn drop(&mut self) {
        // The backend's lock (if still held) goes in the background, when dropped.
        drop(self.lock.take());
        self.busy
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.key);
    }
}
