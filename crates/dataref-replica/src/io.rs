//! The shared backend's own async runtime, and the bridge that lets sync code (the store's
//! traits, the workspace) wait on it from any thread.
//!
//! The store is called from blocking threads, from a producer's writer thread, from inside
//! another runtime's `block_on` (the PostgreSQL producer) and, for a moment, from async
//! workers. None of those may start a runtime of their own, and `Handle::block_on` panics
//! inside one. So every request to the object store and the index runs as a task on this
//! runtime, and the caller waits for its answer on a plain channel: that works from every
//! kind of thread, and a caller that gives up (its thread ends) leaves nothing half done —
//! the task still finishes or times out on its own.

use std::future::Future;
use std::time::Duration;

use crate::error::SharedError;

/// The slowest transfer to or from the object store that still counts as working: 1 MiB/s.
pub(crate) const MIN_TRANSFER_RATE: u64 = 1 << 20;

/// A multi-threaded runtime with its own two workers, kept for the process's life.
#[derive(Debug)]
pub(crate) struct Io {
    /// Always `Some` until dropped (taken out to shut it down without blocking).
    runtime: Option<tokio::runtime::Runtime>,
    /// Every request's bound: past it the shared store counts as unavailable.
    timeout: Duration,
}

impl Io {
    pub(crate) fn new(timeout: Duration) -> Result<Self, SharedError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("dataref-replica")
            .enable_all()
            .build()
            .map_err(|e| SharedError::Runtime(e.to_string()))?;
        Ok(Self {
            runtime: Some(runtime),
            timeout,
        })
    }

    fn handle(&self) -> Option<&tokio::runtime::Runtime> {
        self.runtime.as_ref()
    }

    /// Runs `fut` on this runtime, bounded by the timeout, and waits for it on this thread.
    pub(crate) fn block<T, F>(&self, what: &'static str, fut: F) -> Result<T, SharedError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, SharedError>> + Send + 'static,
    {
        self.block_for(what, self.timeout, fut)
    }

    /// The bound of moving `bytes` to or from the object store: the timeout, plus the time
    /// the bytes take at [`MIN_TRANSFER_RATE`]. A large table is slow, not unavailable.
    pub(crate) fn transfer_budget(&self, bytes: u64) -> Duration {
        self.timeout + Duration::from_secs(bytes / MIN_TRANSFER_RATE)
    }

    /// The timeout itself: how long one request, or one pause in a body, may take.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// [`Io::block`] with another bound than the timeout (transfers).
    pub(crate) fn block_for<T, F>(
        &self,
        what: &'static str,
        bound: Duration,
        fut: F,
    ) -> Result<T, SharedError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, SharedError>> + Send + 'static,
    {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let Some(runtime) = self.handle() else {
            return Err(SharedError::Runtime(format!(
                "{what}: the runtime is shut down"
            )));
        };
        runtime.spawn(async move {
            let answer = match tokio::time::timeout(bound, fut).await {
                Ok(answer) => answer,
                Err(_) => Err(SharedError::TimedOut { what, after: bound }),
            };
            if let Err(e) = &answer {
                e.count();
            }
            // The caller may be gone; its answer is then nobody's.
            let _ = tx.send(answer);
        });
        rx.recv()
            .map_err(|_| SharedError::Runtime(format!("{what}: the task was lost")))?
    }

    /// [`Io::block`] for async callers: the request runs on this runtime, the caller's task
    /// awaits its answer without blocking its thread.
    pub(crate) async fn run<T, F>(&self, what: &'static str, fut: F) -> Result<T, SharedError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, SharedError>> + Send + 'static,
    {
        let timeout = self.timeout;
        let Some(runtime) = self.handle() else {
            return Err(SharedError::Runtime(format!(
                "{what}: the runtime is shut down"
            )));
        };
        let task = runtime.spawn(async move {
            let answer = match tokio::time::timeout(timeout, fut).await {
                Ok(answer) => answer,
                Err(_) => Err(SharedError::TimedOut {
                    what,
                    after: timeout,
                }),
            };
            if let Err(e) = &answer {
                e.count();
            }
            answer
        });
        task.await
            .map_err(|e| SharedError::Runtime(format!("{what}: {e}")))?
    }

    /// Runs `fut` on this runtime without waiting (background work: sweeps, deletions).
    pub(crate) fn spawn<F>(&self, fut: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        if let Some(runtime) = self.handle() {
            runtime.spawn(fut);
        }
    }
}

impl Drop for Io {
    fn drop(&mut self) {
        // The last owner may be an async task: a runtime dropped there would panic, one
        // shut down in the background does not.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
