//! [`TestMariadb`]: a throwaway MariaDB server made from Debian's `mariadb-server`
//! binaries, listening on loopback TCP and a Unix socket in a temp dir, removed on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tempfile::TempDir;

/// A running throwaway MariaDB server; `root` logs in over the socket without a password.
#[derive(Debug)]
pub struct TestMariadb {
    dir: TempDir,
    child: Child,
    port: u16,
}

/// The first of `names` found in `PATH`, `/usr/sbin` or `/usr/bin`.
fn find(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs: Vec<PathBuf> = std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .collect();
    names
        .iter()
        .find_map(|n| dirs.iter().map(|d| d.join(n)).find(|p| p.is_file()))
}

const INSTALL: &str = "no MariaDB server binaries (mariadbd, mariadb-install-db, mariadb) found\n\
     hint: install them (`scripts/host-deps` does: apt-get install mariadb-server mariadb-client)";

impl TestMariadb {
    /// Initialises a data directory in a new temp dir and starts the server on a free
    /// loopback port, without a binary log.
    pub fn start() -> Result<Self> {
        Self::start_with(false)
    }

    /// The same with the binary log on: the server keeps GTIDs of what it writes (a
    /// receipt's version of the source).
    pub fn start_logged() -> Result<Self> {
        Self::start_with(true)
    }

    fn start_with(binlog: bool) -> Result<Self> {
        let server = find(&["mariadbd", "mysqld"]).context(INSTALL)?;
        let install = find(&["mariadb-install-db", "mysql_install_db"]).context(INSTALL)?;
        find(&["mariadb", "mysql"]).context(INSTALL)?;
        let dir = tempfile::Builder::new()
            .prefix("dataref-mariadb-")
            .tempdir()?;
        let data = dir.path().join("data");
        // A temp dir of its own: servers started side by side (tests run in parallel, CI
        // runs several binaries at once) otherwise share /tmp for their temporary tables,
        // and one bootstrap's cleanup was seen to take another's table away.
        let tmp = dir.path().join("tmp");
        std::fs::create_dir(&tmp)?;
        let root = super::is_root();
        let mut init = Command::new(&install);
        init.arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--tmpdir={}", tmp.display()))
            .args(["--auth-root-authentication-method=socket", "--skip-test-db"]);
        if root {
            init.arg("--user=root");
        }
        let out = init
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {}", install.display()))?;
        if !out.status.success() {
            bail!(
                "{} failed ({}):\n{}{}",
                install.display(),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let log = std::fs::File::create(dir.path().join("server.log"))?;
        let mut cmd = Command::new(&server);
        cmd.arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--tmpdir={}", tmp.display()))
            .arg(format!("--socket={}", dir.path().join("sock").display()))
            .arg(format!("--port={port}"))
            .arg(format!("--pid-file={}", dir.path().join("pid").display()))
            .arg(if binlog {
                format!("--log-bin={}", dir.path().join("binlog").display())
            } else {
                "--skip-log-bin".to_owned()
            })
            .args([
                "--bind-address=127.0.0.1",
                "--server-id=1",
                "--skip-name-resolve",
                "--innodb-buffer-pool-size=64M",
                "--innodb-log-file-size=16M",
                "--innodb-flush-log-at-trx-commit=0",
                "--max-connections=100",
            ]);
        if root {
            cmd.arg("--user=root");
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", server.display()))?;
        let mut db = Self { dir, child, port };
        let started = Instant::now();
        loop {
            if db.execute("SELECT 1").is_ok() {
                return Ok(db);
            }
            if let Some(status) = db.child.try_wait()? {
                bail!("mariadbd exited ({status}):\n{}", db.log());
            }
            if started.elapsed() > Duration::from_secs(60) {
                bail!("mariadbd did not answer within 60 s:\n{}", db.log());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// The server's Unix socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("sock")
    }

    /// The loopback TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `mysql://user:password@127.0.0.1:PORT/db` (the password percent-encoded is the
    /// caller's business: tests use plain ones).
    pub fn url(&self, user: &str, password: &str, db: &str) -> String {
        format!("mysql://{user}:{password}@127.0.0.1:{}/{db}", self.port)
    }

    /// Runs `sql` (any number of statements) as `root` with the `mariadb` client.
    pub fn execute(&self, sql: &str) -> Result<()> {
        self.client(sql).map(drop)
    }

    /// Runs `sql` as `root` and returns the rows, tab-separated, one per line (no header).
    pub fn query(&self, sql: &str) -> Result<String> {
        self.client(sql)
    }

    fn client(&self, sql: &str) -> Result<String> {
        let client = find(&["mariadb", "mysql"]).context(INSTALL)?;
        let out = Command::new(client)
            .arg("--no-defaults")
            .arg(format!("--socket={}", self.socket().display()))
            .args(["-uroot", "--batch", "--skip-column-names", "-e", sql])
            .stdin(Stdio::null())
            .output()?;
        if !out.status.success() {
            bail!("mariadb -e: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The data directory (tests that look at the server's files).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for TestMariadb {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
