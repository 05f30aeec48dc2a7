//! The real `dataref` binary: over stdio with rmcp's client, its CLI commands, and what a
//! `kill -9` in the middle of a write leaves behind.
#![expect(
    clippy::expect_used,
    reason = "test helpers fail the test on setup errors"
)]
#![expect(
    clippy::disallowed_methods,
    reason = "fixtures build files and hostile trees directly, outside the code under test"
)]

mod adbc;
mod agent_http;
mod audit;
mod bench_forward;
mod chat;
mod cleanup;
mod docs;
mod eval;
mod http;
mod http_edges;
mod jsonrpc;
mod lake;
mod layers;
mod metrics;
mod mysql;
mod ops;
mod postgres;
mod replay;
mod replicas;
mod snapshots;
mod tools_list;
mod transcript;
mod usage;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::transport::TokioChildProcess;
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_dataref");

type Client = rmcp::service::RunningService<rmcp::RoleClient, ()>;

/// The built-in sample's database of `rows` rows under `home`, made by a start of
/// `dataref serve` (stdio, stdin closed) without a config.
fn make_sample(home: &Path, rows: &str) -> PathBuf {
    let out = Command::new(BIN)
        .arg("serve")
        .arg("--home")
        .arg(home)
        .args(["--rows", rows])
        .env_remove("DATAREF_CONFIG")
        .env_remove("DATAREF_HOME")
        .stdin(Stdio::null())
        .output()
        .expect("run dataref serve");
    let db = home.join(format!("sample/sales-{rows}.sqlite"));
    assert!(
        db.exists(),
        "the sample database was made: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    db
}

async fn connect(home: &Path, principal: &str, extra: &[&str]) -> Client {
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.arg("serve")
        .arg("--home")
        .arg(home)
        .args(extra)
        .env("DATAREF_PRINCIPAL", principal)
        .env_remove("DATAREF_CONFIG")
        .stderr(Stdio::null());
    let transport = TokioChildProcess::new(cmd).expect("spawn dataref serve");
    ().serve(transport).await.expect("MCP handshake")
}

async fn call(client: &Client, tool: &str, args: Value) -> CallToolResult {
    let Value::Object(map) = args else {
        panic!("args must be an object")
    };
    client
        .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(map))
        .await
        .expect("tools/call answered")
}

fn text(r: &CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread")]
async fn stdio_round_trip_with_rmcp_client() {
    let home = tempfile::tempdir().unwrap();
    let client = connect(home.path(), "alice", &["--rows", "3000"]).await;
    let info = client.peer_info().expect("server info");
    assert!(
        info.instructions
            .as_deref()
            .unwrap_or("")
            .contains("dataRef")
    );
    let tools = client.list_all_tools().await.unwrap();
    for t in &tools {
        // `call_tool`'s result is its target's, so it lists no schema of its own.
        assert_eq!(
            t.output_schema.is_some(),
            t.name != "call_tool",
            "{}: output schema",
            t.name
        );
    }

    let r = call(&client, "fetch_sales", json!({"since": "2025-01-01"})).await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    let d = r.structured_content.clone().unwrap();
    assert_eq!(d["rows"], 3000);
    assert!(text(&r).len() < 1500, "{} bytes", text(&r).len());
    let data_ref = d["dataRef"].as_str().unwrap().to_owned();

    // Bad input of every kind is an error result, and the server keeps serving.
    for (tool, args, expect) in [
        ("nope", json!({}), "unknown tool"),
        ("fetch_sales", json!({"since": true}), "since"),
        (
            "fetch_sales",
            json!({"since": "2025-01-01", "extra": 1}),
            "extra",
        ),
        (
            "describe_data",
            json!({"dataRef": "data_AAAAAAAAAAAAAAAAAAAAAA"}),
            "unknown or expired",
        ),
        (
            "describe_data",
            json!({"dataRef": data_ref, "columns": ["revenu"]}),
            "did you mean `revenue`",
        ),
        (
            "query",
            json!({"source": "sample", "sql": "ATTACH DATABASE '/tmp/x' AS x"}),
            "not allowed",
        ),
        (
            "query",
            json!({"source": "sample", "sql": "SELECT 1; SELECT 2"}),
            "not allowed",
        ),
    ] {
        let r = call(&client, tool, args.clone()).await;
        assert_eq!(r.is_error, Some(true), "{tool} {args}: {}", text(&r));
        assert!(text(&r).contains(expect), "{tool} {args}: {}", text(&r));
    }
    let r = call(&client, "describe_data", json!({"dataRef": data_ref})).await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    client.cancel().await.ok();

    // A restart keeps the artifact for its owner only.
    let again = connect(home.path(), "alice", &["--rows", "3000"]).await;
    let r = call(&again, "describe_data", json!({"dataRef": data_ref})).await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    again.cancel().await.ok();
    let other = connect(home.path(), "bob", &["--rows", "3000"]).await;
    let r = call(&other, "describe_data", json!({"dataRef": data_ref})).await;
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).contains("unknown or expired"), "{}", text(&r));
    other.cancel().await.ok();
}

#[tokio::test(flavor = "multi_thread")]
async fn config_file_limits_and_sensitive_sources() {
    let home = tempfile::tempdir().unwrap();
    // Make the sample database once through the built-in config, then point a config at it.
    let c = connect(home.path(), "alice", &["--rows", "3000"]).await;
    c.cancel().await.ok();
    let db = home.path().join("sample/sales-3000.sqlite");
    assert!(db.exists());
    let config = home.path().join("dataref.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[store]
max_artifact_bytes = "20kB"

[sources.hr]
kind = "sqlite"
path = "{}"
sample_rows = 0
max_rows = 1000
allow_sql = true

[queries.region_sales]
source = "hr"
description = "Sales of one region."
sql = "SELECT date, units, revenue FROM sales WHERE region = :region"
params.region = {{ type = "string", required = true }}
"#,
            db.display()
        ),
    )
    .unwrap();
    let client = connect(
        home.path(),
        "alice",
        &["--config", config.to_str().unwrap()],
    )
    .await;
    // Over max_rows: refused with a way to narrow, never silently cut.
    let r = call(
        &client,
        "query",
        json!({"source": "hr", "sql": "SELECT * FROM sales"}),
    )
    .await;
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).contains("more than 1000 rows"), "{}", text(&r));
    // Over the byte cap: refused, and nothing is left behind.
    let r = call(
        &client,
        "query",
        json!({"source": "hr", "sql": "SELECT line, region, channel FROM sales LIMIT 999"}),
    )
    .await;
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).contains("narrow the query"), "{}", text(&r));
    // A small result: no sample rows from a sensitive source, and a note saying so.
    let r = call(
        &client,
        "fetch_region_sales",
        json!({"region": "EMEA' OR '1'='1"}),
    )
    .await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    assert_eq!(r.structured_content.as_ref().unwrap()["rows"], 0);
    let r = call(
        &client,
        "query",
        json!({"source": "hr", "sql": "SELECT region, count(*) AS n FROM sales GROUP BY region"}),
    )
    .await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    let d = r.structured_content.clone().unwrap();
    assert_eq!(d.get("sample"), None, "withheld: no rows, no field");
    assert!(d["sampleNote"].is_string(), "{d}");
    let listed = call(&client, "list_artifacts", json!({})).await;
    assert_eq!(listed.structured_content.unwrap()["total"], 2);
    client.cancel().await.ok();
    assert_eq!(
        std::fs::read_dir(home.path().join("artifacts/.tmp"))
            .unwrap()
            .count(),
        0
    );
}

/// `kill -9` while a table is being written loses that write only: after a restart there
/// is no partial file, no index row without a file, and earlier artifacts are intact.
#[test]
fn kill_9_mid_write_leaves_a_consistent_store() {
    let home = tempfile::tempdir().unwrap();
    let mut child = Command::new(BIN)
        .arg("serve")
        .arg("--home")
        .arg(home.path())
        .args(["--rows", "2000"])
        .env("DATAREF_PRINCIPAL", "alice")
        .env_remove("DATAREF_CONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stdout));
    let mut send = |v: Value| {
        use std::io::Write;
        writeln!(stdin, "{v}").unwrap();
        stdin.flush().unwrap();
    };
    send(
        json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{
        "protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}),
    );
    lines.next().unwrap().unwrap();
    send(json!({"jsonrpc":"2.0","method":"notifications/initialized"}));
    send(
        json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{
        "name":"fetch_sales","arguments":{"since":"2025-01-01"}}}),
    );
    let done: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    let kept = done["result"]["structuredContent"]["dataRef"]
        .as_str()
        .unwrap()
        .to_owned();
    // An endless stream of rows: the write is in flight until we kill the server.
    send(
        json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"query","arguments":{
        "source":"sample",
        "sql":"WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x, 'some padding text' AS pad FROM c"}}}),
    );
    let tmp = home.path().join("artifacts/.tmp");
    let started = Instant::now();
    loop {
        let growing = std::fs::read_dir(&tmp)
            .map(|d| {
                d.flatten()
                    .any(|e| e.metadata().map(|m| m.len() > 1 << 20).unwrap_or(false))
            })
            .unwrap_or(false);
        if growing {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no write in flight"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(
        std::fs::read_dir(&tmp).unwrap().count() > 0,
        "the partial file is there before restart"
    );

    // Restart: reconcile on open.
    let out = Command::new(BIN)
        .arg("doctor")
        .arg("--home")
        .arg(home.path())
        .args(["--rows", "2000"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(
        std::fs::read_dir(&tmp).unwrap().count(),
        0,
        "partial file removed"
    );
    let arrow_files: Vec<_> = std::fs::read_dir(home.path().join("artifacts"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "arrow"))
        .collect();
    assert_eq!(arrow_files.len(), 1, "only the finished artifact remains");

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = connect(home.path(), "alice", &["--rows", "2000"]).await;
        let r = call(&client, "describe_data", json!({"dataRef": kept})).await;
        assert_ne!(r.is_error, Some(true), "{}", text(&r));
        let listed = call(&client, "list_artifacts", json!({})).await;
        assert_eq!(listed.structured_content.unwrap()["total"], 1);
        client.cancel().await.ok();
    });
}

#[test]
fn demo_prints_what_the_model_receives() {
    // The data dir where the sandbox tests provision the Python runtime, so it is installed
    // once per target dir (sandboxed jobs run as uid 65534, which can enter it).
    let home = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dataref-runtime-home");
    let out = Command::new(BIN)
        .args(["demo", "--rows", "4000", "--home"])
        .arg(&home)
        .env_remove("DATAREF_CONFIG")
        .env_remove("DATAREF_LLM_URL")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("▶ fetch_sales"), "{stdout}");
    assert!(stdout.contains("▶ describe_data"), "{stdout}");
    assert!(stdout.contains("what the model receives"), "{stdout}");
    assert!(stdout.contains("| total | 4000 |"), "{stdout}");
    // The agent section: the same question through the loop, by the scripted analyst
    // (no endpoint is configured), with the tokens sent per turn.
    assert!(
        stdout.contains("model: scripted (no model endpoint configured)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("these product lines lost the most revenue"),
        "{stdout}"
    );
    // …and it names the files it made (read from the results of the chart and the export).
    assert!(
        stdout.contains("The chart and the full table are in your workspace: charts/"),
        "{stdout}"
    );
    assert!(stdout.contains("| turn | tokens sent"), "{stdout}");
    // run_python found the quarter-over-quarter losers and stored the delta table.
    assert!(stdout.contains("▶ run_python"), "{stdout}");
    assert!(
        stdout.contains(r#""from":"2025Q3","to":"2025Q4","lost_most":[{"line":"#),
        "{stdout}"
    );
    assert!(
        stdout.contains(r#""qoq_delta":{"dataRef":"data_"#),
        "{stdout}"
    );
    assert!(stdout.contains(r#""rows":300"#), "{stdout}");
    // The person gets a chart and a CSV of the full delta table; the model one line each.
    assert!(stdout.contains("▶ render_chart"), "{stdout}");
    assert!(stdout.contains("▶ export_data"), "{stdout}");
    // The exported CSV, brought back in as a table.
    assert!(stdout.contains("▶ load_file"), "{stdout}");
    assert!(stdout.contains("first line is the header"), "{stdout}");
    for label in ["chart (PNG): ", "delta table (CSV): "] {
        let path = stdout
            .lines()
            .find_map(|l| l.trim().strip_prefix(label))
            .unwrap_or_else(|| panic!("no `{label}` line: {stdout}"));
        let bytes = std::fs::read(path).unwrap();
        assert!(bytes.len() > 1000, "{path}: {} bytes", bytes.len());
    }
    let csv_path = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("delta table (CSV): "))
        .unwrap();
    let csv = std::fs::read_to_string(csv_path).unwrap();
    assert!(csv.starts_with("line,previous,latest,delta,pct"), "{csv}");
    assert_eq!(csv.lines().count(), 301, "a header and 300 product lines");
}

#[test]
fn doctor_and_bad_config_say_what_to_do() {
    let home = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .arg("doctor")
        .arg("--home")
        .arg(home.path())
        .env_remove("DATAREF_CONFIG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("all required checks passed"), "{stdout}");

    let config = home.path().join("dataref.toml");
    std::fs::write(&config, "[store]\nttl = \"forever\"\n").unwrap();
    let out = Command::new(BIN)
        .arg("serve")
        .arg("--home")
        .arg(home.path())
        .arg("--config")
        .arg(&config)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("store.ttl") && stderr.contains("hint:"),
        "{stderr}"
    );
}

/// The sealed workspace through the real binary: `--workspace DIR`, file tools and file
/// resources; every refusal is an error result and the server keeps serving.
#[tokio::test(flavor = "multi_thread")]
async fn workspace_files_over_stdio() {
    let home = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let work = home.path().join("work");
    std::fs::create_dir_all(work.join("reports")).unwrap();
    std::fs::write(work.join("notes.txt"), "first\nsecond\nthird\n").unwrap();
    std::fs::write(work.join("reports/q4.csv"), "line,delta\nKettle,-12.5\n").unwrap();
    std::fs::write(outside.path().join("secret.txt"), "do not read").unwrap();
    std::fs::write(home.path().join("work-secret"), "sibling").unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret.txt"), work.join("out")).unwrap();
    std::os::unix::fs::symlink("notes.txt", work.join("in")).unwrap();

    let client = connect(
        home.path(),
        "alice",
        &["--rows", "2000", "--workspace", work.to_str().unwrap()],
    )
    .await;
    let r = call(&client, "read_file", json!({"path": "in", "offset": 2})).await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    assert!(text(&r).contains("second"), "{}", text(&r));
    let r = call(&client, "list_files", json!({"glob": "**/*.csv"})).await;
    assert!(text(&r).contains("reports/q4.csv"), "{}", text(&r));
    for bad in [
        "/etc/passwd",
        "../../secret",
        "../work-secret",
        "out",
        "reports/../notes.txt",
        "nope.txt",
    ] {
        let r = call(&client, "read_file", json!({"path": bad})).await;
        assert_eq!(r.is_error, Some(true), "{bad}: {}", text(&r));
        assert!(
            !text(&r).contains("do not read") && !text(&r).contains("sibling"),
            "{bad}: {}",
            text(&r)
        );
        assert!(
            !text(&r).contains(home.path().to_str().unwrap()),
            "host path leaked: {}",
            text(&r)
        );
    }
    let r = call(
        &client,
        "copy_file",
        json!({"src": "reports/q4.csv", "dst": "keep/q4-final.csv"}),
    )
    .await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    assert_eq!(
        std::fs::read_to_string(work.join("keep/q4-final.csv")).unwrap(),
        "line,delta\nKettle,-12.5\n"
    );

    let read = client
        .read_resource(rmcp::model::ReadResourceRequestParams::new(
            "dataref://files/reports/q4.csv",
        ))
        .await
        .unwrap();
    let body = serde_json::to_value(&read).unwrap();
    assert_eq!(
        body["contents"][0]["text"], "line,delta\nKettle,-12.5\n",
        "{body}"
    );
    assert_eq!(body["contents"][0]["mimeType"], "text/csv", "{body}");
    let refused = client
        .read_resource(rmcp::model::ReadResourceRequestParams::new(
            "dataref://files/out",
        ))
        .await;
    assert!(refused.is_err(), "a link leading outside is not a resource");
    // Still serving.
    let r = call(&client, "fetch_sales", json!({"since": "2025-06-01"})).await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    client.cancel().await.ok();
}

/// The query shapes that once ended the whole process with a stack overflow, sent to the
/// real binary: each is an error result naming the limit, and the same server answers the
/// next call.
#[tokio::test(flavor = "multi_thread")]
async fn no_query_shape_ends_the_server() {
    let home = tempfile::tempdir().unwrap();
    let client = connect(home.path(), "alice", &["--rows", "1000"]).await;
    let r = call(&client, "fetch_sales", json!({"since": "2025-01-01"})).await;
    let sales = r.structured_content.expect("a dataRef")["dataRef"].clone();
    let inputs = json!({"sales": sales});
    let cte_chain = {
        let mut sql = "WITH t0 AS (SELECT units FROM sales)".to_owned();
        for i in 1..=1_500 {
            sql.push_str(&format!(", t{i} AS (SELECT units FROM t{})", i - 1));
        }
        sql + " SELECT count(*) FROM t1500"
    };
    for sql in [
        format!("SELECT 1{} AS x", "+1".repeat(1_800)),
        format!("SELECT 'a'{} AS x", "||'a'".repeat(2_000)),
        format!("SELECT 1 AS x{}", " UNION ALL SELECT 1".repeat(700)),
        cte_chain,
        format!("SELECT 1{} AS x", "+1".repeat(49_000)),
    ] {
        let r = call(&client, "run_sql", json!({"sql": sql, "inputs": inputs})).await;
        assert_eq!(r.is_error, Some(true), "{}", text(&r));
        assert!(text(&r).contains("the limit is"), "{}", text(&r));
    }
    let r = call(
        &client,
        "run_sql",
        json!({"sql": "SELECT count(*) AS n FROM sales", "inputs": inputs, "store_as": "value"}),
    )
    .await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    assert_eq!(
        r.structured_content.expect("values")["values"],
        json!([[1000]])
    );
}

/// A stored table whose bytes were changed on disk, met by a model and by an operator: each
/// tool that reads it says the table is damaged and which (never "unknown" nor a server
/// fault), `dataref store verify` names it with its owner and exits 1, and `--drop` removes
/// it, after which it is unknown like any other ref.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_table_is_named_to_the_model_and_to_the_operator() {
    let home = tempfile::tempdir().unwrap();
    let client = connect(home.path(), "alice", &["--rows", "3000"]).await;
    let r = call(&client, "fetch_sales", json!({"since": "2025-01-01"})).await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    let data_ref = r.structured_content.unwrap()["dataRef"]
        .as_str()
        .unwrap()
        .to_owned();
    client.cancel().await.ok();

    let file = home.path().join(format!("artifacts/{data_ref}.arrow"));
    let mut bytes = std::fs::read(&file).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x08;
    std::fs::write(&file, &bytes).unwrap();

    let client = connect(home.path(), "alice", &["--rows", "3000"]).await;
    for (tool, args) in [
        ("describe_data", json!({"dataRef": data_ref})),
        (
            "run_sql",
            json!({"sql": "SELECT sum(revenue) AS total FROM sales", "inputs": {"sales": data_ref}}),
        ),
    ] {
        let r = call(&client, tool, args).await;
        assert_eq!(r.is_error, Some(true), "{tool}: {}", text(&r));
        let t = text(&r);
        assert!(
            t.contains("damaged") && t.contains(&data_ref),
            "{tool}: {t}"
        );
        assert!(
            !t.contains("unknown or expired") && !t.contains("internal"),
            "{tool}: {t}"
        );
    }
    client.cancel().await.ok();

    let verify = |extra: &[&str]| {
        Command::new(BIN)
            .args(["store", "verify", "--home"])
            .arg(home.path())
            .args(["--rows", "3000"])
            .args(extra)
            .env_remove("DATAREF_CONFIG")
            .env_remove("DATAREF_HOME")
            .output()
            .unwrap()
    };
    let out = verify(&[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("1 damaged") && stdout.contains(&data_ref) && stdout.contains("alice"),
        "{stdout}"
    );
    let out = verify(&["--drop"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("dropped 1"), "{stdout}");
    let out = verify(&[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    let client = connect(home.path(), "alice", &["--rows", "3000"]).await;
    let r = call(&client, "describe_data", json!({"dataRef": data_ref})).await;
    assert!(text(&r).contains("unknown or expired"), "{}", text(&r));
    client.cancel().await.ok();
}
