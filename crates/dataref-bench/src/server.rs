//! `dataref bench server`: fetch and describe through an MCP server over stdio, as a host
//! sees them, for `dataref serve` on the built-in sample and for the seed article's server
//! (its in-memory store of pandas DataFrames, `pd.read_sql` on the same SQLite file and
//! query, `df.describe(include="all")`; written with the official MCP Python SDK), in one
//! run on the same machine.
//!
//! One client for both (`server_client.py`, the SDK's stdio client) starts each server
//! afresh for every run, times `fetch_sales(since = "2025-01-01")` and `describe_data` on
//! the returned dataRef from request to parsed result, and samples the server process's
//! `RssAnon` and `VmRSS` every few milliseconds for each step's peak.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use clap::Args;
use dataref_config::Config;
use dataref_config::env::DATAREF_CONFIG;
use serde_json::Value;

use super::{f, mb, run_json, sample_sql};

/// The MCP client both servers are measured with.
const CLIENT_PY: &str = include_str!("server_client.py");
/// The seed article's server.
const SEED_PY: &str = include_str!("server_seed.py");

/// What the interpreter must import, and the time of the run (UTC) for the report.
const CHECK_PY: &str = "import importlib.metadata as m, time, pandas, pyarrow, mcp.server.mcpserver; \
print(pandas.__version__, m.version('mcp'), time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()))";

#[derive(Debug, Args)]
pub struct ServerArgs {
    /// Sample sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1000000,10000000")]
    rows: Vec<u64>,
    /// Runs per server and size, each on a freshly started server (the median is reported).
    #[arg(long, default_value_t = 3, value_name = "N")]
    runs: usize,
    /// The seed's server is run on samples up to this many rows (at 10M rows a run of it
    /// takes about 1.5 minutes and 6 GB of memory).
    #[arg(long, default_value_t = 10_000_000, value_name = "N")]
    seed_max_rows: u64,
    /// Python with pandas, pyarrow and mcp (the client and the seed's server). Default: the
    /// top-level `--python`.
    #[arg(long)]
    python: Option<String>,
    /// Where sample databases are kept between runs. Default: the top-level `--dir`, else
    /// `<data dir>/bench`.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// The `dataref` executable to serve. Default: the one beside this executable.
    #[arg(long, value_name = "FILE")]
    dataref: Option<PathBuf>,
}

/// The client's summary of one server at one size.
struct Measured {
    fetch_secs: f64,
    describe_secs: f64,
    fetch_anon: f64,
    fetch_rss: f64,
    describe_anon: f64,
    describe_rss: f64,
}

impl Measured {
    fn from_summary(v: &Value) -> Result<Self> {
        let s = v
            .get("summary")
            .context("the MCP client printed no `summary`")?;
        Ok(Self {
            fetch_secs: f(s, "fetch_secs"),
            describe_secs: f(s, "describe_secs"),
            fetch_anon: f(s, "fetch_rss_anon_peak_bytes"),
            fetch_rss: f(s, "fetch_rss_peak_bytes"),
            describe_anon: f(s, "describe_rss_anon_peak_bytes"),
            describe_rss: f(s, "describe_rss_peak_bytes"),
        })
    }
}

/// The section's scratch directory (scripts, logs, the servers' data dirs), removed when
/// dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn run(args: &ServerArgs, python: &str, dir: Option<&Path>) -> Result<()> {
    let python = args.python.as_deref().unwrap_or(python);
    let dir = match args.dir.as_deref().or(dir) {
        Some(d) => d.to_path_buf(),
        None => dataref_app::home(None)?.join("bench"),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating `{}`", dir.display()))?;
    let dir =
        std::path::absolute(&dir).with_context(|| format!("resolving `{}`", dir.display()))?;
    let dataref = dataref_exe(args.dataref.as_deref())?;
    let (pandas, mcp, when) = check_python(python)?;
    if args.runs == 0 {
        bail!("`--runs` must be at least 1");
    }

    let scratch = Scratch(dir.join(format!("server-{}", std::process::id())));
    std::fs::create_dir_all(&scratch.0)
        .with_context(|| format!("creating `{}`", scratch.0.display()))?;
    let client = scratch.0.join("client.py");
    let seed = scratch.0.join("seed_server.py");
    std::fs::write(&client, CLIENT_PY)
        .with_context(|| format!("writing `{}`", client.display()))?;
    std::fs::write(&seed, SEED_PY).with_context(|| format!("writing `{}`", seed.display()))?;

    let mut results = Vec::new();
    for &n in &args.rows {
        let (config, db) = sample_db(&dir, n)?;

        // `dataref serve` on a data dir of its own (a fresh store), the sample linked in.
        let home = scratch.0.join(format!("home-{n}"));
        std::fs::create_dir_all(&home).with_context(|| format!("creating `{}`", home.display()))?;
        std::os::unix::fs::symlink(dir.join("sample"), home.join("sample"))
            .with_context(|| format!("linking the samples into `{}`", home.display()))?;
        dataref_app::progress_line(&format!(
            "measuring `dataref serve` over MCP on {n} rows ({} runs)…",
            args.runs
        ));
        let mut cmd = client_cmd(
            python,
            &client,
            args.runs,
            n,
            &scratch.0.join("dataref.log"),
        );
        cmd.arg(&dataref)
            .args(["serve", "--home"])
            .arg(&home)
            .args(["--rows", &n.to_string(), "--principal", "bench"]);
        let ours = Measured::from_summary(&run_json(&mut cmd)?)?;
        let _ = std::fs::remove_dir_all(&home);

        let theirs = if n <= args.seed_max_rows {
            dataref_app::progress_line(&format!(
                "measuring the seed's server (pandas) over MCP on {n} rows ({} runs)…",
                args.runs
            ));
            let mut cmd = client_cmd(python, &client, args.runs, n, &scratch.0.join("seed.log"));
            cmd.arg(python)
                .arg(&seed)
                .arg(&db)
                .arg(sample_sql(&config)?);
            // The baseline failing (at 10M rows it needs about 6 GB) costs its cells, not
            // the measurements already made.
            run_json(&mut cmd)
                .and_then(|v| Measured::from_summary(&v))
                .map_err(|e| {
                    dataref_app::progress_line(&format!("the seed's server failed: {e:#}"));
                    "failed: see above".to_owned()
                })
        } else {
            Err("over `--seed-max-rows`".to_owned())
        };
        results.push((n, ours, theirs));
    }
    let mut out = std::io::stdout().lock();
    report(&mut out, args, &results, &pandas, &mcp, &when)
}

/// The built-in sample of `rows` rows under `dir` (made on the first run), and its file.
pub(crate) fn sample_db(dir: &Path, rows: u64) -> Result<(Config, PathBuf)> {
    let config = Config::builtin_sample(dir.to_owned(), rows);
    dataref_app::ensure_sample(&config)?;
    let db = config
        .sample
        .as_ref()
        .map(|s| s.path.clone())
        .context("the built-in sample has no path")?;
    Ok((config, db))
}

/// The `dataref` executable a section serves: `given`, or the one beside this executable.
pub(crate) fn dataref_exe(given: Option<&Path>) -> Result<PathBuf> {
    let dataref = match given {
        Some(p) => p.to_owned(),
        None => std::env::current_exe()
            .context("finding the dataref-bench executable")?
            .with_file_name("dataref"),
    };
    if !dataref.is_file() {
        bail!(
            "`{}` is not there: the section serves the `dataref` executable\n\
             hint: `cargo build --release -p dataref -p dataref-bench` builds both side by side, or pass `--dataref FILE`",
            dataref.display()
        );
    }
    Ok(dataref)
}

/// `python client.py RUNS ROWS LOG --`, the server's command to follow.
fn client_cmd(python: &str, client: &Path, runs: usize, rows: u64, log: &Path) -> Command {
    let mut cmd = Command::new(python);
    cmd.arg(client)
        .arg(runs.to_string())
        .arg(rows.to_string())
        .arg(log)
        .arg("--")
        // The built-in sample, whatever the caller's environment names.
        .env_remove(DATAREF_CONFIG)
        // Each run's times, as they come.
        .stderr(Stdio::inherit());
    cmd
}

/// pandas' and mcp's versions and the time now, or why the interpreter will not do.
fn check_python(python: &str) -> Result<(String, String, String)> {
    let out = Command::new(python)
        .args(["-c", CHECK_PY])
        .output()
        .with_context(|| format!("running `{python}`"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut words = text.split_whitespace();
    match (out.status.success(), words.next(), words.next()) {
        (true, Some(pandas), Some(mcp)) => Ok((
            pandas.to_owned(),
            mcp.to_owned(),
            words.collect::<Vec<_>>().join(" "),
        )),
        _ => bail!(
            "`{python}` cannot import pandas, pyarrow and the MCP SDK (`mcp.server.mcpserver`): {}\n\
             hint: `scripts/bench server` sets up a venv with them, or pass `--python PATH` of one with \
             `pip install pandas pyarrow mcp==2.3.0`",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    }
}

fn report(
    out: &mut impl Write,
    args: &ServerArgs,
    results: &[(u64, Measured, Result<Measured, String>)],
    pandas: &str,
    mcp: &str,
    when: &str,
) -> Result<()> {
    writeln!(
        out,
        "\nMCP servers over stdio ({when}, {} cores): `fetch_sales(since=\"2025-01-01\")`, then `describe_data` on its dataRef, \
         timed by the MCP client (the official Python SDK, mcp {mcp}) from request to parsed result; median of {} runs, \
         each on a freshly started server",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        args.runs
    )?;
    writeln!(
        out,
        "dataref: `dataref serve` on the built-in sample. seed's server: the article's sketch (ArtifactStore of DataFrames, \
         `pd.read_sql` on the same file and query, `df.describe(include=\"all\")` as JSON) with the SDK's `MCPServer` \
         (FastMCP), pandas {pandas}"
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "| step | rows | dataref | seed's server | speed-up | dataref RssAnon peak |"
    )?;
    writeln!(out, "|---|---:|---:|---:|---:|---:|")?;
    let secs = |s: f64| {
        if s < 1.0 {
            format!("{:.0} ms", s * 1e3)
        } else {
            format!("{s:.2} s")
        }
    };
    let baseline = |t: &Result<Measured, String>, f: &dyn Fn(&Measured) -> f64| match t {
        Ok(t) => secs(f(t)),
        Err(why) => format!("– ({why})"),
    };
    for (n, ours, theirs) in results {
        let rate = *n as f64 / ours.fetch_secs / 1e6;
        writeln!(
            out,
            "| fetch_sales | {n} | {} ({rate:.2} M rows/s) | {} | {} | {} (RSS {}) |",
            secs(ours.fetch_secs),
            baseline(theirs, &|t| t.fetch_secs),
            theirs.as_ref().map_or("–".into(), |t| format!(
                "{:.1}×",
                t.fetch_secs / ours.fetch_secs
            )),
            mb(ours.fetch_anon),
            mb(ours.fetch_rss),
        )?;
        writeln!(
            out,
            "| describe_data | {n} | {} | {} | {} | {} (RSS {}) |",
            secs(ours.describe_secs),
            baseline(theirs, &|t| t.describe_secs),
            theirs.as_ref().map_or("–".into(), |t| format!(
                "{:.1}×",
                t.describe_secs / ours.describe_secs
            )),
            mb(ours.describe_anon),
            mb(ours.describe_rss),
        )?;
    }
    let seed_mem: Vec<String> = results
        .iter()
        .filter_map(|(n, _, t)| {
            t.as_ref().ok().map(|t| {
                format!(
                    "{n} rows: fetch {}, describe_data {}",
                    mb(t.fetch_anon),
                    mb(t.describe_anon)
                )
            })
        })
        .collect();
    if !seed_mem.is_empty() {
        writeln!(out, "\nseed's server RssAnon peak: {}", seed_mem.join("; "))?;
    }
    writeln!(out, "\ngoals:")?;
    let at = |n: u64| results.iter().find(|(m, _, _)| *m == n);
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    let missing = "not measured (size not run)";
    let goal = |out: &mut dyn Write, what: &str, v: Option<String>| -> std::io::Result<()> {
        writeln!(out, "- {what}: {}", v.unwrap_or_else(|| missing.to_owned()))
    };
    goal(
        out,
        "fetch ≥ 6× the seed's server at 1M rows",
        at(1_000_000).map(|(_, o, t)| match t {
            Ok(t) => {
                let x = t.fetch_secs / o.fetch_secs;
                format!("{x:.1}×, {}", verdict(x >= 6.0))
            }
            Err(why) => format!("the seed's server: {why}"),
        }),
    )?;
    goal(
        out,
        "fetch ≥ 1.6 M rows/s at 10M rows",
        at(10_000_000).map(|(n, o, _)| {
            let r = *n as f64 / o.fetch_secs / 1e6;
            format!("{r:.2} M rows/s, {}", verdict(r >= 1.6))
        }),
    )?;
    goal(
        out,
        "dataref's anonymous memory (RssAnon peak, fetch and describe_data) < 100 MB at 10M rows",
        at(10_000_000).map(|(_, o, _)| {
            let m = o.fetch_anon.max(o.describe_anon);
            format!("{}, {}", mb(m), verdict(m < 100e6))
        }),
    )?;
    for (n, limit, label) in [
        (1_000_000, 0.1, "100 ms at 1M"),
        (10_000_000, 0.7, "700 ms at 10M"),
    ] {
        goal(
            out,
            &format!("describe_data < {label} rows"),
            at(n).map(|(_, o, _)| {
                format!(
                    "{}, {}",
                    secs(o.describe_secs),
                    verdict(o.describe_secs < limit)
                )
            }),
        )?;
    }
    Ok(())
}
