//! `dataref bench page`: what the page costs the person waiting for it.
//!
//! - **A page of rows**: `view_rows` through `execute_tool_call` in-process, as `serve`
//!   runs the page's call (owner check, the mapping cache, the engine's sort with the row
//!   number as the last key, the cells as JSON), on the fetched sample: the first page in
//!   stored order, sorted by revenue, sorted and filtered, and sorted at the middle of the
//!   table. Against DuckDB on the same Arrow data already loaded (the same `ORDER BY …
//!   LIMIT 100 OFFSET …`, only the query timed).
//! - **First paint**: the page (`/` of `dataref web`, the release binary beside this one)
//!   in headless Chromium driven by Playwright, a fresh browser context per run, the
//!   `first-contentful-paint` entry of the page's own Performance API; against a one-line
//!   static page served from Python in the same browser (the floor). Also the document's
//!   bytes as sent and gzip-compressed.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use dataref_config::Config;
use dataref_store::{ArtifactStore, SystemClock};
use dataref_tool::{SharedContext, ToolCall, execute_tool_call};
use serde_json::{Value, json};

use super::{fetch_sample, group, median};

#[derive(Debug, Args)]
pub struct PageArgs {
    /// Rows of the sample (the table paged is its `fetch_sales(since = "2025-01-01")`).
    #[arg(long, default_value_t = 10_000_000)]
    rows: u64,
    /// Timed runs of each case (the median is reported), after one untimed warm-up.
    #[arg(long, default_value_t = 7, value_name = "N")]
    runs: usize,
    /// Python with pyarrow, duckdb and playwright. Default: the top-level `--python`.
    #[arg(long)]
    python: Option<String>,
    /// The Chromium Playwright drives.
    #[arg(long, default_value = "/usr/bin/chromium")]
    chromium: PathBuf,
    /// Where sample databases are kept between runs. Default: the top-level `--dir`, else
    /// `<data dir>/bench`.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

const DUCK_PY: &str = r#"
import json, sys, time
import duckdb, pyarrow as pa, pyarrow.ipc
with pa.OSFile(sys.argv[1], "rb") as f:
    table = pa.ipc.open_file(f).read_all()
con = duckdb.connect()
con.execute("SET enable_progress_bar = false")
con.register("t", table)
print(json.dumps({"ready": True, "rows": table.num_rows, "duckdb": duckdb.__version__}), flush=True)
for line in sys.stdin:
    sql = json.loads(line)["sql"]
    t = time.perf_counter()
    rows = con.execute(sql).fetchall()
    print(json.dumps({"secs": time.perf_counter() - t, "rows": len(rows)}), flush=True)
"#;

const PAINT_PY: &str = r#"
import gzip, json, sys, threading, time, urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from playwright.sync_api import sync_playwright
base, chromium, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
html = urllib.request.urlopen(base + "/").read()
class Floor(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        body = b"<!doctype html><p>hello</p>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
floor = ThreadingHTTPServer(("127.0.0.1", 0), Floor)
threading.Thread(target=floor.serve_forever, daemon=True).start()
floor_url = f"http://127.0.0.1:{floor.server_address[1]}/"
PAINT = "performance.getEntriesByName('first-contentful-paint').map(e => e.startTime)[0]"
out = {"bytes": len(html), "gzip_bytes": len(gzip.compress(html, 9)), "page": [], "floor": []}
with sync_playwright() as p:
    b = p.chromium.launch(executable_path=chromium, headless=True, args=[
        "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"])
    for i in range(runs + 1):
        for key, url in (("page", base + "/"), ("floor", floor_url)):
            c = b.new_context()
            page = c.new_page()
            page.goto(url, wait_until="load")
            # Polled from here: `wait_for_function` evaluates a string in the page, which
            # the page's Content-Security-Policy refuses (no 'unsafe-eval').
            paint, deadline = None, time.monotonic() + 10
            while paint is None and time.monotonic() < deadline:
                paint = page.evaluate(PAINT)
                if paint is None:
                    time.sleep(0.01)
            if paint is None:
                sys.exit(f"no first-contentful-paint at {url} within 10 s")
            if i > 0:
                out[key].append(paint / 1000.0)
            c.close()
    b.close()
print(json.dumps(out))
"#;

pub fn run(args: &PageArgs, python: &str, dir: Option<&Path>) -> Result<()> {
    let python = args.python.as_deref().unwrap_or(python);
    if args.runs == 0 {
        bail!("`--runs` must be at least 1");
    }
    let dir = match args.dir.as_deref().or(dir) {
        Some(d) => d.to_path_buf(),
        None => dataref_app::home(None)?.join("bench"),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating `{}`", dir.display()))?;
    let dataref = std::env::current_exe()
        .context("finding the dataref-bench executable")?
        .with_file_name("dataref");
    if !dataref.is_file() {
        bail!(
            "`{}` is not there: the first-paint runs serve the `dataref` executable\n\
             hint: `cargo build --release -p dataref -p dataref-bench` builds both side by side",
            dataref.display()
        );
    }
    let ok = Command::new(python)
        .args(["-c", "import duckdb, pyarrow, playwright"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        bail!(
            "`{python}` cannot import duckdb, pyarrow and playwright, the section's baselines\n\
             hint: `scripts/bench` sets up a venv with them, or pass `--python PATH`"
        );
    }
    let rows = rows_section(args, python, &dir)?;
    let paint = paint_section(args, python, &dataref, &dir)?;
    report(&rows, &paint, args.runs, &mut std::io::stdout().lock())
}

/// One case: a name, its `view_rows` arguments (without the dataRef) and DuckDB's SQL.
struct Case {
    name: &'static str,
    args: Value,
    sql: String,
}

fn cases(rows: u64) -> Vec<Case> {
    let middle = rows / 2;
    vec![
        Case {
            name: "first page, stored order",
            args: json!({}),
            sql: "SELECT * FROM t LIMIT 100".into(),
        },
        Case {
            name: "sorted by revenue, largest first",
            args: json!({"sort": [{"column": "revenue", "descending": true}]}),
            sql: "SELECT * FROM t ORDER BY revenue DESC NULLS LAST LIMIT 100".into(),
        },
        Case {
            name: "sorted, region = EMEA",
            args: json!({"sort": [{"column": "revenue", "descending": true}],
                         "filter": [{"column": "region", "op": "=", "value": "EMEA"}]}),
            sql: "SELECT * FROM t WHERE region = 'EMEA' ORDER BY revenue DESC NULLS LAST LIMIT 100"
                .into(),
        },
        Case {
            name: "sorted, the middle page",
            args: json!({"sort": [{"column": "revenue", "descending": true}], "offset": middle}),
            sql: format!(
                "SELECT * FROM t ORDER BY revenue DESC NULLS LAST LIMIT 100 OFFSET {middle}"
            ),
        },
    ]
}

struct RowsMeasured {
    rows: u64,
    /// (case, dataref seconds, DuckDB seconds, page bytes)
    cases: Vec<(&'static str, f64, f64, usize)>,
    duckdb: String,
}

fn ask(stdin: &mut ChildStdin, stdout: &mut BufReader<ChildStdout>, v: &Value) -> Result<Value> {
    writeln!(stdin, "{v}")?;
    stdin.flush()?;
    read_line(stdout)
}

fn read_line(stdout: &mut BufReader<ChildStdout>) -> Result<Value> {
    let mut line = String::new();
    stdout.read_line(&mut line)?;
    serde_json::from_str(&line).with_context(|| format!("the Python baseline said {line:?}"))
}

fn rows_section(args: &PageArgs, python: &str, dir: &Path) -> Result<RowsMeasured> {
    let config = Config::builtin_sample(dir.to_path_buf(), args.rows);
    dataref_app::ensure_sample(&config)?;
    dataref_app::progress_line(&format!("fetching the {}-row sample…", args.rows));
    let fetched = fetch_sample(dir, args.rows)?;
    let store: Arc<dyn ArtifactStore> = fetched.store.clone();
    let workspace = Arc::new(dataref_workspace::Workspace::for_principal(
        &fetched.dir,
        &fetched.owner,
    )?);
    let shared = SharedContext {
        home: fetched.dir.clone(),
        store: store.clone(),
        limits: config.limits.clone(),
        clock: Arc::new(SystemClock),
        mirrors: None,
    };
    let ctx = shared.context(fetched.owner.clone(), workspace);
    let registry = dataref_builtins::builtin_registry_with(&config, None)?;
    let path = store
        .open_table(&fetched.owner, &fetched.meta.data_ref)?
        .path;
    let mut child: Child = Command::new(python)
        .args(["-c", DUCK_PY])
        .arg(&path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the DuckDB baseline")?;
    let mut stdin = child.stdin.take().context("no stdin")?;
    let mut stdout = BufReader::new(child.stdout.take().context("no stdout")?);
    let ready = read_line(&mut stdout)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    dataref_app::progress_line(&format!(
        "paging {} rows ({} runs of each case, interleaved)…",
        fetched.meta.rows, args.runs
    ));
    let mut out = Vec::new();
    for case in cases(fetched.meta.rows) {
        let mut ours = Vec::new();
        let mut theirs = Vec::new();
        let mut bytes = 0;
        for i in 0..=args.runs {
            let mut a = case.args.clone();
            a["dataRef"] = json!(fetched.meta.data_ref.to_string());
            let t = Instant::now();
            let o = runtime.block_on(execute_tool_call(
                &registry,
                ToolCall::new("view_rows", a),
                &ctx,
            ));
            let secs = t.elapsed().as_secs_f64();
            let page = o
                .structured
                .as_ref()
                .and_then(|v| v.get("page"))
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            if o.is_error() || page != 100 {
                bail!("`{}`: view_rows gave {page} rows: {}", case.name, o.text);
            }
            bytes = o.structured.map_or(0, |v| v.to_string().len());
            let duck = ask(&mut stdin, &mut stdout, &json!({"sql": case.sql}))?;
            if duck.get("rows").and_then(Value::as_u64) != Some(100) {
                bail!("`{}`: DuckDB said {duck}", case.name);
            }
            if i > 0 {
                ours.push(secs);
                theirs.push(duck["secs"].as_f64().unwrap_or(f64::NAN));
            }
        }
        out.push((case.name, median(&mut ours), median(&mut theirs), bytes));
    }
    drop(stdin);
    let _ = child.wait();
    Ok(RowsMeasured {
        rows: fetched.meta.rows,
        cases: out,
        duckdb: ready["duckdb"].as_str().unwrap_or("?").to_owned(),
    })
}

struct PaintMeasured {
    page: f64,
    floor: f64,
    bytes: u64,
    gzip_bytes: u64,
}

fn paint_section(
    args: &PageArgs,
    python: &str,
    dataref: &Path,
    dir: &Path,
) -> Result<PaintMeasured> {
    let home = dir.join(format!("page-{}", std::process::id()));
    let mut server = Command::new(dataref)
        .args(["web", "--rows", "1000", "--home"])
        .arg(&home)
        .env_remove("DATAREF_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting `dataref web`")?;
    let mut stderr = BufReader::new(server.stderr.take().context("no stderr")?);
    let mut base = None;
    let mut said = String::new();
    for _ in 0..200 {
        let mut line = String::new();
        if stderr.read_line(&mut line)? == 0 {
            break;
        }
        said.push_str(&line);
        if let Some(rest) = line.split("open ").nth(1)
            && let Some(url) = rest.split("/#token=").next()
        {
            base = Some(url.to_owned());
            break;
        }
    }
    let result = (|| {
        let base = base.with_context(|| format!("`dataref web` did not start:\n{said}"))?;
        dataref_app::progress_line("first paint in headless Chromium…");
        let out = Command::new(python)
            .args(["-c", PAINT_PY, &base])
            .arg(&args.chromium)
            .arg(args.runs.to_string())
            .output()
            .context("running the first-paint script")?;
        if !out.status.success() {
            bail!(
                "the first-paint script failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let v: Value = serde_json::from_slice(&out.stdout)?;
        let times = |k: &str| -> f64 {
            let mut s: Vec<f64> = v[k]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_f64).collect())
                .unwrap_or_default();
            median(&mut s)
        };
        Ok(PaintMeasured {
            page: times("page"),
            floor: times("floor"),
            bytes: v["bytes"].as_u64().unwrap_or(0),
            gzip_bytes: v["gzip_bytes"].as_u64().unwrap_or(0),
        })
    })();
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&home);
    result
}

fn ms(secs: f64) -> String {
    format!("{:.1} ms", secs * 1e3)
}

fn report(
    rows: &RowsMeasured,
    paint: &PaintMeasured,
    runs: usize,
    out: &mut impl Write,
) -> Result<()> {
    writeln!(
        out,
        "## The page (medians of {runs} runs; DuckDB {})\n",
        rows.duckdb
    )?;
    writeln!(
        out,
        "A page of 100 rows of {} rows, server time (goal sorted: under 100 ms):\n",
        group(rows.rows)
    )?;
    writeln!(
        out,
        "| case | view_rows | DuckDB, same query | ratio | page JSON |"
    )?;
    writeln!(out, "|---|---:|---:|---:|---:|")?;
    for (name, ours, theirs, bytes) in &rows.cases {
        writeln!(
            out,
            "| {name} | {} | {} | {:.2}× | {} B |",
            ms(*ours),
            ms(*theirs),
            ours / theirs,
            group(*bytes as u64)
        )?;
    }
    writeln!(out)?;
    writeln!(out, "| first paint | page | one-line static page |")?;
    writeln!(out, "|---|---:|---:|")?;
    writeln!(
        out,
        "| first-contentful-paint (goal under 300 ms) | {} | {} |",
        ms(paint.page),
        ms(paint.floor)
    )?;
    writeln!(
        out,
        "\nThe page's assets: {} B as sent, {} B gzip-compressed (goal under 1 MB).",
        group(paint.bytes),
        group(paint.gzip_bytes)
    )?;
    Ok(())
}
