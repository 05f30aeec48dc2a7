//! `run_python`'s engine: a warm pool of single-use sandboxes over the managed runtime.
//!
//! A warm sandbox is a jailed runner that has already imported numpy, pandas and pyarrow
//! under the full confinement and now blocks on its stdin, a Unix socket. A job takes one
//! from the pool, writes `request.json`, `code.py` and `in/files/` into its job directory
//! (bound read-only into the sandbox, so the host's later writes show through), and sends
//! `go` with the input artifacts' file descriptors attached (`SCM_RIGHTS`): the sandbox maps
//! the Arrow files from those descriptors and never sees a path of the store. Each sandbox
//! serves one job and is destroyed; a background thread refills the pool. A server fills
//! the pool as it starts ([`PythonSandbox::prewarm`], which returns at once): a job that
//! arrives while a warm sandbox is on its way waits for it (it is further along than a new
//! one would be, and a cold start would queue behind it on the same thread anyway). When
//! the pool is empty and nothing is filling it (no pool, the runtime only just installed,
//! or a warm sandbox failed to start) a sandbox is started for the job (the cold path),
//! through the same steps.
//!
//! The thread that starts sandboxes lives as long as the [`PythonSandbox`]: bubblewrap's
//! `--die-with-parent` ties each sandbox to the thread that spawned it.
//!
//! At most [`SandboxSettings::max_concurrent`] jobs run at once; later calls wait in line
//! (hearing "waiting for a free sandbox, N ahead" and honouring cancellation). A server
//! about to exit calls [`PythonSandbox::shutdown`], which stops running jobs and removes
//! every warm sandbox with its cgroup and job directory; whatever a `kill -9` left is
//! removed by the next start, which sweeps job cgroups and job directories whose owner
//! process is gone (each name carries its owner's pid and start time).

use std::collections::VecDeque;
use std::fs::{self, File};
use std::io::{IoSlice, Read};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, mpsc};
use std::time::{Duration, Instant};

use rustix::net::{
    AddressFamily, SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketFlags, SocketType,
    sendmsg, socketpair,
};

use crate::jail::{
    self, Captured, CgroupPolicy, JAIL_GID, JAIL_UID, JailError, JobLimits, JobSpec, JobStatus,
    RoBind, SANDBOX_WORK_DIR, Started, owner,
};
use crate::runtime::exchange::{self, ExchangeCaps, ExchangeError, JobLayout, JobResult};
use crate::runtime::{Runtime, RuntimeError, RuntimeSpec};

/// Where the managed runtime appears inside the sandbox.
pub const SANDBOX_RUNTIME_DIR: &str = "/opt/dataref/python";

/// How long a new sandbox may take to import pandas and pyarrow.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// At most this many input tables per job (one descriptor each in one message).
pub const MAX_INPUTS: usize = 32;
/// Files passed with `files` are copied into the job; together at most this many bytes.
pub const MAX_IN_FILE_BYTES: u64 = 256 << 20;

/// How the sandbox is built and bounded.
#[derive(Debug, Clone)]
pub struct SandboxSettings {
    /// The data directory: the managed runtime lives in `<home>/python`, job directories
    /// in `<home>/jobs`. When dataref runs as root, jobs run as uid 65534, which must be able
    /// to reach both (so not under `/root`).
    pub home: PathBuf,
    pub runtime: RuntimeSpec,
    /// Warm sandboxes kept ready; 0 turns the pool off (every job starts cold).
    pub pool_size: usize,
    /// Per-job limits; `wall_clock` is replaced by each job's timeout.
    pub limits: JobLimits,
    /// Jobs running at once; more wait in line for a free sandbox. At least 1.
    pub max_concurrent: usize,
    pub caps: ExchangeCaps,
    pub cgroups: CgroupPolicy,
}

/// One job: the model's code, its input tables and files.
#[derive(Debug)]
pub struct PythonJob {
    pub code: String,
    /// `(global name, artifact file)`: Arrow IPC files, opened read-only by the caller.
    pub inputs: Vec<(String, File)>,
    /// `(path under in/files, file)`: copied into the job before it starts.
    pub files: Vec<(String, File)>,
    pub timeout: Duration,
}

/// How a job went. The job directory (and with it the output files `result` points at)
/// is removed when this is dropped.
#[derive(Debug)]
pub struct PythonRun {
    pub status: JobStatus,
    pub stdout: Captured,
    pub stderr: Captured,
    /// From the hand-off to the end (a warm sandbox's start-up is not counted).
    pub duration: Duration,
    /// Served by a pre-started sandbox.
    pub warm: bool,
    /// What the runner reported, for a job that ended by itself (`None` when it was killed
    /// for a limit or cancelled).
    pub result: Option<Result<JobResult, ExchangeError>>,
    _dir: JobDir,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SandboxError {
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    Jail(#[from] JailError),
    #[error(transparent)]
    Exchange(#[from] ExchangeError),
    #[error("{action} `{}`: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0} input tables, at most {MAX_INPUTS} are allowed")]
    TooManyInputs(usize),
    #[error("the sandbox pool has shut down")]
    ShutDown,
    /// Cancelled while waiting for a free sandbox (nothing ran).
    #[error("the run was cancelled while it waited for a free sandbox")]
    Cancelled,
    #[error("the Python runner did not start ({reason}); it printed:\n{stderr}")]
    NotReady { reason: String, stderr: String },
}

impl SandboxError {
    /// What an operator or the model can do about it.
    pub fn hint(&self) -> Option<String> {
        match self {
            SandboxError::Jail(e) => e.hint(),
            SandboxError::TooManyInputs(_) => {
                Some("combine tables in one `query`, or run the work in steps".to_owned())
            }
            SandboxError::Exchange(ExchangeError::InputName { .. }) => Some(
                "input names become Python globals: use identifiers such as `sales` or `q1`"
                    .to_owned(),
            ),
            _ => None,
        }
    }

    /// Whether the caller's arguments caused it (not the host).
    pub fn is_caller_error(&self) -> bool {
        matches!(
            self,
            SandboxError::TooManyInputs(_)
                | SandboxError::Exchange(
                    ExchangeError::InputName { .. } | ExchangeError::FilePath { .. }
                )
        )
    }
}

fn io_error(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> SandboxError {
    let path = path.to_path_buf();
    move |source| SandboxError::Io {
        action,
        path,
        source,
    }
}

/// The job directory; removed with everything in it when dropped.
#[derive(Debug)]
struct JobDir(JobLayout);

impl Drop for JobDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(self.0.root());
    }
}

/// A sandbox started ahead, blocked on its socket.
struct Warm {
    started: Started,
    socket: UnixStream,
    dir: JobDir,
}

enum Request {
    /// Find the runtime if it is installed (installing nothing), then fill the pool.
    Prewarm,
    Refill,
    Cold(mpsc::SyncSender<Result<Warm, SandboxError>>),
    /// Drop every warm sandbox (on this thread, their parent), then stop.
    Shutdown(mpsc::SyncSender<()>),
}

struct Shared {
    settings: SandboxSettings,
    runtime: Mutex<Option<Runtime>>,
    pool: Mutex<PoolState>,
    /// Notified when a warm sandbox is added or a fill ends.
    pool_changed: Condvar,
    /// Set by [`PythonSandbox::shutdown`]: no new job starts, running ones are cancelled.
    closing: AtomicBool,
    gate: Gate,
}

#[derive(Default)]
struct PoolState {
    ready: VecDeque<Warm>,
    /// Fill requests sent to the spawner and not yet done: while there is one, a warm
    /// sandbox is on its way (unless starting it fails).
    fills: usize,
    warm_runs: u64,
    cold_runs: u64,
}

impl Shared {
    fn pool(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.pool.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A fill is done (the pool is full, or a sandbox failed to start).
    fn fill_done(&self) {
        let mut pool = self.pool();
        pool.fills = pool.fills.saturating_sub(1);
        drop(pool);
        self.pool_changed.notify_all();
    }
}

/// What the warm pool is doing, for tests and `bench first-run`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStatus {
    /// Warm sandboxes ready now.
    pub ready: usize,
    /// A warm sandbox is being started (or about to be) for the pool.
    pub filling: bool,
    /// Jobs served by a sandbox started for the pool, and by one started for the job.
    pub warm_runs: u64,
    pub cold_runs: u64,
}

/// Job directories are `<home>/jobs/<owner>-<n>` (the owner as in [`owner::tag`]); `n`
/// counts over every [`PythonSandbox`] of the process, so that two of them never take (and
/// clear as stale) each other's directory.
static NEXT_JOB_ID: AtomicU64 = AtomicU64::new(0);

/// Admission of jobs: at most `max` run at once, the rest wait in arrival order.
struct Gate {
    max: usize,
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Default)]
struct GateState {
    running: usize,
    /// Tickets of the waiting calls, first in line first.
    waiting: VecDeque<u64>,
    next_ticket: u64,
    closed: bool,
}

/// A running job's place; dropping it lets the next one in.
struct Permit<'a>(&'a Gate);

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        let mut state = self.0.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.running -= 1;
        drop(state);
        self.0.changed.notify_all();
    }
}

impl Gate {
    fn new(max: usize) -> Self {
        Gate {
            max: max.max(1),
            state: Mutex::new(GateState::default()),
            changed: Condvar::new(),
        }
    }

    /// Waits for a free place (in line), telling `progress` whenever the line moves.
    fn enter(
        &self,
        progress: &dyn Fn(&str),
        cancel: &dyn Fn() -> bool,
    ) -> Result<Permit<'_>, SandboxError> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        state.waiting.push_back(ticket);
        let mut told: Option<usize> = None;
        loop {
            let ahead = state.waiting.iter().position(|t| *t == ticket).unwrap_or(0);
            let leave = if state.closed {
                Some(SandboxError::ShutDown)
            } else if cancel() {
                Some(SandboxError::Cancelled)
            } else {
                None
            };
            if let Some(e) = leave {
                state.waiting.retain(|t| *t != ticket);
                drop(state);
                self.changed.notify_all();
                return Err(e);
            }
            if ahead == 0 && state.running < self.max {
                state.waiting.pop_front();
                state.running += 1;
                drop(state);
                self.changed.notify_all();
                return Ok(Permit(self));
            }
            if told != Some(ahead) {
                told = Some(ahead);
                let running = state.running;
                drop(state);
                progress(&format!(
                    "waiting for a free sandbox ({running} of {} running, {ahead} ahead)",
                    self.max
                ));
                state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                continue;
            }
            // Woken when the line moves; the timeout is for `cancel`, which cannot wake us.
            state = self
                .changed
                .wait_timeout(state, Duration::from_millis(50))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    fn close(&self) {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .closed = true;
        self.changed.notify_all();
    }

    /// Waits until no job runs, at most `patience`.
    fn wait_idle(&self, patience: Duration) -> bool {
        let deadline = Instant::now() + patience;
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        while state.running > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            state = self
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }
}

/// `run_python`'s sandbox: lazily provisioned runtime, warm pool, cold path.
pub struct PythonSandbox {
    shared: Arc<Shared>,
    spawner: Mutex<mpsc::Sender<Request>>,
}

impl std::fmt::Debug for PythonSandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PythonSandbox")
            .field("settings", &self.shared.settings)
            .finish_non_exhaustive()
    }
}

impl PythonSandbox {
    /// Nothing is started or installed until [`PythonSandbox::prewarm`] or the first job.
    pub fn new(settings: SandboxSettings) -> Self {
        let gate = Gate::new(settings.max_concurrent);
        let shared = Arc::new(Shared {
            settings,
            runtime: Mutex::new(None),
            pool: Mutex::new(PoolState::default()),
            pool_changed: Condvar::new(),
            closing: AtomicBool::new(false),
            gate,
        });
        let (tx, rx) = mpsc::channel();
        let thread_shared = Arc::clone(&shared);
        // A plain thread (not a runtime's blocking pool, whose threads exit when idle and
        // would take their sandboxes with them).
        let _ = std::thread::Builder::new()
            .name("dataref-sandbox-pool".to_owned())
            .spawn(move || spawner(&thread_shared, &rx));
        PythonSandbox {
            shared,
            spawner: Mutex::new(tx),
        }
    }

    pub fn settings(&self) -> &SandboxSettings {
        &self.shared.settings
    }

    /// Starts filling the pool, for a server's start-up: returns at once. The pool's thread
    /// finds the runtime if it is installed (by its files; never downloads anything: the
    /// first job does, with progress) and starts the warm sandboxes one after the other;
    /// a job that arrives meanwhile waits for the first. Costs nothing more than
    /// [`SandboxSettings::pool_size`] idle sandboxes, and nothing with a pool of 0.
    pub fn prewarm(&self) {
        self.fill(Request::Prewarm);
    }

    /// Asks the spawner to fill the pool; until it is done, jobs wait for a warm sandbox.
    fn fill(&self, request: Request) {
        if self.shared.settings.pool_size == 0 || self.shared.closing.load(Ordering::SeqCst) {
            return;
        }
        self.shared.pool().fills += 1;
        if !self.send(request) {
            self.shared.fill_done();
        }
    }

    /// The runtime, provisioned on first use (`progress` hears each step).
    pub fn runtime(&self, progress: &dyn Fn(&str)) -> Result<Runtime, SandboxError> {
        let mut slot = self
            .shared
            .runtime
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(r) = &*slot {
            return Ok(r.clone());
        }
        let settings = &self.shared.settings;
        let runtime = Runtime::ensure_with(&settings.home, &settings.runtime, progress)?;
        *slot = Some(runtime.clone());
        Ok(runtime)
    }

    /// Warm sandboxes ready now.
    pub fn warm_count(&self) -> usize {
        self.shared.pool().ready.len()
    }

    /// Waits, at most `patience`, until a warm sandbox is ready or none is coming (no
    /// runtime installed, no pool, a sandbox that failed to start); whether one is ready.
    /// For a server's start-up: answering the client's handshake only then makes its first
    /// call a warm one.
    pub fn wait_warm(&self, patience: Duration) -> bool {
        let deadline = Instant::now() + patience;
        let mut pool = self.shared.pool();
        loop {
            if !pool.ready.is_empty() {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if pool.fills == 0 || left.is_zero() || self.shared.closing.load(Ordering::SeqCst) {
                return false;
            }
            pool = self
                .shared
                .pool_changed
                .wait_timeout(pool, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// What the pool holds and is doing now.
    pub fn status(&self) -> PoolStatus {
        let pool = self.shared.pool();
        PoolStatus {
            ready: pool.ready.len(),
            filling: pool.fills > 0,
            warm_runs: pool.warm_runs,
            cold_runs: pool.cold_runs,
        }
    }

    /// Runs one job to its end: blocks, so call it from a blocking thread. Waits in line
    /// while [`SandboxSettings::max_concurrent`] jobs run (telling `progress`). `cancel` is
    /// polled every few milliseconds and kills the job.
    pub fn run(
        &self,
        job: PythonJob,
        progress: &dyn Fn(&str),
        cancel: &dyn Fn() -> bool,
    ) -> Result<PythonRun, SandboxError> {
        // The job's span, under the caller's (the tool call's): waiting in line, the
        // sandbox taken or started, the run. No code, no output in it.
        let span = tracing::info_span!(
            "sandbox_job",
            inputs = job.inputs.len(),
            warm = tracing::field::Empty,
            status = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        );
        let _in_job = span.enter();
        let ran = self.run_in_span(job, progress, cancel);
        match &ran {
            Ok(run) => {
                span.record("warm", run.warm);
                span.record("status", tracing::field::debug(&run.status));
            }
            Err(_) => {
                span.record("otel.status_code", "ERROR");
            }
        }
        ran
    }

    fn run_in_span(
        &self,
        job: PythonJob,
        progress: &dyn Fn(&str),
        cancel: &dyn Fn() -> bool,
    ) -> Result<PythonRun, SandboxError> {
        if job.inputs.len() > MAX_INPUTS {
            return Err(SandboxError::TooManyInputs(job.inputs.len()));
        }
        let closing = || self.shared.closing.load(Ordering::SeqCst);
        let cancel = &|| cancel() || closing();
        if closing() {
            return Err(SandboxError::ShutDown);
        }
        let _permit = self.shared.gate.enter(progress, cancel)?;
        self.runtime(progress)?;
        let (warm, was_warm) = match self.take_warm(progress, cancel)? {
            Some(w) => (w, true),
            None => (self.start_cold()?, false),
        };
        {
            let mut pool = self.shared.pool();
            if was_warm {
                pool.warm_runs += 1;
            } else {
                pool.cold_runs += 1;
                dataref_ops::metrics::sandbox_cold_start();
            }
        }
        tracing::debug!(warm = was_warm, "run_python job handed to its sandbox");
        // Refill in the background while this job runs.
        self.fill(Request::Refill);
        let Warm {
            started,
            socket,
            dir,
        } = warm;
        let settings = &self.shared.settings;
        let names: Vec<&str> = job.inputs.iter().map(|(n, _)| n.as_str()).collect();
        exchange::write_request(&dir.0, &names, &job.code, &settings.caps)?;
        let mut budget = MAX_IN_FILE_BYTES;
        for (rel, file) in &job.files {
            let mut file = file;
            let copied = exchange::copy_in_file(&dir.0, rel, &mut file, budget, &settings.caps)?;
            budget -= copied;
        }
        let fds: Vec<BorrowedFd<'_>> = job.inputs.iter().map(|(_, f)| f.as_fd()).collect();
        // A send that fails means the sandbox died while idle; its wait reports how.
        let _ = send_go(&socket, &fds);
        drop(socket);
        let outcome = started.wait(job.timeout, cancel)?;
        count_kill(outcome.status);
        let result = match (outcome.status, &outcome.out) {
            (JobStatus::Exited(_) | JobStatus::Signaled(_), Some(out)) => {
                Some(exchange::collect_at(out, dir.0.root(), &settings.caps))
            }
            (JobStatus::Exited(_) | JobStatus::Signaled(_), None) => {
                Some(Err(ExchangeError::NoResult))
            }
            _ => None,
        };
        Ok(PythonRun {
            status: outcome.status,
            stdout: outcome.stdout,
            stderr: outcome.stderr,
            duration: outcome.duration,
            warm: was_warm,
            result,
            _dir: dir,
        })
    }

    /// A warm sandbox: one that is ready, or else the one the pool is starting (waiting
    /// for it, telling `progress`); `None` when none is coming (the cold path).
    fn take_warm(
        &self,
        progress: &dyn Fn(&str),
        cancel: &dyn Fn() -> bool,
    ) -> Result<Option<Warm>, SandboxError> {
        let mut pool = self.shared.pool();
        let mut told = false;
        loop {
            while let Some(mut warm) = pool.ready.pop_front() {
                if warm.started.is_running() {
                    return Ok(Some(warm));
                }
                tracing::warn!("a warm sandbox died while idle; discarding it");
            }
            if pool.fills == 0 {
                return Ok(None);
            }
            if self.shared.closing.load(Ordering::SeqCst) {
                return Err(SandboxError::ShutDown);
            }
            if cancel() {
                return Err(SandboxError::Cancelled);
            }
            if !told {
                told = true;
                drop(pool);
                progress("waiting for the warm sandbox that is starting");
                pool = self.shared.pool();
                continue;
            }
            // Woken when one is ready or the fill ends; the timeout is for `cancel`.
            pool = self
                .shared
                .pool_changed
                .wait_timeout(pool, Duration::from_millis(50))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    fn start_cold(&self) -> Result<Warm, SandboxError> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.send(Request::Cold(tx));
        rx.recv().map_err(|_| SandboxError::ShutDown)?
    }

    /// Jobs running now.
    pub fn running(&self) -> usize {
        self.shared
            .gate
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .running
    }

    /// Stops for good, for a server about to exit: refuses new jobs and cancels waiting and
    /// running ones (waiting up to `patience` for them to clean up), then kills every warm
    /// sandbox and removes its cgroup and job directory. Without this, an exiting process
    /// takes its sandboxes down (`--die-with-parent`) but leaves their cgroups and job
    /// directories for the next start's sweep. Idempotent; dropping the sandbox does the same.
    pub fn shutdown(&self, patience: Duration) {
        if self.shared.closing.swap(true, Ordering::SeqCst) {
            return;
        }
        self.shared.gate.close();
        if !self.shared.gate.wait_idle(patience) {
            tracing::warn!("run_python jobs were still running at shutdown");
        }
        let (tx, rx) = mpsc::sync_channel(1);
        self.send(Request::Shutdown(tx));
        // The spawner may be starting a sandbox (importing pandas takes a few seconds).
        if rx.recv_timeout(patience.max(READY_TIMEOUT / 4)).is_err() {
            // Not on the spawner thread: still kills them and removes what they used.
            self.shared.pool().ready.clear();
        }
        if !jail::wait_for_cleanup(patience) {
            tracing::warn!("job cgroups were still being removed at shutdown");
        }
    }

    /// Whether the spawner got it (it is gone once shut down).
    fn send(&self, request: Request) -> bool {
        self.spawner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .send(request)
            .is_ok()
    }
}

impl Drop for PythonSandbox {
    fn drop(&mut self) {
        self.shutdown(Duration::from_secs(10));
    }
}

/// A job stopped by us or the kernel, in the metrics; one that ended by itself is not.
fn count_kill(status: JobStatus) {
    let reason = match status {
        JobStatus::Exited(_) | JobStatus::Signaled(_) => return,
        JobStatus::TimedOut => "timeout",
        JobStatus::MemoryLimit => "memory",
        JobStatus::OutputFlood => "output_flood",
        JobStatus::OutLimit => "out_limit",
        JobStatus::Cancelled => "cancelled",
    };
    dataref_ops::metrics::sandbox_killed(reason);
}

/// Job directories of dataref processes that are gone (killed with jobs running or warm
/// sandboxes waiting); a live process's are left alone. Returns how many were removed.
pub fn remove_stale_job_dirs(home: &Path) -> usize {
    let jobs = home.join("jobs");
    let Ok(entries) = fs::read_dir(&jobs) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some((pid, start)) = name
            .to_str()
            .and_then(|n| n.split_once('-'))
            .and_then(|(owner, _)| owner::parse(owner))
        else {
            continue;
        };
        if owner::alive(pid, start) {
            continue;
        }
        match fs::remove_dir_all(entry.path()) {
            Ok(()) => removed += 1,
            Err(e) => {
                tracing::warn!(error = %e, path = %entry.path().display(), "could not remove a stale job directory");
            }
        }
    }
    removed
}

fn spawner(shared: &Shared, rx: &mpsc::Receiver<Request>) {
    let dirs = remove_stale_job_dirs(&shared.settings.home);
    let cgroups = jail::sweep_stale_cgroups();
    if dirs + cgroups > 0 {
        tracing::info!(
            job_dirs = dirs,
            cgroups,
            "removed what dead dataref processes left behind"
        );
    }
    while let Ok(request) = rx.recv() {
        match request {
            Request::Shutdown(done) => {
                shared.pool().ready.clear();
                let _ = done.send(());
                return;
            }
            Request::Cold(reply) => {
                let _ = reply.send(spawn(shared));
            }
            Request::Prewarm => {
                if find_runtime(shared) {
                    refill(shared);
                }
                shared.fill_done();
            }
            Request::Refill => {
                refill(shared);
                shared.fill_done();
            }
        }
    }
    // The sandbox is gone: kill the warm ones on this thread, their parent.
    shared.pool().ready.clear();
}

/// The installed runtime, for the pool's first fill (installing nothing: that is the first
/// job's, with progress); whether there is one.
fn find_runtime(shared: &Shared) -> bool {
    let mut slot = shared
        .runtime
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if slot.is_some() {
        return true;
    }
    match Runtime::installed(&shared.settings.home, &shared.settings.runtime) {
        Ok(Some(runtime)) => {
            *slot = Some(runtime);
            true
        }
        Ok(None) => false,
        Err(e) => {
            tracing::warn!(error = %e, "the Python runtime is not usable; the pool stays empty");
            false
        }
    }
}

/// Starts warm sandboxes until the pool is full (or one fails to start).
fn refill(shared: &Shared) {
    loop {
        let have = shared.pool().ready.len();
        if have >= shared.settings.pool_size || shared.closing.load(Ordering::SeqCst) {
            return;
        }
        let started = Instant::now();
        match spawn(shared) {
            Ok(warm) => {
                tracing::debug!(
                    ms = started.elapsed().as_millis(),
                    "a warm sandbox is ready"
                );
                shared.pool().ready.push_back(warm);
                shared.pool_changed.notify_all();
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not start a warm sandbox");
                return;
            }
        }
    }
}

fn spawn(shared: &Shared) -> Result<Warm, SandboxError> {
    let settings = &shared.settings;
    let runtime = shared
        .runtime
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
        .ok_or(SandboxError::ShutDown)?;
    let jobs = settings.home.join("jobs");
    fs::create_dir_all(&jobs).map_err(io_error("creating", &jobs))?;
    let id = NEXT_JOB_ID.fetch_add(1, Ordering::Relaxed);
    let path = jobs.join(format!("{}-{id}", owner::tag()));
    if path.exists() {
        fs::remove_dir_all(&path).map_err(io_error("removing the stale", &path))?;
    }
    let dir = JobDir(exchange::create_job_dir(&path)?);
    if rustix::process::geteuid().is_root() {
        give_to_jail(dir.0.root())?;
    }
    let (ours, theirs) = socketpair(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| io_error("creating the job socket for", dir.0.root())(e.into()))?;

    // The managed venv is mounted at a fixed path, so a data dir anywhere on the host (even
    // under `/tmp`, which is the sandbox's own tmpfs) works; a venv finds its packages
    // from the location of its interpreter. An operator's interpreter keeps its own path.
    let (program, mut ro_binds) = match settings.runtime {
        RuntimeSpec::Managed { .. } => (
            Path::new(SANDBOX_RUNTIME_DIR).join("bin/python"),
            vec![RoBind {
                host: runtime.prefix.clone(),
                sandbox: PathBuf::from(SANDBOX_RUNTIME_DIR),
            }],
        ),
        RuntimeSpec::Interpreter(_) => (
            runtime.python.clone(),
            vec![RoBind {
                host: runtime.prefix.clone(),
                sandbox: runtime.prefix.clone(),
            }],
        ),
    };
    if runtime.base_prefix != runtime.prefix {
        ro_binds.push(RoBind {
            host: runtime.base_prefix.clone(),
            sandbox: runtime.base_prefix.clone(),
        });
    }
    // `/usr` is in every sandbox already.
    ro_binds.retain(|b| !(b.host.starts_with("/usr") && b.sandbox == b.host));
    let mut spec = JobSpec::new(program, dir.0.root(), settings.limits.clone());
    spec.ro_binds = ro_binds;
    spec.args = vec![
        "-I".into(),
        "-B".into(),
        Path::new(SANDBOX_WORK_DIR).join("in/runner.py").into(),
        SANDBOX_WORK_DIR.into(),
    ];
    spec.env = vec![
        ("PATH".to_owned(), "/usr/bin:/bin".to_owned()),
        ("HOME".to_owned(), "/tmp".to_owned()),
        ("LANG".to_owned(), "C.UTF-8".to_owned()),
        ("MPLCONFIGDIR".to_owned(), "/tmp/matplotlib".to_owned()),
        ("MPLBACKEND".to_owned(), "Agg".to_owned()),
        ("PYTHONDONTWRITEBYTECODE".to_owned(), "1".to_owned()),
        ("OPENBLAS_NUM_THREADS".to_owned(), "1".to_owned()),
    ];
    spec.cgroups = settings.cgroups;
    let started = jail::start(&spec, Some(theirs))?;
    let socket = UnixStream::from(ours);
    match wait_ready(&socket) {
        Ok(()) => Ok(Warm {
            started,
            socket,
            dir,
        }),
        Err(e) => {
            // It died importing (or hangs): kill it and say what it printed.
            let outcome = started.wait(Duration::ZERO, &|| true)?;
            let stderr = String::from_utf8_lossy(&outcome.stderr.bytes);
            let tail: String = stderr
                .chars()
                .rev()
                .take(1500)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            Err(SandboxError::NotReady {
                reason: e.to_string(),
                stderr: tail,
            })
        }
    }
}

/// Waits for the runner's `ready` (its imports are done).
fn wait_ready(socket: &UnixStream) -> std::io::Result<()> {
    socket.set_read_timeout(Some(READY_TIMEOUT))?;
    let mut buf = [0u8; 5];
    let mut reader = socket;
    reader.read_exact(&mut buf)?;
    if &buf != b"ready" {
        return Err(std::io::Error::other(
            "the runner said something other than `ready`",
        ));
    }
    socket.set_read_timeout(None)
}

/// The job runs as the jail uid: it may read the job directory (group `nogroup`, nobody
/// else) and write `out/`.
fn give_to_jail(root: &Path) -> Result<(), SandboxError> {
    use std::os::unix::fs::PermissionsExt;
    std::os::unix::fs::chown(root, None, Some(JAIL_GID)).map_err(io_error("chown", root))?;
    fs::set_permissions(root, fs::Permissions::from_mode(0o750))
        .map_err(io_error("chmod", root))?;
    let out = root.join("out");
    for dir in [out.clone(), out.join("outputs"), out.join("files")] {
        std::os::unix::fs::chown(&dir, Some(JAIL_UID), Some(JAIL_GID))
            .map_err(io_error("chown", &dir))?;
    }
    Ok(())
}

fn send_go(socket: &UnixStream, fds: &[BorrowedFd<'_>]) -> std::io::Result<()> {
    let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(std::io::Error::other(
            "too many descriptors for one message",
        ));
    }
    sendmsg(
        socket,
        &[IoSlice::new(b"go")],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    Ok(())
}
