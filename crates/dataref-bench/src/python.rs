//! `dataref bench`'s `run_python` section: what a call costs, with the sandbox the server
//! builds from its `[python]` defaults (warm pool, jail, inputs passed by descriptor).
//!
//! - The trivial script (`result = 1`) from the warm pool and cold (no pool): the fixed cost.
//! - The seed's quarter-over-quarter pivot on the fetched sample, end to end, against the
//!   same code on the same Arrow file in a plain interpreter (pandas in-process, the floor)
//!   and against the seed's hand-off (the table written as Parquet, a new interpreter that
//!   reads it, runs the code and writes its outputs as Parquet, read back).
//! - The server's peak RSS around the pivots: the sandbox's memory is its own process's,
//!   so the server's must not grow with the input.
//!
//! Everything runs in one worker process (`bench-worker python`), so the peak RSS is the
//! worker's own and the store's artifact outlives the measurements.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use clap::Args;
use dataref_config::Config;
use dataref_sandbox::jail::{CpuLimit, JobStatus};
use dataref_sandbox::pool::{PythonJob, PythonRun, PythonSandbox, SandboxSettings};
use dataref_store::ArtifactStore;
use serde_json::{Value, json};

use super::{BenchArgs, Fetched, f, fetch_sample, group, mb, peak_rss_bytes, run_json};

/// The seed article's `run_python` call, verbatim.
const PIVOT_CODE: &str = r#"q = sales.assign(q=sales.date.dt.to_period("Q"))
pivot = q.pivot_table(index="line", columns="q", values="revenue", aggfunc="sum")
delta = (pivot.iloc[:, -1] - pivot.iloc[:, -2]).sort_values()
outputs["qoq"] = delta.rename("delta").reset_index()
result = delta.head(5).round(2).to_dict()
"#;

const TRIVIAL_CODE: &str = "result = 1";

const JOB_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a sandbox may take to start and import pandas before the bench gives up.
const WARM_PATIENCE: Duration = Duration::from_secs(120);

/// The pandas floor: the runner's load (map the Arrow file, `to_pandas` as the runner calls
/// it) and the code, in a plain interpreter with the imports done. Times load + compute.
const IN_PROCESS_SCRIPT: &str = r#"
import json, os, sys, time
path, code, cpus = sys.argv[1], sys.argv[2], int(sys.argv[3])
if cpus:
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:cpus])
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.ipc
t = time.perf_counter()
source = pa.memory_map(path, "r")
sales = pa.ipc.open_file(source).read_all().to_pandas(date_as_object=False)
g = {"__name__": "__main__", "pd": pd, "np": np, "sales": sales, "outputs": {}, "result": None}
exec(compile(code, "<code>", "exec"), g)
secs = time.perf_counter() - t
print(json.dumps({"secs": secs, "out_rows": len(g["outputs"]["qoq"]),
                  "pandas": pd.__version__, "pyarrow": pa.__version__,
                  "python": sys.version.split()[0]}))
"#;

/// The seed's `run_python`: its store holds DataFrames, so the table is loaded untimed; then
/// (timed) `to_parquet` into the job's `in/`, a new interpreter that loads every
/// `in/*.parquet`, runs the code and writes `outputs` as Parquet, and the outputs read back.
const SEED_SCRIPT: &str = r#"
import json, os, subprocess, sys, time
path, code, work, cpus = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
if cpus:
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:cpus])
import pandas as pd
import pyarrow as pa
import pyarrow.ipc
CHILD = '''
import json, os, sys
import numpy as np
import pandas as pd
in_dir, out_dir, code = sys.argv[1], sys.argv[2], sys.argv[3]
g = {"__name__": "__main__", "pd": pd, "np": np, "outputs": {}, "result": None}
for name in sorted(os.listdir(in_dir)):
    if name.endswith(".parquet"):
        g[name[:-8]] = pd.read_parquet(os.path.join(in_dir, name))
exec(compile(code, "<code>", "exec"), g)
for name, df in g["outputs"].items():
    df.to_parquet(os.path.join(out_dir, name + ".parquet"))
with open(os.path.join(out_dir, "result.json"), "w") as f:
    json.dump(g["result"], f)
'''
df = pa.ipc.open_file(pa.memory_map(path, "r")).read_all().to_pandas(date_as_object=False)
in_dir, out_dir = os.path.join(work, "in"), os.path.join(work, "out")
os.makedirs(in_dir)
os.makedirs(out_dir)
t0 = time.perf_counter()
df.to_parquet(os.path.join(in_dir, "sales.parquet"))
t1 = time.perf_counter()
subprocess.run([sys.executable, "-c", CHILD, in_dir, out_dir, code], check=True)
t2 = time.perf_counter()
new = {p[:-8]: pd.read_parquet(os.path.join(out_dir, p))
       for p in os.listdir(out_dir) if p.endswith(".parquet")}
t3 = time.perf_counter()
print(json.dumps({"secs": t3 - t0, "write_secs": t1 - t0, "child_secs": t2 - t1,
                  "read_back_secs": t3 - t2, "out_rows": len(new["qoq"])}))
"#;

#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// Where the sample databases are; the store is made here too.
    #[arg(long)]
    dir: PathBuf,
    /// The data dir whose runtime (`python/`) and job dirs (`jobs/`) the sandbox uses.
    #[arg(long)]
    home: PathBuf,
    #[arg(long)]
    rows: u64,
    #[arg(long)]
    runs: usize,
    #[arg(long)]
    pivot_runs: usize,
    /// An interpreter with pandas and pyarrow for the baselines; without it they are skipped.
    #[arg(long)]
    python: Option<String>,
}

/// Runs the worker and prints the section's tables.
pub(super) fn section(
    args: &BenchArgs,
    dir: &Path,
    home: &Path,
    exe: &Path,
    pandas: Option<&str>,
    out: &mut impl Write,
) -> Result<()> {
    let n = args.python_rows;
    dataref_app::ensure_sample(&Config::builtin_sample(dir.to_path_buf(), n))?;
    let baseline = pandas.is_some() && pyarrow_available(&args.python);
    if pandas.is_some() && !baseline {
        dataref_app::progress_line(&format!(
            "pyarrow is not importable by `{}`; the run_python baselines are skipped\nhint: `scripts/bench` installs it",
            args.python
        ));
    }
    dataref_app::progress_line(&format!(
        "measuring run_python ({} trivial runs warm and cold, {} pivots of {n} rows)…",
        args.python_runs, args.pivot_runs
    ));
    let mut cmd = Command::new(exe);
    cmd.args(["bench-worker", "python", "--rows", &n.to_string()])
        .args(["--runs", &args.python_runs.to_string()])
        .args(["--pivot-runs", &args.pivot_runs.to_string()])
        .arg("--dir")
        .arg(dir)
        .arg("--home")
        .arg(home);
    if baseline {
        cmd.arg("--python").arg(&args.python);
    }
    // The worker's progress (a first run installs the Python runtime) shows as it happens.
    cmd.stderr(Stdio::inherit());
    let v = run_json(&mut cmd)?;
    report(&v, n, out)
}

fn report(v: &Value, n: u64, out: &mut impl Write) -> Result<()> {
    let series = |k: &str| -> Vec<f64> {
        v.get(k)
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_f64).collect())
            .unwrap_or_default()
    };
    let text = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("?").to_owned();
    let p50 = |k: &str| percentile(&series(k), 0.5);
    let rows = group(n);
    writeln!(
        out,
        "\nrun_python, with the server's `[python]` defaults (jailed, {} CPU and {} MiB per run, inputs passed by descriptor), timed end to end around `PythonSandbox::run` (the input opened as `run_python` does); Python {}",
        text("cpus"),
        f(v, "memory_bytes") / f64::from(1 << 20),
        text("runtime_python"),
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "| run_python | rows | p50 | p95 | runs | p50 hand-off → sandbox gone | p50 runner (`go` → result written) |"
    )?;
    writeln!(out, "|---|---:|---:|---:|---:|---:|---:|")?;
    for (label, key, rows) in [
        (
            format!("`{TRIVIAL_CODE}`, warm (pool of {})", f(v, "pool_size")),
            "trivial_warm",
            "–",
        ),
        (
            format!("`{TRIVIAL_CODE}`, cold (pool of 0)"),
            "trivial_cold",
            "–",
        ),
        ("QoQ pivot, warm".to_owned(), "pivot_warm", rows.as_str()),
        ("QoQ pivot, cold".to_owned(), "pivot_cold", rows.as_str()),
    ] {
        let s = series(key);
        writeln!(
            out,
            "| {label} | {rows} | {} | {} | {} | {} | {} |",
            secs(percentile(&s, 0.50)),
            secs(percentile(&s, 0.95)),
            s.len(),
            secs(p50(&format!("{key}_handoff"))),
            secs(p50(&format!("{key}_runner"))),
        )?;
    }

    let ours = p50("pivot_warm");
    let in_process = p50("in_process");
    writeln!(out)?;
    if let Some(b) = v.get("baseline") {
        let version = |k: &str| b.get(k).and_then(Value::as_str).unwrap_or("?").to_owned();
        writeln!(
            out,
            "The seed's QoQ pivot (`pivot_table` line × quarter, last-quarter delta into `outputs`), median of {} runs each, interleaved; baselines in Python {}, pandas {}, pyarrow {}, held to {} CPU like the sandbox:",
            series("pivot_warm").len(),
            version("python"),
            version("pandas"),
            version("pyarrow"),
            f(v, "baseline_cpus"),
        )?;
        writeln!(out)?;
        writeln!(
            out,
            "| QoQ pivot | rows | dataref run_python (warm) | pandas in-process (load + compute) | seed path (Parquet write + new interpreter + read back) | dataref ÷ pandas | seed ÷ dataref |"
        )?;
        writeln!(out, "|---|---:|---:|---:|---:|---:|---:|")?;
        let seed = p50("seed");
        writeln!(
            out,
            "| end to end | {rows} | {} | {} | {} ({} + {} + {}) | {:.2}× | {:.1}× |",
            secs(ours),
            secs(in_process),
            secs(seed),
            secs(p50("seed_write")),
            secs(p50("seed_child")),
            secs(p50("seed_read_back")),
            ours / in_process,
            seed / ours,
        )?;
    } else {
        writeln!(
            out,
            "QoQ pivot: no pandas baselines (pass `--python` with pandas and pyarrow)"
        )?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "| server peak RSS (VmHWM) | before the pivots | after a pivot, input opened as a file | after {} more, input opened with `open_file` as `run_python` does |",
        series("pivot_warm").len() + series("pivot_cold").len(),
    )?;
    writeln!(out, "|---|---:|---:|---:|")?;
    writeln!(
        out,
        "| bench worker, {rows} rows ({} artifact) | {} | {} | {} |",
        mb(f(v, "artifact_bytes")),
        mb(f(v, "peak_rss_before")),
        mb(f(v, "peak_rss_file_input")),
        mb(f(v, "peak_rss_after")),
    )?;
    writeln!(
        out,
        "\nThe server never maps the input (`open_file`: the owner check, then a descriptor for the sandbox); mapping and validating it with `open_table` would take {} and add its pages to the server's RSS.",
        secs(f(v, "open_table_secs")),
    )?;
    writeln!(
        out,
        "goals: warm `result = 1` p50 under 60 ms ({}); the pivot within 1.5× of pandas in-process ({}); the server's peak RSS flat across the pivots",
        {
            let warm = p50("trivial_warm");
            if warm < 0.060 {
                format!("met, {}", secs(warm))
            } else {
                format!("not met, {}", secs(warm))
            }
        },
        if in_process.is_nan() {
            "no baseline".to_owned()
        } else if ours <= 1.5 * in_process {
            format!("met, {:.2}×", ours / in_process)
        } else {
            format!("not met, {:.2}×", ours / in_process)
        },
    )?;
    Ok(())
}

fn secs(s: f64) -> String {
    if s.is_nan() {
        "–".into()
    } else if s < 1.0 {
        format!("{:.0} ms", s * 1e3)
    } else {
        format!("{s:.2} s")
    }
}

/// Nearest-rank percentile; NaN for no samples.
fn percentile(samples: &[f64], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = (p * s.len() as f64).ceil() as usize;
    s[rank.clamp(1, s.len()) - 1]
}

fn pyarrow_available(python: &str) -> bool {
    Command::new(python)
        .args(["-c", "import pandas, pyarrow"])
        .output()
        .is_ok_and(|o| o.status.success())
}

pub(super) fn worker(args: &WorkerArgs) -> Result<Value> {
    let progress = |s: &str| dataref_app::progress_line(s);
    check_home(&args.home)?;
    // The sandbox `serve` would build from the built-in config, over `home`.
    let server =
        dataref_builtins::sandbox_settings(&Config::builtin_sample(args.home.clone(), args.rows));
    let with_pool = |pool_size| SandboxSettings {
        pool_size,
        ..server.clone()
    };
    let pool_size = server.pool_size.max(1);
    // The baselines get the CPUs the sandbox gets (pyarrow's `to_pandas` is multi-threaded).
    let (cpus, baseline_cpus) = match server.limits.cpu {
        CpuLimit::Cores(c) => (format!("{c}"), c.ceil() as usize),
        CpuLimit::Unlimited => ("unlimited".to_owned(), 0),
    };
    let fetched = fetch_sample(&args.dir, args.rows)?;
    let input = Input::new(&fetched)?;
    let mut out = json!({
        "rows": fetched.meta.rows,
        "artifact_bytes": fetched.meta.bytes,
        "fetch_secs": fetched.secs,
        "pool_size": pool_size,
        "cpus": cpus,
        "memory_bytes": server.limits.memory_bytes,
        "baseline_cpus": baseline_cpus,
    });

    let warm = PythonSandbox::new(with_pool(pool_size));
    let runtime = warm.runtime(&progress).map_err(sandbox_error)?;
    out["runtime_python"] = json!(runtime.versions.python);
    // Untimed: an empty pool takes the cold path, so a sandbox that cannot start says why
    // here rather than as a pool that never fills.
    let (_, ran) = timed_run(&warm, TRIVIAL_CODE, None)?;
    check(&ran, ran.warm)?;
    let mut series = Series::default();
    for _ in 0..args.runs {
        wait_warm(&warm, pool_size)?;
        let (t, ran) = timed_run(&warm, TRIVIAL_CODE, None)?;
        check(&ran, true)?;
        series.push(t, &ran);
    }
    series.store("trivial_warm", &mut out);

    // From here on the server holds the store's index, the sandbox's bookkeeping and what
    // each call opens: the high-water mark starts again at what it holds now.
    out["peak_rss_reset"] = json!(reset_peak_rss());
    out["peak_rss_before"] = json!(peak_rss_bytes());
    wait_warm(&warm, pool_size)?;
    let (_, ran) = timed_run(&warm, PIVOT_CODE, Some(InputOpen::File(&input)))?;
    check(&ran, true)?;
    out["peak_rss_file_input"] = json!(peak_rss_bytes());
    let mut series = Series::default();
    let mut baseline = Baseline::default();
    for i in 0..args.pivot_runs {
        wait_warm(&warm, pool_size)?;
        let (t, ran) = timed_run(&warm, PIVOT_CODE, Some(InputOpen::Table(&input)))?;
        check(&ran, true)?;
        series.push(t, &ran);
        out["pivot_result"] = ran
            .result
            .as_ref()
            .and_then(|r| r.as_ref().ok())
            .map_or(Value::Null, |r| r.result.clone());
        // Interleaved with dataref's runs, so that load from elsewhere hits all three alike.
        if let Some(python) = &args.python {
            wait_warm(&warm, pool_size)?;
            baseline.run(python, &input, baseline_cpus, i)?;
        }
    }
    series.store("pivot_warm", &mut out);
    drop(warm);

    let cold = PythonSandbox::new(with_pool(0));
    for (key, code, input, runs) in [
        ("trivial_cold", TRIVIAL_CODE, None, args.runs),
        (
            "pivot_cold",
            PIVOT_CODE,
            Some(InputOpen::Table(&input)),
            args.pivot_runs,
        ),
    ] {
        let mut series = Series::default();
        for _ in 0..runs {
            let (t, ran) = timed_run(&cold, code, input)?;
            check(&ran, false)?;
            series.push(t, &ran);
        }
        series.store(key, &mut out);
    }
    drop(cold);
    out["peak_rss_after"] = json!(peak_rss_bytes());

    let t = Instant::now();
    drop(
        fetched
            .store
            .open_table(&fetched.owner, &fetched.meta.data_ref)?,
    );
    out["open_table_secs"] = json!(t.elapsed().as_secs_f64());

    if args.python.is_some() {
        baseline.store(&mut out);
    }
    Ok(out)
}

/// The pivot's input: the artifact and its path, found once.
struct Input<'a> {
    fetched: &'a Fetched,
    path: PathBuf,
}

impl<'a> Input<'a> {
    fn new(fetched: &'a Fetched) -> Result<Self> {
        // `map_table` decodes nothing, so the `open_table` timed at the end still maps
        // and validates every column.
        let path = fetched
            .store
            .map_table(&fetched.owner, &fetched.meta.data_ref)?
            .path;
        Ok(Input { fetched, path })
    }
}

/// How a call opens its input for the sandbox.
#[derive(Clone, Copy)]
enum InputOpen<'a> {
    /// As `run_python` does: `open_file` (the owner check, then the file; nothing mapped).
    Table(&'a Input<'a>),
    /// The least a call needs: the owner check (`meta`), then the file.
    File(&'a Input<'a>),
}

impl InputOpen<'_> {
    fn open(self) -> Result<File> {
        let path = match self {
            InputOpen::Table(input) => {
                let f = input.fetched;
                return Ok(f.store.open_file(&f.owner, &f.meta.data_ref)?);
            }
            InputOpen::File(input) => {
                let f = input.fetched;
                f.store.meta(&f.owner, &f.meta.data_ref)?;
                input.path.clone()
            }
        };
        File::open(&path).with_context(|| format!("opening `{}`", path.display()))
    }
}

/// The pandas baselines' timings, one run of each at a time.
#[derive(Default)]
struct Baseline {
    versions: Value,
    in_process: Vec<f64>,
    seed: Vec<f64>,
    seed_parts: [Vec<f64>; 3],
}

const SEED_PARTS: [(&str, &str); 3] = [
    ("write_secs", "seed_write"),
    ("child_secs", "seed_child"),
    ("read_back_secs", "seed_read_back"),
];

impl Baseline {
    fn run(&mut self, python: &str, input: &Input<'_>, cpus: usize, i: usize) -> Result<()> {
        let cpus = cpus.to_string();
        let v = run_json(
            Command::new(python)
                .args(["-c", IN_PROCESS_SCRIPT])
                .arg(&input.path)
                .arg(PIVOT_CODE)
                .arg(&cpus),
        )?;
        self.in_process.push(f(&v, "secs"));
        self.versions = json!({
            "python": v.get("python"),
            "pandas": v.get("pandas"),
            "pyarrow": v.get("pyarrow"),
        });
        let work = input.fetched.dir.join(format!("seed-{i}"));
        let v = run_json(
            Command::new(python)
                .args(["-c", SEED_SCRIPT])
                .arg(&input.path)
                .arg(PIVOT_CODE)
                .arg(&work)
                .arg(&cpus),
        );
        let _ = std::fs::remove_dir_all(&work);
        let v = v?;
        self.seed.push(f(&v, "secs"));
        for (p, (k, _)) in self.seed_parts.iter_mut().zip(SEED_PARTS) {
            p.push(f(&v, k));
        }
        Ok(())
    }

    fn store(self, out: &mut Value) {
        out["baseline"] = self.versions;
        out["in_process"] = json!(self.in_process);
        out["seed"] = json!(self.seed);
        for (p, (_, k)) in self.seed_parts.into_iter().zip(SEED_PARTS) {
            out[k] = json!(p);
        }
    }
}

/// Jobs run as uid 65534 when dataref runs as root: it must reach the runtime and the jobs.
fn check_home(home: &Path) -> Result<()> {
    std::fs::create_dir_all(home).with_context(|| format!("creating `{}`", home.display()))?;
    if !dataref_sandbox::jail::jail_can_read(home) {
        bail!(
            "the data dir `{}` is not reachable by uid 65534, which runs the jobs when dataref runs as root\nhint: set `DATAREF_HOME` (or `--dir`) to a directory every user can traverse, not under `/root`",
            home.display()
        );
    }
    Ok(())
}

fn sandbox_error(e: dataref_sandbox::pool::SandboxError) -> anyhow::Error {
    match e.hint() {
        Some(hint) => anyhow!("{e}\nhint: {hint}"),
        None => anyhow!("{e}"),
    }
}

/// A series of timed runs: end to end, from the hand-off to the sandbox's end
/// (`PythonRun::duration`), and the runner's own clock (`go` received → result written).
#[derive(Default)]
struct Series {
    total: Vec<f64>,
    handoff: Vec<f64>,
    runner: Vec<f64>,
}

impl Series {
    fn push(&mut self, total: f64, ran: &PythonRun) {
        self.total.push(total);
        self.handoff.push(ran.duration.as_secs_f64());
        let runner_ms = ran
            .result
            .as_ref()
            .and_then(|r| r.as_ref().ok())
            .map_or(f64::NAN, |r| r.duration_ms as f64);
        self.runner.push(runner_ms / 1e3);
    }

    fn store(self, key: &str, out: &mut Value) {
        out[key] = json!(self.total);
        out[format!("{key}_handoff")] = json!(self.handoff);
        out[format!("{key}_runner")] = json!(self.runner);
    }
}

/// One job, timed from the call as a tool makes it: the input opened, handed to the
/// sandbox, the run to its end (outputs collected).
fn timed_run(
    pool: &PythonSandbox,
    code: &str,
    input: Option<InputOpen<'_>>,
) -> Result<(f64, PythonRun)> {
    let t = Instant::now();
    let mut inputs = Vec::new();
    if let Some(input) = input {
        inputs.push(("sales".to_owned(), input.open()?));
    }
    let job = PythonJob {
        code: code.to_owned(),
        inputs,
        files: Vec::new(),
        timeout: JOB_TIMEOUT,
    };
    let ran = pool.run(job, &|_| {}, &|| false).map_err(sandbox_error)?;
    Ok((t.elapsed().as_secs_f64(), ran))
}

fn check(ran: &PythonRun, warm: bool) -> Result<()> {
    if ran.status != JobStatus::Exited(0) {
        bail!(
            "the job ended with {:?}: {}",
            ran.status,
            String::from_utf8_lossy(&ran.stderr.bytes).trim()
        );
    }
    match &ran.result {
        Some(Ok(r)) if r.ok => {}
        Some(Ok(r)) => bail!("the job's code failed: {:?}", r.error),
        Some(Err(e)) => bail!("collecting the job's result: {e}"),
        None => bail!("the job left no result"),
    }
    if ran.warm != warm {
        bail!(
            "expected a {} sandbox, got the other kind",
            if warm { "warm" } else { "cold" }
        );
    }
    Ok(())
}

/// Waits until the pool is full again. A sandbox joins the pool only once its runner has
/// imported pandas, so a job handed to it is not timed with the imports.
fn wait_warm(pool: &PythonSandbox, pool_size: usize) -> Result<()> {
    let until = Instant::now() + WARM_PATIENCE;
    while pool.warm_count() < pool_size {
        if Instant::now() > until {
            bail!("the sandbox pool did not fill in {WARM_PATIENCE:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// Resets VmHWM to the current RSS (`/proc/self/clear_refs`, Linux 4.0+).
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let s: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(percentile(&s, 0.5), 10.0);
        assert_eq!(percentile(&s, 0.95), 19.0);
        assert_eq!(percentile(&[3.0], 0.95), 3.0);
        assert!(percentile(&[], 0.5).is_nan());
    }

    #[test]
    fn row_counts_are_grouped_by_thousands() {
        assert_eq!(group(1_000_000), "1,000,000");
        assert_eq!(group(48_210), "48,210");
        assert_eq!(group(999), "999");
    }
}
