//! Dev-only helpers for tests and benchmarks.
//!
//! [`TestPostgres`]: a throwaway PostgreSQL server made from the installed binaries
//! (`initdb`, `pg_ctl`, `postgres` under `/usr/lib/postgresql/*/bin`, or `$PG_BIN`), with its
//! data directory and Unix socket in a temp dir, no TCP, `fsync=off`, and stopped on drop.
//! As root (CI), the server runs as the `postgres` OS user (initdb refuses root).
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! let pg = dataref_test_support::TestPostgres::start()?;
//! pg.execute("CREATE TABLE t (id int); INSERT INTO t VALUES (1)").await?;
//! let url = pg.conninfo("postgres"); // host=/tmp/.tmpXXXX port=5432 user=postgres dbname=postgres
//! # let _ = url; Ok(()) }
//! ```
//!
//! [`adbc_driver`] ([`adbc`]): a real ADBC driver's shared library, from the PyPI wheel
//! the test venv holds.
//!
//! [`TestMariadb`] ([`mariadb`]): a throwaway MariaDB server from Debian's `mariadb-server`
//! (loopback TCP and a Unix socket in a temp dir; `root` over the socket), killed on drop.
//!
//! [`ScriptedModel`] ([`model_server`]): a scripted OpenAI-compatible model server on
//! `127.0.0.1:0` (Chat Completions, streamed or not, errors, dropped connections), for the
//! agent's gateway and loop tests.
//!
//! [`TestS3`] ([`s3`]): a throwaway S3-compatible object store (SeaweedFS `weed mini`, from
//! PyPI) on free loopback ports, with one bucket and one access key; it can be stopped and
//! restarted on the same port with the same data.
//!
//! [`TestHaproxy`] ([`haproxy`]): Debian's HAProxy in front of given backends on a free
//! loopback port: round robin, or sticky on a response header such as `Mcp-Session-Id`.
//!
//! [`TestPrometheus`] ([`prometheus`]): Debian's Prometheus scraping one target every
//! second, queried through its HTTP API; [`promtool_check_metrics`] checks a scraped text.
//!
//! [`raw_http`]: a minimal blocking HTTP/1.1 client for probes and plain requests.
//!
//! [`ServeHttp`] ([`serve`]): a `dataref serve --http` a test or benchmark started, found by
//! the address it prints, killed on drop.
//!
//! Owns: fixtures for tests and benchmarks only. It is never a normal dependency of a
//! crate that ships in the release binary (a dev-dependency, or a dependency of
//! `dataref-bench`).

#![expect(
    clippy::disallowed_methods,
    reason = "a test server's temp dir is made and inspected directly, outside any workspace"
)]

pub mod adbc;
mod binary;
pub mod haproxy;
pub mod mariadb;
pub mod model_server;
pub mod prometheus;
pub mod raw_http;
pub mod s3;
pub mod serve;

pub use adbc::adbc_driver;
pub use haproxy::{HaproxyOptions, HealthCheck, Stickiness, TestHaproxy};
pub use mariadb::TestMariadb;
pub use model_server::{Call, Received, Reply, ScriptedModel};
pub use prometheus::{TestPrometheus, promtool_check_metrics, promtool_check_rules};
pub use s3::TestS3;
pub use serve::ServeHttp;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use tempfile::TempDir;

/// The environment variable naming the directory of `initdb` and `pg_ctl`.
pub const PG_BIN_ENV: &str = "PG_BIN";
/// The superuser initdb creates.
pub const SUPERUSER: &str = "postgres";
const PORT: u16 = 5432;

/// A running throwaway PostgreSQL server.
#[derive(Debug)]
pub struct TestPostgres {
    dir: TempDir,
    bin: PathBuf,
    /// Set when the server runs as the `postgres` OS user (we are root).
    run_as: Option<String>,
    /// The TCP port of a server started with TLS ([`TestPostgres::start_tls`]).
    tls_port: Option<u16>,
}

/// Kills `child`'s process group (a server started as the leader of its own group, so
/// its helpers go too) and waits for it. Only while it is unreaped: a reaped pid (and its
/// group id) may be reused by another process. An error from the kill means the group is
/// already gone.
pub(crate) fn kill_group(
    child: &mut std::process::Child,
) -> std::io::Result<std::process::ExitStatus> {
    let unreaped = matches!(child.try_wait(), Ok(None));
    if let Some(pid) = i32::try_from(child.id())
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .filter(|_| unreaped)
    {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
    child.wait()
}

/// The directory holding `initdb` and `pg_ctl`: `$PG_BIN`, else the newest
/// `/usr/lib/postgresql/*/bin`.
pub fn pg_bin() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os(PG_BIN_ENV) {
        return Some(PathBuf::from(dir));
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| {
            let e = e.ok()?;
            let version: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin)
}

/// The workspace root (this crate is `crates/dataref-test-support`).
fn workspace_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.parent()
        .and_then(Path::parent)
        .unwrap_or(here)
        .to_path_buf()
}

/// `bytes` random bytes from the OS, as lowercase hex (credentials, unguessable paths).
fn random_hex(bytes: usize) -> Result<String> {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf).map_err(|e| anyhow::anyhow!("getrandom: {e}"))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

fn is_root() -> bool {
    // The effective uid, without libc: `/proc/self/status` line `Uid: real effective …`.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// uid and gid of a local user, from `/etc/passwd`.
fn user_ids(name: &str) -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.first() == Some(&name) && f.len() > 3)
            .then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))
            .flatten()
    })
}

impl TestPostgres {
    /// initdb into a new temp dir and start the server on a Unix socket there.
    pub fn start() -> Result<Self> {
        Self::start_with(None)
    }

    /// [`TestPostgres::start`], and also listening on `127.0.0.1` with TLS on: a throwaway
    /// CA (made with the `openssl` command) signs a certificate for `localhost`.
    /// [`TestPostgres::tls_url`] and [`TestPostgres::tls_ca`] reach it.
    pub fn start_tls() -> Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        Self::start_with(Some(port))
    }

    fn start_with(tls_port: Option<u16>) -> Result<Self> {
        let bin = pg_bin().context(
            "no PostgreSQL server binaries (initdb) found under /usr/lib/postgresql/*/bin\n\
             hint: install them (`scripts/host-deps` does: apt-get install postgresql) or set PG_BIN",
        )?;
        let dir = tempfile::Builder::new().prefix("dataref-pg-").tempdir()?;
        let run_as = if is_root() {
            let (uid, gid) = user_ids(SUPERUSER).context(
                "running as root, but there is no `postgres` OS user to run the server as",
            )?;
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))?;
            Some(SUPERUSER.to_owned())
        } else {
            None
        };
        let pg = Self {
            dir,
            bin,
            run_as,
            tls_port,
        };
        let data = pg.data_dir();
        pg.run(
            "initdb",
            [
                OsStr::new("-D"),
                data.as_os_str(),
                OsStr::new("-U"),
                OsStr::new(SUPERUSER),
                OsStr::new("--auth=trust"),
                OsStr::new("-E"),
                OsStr::new("UTF8"),
                OsStr::new("--locale=C"),
                OsStr::new("--no-sync"),
            ],
        )?;
        let mut options = format!(
            "-k {} -c fsync=off -c synchronous_commit=off \
             -c full_page_writes=off -c max_connections=50",
            pg.socket_dir().display()
        );
        match tls_port {
            None => options.push_str(&format!(" -c listen_addresses='' -p {PORT}")),
            Some(port) => {
                pg.make_certificates()?;
                // The Unix socket is then named after this port too.
                options.push_str(&format!(
                    " -c listen_addresses='127.0.0.1' -p {port} -c ssl=on \
                     -c ssl_cert_file={0}/server.crt -c ssl_key_file={0}/server.key",
                    pg.dir.path().display()
                ));
            }
        }
        let log = pg.dir.path().join("server.log");
        pg.run(
            "pg_ctl",
            [
                OsStr::new("-D"),
                data.as_os_str(),
                OsStr::new("-l"),
                log.as_os_str(),
                OsStr::new("-o"),
                OsStr::new(&options),
                OsStr::new("-w"),
                OsStr::new("start"),
            ],
        )
        .with_context(|| {
            let tail = std::fs::read_to_string(&log).unwrap_or_default();
            format!("the server log:\n{tail}")
        })?;
        Ok(pg)
    }

    /// A CA and a certificate for `localhost` it signed, for the server (owned by the user
    /// the server runs as, key mode 0600 as PostgreSQL requires).
    fn make_certificates(&self) -> Result<()> {
        let d = self.dir.path();
        let openssl = |args: &[&str]| -> Result<()> {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(d)
                .output()
                .context("running `openssl` (Debian's `openssl` package)")?;
            if !out.status.success() {
                bail!("openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
            }
            Ok(())
        };
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=dataref test CA",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
        ])?;
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ])?;
        std::fs::write(
            d.join("san.ext"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
        )?;
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "san.ext",
            "-out",
            "server.crt",
        ])?;
        std::fs::set_permissions(
            d.join("server.key"),
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )?;
        if self.run_as.is_some() {
            let (uid, gid) = user_ids(SUPERUSER).context("the `postgres` OS user")?;
            for f in ["server.key", "server.crt"] {
                std::os::unix::fs::chown(d.join(f), Some(uid), Some(gid))?;
            }
        }
        Ok(())
    }

    /// With [`TestPostgres::start_tls`]: a URL for `user` over TCP to `localhost`, TLS
    /// required.
    pub fn tls_url(&self, user: &str) -> Option<String> {
        self.tls_port
            .map(|port| format!("postgresql://{user}@localhost:{port}/postgres?sslmode=require"))
    }

    /// With [`TestPostgres::start_tls`]: the PEM file of the CA that signed the server's
    /// certificate.
    pub fn tls_ca(&self) -> Option<PathBuf> {
        self.tls_port.map(|_| self.dir.path().join("ca.crt"))
    }

    /// The port the server listens on (its Unix socket is named after it too).
    fn port(&self) -> u16 {
        self.tls_port.unwrap_or(PORT)
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Stops the server and all its backends (`SIGSTOP`): connections stay open and every
    /// query hangs, as in an outage that does not refuse. [`TestPostgres::thaw`] resumes.
    pub fn freeze(&self) -> Result<()> {
        self.signal("-STOP")
    }

    /// Resumes a server [`TestPostgres::freeze`] stopped.
    pub fn thaw(&self) -> Result<()> {
        self.signal("-CONT")
    }

    /// `kill SIGNAL` to the postmaster (from `postmaster.pid`) and every process under it.
    fn signal(&self, signal: &str) -> Result<()> {
        let pid_file = std::fs::read_to_string(self.data_dir().join("postmaster.pid"))?;
        let root: u32 = pid_file
            .lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .context("postmaster.pid names no pid")?;
        let mut parents: Vec<(u32, u32)> = Vec::new();
        for entry in std::fs::read_dir("/proc")?.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            // `pid (comm) state ppid …`: the fields after the last `)`.
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
            if let Some(ppid) = ppid {
                parents.push((pid, ppid));
            }
        }
        let mut tree = vec![root];
        let mut i = 0;
        while let Some(&p) = tree.get(i) {
            tree.extend(parents.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
            i += 1;
        }
        let status = Command::new("kill")
            .arg(signal)
            .args(tree.iter().map(u32::to_string))
            .status()?;
        anyhow::ensure!(status.success(), "kill {signal} {tree:?}: {status}");
        Ok(())
    }

    /// The directory of the server's Unix socket.
    pub fn socket_dir(&self) -> &Path {
        self.dir.path()
    }

    /// A libpq connection string for `user` on database `postgres`.
    pub fn conninfo(&self, user: &str) -> String {
        format!(
            "host={} port={} user={user} dbname=postgres",
            self.socket_dir().display(),
            self.port()
        )
    }

    /// The same as a `postgresql://` URL (the socket directory percent-encoded as host).
    pub fn url(&self, user: &str) -> String {
        let host: String = self
            .socket_dir()
            .display()
            .to_string()
            .replace('%', "%25")
            .replace('/', "%2F");
        format!("postgresql://{user}@{host}:{}/postgres", self.port())
    }

    fn run<I, S>(&self, tool: &str, args: I) -> Result<()>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let program = self.bin.join(tool);
        let mut cmd = match &self.run_as {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(&program);
                c
            }
            None => Command::new(&program),
        };
        let out = cmd
            .args(args)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {}", program.display()))?;
        if !out.status.success() {
            bail!(
                "{tool} failed ({}):\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// A connection as the superuser; its I/O runs as a task on the current runtime.
    pub async fn client(&self) -> Result<tokio_postgres::Client> {
        let (client, connection) =
            tokio_postgres::connect(&self.conninfo(SUPERUSER), tokio_postgres::NoTls).await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "test postgres connection closed");
            }
        });
        Ok(client)
    }

    /// Runs `sql` (any number of statements) as the superuser.
    pub async fn execute(&self, sql: &str) -> Result<()> {
        self.client().await?.batch_execute(sql).await?;
        Ok(())
    }
}

impl Drop for TestPostgres {
    fn drop(&mut self) {
        let data = self.data_dir();
        let stopped = self.run(
            "pg_ctl",
            [
                OsStr::new("-D"),
                data.as_os_str(),
                OsStr::new("-m"),
                OsStr::new("immediate"),
                OsStr::new("-w"),
                OsStr::new("stop"),
            ],
        );
        if let Err(e) = stopped {
            tracing::warn!(error = %e, "stopping the test PostgreSQL server");
        }
    }
}
