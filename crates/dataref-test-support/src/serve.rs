//! [`ServeHttp`]: a `dataref serve --http` process a test or a benchmark started, found by
//! the address it prints on stderr, its log kept, killed when dropped.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, Result, bail};

/// A running `dataref serve --http`.
#[derive(Debug)]
pub struct ServeHttp {
    child: Child,
    addr: String,
    log: Arc<Mutex<Vec<String>>>,
}

impl ServeHttp {
    /// `bin serve --home HOME --config CONFIG --http 127.0.0.1:0`, with no `DATAREF_CONFIG`
    /// or `DATAREF_HOME` from the caller's environment: what [`ServeHttp::start`] takes,
    /// for the caller to add its environment to.
    pub fn command(bin: impl AsRef<std::ffi::OsStr>, home: &Path, config: &Path) -> Command {
        let mut cmd = Command::new(bin);
        cmd.arg("serve")
            .arg("--home")
            .arg(home)
            .arg("--config")
            .arg(config)
            .args(["--http", "127.0.0.1:0"])
            .env_remove("DATAREF_CONFIG")
            .env_remove("DATAREF_HOME");
        cmd
    }

    /// Spawns `cmd` (a `dataref serve … --http 127.0.0.1:0`; its stdin and stdout are
    /// closed and its stderr read here) and waits up to `timeout` for the line naming the
    /// address it serves on.
    pub fn start(cmd: &mut Command, timeout: Duration) -> Result<Self> {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("spawning `dataref serve --http`")?;
        let stderr = child.stderr.take().context("its stderr")?;
        let log = Arc::new(Mutex::new(Vec::new()));
        let lines = log.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if !sent && let Some(at) = line.find("http://") {
                    let addr = line[at + "http://".len()..]
                        .split(['/', ' '])
                        .next()
                        .unwrap_or("")
                        .to_owned();
                    let _ = tx.send(addr);
                    sent = true;
                }
                lines
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(line);
            }
        });
        match rx.recv_timeout(timeout) {
            Ok(addr) => Ok(Self { child, addr, log }),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                let log = log
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .join("\n");
                bail!("`dataref serve --http` did not start within {timeout:?}:\n{log}")
            }
        }
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Everything it wrote on stderr so far.
    pub fn log(&self) -> String {
        self.log_lines().join("\n")
    }

    /// The process, to signal or wait for.
    pub fn child(&mut self) -> &mut Child {
        &mut self.child
    }

    /// Its stderr so far, line by line.
    pub fn log_lines(&self) -> Vec<String> {
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// `kill -9`, and waits for it to be gone.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServeHttp {
    fn drop(&mut self) {
        self.kill();
    }
}
