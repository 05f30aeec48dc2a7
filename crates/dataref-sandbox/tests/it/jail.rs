//! The jail against the real bubblewrap, cgroups and kernel. These tests expect to run as
//! root (as CI does), so the job runs as the unprivileged jail uid.

#![expect(
    clippy::disallowed_methods,
    reason = "the tests lay out job directories the way the sandbox crate does, with raw std::fs"
)]

use std::ffi::OsString;
use std::io::ErrorKind;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use dataref_sandbox::jail::{
    self, CpuLimit, Enforcement, JAIL_UID, JailError, JobLimits, JobOutcome, JobSpec, JobStatus,
    RoBind,
};

const SH: &str = "/bin/sh";
const PYTHON: &str = "/usr/bin/python3";

/// A work dir as the runtime lays it out, inside a private parent that also holds a secret.
struct Job {
    _root: tempfile::TempDir,
    work: PathBuf,
    secret: PathBuf,
}

fn job() -> Job {
    let root = tempfile::tempdir().unwrap();
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let work = root.path().join("work");
    std::fs::create_dir_all(work.join("in")).unwrap();
    std::fs::create_dir_all(work.join("out")).unwrap();
    for dir in [&work, &work.join("in")] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::write(work.join("in").join("data.txt"), "input").unwrap();
    let secret = root.path().join("secret.txt");
    std::fs::write(&secret, "TOP-SECRET-BESIDE").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    Job {
        _root: root,
        work,
        secret,
    }
}

fn limits() -> JobLimits {
    JobLimits {
        wall_clock: Duration::from_secs(30),
        ..JobLimits::default()
    }
}

fn spec(job: &Job, program: &str, args: &[&str], limits: JobLimits) -> JobSpec {
    let mut spec = JobSpec::new(program, &job.work, limits);
    spec.args = args.iter().map(OsString::from).collect();
    spec.env = vec![("PATH".to_owned(), "/usr/bin:/bin".to_owned())];
    spec
}

/// A file the job left in its `out/` (a tmpfs that lives on through the outcome's
/// descriptor, not a host directory).
fn out_file(outcome: &JobOutcome, rel: &str) -> PathBuf {
    use std::os::fd::AsRawFd;
    let fd = outcome.out.as_ref().unwrap();
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd())).join(rel)
}

fn sh(script: &str, limits: JobLimits) -> (Job, JobOutcome) {
    let job = job();
    let outcome = jail::run(&spec(&job, SH, &["-c", script], limits), &|| false).unwrap();
    (job, outcome)
}

fn stdout(outcome: &JobOutcome) -> String {
    String::from_utf8_lossy(&outcome.stdout.bytes).into_owned()
}

fn assert_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "the jail tests run as root, like CI, so the job drops to uid {JAIL_UID}"
    );
}

/// Processes on the host whose command line contains `marker`.
fn host_processes(marker: &str) -> Vec<String> {
    let out = Command::new("pgrep")
        .args(["-a", "-f", marker])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.contains("pgrep"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn probe_reports_a_usable_host() {
    let caps = jail::probe();
    assert!(caps.bwrap.is_some());
    assert_eq!(caps.user_namespaces, Ok(()));
    assert_eq!(caps.seccomp, Ok(()));
    assert!(caps.cgroups.complete(), "{:?}", caps.cgroups);
    assert!(caps.missing(jail::CgroupPolicy::Required).is_empty());
}

#[test]
fn job_runs_unprivileged_with_no_capabilities_and_no_new_privs() {
    assert_root();
    let (_job, out) = sh(
        "id -u; id -g; grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status",
        limits(),
    );
    assert_eq!(out.status, JobStatus::Exited(0), "{out:?}");
    let text = stdout(&out);
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("65534"));
    assert_eq!(lines.next(), Some("65534"));
    let fields: Vec<(&str, &str)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k, v.trim()))
        .collect();
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert!(fields.contains(&(cap, "0000000000000000")), "{cap}: {text}");
    }
    assert!(fields.contains(&("NoNewPrivs", "1")), "{text}");
    assert!(fields.contains(&("Seccomp", "2")), "{text}");
    assert_eq!(out.memory, Enforcement::Cgroup);
    assert_eq!(out.pids, Enforcement::Cgroup);
    assert_eq!(out.cpu, Enforcement::Cgroup);
}

#[test]
fn network_is_unreachable_and_only_unix_sockets_open() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let script = format!(
        r#"
import socket
for name in ["AF_INET", "AF_INET6", "AF_PACKET", "AF_NETLINK", "AF_VSOCK"]:
    try:
        s = socket.socket(getattr(socket, name), socket.SOCK_RAW if name in ("AF_PACKET", "AF_NETLINK") else socket.SOCK_STREAM)
        print("OPEN", name)
        s.settimeout(1)
        if name == "AF_INET":
            s.connect(("127.0.0.1", {port}))
            print("CONNECTED")
    except OSError as e:
        print("DENIED", name, e.errno)
a, b = socket.socketpair(socket.AF_UNIX)
print("UNIX OK")
"#
    );
    let job = job();
    let out = jail::run(&spec(&job, PYTHON, &["-c", &script], limits()), &|| false).unwrap();
    let text = stdout(&out);
    assert_eq!(out.status, JobStatus::Exited(0), "{out:?}");
    for family in ["AF_INET", "AF_INET6", "AF_PACKET", "AF_NETLINK", "AF_VSOCK"] {
        assert!(
            text.contains(&format!("DENIED {family} {}", libc::EPERM)),
            "{family}: {text}"
        );
    }
    assert!(
        !text.contains("OPEN") && !text.contains("CONNECTED"),
        "{text}"
    );
    assert!(text.contains("UNIX OK"), "{text}");
    match listener.accept() {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        other => panic!("the host listener saw a connection: {other:?}"),
    }
}

#[test]
fn file_system_shows_only_the_runtime_and_the_job() {
    let job = job();
    let script = format!(
        r#"
for p in /etc/shadow /etc/passwd /root /home /sys /run "{secret}" "{work}"; do
  if [ -e "$p" ]; then echo "VISIBLE $p"; fi
done
cat /job/in/data.txt; echo
for p in /x /job/y /job/in/z /usr/z /proc/z; do
  if ( : > "$p" ) 2>/dev/null; then echo "WROTE $p"; fi
done
echo out > /job/out/result.txt && echo "OUT OK"
echo tmp > /tmp/t && echo "TMP OK"
head -c 2000000 /dev/zero > /tmp/big 2>/dev/null || echo "TMP FULL"
"#,
        secret = job.secret.display(),
        work = job.work.display(),
    );
    let limits = JobLimits {
        tmp_bytes: 1 << 20,
        ..limits()
    };
    let out = jail::run(&spec(&job, SH, &["-c", &script], limits), &|| false).unwrap();
    let text = stdout(&out);
    assert_eq!(out.status, JobStatus::Exited(0), "{out:?}");
    assert!(!text.contains("VISIBLE"), "{text}");
    assert!(!text.contains("WROTE"), "{text}");
    assert!(text.contains("input"), "{text}");
    assert!(text.contains("OUT OK") && text.contains("TMP OK"), "{text}");
    assert!(text.contains("TMP FULL"), "{text}");
    assert_eq!(
        std::fs::read_to_string(out_file(&out, "result.txt")).unwrap(),
        "out\n"
    );
    // Nothing of it is on the host's disk: the host directory is only the mount point.
    assert_eq!(std::fs::read_dir(job.work.join("out")).unwrap().count(), 0);
    assert!(!job.work.join("y").exists() && !job.work.join("in").join("z").exists());
}

#[test]
fn proc_shows_only_the_sandbox() {
    let (_job, out) = sh(
        "ls /proc | grep -cE '^[0-9]+$'; cat /proc/1/cmdline | tr '\\0' ' '",
        limits(),
    );
    let text = stdout(&out);
    let count: u32 = text.lines().next().unwrap().trim().parse().unwrap();
    // bwrap's pid 1, the shell, ls and grep.
    assert!(count <= 5, "{text}");
    assert!(text.contains("bwrap"), "pid 1 is bwrap's init: {text}");
}

#[test]
fn dangerous_syscalls_are_refused() {
    // Each call is made so that, without the filter, it would fail differently or succeed:
    // the errno tells the filter's EPERM apart from the kernel's own answer.
    let script = format!(
        r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(name, nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_ulong(a) for a in args])
    print(name, r, ctypes.get_errno())
call("ptrace", {ptrace}, 0, 0, 0, 0)
call("process_vm_readv", {pvr}, os.getpid(), 0, 0, 0, 0, 0)
call("unshare", {unshare}, 0)
call("setns", {setns}, 0, 0)
call("mount", {mount}, 0, 1, 0, 0, 0)
call("keyctl", {keyctl}, 0, 0xfffffffd, 0)
call("io_uring_setup", {uring}, 1, 0)
call("clone_newuser", {clone}, {newuser} | 17, 0, 0, 0, 0)
call("tiocsti", {ioctl}, 0, {tiocsti}, 0)
call("tiocsti_high", {ioctl}, 0, {tiocsti} | (1 << 32), 0)
call("clone3", {clone3}, 0, 0)
"#,
        ptrace = libc::SYS_ptrace,
        pvr = libc::SYS_process_vm_readv,
        unshare = libc::SYS_unshare,
        setns = libc::SYS_setns,
        mount = libc::SYS_mount,
        keyctl = libc::SYS_keyctl,
        uring = libc::SYS_io_uring_setup,
        clone = libc::SYS_clone,
        newuser = libc::CLONE_NEWUSER,
        ioctl = libc::SYS_ioctl,
        tiocsti = libc::TIOCSTI,
        clone3 = libc::SYS_clone3,
    );
    let job = job();
    let out = jail::run(&spec(&job, PYTHON, &["-c", &script], limits()), &|| false).unwrap();
    let text = stdout(&out);
    assert_eq!(out.status, JobStatus::Exited(0), "{out:?}");
    for name in [
        "ptrace",
        "process_vm_readv",
        "unshare",
        "setns",
        "mount",
        "keyctl",
        "io_uring_setup",
        "clone_newuser",
        "tiocsti",
        "tiocsti_high",
    ] {
        assert!(
            text.lines()
                .any(|l| l == format!("{name} -1 {}", libc::EPERM)),
            "{name}: {text}"
        );
    }
    assert!(
        text.lines()
            .any(|l| l == format!("clone3 -1 {}", libc::ENOSYS)),
        "{text}"
    );
}

/// Run by `environment_carries_no_host_secret` in a child process whose environment holds
/// the secret; not a test on its own.
#[test]
#[ignore = "helper for environment_carries_no_host_secret"]
fn env_probe_child() {
    assert!(std::env::var_os("DATAREF_TEST_HOST_SECRET").is_some());
    let mut limits = limits();
    limits.wall_clock = Duration::from_secs(20);
    let job = job();
    let mut spec = spec(
        &job,
        SH,
        &["-c", "echo ENV-BEGIN; env; echo ENV-END"],
        limits,
    );
    spec.env.push(("ALLOWED".to_owned(), "yes".to_owned()));
    let out = jail::run(&spec, &|| false).unwrap();
    assert_eq!(out.status, JobStatus::Exited(0));
    let text = stdout(&out);
    // The parent test reads this.
    println!("{text}");
}

#[test]
fn environment_carries_no_host_secret() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "jail::env_probe_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("DATAREF_TEST_HOST_SECRET", "hunter2-host-secret")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let env = text
        .split("ENV-BEGIN")
        .nth(1)
        .and_then(|rest| rest.split("ENV-END").next())
        .unwrap();
    assert!(env.contains("ALLOWED=yes"), "{env}");
    assert!(!env.contains("hunter2"), "{env}");
    assert!(!env.contains("DATAREF_TEST_HOST_SECRET"), "{env}");
}

#[test]
fn fork_bomb_is_bounded_and_another_job_still_runs() {
    let bomb_limits = JobLimits {
        pids: 32,
        wall_clock: Duration::from_secs(4),
        // Room for the shells' "Cannot fork" stream over the whole 4 s: on a loaded machine
        // it filled the default 64 KiB first, and the job ended as OutputFlood rather than
        // by the clock or the pids limit this test is about.
        stderr_bytes: 16 << 20,
        ..limits()
    };
    let bomb = std::thread::spawn(move || sh("b() { b | b & }; b; sleep 600", bomb_limits).1);
    std::thread::sleep(Duration::from_millis(500));
    let (_job, other) = sh("echo still-here", limits());
    assert_eq!(other.status, JobStatus::Exited(0), "{other:?}");
    assert_eq!(stdout(&other).trim(), "still-here");
    let bomb = bomb.join().unwrap();
    assert_eq!(bomb.pids, Enforcement::Cgroup);
    assert!(
        matches!(bomb.status, JobStatus::TimedOut | JobStatus::Exited(_)),
        "{bomb:?}"
    );
    assert!(
        String::from_utf8_lossy(&bomb.stderr.bytes).contains("fork")
            || String::from_utf8_lossy(&bomb.stderr.bytes)
                .contains("Resource temporarily unavailable")
            || bomb.stderr.dropped > 0
            || bomb.status == JobStatus::TimedOut,
        "{bomb:?}"
    );
}

#[test]
fn memory_bomb_reports_memory_limit() {
    let limits = JobLimits {
        memory_bytes: 64 << 20,
        ..limits()
    };
    let job = job();
    let script = "a = []\nwhile True:\n    a.append(bytearray(8 << 20))";
    let out = jail::run(&spec(&job, PYTHON, &["-c", script], limits), &|| false).unwrap();
    assert_eq!(out.status, JobStatus::MemoryLimit, "{out:?}");
}

#[test]
fn infinite_loop_times_out_and_leaves_nothing_running() {
    let limits = JobLimits {
        wall_clock: Duration::from_secs(1),
        ..limits()
    };
    let started = Instant::now();
    let (_job, out) = sh("sleep 987651 & while :; do :; done", limits);
    assert_eq!(out.status, JobStatus::TimedOut, "{out:?}");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    assert!(host_processes("987651").is_empty());
}

#[test]
fn daemonised_child_does_not_survive() {
    let (_job, out) = sh(
        "setsid sleep 876543 </dev/null >/dev/null 2>&1 & echo started",
        limits(),
    );
    assert_eq!(out.status, JobStatus::Exited(0), "{out:?}");
    assert_eq!(stdout(&out).trim(), "started");
    assert!(host_processes("876543").is_empty());
}

#[test]
fn output_flood_kills_the_job() {
    let limits = JobLimits {
        stdout_bytes: 4096,
        ..limits()
    };
    let (_job, out) = sh("yes flood", limits);
    assert_eq!(out.status, JobStatus::OutputFlood, "{:?}", out.status);
    assert_eq!(out.stdout.bytes.len(), 4096);
    assert!(out.stdout.dropped > 0);
    assert!(out.duration < Duration::from_secs(10));
}

#[test]
fn file_size_and_out_total_are_capped_while_the_job_runs() {
    let limits = JobLimits {
        file_size: 1 << 20,
        out_bytes: 2 << 20,
        ..limits()
    };
    let (_job, big) = sh(
        "head -c 2000000 /dev/zero > /job/out/big; echo rc=$?",
        limits.clone(),
    );
    assert_eq!(big.status, JobStatus::Exited(0), "{big:?}");
    // The shell reports the writer killed by SIGXFSZ; the file stops at the limit.
    assert_eq!(stdout(&big).trim(), format!("rc={}", 128 + libc::SIGXFSZ));
    assert_eq!(
        std::fs::metadata(out_file(&big, "big")).unwrap().len(),
        1 << 20
    );
    // The attacker's way around a per-file cap: many files under it, for as long as the
    // clock allows. Each write past the total fails inside the sandbox while it runs.
    let (job, many) = sh(
        "for i in 1 2 3 4 5 6 7 8; do head -c 900000 /dev/zero > /job/out/f$i || echo FULL; done",
        limits,
    );
    assert_eq!(many.status, JobStatus::OutLimit, "{many:?}");
    assert!(stdout(&many).contains("FULL"), "{}", stdout(&many));
    assert!(many.out_bytes <= 2 << 20, "{}", many.out_bytes);
    let total: u64 = (1..=8)
        .filter_map(|i| std::fs::metadata(out_file(&many, &format!("f{i}"))).ok())
        .map(|m| m.len())
        .sum();
    assert!(total <= 2 << 20, "{total}");
    assert_eq!(std::fs::read_dir(job.work.join("out")).unwrap().count(), 0);
}

#[test]
fn cancel_stops_the_job() {
    let job = job();
    let started = Instant::now();
    let cancel = move || started.elapsed() > Duration::from_millis(300);
    let out = jail::run(&spec(&job, SH, &["-c", "sleep 765432"], limits()), &cancel).unwrap();
    assert_eq!(out.status, JobStatus::Cancelled);
    assert!(host_processes("765432").is_empty());
}

#[test]
fn cpu_quota_is_written() {
    let limits = JobLimits {
        cpu: CpuLimit::Cores(0.5),
        ..limits()
    };
    let (_job, out) = sh("true", limits);
    assert_eq!(out.cpu, Enforcement::Cgroup);
}

#[test]
fn private_host_paths_are_refused_before_bwrap() {
    assert_root();
    let job = job();
    let mut spec = spec(&job, SH, &["-c", "true"], limits());
    let private = Path::new("/root/.pyenv");
    spec.ro_binds.push(RoBind {
        host: private.to_owned(),
        sandbox: private.to_owned(),
    });
    match jail::run(&spec, &|| false) {
        Err(JailError::NotReachable { blocked_at, .. }) => {
            assert_eq!(blocked_at, Path::new("/root"))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn read_only_binds_are_visible_read_only() {
    let job = job();
    let lib = tempfile::tempdir().unwrap();
    std::fs::set_permissions(lib.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(lib.path().join("mod.py"), "X = 1").unwrap();
    let mut spec = spec(
        &job,
        SH,
        &[
            "-c",
            "cat /opt/lib/mod.py; echo; ( : > /opt/lib/new ) 2>/dev/null && echo WROTE",
        ],
        limits(),
    );
    spec.ro_binds.push(RoBind {
        host: lib.path().to_owned(),
        sandbox: "/opt/lib".into(),
    });
    let out = jail::run(&spec, &|| false).unwrap();
    let text = stdout(&out);
    assert!(text.contains("X = 1") && !text.contains("WROTE"), "{text}");
    assert!(!lib.path().join("new").exists());
}

#[test]
fn descriptors_the_server_inherited_do_not_reach_the_job() {
    assert_root();
    // A directory descriptor without close-on-exec, as a careless parent would leave one.
    let planted = rustix::fs::open(
        "/etc",
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
        rustix::fs::Mode::empty(),
    )
    .unwrap();
    let flags = rustix::io::fcntl_getfd(&planted).unwrap();
    assert!(!flags.contains(rustix::io::FdFlags::CLOEXEC));
    let (_job, outcome) = sh("ls /proc/self/fd", limits());
    assert_eq!(outcome.status, JobStatus::Exited(0), "{outcome:?}");
    // 0-2, and the descriptor `ls` opened to list the directory.
    let fds: Vec<String> = stdout(&outcome)
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    assert_eq!(fds, ["0", "1", "2", "3"], "{fds:?}");
    drop(planted);
}
