//! Capped capture of a job's stdout and stderr.

use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Bytes a job wrote to one stream, cut at the stream's cap.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Captured {
    /// The first bytes, at most the cap.
    pub bytes: Vec<u8>,
    /// Bytes read past the cap and thrown away before the job was killed.
    pub dropped: u64,
}

#[derive(Debug, Default)]
struct Shared {
    captured: Captured,
    eof: bool,
}

/// A thread draining one pipe into a capped buffer. Going over the cap raises `flood`.
#[derive(Debug)]
pub(crate) struct Capture {
    shared: Arc<Mutex<Shared>>,
    handle: Option<JoinHandle<()>>,
}

impl Capture {
    pub(crate) fn spawn(
        mut pipe: impl Read + Send + 'static,
        cap: usize,
        flood: Arc<AtomicBool>,
    ) -> Self {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let thread_shared = Arc::clone(&shared);
        let handle = std::thread::spawn(move || {
            let mut buf = [0u8; 16 * 1024];
            loop {
                let n = match pipe.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                };
                let mut s = thread_shared.lock().unwrap_or_else(PoisonError::into_inner);
                let room = cap.saturating_sub(s.captured.bytes.len());
                let keep = room.min(n);
                s.captured.bytes.extend_from_slice(&buf[..keep]);
                if keep < n {
                    s.captured.dropped += (n - keep) as u64;
                    flood.store(true, Ordering::SeqCst);
                }
            }
            thread_shared
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .eof = true;
        });
        Capture {
            shared,
            handle: Some(handle),
        }
    }

    /// What was captured, waiting up to `patience` for the pipe to close. A pipe can stay
    /// open only if a job process escaped the kill; then the thread is left behind rather
    /// than hanging the caller.
    pub(crate) fn finish(mut self, patience: Duration) -> Captured {
        let deadline = Instant::now() + patience;
        loop {
            let s = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
            if s.eof || Instant::now() >= deadline {
                if !s.eof {
                    tracing::warn!("a job output pipe is still open after the job ended");
                }
                let eof = s.eof;
                let captured = s.captured.clone();
                drop(s);
                if eof && let Some(handle) = self.handle.take() {
                    let _ = handle.join();
                }
                return captured;
            }
            drop(s);
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
