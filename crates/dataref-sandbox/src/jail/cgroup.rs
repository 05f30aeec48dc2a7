//! One cgroup per job: memory (no swap), pids and CPU limits, the OOM verdict, and the
//! sweep that kills whatever the job left behind.
//!
//! Job cgroups are created beneath the cgroup dataref itself runs in (read from
//! `/proc/self/cgroup`), so a container's own limits still bound every job.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

use super::{JailError, JobLimits};

const ROOT: &str = "/sys/fs/cgroup";
const V1_CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];
const CPU_PERIOD_US: u64 = 100_000;
/// Job cgroups are `dataref-job-<owner>-<n>` (see [`super::owner`]).
const PREFIX: &str = "dataref-job-";

/// Which cgroup hierarchy the host mounts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    /// Separate hierarchies per controller (`/sys/fs/cgroup/memory`, …).
    V1,
    /// The unified hierarchy (`/sys/fs/cgroup/cgroup.controllers` exists).
    V2,
}

/// What the host offers, as found by `detect`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupSupport {
    pub version: Option<CgroupVersion>,
    /// Controllers we could create a job cgroup for and write a limit to.
    pub memory: bool,
    pub pids: bool,
    pub cpu: bool,
    /// Swap is capped too (v1 `memory.memsw.*`, v2 `memory.swap.max`).
    pub no_swap: bool,
}

impl CgroupSupport {
    /// Every limit [`JobLimits`] asks for can be enforced by cgroups.
    pub fn complete(&self) -> bool {
        self.memory && self.pids && self.cpu
    }
}

pub(crate) fn version() -> Option<CgroupVersion> {
    if Path::new(ROOT).join("cgroup.controllers").is_file() {
        Some(CgroupVersion::V2)
    } else if Path::new(ROOT).join("memory").is_dir() || Path::new(ROOT).join("pids").is_dir() {
        Some(CgroupVersion::V1)
    } else {
        None
    }
}

/// Finds out what works by creating (and removing) a throw-away job cgroup.
pub fn detect() -> CgroupSupport {
    let version = version();
    let mut support = CgroupSupport {
        version,
        memory: false,
        pids: false,
        cpu: false,
        no_swap: false,
    };
    if version.is_none() {
        return support;
    }
    let probe_limits = JobLimits::default();
    if let Ok(cg) = JobCgroup::create(&probe_limits) {
        support.memory = cg.memory.is_some();
        support.pids = cg.pids.is_some();
        support.cpu = cg.cpu.is_some();
        support.no_swap = cg.no_swap;
    }
    support
}

/// A job's cgroup(s). Dropping it kills every process still inside and removes the
/// directories.
#[derive(Debug)]
pub(crate) struct JobCgroup {
    version: CgroupVersion,
    /// v1: one directory per controller; v2: all three point at the same directory.
    memory: Option<PathBuf>,
    pids: Option<PathBuf>,
    cpu: Option<PathBuf>,
    no_swap: bool,
    /// Every directory we created, removed on drop.
    created: Vec<PathBuf>,
}

static NEXT_JOB: AtomicU64 = AtomicU64::new(0);

impl JobCgroup {
    /// Creates the job's cgroup and writes the limits. Controllers that cannot be used are
    /// left `None`; the caller decides whether that is acceptable.
    pub(crate) fn create(limits: &JobLimits) -> Result<Self, JailError> {
        let name = format!(
            "{PREFIX}{}-{}",
            super::owner::tag(),
            NEXT_JOB.fetch_add(1, Ordering::Relaxed)
        );
        let version = version().ok_or_else(|| JailError::Cgroup {
            reason: "no cgroup file system under `/sys/fs/cgroup`".to_owned(),
        })?;
        let mut cg = JobCgroup {
            version,
            memory: None,
            pids: None,
            cpu: None,
            no_swap: false,
            created: Vec::new(),
        };
        match version {
            CgroupVersion::V1 => cg.create_v1(&name, limits),
            CgroupVersion::V2 => cg.create_v2(&name, limits)?,
        }
        Ok(cg)
    }

    fn create_v1(&mut self, name: &str, limits: &JobLimits) {
        let own = own_cgroups();
        for controller in V1_CONTROLLERS {
            let Some(rel) = own.iter().find_map(|(names, path)| {
                names
                    .split(',')
                    .any(|n| n == controller)
                    .then_some(path.as_str())
            }) else {
                continue;
            };
            let dir = Path::new(ROOT)
                .join(controller)
                .join(rel.trim_start_matches('/'))
                .join(name);
            if std::fs::create_dir(&dir).is_err() {
                continue;
            }
            self.created.push(dir.clone());
            let ok = match controller {
                "memory" => {
                    let mem = write(&dir, "memory.limit_in_bytes", limits.memory_bytes);
                    // memsw is absent when the kernel runs without swap accounting; with no
                    // swap limit a job could page out instead of hitting its limit, so we
                    // also ask for swappiness 0.
                    self.no_swap =
                        write(&dir, "memory.memsw.limit_in_bytes", limits.memory_bytes).is_ok();
                    if !self.no_swap {
                        let _ = write(&dir, "memory.swappiness", 0);
                    }
                    mem.is_ok()
                }
                "pids" => write(&dir, "pids.max", limits.pids).is_ok(),
                "cpu" => match limits.cpu.quota_us(CPU_PERIOD_US) {
                    Some(quota) => {
                        write(&dir, "cpu.cfs_period_us", CPU_PERIOD_US).is_ok()
                            && write(&dir, "cpu.cfs_quota_us", quota).is_ok()
                    }
                    None => true,
                },
                _ => false,
            };
            if ok {
                match controller {
                    "memory" => self.memory = Some(dir),
                    "pids" => self.pids = Some(dir),
                    _ => self.cpu = Some(dir),
                }
            }
        }
    }

    fn create_v2(&mut self, name: &str, limits: &JobLimits) -> Result<(), JailError> {
        let rel = own_cgroups()
            .into_iter()
            .find_map(|(names, path)| names.is_empty().then_some(path))
            .ok_or_else(|| JailError::Cgroup {
                reason: "no unified (`0::`) entry in `/proc/self/cgroup`".to_owned(),
            })?;
        let parent = Path::new(ROOT).join(rel.trim_start_matches('/'));
        // Controllers must be enabled in the parent's subtree; this fails (EBUSY) when
        // dataref shares a non-root cgroup with other processes, i.e. it was not given a
        // delegated subtree. Then the limits below fail too and we report them unusable.
        let _ = std::fs::write(parent.join("cgroup.subtree_control"), "+memory +pids +cpu");
        let dir = parent.join(name);
        std::fs::create_dir(&dir).map_err(|e| JailError::Cgroup {
            reason: format!("cannot create `{}`: {e}", dir.display()),
        })?;
        self.created.push(dir.clone());
        if write(&dir, "memory.max", limits.memory_bytes).is_ok() {
            self.memory = Some(dir.clone());
            self.no_swap = write(&dir, "memory.swap.max", 0).is_ok();
        }
        if write(&dir, "pids.max", limits.pids).is_ok() {
            self.pids = Some(dir.clone());
        }
        let cpu_ok = match limits.cpu.quota_us(CPU_PERIOD_US) {
            Some(quota) => {
                std::fs::write(dir.join("cpu.max"), format!("{quota} {CPU_PERIOD_US}")).is_ok()
            }
            None => dir.join("cpu.max").is_file(),
        };
        if cpu_ok {
            self.cpu = Some(dir);
        }
        Ok(())
    }

    pub(crate) fn memory_limited(&self) -> bool {
        self.memory.is_some()
    }

    pub(crate) fn pids_limited(&self) -> bool {
        self.pids.is_some()
    }

    pub(crate) fn cpu_limited(&self) -> bool {
        self.cpu.is_some()
    }

    /// The directories a process must be written into.
    fn dirs(&self) -> Vec<&Path> {
        let mut dirs: Vec<&Path> = Vec::new();
        for dir in [&self.memory, &self.pids, &self.cpu].into_iter().flatten() {
            if !dirs.contains(&dir.as_path()) {
                dirs.push(dir);
            }
        }
        dirs
    }

    /// Moves a process (all its threads) into the job's cgroups.
    pub(crate) fn add(&self, pid: u32) -> Result<(), JailError> {
        for dir in self.dirs() {
            std::fs::write(dir.join("cgroup.procs"), pid.to_string()).map_err(|e| {
                JailError::Cgroup {
                    reason: format!("cannot move pid {pid} into `{}`: {e}", dir.display()),
                }
            })?;
        }
        Ok(())
    }

    /// Every pid in any of the job's cgroups.
    pub(crate) fn pids(&self) -> Vec<u32> {
        let mut pids = Vec::new();
        for dir in self.dirs() {
            if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                for pid in text.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
                    if !pids.contains(&pid) {
                        pids.push(pid);
                    }
                }
            }
        }
        pids
    }

    /// The kernel's OOM killer acted inside the job.
    pub(crate) fn oom_killed(&self) -> bool {
        let Some(dir) = &self.memory else {
            return false;
        };
        let (file, key) = match self.version {
            CgroupVersion::V1 => ("memory.oom_control", "oom_kill"),
            CgroupVersion::V2 => ("memory.events", "oom_kill"),
        };
        std::fs::read_to_string(dir.join(file))
            .ok()
            .and_then(|text| {
                text.lines().find_map(|line| {
                    let (k, v) = line.split_once(' ')?;
                    (k == key).then(|| v.trim().parse::<u64>().ok()).flatten()
                })
            })
            .is_some_and(|n| n > 0)
    }

    /// SIGKILLs every process in the job's cgroups until none is left, and returns the
    /// pids still there after `patience` (empty on success).
    pub(crate) fn kill_all(&self, patience: Duration) -> Vec<u32> {
        let deadline = Instant::now() + patience;
        if self.version == CgroupVersion::V2 {
            for dir in self.dirs() {
                let _ = std::fs::write(dir.join("cgroup.kill"), "1");
            }
        }
        loop {
            let pids = self.pids();
            if pids.is_empty() || Instant::now() >= deadline {
                return pids;
            }
            for pid in &pids {
                if let Some(pid) = i32::try_from(*pid).ok().and_then(Pid::from_raw) {
                    let _ = kill_process(pid, Signal::KILL);
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for JobCgroup {
    fn drop(&mut self) {
        let left = self.kill_all(Duration::from_secs(2));
        if !left.is_empty() {
            tracing::error!(pids = ?left, "job processes survived SIGKILL; cgroup left in place");
        }
        for dir in self.created.iter().rev() {
            // A cgroup whose last process just died may still be busy for a moment.
            for _ in 0..50 {
                match std::fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        }
    }
}

/// Removes the job cgroups of dataref processes that are gone (killed with `kill -9`, or
/// exited before they could clean up), beneath the cgroup(s) this process runs in; a live
/// process's are never touched. Processes still inside a dead owner's cgroup are jobs
/// nobody waits for: they are killed by pid (only those this pid namespace can see).
/// Returns how many cgroups were removed.
pub fn sweep_stale() -> usize {
    let parents: Vec<PathBuf> = match version() {
        None => Vec::new(),
        Some(CgroupVersion::V2) => own_cgroups()
            .into_iter()
            .filter(|(names, _)| names.is_empty())
            .map(|(_, rel)| Path::new(ROOT).join(rel.trim_start_matches('/')))
            .collect(),
        Some(CgroupVersion::V1) => {
            let own = own_cgroups();
            V1_CONTROLLERS
                .iter()
                .filter_map(|controller| {
                    own.iter().find_map(|(names, rel)| {
                        names.split(',').any(|n| n == *controller).then(|| {
                            Path::new(ROOT)
                                .join(controller)
                                .join(rel.trim_start_matches('/'))
                        })
                    })
                })
                .collect()
        }
    };
    let mut removed = 0;
    for parent in parents {
        let Ok(entries) = std::fs::read_dir(&parent) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(owner) = name
                .to_str()
                .and_then(|n| n.strip_prefix(PREFIX))
                .and_then(|rest| rest.split_once('-'))
                .and_then(|(owner, _)| super::owner::parse(owner))
            else {
                continue;
            };
            if super::owner::alive(owner.0, owner.1) {
                continue;
            }
            if remove_dead(&entry.path()) {
                removed += 1;
            } else {
                tracing::warn!(cgroup = %entry.path().display(), "could not remove the cgroup of a dead dataref process");
            }
        }
    }
    removed
}

/// Kills what is left in a dead owner's job cgroup and removes it.
fn remove_dead(dir: &Path) -> bool {
    for _ in 0..50 {
        let pids: Vec<u32> = std::fs::read_to_string(dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        for pid in &pids {
            if let Some(pid) = i32::try_from(*pid).ok().and_then(Pid::from_raw) {
                let _ = kill_process(pid, Signal::KILL);
            }
        }
        match std::fs::remove_dir(dir) {
            Ok(()) => return true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return true,
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    false
}

/// `(controllers, path)` pairs from `/proc/self/cgroup`; the v2 entry has no controllers.
fn own_cgroups() -> Vec<(String, String)> {
    std::fs::read_to_string("/proc/self/cgroup")
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let _id = parts.next()?;
            let names = parts.next()?.to_owned();
            let path = parts.next()?.to_owned();
            Some((names, path))
        })
        .collect()
}

fn write(dir: &Path, file: &str, value: impl std::fmt::Display) -> std::io::Result<()> {
    std::fs::write(dir.join(file), value.to_string())
}
