//! The engine's own runtime: every query is parsed, planned and run on its threads.
//!
//! - **Deep stacks.** Planning and optimizing recurse over the query's structure, and so do
//!   the derived `Clone`, `Hash`, `Eq` and `Drop` of plans and expressions, unprotected by
//!   DataFusion's stack growth. [`shape`](crate::shape) bounds the structure; the threads
//!   here have stacks sized well past what that bound needs (virtual memory: only the
//!   pages a query touches are ever backed).
//! - **Apart from the caller.** An operator that computes without yielding (a join
//!   DataFusion cannot interrupt, apache/datafusion#19358) holds an engine thread, not one of
//!   the server's: the caller's timer still fires, its answer goes out, its other requests
//!   are served.
//! - **Stopped when dropped.** A query's task is aborted when its [`crate::Query`] goes
//!   away; DataFusion's own tasks are aborted with the stream they feed.

use std::future::Future;
use std::sync::OnceLock;

use tokio::runtime::{Builder, Runtime};
use tokio::task::AbortHandle;

use crate::SqlError;

/// Each engine thread's stack. A query that passes the shape limits needs well under a
/// tenth of this in a debug build.
const STACK_BYTES: usize = 256 << 20;

static RUNTIME: OnceLock<Result<Runtime, String>> = OnceLock::new();

fn runtime() -> Result<&'static Runtime, SqlError> {
    let built = RUNTIME.get_or_init(|| {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("dataref-sql")
            .thread_stack_size(STACK_BYTES)
            .enable_time()
            // A lake on S3 is read over HTTP from these threads.
            .enable_io()
            .build()
            .map_err(|e| e.to_string())
    });
    built
        .as_ref()
        .map_err(|e| SqlError::Engine(format!("the SQL engine's threads could not start: {e}")))
}

/// Runs `work` on the engine's runtime; it stops when the returned guard is dropped.
pub(crate) fn spawn<F>(work: F) -> Result<AbortOnDrop, SqlError>
where
    F: Future<Output = ()> + Send + 'static,
{
    Ok(AbortOnDrop(runtime()?.spawn(work).abort_handle()))
}

/// Aborts its task when dropped.
#[derive(Debug)]
pub(crate) struct AbortOnDrop(AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
