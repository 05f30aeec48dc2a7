//! `dataref bench`: fetch and describe speed and memory, with `pandas.read_sql` on the same
//! file and query in the same run. Each measured step runs in a process of its own so its
//! peak RSS is its own.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use dataref_config::Config;
use dataref_protocol::Principal;
use dataref_sources::{FetchRequest, ParamValue, SqlPolicy};
use dataref_store::{ArtifactStore, Lineage, LocalStore, SampleOptions, StoreLimits, SystemClock};
use serde_json::{Value, json};

use crate::settings;

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Row counts to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1000000,10000000")]
    rows: Vec<u64>,
    /// Python interpreter with pandas, for the comparison.
    #[arg(long, default_value = "python3")]
    python: String,
    /// Skip the pandas comparison.
    #[arg(long)]
    no_pandas: bool,
    /// Where sample databases are kept between runs (default: `<data dir>/bench`).
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct WorkerArgs {
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

pub fn worker(args: &WorkerArgs) -> Result<ExitCode> {
    let WorkerStep::Fetch {
        dir,
        rows,
        describe,
    } = &args.step;
    let config = Config::builtin_sample(dir.clone(), *rows);
    let source = config
        .sources
        .get("sample")
        .context("sample source missing")?;
    let store_dir = tempdir_in(dir)?;
    let store = Arc::new(LocalStore::open(
        &store_dir,
        StoreLimits {
            max_artifact_bytes: 64 << 30,
            owner_quota_bytes: 64 << 30,
            ..StoreLimits::default()
        },
        Arc::new(SystemClock),
    )?);
    let owner = Principal::new("bench")?;
    let sql = sample_sql(&config)?;
    let declared = Default::default();
    let req = FetchRequest {
        source,
        sql: &sql,
        params: vec![("since".into(), ParamValue::Text("2025-01-01".into()))],
        declared: &declared,
        policy: SqlPolicy::Configured,
    };
    let t = Instant::now();
    let meta = dataref_sources::fetch(
        &req,
        store.as_ref(),
        &owner,
        Lineage::new("bench", json!({})),
        &|_| {},
        &|| false,
    )?;
    let fetch_secs = t.elapsed().as_secs_f64();
    // The high-water mark now is the fetch's own; describe maps the file and adds to it.
    let mut out = json!({
        "rows": meta.rows,
        "bytes": meta.bytes,
        "fetch_secs": fetch_secs,
        "peak_rss_bytes": peak_rss_bytes(),
    });
    if *describe {
        let t = Instant::now();
        let table = store.open_table(&owner, &meta.data_ref)?;
        let d = dataref_store::describe(&table, SampleOptions::default());
        out["describe_secs"] = json!(t.elapsed().as_secs_f64());
        out["describe_bytes"] = json!(serde_json::to_string(&d)?.len());
        let t = Instant::now();
        let table = store.open_table(&owner, &meta.data_ref)?;
        let s = dataref_store::describe_data(&table, None, 0, 100)?;
        out["describe_data_secs"] = json!(t.elapsed().as_secs_f64());
        out["describe_data_columns"] = json!(s.columns.len());
        out["describe_peak_rss_bytes"] = json!(peak_rss_bytes());
    }
    let _ = std::fs::remove_dir_all(&store_dir);
    writeln!(std::io::stdout().lock(), "{out}")?;
    Ok(ExitCode::SUCCESS)
}

fn tempdir_in(dir: &Path) -> Result<PathBuf> {
    let p = dir.join(format!("store-{}", std::process::id()));
    std::fs::create_dir_all(&p)?;
    Ok(p)
}

/// VmHWM: the high-water mark of this process's resident memory.
fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
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
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
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

pub fn run(args: &BenchArgs) -> Result<ExitCode> {
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => {
            let common = crate::Common {
                home: None,
                config: None,
                rows: None,
            };
            settings::home(&common)?.join("bench")
        }
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating `{}`", dir.display()))?;
    let exe = std::env::current_exe().context("finding the dataref executable")?;
    let pandas = if args.no_pandas {
        None
    } else {
        pandas_available(&args.python)
    };
    if !args.no_pandas && pandas.is_none() {
        settings::progress_line(&format!(
            "pandas is not importable by `{}`; the comparison is skipped\nhint: `scripts/bench` sets up a venv with pandas, or pass `--python PATH`",
            args.python
        ));
    }
    let mut rows_out = Vec::new();
    for &n in &args.rows {
        let config = Config::builtin_sample(dir.clone(), n);
        let t = Instant::now();
        settings::ensure_sample(&config)?;
        let gen_secs = t.elapsed().as_secs_f64();
        settings::progress_line(&format!("measuring fetch of {n} rows…"));
        let describe = n <= 1_000_000;
        let mut cmd = Command::new(&exe);
        cmd.args(["bench-worker", "fetch", "--rows", &n.to_string(), "--dir"])
            .arg(&dir);
        if describe {
            cmd.arg("--describe");
        }
        let ours = run_json(&mut cmd)?;
        let theirs = match &pandas {
            Some(_) => {
                settings::progress_line(&format!("measuring pandas.read_sql of {n} rows…"));
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

    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "\ndataref bench — SQLite sample (`fetch_sales(since=\"2025-01-01\")`), {} cores",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    )?;
    if let Some(v) = &pandas {
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
        }
    }
    writeln!(
        out,
        "\ngoals: fetch ≥ 3× pandas; peak RSS of a 10M-row fetch < 200 MB; describe_data at 1M rows < 0.5 s"
    )?;
    Ok(ExitCode::SUCCESS)
}
