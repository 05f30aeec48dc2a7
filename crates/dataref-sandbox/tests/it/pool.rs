//! The warm pool end to end: the real runtime in the real jail, inputs passed by descriptor;
//! a sandbox serves one job, limits and cancellation end it, errors and files come back.

#![expect(
    clippy::disallowed_methods,
    reason = "the tests write input files beside the sandbox, with raw std::fs"
)]

use std::cell::Cell;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use arrow_array::{ArrayRef, Float64Array, RecordBatch, StringArray};
use arrow_ipc::writer::FileWriter;
use arrow_schema::{DataType, Field, Schema};
use dataref_sandbox::jail::{JobLimits, JobStatus};
use dataref_sandbox::pool::{PythonJob, PythonRun, PythonSandbox, SandboxSettings};
use dataref_sandbox::runtime::RuntimeSpec;
use dataref_sandbox::runtime::exchange::{ExchangeCaps, ExchangeError, JobResult};
use serde_json::{Value, json};

/// The same home as the runtime tests, so the runtime is provisioned once.
pub(crate) fn home() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dataref-runtime-home")
}

pub(crate) fn settings(pool_size: usize) -> SandboxSettings {
    SandboxSettings {
        home: home(),
        runtime: RuntimeSpec::Managed { base: None },
        pool_size,
        limits: JobLimits::default(),
        caps: ExchangeCaps::default(),
        cgroups: Default::default(),
        max_concurrent: 4,
    }
}

pub(crate) fn warm_pool() -> &'static PythonSandbox {
    static POOL: OnceLock<PythonSandbox> = OnceLock::new();
    POOL.get_or_init(|| {
        let pool = PythonSandbox::new(settings(2));
        pool.runtime(&|_| {}).unwrap();
        pool.prewarm();
        pool
    })
}

pub(crate) fn wait_warm(pool: &PythonSandbox, n: usize) {
    let until = Instant::now() + Duration::from_secs(60);
    while pool.warm_count() < n {
        assert!(Instant::now() < until, "the pool never filled");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub(crate) fn table_file(dir: &tempfile::TempDir) -> File {
    write_table(&dir.path().join("t.arrow"))
}

/// The table `line` = a, b, a; `revenue` = 1.5, 2.0, 3.0 as an Arrow IPC file at `path`.
pub(crate) fn write_table(path: &Path) -> File {
    let schema = Arc::new(Schema::new(vec![
        Field::new("line", DataType::Utf8, false),
        Field::new("revenue", DataType::Float64, false),
    ]));
    let line: ArrayRef = Arc::new(StringArray::from(vec!["a", "b", "a"]));
    let revenue: ArrayRef = Arc::new(Float64Array::from(vec![1.5, 2.0, 3.0]));
    let batch = RecordBatch::try_new(Arc::clone(&schema), vec![line, revenue]).unwrap();
    let mut w = FileWriter::try_new(File::create(path).unwrap(), &schema).unwrap();
    w.write(&batch).unwrap();
    w.finish().unwrap();
    File::open(path).unwrap()
}

pub(crate) fn job(code: &str) -> PythonJob {
    PythonJob {
        code: code.to_owned(),
        inputs: Vec::new(),
        files: Vec::new(),
        timeout: Duration::from_secs(30),
    }
}

pub(crate) fn run(pool: &PythonSandbox, job: PythonJob) -> PythonRun {
    pool.run(job, &|_| {}, &|| false).unwrap()
}

/// What the runner reported for a job that ended by itself.
pub(crate) fn finished(ran: &PythonRun) -> &JobResult {
    assert_eq!(
        ran.status,
        JobStatus::Exited(0),
        "stderr: {}",
        String::from_utf8_lossy(&ran.stderr.bytes)
    );
    match &ran.result {
        Some(Ok(result)) => result,
        other => panic!("{other:?}"),
    }
}

/// The one line of JSON the job printed (its report can outgrow the `result` cap).
pub(crate) fn printed_json(ran: &PythonRun) -> Value {
    let text = String::from_utf8_lossy(&ran.stdout.bytes);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "{e}: {text}\nstatus: {:?}\nstderr: {}\nresult: {:?}",
            ran.status,
            String::from_utf8_lossy(&ran.stderr.bytes),
            ran.result
        )
    })
}

/// A number no process has on its command line but the `sleep <marker>` a test's job starts.
pub(crate) fn marker(tag: u64) -> String {
    (7_000_000_000 + u64::from(std::process::id()) * 100 + tag).to_string()
}

/// Host processes (every pid namespace) whose command line contains `marker`.
pub(crate) fn host_processes(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if !entry
            .file_name()
            .to_string_lossy()
            .bytes()
            .all(|b| b.is_ascii_digit())
        {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(marker) {
            found.push(format!(
                "{}: {cmdline}",
                entry.file_name().to_string_lossy()
            ));
        }
    }
    found
}

#[test]
fn a_warm_job_reads_an_input_by_descriptor_and_stores_an_output() {
    let pool = warm_pool();
    wait_warm(pool, 1);
    // A private directory: the sandbox could not open the file by path.
    let dir = tempfile::tempdir().unwrap();
    let mut j = job("g = sales.groupby('line')['revenue'].sum()\n\
         result = {'a': g['a'], 'rows': len(sales)}\n\
         outputs['totals'] = g\n\
         print('hello')");
    j.inputs.push(("sales".to_owned(), table_file(&dir)));
    let ran = run(pool, j);
    assert!(ran.warm);
    assert_eq!(ran.status, JobStatus::Exited(0), "{:?}", ran.stderr);
    let result = ran.result.unwrap().unwrap();
    assert!(result.ok, "{:?}", result.error);
    assert_eq!(result.result, json!({"a": 4.5, "rows": 3}));
    assert_eq!(result.outputs.len(), 1);
    assert_eq!(result.outputs[0].rows, 2);
    assert_eq!(String::from_utf8_lossy(&ran.stdout.bytes), "hello\n");
}

/// Lists the `sleep` processes the job can see, by argument.
const SLEEPERS_PY: &str = r#"
import os
def sleepers():
    found = []
    for pid in os.listdir('/proc'):
        if not pid.isdigit():
            continue
        try:
            with open(f'/proc/{pid}/cmdline', 'rb') as f:
                argv = f.read().split(b'\0')
        except OSError:
            continue
        if argv[0] == b'sleep':
            found.append(argv[1].decode())
    return sorted(found)
"#;

#[test]
fn the_next_warm_sandbox_keeps_nothing_of_the_job_before() {
    let pool = PythonSandbox::new(settings(1));
    pool.runtime(&|_| {}).unwrap();
    pool.prewarm();
    wait_warm(&pool, 1);
    let (child, daemon) = (marker(1), marker(2));
    let a = format!(
        "{SLEEPERS_PY}{}",
        r#"
import subprocess, sys, time, types
with open('/tmp/left-by-a', 'w') as f:
    f.write('a')
with open('/dev/shm/left-by-a', 'w') as f:
    f.write('a')
with open('out/files/left-by-a.txt', 'w') as f:
    f.write('a')
os.environ['LEFT_BY_A'] = '1'
pd.DataFrame.sum = lambda self, *args, **kwargs: 'patched'
sys.modules['left_by_a'] = types.ModuleType('left_by_a')
child = subprocess.Popen(['sleep', 'CHILD'])
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execvp('sleep', ['sleep', 'DAEMON'])
    os._exit(0)
os.wait()
for _ in range(200):
    if len(sleepers()) == 2:
        break
    time.sleep(0.01)
result = {
    'sum': pd.DataFrame({'a': [1, 2]}).sum(),
    'child_running': child.poll() is None,
    'sleepers': sleepers(),
}
"#
        .replace("CHILD", &child)
        .replace("DAEMON", &daemon)
    );
    let ran_a = run(&pool, job(&a));
    assert!(ran_a.warm);
    let result_a = finished(&ran_a);
    assert!(result_a.ok, "{:?}", result_a.error);
    // A's changes took effect, so B not seeing them means something.
    assert_eq!(
        result_a.result,
        json!({"sum": "patched", "child_running": true, "sleepers": [child, daemon]})
    );
    assert_eq!(result_a.files.len(), 1);
    // The child and the daemon that left its session died with A's sandbox.
    assert_eq!(host_processes(&child), Vec::<String>::new());
    assert_eq!(host_processes(&daemon), Vec::<String>::new());

    wait_warm(&pool, 1);
    let b = format!(
        "{SLEEPERS_PY}{}",
        r#"
import sys
result = {
    'tmp': sorted(os.listdir('/tmp')),
    'shm': sorted(os.listdir('/dev/shm')),
    'out': sorted(os.listdir('out/files')),
    'env': os.environ.get('LEFT_BY_A'),
    'module': 'left_by_a' in sys.modules,
    'sum': int(pd.DataFrame({'a': [1, 2]}).sum()['a']),
    'sleepers': sleepers(),
}
"#
    );
    let ran_b = run(&pool, job(&b));
    assert!(ran_b.warm);
    let result_b = finished(&ran_b);
    assert!(result_b.ok, "{:?}", result_b.error);
    assert_eq!(
        result_b.result,
        json!({"tmp": [], "shm": [], "out": [], "env": null, "module": false, "sum": 3, "sleepers": []})
    );
}

#[test]
fn without_a_pool_every_job_starts_cold() {
    let pool = PythonSandbox::new(settings(0));
    pool.prewarm();
    let dir = tempfile::tempdir().unwrap();
    let mut j = job("result = {'total': float(sales['revenue'].sum()), 'rows': len(sales)}");
    j.inputs.push(("sales".to_owned(), table_file(&dir)));
    let ran = run(&pool, j);
    assert!(!ran.warm);
    let result = finished(&ran);
    assert!(result.ok, "{:?}", result.error);
    assert_eq!(result.result, json!({"total": 6.5, "rows": 3}));
    assert_eq!(pool.warm_count(), 0);
}

#[test]
fn a_busy_loop_times_out_and_leaves_nothing_running() {
    let pool = warm_pool();
    // A sandbox joins the pool before its runner has imported pandas, and the rest of that
    // import counts against the job's 2 s: on a busy host the loop may not start in time.
    // Such a run shows nothing about what a job leaves behind, so it is tried again.
    for attempt in 0..3 {
        let mark = marker(10 + attempt);
        let mut j = job(&"import subprocess\n\
             subprocess.Popen(['sleep', 'MARK'])\n\
             print('started', flush=True)\n\
             while True:\n    pass\n"
            .replace("MARK", &mark));
        j.timeout = Duration::from_secs(2);
        let seen = Cell::new(false);
        let watch = || {
            if !seen.get() && !host_processes(&mark).is_empty() {
                seen.set(true);
            }
            false
        };
        let ran = pool.run(j, &|_| {}, &watch).unwrap();
        assert_eq!(ran.status, JobStatus::TimedOut);
        assert!(ran.result.is_none());
        assert!(
            ran.duration >= Duration::from_secs(2) && ran.duration < Duration::from_secs(6),
            "{:?}",
            ran.duration
        );
        assert_eq!(host_processes(&mark), Vec::<String>::new());
        if seen.get() {
            assert_eq!(String::from_utf8_lossy(&ran.stdout.bytes), "started\n");
            return;
        }
    }
    panic!("the loop never started within the job's 2 s, three times over");
}

#[test]
fn a_memory_bomb_ends_at_the_memory_limit() {
    let pool = PythonSandbox::new(SandboxSettings {
        limits: JobLimits {
            memory_bytes: 512 << 20,
            ..JobLimits::default()
        },
        ..settings(0)
    });
    let ran = run(
        &pool,
        job("chunks = []\nwhile True:\n    chunks.append(b'x' * (64 << 20))\n"),
    );
    assert_eq!(
        ran.status,
        JobStatus::MemoryLimit,
        "{}",
        String::from_utf8_lossy(&ran.stderr.bytes)
    );
    assert!(ran.result.is_none());
}

#[test]
fn cancelling_stops_the_job_at_once() {
    let pool = warm_pool();
    let mark = marker(4);
    let code = "import subprocess, time\n\
         subprocess.Popen(['sleep', 'MARK'])\n\
         time.sleep(600)\n"
        .replace("MARK", &mark);
    // Cancel 300 ms after the job's child shows up on the host (or after 30 s, when it
    // never does and the test fails below).
    let polled = Instant::now();
    let seen: Cell<Option<Instant>> = Cell::new(None);
    let cancelled_at: Cell<Option<Instant>> = Cell::new(None);
    let cancel = || {
        if seen.get().is_none() && !host_processes(&mark).is_empty() {
            seen.set(Some(Instant::now()));
        }
        let due = seen
            .get()
            .is_some_and(|t| t.elapsed() > Duration::from_millis(300))
            || polled.elapsed() > Duration::from_secs(30);
        if due && cancelled_at.get().is_none() {
            cancelled_at.set(Some(Instant::now()));
        }
        due
    };
    let ran = pool.run(job(&code), &|_| {}, &cancel).unwrap();
    let returned = Instant::now();
    assert!(seen.get().is_some(), "the job's child never ran");
    assert_eq!(ran.status, JobStatus::Cancelled);
    assert!(ran.result.is_none());
    let after_cancel = returned - cancelled_at.get().unwrap();
    assert!(after_cancel < Duration::from_secs(2), "{after_cancel:?}");
    assert_eq!(host_processes(&mark), Vec::<String>::new());
}

#[test]
fn an_exception_reports_type_message_and_the_code_lines() {
    let ran = run(
        warm_pool(),
        job("print('before')\nx = 1\n\ndef f(d):\n    return d / 0\n\ny = f(x)\n"),
    );
    let result = finished(&ran);
    assert!(!result.ok);
    assert_eq!(result.result, Value::Null);
    let error = result.error.as_ref().unwrap();
    assert_eq!(error.kind, "ZeroDivisionError");
    assert_eq!(error.message, "division by zero");
    let lines: Vec<(u32, &str)> = error
        .traceback
        .iter()
        .map(|f| (f.line, f.code.as_str()))
        .collect();
    assert_eq!(lines, [(7, "y = f(x)"), (5, "return d / 0")]);
    assert_eq!(String::from_utf8_lossy(&ran.stdout.bytes), "before\n");
}

#[test]
fn a_result_over_the_cap_is_refused_by_the_runner_and_again_on_the_host() {
    let pool = warm_pool();
    let too_large = |ran: &PythonRun, bytes: &str| {
        let result = finished(ran);
        assert!(!result.ok);
        assert_eq!(result.result, Value::Null);
        let error = result.error.as_ref().unwrap();
        assert_eq!(error.kind, "ResultTooLarge");
        assert!(error.message.contains(bytes), "{}", error.message);
    };
    too_large(
        &run(pool, job("result = {'big': 'x' * 5000}")),
        "5010 bytes",
    );

    // The code shares the runner's process: it can rewrite `result.json` after the runner
    // (a finalizer runs when the runner drops the code's globals, before it exits). The host
    // checks the cap again...
    let forged = run(
        pool,
        job("import json\n\
             class Forge:\n    \
                 def __del__(self, json=json, open=open):\n        \
                     with open('/job/out/result.json', 'w') as f:\n            \
                         json.dump({'ok': True, 'result': 'x' * 10000, 'outputs': []}, f)\n\
             forge = Forge()\n\
             result = 1\n"),
    );
    too_large(&forged, "10002 bytes");

    // ...and does not follow a `result.json` turned into a link to a host file.
    let linked = run(
        pool,
        job("import os\n\
             class Forge:\n    \
                 def __del__(self, os=os):\n        \
                     os.remove('/job/out/result.json')\n        \
                     os.symlink('/etc/shadow', '/job/out/result.json')\n\
             forge = Forge()\n\
             result = 1\n"),
    );
    assert_eq!(linked.status, JobStatus::Exited(0));
    match &linked.result {
        Some(Err(ExchangeError::BadResult { reason })) => {
            assert!(!reason.contains("root:"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn files_go_in_under_in_files_and_come_back_from_out_files() {
    let pool = warm_pool();
    let private = tempfile::tempdir().unwrap();
    let csv = private.path().join("x.csv");
    std::fs::write(&csv, "line,revenue\na,1.5\nb,2.0\na,3.0\n").unwrap();
    let mut j = job(r#"
import errno, os
df = pd.read_csv('in/files/data/x.csv')
os.makedirs('out/files/charts')
with open('out/files/report.txt', 'w') as f:
    f.write(f"total={df['revenue'].sum()}")
df.groupby('line')['revenue'].sum().to_csv('out/files/charts/by_line.csv')
try:
    open('in/files/data/x.csv', 'a').close()
    in_files = 'WRITABLE'
except OSError as e:
    in_files = errno.errorcode[e.errno]
result = {'rows': len(df), 'in_files': in_files, 'listing': sorted(os.listdir('in/files/data'))}
"#);
    j.files
        .push(("data/x.csv".to_owned(), File::open(&csv).unwrap()));
    let ran = run(pool, j);
    let result = finished(&ran);
    assert!(result.ok, "{:?}", result.error);
    assert_eq!(result.result["rows"], 3);
    assert_eq!(result.result["listing"], json!(["x.csv"]));
    assert!(
        ["EROFS", "EACCES"].contains(&result.result["in_files"].as_str().unwrap()),
        "{}",
        result.result
    );
    let mut files: Vec<(&str, String)> = result
        .files
        .iter()
        .map(|f| {
            let mut text = String::new();
            (&f.file).read_to_string(&mut text).unwrap();
            assert_eq!(f.bytes, text.len() as u64);
            (f.rel.as_str(), text)
        })
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            (
                "charts/by_line.csv",
                "line,revenue\na,4.5\nb,2.0\n".to_owned()
            ),
            ("report.txt", "total=6.5".to_owned()),
        ]
    );
    assert!(result.skipped.is_empty(), "{:?}", result.skipped);
    // The files live on the run's `out/` tmpfs, never on the host's disk (its path names
    // only the mount point); they are read through the descriptors collected with them,
    // and go with the run.
    let path = result.files[0].path.clone();
    assert!(
        path.starts_with(home().join("jobs")) && !path.exists(),
        "{path:?}"
    );
    drop(ran);
}

#[test]
fn a_job_sent_right_after_start_is_served_by_the_warm_sandbox_the_pool_is_starting() {
    // The runtime is installed, as on a server's second start.
    PythonSandbox::new(settings(0)).runtime(&|_| {}).unwrap();
    let pool = PythonSandbox::new(settings(2));
    pool.prewarm();
    // Before any job, and at once: a warm sandbox is on its way.
    let status = pool.status();
    assert!(status.filling || status.ready > 0, "{status:?}");
    assert_eq!((status.warm_runs, status.cold_runs), (0, 0));
    // Sent before the sandbox can have imported pandas: it waits for that one rather than
    // starting a cold sandbox of its own behind it.
    let dir = tempfile::tempdir().unwrap();
    let mut j = job("result = {'total': float(sales['revenue'].sum())}");
    j.inputs.push(("sales".to_owned(), table_file(&dir)));
    let ran = run(&pool, j);
    assert!(ran.warm);
    assert_eq!(finished(&ran).result, json!({"total": 6.5}));
    let status = pool.status();
    assert_eq!((status.warm_runs, status.cold_runs), (1, 0), "{status:?}");
    // The refill after it: the pool fills to its size and then stops.
    assert!(pool.wait_warm(Duration::from_secs(60)));
    wait_warm(&pool, 2);
    while pool.status().filling {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(pool.warm_count(), 2);
}

#[test]
fn when_no_warm_sandbox_can_come_a_job_does_not_wait_for_one() {
    // An interpreter that is not there: the pool's fill ends without a sandbox.
    let pool = PythonSandbox::new(SandboxSettings {
        runtime: RuntimeSpec::Interpreter(PathBuf::from("/nonexistent/python3")),
        ..settings(2)
    });
    pool.prewarm();
    assert!(!pool.wait_warm(Duration::from_secs(60)));
    assert!(!pool.status().filling);
    let err = pool.run(job("result = 1"), &|_| {}, &|| false).unwrap_err();
    assert!(
        matches!(err, dataref_sandbox::pool::SandboxError::Runtime(_)),
        "{err}"
    );
}

/// `(ppid, pgrp)` of process `pid`, from `/proc/PID/stat` (after the command's closing paren).
fn parent_and_group(pid: u32) -> Option<(u32, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace().skip(1);
    Some((fields.next()?.parse().ok()?, fields.next()?.parse().ok()?))
}

#[test]
fn a_warm_sandbox_is_out_of_reach_of_the_terminals_ctrl_c() {
    // Ctrl-C in a terminal signals its whole foreground process group; `dataref chat` is in
    // it, and a warm sandbox in the same group died of it (and said so into the chat).
    let pool = warm_pool();
    wait_warm(pool, 1);
    let me = std::process::id();
    let (_, our_group) = parent_and_group(me).unwrap();
    let sandboxes: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "bwrap")
        })
        .filter_map(|pid| Some((pid, parent_and_group(pid)?)))
        .filter(|(_, (ppid, _))| *ppid == me)
        .map(|(pid, (_, group))| (pid, group))
        .collect();
    assert!(
        !sandboxes.is_empty(),
        "no warm sandbox found among our children"
    );
    for (pid, group) in sandboxes {
        assert_ne!(group, our_group, "sandbox {pid} is in our process group");
        assert_eq!(group, pid, "sandbox {pid} leads a group of its own");
    }
}
