//! What a stdio server leaves on the machine: nothing once its client closes stdin (warm
//! sandboxes, their job cgroups and job directories are removed on the way out), and what a
//! `kill -9` left is removed by the next start, which never touches a live server's.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers fail by panicking, like the tests that call them"
)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::BIN;

/// The data dir where the sandbox tests provision the Python runtime (shared, so it is
/// installed once per target dir; other tests' servers use it at the same time).
fn runtime_home() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dataref-runtime-home")
}

/// Every cgroup directory this process's cgroups hold (v2: one; v1: one per controller).
fn cgroup_parents() -> Vec<PathBuf> {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let mut parents = Vec::new();
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, names, path) = (parts.next(), parts.next().unwrap(), parts.next().unwrap());
        let rel = path.trim_start_matches('/');
        if names.is_empty() {
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

/// What process `pid` left: job cgroups and job directories named with its pid.
fn left_by(pid: u32) -> Vec<PathBuf> {
    let cgroup_prefix = format!("dataref-job-{pid}.");
    let dir_prefix = format!("{pid}.");
    let mut found = Vec::new();
    for parent in cgroup_parents() {
        for e in std::fs::read_dir(&parent).into_iter().flatten().flatten() {
            if e.file_name().to_string_lossy().starts_with(&cgroup_prefix) {
                found.push(e.path());
            }
        }
    }
    for e in std::fs::read_dir(runtime_home().join("jobs"))
        .into_iter()
        .flatten()
        .flatten()
    {
        if e.file_name().to_string_lossy().starts_with(&dir_prefix) {
            found.push(e.path());
        }
    }
    found
}

struct Server {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl Server {
    fn start() -> Server {
        let mut child = Command::new(BIN)
            .arg("serve")
            .arg("--home")
            .arg(runtime_home())
            .args(["--rows", "4000"])
            .env("DATAREF_PRINCIPAL", "cleanup")
            .env_remove("DATAREF_CONFIG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut server = Server {
            child,
            stdin,
            lines,
        };
        server.send(json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{
            "protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}));
        server.lines.next().unwrap().unwrap();
        server.send(json!({"jsonrpc":"2.0","method":"notifications/initialized"}));
        server
    }

    fn send(&mut self, v: Value) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{v}").unwrap();
        stdin.flush().unwrap();
    }

    /// One `run_python` call (provisions the runtime on first use, then the pool refills).
    fn run_python(&mut self) {
        self.send(
            json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{
            "name":"run_python","arguments":{"code":"result = 1 + 1"}}}),
        );
        let reply: Value = loop {
            let line = self.lines.next().unwrap().unwrap();
            let v: Value = serde_json::from_str(&line).unwrap();
            if v["id"] == 2 {
                break v;
            }
        };
        assert_eq!(reply["result"]["structuredContent"]["result"], 2, "{reply}");
    }

    /// Waits until the server has warm sandboxes (job directories and cgroups of its pid).
    fn wait_warm(&self) -> Vec<PathBuf> {
        let until = Instant::now() + Duration::from_secs(120);
        loop {
            let left = left_by(self.child.id());
            let cgroups = left.iter().filter(|p| p.starts_with("/sys")).count();
            if cgroups > 0 && left.len() > cgroups {
                // The sandbox a finished run used is removed by the server itself, a moment
                // after its result: wait until nothing changes for a while, so what is
                // returned is only the warm pool.
                std::thread::sleep(Duration::from_secs(2));
                if left_by(self.child.id()) == left {
                    return left;
                }
                continue;
            }
            assert!(Instant::now() < until, "the pool never filled: {left:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn wait_gone(pid: u32, patience: Duration) -> Vec<PathBuf> {
    let until = Instant::now() + patience;
    loop {
        let left = left_by(pid);
        if left.is_empty() || Instant::now() >= until {
            return left;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn closing_stdin_removes_warm_sandboxes_cgroups_and_job_dirs() {
    let mut server = Server::start();
    server.run_python();
    let pid = server.child.id();
    let warm = server.wait_warm();
    // The client goes away: EOF on the server's stdin.
    drop(server.stdin.take());
    let status = server.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let left = left_by(pid);
    assert!(
        left.is_empty(),
        "left behind: {left:?} (warm were {warm:?})"
    );
}

#[test]
fn the_next_start_removes_what_a_kill_9_left_and_nothing_of_a_live_server() {
    let mut killed = Server::start();
    killed.run_python();
    let killed_pid = killed.child.id();
    killed.wait_warm();
    let mut live = Server::start();
    live.run_python();
    let live_warm = live.wait_warm();
    killed.child.kill().unwrap(); // SIGKILL: no clean-up runs
    killed.child.wait().unwrap();
    // The sandboxes died with their parent; their cgroups and directories did not.
    assert!(!left_by(killed_pid).is_empty());

    let next = Server::start();
    let left = wait_gone(killed_pid, Duration::from_secs(30));
    assert!(
        left.is_empty(),
        "a dead server's leftovers stayed: {left:?}"
    );
    // The live server's warm sandboxes are untouched, and still serve.
    for path in &live_warm {
        assert!(path.exists(), "{path:?} of a live server was removed");
    }
    live.run_python();
    for mut server in [live, next] {
        drop(server.stdin.take());
        server.child.wait().unwrap();
    }
}

#[test]
fn a_stdio_server_starts_its_warm_pool_before_it_answers_the_handshake_and_holds_no_more() {
    // The runtime is installed (the first run of a fresh target dir installs it).
    let mut first = Server::start();
    first.run_python();
    drop(first.stdin.take());
    first.child.wait().unwrap();

    // `start` returns once the server has answered `initialize`: by then the pool's first
    // sandbox is there (its job directory), before any call. (It is ready too: the server
    // reads the handshake only then; `bench first-run` shows the first call served warm.)
    let mut server = Server::start();
    let pid = server.child.id();
    let dirs = |left: &[PathBuf]| left.iter().filter(|p| !p.starts_with("/sys")).count();
    let at_handshake = left_by(pid);
    assert!(
        dirs(&at_handshake) >= 1,
        "no warm sandbox when the handshake was answered: {at_handshake:?}"
    );
    // A server never asked for run_python holds the pool's 2 sandboxes, no more.
    let warm = server.wait_warm();
    assert!(dirs(&warm) <= 2, "{warm:?}");
    drop(server.stdin.take());
    assert!(server.child.wait().unwrap().success());
    let left = left_by(pid);
    assert!(left.is_empty(), "left behind: {left:?}");
}
