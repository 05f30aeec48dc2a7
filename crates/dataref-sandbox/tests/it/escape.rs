//! Escape attempts from a pool job: real Python code in the real sandbox reaches for host
//! files, descriptors, privileges and the network, and tries to smuggle host files out
//! through `out/`. Each test asserts what the code saw and what the host got.

#![expect(
    clippy::disallowed_methods,
    reason = "the tests plant host files the sandbox must not reach, with raw std::fs"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, Permissions};
use std::io::{ErrorKind, Read};
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{SocketAddr, UnixListener};
use std::path::{Component, Path};

use dataref_sandbox::jail::JAIL_UID;
use dataref_sandbox::pool::PythonSandbox;
use dataref_sandbox::runtime::exchange::SkipReason;
use serde_json::json;

use crate::pool::{
    finished, home, job, printed_json, run, settings, wait_warm, warm_pool, write_table,
};

fn assert_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "the escape tests run as root, like CI, so the job drops to uid {JAIL_UID}"
    );
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, Permissions::from_mode(mode)).unwrap();
}

fn first_component(path: &Path) -> String {
    match path.components().nth(1) {
        Some(Component::Normal(name)) => name.to_string_lossy().into_owned(),
        other => panic!("{path:?}: {other:?}"),
    }
}

/// Python that reports, as one line of JSON, what the code can reach: `PATHS` is replaced by
/// `{"open": [...], "list": [...]}`.
const PROBE_PY: &str = r#"
import ctypes, errno, json, mmap, os
P = json.loads(r'''PATHS''')
def code(e):
    return errno.errorcode.get(e.errno, str(e.errno))
def try_open(path):
    try:
        with open(path, 'rb') as f:
            return 'READ ' + f.read(100).decode('utf-8', 'replace')
    except OSError as e:
        return code(e)
def try_list(path):
    try:
        return sorted(os.listdir(path))
    except OSError as e:
        return code(e)
fds = {}
for name in os.listdir('/proc/self/fd'):
    try:
        fds[name] = os.readlink('/proc/self/fd/' + name)
    except OSError as e:
        fds[name] = code(e)
# The input's map: asking for write access must fail, or writing must not reach the file.
mapping = None
libc = ctypes.CDLL(None, use_errno=True)
libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
with open('/proc/self/maps') as maps:
    for line in maps:
        fields = line.split()
        if fields[-1].endswith('escape-input.arrow'):
            lo, hi = (int(x, 16) for x in fields[0].split('-'))
            ctypes.set_errno(0)
            rc = libc.mprotect(lo, hi - lo, mmap.PROT_READ | mmap.PROT_WRITE)
            mapping = {'perms': fields[1], 'errno': errno.errorcode.get(ctypes.get_errno(), 'OK')}
            if rc == 0:
                ctypes.memset(lo, 0x58, 8)
            break
print(json.dumps({
    'rows': len(sales),
    'open': {p: try_open(p) for p in P['open']},
    'list': {p: try_list(p) for p in P['list']},
    'root': sorted(os.listdir('/')),
    'proc1_root': try_list('/proc/1/root'),
    'fds': fds,
    'mapping': mapping,
}))
"#;

#[test]
fn the_job_reaches_no_host_path_beyond_its_view() {
    assert_root();
    let pool = warm_pool();
    // Other jobs' directories exist under `<home>/jobs` while this one runs.
    wait_warm(pool, 1);
    // The input artifact, in a private directory beside the data.
    let private = tempfile::tempdir_in(home()).unwrap();
    let artifact = private.path().join("escape-input.arrow");
    let input = write_table(&artifact);
    let before = std::fs::read(&artifact).unwrap();
    // A secret anyone may read, in the data dir beside the runtime.
    let secret = tempfile::Builder::new()
        .prefix("escape-secret")
        .tempfile_in(home())
        .unwrap();
    std::fs::write(secret.path(), "TOP-SECRET-HOME").unwrap();
    chmod(secret.path(), 0o644);
    // Someone else's job directory, laid out like the pool's, open to anyone.
    let jobs = home().join("jobs");
    let other = tempfile::Builder::new()
        .prefix("escape-other-")
        .tempdir_in(&jobs)
        .unwrap();
    let other_files = other.path().join("out/files");
    std::fs::create_dir_all(&other_files).unwrap();
    std::fs::write(other_files.join("theirs.csv"), "TOP-SECRET-JOB").unwrap();
    for dir in [other.path(), &other.path().join("out"), &other_files] {
        chmod(dir, 0o755);
    }

    let mut open: Vec<String> = vec![
        artifact.display().to_string(),
        "/etc/shadow".to_owned(),
        "/etc/passwd".to_owned(),
        secret.path().display().to_string(),
        other_files.join("theirs.csv").display().to_string(),
        "/proc/1/root/etc/shadow".to_owned(),
        format!("/proc/1/root{}", secret.path().display()),
    ];
    for entry in std::fs::read_dir(&jobs).unwrap().flatten() {
        open.push(entry.path().join("in/code.py").display().to_string());
    }
    let list: Vec<String> = [home(), jobs.clone(), "/root".into(), "/home".into()]
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    let paths = json!({"open": open, "list": list}).to_string();
    let mut j = job(&PROBE_PY.replace("PATHS", &paths));
    j.inputs.push(("sales".to_owned(), input));
    let ran = run(pool, j);
    let report = printed_json(&ran);
    assert_eq!(report["rows"], 3, "the input was read from its descriptor");

    // Not even there: nothing of these is in the sandbox's view.
    for path in &open {
        assert_eq!(report["open"][path], "ENOENT", "{path}: {report}");
    }
    let home_key = home().display().to_string();
    for path in &list {
        let seen = &report["list"][path];
        // The data dir may appear as the mount point of the runtime, and only that.
        let allowed = *seen == json!("ENOENT") || (*path == home_key && *seen == json!(["python"]));
        assert!(allowed, "{path}: {seen}");
    }
    let runtime = pool.runtime(&|_| {}).unwrap();
    let mut expected_root: BTreeSet<String> = [
        "bin", "dev", "job", "lib", "lib32", "lib64", "libx32", "opt", "proc", "sbin", "tmp", "usr",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    for path in [home(), runtime.prefix, runtime.base_prefix] {
        expected_root.insert(first_component(&path));
    }
    let root: Vec<String> = serde_json::from_value(report["root"].clone()).unwrap();
    assert!(
        root.iter().all(|name| expected_root.contains(name)),
        "{root:?}"
    );
    assert_eq!(report["proc1_root"], report["root"]);

    // Standard streams and nothing else: no socket to the host, no descriptor of a file
    // outside the view (the listing's own descriptor is closed when it is read).
    let fds: BTreeMap<String, String> = serde_json::from_value(report["fds"].clone()).unwrap();
    for (fd, target) in &fds {
        let fine = match fd.as_str() {
            "0" => target == "/dev/null",
            "1" | "2" => target.starts_with("pipe:"),
            _ => target == "ENOENT" || target.starts_with("anon_inode:"),
        };
        assert!(fine, "fd {fd} -> {target}: {fds:?}");
    }

    let mapping = &report["mapping"];
    assert!(
        mapping["errno"] == "EACCES" || mapping["perms"].as_str().is_some_and(|p| p.ends_with('p')),
        "{mapping}"
    );
    assert_eq!(
        std::fs::read(&artifact).unwrap(),
        before,
        "the input was written to"
    );
}

#[test]
fn a_descriptor_the_server_inherited_does_not_reach_the_job() {
    assert_root();
    // A host directory anyone may read, held open without close-on-exec, as by a server
    // whose parent leaked it: through it the job could read past its mount namespace.
    let dir = tempfile::tempdir().unwrap();
    chmod(dir.path(), 0o755);
    std::fs::write(dir.path().join("secret.txt"), "TOP-SECRET-FD").unwrap();
    chmod(&dir.path().join("secret.txt"), 0o644);
    let held = File::open(dir.path()).unwrap();
    rustix::io::fcntl_setfd(&held, rustix::io::FdFlags::empty()).unwrap();
    let code = r#"
import errno, json, os
def read_secret(fd):
    try:
        f = os.open('secret.txt', os.O_RDONLY, dir_fd=fd)
        return os.read(f, 100).decode()
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
reached = []
for name in os.listdir('/proc/self/fd'):
    try:
        if 'secret.txt' in os.listdir(int(name)):
            reached.append(name)
    except OSError:
        pass
print(json.dumps({'held': read_secret(HELD_FD), 'reached': reached}))
"#
    .replace("HELD_FD", &held.as_raw_fd().to_string());
    // Cold: the sandbox starts while the descriptor is inheritable.
    let pool = PythonSandbox::new(settings(0));
    let ran = run(&pool, job(&code));
    drop(held);
    assert!(!ran.warm);
    assert_eq!(printed_json(&ran), json!({"held": "EBADF", "reached": []}));
}

#[test]
fn setuid_programs_do_not_raise_privileges() {
    assert_root();
    let setuid_root = [
        "/usr/bin/passwd",
        "/usr/bin/su",
        "/usr/bin/mount",
        "/usr/bin/umount",
        "/usr/bin/newgrp",
        "/usr/bin/chsh",
        "/usr/bin/chfn",
        "/usr/bin/gpasswd",
    ]
    .into_iter()
    .find(|p| std::fs::metadata(p).is_ok_and(|m| m.uid() == 0 && m.mode() & 0o4000 != 0))
    .unwrap_or_else(|| panic!("the host has no setuid-root program in /usr/bin to try"));
    // `LD_SHOW_AUXV` makes the loader print the ids the kernel gave the program; for a
    // program that did gain privileges the loader drops the variable and prints nothing.
    let code = r#"
import json, os, shutil, subprocess
def auxv(argv):
    out = subprocess.run(argv, env={'LD_SHOW_AUXV': '1', 'PATH': '/usr/bin:/bin'},
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=20).stdout
    lines = out.decode('utf-8', 'replace').splitlines()
    pairs = (line.split(':', 1) for line in lines if line.startswith('AT_'))
    return {k: v.strip() for k, v in pairs if k in ('AT_UID', 'AT_EUID', 'AT_GID', 'AT_EGID', 'AT_SECURE')}
shutil.copy('/usr/bin/id', '/tmp/id')
os.chmod('/tmp/id', 0o6755)
mounts = {}
with open('/proc/self/mountinfo') as f:
    for line in f:
        fields = line.split()
        mounts[fields[4]] = fields[5].split(',')
print(json.dumps({
    'setuid_root': auxv(['SETUID', '--help']),
    'tmp_copy': auxv(['/tmp/id']),
    'tmp_copy_mode': oct(os.stat('/tmp/id').st_mode & 0o7777),
    'nosuid': {m: 'nosuid' in mounts.get(m, []) for m in ['/tmp', '/dev/shm', '/job/out']},
}))
"#
    .replace("SETUID", setuid_root);
    let ran = run(warm_pool(), job(&code));
    let id = JAIL_UID.to_string();
    let unprivileged =
        json!({"AT_UID": id, "AT_EUID": id, "AT_GID": id, "AT_EGID": id, "AT_SECURE": "0"});
    assert_eq!(
        printed_json(&ran),
        json!({
            "setuid_root": unprivileged,
            "tmp_copy": unprivileged,
            "tmp_copy_mode": "0o6755",
            "nosuid": {"/tmp": true, "/dev/shm": true, "/job/out": true},
        }),
        "{setuid_root}"
    );
}

/// A link where `collect` expects a directory: opened with `O_DIRECTORY | O_NOFOLLOW`, which
/// the kernel refuses with `ENOTDIR` (so the reason reads "not a directory").
fn link_to_dir(reason: &SkipReason) -> bool {
    matches!(
        reason,
        SkipReason::Symlink | SkipReason::NotRegular("not a directory")
    )
}

#[test]
fn hostile_entries_in_out_are_skipped_and_never_followed() {
    let pool = warm_pool();
    let secret = tempfile::Builder::new()
        .prefix("escape-secret")
        .tempfile_in(home())
        .unwrap();
    std::fs::write(secret.path(), "TOP-SECRET-HOME").unwrap();
    chmod(secret.path(), 0o644);
    let code = r#"
import os, socket
F = 'out/files'
with open(f'{F}/ok.txt', 'w') as f:
    f.write('fine')
os.symlink('/etc/passwd', f'{F}/passwd')
os.symlink('SECRET', f'{F}/secret.txt')
os.symlink('/', f'{F}/host-root')
with open(f'{F}/h1.txt', 'w') as f:
    f.write('linked')
os.link(f'{F}/h1.txt', f'{F}/h2.txt')
os.mkfifo(f'{F}/fifo')
socket.socket(socket.AF_UNIX).bind(f'{F}/sock')
d = F
for level in range(1, 7):
    d = f'{d}/d{level}'
    os.mkdir(d)
    with open(f'{d}/x.txt', 'w') as f:
        f.write(str(level))
for name in ['a b', '..x', '.hidden', 'é.txt', 'new\nline']:
    with open(os.path.join(F, name), 'w') as f:
        f.write('odd')
with open(os.path.join(F.encode(), b'\xff\xfe'), 'w') as f:
    f.write('odd')
os.rmdir('out/outputs')
os.symlink('/', 'out/outputs')
"#
    .replace("SECRET", &secret.path().display().to_string());
    let ran = run(pool, job(&code));
    let result = finished(&ran);
    assert!(result.ok, "{:?}", result.error);
    let mut accepted = Vec::new();
    for file in &result.files {
        let mut text = String::new();
        (&file.file).read_to_string(&mut text).unwrap();
        assert!(
            !text.contains("root:") && !text.contains("TOP-SECRET"),
            "{}: {text}",
            file.rel
        );
        accepted.push(file.rel.as_str());
    }
    accepted.sort_unstable();
    assert_eq!(
        accepted,
        [
            "d1/d2/d3/d4/x.txt",
            "d1/d2/d3/x.txt",
            "d1/d2/x.txt",
            "d1/x.txt",
            "ok.txt"
        ]
    );
    let skipped: BTreeMap<&str, &SkipReason> = result
        .skipped
        .iter()
        .map(|s| (s.path.as_str(), &s.reason))
        .collect();
    let reason = |path: &str| {
        *skipped
            .get(path)
            .unwrap_or_else(|| panic!("{path:?} not skipped: {skipped:?}"))
    };
    for link in ["files/passwd", "files/secret.txt", "files/host-root"] {
        assert_eq!(reason(link), &SkipReason::Symlink, "{link}");
    }
    assert!(link_to_dir(reason("outputs")), "{:?}", reason("outputs"));
    assert_eq!(reason("files/h1.txt"), &SkipReason::HardLink);
    assert_eq!(reason("files/h2.txt"), &SkipReason::HardLink);
    assert_eq!(reason("files/fifo"), &SkipReason::NotRegular("a FIFO"));
    // Opening a socket file fails (ENXIO) before its type can be read.
    assert!(
        matches!(
            reason("files/sock"),
            SkipReason::NotRegular("a socket") | SkipReason::Unreadable(_)
        ),
        "{:?}",
        reason("files/sock")
    );
    for odd in [
        "files/a b",
        "files/..x",
        "files/.hidden",
        "files/é.txt",
        "files/new\nline",
        "files/\u{fffd}\u{fffd}",
    ] {
        assert_eq!(reason(odd), &SkipReason::BadName, "{odd:?}");
    }
    assert_eq!(reason("files/d1/d2/d3/d4/d5"), &SkipReason::TooDeep(4));
    assert_eq!(skipped.len(), 15, "{skipped:?}");

    // `out/files` itself swapped for a link to `/`: on the host that would be the host's root.
    let ran = run(
        pool,
        job("import os\nos.rename('out/files', 'out/old')\nos.symlink('/', 'out/files')\n"),
    );
    let result = finished(&ran);
    assert!(result.files.is_empty(), "{:?}", result.files);
    match &result.skipped[..] {
        [only] if only.path == "files" && link_to_dir(&only.reason) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_pool_job_has_no_network() {
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    tcp.set_nonblocking(true).unwrap();
    let port = tcp.local_addr().unwrap().port();
    // Abstract Unix sockets belong to the network namespace: a host one must be out of reach.
    let name = format!("dataref-escape-{}", std::process::id());
    let unix =
        UnixListener::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap()).unwrap();
    unix.set_nonblocking(true).unwrap();
    let code = r#"
import errno, json, socket
def failure(e):
    return type(e).__name__ + ' ' + errno.errorcode.get(e.errno, str(e.errno))
report = {}
for key, target in [('test_net', ('192.0.2.1', 80)), ('loopback', ('127.0.0.1', PORT))]:
    try:
        socket.create_connection(target, timeout=1).close()
        report[key] = 'CONNECTED'
    except OSError as e:
        report[key] = failure(e)
try:
    report['dns'] = 'RESOLVED ' + repr(socket.getaddrinfo('example.com', 80))
except OSError as e:
    report['dns'] = type(e).__name__
for key, family, kind, proto in [
    ('raw4', socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
    ('raw6', socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6),
    ('ping4', socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP),
    ('packet', socket.AF_PACKET, socket.SOCK_DGRAM, 0),
    ('netlink', socket.AF_NETLINK, socket.SOCK_DGRAM, 0),
    ('vsock', socket.AF_VSOCK, socket.SOCK_DGRAM, 0),
]:
    try:
        socket.socket(family, kind, proto).close()
        report[key] = 'OPEN'
    except OSError as e:
        report[key] = failure(e)
try:
    socket.socket(socket.AF_UNIX).connect('\0ABSTRACT')
    report['abstract'] = 'CONNECTED'
except OSError as e:
    report['abstract'] = failure(e)
print(json.dumps(report))
"#
    .replace("PORT", &port.to_string())
    .replace("ABSTRACT", &name);
    let ran = run(warm_pool(), job(&code));
    let refused = "PermissionError EPERM";
    let report = printed_json(&ran);
    assert_eq!(
        report,
        json!({
            "test_net": refused,
            "loopback": refused,
            "dns": "gaierror",
            "raw4": refused,
            "raw6": refused,
            "ping4": refused,
            "packet": refused,
            "netlink": refused,
            "vsock": refused,
            "abstract": "ConnectionRefusedError ECONNREFUSED",
        })
    );
    for accepted in [tcp.accept().map(drop), unix.accept().map(drop)] {
        match accepted {
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            other => panic!("a host listener saw a connection: {other:?}"),
        }
    }
}
