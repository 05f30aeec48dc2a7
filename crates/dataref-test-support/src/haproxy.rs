//! [`TestHaproxy`]: Debian's HAProxy (`apt-get install haproxy`, which `scripts/test` does)
//! in front of given backends, on a free port on 127.0.0.1, with a config generated into a
//! temp dir. Requests are balanced round robin, one by one (no stickiness), or sticky on a
//! session header: the backend whose response first sets the header gets every request
//! that carries it (a stick table stored from the response header and matched on the
//! request header, the documented path for session-based MCP clients).
//!
//! ```no_run
//! # fn demo(a: std::net::SocketAddr, b: std::net::SocketAddr) -> anyhow::Result<()> {
//! use dataref_test_support::{HaproxyOptions, Stickiness, TestHaproxy};
//! let lb = TestHaproxy::start(
//!     &[a, b],
//!     HaproxyOptions {
//!         stickiness: Stickiness::mcp_session(),
//!         ..HaproxyOptions::default()
//!     },
//! )?;
//! let url = format!("{}/mcp", lb.url()); // http://127.0.0.1:PORT/mcp
//! # let _ = url; Ok(()) }
//! ```
//!
//! Timeouts are long ([`HaproxyOptions::stream_timeout`], an hour by default) so an agent
//! run's SSE stream that goes quiet for minutes is not cut; a connection refused by a
//! backend is retried on another one (`option redispatch`, `retries 2`: connection failures
//! only, so a request that reached a backend is never sent twice). Health checks are a TCP
//! connect by default: `dataref serve --http` has no unauthenticated health route (its open
//! paths are the page `/` and `/.well-known/oauth-protected-resource`, which
//! [`HealthCheck::Http`] can name). Stopped on drop.

use std::fmt::Write as _;
use std::fs;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tempfile::TempDir;

use crate::raw_http;

/// The environment variable naming the `haproxy` binary.
pub const HAPROXY_ENV: &str = "DATAREF_HAPROXY";
/// The header MCP's Streamable HTTP transport carries a session id in.
pub const MCP_SESSION_HEADER: &str = "Mcp-Session-Id";

const START_ATTEMPTS: usize = 5;
const READY_TIMEOUT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(20);
const BACKEND: &str = "replicas";

/// The `haproxy` binary: `$DATAREF_HAPROXY`, else `haproxy` on `PATH`, else
/// `/usr/sbin/haproxy` (root's PATH has it; a user's often does not).
pub fn haproxy_bin() -> Result<PathBuf> {
    crate::binary::find(
        &haproxy_spec(),
        std::env::var_os(HAPROXY_ENV),
        std::env::var_os("PATH"),
    )
}

fn haproxy_spec() -> crate::binary::Spec {
    crate::binary::Spec {
        what: "HAProxy binary",
        var: HAPROXY_ENV,
        name: "haproxy",
        fallbacks: vec![PathBuf::from("/usr/sbin/haproxy")],
        installs: "it installs Debian's `haproxy` with apt-get when missing",
    }
}

/// Which backend a request goes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stickiness {
    /// Each request to the next backend in turn.
    None,
    /// A request carrying this header goes to the backend whose response set it; one
    /// without it, or with a value no response set, round robin.
    ResponseHeader(String),
}

impl Stickiness {
    /// Sticky on `Mcp-Session-Id`.
    pub fn mcp_session() -> Self {
        Self::ResponseHeader(MCP_SESSION_HEADER.to_owned())
    }
}

/// How HAProxy decides a backend is up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthCheck {
    /// Never checked: always up.
    None,
    /// A TCP connect every 300 ms; down after 2 failures, up after 1 success.
    Tcp,
    /// `GET path` with `Host: localhost` at the same pace; up on a 2xx or 3xx.
    Http { path: String },
}

#[derive(Debug, Clone)]
pub struct HaproxyOptions {
    pub stickiness: Stickiness,
    pub health_check: HealthCheck,
    /// How long a connection may stay silent in either direction once a request is under
    /// way (`timeout client`, `timeout server`, `timeout tunnel`).
    pub stream_timeout: Duration,
}

impl Default for HaproxyOptions {
    fn default() -> Self {
        Self {
            stickiness: Stickiness::None,
            health_check: HealthCheck::Tcp,
            stream_timeout: Duration::from_secs(3600),
        }
    }
}

/// A running HAProxy in front of the backends it was given.
#[derive(Debug)]
pub struct TestHaproxy {
    dir: TempDir,
    child: Option<Child>,
    addr: SocketAddr,
    backends: usize,
}

impl TestHaproxy {
    /// Generates the config, starts HAProxy on a free port and waits until it answers.
    pub fn start(backends: &[SocketAddr], opts: HaproxyOptions) -> Result<Self> {
        validate(backends, &opts)?;
        let bin = haproxy_bin()?;
        let mut last_log = String::new();
        for _ in 0..START_ATTEMPTS {
            let dir = tempfile::Builder::new()
                .prefix("dataref-haproxy-")
                .tempdir()?;
            let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
                .local_addr()?
                .port();
            let mut lb = Self {
                addr: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
                backends: backends.len(),
                child: None,
                dir,
            };
            let monitor = format!("/.dataref-test-haproxy-{}", crate::random_hex(8)?);
            fs::write(lb.config_path(), config(&lb, backends, &opts, &monitor)?)?;
            match lb.launch(&bin, &monitor)? {
                None => return Ok(lb),
                Some(status) => {
                    last_log = lb.log();
                    if TcpListener::bind(lb.addr).is_ok() {
                        bail!("HAProxy exited ({status}); its output:\n{last_log}");
                    }
                    // The front port was taken between our pick and HAProxy's bind: again.
                }
            }
        }
        bail!(
            "HAProxy found its port taken at each of {START_ATTEMPTS} starts; the last output:\n\
             {last_log}"
        )
    }

    /// `None` once ready; `Some` when HAProxy exited first.
    fn launch(&mut self, bin: &Path, monitor: &str) -> Result<Option<ExitStatus>> {
        let log = fs::File::create(self.log_path())?;
        let child = Command::new(bin)
            .arg("-db")
            .arg("-f")
            .arg(self.config_path())
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .spawn()
            .with_context(|| format!("running `{}`", bin.display()))?;
        let child = self.child.insert(child);
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = child.try_wait()? {
                self.child = None;
                return Ok(Some(status));
            }
            let ready = raw_http::request(self.addr, "GET", monitor, &[], b"")
                .is_ok_and(|r| r.status == 200);
            if ready {
                return Ok(None);
            }
            if Instant::now() > deadline {
                self.stop();
                bail!(
                    "HAProxy did not answer on {} after {READY_TIMEOUT:?}; its output:\n{}",
                    self.addr,
                    self.log()
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// The front: where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The generated config.
    pub fn config(&self) -> String {
        fs::read_to_string(self.config_path()).unwrap_or_default()
    }

    /// HAProxy's output (alerts, warnings, backends going up and down).
    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Whether HAProxy counts each backend (in the order given) as up, from its stats
    /// socket. Unchecked backends are always up.
    pub fn backends_up(&self) -> Result<Vec<bool>> {
        self.per_backend("status", |s| s.starts_with("UP") || s == "no check")
    }

    /// How many requests HAProxy has sent to each backend (in the order given) so far.
    pub fn requests_per_backend(&self) -> Result<Vec<u64>> {
        self.per_backend("stot", |s| s.parse().unwrap_or(0))
    }

    /// One column of `show stat` for each backend, in the order given, read by `value`.
    fn per_backend<T: Clone>(&self, column: &str, value: impl Fn(&str) -> T) -> Result<Vec<T>> {
        let mut sock = UnixStream::connect(self.stats_path())
            .context("connecting to HAProxy's stats socket")?;
        sock.write_all(b"show stat\n")?;
        let mut csv = String::new();
        sock.read_to_string(&mut csv)?;
        let mut lines = csv.lines();
        let header: Vec<&str> = lines
            .next()
            .and_then(|h| h.strip_prefix("# "))
            .context("no header in `show stat`")?
            .split(',')
            .collect();
        let col = |name: &str| {
            header
                .iter()
                .position(|c| *c == name)
                .with_context(|| format!("no `{name}` column in `show stat`"))
        };
        let (px, sv, wanted) = (col("pxname")?, col("svname")?, col(column)?);
        let mut found = vec![None; self.backends];
        for row in lines {
            let f: Vec<&str> = row.split(',').collect();
            if f.get(px) != Some(&BACKEND) {
                continue;
            }
            let index = f
                .get(sv)
                .and_then(|s| s.strip_prefix('r'))
                .and_then(|i| i.parse::<usize>().ok());
            if let (Some(i), Some(s)) = (index, f.get(wanted))
                && let Some(slot) = found.get_mut(i)
            {
                *slot = Some(value(s));
            }
        }
        found
            .into_iter()
            .enumerate()
            .map(|(i, u)| u.with_context(|| format!("backend `r{i}` missing from `show stat`")))
            .collect()
    }

    /// Polls [`TestHaproxy::backends_up`] until it equals `want`.
    pub fn wait_backends_up(&self, want: &[bool], timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let now = self.backends_up()?;
            if now == want {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("HAProxy's backends are up {now:?}, not {want:?}, after {timeout:?}");
            }
            std::thread::sleep(POLL);
        }
    }

    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Err(e) = crate::kill_group(&mut child) {
            tracing::warn!(error = %e, "waiting for the test HAProxy to exit");
        }
    }

    fn config_path(&self) -> PathBuf {
        self.dir.path().join("haproxy.cfg")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("haproxy.log")
    }

    fn stats_path(&self) -> PathBuf {
        self.dir.path().join("stats.sock")
    }
}

impl Drop for TestHaproxy {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A header name is a token; a check path has no spaces or controls: either goes into the
/// config verbatim.
fn validate(backends: &[SocketAddr], opts: &HaproxyOptions) -> Result<()> {
    if backends.is_empty() {
        bail!("HAProxy needs at least one backend");
    }
    if let Stickiness::ResponseHeader(name) = &opts.stickiness {
        let token = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.!#$%&'*+^`|~".contains(&b));
        if !token {
            bail!("`{name}` is not an HTTP header name");
        }
    }
    if let HealthCheck::Http { path } = &opts.health_check
        && (!path.starts_with('/') || !path.bytes().all(|b| b.is_ascii_graphic()))
    {
        bail!("`{path}` is not a request path (one `/…` without spaces)");
    }
    if opts.stream_timeout.is_zero() {
        bail!("a zero `stream_timeout` would make HAProxy wait forever");
    }
    Ok(())
}

fn config(
    lb: &TestHaproxy,
    backends: &[SocketAddr],
    opts: &HaproxyOptions,
    monitor: &str,
) -> Result<String> {
    let stream_ms = opts.stream_timeout.as_millis();
    let mut c = String::new();
    writeln!(
        c,
        "global\n\
         \x20   nbthread 1\n\
         \x20   maxconn 1000\n\
         \x20   log stderr format short daemon notice\n\
         \x20   stats socket {} mode 600 level admin\n\
         \n\
         defaults\n\
         \x20   mode http\n\
         \x20   log global\n\
         \x20   timeout connect 2s\n\
         \x20   timeout client {stream_ms}ms\n\
         \x20   timeout server {stream_ms}ms\n\
         \x20   timeout tunnel {stream_ms}ms\n\
         \x20   timeout http-request 30s\n\
         \x20   timeout http-keep-alive 30s\n\
         \x20   timeout queue 10s\n\
         \x20   timeout check 2s\n\
         \x20   # A refused connection is tried again on another backend; a request that\n\
         \x20   # reached one is never sent twice (the default `retry-on conn-failure`).\n\
         \x20   option redispatch\n\
         \x20   retries 2\n\
         \n\
         frontend front\n\
         \x20   bind {}\n\
         \x20   monitor-uri {monitor}\n\
         \x20   default_backend {BACKEND}\n\
         \n\
         backend {BACKEND}\n\
         \x20   balance roundrobin",
        lb.stats_path().display(),
        lb.addr,
    )?;
    if let Stickiness::ResponseHeader(name) = &opts.stickiness {
        writeln!(
            c,
            "    stick-table type string len 256 size 100k expire 1h\n\
             \x20   stick store-response res.hdr({name})\n\
             \x20   stick match req.hdr({name})"
        )?;
    }
    let check = match &opts.health_check {
        HealthCheck::None => "",
        HealthCheck::Tcp => " check",
        HealthCheck::Http { path } => {
            writeln!(
                c,
                "    option httpchk\n\
                 \x20   http-check send meth GET uri {path} ver HTTP/1.1 hdr Host localhost"
            )?;
            " check"
        }
    };
    writeln!(c, "    default-server inter 300ms fall 2 rise 1")?;
    for (i, addr) in backends.iter().enumerate() {
        writeln!(c, "    server r{i} {addr}{check}")?;
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_names_and_paths_cannot_inject_config() {
        let a = [SocketAddr::from((Ipv4Addr::LOCALHOST, 1))];
        let sticky = |h: &str| HaproxyOptions {
            stickiness: Stickiness::ResponseHeader(h.to_owned()),
            ..HaproxyOptions::default()
        };
        assert!(validate(&a, &sticky("Mcp-Session-Id")).is_ok());
        assert!(validate(&a, &sticky("x)\n    server evil 1.2.3.4:80")).is_err());
        assert!(validate(&a, &sticky("")).is_err());
        let check = |p: &str| HaproxyOptions {
            health_check: HealthCheck::Http { path: p.to_owned() },
            ..HaproxyOptions::default()
        };
        assert!(validate(&a, &check("/.well-known/oauth-protected-resource")).is_ok());
        assert!(validate(&a, &check("/x hdr Host evil")).is_err());
        assert!(validate(&a, &check("x")).is_err());
        assert!(validate(&[], &HaproxyOptions::default()).is_err());
    }

    #[test]
    fn a_missing_haproxy_says_to_run_scripts_test() {
        let spec = crate::binary::Spec {
            fallbacks: vec![PathBuf::from("/nonexistent/haproxy")],
            ..haproxy_spec()
        };
        let e = crate::binary::find(&spec, None, Some("/nonexistent".into())).unwrap_err();
        assert!(e.to_string().contains("scripts/test"), "{e}");
    }
}
