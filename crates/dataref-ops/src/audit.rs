//! The audit trail: an append-only, hash-chained record of every data access, as JSON
//! lines. Who read which data, when, with which tool, source, query and parameters; what
//! was made, exported and downloaded; approvals asked and answered; authentication
//! failures. Never row values.
//!
//! One line per [`Event`], its fields in a fixed order:
//!
//! ```text
//! {"seq":7,"at":"2026-12-07T11:05:37.123Z","principal":"ana","event":"tool_call",…,"prev":"<hex>","hash":"<hex>"}
//! ```
//!
//! `hash` is BLAKE3 of `prev` (the hex text) followed by the line's bytes without its
//! `hash` field (the line up to `,"hash":` with `}` in its place), so a verifier hashes the
//! bytes as written and never re-serialises. `prev` is the line before's `hash` (64 zeros
//! for the first line ever); `seq` counts up by one. An edited line no longer matches its
//! hash, a removed or reordered line breaks `seq` and `prev`: [`verify()`] names the first.
//!
//! Files are `audit-000001.jsonl`, `audit-000002.jsonl`, … in one directory; a file that
//! would grow past the rotation size is closed and the chain goes on in the next. Several
//! processes may share the directory: each append takes a lock on `audit.lock` and picks
//! the chain up from the newest file's last line when another process wrote since.
//!
//! The process's log is [`install`]ed once at start; [`record`] is a no-op before that.
//! [`record`] only queues the event (a bounded queue of [`QUEUE`]): one writer thread owns
//! the files, the lock and the chain, so a caller never waits on a disk or another
//! process. A full queue or a write that fails never fails the caller: the event is
//! logged and counted ([`dropped`]). [`flush`] waits for the queue to drain (the binary
//! calls it before it exits). A [`Forward`] set with [`forward_to`] gets every line once
//! written (with `[shared]`, `dataref-replica` copies them into the index).

mod events;
mod line;
mod verify;
mod writer;

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

pub use events::{
    Arguments, ToolCallRecord, approval_answered, approval_asked, auth_failed, download, tool_call,
};
pub use line::{GENESIS, rfc3339_millis};
pub use verify::{CopyVerified, Problem, ProblemKind, Verified, verify, verify_copy};
pub use writer::{AuditError, AuditLog, DEFAULT_ROTATE_BYTES, Written, file_name, trail_id_in};

/// Field names of every line, written by the log itself: an event's field of one of these
/// names is dropped (with a warning) rather than let it shadow them.
const RESERVED: [&str; 6] = ["seq", "at", "principal", "event", "prev", "hash"];

/// One thing that happened: its kind (`tool_call`, `download`, …), who did it, and its
/// fields (written after `event`, in the order added).
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    kind: &'static str,
    principal: String,
    fields: Map<String, Value>,
}

impl Event {
    /// An event of `kind` by `principal` (empty when nobody is known, e.g. a refused
    /// token).
    pub fn new(kind: &'static str, principal: impl Into<String>) -> Self {
        Self {
            kind,
            principal: principal.into(),
            fields: Map::new(),
        }
    }

    /// Adds a field (a name the line itself uses, such as `seq` or `hash`, is dropped with
    /// a warning).
    #[must_use]
    pub fn with(mut self, key: &'static str, value: impl Into<Value>) -> Self {
        if RESERVED.contains(&key) {
            tracing::warn!(
                key,
                kind = self.kind,
                "an audit field of a reserved name was dropped"
            );
        } else {
            self.fields.insert(key.to_owned(), value.into());
        }
        self
    }

    /// Adds a field when there is a value.
    #[must_use]
    pub fn with_opt(self, key: &'static str, value: Option<impl Into<Value>>) -> Self {
        match value {
            Some(v) => self.with(key, v),
            None => self,
        }
    }

    pub fn kind(&self) -> &'static str {
        self.kind
    }
}

/// Events waiting for the writer thread; past this they are dropped and counted.
pub const QUEUE: usize = 8192;

/// The process's trail: a bounded queue into one thread that owns the log (its file, its
/// lock and its chain), so [`record`] never waits on a lock, a disk or another process.
struct Sink {
    tx: SyncSender<Event>,
    id: String,
}

static SINK: OnceLock<Sink> = OnceLock::new();
static DROPPED: AtomicU64 = AtomicU64::new(0);
/// Events queued and not yet written (or dropped) by the writer thread.
static PENDING: AtomicU64 = AtomicU64::new(0);

/// Makes `log` the process's audit trail and starts its writer thread: `true`. The first
/// call wins: a second is `false` and its log is closed. A thread that cannot be started
/// is `false` too (logged).
pub fn install(log: AuditLog) -> bool {
    if SINK.get().is_some() {
        return false;
    }
    let id = log.id().to_owned();
    let (tx, rx) = sync_channel::<Event>(QUEUE);
    let started = std::thread::Builder::new()
        .name("dataref-audit".into())
        .spawn(move || write_queued(&log, &rx));
    if let Err(e) = started {
        tracing::error!(error = %e, "the audit trail's writer thread could not be started");
        return false;
    }
    // A second install racing this one loses: its queue closes and its thread ends.
    SINK.set(Sink { tx, id }).is_ok()
}

/// The writer thread: each queued event appended, then handed to the [`Forward`].
fn write_queued(log: &AuditLog, rx: &Receiver<Event>) {
    let forward = |written| {
        if let Some(f) = FORWARD.get() {
            f.forward(written);
        }
    };
    while let Ok(event) = rx.recv() {
        match log.append_noting(&event, forward) {
            Ok(written) => forward(written),
            Err(e) => {
                count_dropped();
                tracing::warn!(kind = event.kind, error = %e, "an audit event could not be written and was dropped");
            }
        }
        PENDING.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Whether a log is installed: callers skip building an event (cloning arguments) without
/// one.
pub fn installed() -> bool {
    SINK.get().is_some()
}

/// Queues `event` for the installed log's writer thread, which appends it and hands the
/// line to the [`Forward`] (when one is set); nothing without a log. Never waits and never
/// fails: a full queue drops the event, a failed write drops the line; both are logged and
/// counted in [`dropped`].
pub fn record(event: Event) {
    let Some(sink) = SINK.get() else {
        return;
    };
    PENDING.fetch_add(1, Ordering::AcqRel);
    if let Err(e) = sink.tx.try_send(event) {
        PENDING.fetch_sub(1, Ordering::AcqRel);
        count_dropped();
        let (TrySendError::Full(event) | TrySendError::Disconnected(event)) = e;
        tracing::warn!(
            kind = event.kind,
            "the audit queue is full: an event was dropped"
        );
    }
}

/// Waits, up to `timeout`, for the queued events to be written, then for the [`Forward`]'s
/// queue to drain: `true` when both did. The binary calls it before it exits.
pub fn flush(timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    let mut wait = Duration::from_micros(200);
    while PENDING.load(Ordering::Acquire) > 0 {
        if Instant::now() >= deadline {
            tracing::warn!(
                queued = PENDING.load(Ordering::Acquire),
                "audit events were still queued at exit; the trail misses them"
            );
            return false;
        }
        std::thread::sleep(wait);
        wait = (wait * 2).min(Duration::from_millis(20));
    }
    match FORWARD.get() {
        Some(f) => f.flush(deadline.saturating_duration_since(Instant::now())),
        None => true,
    }
}

/// Events not queued (the queue full), lines not written, and lines a [`Forward`] could not
/// keep, since the process started.
pub fn dropped() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// Counts one line a [`Forward`] could not keep (its queue full, its store failing).
pub fn count_dropped() {
    DROPPED.fetch_add(1, Ordering::Relaxed);
}

/// The installed log's id ([`AuditLog::id`]).
pub fn log_id() -> Option<&'static str> {
    SINK.get().map(|s| s.id.as_str())
}

/// A second copy of every line, kept elsewhere (the shared index, `dataref-replica`).
/// `forward` is called on the trail's writer thread after each line is written: it must
/// not wait (queue the line, drop and [`count_dropped`] when the queue is full).
pub trait Forward: Send + Sync {
    fn forward(&self, line: Written);

    /// Waits, up to `timeout`, for the lines queued so far to be kept: `true` when they
    /// were. Called by [`flush`] before the process exits.
    fn flush(&self, timeout: Duration) -> bool {
        let _ = timeout;
        true
    }
}

static FORWARD: OnceLock<Box<dyn Forward>> = OnceLock::new();

/// Sets the process's [`Forward`]: `true`; the first call wins.
pub fn forward_to(forward: Box<dyn Forward>) -> bool {
    FORWARD.set(forward).is_ok()
}

#[cfg(test)]
#[expect(
    clippy::disallowed_methods,
    reason = "the tests edit the trail's files as an attacker or a crash would"
)]
mod tests;
