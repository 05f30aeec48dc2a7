//! `[metrics]` through the real binary: `serve --http` and `serve` (stdio) each serve the
//! Prometheus endpoint on a port of their own; MCP calls (one that fails, one refused for
//! want of a token, a burst over the rate limit) move the counters; a wrong or missing
//! token gets 401; `promtool check metrics` passes the text; a real Prometheus scrapes it
//! with the token and answers a query over it. And the refusals at start: a listen address
//! that is not loopback without a token, a port already taken.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dataref_test_support::model_server::{Reply, ScriptedModel};
use dataref_test_support::{
    ServeHttp, TestPrometheus, promtool_check_metrics, promtool_check_rules, raw_http,
};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use serde_json::{Value, json};

use super::{BIN, Client, make_sample};

/// The variable the configs name for the metrics token (set on the child only).
const TOKEN_VAR: &str = "DATAREF_TEST_METRICS_TOKEN";
const METRICS_TOKEN: &str = "metrics-token-of-this-test-7Qx2";

/// `dataref token new NAME`: the token and its `[principals.NAME]` lines.
fn new_token(name: &str) -> (String, String) {
    let out = Command::new(BIN)
        .args(["token", "new", name])
        .output()
        .expect("run dataref token new");
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
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

/// The address in the line `metrics for Prometheus at http://ADDR/metrics`.
fn metrics_addr(line: &str) -> Option<SocketAddr> {
    let at = line.find("metrics for Prometheus at http://")?;
    let rest = &line[at + "metrics for Prometheus at http://".len()..];
    rest.split('/').next()?.parse().ok()
}

/// `GET path` on the metrics endpoint with `authorization` (a whole header value).
fn scrape(addr: SocketAddr, path: &str, authorization: Option<&str>) -> raw_http::Response {
    let headers: Vec<(&str, &str)> = authorization
        .map(|a| vec![("Authorization", a)])
        .unwrap_or_default();
    raw_http::request(addr, "GET", path, &headers, b"").expect("the metrics endpoint answers")
}

/// The value of the sample line `series` (name and labels exactly as rendered), if any.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn config(db: &Path, extra: &str) -> String {
    format!(
        "[python]\nenabled = false\n\n[sources.shop]\nkind = \"sqlite\"\npath = \"{}\"\nallow_sql = true\n\n{extra}",
        db.display()
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn serve_http_metrics_move_pass_promtool_and_reach_prometheus() {
    dataref_config::tls::install_provider();
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let db = make_sample(&home, "2000");
    let (token, lines) = new_token("eu_analyst");
    let (burst_token, burst_lines) = new_token("burst");
    let config_path = dir.path().join("dataref.toml");
    std::fs::write(
        &config_path,
        config(
            &db,
            &format!(
                "[metrics]\nlisten = \"127.0.0.1:0\"\ntoken = \"${{{TOKEN_VAR}}}\"\n\n{lines}\n{burst_lines}"
            ),
        ),
    )
    .expect("write config");
    // The agent's model: one answer with its usage, then a refusal.
    let model = ScriptedModel::start(vec![
        Reply::text("Revenue grew.").usage(120, 12),
        Reply::status(400).message("no such thing"),
    ])
    .expect("model server");
    let mut cmd = ServeHttp::command(BIN, &home, &config_path);
    cmd.env(TOKEN_VAR, METRICS_TOKEN)
        .env_remove("DATAREF_LLM_API_KEY")
        .env("DATAREF_LLM_URL", model.url())
        .env("DATAREF_LLM_MODEL", "test-model");
    let server = ServeHttp::start(&mut cmd, Duration::from_secs(60)).expect("serve --http");
    let addr = metrics_addr_of(&server);
    let mcp = format!("{}/mcp", server.base());

    // Calls: two that work, one of a tool that does not exist, one the tool refuses.
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(mcp.clone()).auth_header(token.clone()),
    );
    let client = ().serve(transport).await.expect("MCP handshake");
    let call = |name: &str, args: Value| {
        let Value::Object(args) = args else {
            panic!("an object")
        };
        CallToolRequestParams::new(name.to_owned()).with_arguments(args)
    };
    let ok = client
        .call_tool(call(
            "query",
            json!({"source": "shop", "sql": "SELECT region, count(*) AS n FROM sales GROUP BY region"}),
        ))
        .await
        .expect("answered");
    assert_ne!(ok.is_error, Some(true), "{:?}", ok.content);
    let listed = client
        .call_tool(call("list_artifacts", json!({})))
        .await
        .expect("answered");
    assert_ne!(listed.is_error, Some(true));
    let unknown = client
        .call_tool(call("no_such_tool_a_model_made_up", json!({})))
        .await
        .expect("answered");
    assert_eq!(unknown.is_error, Some(true));
    let refused = client
        .call_tool(call(
            "query",
            json!({"source": "shop", "sql": "DELETE FROM sales"}),
        ))
        .await
        .expect("answered");
    assert_eq!(refused.is_error, Some(true));
    client.cancel().await.ok();

    // Two agent runs, one model request each: answered, refused.
    let http = reqwest::Client::new();
    for message in ["How did revenue do?", "And now?"] {
        let r = http
            .post(format!("{}/agent/sessions", server.base()))
            .bearer_auth(&token)
            .header("content-type", "application/json")
            .body(json!({ "message": message }).to_string())
            .send()
            .await
            .expect("sent");
        assert_eq!(r.status(), 200);
        let stream = r.text().await.expect("the whole stream");
        assert!(stream.contains("event: done"), "{stream}");
    }

    // Refused at the door: no token, a wrong one.
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string();
    let no_token = http
        .post(&mcp)
        .body(body.clone())
        .send()
        .await
        .expect("sent");
    assert_eq!(no_token.status(), 401);
    let wrong = http
        .post(&mcp)
        .bearer_auth("not-a-token")
        .body(body.clone())
        .send()
        .await
        .expect("sent");
    assert_eq!(wrong.status(), 401);
    // One principal's burst past its bucket (600 a minute, bursts of 60): 429s.
    let mut limited = 0;
    for _ in 0..200 {
        let r = http
            .post(&mcp)
            .bearer_auth(&burst_token)
            .body("{}")
            .send()
            .await
            .expect("sent");
        if r.status() == 429 {
            limited += 1;
            if limited == 3 {
                break;
            }
        }
    }
    assert_eq!(limited, 3, "the burst was never limited");

    // The endpoint: the token first, then the path.
    let bearer = format!("Bearer {METRICS_TOKEN}");
    assert_eq!(scrape(addr, "/metrics", None).status, 401);
    let r = scrape(addr, "/metrics", Some("Bearer wrong"));
    assert_eq!(r.status, 401);
    assert!(
        r.header("WWW-Authenticate")
            .is_some_and(|v| v.starts_with("Bearer")),
        "{:?}",
        r.headers
    );
    assert_eq!(scrape(addr, "/other", None).status, 401, "no path is told");
    assert_eq!(scrape(addr, "/other", Some(&bearer)).status, 404);
    let r = scrape(addr, "/metrics", Some(&bearer));
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("Content-Type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let text = r.text();
    for (series, at_least) in [
        (
            r#"dataref_tool_calls_total{tool="query",outcome="ok"}"#,
            1.0,
        ),
        (
            r#"dataref_tool_calls_total{tool="list_artifacts",outcome="ok"}"#,
            1.0,
        ),
        // The invented name is no label value of its own.
        (
            r#"dataref_tool_calls_total{tool="other",outcome="unknown_tool"}"#,
            1.0,
        ),
        (
            r#"dataref_tool_calls_total{tool="query",outcome="tool_failed"}"#,
            1.0,
        ),
        (
            r#"dataref_tool_call_duration_seconds_bucket{tool="query",le="+Inf"}"#,
            2.0,
        ),
        (
            r#"dataref_mcp_requests_total{transport="http",method="tools/call"}"#,
            4.0,
        ),
        (
            r#"dataref_mcp_requests_total{transport="http",method="initialize"}"#,
            1.0,
        ),
        (
            r#"dataref_http_requests_total{route="/mcp",status="200"}"#,
            4.0,
        ),
        (
            r#"dataref_http_requests_total{route="/mcp",status="401"}"#,
            2.0,
        ),
        (
            r#"dataref_http_requests_total{route="/mcp",status="429"}"#,
            3.0,
        ),
        (r#"dataref_auth_failures_total{reason="missing"}"#, 1.0),
        (r#"dataref_auth_failures_total{reason="invalid"}"#, 1.0),
        (r#"dataref_rate_limited_total{reason="rate"}"#, 3.0),
        (
            r#"dataref_model_requests_total{agent="default",model="test-model",outcome="ok"}"#,
            1.0,
        ),
        (
            r#"dataref_model_requests_total{agent="default",model="test-model",outcome="error"}"#,
            1.0,
        ),
        (
            r#"dataref_model_tokens_total{agent="default",model="test-model",kind="prompt"}"#,
            120.0,
        ),
        (
            r#"dataref_model_tokens_total{agent="default",model="test-model",kind="completion"}"#,
            12.0,
        ),
        (
            r#"dataref_model_request_duration_seconds_count{agent="default",model="test-model"}"#,
            2.0,
        ),
        (
            r#"dataref_http_requests_total{route="/agent/sessions",status="200"}"#,
            2.0,
        ),
        ("dataref_store_tables", 1.0),
        ("dataref_store_bytes", 100.0),
    ] {
        let v = sample(&text, series).unwrap_or_else(|| panic!("no `{series}` in:\n{text}"));
        assert!(v >= at_least, "{series} = {v}, expected ≥ {at_least}");
    }
    assert!(
        !text.contains("no_such_tool_a_model_made_up"),
        "an unknown tool's name is not a label value"
    );
    promtool_check_metrics(&text).expect("promtool check metrics");

    // A real Prometheus scraping it with the token, queried over its HTTP API.
    let prom = TestPrometheus::start(addr, "/metrics", Some(METRICS_TOKEN)).expect("Prometheus");
    let series = prom
        .wait_for(
            r#"dataref_tool_calls_total{outcome="unknown_tool"}"#,
            Duration::from_secs(60),
        )
        .unwrap_or_else(|e| panic!("{e:#}\nPrometheus:\n{}", prom.log()));
    assert_eq!(series.len(), 1, "{series:?}");
    assert_eq!(series[0]["metric"]["tool"], "other", "{series:?}");
    assert_eq!(series[0]["value"][1], "1", "{series:?}");
    let all = prom.query("dataref_tool_calls_total").expect("query");
    assert!(all.len() >= 4, "{all:?}");
    let up = prom.query("up").expect("query");
    assert_eq!(up[0]["value"][1], "1", "{up:?}");
    let quantile = prom
        .query("histogram_quantile(0.5, sum by (le) (rate(dataref_tool_call_duration_seconds_bucket[1m])))")
        .expect("a histogram Prometheus can read");
    let _ = quantile;
    the_dashboard_and_the_alerts_evaluate(&prom);
}

/// The book's dashboard and alerting rules (`docs/src/operations/`): `promtool check rules`
/// passes, every expression of both evaluates on this Prometheus, and the panels of what
/// the test did (tool calls, HTTP, refusals) have series.
fn the_dashboard_and_the_alerts_evaluate(prom: &TestPrometheus) {
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/src/operations");
    let rules = docs.join("alerts.yml");
    promtool_check_rules(&rules).expect("promtool check rules");
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(docs.join("dashboard.json")).expect("the dashboard"),
    )
    .expect("the dashboard is JSON");
    // Grafana's variables, as Grafana would fill them in.
    let fill = |e: &str| {
        e.replace("$__rate_interval", "1m")
            .replace("$instance", ".*")
    };
    let mut panels = BTreeMap::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = fill(target["expr"].as_str().expect("expr"));
            panels.insert(expr, panel["title"].as_str().unwrap_or("").to_owned());
        }
    }
    assert!(panels.len() >= 14, "{panels:?}");
    for (expr, title) in &panels {
        prom.query(expr)
            .unwrap_or_else(|e| panic!("panel `{title}`: `{expr}` does not evaluate: {e:#}"));
    }
    for title in [
        "Tool calls by outcome",
        "HTTP requests by status",
        "Refused: rate limits and credentials",
    ] {
        let expr = panels
            .iter()
            .find(|(_, t)| t.as_str() == title)
            .map(|(e, _)| e.clone())
            .unwrap_or_else(|| panic!("no panel `{title}`"));
        prom.wait_for(&expr, Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("panel `{title}` stays empty: {e:#}"));
    }
    let exprs = alert_exprs(&std::fs::read_to_string(&rules).expect("the rules"));
    assert!(exprs.len() >= 10, "{exprs:?}");
    for expr in &exprs {
        prom.query(expr)
            .unwrap_or_else(|e| panic!("alert `{expr}` does not evaluate: {e:#}"));
    }
}

/// The `expr:` of each rule in a rules file: on its line, or the block under `expr: |`.
fn alert_exprs(yaml: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut lines = yaml.lines().peekable();
    while let Some(line) = lines.next() {
        let Some((indent, rest)) = line.split_once("expr:") else {
            continue;
        };
        let rest = rest.trim();
        if rest != "|" {
            out.push(rest.to_owned());
            continue;
        }
        let mut block = Vec::new();
        while let Some(next) = lines.peek() {
            if next.len() - next.trim_start().len() <= indent.len() {
                break;
            }
            block.push(next.trim().to_owned());
            lines.next();
        }
        out.push(block.join(" "));
    }
    out
}

/// `dataref serve` over stdio serves the endpoint too (no token on loopback), and counts
/// the MCP requests that came over stdio.
#[tokio::test(flavor = "multi_thread")]
async fn serve_stdio_serves_metrics_on_its_own_port() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let db = make_sample(&home, "1000");
    let config_path = dir.path().join("dataref.toml");
    std::fs::write(
        &config_path,
        config(&db, "[metrics]\nlisten = \"127.0.0.1:0\"\npath = \"/m\"\n"),
    )
    .expect("write config");
    let (client, addr) = serve_stdio(&home, &config_path, "alice").await;
    let r = client
        .call_tool(CallToolRequestParams::new("list_artifacts"))
        .await
        .expect("answered");
    assert_ne!(r.is_error, Some(true));
    let text = scrape_async(addr, "/m").await;
    for series in [
        r#"dataref_mcp_requests_total{transport="stdio",method="initialize"}"#,
        r#"dataref_mcp_requests_total{transport="stdio",method="tools/call"}"#,
        r#"dataref_tool_calls_total{tool="list_artifacts",outcome="ok"}"#,
    ] {
        assert_eq!(sample(&text, series), Some(1.0), "{series} in:\n{text}");
    }
    assert!(
        !text.contains("dataref_http_requests_total"),
        "no HTTP server here:\n{text}"
    );
    promtool_check_metrics(&text).expect("promtool check metrics");
    client.cancel().await.ok();
}

/// `GET path` off the async workers; the body of its 200.
async fn scrape_async(addr: SocketAddr, path: &'static str) -> String {
    let r = tokio::task::spawn_blocking(move || scrape(addr, path, None))
        .await
        .expect("scraped");
    assert_eq!(r.status, 200, "{}", r.text());
    r.text()
}

/// `dataref serve` over stdio as `principal`, and the metrics address it printed.
async fn serve_stdio(home: &Path, config: &Path, principal: &str) -> (Client, SocketAddr) {
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.arg("serve")
        .arg("--home")
        .arg(home)
        .arg("--config")
        .arg(config)
        .env("DATAREF_PRINCIPAL", principal)
        .env_remove("DATAREF_CONFIG");
    let (transport, stderr) = TokioChildProcess::builder(cmd)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dataref serve");
    let client = ().serve(transport).await.expect("MCP handshake");
    let mut stderr = tokio::io::BufReader::new(stderr.expect("stderr"));
    let addr = tokio::time::timeout(Duration::from_secs(30), async {
        use tokio::io::AsyncBufReadExt;
        let mut line = String::new();
        loop {
            line.clear();
            if stderr.read_line(&mut line).await.expect("stderr") == 0 {
                panic!("stderr ended before the metrics line");
            }
            if let Some(a) = metrics_addr(&line) {
                return a;
            }
        }
    })
    .await
    .expect("the metrics line within 30 s");
    // Keep reading stderr so the server never blocks on a full pipe.
    tokio::spawn(async move {
        use tokio::io::AsyncBufReadExt;
        let mut line = String::new();
        while stderr.read_line(&mut line).await.is_ok_and(|n| n > 0) {
            line.clear();
        }
    });
    (client, addr)
}

/// `run_python`'s pool and `run_sql`'s memory limit, counted: a job stopped at its
/// timeout, one that ends by itself, a query over its working memory. On the data dir
/// where the sandbox tests keep the managed runtime (installed once per target dir).
#[tokio::test(flavor = "multi_thread")]
async fn sandbox_pool_and_sql_limits_are_counted() {
    let home = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dataref-runtime-home");
    let db = make_sample(&home, "2000");
    let dir = tempfile::tempdir().expect("tempdir");
    let config_path = dir.path().join("dataref.toml");
    std::fs::write(
        &config_path,
        format!(
            "[python]\npool_size = 1\ntimeout = \"3s\"\n\n[sql]\nmemory = \"16MiB\"\n\n\
             [sources.shop]\nkind = \"sqlite\"\npath = \"{}\"\nallow_sql = true\n\n\
             [metrics]\nlisten = \"127.0.0.1:0\"\n",
            db.display()
        ),
    )
    .expect("write config");
    let (client, addr) = serve_stdio(&home, &config_path, "metrics_sandbox").await;
    let call = |name: &str, args: Value| {
        let Value::Object(args) = args else {
            panic!("an object")
        };
        CallToolRequestParams::new(name.to_owned()).with_arguments(args)
    };
    let r = client
        .call_tool(call(
            "query",
            json!({"source": "shop", "sql": "SELECT * FROM sales"}),
        ))
        .await
        .expect("answered");
    assert_ne!(r.is_error, Some(true), "{:?}", r.content);
    let sales = r.structured_content.expect("a dataRef")["dataRef"].clone();
    let r = client
        .call_tool(call(
            "run_sql",
            json!({"sql": "SELECT a.*, b.revenue AS r2 FROM sales a CROSS JOIN sales b ORDER BY a.revenue * b.revenue", "inputs": {"sales": sales}}),
        ))
        .await
        .expect("answered");
    assert_eq!(r.is_error, Some(true), "{:?}", r.content);
    assert!(
        format!("{:?}", r.content).contains("working memory"),
        "{:?}",
        r.content
    );
    let r = client
        .call_tool(call(
            "run_python",
            json!({"code": "import time\ntime.sleep(60)"}),
        ))
        .await
        .expect("answered");
    // The run's own failure, for the model to read: not an error of the call.
    assert!(
        format!("{:?}", r.content).contains("was stopped"),
        "{:?}",
        r.content
    );
    let r = client
        .call_tool(call("run_python", json!({"code": "result = 1"})))
        .await
        .expect("answered");
    assert_ne!(r.is_error, Some(true), "{:?}", r.content);

    let text = scrape_async(addr, "/metrics").await;
    for (series, at_least) in [
        (r#"dataref_sandbox_kills_total{reason="timeout"}"#, 1.0),
        (r#"dataref_sandbox_kills_total{reason="memory"}"#, 0.0),
        (r#"dataref_sql_stopped_total{limit="memory"}"#, 1.0),
        (r#"dataref_sql_stopped_total{limit="time"}"#, 0.0),
        ("dataref_sandbox_cold_starts_total", 0.0),
        ("dataref_sandbox_warm", 0.0),
        (
            r#"dataref_tool_calls_total{tool="run_python",outcome="ok"}"#,
            2.0,
        ),
        (
            r#"dataref_tool_calls_total{tool="run_sql",outcome="tool_failed"}"#,
            1.0,
        ),
    ] {
        let v = sample(&text, series).unwrap_or_else(|| panic!("no `{series}` in:\n{text}"));
        assert!(v >= at_least, "{series} = {v}, expected ≥ {at_least}");
    }
    assert_eq!(sample(&text, "dataref_sandbox_busy"), Some(0.0), "{text}");
    promtool_check_metrics(&text).expect("promtool check metrics");
    client.cancel().await.ok();
}

/// What a start refuses, before anything is served: a listen address that is not loopback
/// without a token (at config resolution, and by `doctor`), a port already taken.
#[test]
fn metrics_refusals_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let run = |config: &str, args: &[&str]| {
        let path = dir.path().join("dataref.toml");
        std::fs::write(&path, config).expect("write config");
        let out = Command::new(BIN)
            .args(args)
            .arg("--home")
            .arg(&home)
            .arg("--config")
            .arg(&path)
            .env_remove("DATAREF_CONFIG")
            .env_remove("DATAREF_HOME")
            .env_remove(TOKEN_VAR)
            .stdin(Stdio::null())
            .output()
            .expect("run dataref");
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let (ok, said) = run("[metrics]\nlisten = \"0.0.0.0:0\"\n", &["serve"]);
    assert!(!ok);
    assert!(
        said.contains("metrics.listen") && said.contains("not a loopback address"),
        "{said}"
    );
    assert!(said.contains("hint: set `token"), "{said}");

    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let port = taken.local_addr().expect("addr").port();
    let (ok, said) = run(
        &format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n"),
        &["serve"],
    );
    assert!(!ok);
    assert!(
        said.contains("the metrics endpoint: cannot listen on `127.0.0.1:")
            && said.contains("hint: choose a free port"),
        "{said}"
    );
    let (ok, said) = run(
        &format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\ntoken = \"${{{TOKEN_VAR}}}\"\n"),
        &["doctor"],
    );
    assert!(!ok, "{said}");
    assert!(
        said.contains("metrics.token") && said.contains(TOKEN_VAR),
        "{said}"
    );
    drop(taken);
}

/// The metrics address a `serve --http` printed (after its MCP line).
fn metrics_addr_of(server: &ServeHttp) -> SocketAddr {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(a) = server.log_lines().iter().find_map(|l| metrics_addr(l)) {
            return a;
        }
        assert!(
            Instant::now() < deadline,
            "no metrics line:\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// With `[shared]`: the store's size read from the shared index, the cache's hits and
/// misses on each replica, and the object store's failures while it is down.
#[tokio::test(flavor = "multi_thread")]
async fn shared_store_size_cache_and_errors_are_counted() {
    use super::replicas::{Cluster, EU, Extra};
    let mut c = Cluster::start(
        2,
        Extra {
            tables: "[metrics]\nlisten = \"127.0.0.1:0\"\n".into(),
            ..Extra::default()
        },
    );
    let (a, b) = (c.direct(0), c.direct(1));
    let (ma, mb) = (
        metrics_addr_of(&c.replicas[0]),
        metrics_addr_of(&c.replicas[1]),
    );
    let r = c
        .ok(&a, EU, "fetch_sales", json!({"since": "2025-01-01"}))
        .await["dataRef"]
        .clone();
    // A wrote it (and keeps it in its cache); B fetches it from the bucket.
    c.ok(&a, EU, "describe_data", json!({"dataRef": r})).await;
    c.ok(&b, EU, "describe_data", json!({"dataRef": r})).await;
    let on_b = scrape_async(mb, "/metrics").await;
    assert_eq!(
        sample(
            &on_b,
            r#"dataref_cache_lookups_total{cache="artifacts",result="miss"}"#
        ),
        Some(1.0),
        "{on_b}"
    );
    // Every replica reads the one index: B counts the table A stored.
    assert_eq!(sample(&on_b, "dataref_store_tables"), Some(1.0), "{on_b}");
    assert!(
        sample(&on_b, "dataref_store_bytes").is_some_and(|b| b > 1000.0),
        "{on_b}"
    );
    c.s3.stop().expect("stop SeaweedFS");
    let write = c
        .call(&a, EU, "fetch_sales", json!({"since": "2025-06-01"}))
        .await;
    assert_eq!(write["isError"], json!(true), "{write}");
    let on_a = scrape_async(ma, "/metrics").await;
    let errors: f64 = on_a
        .lines()
        .filter(|l| l.starts_with("dataref_shared_store_errors_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(errors >= 1.0, "no shared-store error counted:\n{on_a}");
    assert!(
        sample(
            &on_a,
            r#"dataref_cache_lookups_total{cache="artifacts",result="hit"}"#
        )
        .is_some_and(|h| h >= 1.0),
        "{on_a}"
    );
    promtool_check_metrics(&on_a).expect("promtool check metrics");
    c.s3.restart().expect("restart SeaweedFS");
    // The index hangs (PostgreSQL stopped, its connections open): a scrape still answers
    // well inside Prometheus's own 10 s timeout, with the last size read, and scrapes made
    // while the read hangs start no second one.
    c.pg.freeze().expect("freeze PostgreSQL");
    for _ in 0..3 {
        let scraped =
            tokio::time::timeout(Duration::from_secs(5), scrape_async(mb, "/metrics")).await;
        let text = scraped.expect("a scrape answers while the index hangs");
        assert_eq!(sample(&text, "dataref_store_tables"), Some(1.0), "{text}");
    }
    c.pg.thaw().expect("thaw PostgreSQL");
}
