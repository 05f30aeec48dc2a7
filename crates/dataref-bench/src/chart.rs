//! `dataref bench`'s chart section: `render_chart` over the 1M-row sample, end to end
//! through `execute_tool_call` (open the memory-mapped artifact, read the columns, fold and
//! downsample, draw PNG and SVG, write both into the workspace). Goal: under 0.5 s.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use dataref_config::Config;
use dataref_store::{ArtifactStore, SystemClock};
use dataref_tool::{SharedContext, ToolCall, execute_tool_call};
use serde_json::{Value, json};

use super::fetch_sample;

const ROWS: u64 = 1_000_000;
/// Runs per chart; the best and the first are reported.
const RUNS: usize = 3;

/// Times each chart kind over the sample's `ROWS` rows.
pub fn section(dir: &Path, out: &mut impl Write) -> Result<()> {
    let config = Config::builtin_sample(dir.to_path_buf(), ROWS);
    dataref_app::ensure_sample(&config)?;
    dataref_app::progress_line(&format!("measuring render_chart over {ROWS} rows…"));
    let fetched = fetch_sample(dir, ROWS)?;
    let store: Arc<dyn ArtifactStore> = fetched.store.clone();
    let workspace = Arc::new(dataref_workspace::Workspace::for_principal(
        &fetched.dir,
        &fetched.owner,
    )?);
    let shared = SharedContext {
        home: fetched.dir.clone(),
        store,
        limits: config.limits.clone(),
        clock: Arc::new(SystemClock),
        mirrors: None,
    };
    let ctx = shared.context(fetched.owner.clone(), workspace);
    let registry = dataref_builtins::builtin_registry_with(&config, None)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .context("starting a runtime")?;
    let data_ref = fetched.meta.data_ref.to_string();
    let charts = [
        (
            "line: revenue by date",
            json!({"x": "date", "y": ["revenue"], "kind": "line"}),
        ),
        (
            "line: revenue by date, per region",
            json!({"x": "date", "y": ["revenue"], "kind": "line", "group": "region"}),
        ),
        (
            "bar: revenue by line (top 20)",
            json!({"x": "line", "y": ["revenue"], "kind": "bar"}),
        ),
        (
            "scatter: revenue vs units",
            json!({"x": "units", "y": ["revenue"], "kind": "scatter"}),
        ),
        (
            "histogram: revenue",
            json!({"x": "revenue", "kind": "histogram"}),
        ),
        (
            "pie: rows by channel",
            json!({"x": "channel", "kind": "pie"}),
        ),
    ];
    writeln!(
        out,
        "\nrender_chart over the {ROWS}-row sample (PNG + SVG written)\n"
    )?;
    writeln!(
        out,
        "| chart | rows | points drawn | first | best of {RUNS} |"
    )?;
    writeln!(out, "|---|---:|---:|---:|---:|")?;
    let mut worst_best = 0f64;
    for (name, mut args) in charts {
        args["dataRef"] = Value::String(data_ref.clone());
        let mut times = Vec::with_capacity(RUNS);
        let mut points = Value::Null;
        for _ in 0..RUNS {
            let call = ToolCall::new("render_chart", args.clone());
            let t = Instant::now();
            let o = runtime.block_on(execute_tool_call(&registry, call, &ctx));
            times.push(t.elapsed().as_secs_f64());
            if o.is_error() {
                bail!("render_chart {args} failed: {}", o.text);
            }
            points = o.structured.map_or(Value::Null, |s| s["points"].clone());
        }
        let best = times.iter().copied().fold(f64::INFINITY, f64::min);
        worst_best = worst_best.max(best);
        writeln!(
            out,
            "| {name} | {} | {points} | {:.3} s | {best:.3} s |",
            fetched.meta.rows, times[0]
        )?;
    }
    writeln!(
        out,
        "\ngoal: a chart over 1M rows < 0.5 s (slowest here: {worst_best:.3} s)"
    )?;
    Ok(())
}
