//! The agent over HTTP through the real binary: `dataref serve --http` with its model at a
//! scripted OpenAI-compatible server (`DATAREF_LLM_URL`): the SSE stream of a message, the
//! sessions routes, principal isolation, approvals answered over HTTP, the client going
//! away, and the `/v1/chat/completions` facade, streamed and not.

use std::path::Path;
use std::time::{Duration, Instant};

use dataref_test_support::ServeHttp;
use dataref_test_support::model_server::{Call, Reply, ScriptedModel};
use serde_json::{Value, json};

use super::BIN;

const EU: &str = "agent-http-eu-token-0123456789abcdef0123456789";
const US: &str = "agent-http-us-token-0123456789abcdef0123456789";
const ROWS: &str = "2000";

/// A running `dataref serve --http 127.0.0.1:0`.
struct Server(ServeHttp);

impl Server {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.0.base())
    }

    fn log(&self) -> String {
        self.0.log()
    }
}

/// `dataref serve --http` on `home` with `config`, its model at `model`.
fn serve(home: &Path, config: &Path, model: &ScriptedModel) -> Server {
    let mut cmd = ServeHttp::command(BIN, home, config);
    cmd.env_remove("DATAREF_LLM_API_KEY")
        .env("DATAREF_PRINCIPAL", "alice")
        .env("DATAREF_LLM_URL", model.url())
        .env("DATAREF_LLM_MODEL", "test-model")
        .env("DATAREF_LOG", "info");
    Server(ServeHttp::start(&mut cmd, Duration::from_secs(120)).expect("dataref serve --http"))
}

fn client() -> reqwest::Client {
    dataref_config::tls::install_provider();
    reqwest::Client::builder().build().expect("client")
}

fn digest(token: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, token.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `serve --http` on the built-in sample's data (its source and `fetch_sales`, as a config
/// file: `--http` needs one for `[http]`): with `auth`, two principals with tokens, else
/// auth off (loopback, every caller `alice`). The agent `default` and the agent `careful`,
/// which asks before `fetch_sales`.
fn configured(home: &Path, model: &ScriptedModel, auth: bool) -> Server {
    let db = super::make_sample(home, ROWS);
    let http = if auth {
        "rate_per_minute = 100000"
    } else {
        "auth = false"
    };
    let config = home.join("dataref.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[python]
enabled = false

[http]
{http}

[sources.sample]
kind = "sqlite"
path = "{db}"

[queries.sales]
source = "sample"
description = "Load sales on or after a date."
sql = "SELECT date, line, region, channel, units, revenue, discount FROM sales WHERE date >= :since ORDER BY date, id"
params.since = {{ type = "date", required = true }}

[agents.default]
tools = ["fetch_*", "describe_data"]

[agents.careful]
tools = ["fetch_*"]

[agents.careful.approval]
fetch_sales = "ask"

{principals}"#,
            db = db.display(),
            principals = if auth {
                format!(
                    "[principals.eu_analyst]\ntoken_sha256 = [\"{}\"]\n\n[principals.us_analyst]\ntoken_sha256 = [\"{}\"]\n",
                    digest(EU),
                    digest(US)
                )
            } else {
                String::new()
            },
        ),
    )
    .expect("write config");
    serve(home, &config, model)
}

#[derive(Debug, Clone)]
pub(crate) struct Event {
    pub(crate) name: String,
    pub(crate) data: Value,
}

/// One SSE event block (`event:`, `data:` lines; comments skipped).
fn parse_block(block: &str) -> Option<Event> {
    let mut name = String::from("message");
    let mut data = String::new();
    for line in block.lines() {
        if let Some(n) = line.strip_prefix("event:") {
            name = n.trim().to_owned();
        } else if let Some(d) = line.strip_prefix("data:") {
            data.push_str(d.trim_start());
        }
    }
    if data.is_empty() {
        return None;
    }
    let data = serde_json::from_str(&data).unwrap_or(Value::String(data));
    Some(Event { name, data })
}

/// An SSE response read event by event.
pub(crate) struct Sse {
    response: reqwest::Response,
    buf: Vec<u8>,
}

impl Sse {
    pub(crate) fn new(response: reqwest::Response) -> Self {
        assert_eq!(response.status(), 200);
        assert_eq!(
            response.headers()["content-type"],
            "text/event-stream",
            "an SSE response"
        );
        Self {
            response,
            buf: Vec::new(),
        }
    }

    pub(crate) async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(at) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let block: Vec<u8> = self.buf.drain(..at + 2).collect();
                match parse_block(&String::from_utf8_lossy(&block)) {
                    Some(e) => return Some(e),
                    None => continue,
                }
            }
            match tokio::time::timeout(Duration::from_secs(60), self.response.chunk()).await {
                Ok(Ok(Some(chunk))) => self.buf.extend_from_slice(&chunk),
                Ok(Ok(None)) => return None,
                Ok(Err(e)) => panic!("reading the stream: {e}"),
                Err(_) => panic!("no event within 60 s"),
            }
        }
    }

    pub(crate) async fn all(mut self) -> Vec<Event> {
        let mut out = Vec::new();
        while let Some(e) = self.next().await {
            out.push(e);
        }
        out
    }
}

fn names(events: &[Event]) -> Vec<&str> {
    events.iter().map(|e| e.name.as_str()).collect()
}

async fn post(
    c: &reqwest::Client,
    url: &str,
    token: Option<&str>,
    body: Value,
) -> reqwest::Response {
    let mut r = c
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    r.send().await.expect("send")
}

async fn get(c: &reqwest::Client, url: &str, token: Option<&str>) -> (u16, Value) {
    let mut r = c.get(url);
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    let r = r.send().await.expect("send");
    let status = r.status().as_u16();
    let text = r.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn delete(c: &reqwest::Client, url: &str, token: Option<&str>) -> u16 {
    let mut r = c.delete(url);
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    r.send().await.expect("send").status().as_u16()
}

async fn json_of(r: reqwest::Response) -> (u16, Value) {
    let status = r.status().as_u16();
    let text = r.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// The names in order, `usage` events left out and a run of `text_delta`s as one.
fn without_usage<'a>(names: &[&'a str]) -> Vec<&'a str> {
    let mut out: Vec<&str> = Vec::new();
    for n in names.iter().copied().filter(|n| *n != "usage") {
        if n == "text_delta" && out.last() == Some(&"text_delta") {
            continue;
        }
        out.push(n);
    }
    out
}

/// A message that fetches the sample's sales and answers: the stream in order, then the
/// history, the list and the delete; the routes' refusals; `/agent/agents`.
#[tokio::test(flavor = "multi_thread")]
async fn agent_http_message_streams_and_sessions_are_listed_read_and_deleted() {
    let model = ScriptedModel::start(vec![
        Reply::tool_calls(vec![Call::new(
            "call_1",
            "fetch_sales",
            r#"{"since": "2025-01-01"}"#,
        )])
        .usage(120, 12),
        Reply::text("Revenue grew in Q4.").usage(300, 8),
    ])
    .expect("model server");
    let home = tempfile::tempdir().expect("tempdir");
    let server = configured(home.path(), &model, false);
    let c = client();

    let r = post(
        &c,
        &server.url("/agent/sessions"),
        None,
        json!({"message": "How did revenue do?"}),
    )
    .await;
    let events = Sse::new(r).all().await;
    let order = names(&events);
    assert_eq!(
        without_usage(&order),
        [
            "session",
            "tool_call_started",
            "tool_call_finished",
            "text_delta",
            "final",
            "done"
        ],
        "{events:?}\n{}",
        server.log()
    );
    let session = events[0].data["session"]
        .as_str()
        .expect("session id")
        .to_owned();
    assert_eq!(events[0].data["agent"], "default");
    let started = &events
        .iter()
        .find(|e| e.name == "tool_call_started")
        .expect("started")
        .data;
    assert_eq!(started["type"], "tool_call_started");
    assert_eq!(started["tool"], "fetch_sales");
    assert_eq!(started["call_id"], "call_1");
    // What a page shows of the step: the arguments, and the table to open.
    assert!(started["arguments"].is_object(), "{started}");
    let finished = events
        .iter()
        .find(|e| e.name == "tool_call_finished")
        .expect("finished");
    assert_eq!(finished.data["outcome"], "ok", "{finished:?}");
    assert!(
        finished.data["data_ref"]
            .as_str()
            .is_some_and(|r| r.starts_with("data_")),
        "{finished:?}"
    );
    assert!(
        finished.data["summary"]
            .as_str()
            .unwrap_or("")
            .contains("data_"),
        "{finished:?}"
    );
    let text: String = events
        .iter()
        .filter(|e| e.name == "text_delta")
        .map(|e| e.data["text"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(text, "Revenue grew in Q4.");
    let done = &events.last().expect("done").data;
    assert_eq!(done["session"], session.as_str());
    assert_eq!(done["answer"], "Revenue grew in Q4.");
    assert_eq!(done["stopped"], Value::Null);
    assert_eq!(
        done["usage"],
        json!({"prompt_tokens": 420, "completion_tokens": 20})
    );
    // The model got the tool's observation: the dataRef, never the rows.
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0]["model"], "test-model");
    let tool_message = requests[1]["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .find(|m| m["role"] == "tool")
        .expect("a tool message")
        .clone();
    assert!(
        tool_message["content"]
            .as_str()
            .unwrap_or("")
            .contains("data_"),
        "{tool_message}"
    );

    // The history: the person's message, the call, its observation, the answer.
    let (status, body) = get(&c, &server.url(&format!("/agent/sessions/{session}")), None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["session"]["id"], session.as_str());
    assert_eq!(body["session"]["runs"], 1);
    let roles: Vec<&str> = body["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| m["role"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(roles, ["user", "assistant", "tool", "assistant"], "{body}");
    assert_eq!(body["messages"][0]["content"], "How did revenue do?");
    assert_eq!(body["messages"][3]["content"], "Revenue grew in Q4.");

    // A second message continues it, with the history sent to the model.
    model.push(Reply::text("Mostly EMEA."));
    let r = post(
        &c,
        &server.url(&format!("/agent/sessions/{session}/messages")),
        None,
        json!({"message": "Where?"}),
    )
    .await;
    let events = Sse::new(r).all().await;
    assert_eq!(events.last().expect("done").data["answer"], "Mostly EMEA.");
    let sent = &model.requests()[2]["messages"];
    assert!(
        sent.to_string().contains("How did revenue do?"),
        "the history went to the model: {sent}"
    );

    let (status, body) = get(&c, &server.url("/agent/sessions"), None).await;
    assert_eq!(status, 200, "{body}");
    let listed = body["sessions"].as_array().expect("sessions");
    assert_eq!(listed.len(), 1, "{body}");
    assert_eq!(listed[0]["id"], session.as_str());
    assert_eq!(listed[0]["runs"], 2);
    assert_eq!(listed[0]["title"], "How did revenue do?");

    let (status, body) = get(&c, &server.url("/agent/agents"), None).await;
    assert_eq!(status, 200, "{body}");
    let default = body["agents"]
        .as_array()
        .expect("agents")
        .iter()
        .find(|a| a["name"] == "default")
        .expect("the default agent")
        .clone();
    assert_eq!(default["model"], "test-model");
    assert_eq!(default["model_configured"], true);
    assert!(
        default["tools"]
            .as_array()
            .expect("tools")
            .contains(&json!("fetch_sales")),
        "{default}"
    );

    // Refusals before any run: JSON with a hint.
    let r = post(
        &c,
        &server.url("/agent/sessions"),
        None,
        json!({"message": "hi", "agent": "nobody"}),
    )
    .await;
    let (status, body) = json_of(r).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"], "unknown_agent");
    assert!(body["hint"].is_string(), "{body}");
    let r = post(
        &c,
        &server.url("/agent/sessions/bad%20id!/messages"),
        None,
        json!({"message": "hi"}),
    )
    .await;
    let (status, body) = json_of(r).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"], "bad_session_id");
    let r = post(
        &c,
        &server.url("/agent/sessions/s-unknown/messages"),
        None,
        json!({"message": "hi"}),
    )
    .await;
    let (status, body) = json_of(r).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"], "session_not_found");
    let r = post(&c, &server.url("/agent/sessions"), None, json!({"nope": 1})).await;
    let (status, body) = json_of(r).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["hint"].as_str().unwrap_or("").contains("message"),
        "{body}"
    );
    // A body over 1 MiB is refused from its `Content-Length`, before it is read.
    let addr = server.0.addr().to_owned();
    let mut s = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let head = format!(
        "POST /agent/sessions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{{\"message\": \"",
        2 * 1024 * 1024
    );
    tokio::io::AsyncWriteExt::write_all(&mut s, head.as_bytes())
        .await
        .expect("write");
    let mut answer = vec![0u8; 4096];
    let n = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::io::AsyncReadExt::read(&mut s, &mut answer),
    )
    .await
    .expect("an answer before the body")
    .expect("read");
    let answer = String::from_utf8_lossy(&answer[..n]).into_owned();
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("payload_too_large"), "{answer}");
    let r = c
        .put(server.url("/agent/sessions"))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 405);
    assert_eq!(r.headers()["allow"], "GET, POST");
    let r = post(
        &c,
        &server.url(&format!("/agent/sessions/{session}/approvals/call_9")),
        None,
        json!({"approve": true}),
    )
    .await;
    let (status, body) = json_of(r).await;
    assert_eq!(status, 404, "nothing pending: {body}");
    assert_eq!(body["error"], "no_pending_approval");

    assert_eq!(
        delete(&c, &server.url(&format!("/agent/sessions/{session}")), None).await,
        204
    );
    let (status, _) = get(&c, &server.url(&format!("/agent/sessions/{session}")), None).await;
    assert_eq!(status, 404);
    assert_eq!(
        delete(&c, &server.url(&format!("/agent/sessions/{session}")), None).await,
        404
    );
    let (_, body) = get(&c, &server.url("/agent/sessions"), None).await;
    assert_eq!(body["sessions"], json!([]));
}

/// A client that goes away cancels its run (the session records it and is free again); a
/// second message while one runs is 409.
#[tokio::test(flavor = "multi_thread")]
async fn agent_http_disconnect_cancels_the_run_and_a_busy_session_is_409() {
    let model =
        ScriptedModel::start(vec![Reply::text("first").usage(10, 1)]).expect("model server");
    let home = tempfile::tempdir().expect("tempdir");
    let server = configured(home.path(), &model, false);
    let c = client();
    let r = post(
        &c,
        &server.url("/agent/sessions"),
        None,
        json!({"message": "one"}),
    )
    .await;
    let events = Sse::new(r).all().await;
    let session = events[0].data["session"].as_str().expect("id").to_owned();

    // The model takes its time with the next answer.
    model.push(Reply::text("too late").delay(Duration::from_secs(30)));
    let url = server.url(&format!("/agent/sessions/{session}/messages"));
    let r = post(&c, &url, None, json!({"message": "two"})).await;
    let mut stream = Sse::new(r);
    let first = stream.next().await.expect("the session event");
    assert_eq!(first.name, "session");
    // Wait until the model has the request, so the run is in its turn.
    let deadline = Instant::now() + Duration::from_secs(20);
    while model.requests().len() < 2 {
        assert!(Instant::now() < deadline, "the run never asked the model");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = post(&c, &url, None, json!({"message": "three"})).await;
    let (status, body) = json_of(r).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"], "session_busy");
    assert!(body["hint"].is_string());

    drop(stream);
    // The run is counted as soon as its question is kept; its record ends with the stop
    // note once the cancelled run has finished: wait for that.
    let ended = |body: &Value| {
        body["messages"]
            .as_array()
            .and_then(|m| m.last())
            .and_then(|m| m["content"].as_str())
            .is_some_and(|c| c.contains("cancelled"))
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let body = loop {
        let (_, body) = get(&c, &server.url(&format!("/agent/sessions/{session}")), None).await;
        if body["session"]["runs"] == 2 && ended(&body) {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "the cancelled run was not recorded: {body}\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let last = body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .expect("messages")
        .clone();
    assert!(
        last["content"].as_str().unwrap_or("").contains("cancelled"),
        "{body}"
    );
    // Free again, once the cancelled run's task has ended (its record is written a moment
    // before: until then the session is still busy, and says so).
    model.push(Reply::text("four"));
    let deadline = Instant::now() + Duration::from_secs(10);
    let r = loop {
        let r = post(&c, &url, None, json!({"message": "four"})).await;
        if r.status() != 409 {
            break r;
        }
        assert!(Instant::now() < deadline, "the session stayed busy");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let events = Sse::new(r).all().await;
    assert_eq!(events.last().expect("done").data["answer"], "four");
}

/// Principal B can neither list, read, continue, approve nor delete A's session: each is
/// the 404 of an unknown one. Approvals answered yes and no over HTTP by A.
#[tokio::test(flavor = "multi_thread")]
async fn agent_http_principals_are_isolated_and_approvals_are_answered_over_http() {
    let model = ScriptedModel::start(Vec::new()).expect("model server");
    let home = tempfile::tempdir().expect("tempdir");
    let server = configured(home.path(), &model, true);
    let c = client();

    // Every route needs the token.
    for path in ["/agent/sessions", "/agent/agents", "/v1/models"] {
        let (status, _) = get(&c, &server.url(path), None).await;
        assert_eq!(status, 401, "{path}");
        let (status, _) = get(&c, &server.url(path), Some("not-a-token")).await;
        assert_eq!(status, 401, "{path}");
    }
    let r = post(&c, &server.url("/v1/chat/completions"), None, json!({})).await;
    assert_eq!(r.status(), 401);

    // A asks `careful`, which asks before fetch_sales.
    model.push(Reply::tool_calls(vec![Call::new(
        "call_1",
        "fetch_sales",
        r#"{"since": "2025-06-01"}"#,
    )]));
    model.push(Reply::text("Approved and fetched."));
    let r = post(
        &c,
        &server.url("/agent/sessions"),
        Some(EU),
        json!({"message": "Fetch the sales", "agent": "careful"}),
    )
    .await;
    let mut stream = Sse::new(r);
    let first = stream.next().await.expect("session");
    let session = first.data["session"].as_str().expect("id").to_owned();
    assert_eq!(first.data["agent"], "careful");
    let asked = loop {
        let e = stream.next().await.expect("approval_needed");
        if e.name == "approval_needed" {
            break e;
        }
    };
    assert_eq!(asked.data["call_id"], "call_1");
    assert_eq!(asked.data["tool"], "fetch_sales");
    assert_eq!(asked.data["arguments"], json!({"since": "2025-06-01"}));

    // B: A's session is unknown on every route, A's pending approval too.
    let (status, body) = get(&c, &server.url("/agent/sessions"), Some(US)).await;
    assert_eq!((status, &body["sessions"]), (200, &json!([])), "{body}");
    let own = server.url(&format!("/agent/sessions/{session}"));
    let (status, body) = get(&c, &own, Some(US)).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"], "session_not_found");
    let approval = server.url(&format!("/agent/sessions/{session}/approvals/call_1"));
    let r = post(&c, &approval, Some(US), json!({"approve": true})).await;
    let (status, body) = json_of(r).await;
    assert_eq!(status, 404, "B cannot approve A's call: {body}");
    let r = post(
        &c,
        &server.url(&format!("/agent/sessions/{session}/messages")),
        Some(US),
        json!({"message": "let me in"}),
    )
    .await;
    let (status, body) = json_of(r).await;
    assert_eq!(status, 404, "B cannot continue A's session: {body}");
    assert_eq!(delete(&c, &own, Some(US)).await, 404);

    // A approves: the call runs, the answer comes.
    let r = post(&c, &approval, Some(EU), json!({"approve": true})).await;
    let (status, body) = json_of(r).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["approved"], true);
    let rest = stream.all().await;
    let order = names(&rest);
    assert_eq!(
        without_usage(&order)[..2],
        ["tool_call_started", "tool_call_finished"],
        "{rest:?}"
    );
    let finished = rest
        .iter()
        .find(|e| e.name == "tool_call_finished")
        .expect("finished");
    assert_eq!(finished.data["outcome"], "ok", "{finished:?}");
    assert_eq!(
        rest.last().expect("done").data["answer"],
        "Approved and fetched."
    );

    // A denies the next one, with a reason the model reads.
    model.push(Reply::tool_calls(vec![Call::new(
        "call_2",
        "fetch_sales",
        r#"{"since": "2025-07-01"}"#,
    )]));
    model.push(Reply::text("Understood, not fetched."));
    let r = post(
        &c,
        &server.url(&format!("/agent/sessions/{session}/messages")),
        Some(EU),
        json!({"message": "And from July?"}),
    )
    .await;
    let mut stream = Sse::new(r);
    loop {
        let e = stream.next().await.expect("approval_needed");
        if e.name == "approval_needed" {
            assert_eq!(e.data["call_id"], "call_2");
            break;
        }
    }
    let r = post(
        &c,
        &server.url(&format!("/agent/sessions/{session}/approvals/call_2")),
        Some(EU),
        json!({"approve": false, "reason": "not this month"}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let rest = stream.all().await;
    let finished = rest
        .iter()
        .find(|e| e.name == "tool_call_finished")
        .expect("finished");
    assert_eq!(finished.data["outcome"], "denied", "{finished:?}");
    assert!(
        !rest.iter().any(|e| e.name == "tool_call_started"),
        "a denied call does not run: {rest:?}"
    );
    assert_eq!(
        rest.last().expect("done").data["answer"],
        "Understood, not fetched."
    );
    let requests = model.requests();
    let observation = requests.last().expect("a request")["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .rfind(|m| m["role"] == "tool")
        .expect("the refusal")
        .clone();
    let text = observation["content"].as_str().unwrap_or("");
    assert!(
        text.contains("did not approve") && text.contains("not this month"),
        "{text}"
    );

    // A's session is intact, B has none; A deletes it.
    let (status, body) = get(&c, &own, Some(EU)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["session"]["runs"], 2);
    let (_, body) = get(&c, &server.url("/agent/sessions"), Some(US)).await;
    assert_eq!(body["sessions"], json!([]));
    assert_eq!(delete(&c, &own, Some(EU)).await, 204);

    // The facade has no one to ask: `careful`'s fetch_sales is refused, saying why.
    model.push(Reply::tool_calls(vec![Call::new(
        "call_3",
        "fetch_sales",
        r#"{"since": "2025-08-01"}"#,
    )]));
    model.push(Reply::text("I may not fetch that here."));
    let r = post(
        &c,
        &server.url("/v1/chat/completions"),
        Some(EU),
        json!({"model": "careful", "messages": [{"role": "user", "content": "Fetch August"}]}),
    )
    .await;
    let (status, body) = json_of(r).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "I may not fetch that here."
    );
    let refusal = model.requests().last().expect("a request")["messages"].to_string();
    assert!(refusal.contains("no one can be asked"), "{refusal}");
}

/// `/v1/chat/completions` and `/v1/models` as an OpenAI client uses them.
#[tokio::test(flavor = "multi_thread")]
async fn agent_http_openai_facade_streamed_and_not() {
    let model = ScriptedModel::start(vec![Reply::text("Revenue is up.").usage(100, 7)])
        .expect("model server");
    let home = tempfile::tempdir().expect("tempdir");
    let server = configured(home.path(), &model, false);
    let c = client();
    let url = server.url("/v1/chat/completions");

    let (status, body) = get(&c, &server.url("/v1/models"), None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "list");
    let ids: Vec<&str> = body["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|m| m["id"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(ids, ["careful", "default"], "{body}");
    assert_eq!(body["data"][0]["object"], "model");

    let r = post(
        &c,
        &url,
        None,
        json!({
            "model": "default",
            "messages": [
                {"role": "system", "content": "You are a pirate."},
                {"role": "user", "content": "first question"},
                {"role": "assistant", "content": "first answer"},
                {"role": "user", "content": "What is revenue?"},
            ],
        }),
    )
    .await;
    assert!(r.headers().get("x-dataref-session").is_none());
    let (status, body) = json_of(r).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "default");
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    assert_eq!(body["choices"][0]["message"]["content"], "Revenue is up.");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": 100, "completion_tokens": 7, "total_tokens": 107})
    );
    // The profile's prompt, not the client's; the client's history before the message.
    let sent = model.requests()[0]["messages"].clone();
    let sent = sent.as_array().expect("messages");
    assert_eq!(sent[0]["role"], "system");
    assert!(
        !sent.iter().any(|m| m.to_string().contains("pirate")),
        "{sent:?}"
    );
    let rest: Vec<(String, String)> = sent[1..]
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap_or("").to_owned(),
                m["content"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    assert_eq!(
        rest,
        [
            ("user".to_owned(), "first question".to_owned()),
            ("assistant".to_owned(), "first answer".to_owned()),
            ("user".to_owned(), "What is revenue?".to_owned()),
        ]
    );
    // Not kept as a session.
    let (_, body) = get(&c, &server.url("/agent/sessions"), None).await;
    assert_eq!(body["sessions"], json!([]));

    // Streamed, with the usage chunk.
    let streamed = |message: &str| {
        post(
            &c,
            &url,
            None,
            json!({
                "model": "default",
                "stream": true,
                "stream_options": {"include_usage": true},
                "messages": [{"role": "user", "content": message}],
            }),
        )
    };
    model.push(Reply::text("Streamed: revenue is up.").usage(50, 5));
    let events = Sse::new(streamed("Stream it").await).all().await;
    assert!(events.iter().all(|e| e.name == "message"), "data-only SSE");
    assert_eq!(events.last().expect("done").data, "[DONE]");
    let chunks: Vec<&Value> = events[..events.len() - 1].iter().map(|e| &e.data).collect();
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk"),
        "{chunks:?}"
    );
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, "Streamed: revenue is up.");
    let finish: Vec<&Value> = chunks
        .iter()
        .map(|c| &c["choices"][0]["finish_reason"])
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finish, [&json!("stop")]);
    let usage = chunks.last().expect("usage chunk");
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(
        usage["usage"],
        json!({"prompt_tokens": 50, "completion_tokens": 5, "total_tokens": 55})
    );

    // A run the model fails, streamed: an `error` event a client raises, no `stop`.
    model.push(Reply::status(400).message("the model refused the request"));
    let events = Sse::new(streamed("Fail it").await).all().await;
    assert_eq!(events.last().expect("done").data, "[DONE]");
    let failed = &events[events.len() - 2].data;
    assert_eq!(failed["error"]["code"], "model_error", "{events:?}");
    assert!(
        failed["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("the model refused the request"),
        "{failed}"
    );
    assert!(
        events
            .iter()
            .all(|e| e.data["choices"][0]["finish_reason"].is_null()
                && e.data["choices"][0]["delta"]["content"]
                    .as_str()
                    .is_none_or(|c| !c.contains("refused"))),
        "no finish chunk and no error text as the answer: {events:?}"
    );

    // With `X-Dataref-Session`: kept, continued, the client's history ignored.
    for (answer, message) in [("kept one", "remember 7"), ("kept two", "what number?")] {
        model.push(Reply::text(answer));
        let r = c
            .post(&url)
            .header("X-Dataref-Session", "facade-1")
            .header("content-type", "application/json")
            .body(
                json!({
                    "model": "default",
                    "messages": [
                        {"role": "user", "content": "ignored history"},
                        {"role": "assistant", "content": "ignored"},
                        {"role": "user", "content": message},
                    ],
                })
                .to_string(),
            )
            .send()
            .await
            .expect("send");
        assert_eq!(r.headers()["x-dataref-session"], "facade-1");
        let (status, body) = json_of(r).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["choices"][0]["message"]["content"], answer);
    }
    let last = model.requests().last().expect("a request")["messages"].to_string();
    assert!(
        last.contains("remember 7") && !last.contains("ignored history"),
        "{last}"
    );
    let (status, body) = get(&c, &server.url("/agent/sessions/facade-1"), None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["session"]["runs"], 2);

    // Unknown model and bad requests: OpenAI's error shape.
    let r = post(
        &c,
        &url,
        None,
        json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    let (status, body) = json_of(r).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "model_not_found");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("`default`"),
        "{body}"
    );
    let r = post(
        &c,
        &url,
        None,
        json!({"model": "default", "messages": [{"role": "system", "content": "only this"}]}),
    )
    .await;
    let (status, body) = json_of(r).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"]["message"].is_string(), "{body}");
}
