//! What the server tells a client without being asked: resource changes and log messages.
//!
//! - [`Watch`]: per principal, the set of its resources (live tables, workspace files)
//!   as last seen. It is looked at again after each of that principal's tool calls and
//!   every [`TICK`] (so expiry, and files written by anything else, are seen too), but only
//!   while someone listens. A difference goes out on the principal's own channel:
//!   [`Change::ListChanged`] when a resource came or went, [`Change::Updated`] for each one
//!   that changed or went. A listener gets the receiver of the principal it authenticated
//!   as, so another principal's changes never reach it: there is no channel to pick.
//! - [`Session`]: one MCP session's state: its log level (`logging/setLevel`), the URIs it
//!   subscribed to (`resources/subscribe`) and the task that forwards its principal's
//!   changes to it, stopped when the session ends.
//! - Log messages ([`LogSink`]) are about the caller's own call (its progress steps, a
//!   spilled result, a failure) and go out on that request's peer, never to other sessions.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;

use dataref_protocol::{Principal, Timestamp};
use dataref_tool::RunContext;
use rmcp::model::ResourceUpdatedNotificationParam;
#[expect(
    deprecated,
    reason = "MCP logging is deprecated by SEP-2577 but still in 2025-11-25, which hosts speak"
)]
use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam};
use rmcp::{Peer, RoleServer};
use serde_json::Value;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::resources;

/// How often a principal with listeners is looked at besides after its own calls.
pub(crate) const TICK: Duration = Duration::from_secs(15);
/// Changes a slow listener may fall behind by before it is told "the list changed".
const CHANNEL: usize = 256;
/// Tables compared at most (newest first): a store holds a working set, not thousands.
const MAX_TABLES: usize = 1_000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change {
    /// A resource of the principal appeared or went away.
    ListChanged,
    /// This resource changed or went away.
    Updated(String),
}

/// URI → what says it changed (a file's size and modification time; a table never changes,
/// it only comes and goes).
type Snapshot = BTreeMap<String, Option<(u64, Timestamp)>>;

#[derive(Default)]
pub(crate) struct Watch {
    principals: Mutex<HashMap<Principal, Arc<Watched>>>,
    ticker: OnceLock<()>,
}

struct Watched {
    tx: broadcast::Sender<Change>,
    /// The principal's store and workspace, for looking again.
    ctx: RunContext,
    /// Held across a look, so two looks never report the same change twice.
    last: tokio::sync::Mutex<Option<Snapshot>>,
}

impl Watch {
    /// A receiver of `ctx.principal`'s changes, from now on: the resources are looked at
    /// before this returns, so every later change is reported.
    pub(crate) async fn subscribe(
        self: &Arc<Self>,
        ctx: &RunContext,
    ) -> broadcast::Receiver<Change> {
        self.start_ticker();
        let watched = {
            let mut map = self
                .principals
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            map.entry(ctx.principal.clone())
                .or_insert_with(|| {
                    Arc::new(Watched {
                        tx: broadcast::channel(CHANNEL).0,
                        ctx: ctx.clone(),
                        last: tokio::sync::Mutex::new(None),
                    })
                })
                .clone()
        };
        let rx = watched.tx.subscribe();
        watched.look().await;
        rx
    }

    /// Looks at `principal`'s resources again, if anyone listens, and reports what changed.
    pub(crate) async fn refresh(&self, principal: &Principal) {
        let watched = self
            .principals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(principal)
            .cloned();
        if let Some(w) = watched
            && w.tx.receiver_count() > 0
        {
            w.look().await;
        }
    }

    fn start_ticker(self: &Arc<Self>) {
        if self.ticker.set(()).is_err() {
            return;
        }
        let weak = Arc::downgrade(self);
        // Outside a runtime (never in practice: handlers run on one) nothing ticks, and
        // changes are still seen after every tool call.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(tick(weak));
        }
    }
}

async fn tick(watch: Weak<Watch>) {
    let mut interval = tokio::time::interval(TICK);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    interval.tick().await;
    loop {
        interval.tick().await;
        let Some(watch) = watch.upgrade() else { return };
        let listened: Vec<Arc<Watched>> = {
            let mut map = watch
                .principals
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            // Nobody listens: forget it (and let go of its workspace).
            map.retain(|_, w| w.tx.receiver_count() > 0);
            map.values().cloned().collect()
        };
        drop(watch);
        for w in listened {
            w.look().await;
        }
    }
}

impl Watched {
    async fn look(&self) {
        let mut last = self.last.lock().await;
        let ctx = self.ctx.clone();
        let now = match tokio::task::spawn_blocking(move || snapshot(&ctx)).await {
            Ok(Some(s)) => s,
            // Logged where it failed; the next look tries again.
            Ok(None) | Err(_) => return,
        };
        if let Some(before) = last.as_ref() {
            for change in diff(before, &now) {
                // No receiver left is not an error: the next tick forgets this principal.
                let _ = self.tx.send(change);
            }
        }
        *last = Some(now);
    }
}

fn snapshot(ctx: &RunContext) -> Option<Snapshot> {
    let mut out = Snapshot::new();
    match ctx.store.list(&ctx.principal, MAX_TABLES) {
        Ok((metas, _)) => {
            for m in metas {
                out.insert(resources::uri_for(&m.data_ref), None);
            }
        }
        Err(e) => {
            tracing::warn!(principal = %ctx.principal, error = %e, "listing tables for change notifications failed");
            return None;
        }
    }
    match resources::files::list(&ctx.workspace) {
        Ok(listing) => {
            for f in listing.files {
                out.insert(
                    resources::files::uri_for(f.path.as_str()),
                    Some((f.size, f.modified)),
                );
            }
        }
        Err(e) => {
            tracing::warn!(principal = %ctx.principal, error = %e, "listing workspace files for change notifications failed");
            return None;
        }
    }
    Some(out)
}

/// What changed from `before` to `now`: `ListChanged` first when the set of URIs differs,
/// then `Updated` for every resource removed or changed.
fn diff(before: &Snapshot, now: &Snapshot) -> Vec<Change> {
    let mut changes = Vec::new();
    let same_set = before.len() == now.len() && before.keys().all(|k| now.contains_key(k));
    if !same_set {
        changes.push(Change::ListChanged);
    }
    for (uri, was) in before {
        match now.get(uri) {
            None => changes.push(Change::Updated(uri.clone())),
            Some(is) if is != was => changes.push(Change::Updated(uri.clone())),
            Some(_) => {}
        }
    }
    changes
}

/// One MCP session (one `initialize`, or the whole life of a stdio server).
pub(crate) struct Session {
    level: Mutex<Level>,
    subscriptions: Arc<Mutex<HashSet<String>>>,
    forwarding: OnceLock<()>,
    /// Cancelled when the session is dropped: its forwarder stops.
    ended: CancellationToken,
}

impl Default for Session {
    fn default() -> Self {
        Self {
            level: Mutex::new(Level::DEFAULT),
            subscriptions: Arc::default(),
            forwarding: OnceLock::new(),
            ended: CancellationToken::new(),
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.ended.cancel();
    }
}

impl Session {
    pub(crate) fn set_level(&self, level: Level) {
        *self.level.lock().unwrap_or_else(PoisonError::into_inner) = level;
    }

    pub(crate) fn level(&self) -> Level {
        *self.level.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn subscribe(&self, uri: String) {
        self.subscriptions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(uri);
    }

    pub(crate) fn unsubscribe(&self, uri: &str) {
        self.subscriptions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(uri);
    }

    /// From now on (once per session), `ctx.principal`'s changes go to `peer`: every
    /// `list_changed`, and `updated` for the URIs this session subscribed to.
    pub(crate) async fn forward(
        &self,
        watch: &Arc<Watch>,
        ctx: &RunContext,
        peer: Peer<RoleServer>,
    ) {
        if self.forwarding.set(()).is_err() {
            return;
        }
        let mut rx = watch.subscribe(ctx).await;
        let subscriptions = self.subscriptions.clone();
        let ended = self.ended.clone();
        tokio::spawn(async move {
            loop {
                let change = tokio::select! {
                    () = ended.cancelled() => return,
                    c = rx.recv() => c,
                };
                let sent = match change {
                    Ok(Change::ListChanged) | Err(broadcast::error::RecvError::Lagged(_)) => {
                        peer.notify_resource_list_changed().await
                    }
                    Ok(Change::Updated(uri)) => {
                        let wanted = subscriptions
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .contains(&uri);
                        if !wanted {
                            continue;
                        }
                        peer.notify_resource_updated(ResourceUpdatedNotificationParam::new(uri))
                            .await
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                };
                if sent.is_err() || peer.is_transport_closed() {
                    return;
                }
            }
        });
    }
}

/// A log level, ordered by severity (RFC 5424, as MCP has them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Level {
    Debug,
    Info,
    Notice,
    Warning,
    Error,
    Critical,
    Alert,
    Emergency,
}

#[expect(
    deprecated,
    reason = "MCP logging is deprecated by SEP-2577 but still in 2025-11-25, which hosts speak"
)]
impl Level {
    /// Before `logging/setLevel`: what a person should see (failures), not the steps.
    pub(crate) const DEFAULT: Self = Self::Warning;

    pub(crate) fn from_mcp(level: LoggingLevel) -> Self {
        match level {
            LoggingLevel::Debug => Self::Debug,
            LoggingLevel::Info => Self::Info,
            LoggingLevel::Notice => Self::Notice,
            LoggingLevel::Warning => Self::Warning,
            LoggingLevel::Error => Self::Error,
            LoggingLevel::Critical => Self::Critical,
            LoggingLevel::Alert => Self::Alert,
            LoggingLevel::Emergency => Self::Emergency,
        }
    }

    fn to_mcp(self) -> LoggingLevel {
        match self {
            Self::Debug => LoggingLevel::Debug,
            Self::Info => LoggingLevel::Info,
            Self::Notice => LoggingLevel::Notice,
            Self::Warning => LoggingLevel::Warning,
            Self::Error => LoggingLevel::Error,
            Self::Critical => LoggingLevel::Critical,
            Self::Alert => LoggingLevel::Alert,
            Self::Emergency => LoggingLevel::Emergency,
        }
    }
}

/// Log messages about one call, to the peer of its request, at or above the session's
/// level (read once, when the call starts).
pub(crate) struct LogSink {
    peer: Peer<RoleServer>,
    min: Level,
}

impl LogSink {
    pub(crate) fn new(peer: Peer<RoleServer>, min: Level) -> Self {
        Self { peer, min }
    }

    pub(crate) fn wants(&self, level: Level) -> bool {
        level >= self.min
    }

    #[expect(
        deprecated,
        reason = "MCP logging is deprecated by SEP-2577 but still in 2025-11-25, which hosts speak"
    )]
    pub(crate) async fn send(&self, level: Level, logger: &str, data: Value) {
        if !self.wants(level) {
            return;
        }
        let mut param = LoggingMessageNotificationParam::new(level.to_mcp(), data);
        param.logger = Some(logger.to_owned());
        // A client that went away misses its log line; the call itself goes on.
        let _ = self.peer.notify_logging_message(param).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(entries: &[(&str, Option<u64>)]) -> Snapshot {
        entries
            .iter()
            .map(|(u, s)| ((*u).to_owned(), s.map(|n| (n, Timestamp(0)))))
            .collect()
    }

    #[test]
    fn differences() {
        let a = snap(&[("t1", None), ("f1", Some(1))]);
        assert_eq!(diff(&a, &a), vec![]);
        let added = snap(&[("t1", None), ("f1", Some(1)), ("t2", None)]);
        assert_eq!(diff(&a, &added), vec![Change::ListChanged]);
        let removed = snap(&[("f1", Some(1))]);
        assert_eq!(
            diff(&a, &removed),
            vec![Change::ListChanged, Change::Updated("t1".into())]
        );
        let rewritten = snap(&[("t1", None), ("f1", Some(2))]);
        assert_eq!(diff(&a, &rewritten), vec![Change::Updated("f1".into())]);
    }

    #[test]
    fn levels_order_by_severity() {
        assert!(Level::Debug < Level::Info);
        assert!(Level::Warning < Level::Emergency);
    }
}
