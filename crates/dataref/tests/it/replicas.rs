//! Several `dataref serve --http` replicas behind HAProxy, sharing one object store
//! (SeaweedFS's S3 server) and one PostgreSQL index, every part real and started here. Each
//! MCP call is a stateless 2026-07-28 request the balancer sends to whichever replica is
//! next, so a test only passes when the state it needs is shared.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dataref_test_support::{
    HaproxyOptions, HealthCheck, ScriptedModel, ServeHttp, Stickiness, TestHaproxy, TestPostgres,
    TestS3,
};
use serde_json::{Value, json};

use super::BIN;

const ROWS: &str = "20000";
pub(crate) const EU: &str = "eu-token-0123456789abcdef0123456789abcdef";
const US: &str = "us-token-0123456789abcdef0123456789abcdef";

fn digest(token: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, token.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// One replica: `dataref serve --http` on its own data dir.
pub(crate) type Replica = ServeHttp;

/// The services, the replicas and the balancer in front of them.
pub(crate) struct Cluster {
    pub(crate) s3: TestS3,
    pub(crate) pg: TestPostgres,
    pub(crate) replicas: Vec<Replica>,
    pub(crate) lb: TestHaproxy,
    pub(crate) model: ScriptedModel,
    dir: tempfile::TempDir,
    config: PathBuf,
    http: reqwest::Client,
}

/// What a cluster's config adds to the common part.
#[derive(Debug, Clone, Default)]
pub(crate) struct Extra {
    /// More lines for `[http]`.
    pub(crate) http: String,
    /// More top-level tables.
    pub(crate) tables: String,
    pub(crate) python: bool,
    pub(crate) sticky: bool,
    /// `[http] rate_per_minute` (default: high enough never to matter).
    pub(crate) rate_per_minute: Option<u32>,
}

impl Cluster {
    pub(crate) fn start(n: usize, extra: Extra) -> Self {
        dataref_config::tls::install_provider();
        let s3 = TestS3::start().expect("start SeaweedFS (scripts/test installs it)");
        let pg = TestPostgres::start().expect("start PostgreSQL");
        let model = ScriptedModel::start(Vec::new()).expect("model server");
        let dir = tempfile::tempdir().expect("tempdir");
        // The sandbox's jobs run as another uid, which must pass through to each replica's
        // data dir (as under /var/lib in a deployment).
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o711),
        )
        .expect("chmod");
        let db = super::make_sample(&dir.path().join("sample-home"), ROWS);
        let python = if extra.python {
            "enabled = true\npool_size = 1"
        } else {
            "enabled = false"
        };
        let config = dir.path().join("dataref.toml");
        std::fs::write(
            &config,
            format!(
                r#"
[python]
{python}

[http]
rate_per_minute = {rate}
max_concurrent = 64
{http}

[shared]
objects = "s3://{bucket}/replicas-test"
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
sql = "SELECT date, line, region, channel, units, revenue, discount FROM sales WHERE date >= :since ORDER BY date, id"
params.since = {{ type = "date", required = true }}

[agents.default]
tools = ["fetch_*", "describe_data", "run_sql"]

[principals.eu_analyst]
token_sha256 = ["{eu}"]

[principals.us_analyst]
token_sha256 = ["{us}"]

{tables}
"#,
                http = extra.http,
                rate = extra.rate_per_minute.unwrap_or(1_000_000),
                bucket = s3.bucket(),
                endpoint = s3.endpoint(),
                region = s3.region(),
                db = db.display(),
                eu = digest(EU),
                us = digest(US),
                tables = extra.tables,
            ),
        )
        .expect("write config");
        let homes: Vec<PathBuf> = (0..n)
            .map(|i| dir.path().join(format!("replica-{i}")))
            .collect();
        // Started side by side: each takes a few seconds (the sample, the index, the bucket).
        let replicas: Vec<Replica> = std::thread::scope(|scope| {
            let started: Vec<_> = homes
                .iter()
                .map(|home| scope.spawn(|| spawn_replica(home, &config, &s3, &pg, &model)))
                .collect();
            started
                .into_iter()
                .map(|h| h.join().expect("a replica's start"))
                .collect()
        });
        let lb = TestHaproxy::start(
            &replicas
                .iter()
                .map(|r| r.addr().parse().expect("a socket address"))
                .collect::<Vec<_>>(),
            HaproxyOptions {
                stickiness: if extra.sticky {
                    Stickiness::mcp_session()
                } else {
                    Stickiness::None
                },
                // The page at `/` answers without a token: a replica that serves it is up.
                health_check: HealthCheck::Http { path: "/".into() },
                ..HaproxyOptions::default()
            },
        )
        .expect("start HAProxy (scripts/test installs it)");
        Self {
            s3,
            pg,
            replicas,
            lb,
            model,
            dir,
            config,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(300))
                .build()
                .expect("client"),
        }
    }

    /// The balancer's base URL.
    pub(crate) fn base(&self) -> String {
        self.lb.url()
    }

    /// One replica's own base URL (bypassing the balancer).
    pub(crate) fn direct(&self, i: usize) -> String {
        self.replicas[i].base()
    }

    /// Starts replica `i` again on its data dir (after a `kill -9`), on a new port; the
    /// balancer keeps the old address, so this is for direct calls.
    pub(crate) fn restart(&mut self, i: usize) {
        let home = self.dir.path().join(format!("replica-{i}"));
        self.replicas[i] = spawn_replica(&home, &self.config, &self.s3, &self.pg, &self.model);
    }

    pub(crate) fn kill9(&mut self, i: usize) {
        self.replicas[i].kill();
    }

    pub(crate) fn logs(&self) -> String {
        self.replicas
            .iter()
            .enumerate()
            .map(|(i, r)| format!("--- replica {i}\n{}", r.log()))
            .chain([format!("--- the object store\n{}", self.s3.log_tail())])
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// One stateless MCP `tools/call` as `who` (`EU` or `US` token) to `base`: the
    /// JSON-RPC result.
    pub(crate) async fn call(&self, base: &str, token: &str, tool: &str, args: Value) -> Value {
        let body = json!({
            "jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": tool, "arguments": args, "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientInfo": {"name": "replicas-test", "version": "0"},
                "io.modelcontextprotocol/clientCapabilities": {},
            }},
        });
        let response = self
            .http
            .post(format!("{base}/mcp"))
            .bearer_auth(token)
            .header("Accept", "application/json, text/event-stream")
            .header("MCP-Protocol-Version", "2026-07-28")
            .header("Mcp-Method", "tools/call")
            .header("Mcp-Name", tool)
            .json(&body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("`{tool}` through {base}: {e}\n{}", self.logs()));
        let status = response.status();
        let text = response.text().await.expect("a body");
        assert!(
            status.is_success(),
            "`{tool}`: {status} {text}\n{}",
            self.logs()
        );
        let message: Value = if text.trim_start().starts_with('{') {
            serde_json::from_str(&text).expect("JSON")
        } else {
            text.lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
                .find(|m| m["id"] == 1)
                .unwrap_or_else(|| panic!("no answer in {text}"))
        };
        message["result"].clone()
    }

    /// A call that must succeed: its structured content.
    pub(crate) async fn ok(&self, base: &str, token: &str, tool: &str, args: Value) -> Value {
        let result = self.call(base, token, tool, args).await;
        assert_ne!(
            result["isError"],
            json!(true),
            "`{tool}`: {result}\n{}",
            self.logs()
        );
        result["structuredContent"].clone()
    }

    /// The HTTP status of one `tools/call` of `tool` (no arguments).
    pub(crate) async fn status(&self, base: &str, token: &str, tool: &str) -> u16 {
        self.http
            .post(format!("{base}/mcp"))
            .bearer_auth(token)
            .header("Accept", "application/json, text/event-stream")
            .header("MCP-Protocol-Version", "2026-07-28")
            .header("Mcp-Method", "tools/call")
            .header("Mcp-Name", tool)
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": tool, "arguments": {}, "_meta": {
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "0"},
                    "io.modelcontextprotocol/clientCapabilities": {}}}}))
            .send()
            .await
            .expect("a response")
            .status()
            .as_u16()
    }

    /// `GET /ready` of `base`, without a token (as a balancer asks): status and body.
    pub(crate) async fn ready(&self, base: &str) -> (u16, Value) {
        let response = self
            .http
            .get(format!("{base}/ready"))
            .send()
            .await
            .expect("a response");
        let status = response.status().as_u16();
        (status, response.json().await.expect("a JSON body"))
    }

    /// [`Cluster::ready`] until it answers `status`, for up to 10 s (a replica keeps its
    /// answer for a second, and a check takes up to 5 s): the last answer.
    pub(crate) async fn ready_turns(&self, base: &str, status: u16) -> (u16, Value) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let answer = self.ready(base).await;
            if answer.0 == status || Instant::now() > deadline {
                return answer;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub(crate) fn http(&self) -> &reqwest::Client {
        &self.http
    }
}

/// The first text block of a result.
pub(crate) fn text(result: &Value) -> String {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

fn spawn_replica(
    home: &Path,
    config: &Path,
    s3: &TestS3,
    pg: &TestPostgres,
    model: &ScriptedModel,
) -> Replica {
    ServeHttp::start(
        ServeHttp::command(BIN, home, config)
            .env_remove("DATAREF_LLM_API_KEY")
            .env("DATAREF_INDEX_URL", pg.url("postgres"))
            .env("AWS_ACCESS_KEY_ID", s3.access_key())
            .env("AWS_SECRET_ACCESS_KEY", s3.secret_key())
            .env("DATAREF_LLM_URL", model.url())
            .env("DATAREF_LLM_MODEL", "test-model")
            .env("DATAREF_LOG", "info"),
        Duration::from_secs(120),
    )
    .expect("a replica starts")
}

/// An artifact made through replica A is described, queried, run on in the sandbox,
/// charted and exported through replica B, and B's export is read and downloaded (by a
/// link B signed) through A.
#[tokio::test(flavor = "multi_thread")]
async fn an_artifact_made_on_one_replica_is_used_on_the_other() {
    let c = Cluster::start(
        2,
        Extra {
            python: true,
            ..Extra::default()
        },
    );
    let (a, b) = (c.direct(0), c.direct(1));
    let fetched = c
        .ok(&a, EU, "fetch_sales", json!({"since": "2025-01-01"}))
        .await;
    let r = fetched["dataRef"].as_str().expect("a dataRef").to_owned();
    let rows = fetched["rows"].as_u64().expect("rows");
    assert!(rows > 1000, "{fetched}");

    let described = c.ok(&b, EU, "describe_data", json!({"dataRef": r})).await;
    assert_eq!(described["rows"].as_u64(), Some(rows), "{described}");
    let summed = c
        .ok(
            &b,
            EU,
            "run_sql",
            json!({"sql": "SELECT count(*) AS n FROM s", "inputs": {"s": r}, "store_as": "value"}),
        )
        .await;
    assert_eq!(summed["values"][0][0].as_u64(), Some(rows), "{summed}");
    // The sandbox gets B's cached copy of the artifact as a descriptor; the object store's
    // credentials, in the server's environment, never reach it.
    let py = c
        .ok(
            &b,
            EU,
            "run_python",
            json!({"code": "import os\nresult = {'rows': int(len(sales)), 'env': sorted(os.environ)}",
                   "inputs": {"sales": r}}),
        )
        .await;
    assert_eq!(py["result"]["rows"].as_u64(), Some(rows), "{py}");
    let env = py["result"]["env"].to_string();
    assert!(!env.contains("AWS_"), "the sandbox saw {env}");
    assert!(!py.to_string().contains(c.s3.secret_key()));

    let chart = c
        .ok(
            &b,
            EU,
            "render_chart",
            json!({"dataRef": r, "x": "region", "y": "revenue", "kind": "bar"}),
        )
        .await;
    let png = chart["path"].as_str().expect("a chart path").to_owned();
    let export = c
        .ok(&b, EU, "export_data", json!({"source": r, "format": "csv"}))
        .await;
    let csv = export["path"].as_str().expect("an export path").to_owned();

    // B's files, through A.
    let read = c.call(&a, EU, "read_file", json!({"path": csv})).await;
    assert_ne!(read["isError"], json!(true), "{read}");
    assert!(text(&read).contains("date,line,region"), "{}", text(&read));
    let listed = c
        .ok(&a, EU, "list_files", json!({"path": "", "recursive": true}))
        .await;
    for path in [&png, &csv] {
        assert!(
            listed.to_string().contains(path.as_str()),
            "{path} in {listed}"
        );
    }
    let signed: Value = c
        .http()
        .post(format!("{b}/files/sign"))
        .bearer_auth(EU)
        .json(&json!({"path": csv}))
        .send()
        .await
        .expect("sign")
        .json()
        .await
        .expect("JSON");
    let url = signed["url"].as_str().expect("a signed URL");
    let path_and_query = &url[url.find("/files/").expect("a /files/ URL")..];
    let got = c
        .http()
        .get(format!("{a}{path_and_query}"))
        .send()
        .await
        .expect("download");
    assert_eq!(got.status(), 200, "a link B signed, served by A");
    let body = got.text().await.expect("body");
    assert_eq!(body.lines().count() as u64, rows + 1);
}

/// A spilled result written through A is read through B, and another principal finds
/// neither it nor the artifact on any replica, with the answers of what does not exist.
#[tokio::test(flavor = "multi_thread")]
async fn spill_files_and_artifacts_follow_their_owner_to_every_replica() {
    let c = Cluster::start(
        2,
        Extra {
            tables: "[spill]\nthreshold_chars = 200\npreview_chars = 100\n".into(),
            ..Extra::default()
        },
    );
    let (a, b) = (c.direct(0), c.direct(1));
    let r = c
        .ok(&a, EU, "fetch_sales", json!({"since": "2025-06-01"}))
        .await["dataRef"]
        .as_str()
        .expect("ref")
        .to_owned();
    // Five exports make a listing of over 200 characters: spilled to the workspace on A.
    for _ in 0..5 {
        c.ok(&a, EU, "export_data", json!({"source": r, "format": "csv"}))
            .await;
    }
    let spilled = c
        .call(&a, EU, "list_files", json!({"path": "exports"}))
        .await;
    let note = text(&spilled);
    let path = note
        .split(|ch: char| ch == '`' || ch.is_whitespace() || ch == '"')
        .find(|w| w.starts_with(".spill/"))
        .unwrap_or_else(|| panic!("a spill path in {note}"))
        .to_owned();
    let read = c.call(&b, EU, "read_file", json!({"path": path})).await;
    assert_ne!(read["isError"], json!(true), "{read}");
    assert!(text(&read).contains("exports/"), "{}", text(&read));

    for base in [&a, &b] {
        let theirs = c
            .call(base, US, "describe_data", json!({"dataRef": r}))
            .await;
        let unknown = c
            .call(
                base,
                US,
                "describe_data",
                json!({"dataRef": "data_AAAAAAAAAAAAAAAAAAAAAA"}),
            )
            .await;
        assert_eq!(theirs["isError"], json!(true));
        assert_eq!(
            text(&theirs).replace(&r, "REF"),
            text(&unknown).replace("data_AAAAAAAAAAAAAAAAAAAAAA", "REF"),
        );
        let file = c.call(base, US, "read_file", json!({"path": path})).await;
        let none = c
            .call(base, US, "read_file", json!({"path": ".spill/none.json"}))
            .await;
        assert_eq!(file["isError"], json!(true));
        assert_eq!(
            text(&file).replace(&path, "P"),
            text(&none).replace(".spill/none.json", "P")
        );
    }
}

/// An agent session started through A continues through B: the history written on A is
/// what the model gets on B.
#[tokio::test(flavor = "multi_thread")]
async fn an_agent_session_started_on_one_replica_continues_on_the_other() {
    use dataref_test_support::Reply;
    let c = Cluster::start(2, Extra::default());
    let (a, b) = (c.direct(0), c.direct(1));
    c.model.push(Reply::text("First answer."));
    let first = c
        .http()
        .post(format!("{a}/agent/sessions"))
        .bearer_auth(EU)
        .header("Accept", "text/event-stream")
        .json(&json!({"message": "Remember the word teal."}))
        .send()
        .await
        .expect("first message")
        .text()
        .await
        .expect("stream");
    let id = first
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find_map(|d| d["session"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("a session id in {first}"));
    c.model.push(Reply::text("It was teal."));
    let second = c
        .http()
        .post(format!("{b}/agent/sessions/{id}/messages"))
        .bearer_auth(EU)
        .header("Accept", "text/event-stream")
        .json(&json!({"message": "Which word?"}))
        .send()
        .await
        .expect("second message");
    assert_eq!(second.status(), 200);
    let second = second.text().await.expect("stream");
    assert!(second.contains("It was teal."), "{second}");
    let asked = c.model.requests();
    let last = asked.last().expect("a request").to_string();
    assert!(
        last.contains("Remember the word teal.") && last.contains("First answer."),
        "{last}"
    );
    // Listed and read on either replica; another principal sees none of it.
    for base in [&a, &b] {
        let listed: Value = c
            .http()
            .get(format!("{base}/agent/sessions"))
            .bearer_auth(EU)
            .send()
            .await
            .expect("list")
            .json()
            .await
            .expect("JSON");
        assert_eq!(listed["sessions"][0]["id"], json!(id), "{listed}");
        assert_eq!(listed["sessions"][0]["runs"], json!(2), "{listed}");
        let theirs = c
            .http()
            .get(format!("{base}/agent/sessions/{id}"))
            .bearer_auth(US)
            .send()
            .await
            .expect("read");
        assert_eq!(theirs.status(), 404);
    }
}

/// 50 clients × 100 calls through the balancer, spread over two replicas: no errors.
#[tokio::test(flavor = "multi_thread")]
async fn fifty_clients_by_a_hundred_calls_over_two_replicas() {
    let c = Arc::new(Cluster::start(2, Extra::default()));
    let base = c.base();
    let r = c
        .ok(&base, EU, "fetch_sales", json!({"since": "2025-06-01"}))
        .await["dataRef"]
        .as_str()
        .expect("ref")
        .to_owned();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..50 {
        let (c, base, r) = (c.clone(), base.clone(), r.clone());
        tasks.push(tokio::spawn(async move {
            for j in 0..100 {
                let result = if (i + j) % 2 == 0 {
                    c.call(&base, EU, "list_artifacts", json!({})).await
                } else {
                    c.call(
                        &base,
                        EU,
                        "describe_data",
                        json!({"dataRef": r, "columns": ["revenue"]}),
                    )
                    .await
                };
                assert_ne!(result["isError"], json!(true), "{result}");
            }
        }));
    }
    for t in tasks {
        t.await.expect("a client");
    }
    let took = started.elapsed();
    eprintln!("5000 calls over two replicas in {took:?}");
    // The balancer spread them: each replica served a good share.
    let served = c.lb.requests_per_backend().expect("HAProxy's counts");
    assert_eq!(served.len(), 2);
    assert!(
        served.iter().all(|&n| n >= 1000),
        "requests per replica: {served:?}"
    );
}

/// `kill -9` of a replica in the middle of a long fetch (while it reads the source, and
/// while it uploads the result) loses that call only: the other replica keeps serving
/// through the balancer, and nothing half-stored is ever visible.
#[tokio::test(flavor = "multi_thread")]
async fn a_replica_killed_mid_fetch_or_mid_upload_loses_that_call_only() {
    let mut c = Cluster::start(
        2,
        Extra {
            // About 3M rows (48 MB of Arrow): long enough to be cut at several points.
            tables: r#"
[queries.big]
source = "sample"
description = "Many generated rows."
sql = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3000000) SELECT i, i * 2 AS j FROM n"
"#
            .into(),
            ..Extra::default()
        },
    );
    let base = c.base();
    // How long a whole fetch takes here, on replica B.
    let t0 = Instant::now();
    let whole = c.ok(&c.direct(1), EU, "fetch_big", json!({})).await;
    let took = t0.elapsed();
    assert_eq!(whole["rows"], json!(3_000_000), "{whole}");
    let mut finished = 0;
    for fraction in [0.3, 0.85, 0.97] {
        let a = c.direct(0);
        let client = c.http().clone();
        let call = tokio::spawn(async move {
            client
                .post(format!("{a}/mcp"))
                .bearer_auth(EU)
                .header("Accept", "application/json, text/event-stream")
                .header("MCP-Protocol-Version", "2026-07-28")
                .header("Mcp-Method", "tools/call")
                .header("Mcp-Name", "fetch_big")
                .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                    "params": {"name": "fetch_big", "arguments": {}, "_meta": {
                        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "0"},
                        "io.modelcontextprotocol/clientCapabilities": {}}}}))
                .send()
                .await?
                .text()
                .await
        });
        tokio::time::sleep(took.mul_f64(fraction)).await;
        c.kill9(0);
        // The call on A is lost (its connection reset, or an answer cut short), unless it
        // was faster this time and finished first: then its table is whole and stays.
        let answer = call.await.expect("the task");
        if answer
            .as_ref()
            .is_ok_and(|body| body.contains("\"dataRef\""))
        {
            finished += 1;
        }
        // …and the balancer sends everything to B meanwhile: no error.
        for _ in 0..6 {
            let listed = c.ok(&base, EU, "list_artifacts", json!({})).await;
            // Whatever is listed is whole: every listed table describes.
            for a in listed["artifacts"].as_array().expect("artifacts") {
                let r = a["dataRef"].as_str().expect("ref");
                c.ok(
                    &base,
                    EU,
                    "describe_data",
                    json!({"dataRef": r, "columns": ["i"]}),
                )
                .await;
            }
        }
        c.restart(0);
    }
    assert!(finished < 3, "every kill came after its call had finished");
    // A kill may land after A stored its table but before the answer reached the client:
    // that table is whole and may be listed. Every listed table is whole, and every answered
    // fetch is listed.
    let listed = c.ok(&c.direct(0), EU, "list_artifacts", json!({})).await;
    let tables = listed["artifacts"].as_array().expect("artifacts");
    assert!(
        (1 + finished..=4).contains(&tables.len()),
        "only whole fetches are listed, each answered one among them: {listed}"
    );
    for a in tables {
        assert_eq!(
            a["rows"],
            json!(3_000_000),
            "a listed table is whole: {listed}"
        );
        let r = a["dataRef"].as_str().expect("ref");
        let d = c
            .ok(
                &c.direct(0),
                EU,
                "run_sql",
                json!({"sql": "SELECT count(*) AS n, sum(j) AS s FROM t",
                       "inputs": {"t": r}, "store_as": "value"}),
            )
            .await;
        assert_eq!(
            d["values"][0],
            json!([3_000_000, 9_000_003_000_000_u64]),
            "every row of {r} reads back: {d}"
        );
    }
}

/// The object store down for 10 seconds: calls that need it say so clearly (and store
/// nothing), calls that do not keep working, and after it is back everything works.
#[tokio::test(flavor = "multi_thread")]
async fn the_object_store_down_for_ten_seconds_gives_clear_errors_then_recovers() {
    let mut c = Cluster::start(2, Extra::default());
    let (a, b) = (c.direct(0), c.direct(1));
    let r = c
        .ok(&a, EU, "fetch_sales", json!({"since": "2025-01-01"}))
        .await["dataRef"]
        .as_str()
        .expect("ref")
        .to_owned();
    for base in [&a, &b] {
        let (status, body) = c.ready(base).await;
        assert_eq!(status, 200, "{body}");
    }
    c.s3.stop().expect("stop SeaweedFS");
    let down = Instant::now();
    // Each replica tells a balancer's health check it cannot serve, and why.
    for base in [&a, &b] {
        let (status, body) = c.ready_turns(base, 503).await;
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["ready"], json!(false), "{body}");
        let message = body["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("object store") && !message.contains("index"),
            "{body}"
        );
    }
    // B has never read the table: it needs the bucket.
    let read = c.call(&b, EU, "describe_data", json!({"dataRef": r})).await;
    assert_eq!(read["isError"], json!(true), "{read}");
    assert!(
        text(&read).contains("unavailable right now")
            && text(&read).contains("try the same call again"),
        "{}",
        text(&read)
    );
    let write = c
        .call(&a, EU, "fetch_sales", json!({"since": "2025-06-01"}))
        .await;
    assert_eq!(write["isError"], json!(true), "{write}");
    assert!(text(&write).contains("unavailable"), "{}", text(&write));
    // What needs only the index still answers; A has the table in its cache.
    let listed = c.ok(&b, EU, "list_artifacts", json!({})).await;
    assert_eq!(
        listed["total"],
        json!(1),
        "the failed fetch stored nothing: {listed}"
    );
    c.ok(&a, EU, "describe_data", json!({"dataRef": r})).await;
    if let Some(rest) = Duration::from_secs(10).checked_sub(down.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    c.s3.restart().expect("restart SeaweedFS");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let again = c.call(&b, EU, "describe_data", json!({"dataRef": r})).await;
        if again["isError"] != json!(true) {
            break;
        }
        assert!(Instant::now() < deadline, "no recovery: {again}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for base in [&a, &b] {
        let (status, body) = c.ready_turns(base, 200).await;
        assert_eq!(status, 200, "ready again: {body}");
    }
    let fresh = c
        .ok(&a, EU, "fetch_sales", json!({"since": "2025-06-01"}))
        .await["dataRef"]
        .as_str()
        .expect("ref")
        .to_owned();
    c.ok(&b, EU, "describe_data", json!({"dataRef": fresh}))
        .await;
}

/// The limits are per principal across replicas: past `rate_per_minute`, requests are
/// refused whichever replica they reach; another principal is not affected.
#[tokio::test(flavor = "multi_thread")]
async fn the_rate_limit_holds_across_replicas() {
    let c = Cluster::start(
        2,
        Extra {
            rate_per_minute: Some(30),
            ..Extra::default()
        },
    );
    let base = c.base();
    let (mut ok, mut refused) = (0, 0);
    for _ in 0..40 {
        match c.status(&base, EU, "list_artifacts").await {
            200 => ok += 1,
            429 => refused += 1,
            other => panic!("status {other}\n{}", c.logs()),
        }
    }
    // One bucket for the principal across both replicas: a burst of 10 (a tenth of the
    // minute's 30, at least 10), refilled at one every 2 s. Two unshared replicas would
    // accept 20 at once.
    assert!(
        ok <= 15,
        "{ok} of 40 accepted at a rate of 30 a minute over two replicas"
    );
    assert!(refused >= 25, "{refused} refused");
    assert_eq!(c.status(&base, US, "list_artifacts").await, 200);
}

/// A client of the session-based protocol (2025-11-25: `initialize`, then `Mcp-Session-Id`)
/// works through a balancer that sticks on that header.
#[tokio::test(flavor = "multi_thread")]
async fn a_session_based_client_works_through_a_sticky_balancer() {
    use rmcp::ServiceExt;
    use rmcp::model::CallToolRequestParams;
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    let c = Cluster::start(
        2,
        Extra {
            sticky: true,
            ..Extra::default()
        },
    );
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(format!("{}/mcp", c.base()))
            .auth_header(EU.to_owned()),
    );
    let client = ().serve(transport).await.expect("handshake through the balancer");
    for _ in 0..20 {
        let listed = client
            .call_tool(CallToolRequestParams::new("list_artifacts"))
            .await
            .expect("a call in the session");
        assert_ne!(listed.is_error, Some(true), "{listed:?}");
    }
    client.cancel().await.expect("close the session");
}

/// A run on replica A asks before each of two calls; the person's answers reach replica B
/// (no stickiness for the agent API), and the run on A goes on with them. The first is
/// answered the moment the stream shows it, while A's index is slow to take the call (a
/// transaction holds the approvals table for 2 s): the call must be pending by then.
#[tokio::test(flavor = "multi_thread")]
async fn an_approval_asked_on_one_replica_is_answered_through_the_other() {
    use crate::agent_http::Sse;
    use dataref_test_support::{Call, Reply};
    let c = Cluster::start(
        2,
        Extra {
            tables: "[agents.careful]\ntools = [\"fetch_*\"]\n\n[agents.careful.approval]\nfetch_sales = \"ask\"\n"
                .into(),
            ..Extra::default()
        },
    );
    let (a, b) = (c.direct(0), c.direct(1));
    c.model.push(Reply::tool_calls(vec![
        Call::new("call_1", "fetch_sales", r#"{"since": "2025-06-01"}"#),
        Call::new("call_2", "fetch_sales", r#"{"since": "2025-01-01"}"#),
    ]));
    c.model.push(Reply::text("Approved on B, fetched on A."));
    let index = c.pg.client().await.expect("the index");
    index
        .batch_execute("BEGIN; LOCK TABLE dataref_approvals IN SHARE MODE")
        .await
        .expect("hold the approvals");
    let busy = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(2)).await;
        index.batch_execute("COMMIT").await.expect("let them go");
    });
    let started = c
        .http()
        .post(format!("{a}/agent/sessions"))
        .bearer_auth(EU)
        .header("Accept", "text/event-stream")
        .json(&json!({"message": "Fetch the sales", "agent": "careful"}))
        .send()
        .await
        .expect("the run");
    let mut stream = Sse::new(started);
    let session = stream.next().await.expect("session").data["session"]
        .as_str()
        .expect("id")
        .to_owned();
    let answer = |call: &str, token: &'static str, body: Value| {
        c.http()
            .post(format!("{b}/agent/sessions/{session}/approvals/{call}"))
            .bearer_auth(token)
            .json(&body)
            .send()
    };
    for call in ["call_1", "call_2"] {
        loop {
            let e = stream.next().await.expect("approval_needed");
            if e.name == "approval_needed" {
                assert_eq!(e.data["call_id"], call);
                break;
            }
        }
        if call == "call_2" {
            // Another principal, on B: the same 404 as an unknown call.
            let theirs = answer(call, US, json!({"approve": true}))
                .await
                .expect("answer");
            assert_eq!(theirs.status(), 404);
        }
        // At once (call_1), through B.
        let body = match call {
            "call_1" => json!({"approve": true}),
            _ => json!({"approve": false, "reason": "one is enough"}),
        };
        let answered = answer(call, EU, body).await.expect("answer");
        let status = answered.status();
        assert_eq!(
            status,
            200,
            "{call}: {}",
            answered.text().await.unwrap_or_default()
        );
    }
    busy.await.expect("the index let go");
    let rest = stream.all().await;
    let outcome = |call: &str| {
        rest.iter()
            .find(|e| e.name == "tool_call_finished" && e.data["call_id"] == call)
            .unwrap_or_else(|| panic!("{call} finished: {rest:?}"))
            .data["outcome"]
            .clone()
    };
    assert_eq!(outcome("call_1"), "ok", "{rest:?}\n{}", c.logs());
    assert_eq!(outcome("call_2"), "denied", "{rest:?}");
    assert_eq!(
        rest.last().expect("done").data["answer"],
        "Approved on B, fetched on A."
    );
}

/// A query on a replica that has never read the table fetches only the parts of the file
/// its columns lie in, and answers as the replica that wrote it; another principal's query
/// of the same ref is answered as unknown and fetches nothing. Damage where the query
/// reads is named to the model as damage to that table (never a server fault); damage
/// elsewhere is never read.
#[tokio::test(flavor = "multi_thread")]
async fn a_query_on_another_replica_fetches_only_the_columns_it_reads() {
    let c = Cluster::start(
        2,
        Extra {
            // 200k rows of three columns, `s` 110 characters or so (25 MB of Arrow).
            tables: r#"
[queries.wide]
source = "sample"
description = "Generated rows, three columns."
sql = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200000) SELECT i, i * 2 AS j, 'row-' || i || '-' || hex(zeroblob(50)) AS s FROM n"
"#
            .into(),
            ..Extra::default()
        },
    );
    let (a, b) = (c.direct(0), c.direct(1));
    let fetched = c.ok(&a, EU, "fetch_wide", json!({})).await;
    let r = fetched["dataRef"].as_str().expect("a dataRef").to_owned();
    let sum = |column: &str| {
        json!({"sql": format!("SELECT sum({column}) AS s FROM t"), "inputs": {"t": r},
               "store_as": "value"})
    };
    let home_b = c.dir.path().join("replica-1");
    let parts_on_b = || -> Vec<PathBuf> {
        files_under(&home_b)
            .into_iter()
            .filter(|p| p.to_string_lossy().ends_with(".part"))
            .collect()
    };
    // Another principal's query of the ref on B: the unknown answer, and not a byte of it
    // fetched (the owner check comes before any part).
    let theirs = c.call(&b, US, "run_sql", sum("j")).await;
    assert_eq!(theirs["isError"], json!(true), "{theirs}");
    assert!(text(&theirs).contains("unknown or expired"), "{theirs}");
    assert!(parts_on_b().is_empty(), "{:?}", parts_on_b());
    let on_b = c.ok(&b, EU, "run_sql", sum("j")).await;
    assert_eq!(
        on_b["values"][0][0].as_u64(),
        Some(40_000_200_000),
        "{on_b}"
    );
    let on_a = c.ok(&a, EU, "run_sql", sum("j")).await;
    assert_eq!(on_a["values"], on_b["values"]);
    let parts = parts_on_b();
    assert_eq!(parts.len(), 1, "one file of parts: {parts:?}");
    let object = object_store::aws::AmazonS3Builder::new()
        .with_bucket_name(c.s3.bucket())
        .with_region(c.s3.region())
        .with_endpoint(c.s3.endpoint())
        .with_allow_http(true)
        .with_access_key_id(c.s3.access_key())
        .with_secret_access_key(c.s3.secret_key())
        .build()
        .expect("an S3 client");
    let key = object_store::path::Path::from(format!("replicas-test/artifacts/{r}.arrow"));
    let good = {
        use object_store::ObjectStoreExt;
        object
            .get(&key)
            .await
            .expect("the object")
            .bytes()
            .await
            .expect("its bytes")
    };
    let fetched_bytes = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&parts[0]).expect("the file").blocks() * 512
    };
    assert!(
        fetched_bytes < good.len() as u64 / 2,
        "{fetched_bytes} of {} bytes fetched for a column of three",
        good.len()
    );

    // One bit of one `s` value flipped, far from any other column's bytes: `j` still reads
    // right on a replica without the table; `s` is refused as damage, naming the table.
    let at = good
        .windows(11)
        .position(|w| w == b"row-100000-")
        .expect("a value of `s`");
    let text_only = |b: &u8| b.is_ascii_alphanumeric() || *b == b'-';
    assert!(
        good[at - 70_000..at + 70_000].iter().all(text_only),
        "the damage lies in a piece of `s` alone"
    );
    let mut bad = good.to_vec();
    bad[at + 2] ^= 0x01;
    {
        use object_store::ObjectStoreExt;
        object
            .put(&key, bad.into())
            .await
            .expect("damage the object");
    }
    // A new process on B: what it fetched before is not kept.
    let restarted = {
        let mut c = c;
        c.kill9(1);
        c.restart(1);
        c
    };
    let b = restarted.direct(1);
    let again = restarted.ok(&b, EU, "run_sql", sum("j")).await;
    assert_eq!(again["values"], on_a["values"]);
    let refused = restarted
        .call(
            &b,
            EU,
            "run_sql",
            json!({"sql": "SELECT max(s) AS m FROM t", "inputs": {"t": r}, "store_as": "value"}),
        )
        .await;
    assert_eq!(refused["isError"], json!(true), "{refused}");
    let said = text(&refused);
    assert!(said.contains("damaged") && said.contains(&r), "{said}");
    assert!(
        !said.contains("internal") && !said.contains("server"),
        "{said}"
    );
}

/// Every file under `dir`.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}
