//! Budgets and `dataref usage` through the real binary: `dataref ask` against the scripted
//! model server with a config of two priced agents, a daily token budget that stops the
//! third run before its request, and the ledger's totals by agent and by principal;
//! `dataref usage` on a data dir with no sessions database (it creates none); and a
//! budget stop through the OpenAI-compatible facade of `dataref serve --http`.

use std::path::Path;
use std::process::Command;

use dataref_test_support::model_server::{Reply, ScriptedModel};
use serde_json::Value;

use crate::BIN;

const CONFIG: &str = r#"
[python]
enabled = false

[agents.budget_a]
price_input = 1.0
price_output = 2.0
max_tokens = 100

[agents.budget_b]
price_input = 0.5
price_output = 0.5
max_tokens = 100

[budgets.agents.budget_a]
tokens_per_day = 180000
money_per_month = 5
"#;

fn dataref(home: &Path, model: &ScriptedModel, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .arg("--home")
        .arg(home)
        .arg("--config")
        .arg(home.join("dataref.toml"))
        .env_remove("DATAREF_CONFIG")
        .env("DATAREF_LLM_URL", model.url())
        .env("DATAREF_LLM_MODEL", "gpt-4o")
        .env_remove("DATAREF_LLM_API_KEY");
    cmd
}

fn ask(home: &Path, model: &ScriptedModel, principal: &str, agent: &str) -> (bool, Value) {
    let out = dataref(
        home,
        model,
        &[
            "ask",
            "--json",
            "--agent",
            agent,
            "--principal",
            principal,
            "how much?",
        ],
    )
    .output()
    .expect("run ask");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("{e}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr)));
    (out.status.success(), v)
}

fn usage(home: &Path, model: &ScriptedModel, args: &[&str]) -> String {
    let mut all = vec!["usage"];
    all.extend_from_slice(args);
    let out = dataref(home, model, &all).output().expect("run usage");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_budget_stops_ask_and_usage_reports_the_ledger() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path();
    std::fs::write(home.join("dataref.toml"), CONFIG).expect("config");
    let model = ScriptedModel::start(vec![
        Reply::text("One.").usage(100_000, 20_000),
        Reply::text("Two.").usage(50_000, 10_000),
        Reply::text("Three.").usage(200_000, 0),
        Reply::text("never asked for"),
    ])
    .expect("model server");

    assert!(ask(home, &model, "ann", "budget_a").0);
    assert!(ask(home, &model, "ben", "budget_a").0);
    assert!(ask(home, &model, "ann", "budget_b").0);
    // budget_a has used 180,000 of 180,000 tokens today: the next run stops before asking.
    let (ok, v) = ask(home, &model, "ann", "budget_a");
    assert!(!ok, "{v}");
    assert_eq!(v["stopped"], "budget");
    let answer = v["answer"].as_str().unwrap_or_default();
    assert!(
        answer.contains("budgets.agents.budget_a.tokens_per_day"),
        "{answer}"
    );
    assert!(answer.contains("180,000 tokens used"), "{answer}");
    assert!(answer.contains("cap 180,000 tokens"), "{answer}");
    assert_eq!(model.requests().len(), 3);

    let by_agent: Value =
        serde_json::from_str(&usage(home, &model, &["--by", "agent", "--json"])).expect("JSON");
    let groups: Vec<(String, u64, u64, u64, u64, u64)> = by_agent["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .map(|g| {
            (
                g["key"].as_str().unwrap_or_default().to_owned(),
                g["requests"].as_u64().unwrap_or_default(),
                g["prompt_tokens"].as_u64().unwrap_or_default(),
                g["completion_tokens"].as_u64().unwrap_or_default(),
                g["cost_micros"].as_u64().unwrap_or_default(),
                g["estimated"].as_u64().unwrap_or(99),
            )
        })
        .collect();
    // budget_a: 150,000 + 2 × 30,000 = 210,000 micro-units; budget_b: 0.5 × 200,000.
    assert_eq!(
        groups,
        [
            ("budget_b".to_owned(), 1, 200_000, 0, 100_000, 0),
            ("budget_a".to_owned(), 2, 150_000, 30_000, 210_000, 0),
        ]
    );
    assert_eq!(by_agent["total"]["requests"], 3);
    let budgets = by_agent["budgets"].as_array().expect("budgets");
    assert_eq!(budgets.len(), 2);
    assert_eq!(
        budgets[0]["budget"],
        "budgets.agents.budget_a.tokens_per_day"
    );
    assert_eq!(
        (
            &budgets[0]["used"],
            &budgets[0]["cap"],
            &budgets[0]["percent"]
        ),
        (&180_000.into(), &180_000.into(), &100.into())
    );
    assert_eq!(
        budgets[1]["budget"],
        "budgets.agents.budget_a.money_per_month"
    );
    assert_eq!(budgets[1]["used"], 210_000);

    let table = usage(home, &model, &["--by", "agent"]);
    let line = table
        .lines()
        .find(|l| l.starts_with("budget_a "))
        .unwrap_or_else(|| panic!("{table}"));
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        cells,
        ["budget_a", "2", "150,000", "30,000", "0.2100", "0"],
        "{table}"
    );
    assert!(table.contains("180,000 / 180,000 tokens"), "{table}");

    let by_principal = usage(home, &model, &["--by", "principal"]);
    let ann = by_principal
        .lines()
        .find(|l| l.starts_with("ann "))
        .unwrap_or_else(|| panic!("{by_principal}"));
    assert_eq!(
        ann.split_whitespace().collect::<Vec<_>>(),
        ["ann", "2", "300,000", "20,000", "0.2400", "0"]
    );
    // Nothing after today; a bad date is an error with a hint.
    let later: Value =
        serde_json::from_str(&usage(home, &model, &["--json", "--since", "2999-01-01"]))
            .expect("JSON");
    assert_eq!(later["groups"], Value::Array(Vec::new()));
    let bad = dataref(home, &model, &["usage", "--since", "yesterday"])
        .output()
        .expect("run usage");
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("hint:"));
}

/// `dataref usage` reads the ledger and nothing else: on a data dir where no agent ran, it
/// says so and creates no sessions database.
#[test]
fn usage_on_a_fresh_data_dir_creates_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path();
    std::fs::write(home.join("dataref.toml"), CONFIG).expect("config");
    let model = ScriptedModel::start(Vec::new()).expect("model server");
    let text = usage(home, &model, &["--by", "agent"]);
    assert!(text.contains("no usage recorded yet"), "{text}");
    let json: Value = serde_json::from_str(&usage(home, &model, &["--json"])).expect("JSON");
    assert_eq!(json["note"], "no usage recorded yet");
    assert_eq!(json["total"]["requests"], 0);
    assert!(
        !home.join("agent").join("sessions.sqlite").exists(),
        "`dataref usage` created the sessions database"
    );
}

/// A budget stop through `/v1/chat/completions`: a stock OpenAI client reads the stop's
/// sentence as the assistant's content, with `finish_reason: length` (a limit), streamed
/// and not. No model request is made.
#[tokio::test(flavor = "multi_thread")]
async fn a_budget_stop_is_the_answer_of_the_openai_facade() {
    const NAME: &str = "budgets.agents.default.tokens_per_day";
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path();
    let config = home.join("dataref.toml");
    // Any request's prompt is over 10 tokens: every run stops before its first request.
    std::fs::write(
        &config,
        "[python]\nenabled = false\n\n[http]\nauth = false\n\n[budgets.agents.default]\ntokens_per_day = 10\n",
    )
    .expect("config");
    let model = ScriptedModel::start(vec![Reply::text("never asked for")]).expect("model server");
    let mut cmd = dataref_test_support::ServeHttp::command(BIN, home, &config);
    cmd.env_remove("DATAREF_LLM_API_KEY")
        .env("DATAREF_PRINCIPAL", "alice")
        .env("DATAREF_LLM_URL", model.url())
        .env("DATAREF_LLM_MODEL", "test-model");
    let server =
        dataref_test_support::ServeHttp::start(&mut cmd, std::time::Duration::from_secs(120))
            .expect("dataref serve --http");
    dataref_config::tls::install_provider();
    let c = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", server.base());
    let body = |stream: bool| {
        serde_json::json!({
            "model": "default",
            "stream": stream,
            "messages": [{"role": "user", "content": "What is revenue?"}],
        })
    };

    let r = c.post(&url).json(&body(false)).send().await.expect("POST");
    assert_eq!(r.status().as_u16(), 200);
    let v: Value = r.json().await.expect("JSON");
    let content = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default();
    assert!(content.contains(NAME), "{v}");
    assert!(content.contains("would take the budget"), "{v}");
    assert!(content.contains("cap 10 tokens"), "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");

    let r = c.post(&url).json(&body(true)).send().await.expect("POST");
    assert_eq!(r.status().as_u16(), 200);
    let text = r.text().await.expect("stream");
    let mut streamed = String::new();
    let mut finish = Vec::new();
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            continue;
        }
        let chunk: Value = serde_json::from_str(data).expect("chunk");
        assert!(chunk.get("error").is_none(), "{chunk}");
        if let Some(piece) = chunk["choices"][0]["delta"]["content"].as_str() {
            streamed.push_str(piece);
        }
        if let Some(f) = chunk["choices"][0]["finish_reason"].as_str() {
            finish.push(f.to_owned());
        }
    }
    assert!(streamed.contains(NAME), "{text}");
    assert_eq!(finish, ["length"], "{text}");
    assert!(model.requests().is_empty());
}
