//! Progress from a tool call to the client as `notifications/progress`.
//!
//! Tools report through the synchronous [`ProgressSink`], often from a blocking thread
//! and once per batch. The sink only keeps the newest report (a `watch` channel); the
//! forwarder sends at most one notification per [`MIN_INTERVAL`], and the newest report
//! once more when the call ends if it was not sent yet, so the client always sees the
//! final count.

use std::sync::Arc;
use std::time::Duration;

use dataref_tools::ProgressSink;
use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::{Peer, RoleServer};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Clients draw progress bars; ten updates a second is plenty.
const MIN_INTERVAL: Duration = Duration::from_millis(100);

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Report {
    progress: f64,
    total: Option<f64>,
    message: Option<String>,
}

/// A sink that overwrites: a fast producer never queues notifications behind a slow client.
#[derive(Debug)]
pub(crate) struct LatestReport(watch::Sender<Option<Report>>);

impl ProgressSink for LatestReport {
    fn report(&self, progress: f64, total: Option<f64>, message: Option<String>) {
        // `send_replace` never fails, even after the forwarder is gone.
        self.0.send_replace(Some(Report {
            progress,
            total,
            message,
        }));
    }
}

pub(crate) fn channel() -> (Arc<LatestReport>, watch::Receiver<Option<Report>>) {
    let (tx, rx) = watch::channel(None);
    (Arc::new(LatestReport(tx)), rx)
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
