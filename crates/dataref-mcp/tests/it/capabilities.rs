//! Prompts, completion, logging and resource subscriptions, in process: each principal
//! sees only its own values, logs and changes.
#![expect(
    deprecated,
    reason = "MCP logging and resources/subscribe are what 2025-11-25 hosts use"
)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dataref_mcp::rmcp::model::{
    CompletionContext, GetPromptRequestParams, LoggingLevel, LoggingMessageNotificationParam,
    ResourceUpdatedNotificationParam, SetLevelRequestParams, SubscribeRequestParams,
    UnsubscribeRequestParams,
};
use dataref_mcp::rmcp::service::NotificationContext;
use dataref_mcp::rmcp::{ClientHandler, RoleClient, ServiceError};
use dataref_mcp::{InProcessSession, connect_in_process};
use serde_json::{Value, json};

use crate::support::Env;

/// Every notification a session got, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Seen {
    ListChanged,
    Updated(String),
    Log(LoggingLevel, Value),
}

#[derive(Debug, Clone, Default)]
pub struct Watcher {
    pub seen: Arc<Mutex<Vec<Seen>>>,
}

impl Watcher {
    fn push(&self, s: Seen) {
        if let Ok(mut v) = self.seen.lock() {
            v.push(s);
        }
    }

    pub fn all(&self) -> Vec<Seen> {
        self.seen.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// Waits (a generous deadline, for liveness only) until `done` holds for what was seen.
    pub async fn until(&self, what: &str, done: impl Fn(&[Seen]) -> bool) -> Vec<Seen> {
        for _ in 0..1_500 {
            let seen = self.all();
            if done(&seen) {
                return seen;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("never saw {what}; saw {:?}", self.all());
    }
}

impl ClientHandler for Watcher {
    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.push(Seen::Log(params.level, params.data));
    }

    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.push(Seen::Updated(params.uri));
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.push(Seen::ListChanged);
    }
}

pub fn count(seen: &[Seen], what: &Seen) -> usize {
    seen.iter().filter(|s| *s == what).count()
}

async fn connect(
    env: &Env,
    principal: &str,
) -> anyhow::Result<(InProcessSession<Watcher>, Watcher)> {
    let watcher = Watcher::default();
    let session = connect_in_process(env.server(principal)?, watcher.clone()).await?;
    Ok((session, watcher))
}

async fn call(
    session: &InProcessSession<Watcher>,
    name: &str,
    args: Value,
) -> anyhow::Result<Value> {
    let mut params = dataref_mcp::rmcp::model::CallToolRequestParams::new(name.to_owned());
    if let Value::Object(o) = args {
        params = params.with_arguments(o);
    }
    let r = session.client.call_tool(params).await?;
    Ok(json!({
        "isError": r.is_error == Some(true),
        "structured": r.structured_content,
    }))
}

async fn fetch(session: &InProcessSession<Watcher>) -> anyhow::Result<String> {
    let r = call(session, "fetch_sales", json!({"since": "2025-01-01"})).await?;
    assert_eq!(r["isError"], json!(false), "{r}");
    r["structured"]["dataRef"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| anyhow::anyhow!("no dataRef in {r}"))
}

fn mcp_error(e: ServiceError) -> dataref_mcp::rmcp::ErrorData {
    match e {
        ServiceError::McpError(e) => e,
        other => panic!("expected an MCP error, got {other:?}"),
    }
}

fn prompt(name: &str, args: Value) -> GetPromptRequestParams {
    let mut p = GetPromptRequestParams::new(name);
    p.arguments = args.as_object().cloned();
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompts_teach_the_by_reference_workflow_on_the_callers_own_tables() -> anyhow::Result<()> {
    let env = Env::new(2_000)?;
    let (alice, _) = connect(&env, "alice").await?;
    let (bob, _) = connect(&env, "bob").await?;
    let info = alice.client.peer_info().expect("server info");
    assert!(info.capabilities.prompts.is_some());

    let prompts = alice.client.list_all_prompts().await?;
    let names: Vec<&str> = prompts.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["analyse_table", "compare_periods", "analyse_sales"]);
    assert!(prompts.iter().all(|p| p.description.is_some()));
    let sales = &prompts[2];
    let args: Vec<(&str, bool)> = sales
        .arguments
        .iter()
        .flatten()
        .map(|a| (a.name.as_str(), a.required == Some(true)))
        .collect();
    assert_eq!(args, [("since", true), ("question", false)]);

    let data_ref = fetch(&alice).await?;
    let got = alice
        .client
        .get_prompt(prompt(
            "analyse_table",
            json!({"dataRef": data_ref, "question": "which region grows fastest?"}),
        ))
        .await?;
    assert_eq!(got.messages.len(), 1);
    let text = serde_json::to_value(&got.messages[0])?["content"]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    for needle in [
        data_ref.as_str(),
        "2000 rows",
        "which region grows fastest?",
        "`describe_data`",
        "`render_chart`",
        "never ask for the rows",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from {text}");
    }
    // The shape, never the rows: the sample's first row does not appear.
    assert!(!text.contains("2025-01-01,"), "{text}");

    // Bob cannot build a prompt on Alice's table: the answer an unknown one gets.
    let theirs = mcp_error(
        bob.client
            .get_prompt(prompt("analyse_table", json!({"dataRef": data_ref})))
            .await
            .expect_err("bob used alice's dataRef"),
    );
    let unknown = mcp_error(
        bob.client
            .get_prompt(prompt(
                "analyse_table",
                json!({"dataRef": "data_AAAAAAAAAAAAAAAAAAAAAA"}),
            ))
            .await
            .expect_err("unknown dataRef"),
    );
    assert_eq!(
        theirs.message.replace(&data_ref, "X"),
        unknown.message.replace("data_AAAAAAAAAAAAAAAAAAAAAA", "X")
    );

    let missing = mcp_error(
        alice
            .client
            .get_prompt(prompt("compare_periods", json!({"dataRef": data_ref})))
            .await
            .expect_err("missing arguments"),
    );
    assert!(
        missing.message.contains("`dateColumn`"),
        "{}",
        missing.message
    );
    let no_column = mcp_error(
        alice
            .client
            .get_prompt(prompt(
                "compare_periods",
                json!({"dataRef": data_ref, "dateColumn": "when", "first": "2025-Q1", "second": "2025-Q2"}),
            ))
            .await
            .expect_err("unknown column"),
    );
    assert!(
        no_column.message.contains("no column `when`"),
        "{}",
        no_column.message
    );

    let query = alice
        .client
        .get_prompt(prompt("analyse_sales", json!({"since": "2025-06-01"})))
        .await?;
    let text = serde_json::to_value(&query.messages[0])?["content"]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(text.contains("`fetch_sales`"), "{text}");
    assert!(text.contains(r#"{"since":"2025-06-01"}"#), "{text}");

    let unknown_prompt = mcp_error(
        alice
            .client
            .get_prompt(prompt("nope", json!({})))
            .await
            .expect_err("unknown prompt"),
    );
    assert!(unknown_prompt.message.contains("no prompt `nope`"));
    alice.client.cancel().await?;
    bob.client.cancel().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_offers_only_declared_values_and_what_the_caller_owns() -> anyhow::Result<()> {
    let mut env = Env::new(500)?;
    // A declared default, as a named query's config may give one.
    if let Some(q) = env.config.queries.get_mut("sales") {
        q.params[0].default = Some(json!("2025-01-01"));
        q.params[0].required = false;
    }
    env.registry = Arc::new(dataref_builtins::builtin_registry(&env.config)?);
    let (alice, _) = connect(&env, "alice").await?;
    let (bob, _) = connect(&env, "bob").await?;
    assert!(
        alice
            .client
            .peer_info()
            .expect("info")
            .capabilities
            .completions
            .is_some()
    );

    let a1 = fetch(&alice).await?;
    let a2 = fetch(&alice).await?;
    let b1 = fetch(&bob).await?;
    let mut mine = vec![a1.clone(), a2.clone()];
    mine.sort();

    for (who, expected) in [(&alice, mine.clone()), (&bob, vec![b1.clone()])] {
        let mut got = who
            .client
            .complete_prompt_argument("analyse_table", "dataRef", "data_", None)
            .await?
            .values;
        got.sort();
        assert_eq!(got, expected);
        let mut by_template = who
            .client
            .complete_resource_argument("dataref://artifacts/{dataRef}", "dataRef", "", None)
            .await?
            .values;
        by_template.sort();
        assert_eq!(by_template, expected);
    }

    // Column names of the caller's own table; of someone else's, nothing.
    let ctx = |r: &str| {
        Some(CompletionContext::with_arguments(
            [("dataRef".to_owned(), r.to_owned())].into(),
        ))
    };
    let measures = alice
        .client
        .complete_prompt_argument("compare_periods", "measure", "re", ctx(&a1))
        .await?;
    assert_eq!(measures.values, ["revenue"]);
    let stolen = bob
        .client
        .complete_prompt_argument("compare_periods", "measure", "", ctx(&a1))
        .await?;
    assert_eq!(stolen.values, Vec::<String>::new());

    // Workspace paths: the caller's own.
    let exported = call(
        &alice,
        "export_data",
        json!({"source": a1, "format": "csv", "filename": "sales"}),
    )
    .await?;
    assert_eq!(exported["isError"], json!(false), "{exported}");
    let path = exported["structured"]["path"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let alice_paths = alice
        .client
        .complete_resource_argument("dataref://files/{path}", "path", "exp", None)
        .await?;
    assert_eq!(alice_paths.values, [path]);
    let bob_paths = bob
        .client
        .complete_resource_argument("dataref://files/{path}", "path", "", None)
        .await?;
    assert_eq!(bob_paths.values, Vec::<String>::new());

    // A named query's declared values; a free parameter's typed value is not echoed.
    let since = alice
        .client
        .complete_prompt_argument("analyse_sales", "since", "2025", None)
        .await?;
    assert_eq!(since.values, ["2025-01-01"]);
    // Unknown references get no values, not an error (the conformance suite asks this).
    let unknown = alice
        .client
        .complete_prompt_argument("test_prompt_with_arguments", "arg1", "test", None)
        .await?;
    assert_eq!(unknown.values, Vec::<String>::new());
    alice.client.cancel().await?;
    bob.client.cancel().await?;
    Ok(())
}

fn is_log(s: &Seen, level: LoggingLevel) -> bool {
    matches!(s, Seen::Log(l, _) if *l == level)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_messages_follow_each_sessions_level_and_reach_only_the_caller() -> anyhow::Result<()> {
    let mut env = Env::new(50_000)?;
    // `describe_data` spilled past 100 characters, as `[spill.tools.describe_data]` may say.
    env.config.spill.tools.insert(
        "describe_data".into(),
        dataref_config::ToolSpill {
            enabled: Some(true),
            threshold_chars: Some(100),
        },
    );
    env.registry = Arc::new(dataref_builtins::builtin_registry(&env.config)?);
    let (verbose, verbose_seen) = connect(&env, "alice").await?;
    let (quiet, quiet_seen) = connect(&env, "alice").await?;
    let (bob, bob_seen) = connect(&env, "bob").await?;
    assert!(
        verbose
            .client
            .peer_info()
            .expect("info")
            .capabilities
            .logging
            .is_some()
    );
    verbose
        .client
        .set_level(SetLevelRequestParams::new(LoggingLevel::Debug))
        .await?;
    bob.client
        .set_level(SetLevelRequestParams::new(LoggingLevel::Debug))
        .await?;

    // The verbose session sees its fetch's steps at `debug`, and a spilled result at
    // `notice` with its path.
    let data_ref = fetch(&verbose).await?;
    let described = call(&verbose, "describe_data", json!({"dataRef": data_ref})).await?;
    assert_eq!(
        described["structured"]["spilled"],
        json!(true),
        "{described}"
    );
    let spilled_to = described["structured"]["path"].clone();
    verbose_seen
        .until("a notice of the spill", |s| {
            s.iter().any(|e| matches!(e, Seen::Log(LoggingLevel::Notice, d) if d["spilled"] == spilled_to && d["tool"] == "describe_data"))
        })
        .await;
    let seen = verbose_seen
        .until("a debug step of fetch_sales", |s| {
            s.iter().any(|e| matches!(e, Seen::Log(LoggingLevel::Debug, d) if d["tool"] == "fetch_sales" && d["step"].is_string()))
        })
        .await;
    assert!(!seen.iter().any(|s| is_log(s, LoggingLevel::Warning)));

    // The quiet one (default: warnings and worse) sees no steps of its own fetch, only its
    // failures.
    fetch(&quiet).await?;
    let r = call(
        &quiet,
        "describe_data",
        json!({"dataRef": "data_AAAAAAAAAAAAAAAAAAAAAA"}),
    )
    .await?;
    assert_eq!(r["isError"], json!(true));
    let seen = quiet_seen
        .until("a warning for the failed call", |s| {
            s.iter().any(|e| is_log(e, LoggingLevel::Warning))
        })
        .await;
    assert!(
        !seen.iter().any(|s| is_log(s, LoggingLevel::Debug)),
        "{seen:?}"
    );
    let Some(Seen::Log(_, warning)) = seen.iter().find(|s| is_log(s, LoggingLevel::Warning)) else {
        unreachable!()
    };
    assert_eq!(warning["tool"], "describe_data");

    // Nothing of Alice's calls reached Bob, who listens at `debug`: his first log line is
    // about his own call.
    assert_eq!(bob_seen.all(), []);
    fetch(&bob).await?;
    let seen = bob_seen.until("bob's own step", |s| !s.is_empty()).await;
    for s in &seen {
        let Seen::Log(_, d) = s else { continue };
        assert_eq!(d["tool"], "fetch_sales", "{seen:?}");
    }
    assert!(
        !seen.iter().any(|s| is_log(s, LoggingLevel::Warning)),
        "{seen:?}"
    );
    verbose.client.cancel().await?;
    quiet.client.cancel().await?;
    bob.client.cancel().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resource_changes_reach_the_owners_sessions_only() -> anyhow::Result<()> {
    let env = Env::new(500)?;
    let (a1, a1_seen) = connect(&env, "alice").await?;
    let (a2, a2_seen) = connect(&env, "alice").await?;
    let (bob, bob_seen) = connect(&env, "bob").await?;
    let caps = a1
        .client
        .peer_info()
        .expect("info")
        .capabilities
        .resources
        .clone()
        .expect("resources");
    assert_eq!(
        (caps.subscribe, caps.list_changed),
        (Some(true), Some(true))
    );
    let workspace = env.home.path().join("workspaces").join("alice");
    std::fs::create_dir_all(&workspace)?;
    std::fs::write(workspace.join("notes.txt"), "first")?;

    // Listing resources is what starts a session's list_changed; subscribing adds updates.
    for s in [&a1, &a2, &bob] {
        s.client.list_all_resources().await?;
    }
    let notes = "dataref://files/notes.txt".to_owned();
    a1.client
        .subscribe(SubscribeRequestParams::new(notes.clone()))
        .await?;

    // Alice fetches in a1: both her sessions hear the list changed.
    let data_ref = fetch(&a1).await?;
    a1_seen
        .until("list_changed in a1", |s| s.contains(&Seen::ListChanged))
        .await;
    a2_seen
        .until("list_changed in a2", |s| s.contains(&Seen::ListChanged))
        .await;

    // The file is rewritten (by anything) and seen at Alice's next call: only a1
    // subscribed to it.
    std::fs::write(workspace.join("notes.txt"), "second, longer")?;
    call(&a2, "list_artifacts", json!({})).await?;
    a1_seen
        .until("updated notes.txt", |s| {
            s.contains(&Seen::Updated(notes.clone()))
        })
        .await;

    // Subscribing to the table: unknown to anyone else, and not an oracle for Bob.
    let table = format!("dataref://artifacts/{data_ref}");
    a1.client
        .subscribe(SubscribeRequestParams::new(table.clone()))
        .await?;
    bob.client
        .subscribe(SubscribeRequestParams::new(table.clone()))
        .await?;
    a1.client
        .unsubscribe(UnsubscribeRequestParams::new(notes.clone()))
        .await?;
    std::fs::remove_file(workspace.join("notes.txt"))?;
    call(&a1, "list_artifacts", json!({})).await?;
    let seen = a1_seen
        .until("a second list_changed in a1", |s| {
            count(s, &Seen::ListChanged) >= 2
        })
        .await;
    assert_eq!(
        count(&seen, &Seen::Updated(notes.clone())),
        1,
        "unsubscribed: {seen:?}"
    );

    // Bob's own change reaches him, and it is the only thing that did.
    fetch(&bob).await?;
    let seen = bob_seen
        .until("bob's list_changed", |s| !s.is_empty())
        .await;
    assert_eq!(seen, [Seen::ListChanged]);

    // What cannot be subscribed to says so.
    for bad in [
        "test://watched-resource",
        "dataref://files/../etc/passwd",
        "dataref://artifacts/nope",
    ] {
        let e = a1
            .client
            .subscribe(SubscribeRequestParams::new(bad))
            .await
            .expect_err(bad);
        let e = mcp_error(e);
        assert!(!e.message.is_empty(), "{bad}");
    }
    a1.client.cancel().await?;
    a2.client.cancel().await?;
    bob.client.cancel().await?;
    Ok(())
}
