//! Spill and delegated calls through `execute_tool_call`, on the real workspace and store.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use dataref_config::SpillConfig;
use dataref_protocol::{DataRef, ToolSpec};
use dataref_store::SystemClock;
use dataref_tool::{
    CallOutcome, RunContext, Tool, ToolCall, ToolError, ToolOutput, ToolRegistry,
    execute_tool_call, sweep_spill,
};
use serde_json::{Map, Value, json};

use crate::{Fixture, fixture_with};

/// Returns what it is asked to, as an upstream MCP server would: text, JSON as text,
/// records, an error, or a labelled echo of its arguments.
struct Echo {
    spec: ToolSpec,
}

impl Echo {
    fn new() -> Self {
        let mut spec = ToolSpec::from_types::<Value, Value>("echo", "returns what it is asked to");
        spec.input_schema = json!({
            "type": "object",
            "properties": {
                "char": {"type": "string"},
                "count": {"type": "integer", "minimum": 0},
                "json": {},
                "records": {"type": "integer", "minimum": 0},
                "error": {"type": "integer", "minimum": 0},
                "label": {"type": "string"},
                "nested": {"type": "object"}
            },
            "additionalProperties": true
        });
        spec.output_schema = Some(json!({"type": "object"}));
        Self { spec }
    }
}

fn record(i: u64) -> Value {
    json!({"id": i, "name": format!("item {i}"), "price": i as f64 * 1.5, "ok": i.is_multiple_of(2)})
}

#[async_trait]
impl Tool for Echo {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(
        &self,
        args: Map<String, Value>,
        _: &RunContext,
    ) -> Result<ToolOutput, ToolError> {
        let text = |t: String| ToolOutput {
            structured: Value::Null,
            attachments: vec![],
            text: Some(t),
        };
        if let Some(n) = args.get("error").and_then(Value::as_u64) {
            let mut message = String::from("Traceback (most recent call last):\n");
            while message.len() < n as usize {
                message.push_str("  File \"x.py\", line 7, in <module>\n");
            }
            message.push_str("ValueError: the last line matters");
            return Err(ToolError::respond(message, None));
        }
        if let Some(n) = args.get("records").and_then(Value::as_u64) {
            let rows: Vec<Value> = (0..n).map(record).collect();
            return Ok(text(json!({"rows": rows, "count": n}).to_string()));
        }
        if let Some(v) = args.get("json") {
            return Ok(text(v.to_string()));
        }
        if let (Some(c), Some(n)) = (
            args.get("char").and_then(Value::as_str),
            args.get("count").and_then(Value::as_u64),
        ) {
            return Ok(text(c.repeat(n as usize)));
        }
        Ok(ToolOutput::new(Value::Object(args)))
    }
}

/// The built-in tools plus `echo`, with `spill`.
fn fixture_spill(spill: SpillConfig) -> Fixture {
    let mut f = fixture_with(|l| l.max_result_chars = 16_000);
    let mut b = ToolRegistry::builder();
    for name in f.registry.names() {
        b.register(f.registry.get(&name).unwrap().clone());
    }
    b.register(Arc::new(Echo::new()));
    b.spill(spill);
    b.records_csv(Arc::new(dataref_builtins::ExportCsv));
    f.registry = b.build().unwrap();
    f
}

async fn call(f: &Fixture, tool: &str, args: Value) -> CallOutcome {
    execute_tool_call(&f.registry, ToolCall::new(tool, args), &f.ctx).await
}

fn read(f: &Fixture, path: &str) -> String {
    std::fs::read_to_string(f.home.path().join("workspaces/alice").join(path)).unwrap()
}

fn synopsis(o: &CallOutcome) -> Value {
    assert!(!o.is_error(), "{}", o.text);
    let Some(s) = o.structured.clone() else {
        panic!("no synopsis in {}", o.text)
    };
    assert_eq!(s["spilled"], json!(true), "{s}");
    assert_eq!(serde_json::from_str::<Value>(&o.text).unwrap(), s);
    s
}

#[tokio::test(flavor = "multi_thread")]
async fn thresholds_count_characters_not_bytes() {
    let f = fixture_spill(SpillConfig::default());
    for n in [999, 1000] {
        // Two bytes a character: 2,000 bytes is still 1,000 characters.
        let o = call(&f, "echo", json!({"char": "é", "count": n})).await;
        assert_eq!(o.text, "é".repeat(n), "{n} characters are not spilled");
        assert!(o.structured.is_none());
    }
    let o = call(&f, "echo", json!({"char": "é", "count": 1001})).await;
    let s = synopsis(&o);
    assert_eq!(s["format"], "text");
    assert_eq!(s["characters"], 1001);
    assert_eq!(s["bytes"], 2002);
    assert_eq!(s["preview"], "é".repeat(300));
    let path = s["path"].as_str().unwrap();
    assert!(
        path.starts_with(".spill/") && path.contains("-echo-"),
        "{path}"
    );
    assert_eq!(read(&f, path), "é".repeat(1001));
    assert!(
        o.text.chars().count() < 1000,
        "the synopsis is short: {}",
        o.text
    );

    // Per tool: a higher threshold, or never.
    let mut spill = SpillConfig::default();
    spill.tools.insert(
        "echo".into(),
        dataref_config::ToolSpill {
            enabled: None,
            threshold_chars: Some(5000),
        },
    );
    let f = fixture_spill(spill);
    let o = call(&f, "echo", json!({"char": "a", "count": 4000})).await;
    assert!(o.structured.is_none() && o.text.len() == 4000);
    let off = SpillConfig {
        enabled: false,
        ..SpillConfig::default()
    };
    let f = fixture_spill(off);
    let o = call(&f, "echo", json!({"char": "a", "count": 4000})).await;
    assert_eq!(o.text.len(), 4000);
}

#[tokio::test(flavor = "multi_thread")]
async fn json_in_text_is_written_as_json() {
    let f = fixture_spill(SpillConfig::default());
    let doc = json!({
        "stack": (0..60).map(|i| format!("#{i} 0x7f in start_thread () from /lib/libpthread.so.0")).collect::<Vec<_>>(),
        "thread": {"id": 232155, "name": "worker"}
    });
    let o = call(&f, "echo", json!({ "json": doc })).await;
    let s = synopsis(&o);
    assert_eq!(s["format"], "json");
    assert!(s.get("table").is_none(), "strings are not records");
    let written = read(&f, s["path"].as_str().unwrap());
    assert!(
        written.lines().count() > 60,
        "indented, one value a line, not one escaped line"
    );
    assert_eq!(serde_json::from_str::<Value>(&written).unwrap(), doc);
    assert!(
        written.contains("/lib/libpthread.so.0"),
        "bytes as they came"
    );
    // The model reads a part of it by path.
    let r = call(
        &f,
        "read_file",
        json!({"path": s["path"], "offset": 5, "limit": 3}),
    )
    .await;
    assert!(!r.is_error(), "{}", r.text);
    assert!(r.text.contains("#3 0x7f in start_thread"), "{}", r.text);
}

#[tokio::test(flavor = "multi_thread")]
async fn records_are_spilled_as_json_csv_and_a_table() {
    let f = fixture_spill(SpillConfig::default());
    let o = call(&f, "echo", json!({"records": 321})).await;
    let s = synopsis(&o);
    let table = &s["table"];
    assert_eq!(table["rows"], 321);
    assert_eq!(
        table["columns"],
        json!(["id", "name", "price", "ok"]),
        "the keys' order"
    );
    let csv = read(&f, table["csv"].as_str().unwrap());
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("id,name,price,ok"));
    assert_eq!(lines.next(), Some("0,item 0,0.0,true"));
    assert_eq!(csv.lines().count(), 322);
    // The dataRef is a real table of the caller's.
    let r = DataRef::parse(table["dataRef"].as_str().unwrap()).unwrap();
    let t = f.ctx.store.open_table(&f.ctx.principal, &r).unwrap();
    assert_eq!(t.meta.rows, 321);
    assert_eq!(t.meta.lineage.tool, "echo");
    // And the next tool takes it by reference.
    let d = call(&f, "describe_data", json!({"dataRef": r.to_string()})).await;
    assert!(!d.is_error(), "{}", d.text);
    assert!(d.text.contains("\"price\""), "{}", d.text);
    // …or the CSV by path.
    let e = call(
        &f,
        "export_data",
        json!({"source": table["csv"], "format": "xlsx", "filename": "items"}),
    )
    .await;
    assert!(!e.is_error(), "{}", e.text);
    assert!(s["hint"].as_str().unwrap().contains(&r.to_string()));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_long_error_is_spilled_whole() {
    let f = fixture_spill(SpillConfig::default());
    let o = call(&f, "echo", json!({"error": 5000})).await;
    assert!(o.is_error());
    assert!(o.structured.is_none());
    assert!(o.text.chars().count() < 1000, "{}", o.text);
    let path = o
        .text
        .split('`')
        .nth(1)
        .filter(|p| p.starts_with(".spill/"))
        .unwrap_or_else(|| panic!("no path in {}", o.text));
    let whole = read(&f, path);
    assert!(
        whole.ends_with("ValueError: the last line matters"),
        "the line that was cut"
    );
    assert!(o.text.contains("read_file"), "{}", o.text);
    // A short error is left alone.
    let o = call(&f, "echo", json!({"error": 10})).await;
    assert!(o.text.contains("ValueError") && !o.text.contains(".spill/"));
}

#[tokio::test(flavor = "multi_thread")]
async fn synopsis_tools_are_not_spilled_unless_configured() {
    let low = SpillConfig {
        threshold_chars: 100,
        preview_chars: 50,
        ..SpillConfig::default()
    };
    let f = fixture_spill(low.clone());
    let o = call(&f, "fetch_sales", json!({"since": "2025-01-01"})).await;
    assert!(o.text.chars().count() > 100);
    assert!(o.structured.unwrap().get("dataRef").is_some());
    let spec = f
        .registry
        .specs()
        .find(|s| s.name == "fetch_sales")
        .unwrap();
    // Its listed schema admits the result cap's truncation object, never a spill synopsis
    // (the shapes are folded into one object schema, each named by its discriminator).
    let admits_synopsis = |spec: &dataref_protocol::ToolSpec| {
        let output = spec.output_schema.as_ref().unwrap();
        assert_eq!(output["properties"]["truncated"]["const"], true, "{output}");
        output["properties"].get("spilled").is_some()
    };
    assert!(!admits_synopsis(spec), "{:?}", spec.output_schema);
    // A spilling tool lists an output schema that admits the synopsis.
    let spec = f.registry.specs().find(|s| s.name == "echo").unwrap();
    assert!(admits_synopsis(spec), "{:?}", spec.output_schema);

    let mut spill = low;
    spill.tools.insert(
        "fetch_sales".into(),
        dataref_config::ToolSpill {
            enabled: Some(true),
            threshold_chars: None,
        },
    );
    let f = fixture_spill(spill);
    let o = call(&f, "fetch_sales", json!({"since": "2025-01-01"})).await;
    let s = synopsis(&o);
    assert!(read(&f, s["path"].as_str().unwrap()).contains("dataRef"));
}

/// Spilling never fails a call: with the disk full the result goes on, capped.
#[tokio::test(flavor = "multi_thread")]
async fn a_full_disk_does_not_fail_the_call() {
    let mut f = fixture_spill(SpillConfig::default());
    f.ctx.limits.max_result_chars = 4_000;
    let dir = f.home.path().join("tiny");
    std::fs::create_dir(&dir).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
        .arg(&dir)
        .status()
        .is_ok_and(|s| s.success());
    let _unmount = Unmount(mounted.then(|| dir.clone()));
    if mounted {
        // Fill it: the spill file cannot be written.
        let filler = std::fs::File::create(dir.join("filler")).unwrap();
        let _ = std::io::Write::write_all(&mut &filler, &vec![0u8; 1 << 20]);
    } else {
        // Not allowed to mount (not root): `.spill` is a file, so nothing can be written
        // under it either. The failure path is the same.
        eprintln!("mount not permitted: testing an unwritable .spill instead of a full disk");
        std::fs::write(dir.join(".spill"), b"").unwrap();
    }
    f.ctx.workspace = Arc::new(dataref_workspace::Workspace::open(&dir).unwrap());
    let o = call(&f, "echo", json!({"char": "x", "count": 10_000})).await;
    assert!(!o.is_error(), "{}", o.text);
    assert!(
        o.text.contains("[cut: this result has 10000 characters"),
        "{}",
        &o.text[..100]
    );
    let o = call(&f, "echo", json!({"records": 500})).await;
    assert!(!o.is_error(), "{}", o.text);
    assert!(o.text.contains("[cut:"));
}

struct Unmount(Option<std::path::PathBuf>);

impl Drop for Unmount {
    fn drop(&mut self) {
        if let Some(dir) = &self.0 {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(dir)
                .status();
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn old_spill_files_are_swept_and_copies_kept() {
    let f = fixture_spill(SpillConfig::default());
    let mut paths = Vec::new();
    for _ in 0..3 {
        let o = call(&f, "echo", json!({"char": "y", "count": 2000})).await;
        paths.push(synopsis(&o)["path"].as_str().unwrap().to_owned());
    }
    let ws = f.home.path().join("workspaces/alice");
    // A person keeps the first one.
    let c = call(
        &f,
        "copy_file",
        json!({"src": paths[0], "dst": "kept/answer.txt"}),
    )
    .await;
    assert!(!c.is_error(), "{}", c.text);
    let eight_days_ago = SystemTime::now() - Duration::from_secs(8 * 86_400);
    for p in [&paths[0], &paths[1]] {
        let file = std::fs::File::options()
            .write(true)
            .open(ws.join(p))
            .unwrap();
        file.set_modified(eight_days_ago).unwrap();
    }
    let kept = std::fs::File::options()
        .write(true)
        .open(ws.join("kept/answer.txt"))
        .unwrap();
    kept.set_modified(eight_days_ago).unwrap();

    let now = dataref_store::Clock::now(&SystemClock);
    let swept = sweep_spill(&f.ctx.workspace, now, Duration::from_secs(7 * 86_400)).unwrap();
    assert_eq!(swept.removed, 2);
    assert!(!ws.join(&paths[0]).exists() && !ws.join(&paths[1]).exists());
    assert!(ws.join(&paths[2]).exists(), "younger than the retention");
    assert!(ws.join("kept/answer.txt").exists(), "copies are not swept");

    // An injected clock a week on sweeps the rest.
    let later = dataref_protocol::Timestamp(now.0 + 8 * 86_400);
    let swept = sweep_spill(&f.ctx.workspace, later, Duration::from_secs(7 * 86_400)).unwrap();
    assert_eq!(swept.removed, 1);

    // `.spill` replaced by a link is not followed.
    std::fs::remove_dir(ws.join(".spill")).unwrap();
    std::os::unix::fs::symlink("kept", ws.join(".spill")).unwrap();
    assert!(sweep_spill(&f.ctx.workspace, later, Duration::from_secs(1)).is_err());
    assert!(ws.join("kept/answer.txt").exists());
}

fn write_ws(f: &Fixture, path: &str, bytes: &[u8]) {
    let p = f.home.path().join("workspaces/alice").join(path);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, bytes).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn call_tool_merges_overrides_over_the_file() {
    let f = fixture_spill(SpillConfig::default());
    write_ws(
        &f,
        "args.json",
        json!({"label": "from the file", "body": "libpthread.so.0", "nested": {"a": 1, "b": 2}})
            .to_string()
            .as_bytes(),
    );
    let o = call(
        &f,
        "call_tool",
        json!({"tool": "echo", "args_file": "args.json", "overrides": {"label": "mine", "nested": {"b": 3}}}),
    )
    .await;
    assert!(!o.is_error(), "{}", o.text);
    assert_eq!(
        o.structured.unwrap(),
        json!({"label": "mine", "body": "libpthread.so.0", "nested": {"a": 1, "b": 3}})
    );

    // The target's spill policy applies to a delegated call's result.
    write_ws(&f, "big.json", br#"{"char": "z", "count": 1500}"#);
    let o = call(
        &f,
        "call_tool",
        json!({"tool": "echo", "args_file": "big.json"}),
    )
    .await;
    let s = synopsis(&o);
    assert!(s["path"].as_str().unwrap().contains("-echo-"), "{s}");
}

#[tokio::test(flavor = "multi_thread")]
async fn call_tool_refuses_what_it_cannot_run() {
    let f = fixture_spill(SpillConfig::default());
    // Exactly 1 MiB is read; one byte more is refused.
    let pad = |total: usize| {
        let head = br#"{"label": ""#;
        let tail = br#""}"#;
        let mut v = head.to_vec();
        v.resize(total - tail.len(), b'x');
        v.extend_from_slice(tail);
        v
    };
    write_ws(&f, "max.json", &pad(1 << 20));
    let o = call(
        &f,
        "call_tool",
        json!({"tool": "echo", "args_file": "max.json"}),
    )
    .await;
    assert!(!o.is_error(), "{}", &o.text[..200.min(o.text.len())]);
    write_ws(&f, "over.json", &pad((1 << 20) + 1));
    let o = call(
        &f,
        "call_tool",
        json!({"tool": "echo", "args_file": "over.json"}),
    )
    .await;
    assert!(o.is_error());
    assert!(
        o.text.contains("1048577 bytes") && o.text.contains("1 MiB"),
        "{}",
        o.text
    );

    // A schema violation after merging says where the arguments came from.
    write_ws(&f, "a.json", br#"{"char": "a"}"#);
    let o = call(
        &f,
        "call_tool",
        json!({"tool": "echo", "args_file": "a.json", "overrides": {"count": "many"}}),
    )
    .await;
    assert!(o.is_error());
    assert!(
        o.text.contains(
            "invalid arguments for `echo` (from `a.json` with `overrides` merged on top): `count`"
        ),
        "{}",
        o.text
    );

    for (args, expect) in [
        (
            json!({"tool": "ech", "args_file": "a.json"}),
            "did you mean `echo`",
        ),
        (
            json!({"tool": "call_tool", "args_file": "a.json"}),
            "cannot call itself",
        ),
        (
            json!({"tool": "echo", "args_file": "missing.json"}),
            "does not exist",
        ),
        (
            json!({"tool": "echo", "args_file": "../outside.json"}),
            "error:",
        ),
        (json!({"tool": "echo"}), "invalid arguments for `call_tool`"),
    ] {
        let o = call(&f, "call_tool", args.clone()).await;
        assert!(
            o.is_error() && o.text.contains(expect),
            "{args}: {}",
            o.text
        );
    }
    write_ws(&f, "list.json", b"[1, 2]");
    let o = call(
        &f,
        "call_tool",
        json!({"tool": "echo", "args_file": "list.json"}),
    )
    .await;
    assert!(o.text.contains("must hold one JSON object"), "{}", o.text);
    write_ws(&f, "broken.json", b"{\"a\": ");
    let o = call(
        &f,
        "call_tool",
        json!({"tool": "echo", "args_file": "broken.json"}),
    )
    .await;
    assert!(o.text.contains("is not valid JSON"), "{}", o.text);
}
