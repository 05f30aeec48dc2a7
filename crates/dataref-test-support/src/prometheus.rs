//! [`TestPrometheus`]: Debian's Prometheus (`apt-get install prometheus`, which
//! `scripts/host-deps` does when it is missing) scraping one target every second, on a free
//! port on 127.0.0.1, its config and data in a temp dir, killed on drop; and
//! [`promtool_check_metrics`], `promtool check metrics` on a scraped text.
//!
//! ```no_run
//! # fn demo(target: std::net::SocketAddr) -> anyhow::Result<()> {
//! use dataref_test_support::TestPrometheus;
//! let prom = TestPrometheus::start(target, "/metrics", Some("s3cret"))?;
//! let series = prom.wait_for("dataref_tool_calls_total", std::time::Duration::from_secs(60))?;
//! # let _ = series; Ok(()) }
//! ```

use std::fs;
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;
use tempfile::TempDir;

use crate::raw_http;

/// The environment variable naming the `prometheus` binary.
pub const PROMETHEUS_ENV: &str = "DATAREF_PROMETHEUS";
/// The environment variable naming the `promtool` binary.
pub const PROMTOOL_ENV: &str = "DATAREF_PROMTOOL";

const START_ATTEMPTS: usize = 5;
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(200);
const INSTALLS: &str =
    "`apt-get install prometheus`, which `scripts/host-deps` runs when it is missing";

/// The `prometheus` binary: `$DATAREF_PROMETHEUS`, else on `PATH`, else `/usr/bin/prometheus`.
pub fn prometheus_bin() -> Result<PathBuf> {
    crate::binary::find(
        &crate::binary::Spec {
            what: "Prometheus binary",
            var: PROMETHEUS_ENV,
            name: "prometheus",
            fallbacks: vec![PathBuf::from("/usr/bin/prometheus")],
            installs: INSTALLS,
        },
        std::env::var_os(PROMETHEUS_ENV),
        std::env::var_os("PATH"),
    )
}

/// The `promtool` binary: `$DATAREF_PROMTOOL`, else on `PATH`, else `/usr/bin/promtool`.
pub fn promtool_bin() -> Result<PathBuf> {
    crate::binary::find(
        &crate::binary::Spec {
            what: "promtool binary",
            var: PROMTOOL_ENV,
            name: "promtool",
            fallbacks: vec![PathBuf::from("/usr/bin/promtool")],
            installs: INSTALLS,
        },
        std::env::var_os(PROMTOOL_ENV),
        std::env::var_os("PATH"),
    )
}

/// `promtool check metrics` on `text` (the exposition format on its stdin): an error with
/// promtool's words for any problem it reports, lint included.
pub fn promtool_check_metrics(text: &str) -> Result<()> {
    let bin = promtool_bin()?;
    let mut child = Command::new(&bin)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running `{}`", bin.display()))?;
    child
        .stdin
        .take()
        .context("promtool's stdin")?
        .write_all(text.as_bytes())?;
    let out = child.wait_with_output()?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() || !said.trim().is_empty() {
        bail!("`promtool check metrics` ({}): {said}", out.status);
    }
    Ok(())
}

/// `promtool check rules` on the rules file at `path`: an error with promtool's words when
/// it finds a problem.
pub fn promtool_check_rules(path: &Path) -> Result<()> {
    let bin = promtool_bin()?;
    let out = Command::new(&bin)
        .args(["check", "rules"])
        .arg(path)
        .output()
        .with_context(|| format!("running `{}`", bin.display()))?;
    if !out.status.success() {
        bail!(
            "`promtool check rules {}` ({}): {}{}",
            path.display(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// A running Prometheus scraping one target.
#[derive(Debug)]
pub struct TestPrometheus {
    dir: TempDir,
    child: Option<Child>,
    addr: SocketAddr,
}

impl TestPrometheus {
    /// Prometheus on a free port, scraping `http://target{path}` every second (with
    /// `Authorization: Bearer token` when given), once it answers `/-/ready`.
    pub fn start(target: SocketAddr, path: &str, token: Option<&str>) -> Result<Self> {
        let bin = prometheus_bin()?;
        let mut last_log = String::new();
        for _ in 0..START_ATTEMPTS {
            let dir = tempfile::Builder::new()
                .prefix("dataref-prometheus-")
                .tempdir()?;
            let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
                .local_addr()?
                .port();
            let mut prom = Self {
                dir,
                child: None,
                addr: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
            };
            fs::write(prom.config_path(), config(target, path, token))?;
            if prom.launch(&bin)? {
                return Ok(prom);
            }
            last_log = prom.log();
            if TcpListener::bind(prom.addr).is_ok() {
                bail!("Prometheus exited; its output:\n{last_log}");
            }
            // The port was taken between our pick and its bind: again.
        }
        bail!("Prometheus found its port taken at each of {START_ATTEMPTS} starts:\n{last_log}")
    }

    /// True once ready; false when it exited first.
    fn launch(&mut self, bin: &Path) -> Result<bool> {
        let log = fs::File::create(self.log_path())?;
        let child = Command::new(bin)
            .arg(format!("--config.file={}", self.config_path().display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                self.dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={}", self.addr))
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
            if child.try_wait()?.is_some() {
                self.child = None;
                return Ok(false);
            }
            if raw_http::request(self.addr, "GET", "/-/ready", &[], b"")
                .is_ok_and(|r| r.status == 200)
            {
                return Ok(true);
            }
            if Instant::now() > deadline {
                self.stop();
                bail!(
                    "Prometheus was not ready on {} after {READY_TIMEOUT:?}; its output:\n{}",
                    self.addr,
                    self.log()
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Its output.
    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// `GET /api/v1/{what}` (e.g. `query?query=up`, already encoded): the `data` of a
    /// success.
    fn api(&self, what: &str) -> Result<Value> {
        let r = raw_http::request(self.addr, "GET", &format!("/api/v1/{what}"), &[], b"")?;
        let body: Value = serde_json::from_slice(&r.body)
            .with_context(|| format!("Prometheus answered {}: {}", r.status, r.text()))?;
        if body["status"] != "success" {
            bail!("Prometheus refused `{what}`: {body}");
        }
        Ok(body["data"].clone())
    }

    /// An instant query: the result vector.
    pub fn query(&self, expr: &str) -> Result<Vec<Value>> {
        let data = self.api(&format!("query?query={}", encode(expr)))?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    /// The active targets with their health and last scrape error.
    pub fn targets(&self) -> Result<Value> {
        self.api("targets")
    }

    /// Polls `expr` until it has a result (or `timeout`, then an error naming the
    /// target's last scrape error).
    pub fn wait_for(&self, expr: &str, timeout: Duration) -> Result<Vec<Value>> {
        let deadline = Instant::now() + timeout;
        loop {
            let result = self.query(expr)?;
            if !result.is_empty() {
                return Ok(result);
            }
            if Instant::now() > deadline {
                bail!(
                    "`{expr}` had no series after {timeout:?}; the targets: {}",
                    self.targets().map(|t| t.to_string()).unwrap_or_default()
                );
            }
            std::thread::sleep(POLL);
        }
    }

    fn config_path(&self) -> PathBuf {
        self.dir.path().join("prometheus.yml")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("prometheus.log")
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = crate::kill_group(&mut child);
        }
    }
}

impl Drop for TestPrometheus {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The scrape config: one job, one target, every second.
fn config(target: SocketAddr, path: &str, token: Option<&str>) -> String {
    let auth = match token {
        Some(t) => format!(
            "    authorization:\n      type: Bearer\n      credentials: {}\n",
            serde_json::Value::String(t.to_owned())
        ),
        None => String::new(),
    };
    format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
         scrape_configs:\n  - job_name: dataref\n    metrics_path: {}\n{auth}    \
         static_configs:\n      - targets: [\"{target}\"]\n",
        serde_json::Value::String(path.to_owned())
    )
}

/// `expr` percent-encoded for a query string.
fn encode(expr: &str) -> String {
    let mut out = String::new();
    for b in expr.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_quotes_what_it_is_given() {
        let c = config(SocketAddr::from(([127, 0, 0, 1], 9)), "/m", Some("a\"b"));
        assert!(c.contains("metrics_path: \"/m\"\n"), "{c}");
        assert!(c.contains("credentials: \"a\\\"b\"\n"), "{c}");
        assert!(c.contains("targets: [\"127.0.0.1:9\"]"), "{c}");
        assert_eq!(encode("a{b=\"c\"} 1"), "a%7Bb%3D%22c%22%7D%201");
    }

    /// The check fails on lint too, not only on text Prometheus cannot parse.
    #[test]
    fn promtool_check_fails_on_what_it_reports() {
        promtool_check_metrics("# HELP a_total a\n# TYPE a_total counter\na_total 1\n")
            .expect("a clean text passes");
        let e = promtool_check_metrics("a 1\n").expect_err("no help text");
        assert!(e.to_string().contains("no help text"), "{e}");
        let e = promtool_check_metrics("a{ 1\n").expect_err("not the format");
        assert!(e.to_string().contains("check metrics"), "{e}");
    }
}
