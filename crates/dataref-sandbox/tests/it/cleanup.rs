//! Bounds on the machine as a whole: jobs wait in line for a free sandbox, and what dead
//! servers left (job cgroups, job directories) is removed without touching a live one's.

#![expect(
    clippy::disallowed_methods,
    reason = "the tests plant cgroups and job directories the way a dead server leaves them"
)]

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use dataref_sandbox::jail;
use dataref_sandbox::pool::{self, PythonSandbox, SandboxError, SandboxSettings};

use crate::pool::{job, settings};

/// Every cgroup directory this process runs in (v2: one; v1: one per limited controller).
fn cgroup_parents() -> Vec<PathBuf> {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let mut parents = Vec::new();
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, names, path) = (parts.next(), parts.next().unwrap(), parts.next().unwrap());
        let rel = path.trim_start_matches('/');
        if names.is_empty() && Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            parents.push(Path::new("/sys/fs/cgroup").join(rel));
        }
        for controller in ["memory", "pids", "cpu"] {
            if names.split(',').any(|n| n == controller) {
                parents.push(Path::new("/sys/fs/cgroup").join(controller).join(rel));
            }
        }
    }
    parents
}

/// The pid of a process that has exited (and been reaped), and so owns nothing.
fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("/bin/true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

/// This process's start time, as the sandbox names its owner.
fn own_start() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let rest = stat.rsplit_once(')').unwrap().1;
    rest.split_whitespace().nth(19).unwrap().parse().unwrap()
}

#[test]
fn the_sweep_removes_a_dead_servers_cgroups_and_job_dirs_only() {
    let parents = cgroup_parents();
    // As the jail's tests: run as root with a writable cgroup v2 hierarchy (what
    // `scripts/test` runs on); without one this test has nothing to test and says so.
    let Some(parent) = parents
        .iter()
        .find(|p| std::fs::create_dir(p.join("dataref-probe")).is_ok())
    else {
        panic!(
            "no writable cgroup among {parents:?}: run the tests as root on a machine with \
             cgroup v2 mounted read-write at /sys/fs/cgroup"
        );
    };
    std::fs::remove_dir(parent.join("dataref-probe")).unwrap();
    let dead = dead_pid();
    let me = std::process::id();
    let names = [
        // A server killed with `kill -9`: pid and start time.
        (format!("dataref-job-{dead}.12345-0"), false),
        // A reused pid: this process's pid with another start time is not this process.
        (format!("dataref-job-{me}.{}-7", own_start() + 1), false),
        // The older naming, pid only, of a dead process.
        (format!("dataref-job-{dead}-3"), false),
        // A live server's (this process's).
        (format!("dataref-job-{me}.{}-9999", own_start()), true),
        // Not ours at all.
        ("someone-elses".to_owned(), true),
    ];
    for (name, _) in &names {
        std::fs::create_dir(parent.join(name)).unwrap();
    }
    jail::sweep_stale_cgroups();
    for (name, kept) in &names {
        assert_eq!(parent.join(name).exists(), *kept, "{name}");
    }
    for (name, kept) in &names {
        if *kept {
            std::fs::remove_dir(parent.join(name)).unwrap();
        }
    }

    let home = tempfile::tempdir().unwrap();
    let jobs = home.path().join("jobs");
    let dirs = [
        (format!("{dead}.12345-0"), false),
        (format!("{dead}-1"), false),
        (format!("{me}.{}-2", own_start()), true),
        (format!("{me}.{}-3", own_start() + 1), false),
    ];
    for (name, _) in &dirs {
        std::fs::create_dir_all(jobs.join(name).join("out")).unwrap();
    }
    assert_eq!(pool::remove_stale_job_dirs(home.path()), 3);
    for (name, kept) in &dirs {
        assert_eq!(jobs.join(name).exists(), *kept, "{name}");
    }
}

fn one_at_a_time() -> PythonSandbox {
    PythonSandbox::new(SandboxSettings {
        max_concurrent: 1,
        ..settings(0)
    })
}

/// The job's own clock at its start and end, as `result`.
const TIMED: &str = "import time\nt0 = time.time()\ntime.sleep(SECS)\nresult = [t0, time.time()]";

fn span(ran: &pool::PythonRun) -> (f64, f64) {
    let result = crate::pool::finished(ran);
    let v = result.result.as_array().unwrap();
    (v[0].as_f64().unwrap(), v[1].as_f64().unwrap())
}

#[test]
fn a_job_over_the_limit_waits_in_line_and_hears_why() {
    let sandbox = one_at_a_time();
    sandbox.runtime(&|_| {}).unwrap();
    let heard = Mutex::new(Vec::<String>::new());
    std::thread::scope(|s| {
        let first = s.spawn(|| {
            sandbox
                .run(job(&TIMED.replace("SECS", "2")), &|_| {}, &|| false)
                .unwrap()
        });
        while sandbox.running() == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        let second = sandbox
            .run(
                job(&TIMED.replace("SECS", "0")),
                &|step| heard.lock().unwrap().push(step.to_owned()),
                &|| false,
            )
            .unwrap();
        let first = first.join().unwrap();
        // The second started only after the first had ended.
        assert!(
            span(&second).0 >= span(&first).1,
            "{:?} {:?}",
            span(&first),
            span(&second)
        );
    });
    let heard = heard.into_inner().unwrap();
    assert!(
        heard
            .iter()
            .any(|h| h == "waiting for a free sandbox (1 of 1 running, 0 ahead)"),
        "{heard:?}"
    );
}

#[test]
fn a_call_cancelled_while_it_waits_runs_nothing() {
    let sandbox = one_at_a_time();
    sandbox.runtime(&|_| {}).unwrap();
    std::thread::scope(|s| {
        let first = s.spawn(|| {
            sandbox
                .run(job(&TIMED.replace("SECS", "2")), &|_| {}, &|| false)
                .unwrap()
        });
        while sandbox.running() == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        let waiting = Mutex::new(false);
        let err = sandbox
            .run(
                job("open('/job/out/files/ran.txt', 'w').write('ran')"),
                &|_| *waiting.lock().unwrap() = true,
                &|| *waiting.lock().unwrap(),
            )
            .unwrap_err();
        assert!(matches!(err, SandboxError::Cancelled), "{err:?}");
        crate::pool::finished(&first.join().unwrap());
    });
    assert_eq!(sandbox.running(), 0);
}

#[test]
fn shutdown_stops_waiting_and_new_calls() {
    let sandbox = one_at_a_time();
    sandbox.runtime(&|_| {}).unwrap();
    sandbox.shutdown(Duration::from_secs(10));
    let err = sandbox
        .run(job("result = 1"), &|_| {}, &|| false)
        .unwrap_err();
    assert!(matches!(err, SandboxError::ShutDown), "{err:?}");
}
