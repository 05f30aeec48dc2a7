//! `dataref bench`'s export section: the sample's rows written to CSV, XLSX and Parquet by
//! `dataref_export`, against pandas `to_csv`, `to_excel` (openpyxl) and `to_parquet`
//! (pyarrow) on the same rows, in the same run.
//!
//! Each format on each side runs in a worker process of its own that loads the rows
//! (dataref: the fetched artifact, memory-mapped; pandas: `read_sql` into a DataFrame, then
//! the heap trimmed) and resets the peak-RSS mark (`/proc/self/clear_refs`) before writing,
//! so the peak is the write's own, with the loaded data that stays resident on both sides.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use dataref_config::Config;
use dataref_export::{ExportOptions, Format};
use dataref_store::ArtifactStore;
use serde_json::{Value, json};

use super::{f, fetch_sample, mb, peak_rss_bytes, run_json, sample_sql};

const FORMATS: [Format; 3] = [Format::Csv, Format::Xlsx, Format::Parquet];

/// The export section's options (flattened into `dataref bench`).
#[derive(Debug, Args)]
pub struct ExportBenchArgs {
    /// Rows of the sample the export section writes.
    #[arg(long, default_value_t = 1_000_000, value_name = "N")]
    export_rows: u64,
    /// Skip the export section.
    #[arg(long)]
    skip_export: bool,
}

impl ExportBenchArgs {
    pub fn skip(&self) -> bool {
        self.skip_export
    }
}

#[derive(Debug, Args)]
pub struct WorkerArgs {
    #[arg(long)]
    dir: PathBuf,
    #[arg(long)]
    rows: u64,
    /// `csv`, `xlsx` or `parquet`.
    #[arg(long)]
    format: String,
}

/// Starts a new peak-RSS mark at the current RSS (Linux ≥ 4.0; a no-op elsewhere).
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Fetches the sample, then writes it in one format into the store's scratch directory.
pub fn worker(a: &WorkerArgs) -> Result<Value> {
    let format = FORMATS
        .into_iter()
        .find(|f| f.extension() == a.format)
        .with_context(|| format!("unknown format `{}`", a.format))?;
    let fetched = fetch_sample(&a.dir, a.rows)?;
    let table = fetched
        .store
        .open_table(&fetched.owner, &fetched.meta.data_ref)?;
    let path = fetched.dir.join(format!("bench.{}", format.extension()));
    reset_peak_rss();
    let t = Instant::now();
    let file =
        std::fs::File::create(&path).with_context(|| format!("creating `{}`", path.display()))?;
    let done = dataref_export::export(
        format,
        &table.meta.schema,
        &table.batches,
        &ExportOptions::default(),
        BufWriter::with_capacity(1 << 20, file),
        &|| false,
    )?;
    let secs = t.elapsed().as_secs_f64();
    let peak = peak_rss_bytes();
    let bytes = std::fs::metadata(&path).map_or(0, |m| m.len());
    std::fs::remove_file(&path)?;
    Ok(json!({
        "secs": secs, "bytes": bytes, "rows": done.rows, "peak_rss_bytes": peak,
    }))
}

const PANDAS_SCRIPT: &str = r#"
import ctypes, gc, json, os, sqlite3, sys, time
import pandas as pd
db, sql, out, name = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
df = pd.read_sql(sql, sqlite3.connect(db), params={"since": "2025-01-01"}, parse_dates=["date"])
gc.collect()
try:
    ctypes.CDLL("libc.so.6").malloc_trim(0)
except OSError:
    pass
def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0
res = {"rows": len(df), "pandas": pd.__version__}
writers = {
    "csv": lambda p: df.to_csv(p, index=False),
    "xlsx": lambda p: df.to_excel(p, index=False, engine="openpyxl"),
    "parquet": lambda p: df.to_parquet(p, index=False, engine="pyarrow"),
}
p = os.path.join(out, "pandas-bench." + name)
try:
    open("/proc/self/clear_refs", "w").write("5")
except OSError:
    pass
t = time.perf_counter()
try:
    writers[name](p)
    res.update(secs=time.perf_counter() - t, bytes=os.path.getsize(p), peak_rss_bytes=peak())
    os.remove(p)
except ImportError as e:
    res["error"] = str(e)
print(json.dumps(res))
"#;

/// Runs both sides and prints the table.
pub(super) fn section(
    args: &ExportBenchArgs,
    python: &str,
    dir: &Path,
    exe: &Path,
    pandas: Option<&str>,
    out: &mut impl Write,
) -> Result<()> {
    let n = args.export_rows;
    let config = Config::builtin_sample(dir.to_path_buf(), n);
    dataref_app::ensure_sample(&config)?;
    let db = config
        .sample
        .as_ref()
        .map(|s| s.path.clone())
        .context("sample path")?;
    let mut ours = json!({});
    let mut theirs = pandas.map(|_| json!({}));
    for format in FORMATS {
        let ext = format.extension();
        dataref_app::progress_line(&format!("measuring export of {n} rows to {ext}…"));
        ours[ext] = run_json(
            Command::new(exe)
                .args(["bench-worker", "export", "--rows", &n.to_string()])
                .args(["--format", ext, "--dir"])
                .arg(dir),
        )?;
        if let Some(theirs) = theirs.as_mut() {
            dataref_app::progress_line(&format!("measuring pandas writing {n} rows to {ext}…"));
            theirs[ext] = run_json(
                Command::new(python)
                    .args(["-c", PANDAS_SCRIPT])
                    .arg(&db)
                    .arg(sample_sql(&config)?)
                    .arg(dir)
                    .arg(ext),
            )?;
        }
    }

    writeln!(
        out,
        "\nexport_data: the sample's {n} rows × 7 columns to a file"
    )?;
    if let Some(v) = pandas {
        writeln!(
            out,
            "pandas {v}: `to_csv`, `to_excel` (openpyxl), `to_parquet` (pyarrow) of the same rows, \
             loaded beforehand with `read_sql`; each write in a process of its own"
        )?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "| format | dataref | peak RSS | file | pandas | pandas peak RSS | pandas file | speed-up |"
    )?;
    writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|")?;
    for format in FORMATS {
        let ext = format.extension();
        let o = &ours[ext];
        let t = theirs.as_ref().map(|t| &t[ext]);
        let p_secs = t.map_or(f64::NAN, |t| f(t, "secs"));
        let dash = |s: String, v: f64| if v.is_nan() { "–".to_owned() } else { s };
        writeln!(
            out,
            "| {ext} | {:.2} s | {} | {} | {} | {} | {} | {} |",
            f(o, "secs"),
            mb(f(o, "peak_rss_bytes")),
            mb(f(o, "bytes")),
            dash(format!("{p_secs:.2} s"), p_secs),
            t.map_or("–".into(), |t| dash(
                mb(f(t, "peak_rss_bytes")),
                f(t, "peak_rss_bytes")
            )),
            t.map_or("–".into(), |t| dash(mb(f(t, "bytes")), f(t, "bytes"))),
            dash(format!("{:.1}×", p_secs / f(o, "secs")), p_secs),
        )?;
        if let Some(e) = t.and_then(|t| t.get("error")) {
            writeln!(out, "  (pandas {ext}: {e})")?;
        }
    }
    writeln!(out, "\ngoals: CSV ≥ 2× pandas, XLSX ≥ 5× pandas")?;
    Ok(())
}
