//! `dataref eval` through the real binary on the real sample: the shipped suite, scored
//! against a scripted model that asks the `query` tool each case's own SQL and answers with
//! what it returns; a wrong answer and the threshold; a malformed suite; a session exported
//! as a case.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use dataref_test_support::model_server::{Call, Reply, ScriptedModel};
use rusqlite::{Connection, OpenFlags};
use serde_json::{Value, json};

use crate::{BIN, make_sample};

/// The data dir the agent tests share (the Python runtime is provisioned there once).
fn home() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dataref-runtime-home")
}

fn shipped_suite() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../evals/sample.toml")
}

fn dataref(model: Option<&ScriptedModel>, principal: &str, args: &[&str]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .arg("--home")
        .arg(home())
        .env_remove("DATAREF_CONFIG")
        .env_remove("DATAREF_LLM_API_KEY")
        .env("DATAREF_PRINCIPAL", principal);
    match model {
        Some(m) => cmd
            .env("DATAREF_LLM_URL", m.url())
            .env("DATAREF_LLM_MODEL", "gpt-4o"),
        None => cmd
            .env_remove("DATAREF_LLM_URL")
            .env_remove("DATAREF_LLM_MODEL"),
    };
    cmd.output().expect("run dataref")
}

/// One case of a suite file, as the test's model needs it.
#[derive(Debug, Clone)]
struct Case {
    id: String,
    kind: String,
    sql: String,
    matching: String,
}

/// The cases of a suite file, read with the toml crate (not the code under test).
fn cases(path: &Path) -> Vec<Case> {
    let text = std::fs::read_to_string(path).expect("read the suite");
    let v: toml::Table = toml::from_str(&text).expect("the suite is TOML");
    v["case"]
        .as_array()
        .expect("[[case]]")
        .iter()
        .map(|c| {
            let s = |k: &str| c.get(k).and_then(|v| v.as_str()).map(str::to_owned);
            Case {
                id: s("id").expect("id"),
                kind: s("kind").unwrap_or_default(),
                sql: s("sql").expect("sql"),
                matching: s("match").unwrap_or_else(|| "number".to_owned()),
            }
        })
        .collect()
}

/// The questions of a suite, by case id.
fn questions(path: &Path) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(path).expect("read the suite");
    let v: toml::Table = toml::from_str(&text).expect("the suite is TOML");
    v["case"]
        .as_array()
        .expect("[[case]]")
        .iter()
        .map(|c| {
            (
                c["id"].as_str().expect("id").to_owned(),
                c["question"].as_str().expect("question").to_owned(),
            )
        })
        .collect()
}

/// `12,421,073.90`; a fraction as a percent (`27.79%`); a count as `7,009`.
fn written(x: f64) -> String {
    if x.abs() < 1.0 {
        return format!("{:.2}%", x * 100.0);
    }
    let s = if x.fract() == 0.0 {
        format!("{:.0}", x.abs())
    } else {
        format!("{:.2}", x.abs())
    };
    let (int, frac) = s
        .split_once('.')
        .map_or((s.as_str(), None), |(i, f)| (i, Some(f)));
    let mut grouped = String::new();
    for (i, c) in int.chars().enumerate() {
        if i > 0 && (int.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(c);
    }
    let sign = if x < 0.0 { "-" } else { "" };
    match frac {
        Some(f) => format!("{sign}{grouped}.{f}"),
        None => format!("{sign}{grouped}"),
    }
}

/// What a model that read the case's result would answer: computed here with the same SQL
/// on the same database file.
fn answer_of(db: &Connection, case: &Case) -> String {
    let mut stmt = db.prepare(&case.sql).expect("the case's SQL");
    let column: Vec<rusqlite::types::Value> = stmt
        .query_map([], |r| r.get(0))
        .expect("run the case's SQL")
        .map(Result::unwrap)
        .collect();
    let show = |v: &rusqlite::types::Value| match v {
        rusqlite::types::Value::Integer(i) => written(*i as f64),
        rusqlite::types::Value::Real(f) => written(*f),
        rusqlite::types::Value::Text(t) => t.clone(),
        other => panic!("{}: {other:?}", case.id),
    };
    match case.matching.as_str() {
        "number" => format!("The answer is {}.", show(&column[0])),
        "text" => format!("It is {}.", show(&column[0])),
        _ => column
            .iter()
            .enumerate()
            .map(|(i, v)| format!("{}. {}", i + 1, show(v)))
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

/// A model that, for each question of `cases`, calls `query` with the case's SQL, then
/// answers with `answers[id]`; enough replies for `runs` runs of every case (a grounding
/// check that sends an answer back gets the same answer again).
fn model_for(
    cases: &[Case],
    questions: &BTreeMap<String, String>,
    answers: BTreeMap<String, String>,
    runs: usize,
) -> ScriptedModel {
    let by_question: BTreeMap<String, Case> = cases
        .iter()
        .map(|c| (questions[&c.id].clone(), c.clone()))
        .collect();
    let reply = Reply::dynamic(move |body: &Value| {
        let messages = body["messages"].as_array().expect("messages");
        let question = messages
            .iter()
            .find(|m| m["role"] == "user")
            .and_then(|m| m["content"].as_str())
            .expect("a question");
        let case = by_question
            .get(question)
            .unwrap_or_else(|| panic!("not a question of the suite: {question}"));
        if messages.iter().any(|m| m["role"] == "tool") {
            Reply::text(answers[&case.id].clone()).usage(1_500, 40)
        } else {
            Reply::tool_calls(vec![Call::new(
                "call_1",
                "query",
                json!({"source": "sample", "sql": case.sql}).to_string(),
            )])
            .usage(1_200, 60)
        }
    });
    ScriptedModel::start(vec![reply; cases.len() * runs * 3]).expect("model server")
}

fn sample_db() -> Connection {
    let path = make_sample(&home(), "48210");
    Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).expect("open the sample")
}

#[test]
fn the_shipped_suite_passes_grounded_against_a_model_that_reports_the_sources_values() {
    let suite = shipped_suite();
    let cases = cases(&suite);
    assert!(cases.len() >= 25, "{} cases", cases.len());
    for kind in [
        "period",
        "period delta",
        "top-k",
        "share",
        "growth",
        "filter",
        "join",
        "whole table",
    ] {
        assert!(cases.iter().any(|c| c.kind == kind), "no `{kind}` case");
    }
    assert!(
        cases.iter().any(|c| c.sql.contains("JOIN lines")),
        "a case joins the catalogue"
    );
    let db = sample_db();
    let answers = cases
        .iter()
        .map(|c| (c.id.clone(), answer_of(&db, c)))
        .collect();
    let questions = questions(&suite);
    let model = model_for(&cases, &questions, answers, 1);
    let out = dataref(
        Some(&model),
        "evaluator",
        &["eval", suite.to_str().unwrap(), "--min-accuracy", "1"],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("## Eval `sample`: agent `default`, model `gpt-4o`"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "**Accuracy 100.0%** ({n} of {n} runs) · grounded 100.0%",
            n = cases.len()
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains("| `q4-losers-top5` | pass | Falcon Office Chair, "),
        "{stdout}"
    );
    assert!(
        stdout.contains("Meets the minimum accuracy of 100.0%"),
        "{stdout}"
    );
    // Each question ran in a session of its own, and its one tool call was the case's SQL.
    let requests = model.requests();
    assert_eq!(requests.len(), 2 * cases.len(), "{stderr}");
    for r in requests.iter().filter(|r| {
        r["messages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["role"] == "tool")
    }) {
        let users = r["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "user")
            .count();
        assert_eq!(users, 1, "one question per session: {r}");
    }
}

#[test]
fn a_wrong_answer_fails_its_case_and_the_threshold_with_json() {
    let suite = shipped_suite();
    let cases = cases(&suite);
    let db = sample_db();
    let mut answers: BTreeMap<String, String> = cases
        .iter()
        .map(|c| (c.id.clone(), answer_of(&db, c)))
        .collect();
    // Q4 revenue, 10% too high: a number no tool produced.
    let q4: f64 = db
        .query_row(
            &cases.iter().find(|c| c.id == "q4-revenue").unwrap().sql,
            [],
            |r| r.get(0),
        )
        .unwrap();
    answers.insert(
        "q4-revenue".into(),
        format!("The answer is {}.", written(q4 * 1.1)),
    );
    // The top regions, second and third swapped.
    let regions = answers["regions-top3"].clone();
    let lines: Vec<&str> = regions.lines().collect();
    answers.insert(
        "regions-top3".into(),
        format!("{}\n{}\n{}", lines[0], lines[2], lines[1]),
    );
    let questions = questions(&suite);
    let model = model_for(&cases, &questions, answers, 2);
    let out = dataref(
        Some(&model),
        "evaluator-wrong",
        &[
            "eval",
            suite.to_str().unwrap(),
            "--json",
            "--runs",
            "2",
            "--min-accuracy",
            "1",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stdout}\n{stderr}");
    let v: Value = serde_json::from_str(&stdout).expect("one JSON object");
    let n = cases.len() as u64;
    assert_eq!(v["suite"], "sample");
    assert_eq!(v["agent"], "default");
    assert_eq!(v["model"], "gpt-4o");
    assert_eq!(v["runs"], 2);
    assert_eq!(v["ok"], false);
    assert_eq!(v["min_accuracy"], 1.0);
    let t = &v["totals"];
    assert_eq!(t["runs"], 2 * n);
    assert_eq!(t["passed"], 2 * n - 4);
    assert_eq!(t["accuracy"], (2 * n - 4) as f64 / (2 * n) as f64);
    // The invented number is not grounded; a wrong order of names is.
    assert_eq!(t["grounded"], 2 * n - 2);
    assert_eq!(t["cost"], Value::Null, "the profile declares no prices");
    assert!(t["prompt_tokens"].as_u64().unwrap() >= 2 * n * 2_700);
    assert_eq!(t["tool_calls"], 2 * n);
    assert!(t["seconds"].as_f64().unwrap() > 0.0);
    let case = |id: &str| {
        v["cases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == id)
            .unwrap_or_else(|| panic!("{id}"))
            .clone()
    };
    let q4_case = case("q4-revenue");
    assert_eq!(q4_case["match"], "number");
    assert_eq!(q4_case["kind"], "period");
    assert_eq!(q4_case["pass_rate"], 0.0);
    assert!((q4_case["expected"][0].as_f64().unwrap() - q4).abs() < 1e-6);
    let run = &q4_case["results"][0];
    assert_eq!(run["pass"], false);
    assert_eq!(run["grounded"], false);
    assert_eq!(run["unmatched"][0], written(q4 * 1.1));
    assert_eq!(run["got"], written(q4 * 1.1));
    assert_eq!(run["tool_calls"], 1);
    assert!(run["session"].as_str().unwrap().starts_with("s-"));
    for key in [
        "run",
        "answer",
        "stopped",
        "prompt_tokens",
        "completion_tokens",
        "seconds",
        "cost",
    ] {
        assert!(run.get(key).is_some(), "{key} in {run}");
    }
    let regions = case("regions-top3");
    assert_eq!(regions["passed"], 0);
    assert_eq!(regions["results"][1]["grounded"], true);
    assert!(
        regions["results"][0]["got"]
            .as_str()
            .unwrap()
            .starts_with("all named, "),
        "{regions}"
    );
    assert_eq!(case("total-revenue")["pass_rate"], 1.0);
}

#[test]
fn a_malformed_suite_or_a_broken_case_is_refused_before_any_question() {
    let dir = tempfile::tempdir().unwrap();
    let model = ScriptedModel::start(Vec::new()).expect("model server");
    let run = |text: &str| {
        let path = dir.path().join("suite.toml");
        std::fs::write(&path, text).unwrap();
        let out = dataref(
            Some(&model),
            "evaluator-bad",
            &["eval", path.to_str().unwrap()],
        );
        assert_eq!(out.status.code(), Some(1), "{text}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = run("[[case]]\nid = \"a\"\nquestion = \"q\"\nsql = \"SELECT 1\"\nexpect = 3\n");
    assert!(e.contains("line 5"), "{e}");
    assert!(e.contains("unknown field `expect`"), "{e}");
    assert!(e.contains("hint:"), "{e}");
    let e = run(
        "[[case]]\nid = \"ok\"\nquestion = \"q\"\nsql = \"SELECT 1\"\n\n[[case]]\nid = \"broken\"\nquestion = \"q\"\nsql = \"SELECT nope FROM sales\"\n",
    );
    assert!(
        e.contains("case `broken` (line 6): the expected value's SQL failed"),
        "{e}"
    );
    assert!(e.contains("nope"), "{e}");
    let e =
        run("[[case]]\nid = \"a\"\nquestion = \"q\"\nsql = \"SELECT region FROM sales LIMIT 2\"\n");
    assert!(e.contains("expects one value, there are 2"), "{e}");
    assert_eq!(model.requests().len(), 0, "no question was asked");

    // No model: the scripted analyst answers only the demo's question, so say what to set.
    let out = dataref(
        None,
        "evaluator-bad",
        &["eval", shipped_suite().to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("has no model endpoint"), "{stderr}");
    assert!(stderr.contains("DATAREF_LLM_URL"), "{stderr}");
}

#[test]
fn a_finished_session_becomes_an_eval_case_that_eval_accepts() {
    let db = sample_db();
    let sql = "SELECT sum(revenue) FROM sales WHERE region = 'LATAM' AND date >= '2025-10-01'";
    let value: f64 = db.query_row(sql, [], |r| r.get(0)).unwrap();
    let question = "How much revenue did LATAM make in Q4 2025?";
    let answer = format!("LATAM made {} in Q4 2025.", written(value));
    let case = Case {
        id: "asked".into(),
        kind: String::new(),
        sql: sql.into(),
        matching: "number".into(),
    };
    let questions = BTreeMap::from([("asked".to_owned(), question.to_owned())]);
    let answers = BTreeMap::from([("asked".to_owned(), answer)]);
    // Once for `ask`, once for the eval of the exported case.
    let model = model_for(&[case], &questions, answers, 2);
    let out = dataref(
        Some(&model),
        "evaluator-export",
        &["ask", "--json", question],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let session = v["session"].as_str().unwrap();

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("case.toml");
    let out = dataref(
        Some(&model),
        "evaluator-export",
        &[
            "sessions",
            "export",
            "--eval",
            session,
            "-o",
            file.to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&file).unwrap();
    let v: toml::Table = toml::from_str(&text).expect("TOML");
    let exported = &v["case"][0];
    assert_eq!(exported["question"].as_str(), Some(question));
    assert_eq!(exported["sql"].as_str(), Some(sql));
    assert_eq!(exported["source"].as_str(), Some("sample"));
    assert_eq!(exported["match"].as_str(), Some("number"));

    let out = dataref(
        Some(&model),
        "evaluator-export",
        &[
            "eval",
            file.to_str().unwrap(),
            "--json",
            "--min-accuracy",
            "1",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["totals"]["accuracy"], 1.0);
    assert_eq!(v["totals"]["grounded_rate"], 1.0);
    assert!((v["cases"][0]["expected"][0].as_f64().unwrap() - value).abs() < 1e-6);
}

#[test]
#[ignore = "asks the model of DATAREF_LLM_URL (costs tokens): cargo test --workspace --test it -- --ignored eval::the_shipped_suite_against_a_real_model"]
fn the_shipped_suite_against_a_real_model() {
    let url = std::env::var_os("DATAREF_LLM_URL").expect(
        "set DATAREF_LLM_URL (and DATAREF_LLM_MODEL, DATAREF_LLM_API_KEY) to the model to evaluate",
    );
    let suite = shipped_suite();
    let n = cases(&suite).len();
    let out = Command::new(BIN)
        .args(["eval", suite.to_str().unwrap(), "--json", "--home"])
        .arg(home())
        .env_remove("DATAREF_CONFIG")
        .env("DATAREF_LLM_URL", url)
        .env("DATAREF_PRINCIPAL", "evaluator-real")
        .output()
        .expect("run dataref eval");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let v: Value = serde_json::from_str(&stdout).expect("one JSON object");
    // What the model scored is the report's business; that every case was asked and
    // answered through the loop is the test's.
    assert_eq!(v["totals"]["runs"], n);
    assert!(v["totals"]["prompt_tokens"].as_u64().unwrap() > 0);
    let stopped: Vec<&Value> = v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["results"][0]["stopped"] == "model_error")
        .collect();
    assert!(
        stopped.is_empty(),
        "the model could not be reached: {stopped:?}"
    );
    eprintln!("{stderr}");
}
