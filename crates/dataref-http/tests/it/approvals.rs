//! An `ask` call's approval answered through another replica the moment the run's stream
//! shows `approval_needed`. Two servers share one approval store, as replicas share their
//! index, and that store takes a while to register a call (a round trip to the index, a
//! wait for a pooled connection): the answer must find the call pending all the same, and
//! the run go on with it.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers fail the test on setup errors"
)]
#![expect(clippy::expect_used, reason = "a test fails by panicking")]

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use dataref_agent::approvals::{ApprovalError, ApprovalStore, ApprovalWait, PendingCall};
use dataref_agent::llm::{ChatModel, ChatRequest, ChatResponse, LlmError, TextSink};
use dataref_agent::{AgentHost, AssistantToolCall, Decision, Message};
use dataref_config::{Approval, HttpConfig, PrincipalConfig};
use dataref_http::{HttpOptions, HttpServer, Replicated};
use dataref_mcp::DatarefServer;
use dataref_protocol::Principal;
use dataref_tool::SharedContext;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::support::Env;

const EU: &str = "eu-token-0123456789abcdef0123456789abcdef";

/// How long the shared store takes to register a call: far longer than an answer takes
/// to come back through the other replica once the client sees the event.
const REGISTER: Duration = Duration::from_millis(500);

type Key = (Principal, String, String);

/// The store both replicas reach: registering a call takes [`REGISTER`], answering one is
/// immediate (the answering replica's round trip happened to be quicker).
#[derive(Default)]
struct SlowToRegister {
    pending: Arc<Mutex<HashMap<Key, oneshot::Sender<Decision>>>>,
}

fn key(call: &PendingCall) -> Key {
    (
        call.principal.clone(),
        call.session.clone(),
        call.call_id.clone(),
    )
}

#[async_trait]
impl ApprovalStore for SlowToRegister {
    async fn ask(
        &self,
        call: &PendingCall,
        _timeout: Duration,
    ) -> Result<Box<dyn ApprovalWait>, ApprovalError> {
        tokio::time::sleep(REGISTER).await;
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap().insert(key(call), tx);
        Ok(Box::new(Wait {
            pending: self.pending.clone(),
            key: key(call),
            rx,
        }))
    }

    async fn answer(&self, call: &PendingCall, decision: Decision) -> Result<bool, ApprovalError> {
        Ok(match self.pending.lock().unwrap().remove(&key(call)) {
            Some(tx) => tx.send(decision).is_ok(),
            None => false,
        })
    }
}

struct Wait {
    pending: Arc<Mutex<HashMap<Key, oneshot::Sender<Decision>>>>,
    key: Key,
    rx: oneshot::Receiver<Decision>,
}

#[async_trait]
impl ApprovalWait for Wait {
    async fn decided(&mut self) -> Option<Decision> {
        (&mut self.rx).await.ok()
    }

    async fn end(self: Box<Self>) {}
}

impl Drop for Wait {
    fn drop(&mut self) {
        self.pending.lock().unwrap().remove(&self.key);
    }
}

/// A model that gives its replies in order (no model can run here).
struct Scripted(Mutex<VecDeque<Message>>);

#[async_trait]
impl ChatModel for Scripted {
    fn endpoint(&self) -> &str {
        "scripted"
    }

    async fn complete(
        &self,
        _request: &ChatRequest,
        sink: &dyn TextSink,
        _cancel: &CancellationToken,
    ) -> Result<ChatResponse, LlmError> {
        let message = self.0.lock().unwrap().pop_front().unwrap();
        sink.text(&message.content);
        Ok(ChatResponse {
            message,
            usage: None,
            finish_reason: None,
        })
    }
}

fn principals() -> BTreeMap<Principal, PrincipalConfig> {
    let p = Principal::new("eu_analyst").unwrap();
    let mut digest = [0u8; 32];
    digest.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, EU.as_bytes()).as_ref());
    let c = PrincipalConfig {
        name: p.clone(),
        token_sha256: vec![digest],
        pg_role: None,
        pg_password: None,
        mysql_user: None,
        mysql_password: None,
        adbc: Default::default(),
    };
    [(p, c)].into_iter().collect()
}

struct Replica {
    base: String,
    stop: CancellationToken,
}

/// A replica on `env` whose runs ask before `fetch_sales`, with its approvals in `store`
/// and `model` answering for its agent.
async fn replica(env: &Env, store: Arc<dyn ApprovalStore>, model: Arc<Scripted>) -> Replica {
    dataref_config::tls::install_provider();
    let context = SharedContext {
        home: env.home.path().to_path_buf(),
        store: env.store.clone(),
        limits: env.config.limits.clone(),
        clock: Arc::new(dataref_store::SystemClock),
        mirrors: None,
    };
    let mut config = env.config.clone();
    let profile = config.agents.get_mut("default").unwrap();
    profile.model.url = None;
    profile.approvals = vec![("fetch_sales".into(), Approval::Ask)];
    let host = AgentHost::build(&config, &env.registry).unwrap();
    host.set_fallback(model);
    let options = HttpOptions {
        http: HttpConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            ..HttpConfig::default()
        },
        principals: principals(),
        anonymous: Principal::new("local").unwrap(),
    };
    let replicated = Replicated::default();
    let server = DatarefServer::per_request(env.registry.clone(), context.clone());
    let http = HttpServer::bind_replicated(server, options, replicated)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .with_agents_approvals(Arc::new(host), context, store, Duration::from_secs(60));
    let base = format!("http://{}", http.local_addr().unwrap());
    let stop = CancellationToken::new();
    tokio::spawn(http.serve(stop.clone()));
    Replica { base, stop }
}

/// One SSE event: its name and data.
#[derive(Debug)]
struct Event {
    name: String,
    data: Value,
}

/// Reads an SSE response event by event.
struct Sse {
    response: reqwest::Response,
    buf: Vec<u8>,
}

impl Sse {
    async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(at) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let block: Vec<u8> = self.buf.drain(..at + 2).collect();
                let block = String::from_utf8_lossy(&block);
                let field = |name: &str| {
                    block
                        .lines()
                        .find_map(|l| l.strip_prefix(name))
                        .map(str::trim)
                        .map(str::to_owned)
                };
                if let (Some(name), Some(data)) = (field("event:"), field("data:")) {
                    return Some(Event {
                        name,
                        data: serde_json::from_str(&data).unwrap(),
                    });
                }
                continue;
            }
            let chunk = tokio::time::timeout(Duration::from_secs(60), self.response.chunk())
                .await
                .expect("an event within 60 s")
                .unwrap()?;
            self.buf.extend_from_slice(&chunk);
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_approval_answered_through_another_replica_the_moment_it_is_shown_is_taken() {
    let env = Env::new(100).unwrap();
    let store: Arc<dyn ApprovalStore> = Arc::new(SlowToRegister::default());
    let model = Arc::new(Scripted(Mutex::new(VecDeque::from([
        Message::assistant_calls(
            "",
            vec![AssistantToolCall {
                id: "call_1".into(),
                name: "fetch_sales".into(),
                arguments: r#"{"since": "2025-06-01"}"#.into(),
            }],
        ),
        Message::assistant("Approved on B, fetched on A."),
    ]))));
    let a = replica(&env, store.clone(), model.clone()).await;
    let b = replica(&env, store, model).await;
    let http = reqwest::Client::new();

    let started = http
        .post(format!("{}/agent/sessions", a.base))
        .bearer_auth(EU)
        .header("Accept", "text/event-stream")
        .body(json!({"message": "Fetch the sales"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(started.status(), 200);
    let mut stream = Sse {
        response: started,
        buf: Vec::new(),
    };
    let session = stream.next().await.unwrap().data["session"]
        .as_str()
        .unwrap()
        .to_owned();
    loop {
        let e = stream.next().await.expect("approval_needed");
        if e.name == "approval_needed" {
            assert_eq!(e.data["call_id"], "call_1");
            break;
        }
    }
    // At once, through the other replica.
    let answered = http
        .post(format!(
            "{}/agent/sessions/{session}/approvals/call_1",
            b.base
        ))
        .bearer_auth(EU)
        .body(json!({"approve": true}).to_string())
        .send()
        .await
        .unwrap();
    let status = answered.status();
    assert_eq!(status, 200, "{}", answered.text().await.unwrap());

    let mut rest = Vec::new();
    while let Some(e) = stream.next().await {
        rest.push(e);
    }
    let finished = rest
        .iter()
        .find(|e| e.name == "tool_call_finished")
        .unwrap_or_else(|| panic!("the call ran: {rest:?}"));
    assert_eq!(finished.data["outcome"], "ok", "{finished:?}");
    let done = rest.last().unwrap();
    assert_eq!(done.name, "done", "{rest:?}");
    assert_eq!(done.data["answer"], "Approved on B, fetched on A.");
    a.stop.cancel();
    b.stop.cancel();
}
