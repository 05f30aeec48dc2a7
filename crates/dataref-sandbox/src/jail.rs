//! Isolation for one job: bubblewrap namespaces and file-system view, a seccomp deny-list,
//! cgroup limits (rlimits where cgroups are unusable), an unprivileged uid when dataref runs
//! as root. Fail closed: when a layer that must be there is missing, [`run`] refuses with an
//! error naming it, and never runs the program bare.
//!
//! Inside the sandbox the job sees:
//!
//! | path | what |
//! |---|---|
//! | `/usr` (+ `/bin`, `/lib`, … as on the host) | read-only |
//! | each [`JobSpec::ro_binds`] entry | read-only, at its sandbox path |
//! | `/job` | [`JobSpec::work_dir`], read-only |
//! | `/job/out` | a tmpfs of [`JobLimits::out_bytes`], writable, with `outputs/` and `files/`; each file also capped by `RLIMIT_FSIZE` |
//! | `/tmp`, `/dev/shm` | empty size-capped tmpfs |
//! | `/proc`, `/dev` | the sandbox's own processes; a minimal `/dev` |
//!
//! No `/etc`, `/home`, `/root`, `/sys`, no network (a new network namespace has only a
//! down loopback, and the filter refuses every socket family but `AF_UNIX`).
//!
//! `out/` is a size-capped tmpfs, so the cap holds while the job runs: a write past it fails
//! with `ENOSPC` inside the sandbox, whatever the number of files or the wall clock, and the
//! host's disk never sees a byte of it. Its pages are memory, charged to the job's memory
//! cgroup like any other (so `memory_bytes` must leave room for `out_bytes`). The host
//! opens the mounted tmpfs (through `/proc/<pid>/root/job/out`) after bubblewrap has set it
//! up and before the job runs, and keeps that descriptor: the file system lives on after the
//! sandbox is gone, so what the job wrote is read afterwards, with no process of the job
//! left ([`JobOutcome::out`]). A job that filled it ends as [`JobStatus::OutLimit`].
//!
//! ```no_run
//! # use dataref_sandbox::jail::{self, JobSpec, JobLimits};
//! let spec = JobSpec::new("/usr/bin/true", "/srv/dataref/jobs/1", JobLimits::default());
//! let outcome = jail::run(&spec, &|| false)?;
//! # Ok::<(), jail::JailError>(())
//! ```

mod capture;
mod cgroup;
pub(crate) mod owner;
mod seccomp;

use std::ffi::OsString;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Component, Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::time::{Duration, Instant};

use rustix::io::{FdFlags, fcntl_setfd};
use rustix::pipe::{PipeFlags, pipe_with};

pub use capture::Captured;
pub use cgroup::{CgroupSupport, CgroupVersion, sweep_stale as sweep_stale_cgroups};
pub use seccomp::denied_syscalls;

use capture::Capture;
use cgroup::JobCgroup;

/// The uid and gid jobs run as when dataref itself runs as root (`nobody`/`nogroup`).
pub const JAIL_UID: u32 = 65534;
pub const JAIL_GID: u32 = 65534;

/// Where the work dir appears inside the sandbox.
pub const SANDBOX_WORK_DIR: &str = "/job";

const BWRAP_CANDIDATES: &[&str] = &["/usr/bin/bwrap", "/usr/local/bin/bwrap", "/bin/bwrap"];
const PRLIMIT_CANDIDATES: &[&str] = &["/usr/bin/prlimit", "/bin/prlimit"];
/// Top-level host entries that are (on merged-/usr systems) links into `/usr`.
const USR_ALIASES: &[&str] = &["bin", "sbin", "lib", "lib32", "lib64", "libx32"];
/// How long bubblewrap may take to set up the namespaces before we give up.
const SETUP_TIMEOUT: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(10);
/// Patience for output pipes to close once every job process is gone.
const DRAIN_PATIENCE: Duration = Duration::from_secs(2);
const KILL_PATIENCE: Duration = Duration::from_secs(5);

/// CPU allowance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CpuLimit {
    /// No quota beyond the host's.
    Unlimited,
    /// Share of one core, e.g. `0.5` or `2.0` (two cores).
    Cores(f64),
}

impl CpuLimit {
    /// CFS quota for `period_us`, or `None` when unlimited.
    fn quota_us(self, period_us: u64) -> Option<u64> {
        match self {
            CpuLimit::Unlimited => None,
            CpuLimit::Cores(cores) => {
                let quota = (cores.max(0.01) * period_us as f64).round();
                // The float is positive and far below u64::MAX for any sane core count.
                Some(quota.clamp(1000.0, 1e12) as u64)
            }
        }
    }
}

/// Per-job limits.
#[derive(Debug, Clone, PartialEq)]
pub struct JobLimits {
    /// Memory + swap of every process in the job (cgroup; else `RLIMIT_AS` per process).
    pub memory_bytes: u64,
    /// Processes and threads of the job (cgroup; else `RLIMIT_NPROC`, which counts every
    /// process of the jail uid on the host).
    pub pids: u64,
    pub cpu: CpuLimit,
    pub wall_clock: Duration,
    /// Captured stdout; writing more kills the job ([`JobStatus::OutputFlood`]).
    pub stdout_bytes: usize,
    pub stderr_bytes: usize,
    /// Size of the `out/` tmpfs: writes past it fail with `ENOSPC` while the job runs
    /// ([`JobStatus::OutLimit`] when the job filled it). Memory, charged to the job.
    pub out_bytes: u64,
    /// Largest file the job may write (`RLIMIT_FSIZE`; going over raises `SIGXFSZ`).
    pub file_size: u64,
    /// Size of each of the `/tmp` and `/dev/shm` tmpfs mounts.
    pub tmp_bytes: u64,
}

impl Default for JobLimits {
    fn default() -> Self {
        JobLimits {
            memory_bytes: 1 << 30,
            pids: 64,
            cpu: CpuLimit::Cores(1.0),
            wall_clock: Duration::from_secs(60),
            stdout_bytes: 64 * 1024,
            stderr_bytes: 64 * 1024,
            out_bytes: 256 << 20,
            file_size: 256 << 20,
            tmp_bytes: 64 << 20,
        }
    }
}

/// What to do when the host's cgroups cannot enforce memory, pids and CPU limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CgroupPolicy {
    /// Refuse to run ([`JailError::Unsupported`]).
    Required,
    /// Fall back to rlimits and log a warning. `RLIMIT_AS` counts address space, not memory,
    /// and `RLIMIT_NPROC` is shared by every job of the jail uid.
    #[default]
    RlimitFallback,
}

/// A host path bound read-only into the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoBind {
    pub host: PathBuf,
    pub sandbox: PathBuf,
}

/// One program to run in the jail.
#[derive(Debug, Clone)]
pub struct JobSpec {
    /// Absolute path inside the sandbox.
    pub program: PathBuf,
    pub args: Vec<OsString>,
    /// The job's whole environment; nothing is inherited.
    pub env: Vec<(String, String)>,
    pub ro_binds: Vec<RoBind>,
    /// Host directory shown at `/job` (read-only); must contain a directory `out/`, which the
    /// job may write.
    pub work_dir: PathBuf,
    pub limits: JobLimits,
    pub cgroups: CgroupPolicy,
}

impl JobSpec {
    pub fn new(
        program: impl Into<PathBuf>,
        work_dir: impl Into<PathBuf>,
        limits: JobLimits,
    ) -> Self {
        JobSpec {
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            ro_binds: Vec::new(),
            work_dir: work_dir.into(),
            limits,
            cgroups: CgroupPolicy::default(),
        }
    }
}

/// How a job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobStatus {
    Exited(i32),
    /// Killed by a signal. bubblewrap reports a signalled job as exit code `128 + n`, so an
    /// exit code above 128 is read as a signal.
    Signaled(i32),
    TimedOut,
    /// The kernel's OOM killer acted in the job's cgroup.
    MemoryLimit,
    /// stdout or stderr went over its cap; the job was killed.
    OutputFlood,
    /// The job filled `out/` up to [`JobLimits::out_bytes`] (writes past it failed with
    /// `ENOSPC`); its content must not be collected.
    OutLimit,
    Cancelled,
}

/// Which mechanism enforced each limit, so callers and `doctor` can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enforcement {
    Cgroup,
    Rlimit,
    None,
}

#[derive(Debug, Clone)]
pub struct JobOutcome {
    pub status: JobStatus,
    pub stdout: Captured,
    pub stderr: Captured,
    pub duration: Duration,
    /// Bytes in `out/` after the job (tmpfs pages in use).
    pub out_bytes: u64,
    /// The job's `out/` tmpfs, opened before the job ran (`O_DIRECTORY`); it outlives the
    /// sandbox for as long as this (or a file opened beneath it) is held. `None` only when
    /// the sandbox never got as far as mounting it.
    pub out: Option<Arc<OwnedFd>>,
    pub memory: Enforcement,
    pub pids: Enforcement,
    pub cpu: Enforcement,
}

/// A layer the jail needs and the host lacks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Missing {
    Bwrap,
    Prlimit,
    UserNamespaces { detail: String },
    Seccomp { detail: String },
    Cgroups { detail: String },
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Missing::Bwrap => write!(f, "`bwrap` (bubblewrap) is not installed"),
            Missing::Prlimit => write!(f, "`prlimit` (util-linux) is not installed"),
            Missing::UserNamespaces { detail } => {
                write!(f, "unprivileged user namespaces do not work: {detail}")
            }
            Missing::Seccomp { detail } => write!(f, "seccomp is unavailable: {detail}"),
            Missing::Cgroups { detail } => write!(f, "cgroup limits are unavailable: {detail}"),
        }
    }
}

impl Missing {
    /// What an operator can do about it.
    pub fn hint(&self) -> &'static str {
        match self {
            Missing::Bwrap => "install bubblewrap (`apt-get install bubblewrap`)",
            Missing::Prlimit => "install util-linux",
            Missing::UserNamespaces { .. } => {
                "enable unprivileged user namespaces (`sysctl kernel.unprivileged_userns_clone=1`, or `user.max_user_namespaces` > 0; in a container allow `unshare`/`clone` in its seccomp profile)"
            }
            Missing::Seccomp { .. } => {
                "run on x86_64, aarch64 or riscv64 with a seccomp-enabled kernel"
            }
            Missing::Cgroups { .. } => {
                "run dataref as root, or give it a delegated cgroup v2 subtree (systemd `Delegate=yes`)"
            }
        }
    }
}

/// What the host supports, for `dataref doctor` and for refusing with a reason.
#[derive(Debug, Clone)]
pub struct Capabilities {
    pub bwrap: Option<PathBuf>,
    pub prlimit: Option<PathBuf>,
    /// A trivial sandbox with every namespace started.
    pub user_namespaces: Result<(), String>,
    pub cgroups: CgroupSupport,
    pub seccomp: Result<(), String>,
    /// Jobs run as [`JAIL_UID`] because dataref runs as root; otherwise as dataref's uid.
    pub drops_root: bool,
}

impl Capabilities {
    /// Layers that are missing; with `cgroups` set to [`CgroupPolicy::Required`] incomplete
    /// cgroups count too.
    pub fn missing(&self, cgroups: CgroupPolicy) -> Vec<Missing> {
        let mut missing = Vec::new();
        if self.bwrap.is_none() {
            missing.push(Missing::Bwrap);
        }
        if self.prlimit.is_none() {
            missing.push(Missing::Prlimit);
        }
        if let Err(detail) = &self.user_namespaces {
            missing.push(Missing::UserNamespaces {
                detail: detail.clone(),
            });
        }
        if let Err(detail) = &self.seccomp {
            missing.push(Missing::Seccomp {
                detail: detail.clone(),
            });
        }
        match cgroups {
            CgroupPolicy::Required if !self.cgroups.complete() => {
                missing.push(Missing::Cgroups {
                    detail: format!("{:?}", self.cgroups),
                });
            }
            CgroupPolicy::Required | CgroupPolicy::RlimitFallback => {}
        }
        missing
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JailError {
    #[error("the sandbox cannot run here: {}", list(missing))]
    Unsupported { missing: Vec<Missing> },
    #[error("invalid job: {reason}")]
    InvalidSpec { reason: String },
    #[error(
        "`{}` is not reachable by uid {uid}: `{}` lacks search or read permission for it",
        path.display(),
        blocked_at.display()
    )]
    NotReachable {
        path: PathBuf,
        blocked_at: PathBuf,
        uid: u32,
    },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("seccomp: {reason}")]
    Seccomp { reason: String },
    #[error("cgroup: {reason}")]
    Cgroup { reason: String },
    /// bubblewrap failed before the job started (its stderr, cut).
    #[error("the sandbox failed to start: {stderr}")]
    Setup { stderr: String },
    /// Job processes survived SIGKILL; the host needs attention.
    #[error("job processes survived the kill: {pids:?}")]
    Escaped { pids: Vec<u32> },
}

impl JailError {
    /// What to do next, for errors an operator can fix.
    pub fn hint(&self) -> Option<String> {
        match self {
            JailError::Unsupported { missing } => Some(
                missing
                    .iter()
                    .map(Missing::hint)
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
            JailError::NotReachable { uid, .. } => Some(format!(
                "jobs run as uid {uid}: keep the runtime and job directories outside private directories such as `/root`, with search permission for others on every parent"
            )),
            JailError::InvalidSpec { .. }
            | JailError::Io { .. }
            | JailError::Seccomp { .. }
            | JailError::Cgroup { .. }
            | JailError::Setup { .. }
            | JailError::Escaped { .. } => None,
        }
    }
}

fn list(missing: &[Missing]) -> String {
    missing
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> JailError {
    let context = context.into();
    move |source| JailError::Io { context, source }
}

/// Probes the host: finds the tools, starts a trivial sandbox, tries a job cgroup.
pub fn probe() -> Capabilities {
    let bwrap = find(BWRAP_CANDIDATES);
    let prlimit = find(PRLIMIT_CANDIDATES);
    let user_namespaces = match &bwrap {
        Some(bwrap) => probe_userns(bwrap),
        None => Err("`bwrap` not found".to_owned()),
    };
    let seccomp = probe_seccomp();
    Capabilities {
        bwrap,
        prlimit,
        user_namespaces,
        cgroups: cgroup::detect(),
        seccomp,
        drops_root: rustix::process::geteuid().is_root(),
    }
}

fn find(candidates: &[&str]) -> Option<PathBuf> {
    candidates.iter().map(PathBuf::from).find(|p| p.is_file())
}

fn probe_userns(bwrap: &Path) -> Result<(), String> {
    let mut cmd = Command::new(bwrap);
    cmd.args(["--unshare-all", "--unshare-user", "--disable-userns"])
        .args(["--die-with-parent", "--cap-drop", "ALL", "--clearenv"])
        .args(usr_args().iter())
        .args(["--proc", "/proc", "--dev", "/dev", "--", "/usr/bin/true"]);
    cmd.env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    drop_root(&mut cmd);
    let out = cmd.output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

fn probe_seccomp() -> Result<(), String> {
    seccomp::compile().map_err(|e| e.to_string())?;
    let status = std::fs::read_to_string("/proc/self/status").map_err(|e| e.to_string())?;
    if status.lines().any(|l| l.starts_with("Seccomp:")) {
        Ok(())
    } else {
        Err("the kernel reports no `Seccomp:` in `/proc/self/status`".to_owned())
    }
}

/// Runs the job in the jail and waits for it; `cancel` is polled every few milliseconds.
/// Must be called on a thread that outlives the job: bubblewrap's `--die-with-parent` ties
/// the sandbox to the spawning thread.
pub fn run(spec: &JobSpec, cancel: &dyn Fn() -> bool) -> Result<JobOutcome, JailError> {
    start(spec, None)?.wait(spec.limits.wall_clock, cancel)
}

/// A job running in the jail (for the warm pool: started ahead, waiting on its `stdin` for
/// work). Dropping it kills the job.
pub struct Started {
    guard: KillOnDrop,
    cg: Option<JobCgroup>,
    status_rx: mpsc::Receiver<StatusMsg>,
    stdout: Option<Capture>,
    stderr: Option<Capture>,
    flood: Arc<AtomicBool>,
    out_dir: PathBuf,
    out: Option<Arc<OwnedFd>>,
    memory: Enforcement,
    pids: Enforcement,
    cpu: Enforcement,
}

impl std::fmt::Debug for Started {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Started")
            .field("pid", &self.guard.0.id())
            .field("out_dir", &self.out_dir)
            .finish_non_exhaustive()
    }
}

/// Starts the job in the jail and returns once its first process runs inside the job's
/// cgroup. `stdin` becomes the job's standard input (`/dev/null` when `None`): a pipe or
/// a Unix socket the caller keeps the other end of. Call it on a thread that outlives the
/// job: bubblewrap's `--die-with-parent` ties the sandbox to the spawning thread.
pub fn start(spec: &JobSpec, stdin: Option<OwnedFd>) -> Result<Started, JailError> {
    validate(spec)?;
    let bwrap = find(BWRAP_CANDIDATES).ok_or(JailError::Unsupported {
        missing: vec![Missing::Bwrap],
    })?;
    let prlimit = find(PRLIMIT_CANDIDATES).ok_or(JailError::Unsupported {
        missing: vec![Missing::Prlimit],
    })?;
    let as_root = rustix::process::geteuid().is_root();
    let out_dir = spec.work_dir.join("out");
    if as_root {
        // bubblewrap resolves every source path as the jail uid, so a path under a private
        // directory fails inside bwrap with a vaguer message; say which component blocks.
        reachable(&spec.work_dir, JAIL_UID, JAIL_GID)?;
        for bind in &spec.ro_binds {
            reachable(&bind.host, JAIL_UID, JAIL_GID)?;
        }
        std::os::unix::fs::chown(&out_dir, Some(JAIL_UID), Some(JAIL_GID)).map_err(io_err(
            format!("giving `{}` to the jail uid", out_dir.display()),
        ))?;
    }

    let limits = &spec.limits;
    let cg = match JobCgroup::create(limits) {
        Ok(cg) => Some(cg),
        Err(e) => {
            tracing::debug!(error = %e, "no job cgroup");
            None
        }
    };
    let memory = enforcement(cg.as_ref().is_some_and(JobCgroup::memory_limited));
    let pids = enforcement(cg.as_ref().is_some_and(JobCgroup::pids_limited));
    let cpu = match limits.cpu {
        CpuLimit::Unlimited => Enforcement::None,
        CpuLimit::Cores(_) if cg.as_ref().is_some_and(JobCgroup::cpu_limited) => {
            Enforcement::Cgroup
        }
        CpuLimit::Cores(_) => Enforcement::Rlimit,
    };
    let complete = memory == Enforcement::Cgroup
        && pids == Enforcement::Cgroup
        && matches!(cpu, Enforcement::Cgroup | Enforcement::None);
    if !complete {
        match spec.cgroups {
            CgroupPolicy::Required => {
                return Err(JailError::Unsupported {
                    missing: vec![Missing::Cgroups {
                        detail: format!("memory: {memory:?}, pids: {pids:?}, cpu: {cpu:?}"),
                    }],
                });
            }
            CgroupPolicy::RlimitFallback => tracing::warn!(
                ?memory,
                ?pids,
                ?cpu,
                "cgroups cannot enforce every job limit; falling back to rlimits"
            ),
        }
    }

    let seccomp_fd = seccomp::memfd()?;
    let (block_r, block_w) =
        pipe_with(PipeFlags::CLOEXEC).map_err(|e| io_err("creating the block pipe")(e.into()))?;
    let (status_r, status_w) =
        pipe_with(PipeFlags::CLOEXEC).map_err(|e| io_err("creating the status pipe")(e.into()))?;

    let mut cmd = Command::new(&prlimit);
    cmd.arg(format!("--fsize={}", limits.file_size))
        .arg("--core=0");
    if memory == Enforcement::Rlimit {
        cmd.arg(format!("--as={}", limits.memory_bytes));
    }
    if pids == Enforcement::Rlimit {
        cmd.arg(format!("--nproc={}", limits.pids));
    }
    if cpu == Enforcement::Rlimit {
        // Without a CFS quota the wall clock is the real bound; RLIMIT_CPU is a backstop.
        cmd.arg(format!("--cpu={}", limits.wall_clock.as_secs().max(1)));
    }
    cmd.arg("--").arg(&bwrap);
    cmd.args(bwrap_args(
        spec,
        seccomp_fd.as_raw_fd(),
        block_r.as_raw_fd(),
        status_w.as_raw_fd(),
    ));
    cmd.env_clear()
        .current_dir("/")
        .stdin(stdin.map_or_else(Stdio::null, Stdio::from))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // A process group of its own: the terminal's Ctrl-C (SIGINT to its foreground group,
    // which `dataref chat` is in) must not reach an idle warm sandbox. Its life is tied to
    // ours by `--die-with-parent` and `KillOnDrop`, not by the group.
    cmd.process_group(0);
    if as_root {
        drop_root(&mut cmd);
    }

    let mut guard = KillOnDrop(spawn_with_fds(&mut cmd, [seccomp_fd, block_r, status_w])?);

    let (status_tx, status_rx) = mpsc::channel();
    std::thread::spawn(move || read_status(status_r, status_tx));

    let flood = Arc::new(AtomicBool::new(false));
    let stdout = guard
        .0
        .stdout
        .take()
        .map(|p| Capture::spawn(p, limits.stdout_bytes, Arc::clone(&flood)));
    let stderr = guard
        .0
        .stderr
        .take()
        .map(|p| Capture::spawn(p, limits.stderr_bytes, Arc::clone(&flood)));

    // The sandbox is blocked on `--block-fd` before exec: put bwrap's monitor and the
    // sandbox's first process into the cgroup, then let it go. Everything the job starts
    // later is born inside. On an early return `guard` kills bwrap before `block_w` closes
    // (EOF would also release the block).
    let mut out = None;
    if let Ok(StatusMsg::ChildPid(sandbox_pid)) = status_rx.recv_timeout(SETUP_TIMEOUT) {
        if let Some(cg) = &cg {
            cg.add(guard.0.id())?;
            cg.add(sandbox_pid)?;
        }
        out = open_out_tmpfs(&mut guard, sandbox_pid, &out_dir, limits.out_bytes)?;
        let mut block = std::fs::File::from(block_w);
        // A failed write means bwrap already died; the wait sees that.
        let _ = block.write_all(b"x");
    }
    Ok(Started {
        guard,
        cg,
        status_rx,
        stdout,
        stderr,
        flood,
        out_dir,
        out: out.map(Arc::new),
        memory,
        pids,
        cpu,
    })
}

/// Opens the sandbox's `out/` tmpfs from outside, while the job is still blocked before
/// exec. Until bubblewrap has pivoted into the new root, `/proc/<pid>/root/job/out` does
/// not exist or is something else; the descriptor is taken only once it is a tmpfs of the
/// job's size on a device other than the host's `out/` directory. `None` when bubblewrap
/// died first (its wait reports why).
fn open_out_tmpfs(
    guard: &mut KillOnDrop,
    sandbox_pid: u32,
    host_out: &Path,
    out_bytes: u64,
) -> Result<Option<OwnedFd>, JailError> {
    use rustix::fs::{Mode, OFlags};
    const TMPFS_MAGIC: u64 = 0x0102_1994;
    let host_dev = std::fs::metadata(host_out)
        .map_err(io_err(format!("reading `{}`", host_out.display())))?
        .dev();
    let path = format!("/proc/{sandbox_pid}/root{SANDBOX_WORK_DIR}/out");
    let deadline = Instant::now() + SETUP_TIMEOUT;
    loop {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        if let Ok(fd) = rustix::fs::open(path.as_str(), flags, Mode::empty()) {
            let is_ours = rustix::fs::fstatfs(&fd).is_ok_and(|fs| {
                u64::try_from(fs.f_type).ok() == Some(TMPFS_MAGIC)
                    && fs.f_blocks.saturating_mul(fs.f_bsize as u64) >= out_bytes
            }) && rustix::fs::fstat(&fd).is_ok_and(|st| st.st_dev != host_dev);
            if is_ours {
                return Ok(Some(fd));
            }
        }
        if !matches!(guard.0.try_wait(), Ok(None)) {
            return Ok(None);
        }
        if Instant::now() >= deadline {
            return Err(JailError::Setup {
                stderr: format!("the sandbox's `out/` did not appear at `{path}`"),
            });
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Bytes in use on the `out/` tmpfs, and whether the job filled it (less than this much
/// room left: a writer that hit `ENOSPC` leaves at most a page).
fn out_usage(out: Option<&OwnedFd>) -> (u64, bool) {
    const FULL_BELOW: u64 = 64 << 10;
    let Some(fd) = out else { return (0, false) };
    match rustix::fs::fstatvfs(fd) {
        Ok(vfs) => {
            let used = vfs
                .f_blocks
                .saturating_sub(vfs.f_bfree)
                .saturating_mul(vfs.f_frsize);
            let free = vfs.f_bavail.saturating_mul(vfs.f_frsize);
            (used, free < FULL_BELOW)
        }
        Err(_) => (0, false),
    }
}

/// Cleanup threads (cgroup removal) still running; [`wait_for_cleanup`] waits for them.
static CLEANUPS: AtomicUsize = AtomicUsize::new(0);

/// Waits (at most `patience`) until every job cgroup dropped in the background is removed,
/// so a process about to exit leaves none behind. Returns whether all were.
pub fn wait_for_cleanup(patience: Duration) -> bool {
    let deadline = Instant::now() + patience;
    while CLEANUPS.load(Ordering::SeqCst) > 0 {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(POLL);
    }
    true
}

impl Started {
    /// Whether the job's processes are still there (a warm sandbox that died while idle
    /// is thrown away, not handed a job).
    pub fn is_running(&mut self) -> bool {
        matches!(self.guard.0.try_wait(), Ok(None)) && !self.flood.load(Ordering::SeqCst)
    }

    /// Waits for the job to end, at most `wall_clock` from now; `cancel` is polled every
    /// few milliseconds. Kills whatever is left, then reports how it ended.
    pub fn wait(
        self,
        wall_clock: Duration,
        cancel: &dyn Fn() -> bool,
    ) -> Result<JobOutcome, JailError> {
        let Started {
            mut guard,
            cg,
            status_rx,
            stdout,
            stderr,
            flood,
            out_dir: _,
            out,
            memory,
            pids,
            cpu,
        } = self;
        let started = Instant::now();
        let mut exit_code = None;
        let deadline = started + wall_clock;
        let ended = loop {
            if let Some(status) = guard.0.try_wait().map_err(io_err("waiting for bwrap"))? {
                break Ended::Exited(status);
            }
            if flood.load(Ordering::SeqCst) {
                break Ended::Killed(JobStatus::OutputFlood);
            }
            if cancel() {
                break Ended::Killed(JobStatus::Cancelled);
            }
            if Instant::now() >= deadline {
                break Ended::Killed(JobStatus::TimedOut);
            }
            std::thread::sleep(POLL);
        };
        // Killing bwrap's monitor takes the sandbox's pid 1 with it (`--die-with-parent`), and
        // with it the whole pid namespace; the cgroup sweep catches anything else.
        let _ = guard.0.kill();
        let _ = guard.0.wait();
        let duration = started.elapsed();
        if let Some(cg) = &cg {
            let left = cg.kill_all(KILL_PATIENCE);
            if !left.is_empty() {
                return Err(JailError::Escaped { pids: left });
            }
        }
        let stdout = stdout.map(|c| c.finish(DRAIN_PATIENCE)).unwrap_or_default();
        let stderr = stderr.map(|c| c.finish(DRAIN_PATIENCE)).unwrap_or_default();
        // bwrap writes the exit code just before it exits, but the thread reading the status
        // pipe may not have passed it on yet. Bounded: a write end that leaked into another
        // process would keep the pipe open.
        if matches!(ended, Ended::Exited(_)) {
            let until = Instant::now() + DRAIN_PATIENCE;
            while exit_code.is_none() {
                match status_rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
                    Ok(StatusMsg::ExitCode(code)) => exit_code = Some(code),
                    Ok(StatusMsg::ChildPid(_)) => {}
                    Err(_) => break,
                }
            }
        }
        let oom = cg.as_ref().is_some_and(JobCgroup::oom_killed);
        // Every process is gone (checked above); removing the cgroup directories can take
        // the kernel tens of milliseconds, which the caller need not wait for.
        if let Some(cg) = cg {
            CLEANUPS.fetch_add(1, Ordering::SeqCst);
            let spawned = std::thread::Builder::new()
                .name("dataref-cgroup-rmdir".to_owned())
                .spawn(move || {
                    drop(cg);
                    CLEANUPS.fetch_sub(1, Ordering::SeqCst);
                });
            if spawned.is_err() {
                // The closure (and the cgroup with it) was dropped here.
                CLEANUPS.fetch_sub(1, Ordering::SeqCst);
            }
        }

        let (out_bytes, out_full) = out_usage(out.as_deref());
        let status = match ended {
            Ended::Killed(status) => status,
            Ended::Exited(_) if oom => JobStatus::MemoryLimit,
            Ended::Exited(bwrap_status) => match exit_code {
                Some(code) if code > 128 && code < 128 + 65 => JobStatus::Signaled(code - 128),
                Some(code) => JobStatus::Exited(code),
                None => match bwrap_status.signal() {
                    Some(sig) => JobStatus::Signaled(sig),
                    // No exit code on the status fd: the sandbox never reached exec.
                    None => {
                        return Err(JailError::Setup {
                            stderr: String::from_utf8_lossy(&stderr.bytes)
                                .chars()
                                .take(2000)
                                .collect(),
                        });
                    }
                },
            },
        };
        let status = match status {
            JobStatus::Exited(_) | JobStatus::Signaled(_) if out_full => JobStatus::OutLimit,
            other => other,
        };
        Ok(JobOutcome {
            status,
            stdout,
            stderr,
            duration,
            out_bytes,
            out,
            memory,
            pids,
            cpu,
        })
    }
}

enum Ended {
    Exited(std::process::ExitStatus),
    Killed(JobStatus),
}

fn enforcement(by_cgroup: bool) -> Enforcement {
    if by_cgroup {
        Enforcement::Cgroup
    } else {
        Enforcement::Rlimit
    }
}

/// Kills bwrap if `run` returns early, so no sandbox outlives an error.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Inheritable fds are visible to every child spawned while they are inheritable, so the
/// window is serialised: jobs started concurrently never see each other's pipes. (Other
/// spawns in this process are not covered; they would inherit the fds only for that
/// instant. bwrap does not close inherited fds, so nothing else may be inheritable: see
/// [`cloexec_all`].)
static SPAWN_LOCK: Mutex<()> = Mutex::new(());

/// Marks every descriptor above stderr close-on-exec. Descriptors dataref opens are
/// close-on-exec already; this catches those the process inherited from whoever started it
/// (a host, a shell, a test harness), which bubblewrap would otherwise carry into the
/// sandbox — a directory among them reaches past the mount namespace.
fn cloexec_all() -> Result<(), JailError> {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    #[expect(
        unsafe_code,
        reason = "close_range with CLOSE_RANGE_CLOEXEC only sets a flag on descriptors; it closes nothing and touches no memory"
    )]
    // SAFETY: no pointers are passed; the call cannot invalidate any descriptor.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        )
    };
    if rc != 0 {
        return Err(io_err("marking inherited descriptors close-on-exec")(
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

fn spawn_with_fds<const N: usize>(
    cmd: &mut Command,
    fds: [OwnedFd; N],
) -> Result<Child, JailError> {
    let _lock = SPAWN_LOCK.lock().unwrap_or_else(PoisonError::into_inner);
    cloexec_all()?;
    for fd in &fds {
        fcntl_setfd(fd, FdFlags::empty())
            .map_err(|e| io_err("making an fd inheritable")(e.into()))?;
    }
    let child = cmd.spawn().map_err(io_err("starting bwrap"));
    // Our copies close here, so the pipes see EOF when bwrap closes its own.
    drop(fds);
    child
}

enum StatusMsg {
    ChildPid(u32),
    ExitCode(i32),
}

/// bwrap writes one JSON object per line to `--json-status-fd`: first the sandbox's pid
/// (as seen from here), then, once the job's first process exits, its exit code.
fn read_status(fd: OwnedFd, tx: mpsc::Sender<StatusMsg>) {
    let file = std::fs::File::from(fd);
    let stream = serde_json::Deserializer::from_reader(file).into_iter::<serde_json::Value>();
    for value in stream {
        let Ok(value) = value else { return };
        let msg = if let Some(pid) = value.get("child-pid").and_then(serde_json::Value::as_u64) {
            u32::try_from(pid).ok().map(StatusMsg::ChildPid)
        } else if let Some(code) = value.get("exit-code").and_then(serde_json::Value::as_i64) {
            i32::try_from(code).ok().map(StatusMsg::ExitCode)
        } else {
            None
        };
        if let Some(msg) = msg
            && tx.send(msg).is_err()
        {
            return;
        }
    }
}

fn drop_root(cmd: &mut Command) {
    if rustix::process::geteuid().is_root() {
        // std calls setgroups(0) before setgid/setuid when root changes uid, so no
        // supplementary group of root's survives.
        cmd.uid(JAIL_UID).gid(JAIL_GID);
    }
}

/// `/usr` and the host's top-level aliases into it.
fn usr_args() -> Vec<OsString> {
    let mut args: Vec<OsString> = vec!["--ro-bind".into(), "/usr".into(), "/usr".into()];
    for name in USR_ALIASES {
        let host = Path::new("/").join(name);
        match std::fs::read_link(&host) {
            Ok(target) => {
                args.push("--symlink".into());
                args.push(target.into());
                args.push(host.into());
            }
            Err(_) if host.is_dir() => {
                args.push("--ro-bind".into());
                args.push(host.clone().into());
                args.push(host.into());
            }
            Err(_) => {}
        }
    }
    args
}

fn bwrap_args(spec: &JobSpec, seccomp_fd: i32, block_fd: i32, status_fd: i32) -> Vec<OsString> {
    let limits = &spec.limits;
    let mut a: Vec<OsString> = Vec::new();
    let mut push = |items: &[&str]| a.extend(items.iter().map(OsString::from));
    push(&["--unshare-all", "--unshare-user", "--disable-userns"]);
    push(&["--die-with-parent", "--new-session", "--cap-drop", "ALL"]);
    push(&["--clearenv"]);
    let tmp = limits.tmp_bytes.to_string();
    push(&["--proc", "/proc", "--dev", "/dev"]);
    push(&["--perms", "1777", "--size", &tmp, "--tmpfs", "/tmp"]);
    push(&["--perms", "1777", "--size", &tmp, "--tmpfs", "/dev/shm"]);
    let fds = [
        ("--seccomp", seccomp_fd),
        ("--block-fd", block_fd),
        ("--json-status-fd", status_fd),
    ];
    for (flag, fd) in fds {
        push(&[flag, &fd.to_string()]);
    }
    a.extend(usr_args());
    for (key, value) in &spec.env {
        a.extend(["--setenv".into(), key.into(), value.into()]);
    }
    for bind in &spec.ro_binds {
        a.extend([
            "--ro-bind".into(),
            bind.host.clone().into(),
            bind.sandbox.clone().into(),
        ]);
    }
    let out = Path::new(SANDBOX_WORK_DIR).join("out");
    a.extend([
        "--ro-bind".into(),
        spec.work_dir.clone().into(),
        SANDBOX_WORK_DIR.into(),
        // `work_dir/out` on the host is only the mount point.
        "--size".into(),
        limits.out_bytes.max(4096).to_string().into(),
        "--tmpfs".into(),
        out.clone().into(),
        "--dir".into(),
        out.join("outputs").into(),
        "--dir".into(),
        out.join("files").into(),
        "--remount-ro".into(),
        "/".into(),
        "--chdir".into(),
        SANDBOX_WORK_DIR.into(),
        "--".into(),
        spec.program.clone().into(),
    ]);
    a.extend(spec.args.iter().cloned());
    a
}

fn validate(spec: &JobSpec) -> Result<(), JailError> {
    let bad = |reason: String| Err(JailError::InvalidSpec { reason });
    if !clean_absolute(&spec.program) {
        return bad(format!(
            "program `{}` must be an absolute path without `..`",
            spec.program.display()
        ));
    }
    if !clean_absolute(&spec.work_dir) {
        return bad(format!(
            "work dir `{}` must be an absolute path without `..`",
            spec.work_dir.display()
        ));
    }
    if !spec.work_dir.join("out").is_dir() {
        return bad(format!(
            "work dir `{}` has no `out/` directory",
            spec.work_dir.display()
        ));
    }
    for bind in &spec.ro_binds {
        if !clean_absolute(&bind.host) || !clean_absolute(&bind.sandbox) {
            return bad(format!(
                "bind `{}` -> `{}` needs absolute paths without `..`",
                bind.host.display(),
                bind.sandbox.display()
            ));
        }
        let reserved = ["/", "/proc", "/dev", "/tmp", SANDBOX_WORK_DIR];
        if reserved
            .iter()
            .any(|r| bind.sandbox == Path::new(r) || (*r != "/" && bind.sandbox.starts_with(r)))
        {
            return bad(format!(
                "bind target `{}` overlaps a path the jail owns",
                bind.sandbox.display()
            ));
        }
    }
    for (key, value) in &spec.env {
        if key.is_empty() || key.contains('=') || key.contains('\0') || value.contains('\0') {
            return bad(format!("environment variable `{key}` is not a valid name"));
        }
    }
    if spec.limits.pids == 0 || spec.limits.memory_bytes == 0 {
        return bad("memory and pids limits must be positive".to_owned());
    }
    Ok(())
}

fn clean_absolute(path: &Path) -> bool {
    path.is_absolute()
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
}

/// Whether jobs can read `path` (always, unless dataref runs as root and jobs run as
/// [`JAIL_UID`]).
pub fn jail_can_read(path: &Path) -> bool {
    !rustix::process::geteuid().is_root() || reachable(path, JAIL_UID, JAIL_GID).is_ok()
}

/// Checks that `uid`/`gid` (with no supplementary groups) can search every directory on the
/// way to `path` and read `path` itself, from the mode bits. ACLs are not consulted, so an
/// ACL-only grant is reported as a block.
fn reachable(path: &Path, uid: u32, gid: u32) -> Result<(), JailError> {
    let blocked = |at: &Path| JailError::NotReachable {
        path: path.to_owned(),
        blocked_at: at.to_owned(),
        uid,
    };
    let mut current = PathBuf::from("/");
    let components: Vec<_> = path.components().collect();
    for (i, component) in components.iter().enumerate() {
        if let Component::Normal(name) = component {
            current.push(name);
        }
        let meta = std::fs::metadata(&current)
            .map_err(io_err(format!("reading `{}`", current.display())))?;
        let mode = meta.mode();
        let class = if meta.uid() == uid {
            (mode >> 6) & 0o7
        } else if meta.gid() == gid {
            (mode >> 3) & 0o7
        } else {
            mode & 0o7
        };
        let last = i + 1 == components.len();
        let need = if !last {
            0o1
        } else if meta.is_dir() {
            0o5
        } else {
            0o4
        };
        if class & need != need {
            return Err(blocked(&current));
        }
    }
    Ok(())
}
