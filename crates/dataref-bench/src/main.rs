//! `dataref-bench` (also run as `dataref bench`, which forwards here, and by
//! `scripts/bench`): fetch and describe speed and memory, with `pandas.read_sql` on the same
//! file and query in the same run; exports, charts and spill; then `run_python`'s sandbox
//! ([`python`]): start-up latency and the seed's quarter-over-quarter pivot against pandas
//! in-process and against the seed's Parquet hand-off; `--pg`, a throwaway PostgreSQL
//! ([`postgres`]); and what the model reads (`context`, `first-run`). Each measured step
//! runs in a process of its own (`dataref-bench bench-worker …`) so its peak RSS is its own.
//!
//! Owns every benchmark and what only benchmarks use (the throwaway PostgreSQL of
//! `dataref-test-support`, tokio-postgres for the raw COPY baseline, the o200k tokenizer
//! of `context`). Builds what it measures through `dataref-app`, as `serve` does. Nothing
//! imports it: it is never part of the `dataref` binary.
#![expect(
    clippy::disallowed_methods,
    reason = "benchmark files (samples, stores, baselines) live outside any workspace"
)]

mod agent;
mod chart;
mod context;
mod export;
mod first_run;
mod load;
mod page;
mod postgres;
mod python;
mod server;
mod shared;
mod spill;
mod sql;
mod sql_limits;
mod start;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use dataref_config::Config;
use dataref_protocol::Principal;
use dataref_sources::{FetchRequest, ParamValue, SqlPolicy};
use dataref_store::{
    ArtifactMeta, ArtifactStore, Lineage, LocalStore, SampleOptions, StoreLimits, SystemClock,
};
use serde_json::{Value, json};

/// Measure dataref's speed and memory, against pandas in the same run.
#[derive(Debug, Parser)]
#[command(name = "dataref-bench", version, about, long_about = None)]
pub struct BenchArgs {
    /// A section of its own instead of the speed and memory runs.
    #[command(subcommand)]
    section: Option<BenchSection>,
    /// Row counts to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1000000,10000000")]
    rows: Vec<u64>,
    /// Python interpreter with pandas, for the comparison.
    #[arg(long, default_value = "python3")]
    python: String,
    /// Skip the pandas comparison.
    #[arg(long)]
    no_pandas: bool,
    /// Where sample databases are kept between runs (default: `<data dir>/bench`). The
    /// `run_python` section uses the data dir's runtime (`DATAREF_HOME`, as `serve` does),
    /// installing it on the first run.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Only the `run_python` section (skip fetch and describe).
    #[arg(long, conflicts_with = "skip_python")]
    python_only: bool,
    /// Skip the `run_python` section.
    #[arg(long)]
    skip_python: bool,
    /// Only the spill section (what writing a large result to the workspace adds to a call).
    #[arg(long, conflicts_with_all = ["python_only", "skip_python"])]
    spill_only: bool,
    /// Only the PostgreSQL section: a throwaway server (initdb + pg_ctl from the installed
    /// binaries), `--pg-rows` rows fetched by dataref, by `pandas.read_sql` with psycopg and
    /// by a raw binary COPY.
    #[arg(long, conflicts_with_all = ["python_only", "spill_only"])]
    pg: bool,
    /// Rows of the PostgreSQL section's table.
    #[arg(long, default_value_t = 1_000_000, value_name = "N")]
    pg_rows: u64,
    /// Rows of the sample the `run_python` pivot reads.
    #[arg(long, default_value_t = 1_000_000, value_name = "N")]
    python_rows: u64,
    /// Runs of the trivial `run_python` script, warm and cold each (for p50/p95).
    #[arg(long, default_value_t = 30, value_name = "N")]
    python_runs: usize,
    /// Runs of the pivot, for each of dataref, pandas in-process and the seed's path.
    #[arg(long, default_value_t = 5, value_name = "N")]
    pivot_runs: usize,
    #[command(flatten)]
    export: export::ExportBenchArgs,
}

#[derive(Debug, Subcommand)]
enum BenchSection {
    /// What the model reads: the seed's transcript (fetch_sales, describe_data, its
    /// run_python, render_chart, a CSV export) replayed word for word over MCP at each
    /// size, with bytes and o200k tokens per step, and of `tools/list`.
    Context(context::ContextArgs),
    /// The first `run_python` of a session against warm ones: fresh in-process servers,
    /// the seed's pivot sent right after the handshake, with the warm pool and without.
    FirstRun(first_run::FirstRunArgs),
    /// The agent loop: its own time per turn (model time excluded) over a 200-message
    /// session, context assembly (`window::fit`), and the tokens the model receives for the
    /// seed's question at each size, each against a baseline.
    Agent(agent::AgentArgs),
    /// Fetch and describe through an MCP server over stdio, timed by the official Python
    /// SDK's client: `dataref serve` against the seed article's pandas server, with
    /// dataref's anonymous memory.
    Server(server::ServerArgs),
    /// The seed's question in SQL, in two forms (the quarter bounds once, `date_trunc` per
    /// row), through `run_sql` and the engine alone, against DuckDB and pandas in-process on
    /// the same Arrow data, already loaded.
    Sql(sql::SqlArgs),
    /// Whether `run_sql`'s limits hold on the real server: queries that would run for
    /// minutes or build gigabytes, with the time to the answer, the server's CPU after it,
    /// the next query's time and the memory the server grew by.
    SqlLimits(sql_limits::SqlLimitsArgs),
    /// The page: a page of rows (`view_rows`, sorted and filtered) against DuckDB on the
    /// same Arrow data, and first paint in headless Chromium against a one-line page.
    Page(page::PageArgs),
    /// Sharing the store across replicas: fetch into the object store and the PostgreSQL
    /// index, read back on another replica (first and cached) against the local store;
    /// and 50 clients × 100 calls through HAProxy to 1 and to 2 replicas.
    Shared(shared::SharedArgs),
    /// How soon `dataref serve` on stdio answers `initialize` and `tools/list` (what a host
    /// waits for at the start of every conversation), against the executable's own
    /// `--version`.
    Start(start::StartArgs),
    /// Files into tables and a lake queried in place: a 10M-row CSV loaded into the store
    /// against DuckDB's `read_csv` and pandas, a 100k-row XLSX against pandas/openpyxl, a
    /// Parquet lake query against DuckDB's `read_parquet`, with peak memory.
    Load(load::LoadArgs),
    /// (internal) one measured step, in a process of its own.
    #[command(hide = true)]
    BenchWorker(WorkerArgs),
}

#[derive(Debug, Args)]
struct WorkerArgs {
    #[command(subcommand)]
    step: WorkerStep,
}

#[derive(Debug, Subcommand)]
enum WorkerStep {
    /// Fetch the sample query into a fresh store; with `--describe`, time describe too.
    Fetch {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        rows: u64,
        #[arg(long)]
        describe: bool,
    },
    /// The `run_python` section: fetch the sample, then time the sandbox (and, with
    /// `--python`, the pandas baselines) on the artifact.
    Python(python::WorkerArgs),
    /// The export section: fetch the sample, then write it as CSV, XLSX and Parquet.
    Export(export::WorkerArgs),
    /// The load section: one file loaded into a fresh store, as `load_file` does.
    Load(load::WorkerArgs),
}

fn main() -> ExitCode {
    let args = BenchArgs::parse();
    init_tracing();
    match run(&args) {
        Ok(code) => code,
        Err(e) => {
            // The whole chain, once (not also as a log line: both go to stderr).
            eprintln_error(&e);
            ExitCode::FAILURE
        }
    }
}

/// Logs to stderr (stdout is the report), filtered by `DATAREF_LOG` (default `warn`).
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env(dataref_config::env::DATAREF_LOG)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}

#[expect(
    clippy::print_stderr,
    reason = "the benchmark's last word on a fatal error"
)]
fn eprintln_error(e: &anyhow::Error) {
    eprintln!("error: {e:#}");
}

/// The sample query, as `fetch_sales(since = "2025-01-01")` runs it.
fn sample_sql(config: &Config) -> Result<String> {
    Ok(config
        .queries
        .get("sales")
        .context("the built-in sample has no `sales` query")?
        .sql
        .clone())
}

fn worker(args: &WorkerArgs) -> Result<ExitCode> {
    let out = match &args.step {
        WorkerStep::Fetch {
            dir,
            rows,
            describe,
        } => fetch_worker(dir, *rows, *describe)?,
        WorkerStep::Python(a) => python::worker(a)?,
        WorkerStep::Export(a) => export::worker(a)?,
        WorkerStep::Load(a) => load::worker(a)?,
    };
    writeln!(std::io::stdout().lock(), "{out}")?;
    Ok(ExitCode::SUCCESS)
}

/// The sample fetched into a fresh store of its own, removed when dropped.
struct Fetched {
    store: Arc<LocalStore>,
    owner: Principal,
    meta: ArtifactMeta,
    secs: f64,
    dir: PathBuf,
}

impl Drop for Fetched {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `fetch_sales(since = "2025-01-01")` on the `rows`-row sample (generated beforehand)
/// into a new store under `dir`.
fn fetch_sample(dir: &Path, rows: u64) -> Result<Fetched> {
    let config = Config::builtin_sample(dir.to_path_buf(), rows);
    let (store_dir, store) = bench_store(dir)?;
    let owner = Principal::new("bench")?;
    let t = Instant::now();
    let meta = fetch_into(&config, store.as_ref(), &owner)?;
    Ok(Fetched {
        store,
        owner,
        meta,
        secs: t.elapsed().as_secs_f64(),
        dir: store_dir,
    })
}

/// The sample's `fetch_sales(since = "2025-01-01")` into `store`, as the tool runs it.
pub(crate) fn fetch_into(
    config: &Config,
    store: &dyn ArtifactStore,
    owner: &Principal,
) -> Result<ArtifactMeta> {
    let source = config
        .sources
        .get("sample")
        .context("sample source missing")?;
    let sql = sample_sql(config)?;
    let declared = Default::default();
    let req = FetchRequest {
        source,
        sql: &sql,
        params: vec![("since".into(), ParamValue::Text("2025-01-01".into()))],
        declared: &declared,
        policy: SqlPolicy::Configured,
    };
    Ok(dataref_sources::fetch(
        &req,
        store,
        owner,
        Lineage::new("bench", json!({})),
        &|_| {},
        &|| false,
    )?)
}

fn fetch_worker(dir: &Path, rows: u64, describe: bool) -> Result<Value> {
    let fetched = fetch_sample(dir, rows)?;
    let (store, owner, meta) = (&fetched.store, &fetched.owner, &fetched.meta);
    // The high-water mark now is the fetch's own; describe maps the file and adds to it.
    let mut out = json!({
        "rows": meta.rows,
        "bytes": meta.bytes,
        "fetch_secs": fetched.secs,
        "peak_rss_bytes": peak_rss_bytes(),
    });
    if describe {
        // The first read of a table in a process checks its file against the quick check
        // written with it. Its cost: describe_data on a fresh store (as a new process) over
        // the same on a fresh store that already knows the file good (`verify` hashed it,
        // mapping nothing): both map the file, fault it in and decode it.
        let (mut hashed, mut known) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            let fresh = open_bench_store(&fetched.dir)?;
            let t = Instant::now();
            let table = fresh.map_table(owner, &meta.data_ref)?;
            let s = dataref_store::describe_data(&table, None, 0, 100)?;
            hashed.push(t.elapsed().as_secs_f64());
            out["describe_data_columns"] = json!(s.columns.len());
            let fresh = open_bench_store(&fetched.dir)?;
            let report = fresh.verify(false, &mut |_, _| {})?;
            anyhow::ensure!(report.intact == 1, "the fetched table did not verify");
            let t = Instant::now();
            let table = fresh.map_table(owner, &meta.data_ref)?;
            dataref_store::describe_data(&table, None, 0, 100)?;
            known.push(t.elapsed().as_secs_f64());
        }
        out["describe_data_first_secs"] = json!(median(&mut hashed));
        out["describe_data_secs"] = json!(median(&mut known));
        let table = store.map_table(owner, &meta.data_ref)?;
        // The hash alone, of the file's bytes in memory: its rate.
        let bytes = std::fs::read(&table.path)?;
        let t = Instant::now();
        let sum = dataref_store::Checksum::of(&bytes);
        out["verify_secs"] = json!(t.elapsed().as_secs_f64());
        anyhow::ensure!(Some(sum) == meta.checksum, "the fetched table's checksum");
        let t = Instant::now();
        let quick = dataref_store::QuickCheck::of(&bytes);
        out["quick_secs"] = json!(t.elapsed().as_secs_f64());
        anyhow::ensure!(
            Some(quick) == meta.quick_check,
            "the fetched table's quick check"
        );
        let t = Instant::now();
        let opts = SampleOptions::default();
        let table = store.map_table(owner, &meta.data_ref)?.head(opts.rows)?;
        let d = dataref_store::describe(&table, opts);
        out["describe_secs"] = json!(t.elapsed().as_secs_f64());
        out["describe_bytes"] = json!(serde_json::to_string(&d)?.len());
        out["describe_peak_rss_bytes"] = json!(peak_rss_bytes());
    }
    Ok(out)
}

/// The text blocks of a result, joined by newlines.
fn result_text(r: &dataref_mcp::rmcp::model::CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A fresh store under `dir` with bounds no benchmark reaches, and its directory.
fn bench_store(dir: &Path) -> Result<(PathBuf, Arc<LocalStore>)> {
    let store_dir = tempdir_in(dir)?;
    let store = Arc::new(open_bench_store(&store_dir)?);
    Ok((store_dir, store))
}

/// The store under `store_dir`, opened afresh (as another process would).
fn open_bench_store(store_dir: &Path) -> Result<LocalStore> {
    Ok(LocalStore::open(
        store_dir,
        StoreLimits {
            max_artifact_bytes: 64 << 30,
            owner_quota_bytes: 64 << 30,
            ..StoreLimits::default()
        },
        Arc::new(SystemClock),
    )?)
}

fn tempdir_in(dir: &Path) -> Result<PathBuf> {
    let p = dir.join(format!("store-{}", std::process::id()));
    std::fs::create_dir_all(&p)?;
    Ok(p)
}

/// `1000000` → `1,000,000`.
pub(crate) fn group(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The median; NaN for no samples.
pub(crate) fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

/// VmHWM: the high-water mark of this process's resident memory.
fn peak_rss_bytes() -> u64 {
    proc_status_bytes("VmHWM:")
}

/// A `kB` line of `/proc/self/status`, in bytes (0 when it cannot be read).
fn proc_status_bytes(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

const PANDAS_SCRIPT: &str = r#"
import json, resource, sqlite3, sys, time
import pandas as pd
db, sql = sys.argv[1], sys.argv[2]
con = sqlite3.connect(db)
t = time.perf_counter()
df = pd.read_sql(sql, con, params={"since": "2025-01-01"}, parse_dates=["date"])
secs = time.perf_counter() - t
t = time.perf_counter()
df.describe(include="all")
describe_secs = time.perf_counter() - t
print(json.dumps({"rows": len(df), "fetch_secs": secs, "describe_secs": describe_secs,
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "pandas": pd.__version__}))
"#;

fn run_json(cmd: &mut Command) -> Result<Value> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        if stderr.trim().is_empty() {
            // Its stderr was not captured (it went to ours, above).
            bail!("{cmd:?} failed ({})", out.status);
        }
        bail!("{cmd:?} failed: {}", stderr.trim());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or_default();
    serde_json::from_str(line).with_context(|| format!("reading the result of {cmd:?}: {line}"))
}

fn pandas_available(python: &str) -> Option<String> {
    let out = Command::new(python)
        .args(["-c", "import pandas; print(pandas.__version__)"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn f(v: &Value, k: &str) -> f64 {
    v.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

fn mb(bytes: f64) -> String {
    format!("{:.0} MB", bytes / 1e6)
}

fn run(args: &BenchArgs) -> Result<ExitCode> {
    match &args.section {
        Some(BenchSection::Context(a)) => {
            context::run(a)?;
            return Ok(ExitCode::SUCCESS);
        }
        Some(BenchSection::FirstRun(a)) => {
            first_run::run(a)?;
            return Ok(ExitCode::SUCCESS);
        }
        Some(BenchSection::Agent(a)) => {
            agent::run(a)?;
            return Ok(ExitCode::SUCCESS);
        }
        Some(BenchSection::Server(a)) => {
            server::run(a, &args.python, args.dir.as_deref())?;
            return Ok(ExitCode::SUCCESS);
        }
        Some(BenchSection::Sql(a)) => {
            sql::run(a, &args.python, args.dir.as_deref())?;
            return Ok(ExitCode::SUCCESS);
        }
        Some(BenchSection::SqlLimits(a)) => {
            sql_limits::run(a)?;
            return Ok(ExitCode::SUCCESS);
        }
        Some(BenchSection::Page(a)) => {
            page::run(a, &args.python, args.dir.as_deref())?;
            return Ok(ExitCode::SUCCESS);
        }
        Some(BenchSection::Shared(a)) => {
            shared::run(a, args.dir.as_deref())?;
            return Ok(ExitCode::SUCCESS);
        }
        Some(BenchSection::Start(a)) => {
            start::run(a)?;
            return Ok(ExitCode::SUCCESS);
        }
        Some(BenchSection::Load(a)) => {
            load::run(a, &args.python, args.dir.as_deref())?;
            return Ok(ExitCode::SUCCESS);
        }
        Some(BenchSection::BenchWorker(a)) => return worker(a),
        None => {}
    }
    // The data dir, as `serve` finds it: the run_python section uses its runtime.
    let home = dataref_app::home(None)?;
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => home.join("bench"),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating `{}`", dir.display()))?;
    let exe = std::env::current_exe().context("finding the dataref-bench executable")?;
    let pandas = if args.no_pandas {
        None
    } else {
        pandas_available(&args.python)
    };
    if !args.no_pandas && pandas.is_none() {
        dataref_app::progress_line(&format!(
            "pandas is not importable by `{}`; the comparison is skipped\nhint: `scripts/bench` sets up a venv with pandas, or pass `--python PATH`",
            args.python
        ));
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "\ndataref bench — {} cores",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    )?;
    if args.spill_only {
        spill::section(&dir, &mut out)?;
        return Ok(ExitCode::SUCCESS);
    }
    if args.pg {
        postgres::section(
            args.pg_rows,
            &args.python,
            &dir,
            pandas.as_deref(),
            &mut out,
        )?;
        return Ok(ExitCode::SUCCESS);
    }
    if !args.python_only {
        fetch_section(args, &dir, &exe, pandas.as_deref(), &mut out)?;
    }
    if !args.python_only && !args.export.skip() {
        export::section(
            &args.export,
            &args.python,
            &dir,
            &exe,
            pandas.as_deref(),
            &mut out,
        )?;
    }
    if !args.python_only {
        chart::section(&dir, &mut out)?;
        spill::section(&dir, &mut out)?;
    }
    if !args.skip_python {
        python::section(args, &dir, &home, &exe, pandas.as_deref(), &mut out)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Fetch and describe of the SQLite sample, against `pandas.read_sql`.
fn fetch_section(
    args: &BenchArgs,
    dir: &Path,
    exe: &Path,
    pandas: Option<&str>,
    out: &mut impl Write,
) -> Result<()> {
    let mut rows_out = Vec::new();
    for &n in &args.rows {
        let config = Config::builtin_sample(dir.to_path_buf(), n);
        let t = Instant::now();
        dataref_app::ensure_sample(&config)?;
        let gen_secs = t.elapsed().as_secs_f64();
        dataref_app::progress_line(&format!("measuring fetch of {n} rows…"));
        let describe = n <= 1_000_000;
        let mut cmd = Command::new(exe);
        cmd.args(["bench-worker", "fetch", "--rows", &n.to_string(), "--dir"])
            .arg(dir);
        if describe {
            cmd.arg("--describe");
        }
        let ours = run_json(&mut cmd)?;
        let theirs = match pandas {
            Some(_) => {
                dataref_app::progress_line(&format!("measuring pandas.read_sql of {n} rows…"));
                let db = config
                    .sample
                    .as_ref()
                    .map(|s| s.path.clone())
                    .context("sample path")?;
                let sql = sample_sql(&config)?;
                Some(run_json(
                    Command::new(&args.python)
                        .args(["-c", PANDAS_SCRIPT])
                        .arg(&db)
                        .arg(&sql),
                )?)
            }
            None => None,
        };
        rows_out.push((n, gen_secs, ours, theirs));
    }

    writeln!(out, "\nSQLite sample (`fetch_sales(since=\"2025-01-01\")`)")?;
    if let Some(v) = pandas {
        writeln!(
            out,
            "pandas {v}: `pandas.read_sql(sql, sqlite3, parse_dates=[\"date\"])` on the same file and query"
        )?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "| step | rows | dataref | rows/s | peak RSS | pandas | pandas peak RSS | speed-up |"
    )?;
    writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|")?;
    for (n, _gen, ours, theirs) in &rows_out {
        let secs = f(ours, "fetch_secs");
        let (p_secs, p_rss) = theirs.as_ref().map_or((f64::NAN, f64::NAN), |t| {
            (f(t, "fetch_secs"), f(t, "peak_rss_bytes"))
        });
        writeln!(
            out,
            "| fetch → artifact | {n} | {secs:.2} s | {:.2} M | {} | {} | {} | {} |",
            *n as f64 / secs / 1e6,
            mb(f(ours, "peak_rss_bytes")),
            if p_secs.is_nan() {
                "–".into()
            } else {
                format!("{p_secs:.2} s")
            },
            if p_rss.is_nan() {
                "–".into()
            } else {
                mb(p_rss)
            },
            if p_secs.is_nan() {
                "–".into()
            } else {
                format!("{:.1}×", p_secs / secs)
            },
        )?;
        if ours.get("describe_secs").is_some() {
            writeln!(
                out,
                "| describe (producer result) | {n} | {:.3} s | | | | | |",
                f(ours, "describe_secs")
            )?;
            let p = theirs.as_ref().map(|t| f(t, "describe_secs"));
            let rss = mb(f(ours, "describe_peak_rss_bytes"));
            writeln!(
                out,
                "| describe_data (all columns) | {n} | {:.3} s | | {rss} | {} | | {} |",
                f(ours, "describe_data_secs"),
                p.map_or("–".into(), |p| format!("{p:.3} s (df.describe)")),
                p.map_or("–".into(), |p| format!(
                    "{:.1}×",
                    p / f(ours, "describe_data_secs")
                )),
            )?;
            let (first, again) = (
                f(ours, "describe_data_first_secs"),
                f(ours, "describe_data_secs"),
            );
            writeln!(
                out,
                "| describe_data, first read in a process (the file checked) | {n} | {first:.3} s (+{:.0}% over {again:.3} s known good) | | | | | |",
                100.0 * (first - again) / again,
            )?;
            writeln!(
                out,
                "| the quick check alone (the file in memory; what a first read checks) | {n} | {:.3} s | {:.1} GB/s | | | | |",
                f(ours, "quick_secs"),
                f(ours, "bytes") / f(ours, "quick_secs") / 1e9,
            )?;
            writeln!(
                out,
                "| the checksum alone (BLAKE3; what `store verify` checks) | {n} | {:.3} s | {:.1} GB/s | | | | |",
                f(ours, "verify_secs"),
                f(ours, "bytes") / f(ours, "verify_secs") / 1e9,
            )?;
        }
    }
    writeln!(
        out,
        "\ngoals: fetch ≥ 3× pandas; peak RSS of a 10M-row fetch < 200 MB; describe_data at 1M rows < 0.5 s; \
         the first read of a 1M-row table (its file checked) ≤ 10% over a later describe_data (issue #29)"
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&mut []).is_nan());
    }
}
