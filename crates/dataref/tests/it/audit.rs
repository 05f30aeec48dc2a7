//! The audit trail through the real binary: calls over stdio are recorded (who, which tool,
//! the SQL, what was read and made, how it ended; never a row value), `dataref audit verify`
//! says the chain is whole, and names the line a person edited afterwards.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

use super::{BIN, call, connect, text};

fn audit(home: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("audit")
        .args(args)
        .arg("--home")
        .arg(home)
        .env_remove("DATAREF_CONFIG")
        .env_remove("DATAREF_HOME")
        .stdin(Stdio::null())
        .output()
        .expect("run dataref audit")
}

/// The lines of the trail's files in `dir`, once there are at least `n` (the lines are
/// written by the server's writer thread, a moment after the call answered).
fn wait_for_lines(dir: &Path, n: usize) -> Vec<String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .map(|d| {
                d.filter_map(Result::ok)
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
                    .collect()
            })
            .unwrap_or_default();
        files.sort();
        let lines: Vec<String> = files
            .iter()
            .flat_map(|f| {
                std::fs::read_to_string(f)
                    .unwrap_or_default()
                    .lines()
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .collect();
        if lines.len() >= n || std::time::Instant::now() > deadline {
            assert!(
                lines.len() >= n,
                "{} lines, not {n}: {lines:#?}",
                lines.len()
            );
            return lines;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn out(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Every product line and region of the sample database: cell values the trail must never
/// hold.
fn cell_values(db: &Path) -> Vec<String> {
    let conn = rusqlite::Connection::open(db).expect("open the sample database");
    let mut stmt = conn
        .prepare("SELECT DISTINCT line FROM sales UNION SELECT DISTINCT region FROM sales")
        .expect("prepare");
    let values: Vec<String> = stmt
        .query_map([], |r| r.get(0))
        .expect("query")
        .map(|v| v.expect("a line"))
        .collect();
    assert!(values.len() > 5, "{values:?}");
    values
}

#[tokio::test(flavor = "multi_thread")]
async fn calls_are_recorded_without_values_and_verify_names_an_edited_line() {
    let home = tempfile::tempdir().unwrap();
    let client = connect(home.path(), "alice", &["--rows", "3000"]).await;

    let r = call(&client, "fetch_sales", json!({"since": "2025-01-01"})).await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    let fetched = r.structured_content.clone().unwrap();
    let data_ref = fetched["dataRef"].as_str().unwrap().to_owned();

    // The rows come back in the result itself: the trail keeps only that there were some.
    let sql = "SELECT region, SUM(revenue) AS revenue FROM t GROUP BY region ORDER BY region";
    let r = call(
        &client,
        "run_sql",
        json!({"sql": sql, "inputs": {"t": data_ref}, "store_as": "value"}),
    )
    .await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    assert!(
        text(&r).contains("Nordics"),
        "the rows came back: {}",
        text(&r)
    );

    let refused = "SELECT * FROM sales; SELECT 2";
    let r = call(
        &client,
        "query",
        json!({"source": "sample", "sql": refused}),
    )
    .await;
    assert_eq!(r.is_error, Some(true), "{}", text(&r));
    client.cancel().await.ok();

    let dir = home.path().join("audit");
    let file = dir.join("audit-000001.jsonl");
    wait_for_lines(&dir, 3);
    let trail = std::fs::read_to_string(&file).expect("the audit file");
    let lines: Vec<Value> = trail
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let calls: Vec<&Value> = lines.iter().filter(|l| l["event"] == "tool_call").collect();
    assert_eq!(calls.len(), 3, "{trail}");
    for c in &calls {
        assert_eq!(c["principal"], "alice");
    }
    let fetch = calls[0];
    assert_eq!(fetch["tool"], "fetch_sales");
    assert_eq!(fetch["query"], "sales");
    assert_eq!(fetch["args"], json!({"since": "2025-01-01"}));
    assert_eq!(fetch["outcome"], "ok");
    assert_eq!(fetch["rows"], fetched["rows"]);
    assert_eq!(fetch["created"], json!([data_ref]));
    let sql_call = calls[1];
    assert_eq!(sql_call["tool"], "run_sql");
    assert_eq!(sql_call["args"]["sql"], sql);
    assert_eq!(sql_call["read"], json!([data_ref]));
    assert_eq!(sql_call["created"], json!([]));
    let failed = calls[2];
    assert_eq!(failed["outcome"], "tool_failed");
    assert_eq!(failed["args"]["sql"], refused);
    assert_eq!(failed["args"]["source"], "sample");

    // No cell of the table, though the model saw some in the fetch's sample and all of
    // them in run_sql's rows.
    let db = home.path().join("sample/sales-3000.sqlite");
    for value in cell_values(&db) {
        assert!(
            !trail.contains(&value),
            "`{value}` is in the trail:\n{trail}"
        );
    }

    let o = audit(home.path(), &["verify"]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    assert!(
        out(&o).contains("is whole: 3 lines in 1 files"),
        "{}",
        out(&o)
    );
    let o = audit(home.path(), &["verify", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (v["ok"].clone(), v["lines"].clone()),
        (json!(true), json!(3))
    );

    let o = audit(
        home.path(),
        &["show", "--principal", "alice", "--since", "2000-01-01"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).lines().count(), 3);
    let o = audit(home.path(), &["show", "--principal", "bob"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout).lines().count(), 0);

    // Someone changes who made the second call.
    let mut rows: Vec<String> = trail.lines().map(str::to_owned).collect();
    rows[1] = rows[1].replacen("\"principal\":\"alice\"", "\"principal\":\"bob\"", 1);
    assert!(rows[1].contains("\"principal\":\"bob\""));
    std::fs::write(&file, rows.join("\n") + "\n").unwrap();
    let o = audit(home.path(), &["verify"]);
    assert_eq!(o.status.code(), Some(3), "{}", out(&o));
    assert!(
        out(&o).contains("broken at audit-000001.jsonl line 2: edited"),
        "{}",
        out(&o)
    );
    let o = audit(
        home.path(),
        &["verify", "--json", "--dir", dir.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(3), "{}", out(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["problem"]["kind"], "edited");
    assert_eq!(v["problem"]["line"], 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_config_can_turn_the_trail_off_or_move_it() {
    let home = tempfile::tempdir().unwrap();
    let c = connect(home.path(), "alice", &["--rows", "3000"]).await;
    c.cancel().await.ok();
    let db = home.path().join("sample/sales-3000.sqlite");
    let elsewhere = home.path().join("elsewhere");
    for (audit_table, kept) in [
        ("enabled = false", None),
        (
            &*format!("dir = \"{}\"\nrotate = \"4KiB\"", elsewhere.display()),
            Some(&elsewhere),
        ),
    ] {
        let config = home.path().join("dataref.toml");
        std::fs::write(
            &config,
            format!(
                "[sources.s]\nkind = \"sqlite\"\npath = \"{}\"\nallow_sql = true\n\n[audit]\n{audit_table}\n",
                db.display()
            ),
        )
        .unwrap();
        let _ = std::fs::remove_dir_all(home.path().join("audit"));
        let client = connect(
            home.path(),
            "alice",
            &["--config", config.to_str().unwrap()],
        )
        .await;
        for _ in 0..20 {
            let r = call(
                &client,
                "query",
                json!({"source": "s", "sql": "SELECT region, COUNT(*) FROM sales GROUP BY 1"}),
            )
            .await;
            assert_ne!(r.is_error, Some(true), "{}", text(&r));
        }
        client.cancel().await.ok();
        assert!(!home.path().join("audit").exists());
        if let Some(dir) = kept {
            let files = std::fs::read_dir(dir)
                .unwrap()
                .filter(|e| {
                    e.as_ref()
                        .unwrap()
                        .file_name()
                        .to_string_lossy()
                        .ends_with(".jsonl")
                })
                .count();
            assert!(files > 1, "rotated at 4 KiB: {files} files");
            let o = Command::new(BIN)
                .args(["audit", "verify", "--config"])
                .arg(&config)
                .arg("--home")
                .arg(home.path())
                .output()
                .unwrap();
            assert_eq!(o.status.code(), Some(0), "{}", out(&o));
            assert!(out(&o).contains("20 lines"), "{}", out(&o));
        }
    }
}

/// `serve --http` with `config`: the process (killed when dropped) and its base URL.
struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve_http(home: &Path, config: &Path) -> (Server, String) {
    use std::io::BufRead;
    let mut child = Command::new(BIN)
        .args(["serve", "--http", "127.0.0.1:0", "--config"])
        .arg(config)
        .arg("--home")
        .arg(home)
        .env_remove("DATAREF_CONFIG")
        .env_remove("DATAREF_HOME")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dataref serve --http");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if line.starts_with("serving MCP on ") {
                let _ = tx.send(line);
            }
        }
    });
    let line = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the server printed its start line");
    let at = line.find("http://127.0.0.1:").expect("an address");
    let url = line[at..]
        .split([' ', ';', ')'])
        .next()
        .unwrap_or_default()
        .trim_end_matches("/mcp")
        .to_owned();
    (Server(child), url)
}

/// `dataref token new NAME`: the token and the config lines that accept it.
fn new_token(name: &str) -> (String, String) {
    let o = Command::new(BIN)
        .args(["token", "new", name])
        .output()
        .expect("run dataref token new");
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    let token = stdout
        .lines()
        .find_map(|l| l.strip_prefix("token: "))
        .expect("a token line")
        .to_owned();
    let lines = stdout
        .lines()
        .skip_while(|l| !l.starts_with("[principals."))
        .map(|l| format!("{l}\n"))
        .collect();
    (token, lines)
}

#[tokio::test(flavor = "multi_thread")]
async fn http_downloads_and_refused_tokens_are_recorded_without_the_token() {
    dataref_config::tls::install_provider();
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let (token, lines) = new_token("alice");
    let config = dir.path().join("dataref.toml");
    std::fs::write(&config, format!("[python]\nenabled = false\n\n{lines}")).unwrap();
    let files = home.join("workspaces/alice");
    std::fs::create_dir_all(&files).unwrap();
    std::fs::write(files.join("report.csv"), "region,revenue\nNordics,1\n").unwrap();
    let (server, base) = serve_http(&home, &config);
    let http = reqwest::Client::new();

    let forged = "forged-token-7Qx9vLmZ";
    let r = http
        .post(format!("{base}/mcp"))
        .bearer_auth(forged)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);

    let r = http
        .get(format!("{base}/files/report.csv"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let signed: Value = http
        .post(format!("{base}/files/sign"))
        .bearer_auth(&token)
        .json(&json!({"path": "report.csv"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let link = signed["url"].as_str().unwrap().to_owned();
    let link = format!("{base}{}", &link[link.find("/files/").unwrap()..]);
    let r = http.get(&link).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = http
        .get(format!(
            "{base}/files/report.csv?principal=alice&expires=99999999999&sig=AAAA"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    // A flood of refused tokens from one address, each with a long path: one line for the
    // first refusal of the minute, its path cut.
    let long = format!("/files/{}", "a".repeat(60_000));
    for _ in 0..50 {
        let r = http
            .get(format!("{base}{long}"))
            .bearer_auth(forged)
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401);
    }
    wait_for_lines(&home.join("audit"), 3);
    drop(server);

    let trail = std::fs::read_to_string(home.join("audit/audit-000001.jsonl")).unwrap();
    assert!(!trail.contains(forged), "{trail}");
    assert!(!trail.contains(&token), "{trail}");
    assert!(!trail.contains("Nordics"), "{trail}");
    let lines: Vec<Value> = trail
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let of = |kind: &str| -> Vec<&Value> { lines.iter().filter(|l| l["event"] == kind).collect() };
    let refused = of("auth_failed");
    // The bad signed link and the flood came from the same address within the minute:
    // counted into that address's next line, not written.
    assert_eq!(refused.len(), 1, "{trail}");
    assert_eq!(refused[0]["path"], "/mcp");
    assert_eq!(refused[0]["count"], 1);
    assert!(trail.len() < 4096, "{} bytes", trail.len());
    assert_eq!(refused[0]["principal"], "");
    assert!(
        refused[0]["remote"]
            .as_str()
            .is_some_and(|r| r.starts_with("127.0.0.1:")),
        "{trail}"
    );
    let downloads = of("download");
    assert_eq!(downloads.len(), 2, "{trail}");
    for (d, via) in downloads.iter().zip(["bearer", "signed_link"]) {
        assert_eq!(d["principal"], "alice");
        assert_eq!(d["path"], "report.csv");
        assert_eq!(d["via"], via);
        assert_eq!(d["bytes"], 25);
    }
    let o = audit(&home, &["verify", "--config", config.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
}

#[test]
fn approvals_asked_and_answered_are_recorded() {
    use dataref_test_support::model_server::{Call, Reply, ScriptedModel};
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let db = super::make_sample(&home, "2000");
    let config = dir.path().join("dataref.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[python]
enabled = false

[sources.sample]
kind = "sqlite"
path = "{}"

[queries.sales]
source = "sample"
description = "Load sales on or after a date."
sql = "SELECT date, line, region, revenue FROM sales WHERE date >= :since"
params.since = {{ type = "date", required = true }}

[agents.default]
tools = ["fetch_*"]

[agents.default.approval]
fetch_sales = "ask"
"#,
            db.display()
        ),
    )
    .unwrap();
    let fetch = || {
        Reply::tool_calls(vec![Call::new(
            "c1",
            "fetch_sales",
            r#"{"since": "2025-10-01"}"#,
        )])
    };
    let model = ScriptedModel::start(vec![
        fetch(),
        Reply::text("Fetched.").usage(100, 5),
        fetch(),
        Reply::text("Could not.").usage(100, 5),
    ])
    .expect("model server");
    // `--yes` approves; without it no one can be asked, which is a refusal.
    for yes in [true, false] {
        let mut cmd = Command::new(BIN);
        cmd.arg("ask")
            .arg("fetch the sales since October")
            .args(if yes { &["--yes"][..] } else { &[][..] })
            .arg("--config")
            .arg(&config)
            .arg("--home")
            .arg(&home)
            .env_remove("DATAREF_CONFIG")
            .env("DATAREF_LLM_URL", model.url())
            .env("DATAREF_LLM_MODEL", "gpt-4o")
            .env_remove("DATAREF_LLM_API_KEY")
            .env("DATAREF_PRINCIPAL", "carol")
            .stdin(Stdio::null());
        let o = cmd.output().expect("run ask");
        assert!(o.status.success(), "{}", out(&o));
    }
    let trail = std::fs::read_to_string(home.join("audit/audit-000001.jsonl")).unwrap();
    let lines: Vec<Value> = trail
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kinds: Vec<&str> = lines.iter().map(|l| l["event"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "approval_asked",
            "approval_answered",
            "tool_call",
            "approval_asked",
            "approval_answered"
        ],
        "{trail}"
    );
    assert_eq!(lines[0]["principal"], "carol");
    assert_eq!(lines[0]["tool"], "fetch_sales");
    assert_eq!(lines[0]["args"]["since"], "2025-10-01");
    assert_eq!(lines[1]["decision"], "approved");
    assert_eq!(lines[2]["created"].as_array().map(Vec::len), Some(1));
    assert_eq!(lines[4]["decision"], "denied");
    assert!(
        lines[4]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("no one can be asked")),
        "{trail}"
    );
    let o = audit(&home, &["verify", "--config", config.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
}

/// `psql -At -c SQL` on the cluster's index.
fn psql(url: &str, sql: &str) -> String {
    let o = Command::new("psql")
        .args([url, "-At", "-c", sql])
        .output()
        .expect("psql (postgresql-client) is installed");
    assert!(o.status.success(), "{}", out(&o));
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn with_shared_every_replica_copies_its_lines_into_the_index() {
    use super::replicas::{Cluster, EU, Extra};
    let c = Cluster::start(2, Extra::default());
    let (a, b) = (c.direct(0), c.direct(1));
    let fetched = c
        .ok(&a, EU, "fetch_sales", json!({"since": "2025-01-01"}))
        .await;
    let r = fetched["dataRef"].as_str().expect("a dataRef").to_owned();
    c.ok(&b, EU, "describe_data", json!({"dataRef": r})).await;
    let url = c.pg.url("postgres");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let counted = loop {
        let counted = psql(
            &url,
            "SELECT count(DISTINCT trail) || ' ' || count(*) FROM dataref_audit \
             WHERE event = 'tool_call'",
        );
        if counted == "2 2" || std::time::Instant::now() > deadline {
            break counted;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_eq!(counted, "2 2", "one line from each replica");
    let rows = psql(
        &url,
        "SELECT principal || ' ' || (record->>'tool') || ' ' || seq || ' ' || (record->'created'->>0 IS NOT NULL) \
         FROM dataref_audit WHERE event = 'tool_call' ORDER BY at",
    );
    assert_eq!(
        rows.lines().collect::<Vec<_>>(),
        [
            "eu_analyst fetch_sales 1 true",
            "eu_analyst describe_data 1 false"
        ]
    );
    let lines = psql(&url, "SELECT line FROM dataref_audit ORDER BY at");
    assert!(lines.contains(&r), "{lines}");
    assert!(!lines.contains("Nordics"), "{lines}");
}

/// `dataref audit verify`'s exit code and output.
fn verify_out(home: &Path) -> (Option<i32>, String) {
    let o = audit(home, &["verify"]);
    (o.status.code(), out(&o))
}

#[tokio::test(flavor = "multi_thread")]
async fn lines_cut_off_the_end_or_a_deleted_newest_file_stay_reported() {
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join("audit");
    let client = connect(home.path(), "alice", &["--rows", "2000"]).await;
    for day in 1..=5 {
        let r = call(
            &client,
            "fetch_sales",
            json!({"since": format!("2025-01-0{day}")}),
        )
        .await;
        assert_ne!(r.is_error, Some(true), "{}", text(&r));
    }
    client.cancel().await.ok();
    let lines = wait_for_lines(&dir, 5);
    assert_eq!(lines.len(), 5);
    let (code, o) = verify_out(home.path());
    assert_eq!(code, Some(0), "{o}");

    // The last two lines cut off: what is left chains whole, but the head says seq 5.
    let file = dir.join("audit-000001.jsonl");
    std::fs::write(&file, lines[..3].join("\n") + "\n").unwrap();
    let (code, o) = verify_out(home.path());
    assert_eq!(code, Some(3), "{o}");
    assert!(o.contains("truncated") && o.contains("end at seq 3"), "{o}");

    // Writing again does not hide it: seqs 4 and 5 are not issued again.
    let client = connect(home.path(), "alice", &["--rows", "2000"]).await;
    let r = call(&client, "fetch_sales", json!({"since": "2025-02-01"})).await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    client.cancel().await.ok();
    let lines = wait_for_lines(&dir, 5);
    let first_new: Value = serde_json::from_str(&lines[3]).unwrap();
    assert_eq!(first_new["event"], "trail_truncated", "{lines:#?}");
    let (code, o) = verify_out(home.path());
    assert_eq!(code, Some(3), "{o}");
    assert!(
        o.contains("audit-000002.jsonl line 1: truncated") && o.contains("seq 4 to 5"),
        "{o}"
    );

    // The newest file deleted: the head is ahead of the files again.
    std::fs::remove_file(dir.join("audit-000002.jsonl")).unwrap();
    let (code, o) = verify_out(home.path());
    assert_eq!(code, Some(3), "{o}");
    assert!(o.contains("truncated") && o.contains("up to seq 7"), "{o}");
    let o = audit(home.path(), &["verify", "--json"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["problem"]["kind"], "truncated");
}

#[tokio::test(flavor = "multi_thread")]
async fn call_tool_is_recorded_as_what_ran() {
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let sql = "SELECT COUNT(*) AS orders FROM sales";
    std::fs::write(
        work.path().join("count.json"),
        json!({"source": "sample", "sql": sql}).to_string(),
    )
    .unwrap();
    let client = connect(
        home.path(),
        "alice",
        &[
            "--rows",
            "2000",
            "--workspace",
            &work.path().display().to_string(),
        ],
    )
    .await;
    let r = call(
        &client,
        "call_tool",
        json!({"tool": "query", "args_file": "count.json"}),
    )
    .await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    client.cancel().await.ok();
    let lines = wait_for_lines(&home.path().join("audit"), 1);
    let line: Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(line["tool"], "call_tool");
    assert_eq!(line["target"], "query", "{line}");
    assert_eq!(line["args_file"], "count.json", "{line}");
    // What ran: the file's arguments, not its name alone.
    assert_eq!(line["args"]["sql"], sql, "{line}");
    assert_eq!(line["args"]["source"], "sample", "{line}");
}

/// `verify --index` checks the shared index's copy against the files: it catches lines cut
/// off the end even when the head in `audit.lock` was removed with them.
#[tokio::test(flavor = "multi_thread")]
async fn verify_index_compares_the_copy_with_the_files() {
    use dataref_test_support::{TestPostgres, TestS3};
    use rmcp::ServiceExt;
    dataref_config::tls::install_provider();
    let s3 = TestS3::start().expect("start SeaweedFS (scripts/test installs it)");
    let pg = TestPostgres::start().expect("start PostgreSQL");
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let db = super::make_sample(&dir.path().join("sample-home"), "2000");
    let config = dir.path().join("dataref.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[python]
enabled = false

[shared]
objects = "s3://{bucket}/audit-index-test"
endpoint = "{endpoint}"
region = "{region}"
index = "${{DATAREF_INDEX_URL}}"
timeout = "10s"

[sources.sample]
kind = "sqlite"
path = "{db}"

[queries.sales]
source = "sample"
description = "Load sales on or after a date."
sql = "SELECT date, region, revenue FROM sales WHERE date >= :since"
params.since = {{ type = "date", required = true }}
"#,
            bucket = s3.bucket(),
            endpoint = s3.endpoint(),
            region = s3.region(),
            db = db.display(),
        ),
    )
    .unwrap();
    let with_env = |cmd: &mut tokio::process::Command| {
        cmd.env("DATAREF_INDEX_URL", pg.url("postgres"))
            .env("AWS_ACCESS_KEY_ID", s3.access_key())
            .env("AWS_SECRET_ACCESS_KEY", s3.secret_key())
            .env_remove("DATAREF_CONFIG")
            .env_remove("DATAREF_HOME");
    };
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.arg("serve")
        .arg("--config")
        .arg(&config)
        .arg("--home")
        .arg(&home)
        .env("DATAREF_PRINCIPAL", "alice")
        .stderr(Stdio::null());
    with_env(&mut cmd);
    let transport = rmcp::transport::TokioChildProcess::new(cmd).expect("spawn dataref serve");
    let client = ().serve(transport).await.expect("MCP handshake");
    for day in 1..=4 {
        let r = call(
            &client,
            "fetch_sales",
            json!({"since": format!("2025-01-0{day}")}),
        )
        .await;
        assert_ne!(r.is_error, Some(true), "{}", text(&r));
    }
    // The server flushes the queue into the index when it exits.
    client.cancel().await.ok();
    let trail = home.join("audit");
    let lines = wait_for_lines(&trail, 4);
    let verify_index = || {
        let mut cmd = Command::new(BIN);
        cmd.args(["audit", "verify", "--index", "--config"])
            .arg(&config)
            .arg("--home")
            .arg(&home)
            .env("DATAREF_INDEX_URL", pg.url("postgres"))
            .env("AWS_ACCESS_KEY_ID", s3.access_key())
            .env("AWS_SECRET_ACCESS_KEY", s3.secret_key())
            .env_remove("DATAREF_CONFIG")
            .env_remove("DATAREF_HOME")
            .stdin(Stdio::null());
        let o = cmd.output().expect("run dataref audit verify --index");
        (o.status.code(), out(&o))
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let (code, o) = loop {
        let (code, o) = verify_index();
        if o.contains("4 lines, 4 found") || std::time::Instant::now() > deadline {
            break (code, o);
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert_eq!(code, Some(0), "{o}");
    assert!(o.contains("the shared index's copy is whole"), "{o}");

    // The last line cut off and the head removed with it: the files alone look whole, the
    // index's copy shows the cut.
    std::fs::write(
        trail.join("audit-000001.jsonl"),
        lines[..3].join("\n") + "\n",
    )
    .unwrap();
    std::fs::remove_file(trail.join("audit.lock")).unwrap();
    let (code, o) = verify_out(&home);
    assert_eq!(code, Some(0), "without its head the cut is not seen: {o}");
    let (code, o) = verify_index();
    assert_eq!(code, Some(3), "{o}");
    assert!(
        o.contains("disagrees at seq 4: truncated") && o.contains("the files end at seq 3"),
        "{o}"
    );
}
