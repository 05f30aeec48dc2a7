//! Progress from a tool call to the client as `notifications/progress`.
//!
//! Tools report through the synchronous [`ProgressSink`], often from a blocking thread
//! and once per batch. The sink only keeps the newest report (a `watch` channel); the
//! forwarder sends at most one notification per [`MIN_INTERVAL`], and the newest report
//! once more when the call ends if it was not sent yet, so the client always sees the
//! final count.

use std::sync::Arc;
use std::time::Duration;

use dataref_tool::ProgressSink;
use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::{Peer, RoleServer};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::notify::{Level, LogSink};
use tokio_util::sync::CancellationToken;

/// Clients draw progress bars; ten updates a second is plenty.
const MIN_INTERVAL: Duration = Duration::from_millis(100);
/// A log is read by a person: steps (a fetch's row count per batch) are thinned more.
const MIN_STEP_INTERVAL: Duration = Duration::from_millis(500);
const STEP_QUEUE: usize = 64;

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Report {
    progress: f64,
    total: Option<f64>,
    message: Option<String>,
}

/// A sink that overwrites: a fast producer never queues notifications behind a slow client.
/// It also hands each step's message to the call's log (bounded; a flood is dropped, the
/// call never waits on it).
#[derive(Debug)]
pub(crate) struct LatestReport {
    latest: Option<watch::Sender<Option<Report>>>,
    steps: Option<mpsc::Sender<String>>,
}

impl ProgressSink for LatestReport {
    fn report(&self, progress: f64, total: Option<f64>, message: Option<String>) {
        if let (Some(steps), Some(m)) = (&self.steps, &message) {
            let _ = steps.try_send(m.clone());
        }
        if let Some(latest) = &self.latest {
            // `send_replace` never fails, even after the forwarder is gone.
            latest.send_replace(Some(Report {
                progress,
                total,
                message,
            }));
        }
    }
}

/// A sink for one call: reports for [`forward`] when `progress`, step messages for
/// [`log_steps`] when `steps`.
pub(crate) fn channel(
    progress: bool,
    steps: bool,
) -> (
    Arc<LatestReport>,
    watch::Receiver<Option<Report>>,
    Option<mpsc::Receiver<String>>,
) {
    let (tx, rx) = watch::channel(None);
    let (step_tx, step_rx) = if steps {
        let (t, r) = mpsc::channel(STEP_QUEUE);
        (Some(t), Some(r))
    } else {
        (None, None)
    };
    (
        Arc::new(LatestReport {
            latest: progress.then_some(tx),
            steps: step_tx,
        }),
        rx,
        step_rx,
    )
}

/// Sends a call's step messages as `debug` log messages until `done`, at most one per
/// [`MIN_STEP_INTERVAL`] (the newest of those between), and the last one at the end.
pub(crate) async fn log_steps(
    steps: Option<mpsc::Receiver<String>>,
    log: &LogSink,
    tool: &str,
    logger: &str,
    done: CancellationToken,
) {
    let Some(mut steps) = steps else { return };
    let mut pending: Option<String> = None;
    let mut last_sent: Option<Instant> = None;
    let send = |m: String| {
        log.send(
            Level::Debug,
            logger,
            serde_json::json!({"tool": tool, "step": m}),
        )
    };
    loop {
        tokio::select! {
            biased;
            () = done.cancelled() => break,
            m = steps.recv() => {
                let Some(m) = m else { break };
                if last_sent.is_some_and(|t| t.elapsed() < MIN_STEP_INTERVAL) {
                    pending = Some(m);
                    continue;
                }
                send(m).await;
                pending = None;
                last_sent = Some(Instant::now());
            }
        }
    }
    while let Ok(m) = steps.try_recv() {
        pending = Some(m);
    }
    if let Some(m) = pending {
        send(m).await;
    }
}

/// Sends reports to `peer` until `done` is cancelled, then the last unsent one.
///
/// Run it joined with the call in the request's own task, not spawned: then every
/// notification is sent before the response, as MCP requires, and it ends with the call
/// even when a blocking thread of the tool still holds the sink.
pub(crate) async fn forward(
    peer: Peer<RoleServer>,
    token: ProgressToken,
    mut rx: watch::Receiver<Option<Report>>,
    done: CancellationToken,
) {
    loop {
        tokio::select! {
            biased;
            () = done.cancelled() => break,
            changed = rx.changed() => {
                if changed.is_err() {
                    break;
                }
            }
        }
        let report = rx.borrow_and_update().clone();
        send(&peer, &token, report).await;
        tokio::select! {
            () = done.cancelled() => break,
            () = tokio::time::sleep(MIN_INTERVAL) => {}
        }
    }
    let last = {
        let r = rx.borrow_and_update();
        r.has_changed().then(|| r.clone())
    };
    if let Some(report) = last {
        send(&peer, &token, report).await;
    }
}

async fn send(peer: &Peer<RoleServer>, token: &ProgressToken, report: Option<Report>) {
    let Some(report) = report else {
        return;
    };
    let mut param = ProgressNotificationParam::new(token.clone(), report.progress);
    if let Some(total) = report.total {
        param = param.with_total(total);
    }
    if let Some(message) = report.message {
        param = param.with_message(message);
    }
    if let Err(e) = peer.notify_progress(param).await {
        // The client went away; the call itself notices through cancellation.
        tracing::debug!(error = %e, "progress notification not sent");
    }
}
