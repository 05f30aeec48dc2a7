//! `dataref bench sql`: the seed's question written in SQL (`QOQ_SQL`: revenue per product
//! line in the last quarter against the one before, the five largest drops) over the
//! fetched sample, through `run_sql` as a call makes it, against DuckDB and pandas in one
//! Python interpreter that holds the same Arrow data already loaded. One run, same machine,
//! the four interleaved.
//!
//! - **run_sql (tool)**: `execute_tool_call` in-process, as `serve` runs a call: the owner
//!   check, the artifact from the store's mapping cache (its columns decoded by the
//!   warm-up, as a second question about a table finds them), parse, plan and run, the
//!   result stored as a new artifact and described.
//! - **run_sql engine only**: `dataref_sql::Query` over the table opened once beforehand:
//!   parse, plan, run and collect, the part DuckDB's query time compares with.
//! - **DuckDB**: the artifact's Arrow IPC file read into memory with pyarrow, registered
//!   with `con.register`; only `execute(sql).fetchall()` is timed.
//! - **pandas**: the seed's `run_python` code (`pivot_table`) on `to_pandas()` of the same
//!   table; only the code is timed.
//!
//! The four answers (five lines and their deltas) are compared on every run; any
//! disagreement stops the bench.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use arrow_array::RecordBatch;
use clap::Args;
use dataref_config::Config;
use dataref_config::QOQ_SQL;
use dataref_protocol::DataRef;
use dataref_store::{ArtifactStore, SystemClock, Table};
use dataref_tool::{RunContext, SharedContext, ToolCall, ToolRegistry, execute_tool_call};
use serde_json::{Value, json};

use super::{Fetched, fetch_sample, group, median};
use crate::context::SEED_QOQ_CODE;

#[derive(Debug, Args)]
pub struct SqlArgs {
    /// Sample sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1000000,10000000")]
    rows: Vec<u64>,
    /// Timed runs of each of the four, interleaved (the median is reported), after one
    /// untimed warm-up of each.
    #[arg(long, default_value_t = 5, value_name = "N")]
    runs: usize,
    /// Python with pandas, pyarrow and duckdb. Default: the top-level `--python`.
    #[arg(long)]
    python: Option<String>,
    /// Where sample databases are kept between runs. Default: the top-level `--dir`, else
    /// `<data dir>/bench`.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

/// One interpreter, the table loaded once; it answers `duckdb` and `pandas` on stdin with
/// one JSON line each: the time of the query (or the code) alone and the answer.
const BASELINE_PY: &str = r#"
import json, sys, time
path, duck_sql, code = sys.argv[1], sys.argv[2], sys.argv[3]
import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.ipc

def emit(v):
    sys.stdout.write(json.dumps(v) + "\n")
    sys.stdout.flush()

t = time.perf_counter()
with pa.OSFile(path, "rb") as f:
    table = pa.ipc.open_file(f).read_all()
sales = table.to_pandas(date_as_object=False)
con = duckdb.connect()
# No progress bar: it would be printed on stdout, where the answers go.
con.execute("SET enable_progress_bar = false")
con.register("sales", table)
# DuckDB's own columnar table, copied from the same Arrow data: usually faster than a scan
# of registered Arrow, so the goal is judged against the faster of the two.
native = duckdb.connect()
native.execute("SET enable_progress_bar = false")
native.register("arrow_in", table)
native.execute("CREATE TABLE sales AS SELECT * FROM arrow_in")
native.unregister("arrow_in")
emit({"ready": True, "rows": table.num_rows, "load_secs": time.perf_counter() - t,
      "duckdb_threads": con.execute("SELECT current_setting('threads')").fetchone()[0],
      "duckdb": duckdb.__version__, "pandas": pd.__version__, "pyarrow": pa.__version__,
      "python": sys.version.split()[0]})
compiled = compile(code, "<code>", "exec")
for line in sys.stdin:
    cmd = line.strip()
    if cmd in ("duckdb", "duckdb_table"):
        c = con if cmd == "duckdb" else native
        t = time.perf_counter()
        rows = c.execute(duck_sql).fetchall()
        secs = time.perf_counter() - t
        emit({"secs": secs, "answer": [[str(r[0]), float(r[3])] for r in rows]})
    elif cmd == "pandas":
        g = {"__name__": "__main__", "pd": pd, "np": np, "sales": sales, "outputs": {},
             "result": None}
        t = time.perf_counter()
        exec(compiled, g)
        secs = time.perf_counter() - t
        emit({"secs": secs,
              "answer": [[str(k), float(v)] for k, v in g["delta"].head(5).items()]})
    elif cmd == "quit":
        break
    else:
        emit({"error": "unknown command " + repr(cmd)})
"#;

/// The seed's question as a model often writes it: `date_trunc` on every row, the quarters
/// compared by equality (`QOQ_SQL` computes the bounds once and filters by range).
pub const QOQ_TRUNC_SQL: &str = "\
WITH q AS (
  SELECT line, date_trunc('quarter', date) AS quarter, revenue FROM sales
), bounds AS (
  SELECT max(quarter) AS last_q FROM q
), by_line AS (
  SELECT line,
    coalesce(sum(revenue) FILTER (WHERE quarter = last_q - INTERVAL '3 months'), 0) AS previous,
    coalesce(sum(revenue) FILTER (WHERE quarter = last_q), 0) AS latest
  FROM q CROSS JOIN bounds
  GROUP BY line
)
SELECT line, previous, latest, latest - previous AS delta,
  round(100 * (latest - previous) / nullif(previous, 0), 1) AS pct
FROM by_line
ORDER BY delta, line
LIMIT 5
";

/// The two forms of the question: `(name, sql)`.
const FORMS: [(&str, &str); 2] = [
    ("bounds once (`QOQ_SQL`)", QOQ_SQL),
    ("`date_trunc` per row", QOQ_TRUNC_SQL),
];

/// What the interpreter must import.
const CHECK_PY: &str = "import duckdb, pandas, pyarrow";

/// Five lines and their deltas, in order.
type Answer = Vec<(String, f64)>;

/// The deltas are differences of two sums: they may differ by the order of summation, in
/// proportion to the sums rather than to the (small) difference.
const SUM_TOLERANCE: f64 = 1e-9;

/// Medians of one size.
struct Measured {
    rows: u64,
    form: &'static str,
    tool: f64,
    engine: f64,
    duckdb: f64,
    /// DuckDB on its own table (copied from the same Arrow data).
    duckdb_table: f64,
    pandas: f64,
}

impl Measured {
    /// The faster DuckDB: on the registered Arrow table or on its own.
    fn duck(&self) -> f64 {
        self.duckdb.min(self.duckdb_table)
    }
}

pub fn run(args: &SqlArgs, python: &str, dir: Option<&Path>) -> Result<()> {
    let python = args.python.as_deref().unwrap_or(python);
    let dir = match args.dir.as_deref().or(dir) {
        Some(d) => d.to_path_buf(),
        None => dataref_app::home(None)?.join("bench"),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating `{}`", dir.display()))?;
    if args.runs == 0 {
        bail!("`--runs` must be at least 1");
    }
    check_python(python)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting a runtime")?;
    let mut measured = Vec::new();
    let mut versions = Value::Null;
    for &n in &args.rows {
        let config = Config::builtin_sample(dir.clone(), n);
        dataref_app::ensure_sample(&config)?;
        dataref_app::progress_line(&format!("fetching the {n}-row sample…"));
        let fetched = fetch_sample(&dir, n)?;
        for (form, sql) in FORMS {
            let (m, v) = measure(args.runs, python, form, sql, &config, &fetched, &runtime)
                .with_context(|| format!("measuring run_sql on {n} rows, {form}"))?;
            measured.push(m);
            versions = v;
        }
    }
    report(
        &measured,
        &versions,
        args.runs,
        &mut std::io::stdout().lock(),
    )
}

fn check_python(python: &str) -> Result<()> {
    let ok = Command::new(python)
        .args(["-c", CHECK_PY])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        bail!(
            "`{python}` cannot import duckdb, pandas and pyarrow, the section's baselines\nhint: `scripts/bench` sets up a venv with them, or pass `--python PATH`"
        );
    }
    Ok(())
}

fn measure(
    runs: usize,
    python: &str,
    form: &'static str,
    duck_sql: &str,
    config: &Config,
    fetched: &Fetched,
    runtime: &tokio::runtime::Runtime,
) -> Result<(Measured, Value)> {
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
    let registry = dataref_builtins::builtin_registry_with(config, None)?;
    // The engine-only runs take the table opened once, with the limits the tool uses.
    let table = store.open_table(&fetched.owner, &fetched.meta.data_ref)?;
    let limits = dataref_sql::QueryLimits {
        memory_bytes: usize::try_from(config.sql.memory_bytes).unwrap_or(usize::MAX),
        ..dataref_sql::QueryLimits::default()
    };
    let tool = Tool {
        sql: duck_sql,
        registry: &registry,
        ctx: &ctx,
        store: store.as_ref(),
        data_ref: &fetched.meta.data_ref,
    };

    dataref_app::progress_line(&format!(
        "loading {} rows into DuckDB and pandas…",
        fetched.meta.rows
    ));
    let mut py = Baseline::start(python, &table.path, duck_sql)?;
    let ready = py.read()?;
    if ready.get("rows").and_then(Value::as_u64) != Some(fetched.meta.rows) {
        bail!(
            "the Python baseline read {ready} rather than {} rows",
            fetched.meta.rows
        );
    }
    dataref_app::progress_line(&format!(
        "measuring the QoQ query, {form}, on {} rows ({runs} runs of each, interleaved)…",
        fetched.meta.rows
    ));
    let mut times: [Vec<f64>; 5] = Default::default();
    // Run 0 is the untimed warm-up.
    for i in 0..=runs {
        let (t_tool, (reference, scale)) = runtime.block_on(tool.run())?;
        let (t_engine, (engine, _)) = runtime.block_on(engine_run(duck_sql, &table, &limits))?;
        let (t_duck, duck) = py.ask("duckdb")?;
        let (t_duck_table, duck_table) = py.ask("duckdb_table")?;
        let (t_pandas, pandas) = py.ask("pandas")?;
        for (who, answer) in [
            ("run_sql engine only", &engine),
            ("DuckDB", &duck),
            ("DuckDB (own table)", &duck_table),
            ("pandas", &pandas),
        ] {
            check_same(&reference, scale, who, answer)?;
        }
        if i > 0 {
            let t = [t_tool, t_engine, t_duck, t_duck_table, t_pandas];
            for (s, t) in times.iter_mut().zip(t) {
                s.push(t);
            }
        }
    }
    py.quit()?;
    let [tool_t, engine_t, duck_t, duck_table_t, pandas_t] = times.map(|mut s| median(&mut s));
    let versions = json!({
        "duckdb": ready.get("duckdb"),
        "pandas": ready.get("pandas"),
        "pyarrow": ready.get("pyarrow"),
        "python": ready.get("python"),
        "duckdb_threads": ready.get("duckdb_threads"),
        "engine_threads": limits.threads,
    });
    Ok((
        Measured {
            rows: fetched.meta.rows,
            form,
            tool: tool_t,
            engine: engine_t,
            duckdb: duck_t,
            duckdb_table: duck_table_t,
            pandas: pandas_t,
        },
        versions,
    ))
}

/// `run_sql` as a call makes it, through the registry.
struct Tool<'a> {
    sql: &'a str,
    registry: &'a ToolRegistry,
    ctx: &'a RunContext,
    store: &'a dyn ArtifactStore,
    data_ref: &'a DataRef,
}

impl Tool<'_> {
    /// One timed call; the answer is read back from the stored result, untimed.
    async fn run(&self) -> Result<(f64, (Answer, f64))> {
        let call = ToolCall::new(
            "run_sql",
            json!({"sql": self.sql, "inputs": {"sales": self.data_ref.to_string()}}),
        );
        let t = Instant::now();
        let o = execute_tool_call(self.registry, call, self.ctx).await;
        let secs = t.elapsed().as_secs_f64();
        if o.is_error() {
            bail!("run_sql failed: {}", o.text);
        }
        let result: DataRef = o
            .structured
            .as_ref()
            .and_then(|s| s.get("dataRef"))
            .and_then(Value::as_str)
            .with_context(|| format!("run_sql returned no `dataRef`: {}", o.text))
            .and_then(|s| DataRef::parse(s).context("run_sql's `dataRef`"))?;
        let stored = self.store.open_table(&self.ctx.principal, &result)?;
        Ok((secs, answer(&stored.batches)?))
    }
}

/// The engine alone over the opened table: parse, plan, run and collect.
async fn engine_run(
    sql: &str,
    table: &Table,
    limits: &dataref_sql::QueryLimits,
) -> Result<(f64, (Answer, f64))> {
    let input = dataref_sql::Input::new("sales", table.meta.schema.clone(), table.batches.clone());
    let t = Instant::now();
    let mut q = dataref_sql::Query::start(sql, vec![input], limits).await?;
    let mut batches = Vec::new();
    while let Some(b) = q.next_batch().await? {
        batches.push(b);
    }
    let secs = t.elapsed().as_secs_f64();
    Ok((secs, answer(&batches)?))
}

/// The `line` and `delta` columns of a result, and the largest `previous` or `latest` sum
/// (the scale of the deltas' rounding).
fn answer(batches: &[RecordBatch]) -> Result<(Answer, f64)> {
    let mut out = Vec::new();
    let mut scale = 0.0_f64;
    let number = |column: &arrow_array::ArrayRef, row| {
        dataref_store::cell_to_json(column, row, None)
            .0
            .as_f64()
            .unwrap_or(f64::NAN)
    };
    for b in batches {
        let columns = ["line", "previous", "latest", "delta"].map(|c| b.column_by_name(c));
        let [Some(line), Some(previous), Some(latest), Some(delta)] = columns else {
            bail!(
                "the result has no `line`, `previous`, `latest` and `delta` columns: {:?}",
                b.schema()
            );
        };
        for row in 0..b.num_rows() {
            let (l, _) = dataref_store::cell_to_json(line, row, None);
            scale = scale.max(number(previous, row).abs().max(number(latest, row).abs()));
            out.push((
                l.as_str().map_or_else(|| l.to_string(), str::to_owned),
                number(delta, row),
            ));
        }
    }
    Ok((out, scale))
}

/// The same five lines in the same order, deltas equal but for the order of the sums.
fn check_same(reference: &Answer, scale: f64, who: &str, answer: &Answer) -> Result<()> {
    let tolerance = SUM_TOLERANCE * scale.max(1.0);
    let same = reference.len() == 5
        && reference.len() == answer.len()
        && reference
            .iter()
            .zip(answer)
            .all(|((l1, d1), (l2, d2))| l1 == l2 && (d1 - d2).abs() <= tolerance);
    if !same {
        bail!(
            "the answers differ\n  run_sql (tool): {reference:?}\n  {who}: {answer:?}\nhint: the four must agree on the five lines and their deltas; one of them computes something else"
        );
    }
    Ok(())
}

/// The Python interpreter holding the loaded table.
struct Baseline {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Baseline {
    fn start(python: &str, path: &Path, duck_sql: &str) -> Result<Self> {
        let mut child = Command::new(python)
            .args(["-c", BASELINE_PY])
            .arg(path)
            .arg(duck_sql)
            .arg(SEED_QOQ_CODE)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            // Its errors show as they happen, above ours.
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting `{python}`"))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            bail!("no pipes to `{python}`");
        };
        Ok(Self {
            child,
            stdin,
            stdout: BufReader::new(stdout),
        })
    }

    fn read(&mut self) -> Result<Value> {
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .context("reading from the Python baseline")?;
        if line.is_empty() {
            bail!("the Python baseline exited (its error is above)");
        }
        let v: Value = serde_json::from_str(&line)
            .with_context(|| format!("reading the Python baseline's answer: {line}"))?;
        if let Some(e) = v.get("error") {
            bail!("the Python baseline: {e}");
        }
        Ok(v)
    }

    fn ask(&mut self, what: &str) -> Result<(f64, Answer)> {
        writeln!(self.stdin, "{what}").context("writing to the Python baseline")?;
        self.stdin.flush()?;
        let v = self.read()?;
        let secs = v.get("secs").and_then(Value::as_f64).unwrap_or(f64::NAN);
        let answer = v
            .get("answer")
            .and_then(Value::as_array)
            .with_context(|| format!("{what} gave no answer: {v}"))?
            .iter()
            .map(|p| {
                (
                    p.get(0).and_then(Value::as_str).unwrap_or("?").to_owned(),
                    p.get(1).and_then(Value::as_f64).unwrap_or(f64::NAN),
                )
            })
            .collect();
        Ok((secs, answer))
    }

    fn quit(mut self) -> Result<()> {
        writeln!(self.stdin, "quit").context("writing to the Python baseline")?;
        self.stdin.flush()?;
        let status = self.child.wait()?;
        if !status.success() {
            bail!("the Python baseline ended with {status}");
        }
        Ok(())
    }
}

/// On an error the interpreter would otherwise finish what it was asked first.
impl Drop for Baseline {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.child.kill().ok();
            self.child.wait().ok();
        }
    }
}

fn secs(s: f64) -> String {
    if s < 1.0 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{s:.2} s")
    }
}

fn report(measured: &[Measured], v: &Value, runs: usize, out: &mut impl Write) -> Result<()> {
    let text = |k: &str| match v.get(k) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => "?".to_owned(),
        Some(other) => other.to_string(),
    };
    writeln!(
        out,
        "\nrun_sql: the seed's QoQ question in SQL, in two forms (`QOQ_SQL`, bounds computed once; `QOQ_TRUNC_SQL`, `date_trunc` per row as a model often writes it) over the fetched sample, with run_sql's limits on, median of {runs} runs each, interleaved after one untimed warm-up; {} cores, the engine on {} threads, DuckDB {} on {} threads; pandas {}, pyarrow {}, Python {}\n",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        text("engine_threads"),
        text("duckdb"),
        text("duckdb_threads"),
        text("pandas"),
        text("pyarrow"),
        text("python"),
    )?;
    writeln!(
        out,
        "| rows | SQL | run_sql (tool) | run_sql engine only | DuckDB on Arrow | DuckDB own table | pandas | tool ÷ DuckDB | pandas ÷ tool |"
    )?;
    writeln!(out, "|---:|---|---:|---:|---:|---:|---:|---:|---:|")?;
    for m in measured {
        writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {:.2}× (engine {:.2}×) | {:.1}× |",
            group(m.rows),
            m.form,
            secs(m.tool),
            secs(m.engine),
            secs(m.duckdb),
            secs(m.duckdb_table),
            secs(m.pandas),
            m.tool / m.duck(),
            m.engine / m.duck(),
            m.pandas / m.tool,
        )?;
    }
    writeln!(
        out,
        "\n- run_sql (tool): `execute_tool_call` in-process: the owner check, the artifact from the store's mapping cache (its columns decoded by the warm-up, as for any second question about a table), parse, plan and run, the 5-row result stored as an artifact and described.\n\
         - engine only: `dataref_sql::Query` over the table opened (mapped) once beforehand: parse, plan, run, collect.\n\
         - DuckDB on Arrow: the artifact's Arrow IPC file read into memory with pyarrow, `con.register(\"sales\", table)`; own table: `CREATE TABLE sales AS SELECT * FROM` that Arrow table. Timed: `execute(sql).fetchall()`, the same SQL text. The ratios are to the faster of the two.\n\
         - pandas: the seed's `run_python` code (`pivot_table` line × quarter, last-quarter delta) on `to_pandas()` of the same table; timed: the code alone.\n\
         - The five agreed on the five lines and their deltas in every run."
    )?;
    writeln!(out, "\ngoals:")?;
    for n in [1_000_000, 10_000_000] {
        for (form, _) in FORMS {
            let Some(m) = measured.iter().find(|m| m.rows == n && m.form == form) else {
                writeln!(out, "- at {}, {form}: not measured (`--rows`)", group(n))?;
                continue;
            };
            let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
            writeln!(
                out,
                "- at {}, {form}: run_sql no slower than DuckDB (issue #28): {:.2}× {}; at least 3× faster than pandas: {:.1}× {}",
                group(n),
                m.tool / m.duck(),
                verdict(m.tool <= m.duck()),
                m.pandas / m.tool,
                verdict(m.pandas >= 3.0 * m.tool),
            )?;
        }
    }
    Ok(())
}
