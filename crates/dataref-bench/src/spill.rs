//! `dataref bench`'s spill section: what spilling adds to one tool call, measured through
//! `execute_tool_call` with spilling on against the same call with it off. Goal: under
//! 1 ms added at 100 KB (p50).

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use async_trait::async_trait;
use dataref_config::{CallLimits, SpillConfig};
use dataref_protocol::{Principal, ToolSpec};
use dataref_store::{LocalStore, StoreLimits, SystemClock};
use dataref_tool::{
    RunContext, SharedContext, Tool, ToolCall, ToolError, ToolOutput, ToolRegistry,
    execute_tool_call,
};
use serde_json::{Map, Value, json};

use super::tempdir_in;

/// A tool that returns a prepared text, as an upstream MCP server returns a text block.
struct Payload {
    spec: ToolSpec,
    texts: Vec<Arc<String>>,
}

#[async_trait]
impl Tool for Payload {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(
        &self,
        args: Map<String, Value>,
        _: &RunContext,
    ) -> Result<ToolOutput, ToolError> {
        let i = args.get("i").and_then(Value::as_u64).unwrap_or(0) as usize;
        let text = self
            .texts
            .get(i)
            .map(|t| t.as_str().to_owned())
            .unwrap_or_default();
        Ok(ToolOutput {
            structured: Value::Null,
            attachments: Vec::new(),
            text: Some(text),
        })
    }
}

/// Plain text of about `bytes`.
fn text_of(bytes: usize) -> String {
    let line = "2026-11-29 22:35:01 worker-7 INFO request served in 12 ms from cache\n";
    line.repeat(bytes / line.len() + 1)[..bytes].to_owned()
}

/// A JSON document of about `bytes` that is not a table (nested objects).
fn json_of(bytes: usize) -> String {
    let mut items = Vec::new();
    let mut len = 2;
    let mut i = 0u64;
    while len < bytes {
        let v = json!({"id": i, "frame": {"file": "libpthread.so.0", "line": i * 7, "fn": "start_thread"}});
        len += v.to_string().len() + 1;
        items.push(v);
        i += 1;
    }
    Value::Array(items).to_string()
}

/// Flat records of about `bytes`: also written as CSV and stored as a table.
fn records_of(bytes: usize) -> String {
    let mut items = Vec::new();
    let mut len = 2;
    let mut i = 0u64;
    while len < bytes {
        let v = json!({"id": i, "name": format!("item {i}"), "price": i as f64 * 1.25, "ok": i.is_multiple_of(3)});
        len += v.to_string().len() + 1;
        items.push(v);
        i += 1;
    }
    Value::Array(items).to_string()
}

fn p50(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn section(dir: &Path, out: &mut impl Write) -> Result<()> {
    dataref_app::progress_line("measuring spill overhead…");
    let root = tempdir_in(dir)?;
    let result = measure(&root, out);
    let _ = std::fs::remove_dir_all(&root);
    result
}

fn measure(root: &Path, out: &mut impl Write) -> Result<()> {
    let cases: Vec<(&str, usize, String, usize)> = vec![
        ("text", 1_024, text_of(1_024), 300),
        ("text", 100_000, text_of(100_000), 300),
        ("text", 10_000_000, text_of(10_000_000), 15),
        ("JSON, not a table", 100_000, json_of(100_000), 300),
        ("JSON, not a table", 10_000_000, json_of(10_000_000), 15),
        (
            "flat records (+ CSV + table)",
            100_000,
            records_of(100_000),
            100,
        ),
        (
            "flat records (+ CSV + table)",
            10_000_000,
            records_of(10_000_000),
            10,
        ),
    ];
    let mut spec = ToolSpec::from_types::<Value, Value>("payload", "returns a prepared text");
    spec.input_schema = json!({"type": "object", "properties": {"i": {"type": "integer"}}});
    spec.output_schema = None;
    let tool = Arc::new(Payload {
        spec,
        texts: cases.iter().map(|c| Arc::new(c.2.clone())).collect(),
    });
    let registry = |spill: SpillConfig| -> Result<ToolRegistry> {
        let mut b = ToolRegistry::builder();
        b.register(tool.clone());
        b.spill(spill);
        Ok(b.build()?)
    };
    let on = registry(SpillConfig::default())?;
    let off = registry(SpillConfig {
        enabled: false,
        ..SpillConfig::default()
    })?;
    let owner = Principal::new("bench")?;
    let store = LocalStore::open(root, StoreLimits::default(), Arc::new(SystemClock))?;
    let workspace = Arc::new(dataref_workspace::Workspace::for_principal(root, &owner)?);
    let shared = SharedContext {
        home: root.to_path_buf(),
        store: Arc::new(store),
        // No cap: the call without spilling returns the whole text, like the one with it
        // (the cap's own cost is not spill's).
        limits: CallLimits {
            max_result_chars: usize::MAX,
            ..CallLimits::default()
        },
        clock: Arc::new(SystemClock),
        mirrors: None,
    };
    let ctx = shared.context(owner, workspace);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .context("starting a runtime")?;
    writeln!(
        out,
        "\nspill: one call through `execute_tool_call` with spilling on (file written and renamed into the workspace, not fsynced; records also as CSV and a stored table, which is fsynced) against the same call with it off\n"
    )?;
    writeln!(
        out,
        "| result | size | runs | p50 spill off | p50 spill on | added (p50) |"
    )?;
    writeln!(out, "|---|---:|---:|---:|---:|---:|")?;
    let mut added_100k_text = f64::NAN;
    for (i, (kind, bytes, _, runs)) in cases.iter().enumerate() {
        let (mut t_off, mut t_on) = (Vec::new(), Vec::new());
        for _ in 0..*runs {
            for (registry, times) in [(&off, &mut t_off), (&on, &mut t_on)] {
                let call = ToolCall::new("payload", json!({ "i": i }));
                let t = Instant::now();
                let o = runtime.block_on(execute_tool_call(registry, call, &ctx));
                times.push(t.elapsed().as_secs_f64());
                if o.is_error() {
                    bail!("the payload call failed: {}", o.text);
                }
            }
        }
        let (a, b) = (p50(&mut t_off), p50(&mut t_on));
        if *kind == "text" && *bytes == 100_000 {
            added_100k_text = b - a;
        }
        writeln!(
            out,
            "| {kind} | {} | {runs} | {} | {} | {} |",
            size(*bytes),
            ms(a),
            ms(b),
            ms(b - a)
        )?;
    }
    writeln!(
        out,
        "\ngoal: under 1 ms added at 100 KB, p50 ({}: {})",
        if added_100k_text < 0.001 {
            "met"
        } else {
            "not met"
        },
        ms(added_100k_text)
    )?;
    Ok(())
}

fn size(bytes: usize) -> String {
    match bytes {
        b if b >= 1_000_000 => format!("{} MB", b / 1_000_000),
        b if b >= 1_000 => format!("{} KB", b / 1_000),
        b => format!("{b} B"),
    }
}

fn ms(secs: f64) -> String {
    format!("{:.2} ms", secs * 1e3)
}
