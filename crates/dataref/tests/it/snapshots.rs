//! Snapshots of what people and models read, through the real binary: one successful
//! `tools/call` result per built-in tool on the built-in sample (the whole result as the
//! model gets it), `dataref doctor`, and `--help` of the binary and each subcommand. A
//! changed payload fails the test until the snapshot is reviewed and accepted
//! (`cargo insta review`); nothing is accepted automatically.
//!
//! The whole `tools/list` result is already snapshotted by `transcript.rs` (at the seed's
//! 48,210 rows, which list the same tools), so it is not repeated here.
//!
//! What varies between runs is replaced with insta filters: dataRefs (by the table they
//! name), timestamps, durations, temporary paths, the principal (unique per run, so
//! `list_artifacts` sees this run's tables only), chart images, and the host facts
//! `doctor` reports.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use rmcp::model::CallToolResult;
use serde_json::{Value, json};

use super::{BIN, call, connect, text};

/// What changes from run to run, whatever produced it.
const COMMON_FILTERS: &[(&str, &str)] = &[
    // RFC 3339 times (`createdAt`, `expiresAt`, …), with any fraction and zone.
    (
        r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})?",
        "[time]",
    ),
    // Times in file names: `20261201-180247`, `20261129T225927Z`.
    (r"\b\d{8}-\d{6}\b", "[stamp]"),
    (r"\b\d{8}T\d{6}Z", "[stamp]"),
    // A table file is named by the dataRef it shows, as a slug (lower-cased, runs of `-`
    // and `_` made one `-`, so of varying length), and its arguments' hash.
    (
        r"table-data-[a-z0-9-]+-[0-9a-f]{8}\.html",
        "table-data-[ref]-[hash].html",
    ),
    // A chart or table file's argument hash: `-1a2b3c4d.png`.
    (r"-[0-9a-f]{8}\.(png|svg|html)", "-[hash].$1"),
    // Durations, in JSON and in JSON inside a text block.
    (r#"(durationMs\\?"\s*:\s*)\d+"#, "$1[ms]"),
    // Any dataRef or file reference not named by the test (no `\b` after it: one may end
    // in `-`).
    (r"\bdata_[A-Za-z0-9_-]{22}", "data_[ref]"),
    (r"\bfile_[A-Za-z0-9_-]{22}", "file_[ref]"),
    // Content hashes (a receipt's checksums and a source file's version).
    (r"blake3:[0-9a-f]{64}", "blake3:[hash]"),
    // The host's Python the managed runtime was made from (a receipt's engines).
    (r#"(python\\?"\s*:\s*\\?")3\.\d+\.\d+"#, "${1}3.[x]"),
];

/// `settings` with the common filters, and each `(literal, placeholder)` of `named`.
fn settings(named: &[(String, String)]) -> insta::Settings {
    let mut settings = insta::Settings::clone_current();
    // Named values first: a literal must be replaced before a general pattern eats it.
    for (literal, placeholder) in named {
        settings.add_filter(&regex_escape(literal), placeholder.as_str());
    }
    for (pattern, replacement) in COMMON_FILTERS {
        settings.add_filter(pattern, *replacement);
    }
    settings
}

fn regex_escape(literal: &str) -> String {
    let mut out = String::with_capacity(literal.len());
    for c in literal.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The result as the model gets it: every content block and `structuredContent`, as JSON.
/// An image is kept by its type and size, not its pixels.
fn as_sent(r: &CallToolResult) -> String {
    let mut v = serde_json::to_value(r).expect("JSON");
    if let Some(blocks) = v.get_mut("content").and_then(Value::as_array_mut) {
        for block in blocks {
            if block.get("type").and_then(Value::as_str) == Some("image")
                && let Some(data) = block.get_mut("data")
            {
                let n = data.as_str().map_or(0, str::len);
                *data = json!(format!("[{n} bytes of base64]"));
            }
        }
    }
    serde_json::to_string_pretty(&v).expect("JSON")
}

/// The data dir where the sandbox tests provision the Python runtime (installed once per
/// target dir), so `run_python` runs without installing anything.
fn runtime_home() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dataref-runtime-home")
}

fn ok(r: CallToolResult, tool: &str) -> CallToolResult {
    assert_ne!(r.is_error, Some(true), "{tool}: {}", text(&r));
    r
}

fn data_ref(r: &CallToolResult, pointer: &str) -> String {
    r.structured_content
        .as_ref()
        .and_then(|s| s.pointer(pointer))
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no `{pointer}` in {:?}", r.structured_content))
        .to_owned()
}

/// One server for every tool: a principal of this run's own (so the listed artifacts are
/// this run's), in a workspace made for the test.
#[tokio::test(flavor = "multi_thread")]
async fn one_result_per_built_in_tool() {
    let work = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        work.path().join("notes.txt"),
        "Q4 review\nEMEA fell, APAC grew.\nAsk finance about returns.\n",
    )
    .expect("write notes");
    std::fs::write(
        work.path().join("count.json"),
        r#"{"source": "sample", "sql": "SELECT COUNT(*) AS orders FROM sales"}"#,
    )
    .expect("write args");
    std::fs::write(
        work.path().join("targets.csv"),
        "region;target;due\nEMEA;1.250.000,50;2025-12-31\nAPAC;980.000;2025-12-31\n",
    )
    .expect("write targets");
    // A pid alone may come back on a long-lived machine; with the time it does not.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos();
    let principal = format!("snapshots-{}-{nanos}", std::process::id());
    let home = runtime_home();
    let client = connect(
        &home,
        &principal,
        &[
            "--rows",
            "2000",
            "--workspace",
            &work.path().display().to_string(),
        ],
    )
    .await;

    let mut results: Vec<(&str, CallToolResult)> = Vec::new();
    let fetched = ok(
        call(&client, "fetch_sales", json!({"since": "2025-01-01"})).await,
        "fetch_sales",
    );
    let sales = data_ref(&fetched, "/dataRef");
    results.push(("fetch_sales", fetched));

    let queried = ok(
        call(
            &client,
            "query",
            json!({"source": "sample", "sql": "SELECT region, SUM(units) AS units, ROUND(SUM(revenue), 2) AS revenue FROM sales GROUP BY region ORDER BY region"}),
        )
        .await,
        "query",
    );
    let by_region = data_ref(&queried, "/dataRef");
    results.push(("query", queried));

    for (tool, args) in [
        ("describe_data", json!({"dataRef": by_region})),
        ("list_artifacts", json!({})),
        (
            "run_sql",
            json!({
                "sql": "SELECT channel, count(*) AS orders, round(sum(revenue), 2) AS revenue FROM sales GROUP BY channel ORDER BY channel",
                "inputs": {"sales": sales},
                "store_as": "value",
            }),
        ),
    ] {
        results.push((tool, ok(call(&client, tool, args).await, tool)));
    }

    let python = ok(
        call(
            &client,
            "run_python",
            json!({
                "inputs": {"sales": sales},
                "code": "top = sales.groupby('line', as_index=False)['revenue'].sum().nlargest(3, 'revenue').round(2)\noutputs['top_lines'] = top\ntop.to_csv('out/files/top_lines.csv', index=False)\nresult = {'lines': len(top), 'best': top.iloc[0]['line']}",
            }),
        )
        .await,
        "run_python",
    );
    let top_lines = data_ref(&python, "/outputs/top_lines/dataRef");
    results.push(("run_python", python));
    // What the model reads when it asks how a table was made: a derived one, with its code,
    // its parent and the engines.
    let lineage = ok(
        call(&client, "lineage", json!({"dataRef": top_lines})).await,
        "lineage",
    );
    results.push(("lineage", lineage));

    for (tool, args) in [
        (
            "render_chart",
            json!({"dataRef": by_region, "x": "region", "y": "revenue", "kind": "bar"}),
        ),
        ("render_table", json!({"dataRef": by_region})),
        ("export_data", json!({"source": by_region, "format": "csv"})),
        ("load_file", json!({"path": "targets.csv"})),
        ("read_file", json!({"path": "notes.txt"})),
        (
            "copy_file",
            json!({"src": "notes.txt", "dst": "archive/notes.txt"}),
        ),
        (
            "call_tool",
            json!({"tool": "query", "args_file": "count.json"}),
        ),
        ("list_files", json!({})),
    ] {
        results.push((tool, ok(call(&client, tool, args).await, tool)));
    }
    let tools = client.list_all_tools().await.expect("tools/list");
    client.cancel().await.ok();

    let mut called: Vec<&str> = results.iter().map(|(t, _)| *t).collect();
    called.sort_unstable();
    let mut listed: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    listed.sort_unstable();
    assert_eq!(
        called, listed,
        "one result for every tool `tools/list` shows"
    );

    let named = [
        (sales, "data_[sales]".to_owned()),
        (by_region, "data_[by_region]".to_owned()),
        (top_lines, "data_[top_lines]".to_owned()),
        (work.path().display().to_string(), "[workspace]".to_owned()),
        (home.display().to_string(), "[home]".to_owned()),
        (principal, "[principal]".to_owned()),
    ];
    settings(&named).bind(|| {
        for (tool, r) in &results {
            insta::assert_snapshot!(format!("tool_{tool}"), as_sent(r));
        }
    });
}

/// `dataref doctor` on a fresh data dir with the built-in sample, host facts replaced.
#[test]
fn doctor_output() {
    let home = tempfile::tempdir().expect("tempdir");
    let out = Command::new(BIN)
        .arg("doctor")
        .arg("--home")
        .arg(home.path())
        .env_remove("DATAREF_CONFIG")
        .env_remove("DATAREF_HOME")
        .env_remove("DATAREF_PRINCIPAL")
        .env_remove("DATAREF_LLM_URL")
        .env_remove("DATAREF_LLM_MODEL")
        .stdin(Stdio::null())
        .output()
        .expect("run dataref doctor");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}");
    let named = [(home.path().display().to_string(), "[home]".to_owned())];
    let mut settings = settings(&named);
    for (pattern, replacement) in DOCTOR_FILTERS {
        settings.add_filter(pattern, *replacement);
    }
    settings.bind(|| insta::assert_snapshot!("doctor", stdout));
}

/// What `doctor` reports about the machine it runs on: how the sandbox isolates here
/// (cgroup v2, v1 or rlimits, user namespaces) is the host's, not dataref's.
const DOCTOR_FILTERS: &[(&str, &str)] = &[(
    r"(?m)^  (ok|warn|fail)(\s+)sandbox(\s+).*$",
    "  [status]$2sandbox$3[how this host isolates]",
)];

/// `dataref --help` and `--help` of every subcommand, in one document.
#[test]
fn help_of_every_command() {
    let mut doc = String::new();
    let mut page = String::from(
        "# Command line\n\n<!-- Generated from `--help` by crates/dataref/tests/it/snapshots.rs: \
         edit the commands' doc comments, then regenerate (see Develop). -->\n",
    );
    for command in [
        &[][..],
        &["serve"],
        &["token"],
        &["token", "new"],
        &["demo"],
        &["chat"],
        &["ask"],
        &["eval"],
        &["sessions"],
        &["sessions", "export"],
        &["store"],
        &["store", "verify"],
        &["doctor"],
    ] {
        doc.push_str(&help(command));
        let name = std::iter::once("dataref")
            .chain(command.iter().copied())
            .collect::<Vec<_>>()
            .join(" ");
        page.push_str(&format!(
            "\n## `{name}`\n\n```text\n{}```\n",
            help_text(command)
        ));
    }
    settings(&[]).bind(|| insta::assert_snapshot!("help", doc));
    super::docs::check_generated("docs/src/reference/cli.md", &page);
}

/// `bench`'s own, apart: it is about to move to a binary of its own.
#[test]
fn help_of_bench() {
    // `dataref bench` runs `dataref-bench`; its own help is snapshotted in that crate's
    // tests. Here: what `dataref` itself says about the subcommand.
    let out = Command::new(BIN)
        .args(["help", "bench"])
        .env_remove("DATAREF_CONFIG")
        .output()
        .expect("run help bench");
    assert!(out.status.success());
    let doc = format!(
        "$ dataref help bench\n{}\n",
        String::from_utf8_lossy(&out.stdout)
    );
    settings(&[]).bind(|| insta::assert_snapshot!("help_bench", doc));
}

fn help(command: &[&str]) -> String {
    format!(
        "$ dataref {}--help\n{}\n",
        command.iter().map(|c| format!("{c} ")).collect::<String>(),
        help_text(command)
    )
}

fn help_text(command: &[&str]) -> String {
    let out = Command::new(BIN)
        .args(command)
        .arg("--help")
        .env_remove("DATAREF_CONFIG")
        .output()
        .expect("run --help");
    assert!(out.status.success(), "{command:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}
