//! What the metrics read at scrape time from what a server is built of: the store's size
//! and the warm pool (`dataref_ops::metrics::set_collector`).

use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::time::Duration;

use dataref_ops::metrics;

use crate::App;

/// How long a scrape waits for the store's size before it shows the last one read.
const STORE_WAIT: Duration = Duration::from_secs(1);

impl App {
    /// Registers the collectors of this server's store and sandbox (they hold weak
    /// references: a server that is gone reports nothing more), and makes the series of
    /// what it may count at 0.
    pub fn collect_metrics(&self) {
        metrics::zero_known(self.python.is_some());
        let store = Arc::downgrade(&self.shared.store);
        // The size comes from the index, which with `[shared]` is PostgreSQL: a read that
        // hangs in an outage must not hang the scrape (Prometheus gives up after its own
        // timeout and the whole target goes dark). The read runs on a thread of its own; a
        // scrape waits for it at most `STORE_WAIT` and otherwise shows the last size read,
        // and while one read is out no second one starts.
        let pending: Mutex<Option<mpsc::Receiver<()>>> = Mutex::new(None);
        metrics::set_collector("store", move || {
            let mut pending = pending.lock().unwrap_or_else(PoisonError::into_inner);
            let done = match pending.take() {
                Some(done) => done,
                None => {
                    let Some(store) = store.upgrade() else {
                        return;
                    };
                    let (tx, done) = mpsc::channel();
                    let read = std::thread::Builder::new()
                        .name("metrics-store".into())
                        .spawn(move || {
                            match store.totals() {
                                Ok(Some((tables, bytes))) => metrics::store_size(tables, bytes),
                                Ok(None) => {}
                                Err(e) => {
                                    tracing::warn!("metrics: the store's size cannot be read: {e}");
                                }
                            }
                            let _ = tx.send(());
                        });
                    if let Err(e) = read {
                        tracing::warn!("metrics: no thread to read the store's size: {e}");
                        return;
                    }
                    done
                }
            };
            if let Err(mpsc::RecvTimeoutError::Timeout) = done.recv_timeout(STORE_WAIT) {
                *pending = Some(done);
            }
        });
        if let Some(python) = &self.python {
            let python = Arc::downgrade(python);
            metrics::set_collector("sandbox", move || {
                if let Some(python) = python.upgrade() {
                    metrics::sandbox_pool(python.warm_count(), python.running());
                }
            });
        }
    }
}
