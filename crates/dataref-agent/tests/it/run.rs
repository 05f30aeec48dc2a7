//! The loop on real parts: the built-in tools on the generated sample, the real store,
//! workspace and sandbox, and the model played by the scripted OpenAI-compatible server
//! over a real socket, through the real gateway.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use dataref_agent::{
    AgentEvent, AgentHost, ApprovalRequest, ApproveAll, Approver, Decision, EventSink, NoOneToAsk,
    SendRequest, Sent, Stopped,
};
use dataref_config::{Approval, Config};
use dataref_protocol::Principal;
use dataref_sandbox::pool::{PythonSandbox, SandboxSettings};
use dataref_sandbox::runtime::RuntimeSpec;
use dataref_store::{ArtifactStore, LocalStore, StoreLimits, SystemClock};
use dataref_test_support::model_server::{Call, Reply, ScriptedModel};
use dataref_tool::{RunContext, SharedContext};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// The runtime the sandbox crate's tests provision, shared (PyPI is hit once per target dir).
fn runtime_home() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dataref-runtime-home")
}

fn sandbox() -> Arc<PythonSandbox> {
    static SANDBOX: OnceLock<Arc<PythonSandbox>> = OnceLock::new();
    Arc::clone(SANDBOX.get_or_init(|| {
        let config = Config::builtin_sample(runtime_home(), 10);
        let settings = SandboxSettings {
            home: runtime_home(),
            runtime: RuntimeSpec::Managed { base: None },
            ..dataref_builtins::sandbox_settings(&config)
        };
        let sandbox = Arc::new(PythonSandbox::new(settings));
        sandbox.runtime(&|_| {}).unwrap();
        sandbox.prewarm();
        sandbox
    }))
}

pub(crate) struct Fixture {
    pub _home: tempfile::TempDir,
    pub config: Config,
    pub host: AgentHost,
    pub store: Arc<dyn ArtifactStore>,
    pub shared: SharedContext,
    pub model: ScriptedModel,
}

pub(crate) const ROWS: u64 = 3_000;

/// The sample with `script` as the model; `edit` changes the default profile first.
pub(crate) fn fixture(
    script: Vec<Reply>,
    python: bool,
    edit: impl FnOnce(&mut dataref_config::AgentConfig),
) -> Fixture {
    let home = tempfile::tempdir().unwrap();
    fixture_in(home, script, python, edit)
}

pub(crate) fn fixture_in(
    home: tempfile::TempDir,
    script: Vec<Reply>,
    python: bool,
    edit: impl FnOnce(&mut dataref_config::AgentConfig),
) -> Fixture {
    let model = ScriptedModel::start(script).unwrap();
    let mut config = Config::builtin_sample_with_env(home.path().to_owned(), ROWS, &|_| None);
    dataref_sources::ensure_sample(config.sample.as_ref().unwrap(), &|_| {}).unwrap();
    config.limits.tool_timeout = Duration::from_secs(120);
    let profile = config.agents.get_mut("default").unwrap();
    profile.model.url = Some(model.url());
    profile.model.model = Some("gpt-4o".into());
    profile.model.max_retries = 0;
    edit(profile);
    let store: Arc<dyn ArtifactStore> = Arc::new(
        LocalStore::open(
            home.path(),
            StoreLimits {
                ttl: config.store.ttl,
                max_artifact_bytes: config.store.max_artifact_bytes,
                owner_quota_bytes: config.store.owner_quota_bytes,
            },
            Arc::new(SystemClock),
        )
        .unwrap(),
    );
    let registry = dataref_builtins::builtin_registry_with(&config, python.then(sandbox)).unwrap();
    let host = AgentHost::build(&config, &registry).unwrap();
    let shared = SharedContext {
        home: config.home.clone(),
        store: store.clone(),
        limits: config.limits.clone(),
        clock: Arc::new(SystemClock),
        mirrors: None,
    };
    Fixture {
        _home: home,
        config,
        host,
        store,
        shared,
        model,
    }
}

impl Fixture {
    pub(crate) fn ctx(&self, principal: &str) -> RunContext {
        let p = Principal::new(principal).unwrap();
        let ws = Arc::new(self.shared.principal_workspace(&p).unwrap());
        self.shared.context(p, ws)
    }

    pub(crate) async fn send(
        &self,
        principal: &str,
        session: Option<&str>,
        message: &str,
        approver: &dyn Approver,
    ) -> (Sent, Vec<AgentEvent>) {
        let events = Events::default();
        let sent = self
            .host
            .send(SendRequest {
                ctx: self.ctx(principal),
                agent: None,
                session: session.map(str::to_owned),
                message: message.to_owned(),
                events: &events,
                approver,
                cancel: CancellationToken::new(),
            })
            .await
            .unwrap();
        (sent, events.take())
    }
}

#[derive(Default)]
pub(crate) struct Events(Mutex<Vec<AgentEvent>>);

impl Events {
    pub(crate) fn take(&self) -> Vec<AgentEvent> {
        std::mem::take(&mut self.0.lock().unwrap())
    }
}

impl EventSink for Events {
    fn event(&self, event: AgentEvent) {
        self.0.lock().unwrap().push(event);
    }
}

/// Writes `bytes` to `path` in the context's workspace (an argument file, say).
fn put(ctx: &RunContext, path: &str, bytes: &[u8]) {
    ctx.workspace
        .write_atomic(path, bytes, dataref_workspace::Overwrite::Replace)
        .unwrap();
}

/// The content of the request's last tool message, as JSON.
pub(crate) fn last_tool(request: &Value) -> Value {
    let msgs = request["messages"].as_array().unwrap();
    let m = msgs.iter().rev().find(|m| m["role"] == "tool").unwrap();
    serde_json::from_str(m["content"].as_str().unwrap()).unwrap_or(Value::Null)
}

fn tool_messages(request: &Value) -> Vec<String> {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or("").to_owned())
        .collect()
}

/// The seed's analysis as a model would play it, deciding from the observations.
fn canonical_script() -> Vec<Reply> {
    vec![
        Reply::text_and_calls(
            "Fetching the sales into an artifact.",
            vec![Call::new("c1", "fetch_sales", r#"{"since":"2025-01-01"}"#)],
        ),
        Reply::dynamic(|req| {
            let r = last_tool(req)["dataRef"].as_str().unwrap().to_owned();
            let args = json!({"code": dataref_agent::scripted::QOQ_CODE, "inputs": {"sales": r}});
            Reply::tool_calls(vec![Call::new("c2", "run_python", args.to_string())])
        }),
        Reply::dynamic(|req| {
            let v = last_tool(req);
            let losers = v["outputs"]["biggest_losers"]["dataRef"]
                .as_str()
                .unwrap()
                .to_owned();
            let delta = v["outputs"]["qoq_delta"]["dataRef"]
                .as_str()
                .unwrap()
                .to_owned();
            let chart = json!({"dataRef": losers, "x": "line", "y": ["delta"], "kind": "bar"});
            let export = json!({"source": delta, "format": "csv", "filename": "qoq"});
            Reply::tool_calls(vec![
                Call::new("c3", "render_chart", chart.to_string()),
                Call::new("c4", "export_data", export.to_string()),
            ])
        }),
        Reply::dynamic(|req| {
            let results = tool_messages(req);
            let py: Value = results
                .iter()
                .filter_map(|t| serde_json::from_str::<Value>(t).ok())
                .find(|v| v.get("result").is_some())
                .unwrap();
            let top = py["result"]["lost_most"][0]["line"]
                .as_str()
                .unwrap()
                .to_owned();
            Reply::text(format!("The biggest loser is {top}.")).chunk_split(3)
        }),
    ]
}

/// Numbers as they appear in the requests' JSON text.
fn numbers_in(text: &str) -> std::collections::HashSet<String> {
    text.split(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-'))
        .filter(|s| s.len() >= 4 && s.contains('.'))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_canonical_analysis_runs_through_the_loop_and_no_row_reaches_the_model() {
    let f = fixture(canonical_script(), true, |_| {});
    let (sent, events) = f
        .send("ana", None, dataref_agent::scripted::QUESTION, &NoOneToAsk)
        .await;
    assert_eq!(sent.run.stopped, None, "{}", sent.run.answer);
    assert!(
        sent.run.answer.starts_with("The biggest loser is "),
        "{}",
        sent.run.answer
    );
    assert_eq!(sent.run.tool_calls, 4);
    let requests = f.model.requests();
    assert_eq!(requests.len(), 4);
    // Every observation was a success.
    let finished: Vec<(&str, &str)> = events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::ToolCallFinished { tool, outcome, .. } => {
                Some((tool.as_str(), outcome.as_str()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        finished,
        [
            ("fetch_sales", "ok"),
            ("run_python", "ok"),
            ("render_chart", "ok"),
            ("export_data", "ok")
        ]
    );
    // Text streamed, then the final answer.
    let streamed: String = events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::TextDelta { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert!(streamed.ends_with(&sent.run.answer), "{streamed}");
    assert!(matches!(
        events.last(),
        Some(AgentEvent::Final { stopped: None, .. })
    ));

    // No row beyond the samples reached the model: of the fetched table's revenue values,
    // only the sample's can appear in what the model was sent.
    let first = &requests[1];
    let data_ref = last_tool(first)["dataRef"].as_str().unwrap().to_owned();
    let data_ref = dataref_protocol::DataRef::parse(&data_ref).unwrap();
    let owner = Principal::new("ana").unwrap();
    let table = f.store.open_table(&owner, &data_ref).unwrap();
    let mut revenues = std::collections::HashSet::new();
    for batch in &table.batches {
        let col = batch.column_by_name("revenue").unwrap();
        let col = col
            .as_any()
            .downcast_ref::<arrow_array::Float64Array>()
            .unwrap();
        for v in col.iter().flatten() {
            revenues.insert(serde_json::to_string(&v).unwrap());
        }
    }
    assert!(revenues.len() > 1_000, "{}", revenues.len());
    let sent_text: String = requests.iter().map(|r| r.to_string()).collect();
    let seen = numbers_in(&sent_text);
    let leaked: Vec<&String> = revenues.iter().filter(|v| seen.contains(*v)).collect();
    let sample_rows = f.config.sources["sample"].sample_rows;
    assert!(
        leaked.len() <= sample_rows,
        "{} revenue values of {} reached the model (samples: {sample_rows}): {leaked:?}",
        leaked.len(),
        revenues.len()
    );
    // The whole run is far smaller than the rows.
    let bytes: usize = requests.iter().map(|r| r.to_string().len()).sum();
    assert!(bytes < 120_000, "{bytes}");
}

/// Every built-in tool, called through the loop: the model reads something from each,
/// and for the tools whose content is only a link (a chart, an export) it reads the path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_reads_a_result_from_every_builtin_tool() {
    let script = vec![
        Reply::tool_calls(vec![Call::new(
            "f",
            "fetch_sales",
            r#"{"since":"2025-01-01"}"#,
        )]),
        Reply::dynamic(|req| {
            let r = last_tool(req)["dataRef"].as_str().unwrap().to_owned();
            let sql = json!({
                "sql": "SELECT region, sum(units) AS units, sum(revenue) AS revenue FROM s GROUP BY region",
                "inputs": {"s": r},
            });
            let py = json!({
                "code": "import json\nopen('out/files/args.json', 'w').write(json.dumps({'limit': 1}))\nresult = len(s)",
                "inputs": {"s": r},
            });
            Reply::tool_calls(vec![
                Call::new("d", "describe_data", json!({"dataRef": r}).to_string()),
                Call::new("q", "run_sql", sql.to_string()),
                Call::new("p", "run_python", py.to_string()),
                Call::new("l", "list_artifacts", "{}"),
                Call::new(
                    "t",
                    "render_table",
                    json!({"dataRef": r, "limit": 5}).to_string(),
                ),
                Call::new(
                    "e",
                    "export_data",
                    json!({"source": r, "format": "csv", "filename": "all"}).to_string(),
                ),
            ])
        }),
        Reply::dynamic(|req| {
            let by_region = tool_messages(req)
                .iter()
                .filter_map(|t| serde_json::from_str::<Value>(t).ok())
                .find(|v| v["columns"].get("units").is_some() && v["rows"] == 5)
                .and_then(|v| v["dataRef"].as_str().map(str::to_owned))
                .unwrap();
            let chart = json!({"dataRef": by_region, "x": "region", "y": "revenue", "kind": "bar"});
            Reply::tool_calls(vec![
                Call::new("c", "render_chart", chart.to_string()),
                Call::new(
                    "r",
                    "read_file",
                    r#"{"path": "exports/all.csv", "limit": 2}"#,
                ),
                Call::new(
                    "cp",
                    "copy_file",
                    r#"{"src": "exports/all.csv", "dst": "kept/all.csv"}"#,
                ),
                Call::new("ls", "list_files", "{}"),
                Call::new(
                    "ct",
                    "call_tool",
                    r#"{"tool": "list_artifacts", "args_file": "args.json"}"#,
                ),
            ])
        }),
        Reply::text("done"),
    ];
    let f = fixture(script, true, |_| {});
    let (sent, events) = f.send("ana", None, "everything", &NoOneToAsk).await;
    assert_eq!(sent.run.stopped, None, "{}", sent.run.answer);
    let outcomes: Vec<(String, String)> = events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::ToolCallFinished { tool, outcome, .. } => {
                Some((tool.clone(), outcome.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(outcomes.len(), 12, "{outcomes:?}");
    let last = f.model.requests().last().unwrap().clone();
    let msgs = last["messages"].as_array().unwrap();
    let calls: std::collections::HashMap<String, String> = msgs
        .iter()
        .filter_map(|m| m["tool_calls"].as_array())
        .flatten()
        .map(|c| {
            (
                c["id"].as_str().unwrap().to_owned(),
                c["function"]["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let mut seen = std::collections::BTreeSet::new();
    for m in msgs.iter().filter(|m| m["role"] == "tool") {
        let tool = &calls[m["tool_call_id"].as_str().unwrap()];
        let text = m["content"].as_str().unwrap_or("");
        assert!(
            !text.trim().is_empty(),
            "`{tool}` reached the model as an empty message"
        );
        assert!(!text.starts_with("error"), "`{tool}`: {text}");
        seen.insert(tool.clone());
    }
    assert_eq!(seen.len(), 12, "{seen:?}");
    let text_of = |id: &str| {
        msgs.iter()
            .find(|m| m["tool_call_id"] == id)
            .and_then(|m| m["content"].as_str())
            .unwrap()
            .to_owned()
    };
    let export = text_of("e");
    assert!(
        export.contains("exports/all.csv") && export.contains("\"rows\""),
        "{export}"
    );
    let chart = text_of("c");
    assert!(
        chart.contains("charts/") && chart.contains(".png"),
        "{chart}"
    );
}

#[tokio::test]
async fn failures_are_observations_and_the_run_goes_on() {
    let f = fixture(
        vec![
            Reply::tool_calls(vec![
                Call::new("a", "fetch_salez", "{}"),
                Call::new("b", "fetch_sales", "{\"since\": "),
                Call::new("c", "fetch_sales", r#"{"since": 2025}"#),
                Call::new(
                    "d",
                    "describe_data",
                    r#"{"dataRef": "data_AAAAAAAAAAAAAAAAAAAAAA"}"#,
                ),
            ])
            .duplicate_indexes(),
            Reply::text("I could not do it."),
        ],
        false,
        |_| {},
    );
    let (sent, _) = f.send("ana", None, "go", &NoOneToAsk).await;
    assert_eq!(sent.run.stopped, None);
    let req = &f.model.requests()[1];
    let obs = tool_messages(req);
    assert_eq!(obs.len(), 4, "{obs:?}");
    assert!(
        obs[0].contains("unknown tool `fetch_salez`") && obs[0].contains("fetch_sales"),
        "{}",
        obs[0]
    );
    assert!(obs[1].contains("not valid JSON"), "{}", obs[1]);
    assert!(obs[2].contains("invalid arguments"), "{}", obs[2]);
    assert!(
        obs[3].contains("fetch the data again") || obs[3].contains("hint"),
        "{}",
        obs[3]
    );
    // Each result follows its call, in order, with the call's id.
    let msgs = req["messages"].as_array().unwrap();
    let ids: Vec<&str> = msgs
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["tool_call_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["a", "b", "c", "d"]);
}

#[tokio::test]
async fn a_repeated_call_is_warned_about_then_refused() {
    let call = || Reply::tool_calls(vec![Call::new("x", "list_artifacts", "{}")]);
    let f = fixture(
        vec![call(), call(), call(), Reply::text("done")],
        false,
        |_| {},
    );
    let (sent, _) = f.send("ana", None, "go", &NoOneToAsk).await;
    let obs = tool_messages(&f.model.requests()[3]);
    assert_eq!(obs.len(), 3);
    assert!(!obs[0].contains("repeats"), "{}", obs[0]);
    assert!(obs[1].contains("repeats an earlier call"), "{}", obs[1]);
    assert!(
        obs[2].starts_with("error: not run") && obs[2].contains("identical"),
        "{}",
        obs[2]
    );
    assert_eq!(sent.run.answer, "done");
}

#[tokio::test]
async fn limits_end_the_run_and_the_final_message_says_so() {
    let calls = (0..5)
        .map(|i| {
            Reply::tool_calls(vec![Call::new(
                format!("c{i}"),
                "list_artifacts",
                format!("{{\"limit\": {}}}", i + 1),
            )])
        })
        .collect();
    let f = fixture(calls, false, |p| p.limits.max_turns = 3);
    let (sent, events) = f.send("ana", None, "go", &NoOneToAsk).await;
    assert_eq!(sent.run.stopped, Some(Stopped::MaxTurns(3)));
    assert!(
        sent.run.answer.contains("limit of 3 model turns"),
        "{}",
        sent.run.answer
    );
    assert!(
        matches!(events.last(), Some(AgentEvent::Final { stopped: Some(s), .. }) if s == "max_turns")
    );

    let f = fixture(
        vec![Reply::tool_calls(vec![
            Call::new("a", "list_artifacts", r#"{"limit": 1}"#),
            Call::new("b", "list_artifacts", r#"{"limit": 2}"#),
            Call::new("c", "list_artifacts", r#"{"limit": 3}"#),
        ])],
        false,
        |p| p.limits.max_tool_calls = 2,
    );
    let (sent, _) = f.send("ana", None, "go", &NoOneToAsk).await;
    assert_eq!(sent.run.stopped, Some(Stopped::MaxToolCalls(2)));
    assert!(
        sent.run.answer.contains("limit of 2 tool calls"),
        "{}",
        sent.run.answer
    );
    // The refused call still has its result in the history: no orphaned call.
    let tools: Vec<_> = sent.run.observations().collect();
    assert_eq!(tools.len(), 3);
    assert!(tools[2].content.contains("limit of 2 tool calls"));
}

/// Records what it was asked and answers as told.
struct Recorder {
    answer: Decision,
    asked: Mutex<Vec<ApprovalRequest>>,
}

#[async_trait]
impl Approver for Recorder {
    async fn decide(&self, request: &ApprovalRequest) -> Decision {
        self.asked.lock().unwrap().push(request.clone());
        self.answer.clone()
    }
}

#[tokio::test]
async fn approvals_see_the_expanded_delegated_call_and_history_keeps_the_short_one() {
    let script = || {
        vec![
            Reply::tool_calls(vec![Call::new(
                "d1",
                "call_tool",
                r#"{"tool": "fetch_sales", "args_file": "args/fetch.json", "overrides": {"since": "2025-06-01"}}"#,
            )]),
            Reply::text("ok"),
        ]
    };
    for (answer, ran) in [
        (Decision::Approve, true),
        (Decision::Deny(Some("not today".into())), false),
    ] {
        let f = fixture(script(), false, |p| {
            p.approvals = vec![("fetch_*".into(), Approval::Ask)];
        });
        let ctx = f.ctx("ana");
        put(&ctx, "args/fetch.json", br#"{"since": "2025-01-01"}"#);
        let rec = Recorder {
            answer,
            asked: Mutex::new(Vec::new()),
        };
        let (sent, events) = f.send("ana", None, "go", &rec).await;
        let asked = rec.asked.lock().unwrap().clone();
        assert_eq!(asked.len(), 1);
        assert_eq!(asked[0].tool, "fetch_sales");
        assert_eq!(asked[0].via.as_deref(), Some("call_tool"));
        assert_eq!(asked[0].arguments, json!({"since": "2025-06-01"}));
        assert!(events.iter().any(
            |e| matches!(e, AgentEvent::ApprovalNeeded { tool, .. } if tool == "fetch_sales")
        ));
        let obs = tool_messages(&f.model.requests()[1]);
        if ran {
            assert!(obs[0].contains("dataRef"), "{}", obs[0]);
        } else {
            assert!(
                obs[0].contains("did not approve") && obs[0].contains("not today"),
                "{}",
                obs[0]
            );
            assert!(
                f.store
                    .list(&Principal::new("ana").unwrap(), 10)
                    .unwrap()
                    .0
                    .is_empty()
            );
        }
        // The history keeps the call as the model wrote it.
        let call = &sent.run.messages[1].tool_calls[0];
        assert_eq!(call.name, "call_tool");
        assert!(call.arguments.contains("args_file"));
    }
}

#[tokio::test]
async fn deny_and_the_profiles_tool_set_hold_through_call_tool() {
    // `fetch_sales` denied: neither directly nor through `call_tool` does it run.
    let f = fixture(
        vec![
            Reply::tool_calls(vec![
                Call::new("a", "fetch_sales", r#"{"since": "2025-01-01"}"#),
                Call::new(
                    "b",
                    "call_tool",
                    r#"{"tool": "fetch_sales", "args_file": "a.json"}"#,
                ),
            ]),
            Reply::text("ok"),
        ],
        false,
        |p| p.approvals = vec![("fetch_sales".into(), Approval::Deny)],
    );
    let ctx = f.ctx("ana");
    put(&ctx, "a.json", br#"{"since": "2025-01-01"}"#);
    f.send("ana", None, "go", &ApproveAll).await;
    let obs = tool_messages(&f.model.requests()[1]);
    assert!(
        obs.iter().all(|o| o.contains("approval policy denies")),
        "{obs:?}"
    );
    assert!(
        f.store
            .list(&Principal::new("ana").unwrap(), 10)
            .unwrap()
            .0
            .is_empty()
    );

    // A profile without `export_data`: `call_tool` cannot reach it either (the profile's
    // tools are a registry of their own), and the model is not offered it.
    let f = fixture(
        vec![
            Reply::tool_calls(vec![Call::new(
                "a",
                "call_tool",
                r#"{"tool": "export_data", "args_file": "a.json"}"#,
            )]),
            Reply::text("ok"),
        ],
        false,
        |p| p.tools = vec!["fetch_*".into(), "call_tool".into()],
    );
    f.send("ana", None, "go", &ApproveAll).await;
    let reqs = f.model.requests();
    let offered: Vec<&str> = reqs[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    // `read_file` comes with any tool that can spill.
    assert!(
        offered.contains(&"fetch_sales") && offered.contains(&"call_tool"),
        "{offered:?}"
    );
    assert!(offered.contains(&"read_file"), "{offered:?}");
    assert!(!offered.contains(&"export_data"));
    let obs = tool_messages(&reqs[1]);
    assert!(obs[0].contains("unknown tool `export_data`"), "{}", obs[0]);

    // `read_spilled = false` keeps the tools exactly as listed.
    let f = fixture(vec![Reply::text("ok")], false, |p| {
        p.tools = vec!["fetch_*".into()];
        p.read_spilled = false;
    });
    f.send("ana", None, "go", &ApproveAll).await;
    let offered: Vec<String> = f.model.requests()[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(offered, ["fetch_sales"]);
}

#[tokio::test]
async fn a_session_is_resumed_after_a_restart_and_is_its_principals_only() {
    let home = tempfile::tempdir().unwrap();
    let path = home.path().to_owned();
    let f = fixture_in(home, vec![Reply::text("first answer")], false, |_| {});
    let (sent, _) = f
        .send("ana", Some("s1"), "first question", &NoOneToAsk)
        .await;
    assert_eq!(sent.session, "s1");
    let Fixture { _home: home, .. } = f;
    // A new host on the same data dir: the history is read back.
    let f = fixture_in(
        home,
        vec![Reply::text("second answer"), Reply::text("bob's")],
        false,
        |_| {},
    );
    assert_eq!(f.config.home, path);
    let (sent, _) = f
        .send("ana", Some("s1"), "second question", &NoOneToAsk)
        .await;
    assert_eq!(sent.run.answer, "second answer");
    let req = &f.model.requests()[0];
    let texts: Vec<&str> = req["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert!(
        texts.contains(&"first question") && texts.contains(&"first answer"),
        "{texts:?}"
    );
    let ana = Principal::new("ana").unwrap();
    let info = f.host.sessions.info(&ana, "s1").unwrap();
    assert_eq!(info.runs, 2);
    assert_eq!(info.messages, 4);
    // Another principal with the same session id has a session of its own.
    let (_, _) = f.send("bob", Some("s1"), "bob here", &NoOneToAsk).await;
    let bob = Principal::new("bob").unwrap();
    assert_eq!(f.host.sessions.history(&bob, "s1", None).unwrap().len(), 2);
    assert_eq!(f.host.sessions.history(&ana, "s1", None).unwrap().len(), 4);
    f.host.sessions.delete(&bob, "s1").unwrap();
    assert!(f.host.sessions.history(&bob, "s1", None).is_err());
    assert_eq!(f.host.sessions.history(&ana, "s1", None).unwrap().len(), 4);
}

#[tokio::test]
async fn cancellation_stops_the_turn() {
    let f = fixture(
        vec![Reply::text("too late").delay(Duration::from_secs(30))],
        false,
        |_| {},
    );
    let events = Events::default();
    let cancel = CancellationToken::new();
    let c2 = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        c2.cancel();
    });
    let t0 = std::time::Instant::now();
    let sent = f
        .host
        .send(SendRequest {
            ctx: f.ctx("ana"),
            agent: None,
            session: None,
            message: "hello".into(),
            events: &events,
            approver: &NoOneToAsk,
            cancel,
        })
        .await
        .unwrap();
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert_eq!(sent.run.stopped, Some(Stopped::Cancelled));
}

#[tokio::test]
async fn an_unreachable_model_ends_the_run_with_the_endpoint_named() {
    let f = fixture(vec![Reply::status(401).message("bad key")], false, |_| {});
    let (sent, events) = f.send("ana", None, "hello", &NoOneToAsk).await;
    assert!(matches!(sent.run.stopped, Some(Stopped::Model(_))));
    assert!(
        sent.run.answer.contains("401") && sent.run.answer.contains("API key"),
        "{}",
        sent.run.answer
    );
    assert!(events.iter().any(|e| matches!(e, AgentEvent::Error { .. })));
    // The person's message is kept in the session with the answer that says why.
    let h = f
        .host
        .sessions
        .history(&Principal::new("ana").unwrap(), &sent.session, None)
        .unwrap();
    assert_eq!(h.len(), 2);
}

/// What the model reads before any tool runs: the system prompt and the tool definitions of
/// the default profile on the built-in sample, as the provider receives them, with their
/// size. A change here changes what every request costs.
#[tokio::test]
async fn the_first_request_is_what_the_model_reads_first() {
    let f = fixture(vec![Reply::text("hello")], true, |_| {});
    let mut ctx = f.ctx("ana");
    ctx.clock = Arc::new(dataref_store::ManualClock::new(
        dataref_protocol::Timestamp::parse_rfc3339("2026-12-01T09:30:00Z").unwrap(),
    ));
    let events = Events::default();
    f.host
        .send(SendRequest {
            ctx,
            agent: None,
            session: None,
            message: "hi".into(),
            events: &events,
            approver: &NoOneToAsk,
            cancel: CancellationToken::new(),
        })
        .await
        .unwrap();
    let req = &f.model.requests()[0];
    let system = req["messages"][0]["content"].as_str().unwrap().to_owned();
    let tools = serde_json::to_string(&req["tools"]).unwrap();
    let bpe = tiktoken_rs::o200k_base().unwrap();
    let sizes = json!({
        "system_prompt": {"bytes": system.len(), "tokens": bpe.encode_with_special_tokens(&system).len()},
        "tools": {
            "count": req["tools"].as_array().unwrap().len(),
            "bytes": tools.len(),
            "tokens": bpe.encode_with_special_tokens(&tools).len(),
        },
    });
    insta::assert_snapshot!("system_prompt", system);
    insta::assert_json_snapshot!("first_request_sizes", sizes);
    let names: Vec<&str> = req["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    insta::assert_json_snapshot!("tools_offered", names);
}

#[test]
fn a_profile_naming_an_unknown_tool_or_variable_is_an_error_naming_it() {
    let build = |edit: &dyn Fn(&mut dataref_config::AgentConfig)| {
        let home = tempfile::tempdir().unwrap();
        let mut config = Config::builtin_sample_with_env(home.path().to_owned(), 10, &|_| None);
        edit(config.agents.get_mut("default").unwrap());
        let registry = dataref_builtins::builtin_registry_with(&config, None).unwrap();
        AgentHost::build(&config, &registry)
            .map(|_| ())
            .map_err(|e| {
                let hint = e.hint().unwrap_or_default();
                format!("{e}\nhint: {hint}")
            })
    };
    let e = build(&|p| p.tools = vec!["fetch_sale".into()]).unwrap_err();
    assert!(
        e.contains("agents.default.tools: `fetch_sale` names no tool"),
        "{e}"
    );
    assert!(e.contains("did you mean `fetch_sales`"), "{e}");
    let e = build(&|p| p.tools = vec!["nothing_*".into()]).unwrap_err();
    assert!(e.contains("`nothing_*` names no tool"), "{e}");
    let e = build(&|p| {
        p.prompt = dataref_config::PromptSource::Inline("Hello {{ team }} on {{ today }}".into())
    })
    .unwrap_err();
    assert!(e.contains("`team`"), "{e}");
    assert!(e.contains("[agents.NAME.vars]"), "{e}");
    build(&|p| {
        p.prompt = dataref_config::PromptSource::Inline("Hello {{ team }}".into());
        p.vars.insert("team".into(), "EU".into());
    })
    .unwrap();
    let e = build(&|p| p.approvals = vec![("export_*".into(), Approval::Ask)]);
    assert!(e.is_ok(), "{e:?}");
    let e = build(&|p| {
        p.tools = vec!["fetch_*".into()];
        p.approvals = vec![("export_data".into(), Approval::Ask)];
    })
    .unwrap_err();
    assert!(
        e.contains("`export_data` names no tool of this agent"),
        "{e}"
    );
    let e =
        build(&|p| p.prompt = dataref_config::PromptSource::File("/nonexistent/prompt.md".into()))
            .unwrap_err();
    assert!(e.contains("/nonexistent/prompt.md"), "{e}");
}

/// Rewrites the argument file while the person is being asked, then approves.
struct SwapsTheFile {
    ctx: RunContext,
}

#[async_trait]
impl Approver for SwapsTheFile {
    async fn decide(&self, _request: &ApprovalRequest) -> Decision {
        put(&self.ctx, "args/fetch.json", br#"{"since": "2099-01-01"}"#);
        Decision::Approve
    }
}

#[tokio::test]
async fn what_was_approved_is_what_runs_even_if_the_file_changes_meanwhile() {
    let f = fixture(
        vec![
            Reply::tool_calls(vec![Call::new(
                "d1",
                "call_tool",
                r#"{"tool": "fetch_sales", "args_file": "args/fetch.json"}"#,
            )]),
            Reply::text("ok"),
        ],
        false,
        |p| p.approvals = vec![("fetch_sales".into(), Approval::Ask)],
    );
    let ctx = f.ctx("ana");
    put(&ctx, "args/fetch.json", br#"{"since": "2025-01-01"}"#);
    let (_, events) = f.send("ana", None, "go", &SwapsTheFile { ctx }).await;
    let approved = events
        .iter()
        .find_map(|e| match e {
            AgentEvent::ApprovalNeeded { arguments, .. } => Some(arguments.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(approved, json!({"since": "2025-01-01"}));
    // The call that ran is the one approved: rows since 2025, not none since 2099.
    let obs = last_tool(&f.model.requests()[1]);
    assert!(obs["rows"].as_u64().unwrap() > 0, "{obs}");
}

#[tokio::test]
async fn calls_without_ids_or_with_one_id_each_get_their_own_result() {
    let f = fixture(
        vec![
            Reply::tool_calls(vec![
                Call::new("", "list_artifacts", r#"{"limit": 1}"#),
                Call::new("", "list_artifacts", r#"{"limit": 2}"#),
            ]),
            Reply::tool_calls(vec![
                Call::new("same", "list_artifacts", r#"{"limit": 3}"#),
                Call::new("same", "list_artifacts", r#"{"limit": 4}"#),
            ]),
            Reply::text("done"),
        ],
        false,
        |_| {},
    );
    let (sent, _) = f.send("ana", None, "go", &NoOneToAsk).await;
    assert_eq!(sent.run.answer, "done");
    let req = &f.model.requests()[2];
    let msgs = req["messages"].as_array().unwrap();
    let mut calls = Vec::new();
    let mut results = Vec::new();
    for m in msgs {
        for c in m["tool_calls"].as_array().into_iter().flatten() {
            calls.push(c["id"].as_str().unwrap().to_owned());
        }
        if m["role"] == "tool" {
            results.push(m["tool_call_id"].as_str().unwrap().to_owned());
        }
    }
    assert_eq!(calls.len(), 4);
    assert_eq!(calls, results);
    let unique: std::collections::HashSet<_> = calls.iter().collect();
    assert_eq!(unique.len(), 4, "{calls:?}");
    assert!(results.iter().all(|r| !r.is_empty()));
    // No result is an "interrupted" one: each call ran.
    assert!(!req.to_string().contains("interrupted"));
}

/// The order of the run's tool events: `+tool` started, `-tool` finished.
fn tool_order(events: &[AgentEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::ToolCallStarted { call_id, .. } => Some(format!("+{call_id}")),
            AgentEvent::ToolCallFinished { call_id, .. } => Some(format!("-{call_id}")),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn read_only_calls_of_a_turn_run_together_and_mutating_ones_alone() {
    let f = fixture(
        vec![
            Reply::tool_calls(vec![Call::new(
                "f",
                "fetch_sales",
                r#"{"since": "2025-01-01"}"#,
            )]),
            Reply::dynamic(|req| {
                let r = last_tool(req)["dataRef"].as_str().unwrap().to_owned();
                let d = json!({"dataRef": r}).to_string();
                let e1 = json!({"source": r, "format": "csv", "filename": "a"}).to_string();
                let e2 = json!({"source": r, "format": "csv", "filename": "b"}).to_string();
                Reply::tool_calls(vec![
                    Call::new("r1", "describe_data", d.clone()),
                    Call::new("r2", "list_artifacts", "{}"),
                    Call::new("m1", "export_data", e1),
                    Call::new("m2", "export_data", e2),
                    Call::new("r3", "describe_data", d),
                ])
            }),
            Reply::text("done"),
        ],
        false,
        |_| {},
    );
    let (sent, events) = f.send("ana", None, "go", &NoOneToAsk).await;
    assert_eq!(sent.run.answer, "done");
    let order = tool_order(&events);
    assert_eq!(&order[..2], ["+f", "-f"]);
    let turn2 = &order[2..];
    // The two read-only calls both start before either finishes; each export runs alone;
    // the last read-only call after them.
    assert_eq!(&turn2[..2], ["+r1", "+r2"], "{turn2:?}");
    assert!(turn2[2..4].contains(&"-r1".to_owned()) && turn2[2..4].contains(&"-r2".to_owned()));
    assert_eq!(
        &turn2[4..],
        ["+m1", "-m1", "+m2", "-m2", "+r3", "-r3"],
        "{turn2:?}"
    );
    // Results go back in call order.
    let ids: Vec<String> = f.model.requests()[2]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["tool_call_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, ["f", "r1", "r2", "m1", "m2", "r3"]);
}

#[tokio::test]
async fn a_result_over_the_token_cap_is_cut_with_a_note() {
    let f = fixture(
        vec![
            Reply::tool_calls(vec![Call::new(
                "f",
                "fetch_sales",
                r#"{"since": "2025-01-01"}"#,
            )]),
            Reply::text("done"),
        ],
        false,
        |p| p.limits.result_tokens = 60,
    );
    f.send("ana", None, "go", &NoOneToAsk).await;
    let obs = &tool_messages(&f.model.requests()[1])[0];
    assert!(obs.contains("cut"), "{obs}");
    let bpe = tiktoken_rs::o200k_base().unwrap();
    assert!(bpe.encode_with_special_tokens(obs).len() <= 60, "{obs}");
    assert!(obs.starts_with("{\"dataRef\":\"data_"), "{obs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_stops_the_running_tool() {
    let code = json!({"code": "import time\ntime.sleep(60)\nresult = 1"}).to_string();
    let f = fixture(
        vec![Reply::tool_calls(vec![Call::new("p", "run_python", code)])],
        true,
        |_| {},
    );
    let events = Events::default();
    let cancel = CancellationToken::new();
    let started = std::time::Instant::now();
    let run = f.host.send(SendRequest {
        ctx: f.ctx("ana"),
        agent: None,
        session: None,
        message: "sleep".into(),
        events: &events,
        approver: &NoOneToAsk,
        cancel: cancel.clone(),
    });
    tokio::pin!(run);
    // Cancel once the tool is running.
    let sent = loop {
        tokio::select! {
            r = &mut run => break r.unwrap(),
            () = tokio::time::sleep(Duration::from_millis(100)) => {
                let running = events.0.lock().unwrap().iter().any(|e| matches!(e, AgentEvent::ToolCallStarted { .. }));
                if running && !cancel.is_cancelled() {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    cancel.cancel();
                }
            }
        }
    };
    assert!(started.elapsed() < Duration::from_secs(50));
    assert_eq!(sent.run.stopped, Some(Stopped::Cancelled));
    let obs: Vec<_> = sent.run.observations().collect();
    assert_eq!(obs.len(), 1);
    assert!(obs[0].content.contains("cancelled"), "{}", obs[0].content);
    let finished = events
        .take()
        .into_iter()
        .find_map(|e| match e {
            AgentEvent::ToolCallFinished { outcome, .. } => Some(outcome),
            _ => None,
        })
        .unwrap();
    assert_eq!(finished, "cancelled");
}

#[tokio::test]
async fn a_policy_on_call_tool_itself_holds_for_its_targets() {
    let f = fixture(
        vec![
            Reply::tool_calls(vec![Call::new(
                "d",
                "call_tool",
                r#"{"tool": "list_artifacts", "args_file": "a.json"}"#,
            )]),
            Reply::text("ok"),
        ],
        false,
        |p| p.approvals = vec![("call_tool".into(), Approval::Deny)],
    );
    let ctx = f.ctx("ana");
    put(&ctx, "a.json", b"{}");
    f.send("ana", None, "go", &ApproveAll).await;
    let obs = tool_messages(&f.model.requests()[1]);
    assert!(obs[0].contains("approval policy denies"), "{}", obs[0]);
}

/// Never answers.
struct NobodyThere;

#[async_trait]
impl Approver for NobodyThere {
    async fn decide(&self, _request: &ApprovalRequest) -> Decision {
        std::future::pending().await
    }
}

#[tokio::test]
async fn waiting_for_an_approval_ends_with_the_run() {
    let f = fixture(
        vec![Reply::tool_calls(vec![Call::new(
            "f",
            "fetch_sales",
            r#"{"since": "2025-01-01"}"#,
        )])],
        false,
        |p| {
            p.approvals = vec![("fetch_sales".into(), Approval::Ask)];
            p.limits.wall_time = Duration::from_secs(2);
        },
    );
    let (sent, _) = f.send("ana", None, "go", &NobodyThere).await;
    assert_eq!(
        sent.run.stopped,
        Some(Stopped::WallTime(Duration::from_secs(2)))
    );
    let obs: Vec<_> = sent.run.observations().collect();
    assert!(
        obs[0].content.contains("time limit while waiting"),
        "{}",
        obs[0].content
    );
}
