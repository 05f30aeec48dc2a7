//! A session exported as its reproducible record: the canonical run's history built by
//! hand, checked as nbformat JSON and as a script, and the script run for real against the
//! generated sample with the managed runtime's Python.
#![expect(
    clippy::disallowed_methods,
    reason = "the test writes the script and reads what it wrote in its own temp dirs"
)]

use std::path::PathBuf;
use std::process::Command;

use dataref_agent::record::record;
use dataref_agent::scripted::{QOQ_CODE, QUESTION};
use dataref_agent::{AssistantToolCall, Message, StepOutcome};
use dataref_builtins::replay::{ExportMeta, notebook, script};
use dataref_config::{Config, SourceKind};
use dataref_protocol::{DataRef, Timestamp};
use dataref_sandbox::runtime::Runtime;
use dataref_tool::OutcomeKind;
use serde_json::{Value, json};

/// In the fetch's sample only: must never reach the record.
const SAMPLE_VALUE: &str = "98765.43";
const SAMPLE_TEXT: &str = "Zebra Sample Row";
const ANSWER: &str = "From 2025Q3 to 2025Q4, Alpine Boots lost the most revenue.";

fn data_ref(n: u8) -> String {
    DataRef::from_random_bytes([n; 16]).as_str().to_owned()
}

fn call(id: &str, name: &str, args: Value) -> AssistantToolCall {
    AssistantToolCall {
        id: id.into(),
        name: name.into(),
        arguments: args.to_string(),
    }
}

fn meta() -> ExportMeta {
    ExportMeta {
        session: "s_canonical".into(),
        agent: "default".into(),
        principal: "alice".into(),
        exported: Timestamp::parse_rfc3339("2026-03-01T12:00:00Z").unwrap(),
    }
}

fn config() -> (tempfile::TempDir, Config) {
    let home = tempfile::tempdir().unwrap();
    let config = Config::builtin_sample_with_env(home.path().to_path_buf(), 100, &|_| None);
    (home, config)
}

/// The canonical run as the loop records it.
fn canonical() -> Vec<Message> {
    let (sales, delta, losers) = (data_ref(1), data_ref(2), data_ref(3));
    let fetched = json!({
        "dataRef": sales,
        "rows": 100,
        "columns": {"date": "date", "line": "string", "region": "string", "channel": "string",
                    "units": "integer", "revenue": "float", "discount": "float"},
        "sample": [
            ["2025-01-02", SAMPLE_TEXT, "EMEA", "web", 3, 98765.43, 0.1],
            ["2025-01-03", "Harbor Tent", "APAC", "retail", 1, 120.5, null],
        ],
    });
    let ran = json!({
        "result": {"from": "2025Q3", "to": "2025Q4",
                   "lost_most": [{"line": "Alpine Boots", "delta": -310.0, "pct": -12.5}]},
        "outputs": {
            "qoq_delta": {"dataRef": delta, "rows": 14,
                          "columns": {"line": "string", "previous": "float", "latest": "float",
                                      "delta": "float", "pct": "float"}},
            "biggest_losers": {"dataRef": losers, "rows": 10,
                               "columns": {"line": "string", "delta": "float"}},
        },
    });
    vec![
        Message::user(QUESTION),
        Message::assistant_calls(
            "I'll fetch the sales into an artifact, then compute the change per product line.",
            vec![call(
                "call_1",
                "fetch_sales",
                json!({"since": "2025-01-01"}),
            )],
        ),
        Message::tool(
            "call_1",
            fetched.to_string(),
            StepOutcome::Ran(OutcomeKind::Ok),
        ),
        Message::assistant_calls(
            "",
            vec![call(
                "call_2",
                "run_python",
                json!({"code": QOQ_CODE, "inputs": {"sales": sales}}),
            )],
        ),
        Message::tool("call_2", ran.to_string(), StepOutcome::Ran(OutcomeKind::Ok)),
        Message::assistant_calls(
            "",
            vec![
                call(
                    "call_3",
                    "render_chart",
                    json!({"dataRef": losers, "x": "line", "y": ["delta"], "kind": "bar",
                           "sort": "ascending", "width": 1400,
                           "title": "Revenue change: the \"\"\" biggest losers"}),
                ),
                call(
                    "call_4",
                    "export_data",
                    json!({"source": delta, "format": "csv", "filename": "qoq"}),
                ),
            ],
        ),
        Message::tool(
            "call_3",
            json!({"path": "charts/losers.png", "points": 10}).to_string(),
            StepOutcome::Ran(OutcomeKind::Ok),
        ),
        Message::tool("call_4", "", StepOutcome::Ran(OutcomeKind::Ok)),
        Message::assistant(ANSWER),
    ]
}

fn cell_text(cell: &Value) -> String {
    cell["source"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect()
}

/// nbformat 4.5's structure: what Jupyter refuses to open without.
fn assert_valid_notebook(nb: &Value) {
    assert_eq!(nb["nbformat"], 4);
    assert_eq!(nb["nbformat_minor"], 5);
    assert_eq!(nb["metadata"]["kernelspec"]["name"], "python3");
    assert_eq!(nb["metadata"]["kernelspec"]["language"], "python");
    assert_eq!(nb["metadata"]["language_info"]["name"], "python");
    let cells = nb["cells"].as_array().unwrap();
    assert!(!cells.is_empty());
    let mut ids = std::collections::HashSet::new();
    for cell in cells {
        let id = cell["id"].as_str().unwrap();
        assert!(
            !id.is_empty()
                && id.len() <= 64
                && id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
            "{id}"
        );
        assert!(ids.insert(id.to_owned()), "duplicate cell id {id}");
        assert!(cell["metadata"].is_object());
        let source = cell["source"].as_array().unwrap();
        assert!(source.iter().all(Value::is_string));
        // Every line but the last ends with its newline.
        for l in &source[..source.len().saturating_sub(1)] {
            assert!(l.as_str().unwrap().ends_with('\n'));
        }
        match cell["cell_type"].as_str().unwrap() {
            "code" => {
                assert_eq!(cell["outputs"], json!([]));
                assert!(cell["execution_count"].is_null());
                assert_eq!(cell.as_object().unwrap().len(), 6);
            }
            "markdown" => assert_eq!(cell.as_object().unwrap().len(), 4),
            other => panic!("cell type {other}"),
        }
    }
}

#[test]
fn canonical_session_becomes_a_notebook_and_a_script_without_rows() {
    let (_home, config) = config();
    let history = canonical();
    let nb = notebook(&record(&history), &meta(), &config);
    assert_valid_notebook(&nb);
    let text = serde_json::to_string(&nb).unwrap();
    let py = script(&record(&history), &meta(), &config);
    // The whole script, as a person gets it (the data dir is a temp dir).
    let home = regex_lite_escape(&config.home.display().to_string());
    insta::with_settings!({filters => vec![(home.as_str(), "[HOME]")]}, {
        insta::assert_snapshot!("canonical_script", py);
    });
    let cells = nb["cells"].as_array().unwrap();
    let code: Vec<String> = cells
        .iter()
        .filter(|c| c["cell_type"] == "code")
        .map(cell_text)
        .collect();
    let markdown: Vec<String> = cells
        .iter()
        .filter(|c| c["cell_type"] == "markdown")
        .map(cell_text)
        .collect();
    let all_code = code.join("\n");

    // No rows: neither the sample's values nor its text, in either form.
    for leaked in [SAMPLE_VALUE, SAMPLE_TEXT] {
        assert!(!text.contains(leaked), "{leaked} in the notebook");
        assert!(!py.contains(leaked), "{leaked} in the script");
    }

    // Header: who, when, how to run it.
    let header = &markdown[0];
    for s in [
        "s_canonical",
        "default",
        "alice",
        "2026-03-01T12:00:00Z",
        "pip install pandas pyarrow",
        "psycopg",
    ] {
        assert!(header.contains(s), "header lacks {s}:\n{header}");
    }
    assert!(header.contains(&config.sample.as_ref().unwrap().path.display().to_string()));

    // The question, the query's SQL with `since` as a param, read into `sales_1`.
    assert!(
        markdown
            .iter()
            .any(|m| m.starts_with("## Question") && m.contains(QUESTION))
    );
    let sql = &config.queries["sales"].sql;
    assert!(
        all_code.contains(&serde_json::to_string(sql).unwrap()),
        "{all_code}"
    );
    assert!(all_code.contains("sales_1 = pd.read_sql_query("));
    assert!(
        all_code.contains("params={\"since\": \"2025-01-01\"}"),
        "{all_code}"
    );
    assert!(all_code.contains("parse_dates=[\"date\"]"));

    // The code verbatim, its input bound to the fetch's variable, its outputs kept.
    assert!(code.iter().any(|c| c.contains(QOQ_CODE)));
    assert!(py.contains(QOQ_CODE));
    assert!(all_code.contains("sales = sales_1"));
    assert!(all_code.contains("step2_outputs = "));
    assert!(all_code.contains("step2_result = result"));
    assert!(all_code.contains("# In the session the run returned result = "));

    // The chart from the step's output, guarded when matplotlib is missing; the export.
    assert!(all_code.contains("_table = step2_outputs[\"biggest_losers\"]"));
    assert!(all_code.contains("except ImportError:"));
    assert!(all_code.contains(".plot(kind=\"bar\""));
    assert!(all_code.contains("title=\"Revenue change: the \\\"\\\"\\\" biggest losers\""));
    assert!(markdown.iter().any(|m| m.contains("Shown to the person")));
    assert!(all_code.contains("_export = step2_outputs[\"qoq_delta\"]"));
    assert!(all_code.contains("exports/qoq.csv"));

    // The answer, last.
    assert_eq!(markdown.last().unwrap(), &format!("## Answer\n\n{ANSWER}"));
    assert!(py.contains(&format!("# {ANSWER}")));
}

#[test]
fn postgres_sources_connect_from_the_environment() {
    let (_home, mut config) = config();
    let mut wh = config.sources["sample"].clone();
    wh.name = "wh-eu".into();
    wh.kind = SourceKind::Postgres {
        url: "postgresql://login:s3cret-pw@db.internal/wh".into(),
        pool_size: 4,
        allow_sql_shared_roles: false,
    };
    config.sources.insert("wh-eu".into(), wh);
    let mut q = config.queries["sales"].clone();
    q.name = "eu_sales".into();
    q.source = "wh-eu".into();
    q.sql =
        "SELECT * FROM sales WHERE date >= :since AND note LIKE '50%' AND d::date > now()".into();
    config.queries.insert("eu_sales".into(), q);
    let history = vec![
        Message::user("EU?"),
        Message::assistant_calls(
            "",
            vec![
                call("c1", "fetch_eu_sales", json!({"since": "2025-01-01"})),
                call(
                    "c2",
                    "query",
                    json!({"source": "wh-eu", "sql": "SELECT count(*) FROM sales"}),
                ),
            ],
        ),
        Message::tool(
            "c1",
            json!({"dataRef": data_ref(1), "rows": 5}).to_string(),
            StepOutcome::Ran(OutcomeKind::Ok),
        ),
        Message::tool(
            "c2",
            json!({"dataRef": data_ref(2), "rows": 1}).to_string(),
            StepOutcome::Ran(OutcomeKind::Ok),
        ),
        Message::assistant("Done."),
    ];
    let py = script(&record(&history), &meta(), &config);
    assert!(
        !py.contains("s3cret-pw") && !py.contains("db.internal"),
        "{py}"
    );
    assert!(
        py.contains("os.environ.get(\"DATAREF_SOURCE_WH_EU_URL\")"),
        "{py}"
    );
    assert!(py.contains("import psycopg"));
    assert!(py.contains("con_wh_eu.read_only = True"));
    assert!(
        py.contains("date >= %(since)s AND note LIKE '50%%' AND d::date > now()"),
        "{py}"
    );
    assert!(py.contains("eu_sales_1 = pd.read_sql_query("));
    assert!(
        py.contains(
            "query_2 = pd.read_sql_query(\n    \"SELECT count(*) FROM sales\",\n    con_wh_eu,\n)"
        ),
        "{py}"
    );
    // Only the sources read are connected.
    assert!(!py.contains("con_sample"));
}

#[test]
fn failed_calls_become_notes_and_unknown_refs_comments() {
    let (_home, config) = config();
    let outside = data_ref(9);
    let history = vec![
        Message::user("Again, for 2024?"),
        Message::assistant_calls(
            "",
            vec![
                call("call_1", "fetch_sales", json!({"since": "2024-13-01"})),
                call(
                    "call_2",
                    "render_table",
                    json!({"dataRef": outside, "limit": 5}),
                ),
                call("call_3", "describe_data", json!({"dataRef": outside})),
                call(
                    "call_4",
                    "call_tool",
                    json!({"tool": "post_report", "args_file": "args.json"}),
                ),
                call(
                    "call_5",
                    "run_python",
                    json!({"code": "result = len(t)", "inputs": {"t": outside}}),
                ),
            ],
        ),
        Message::tool(
            "call_1",
            "error: `since`: expected a date `YYYY-MM-DD`, got `2024-13-01`\nhint: fix the date",
            StepOutcome::Ran(OutcomeKind::InvalidArguments),
        ),
        Message::tool(
            "call_2",
            json!({"path": "tables/t.html", "rowsShown": 5}).to_string(),
            StepOutcome::Ran(OutcomeKind::Ok),
        ),
        Message::tool(
            "call_3",
            json!({"dataRef": outside, "rows": 3}).to_string(),
            StepOutcome::Ran(OutcomeKind::Ok),
        ),
        Message::tool(
            "call_4",
            json!({"ok": true}).to_string(),
            StepOutcome::Ran(OutcomeKind::Ok),
        ),
        Message::tool(
            "call_5",
            json!({"result": 3}).to_string(),
            StepOutcome::Ran(OutcomeKind::Ok),
        ),
        Message::assistant("I could not read 2024."),
    ];
    let nb = notebook(&record(&history), &meta(), &config);
    assert_valid_notebook(&nb);
    let cells = nb["cells"].as_array().unwrap();
    let text: Vec<(String, String)> = cells
        .iter()
        .map(|c| (c["cell_type"].as_str().unwrap().to_owned(), cell_text(c)))
        .collect();
    let find = |needle: &str| {
        text.iter()
            .find(|(_, t)| t.contains(needle))
            .unwrap_or_else(|| panic!("no cell with {needle}: {text:#?}"))
            .clone()
    };
    // The failed fetch: a note with the error's first line, and no query ran.
    let (kind, note) = find("failed");
    assert_eq!(kind, "markdown");
    assert!(note.contains("expected a date `YYYY-MM-DD`, got `2024-13-01`"));
    assert!(!note.contains("hint"));
    assert!(!text.iter().any(|(_, t)| t.contains("read_sql_query")));
    // The table of an unknown dataRef: a comment, no code reading it.
    let (kind, c) = find("# Step 2:");
    assert_eq!(kind, "code");
    assert!(c.contains("came from outside this session"), "{c}");
    assert!(!c.contains("_shown ="));
    // Other tools and call_tool: notes naming them and their arguments.
    let (kind, n) = find("`describe_data`");
    assert_eq!(kind, "markdown");
    assert!(n.contains(&outside));
    let (kind, n) = find("`call_tool`");
    assert_eq!(kind, "markdown");
    assert!(n.contains("`post_report`") && n.contains("`args.json`"));
    // A run_python input from outside: a comment instead of a binding.
    let (_, c) = find("result = len(t)");
    assert!(c.contains("# `t` (") && c.contains("came from outside this session"));
    assert!(!c.lines().any(|l| l.starts_with("t = ")), "{c}");
    // No source was read: the setup has no connection.
    let py = script(&record(&history), &meta(), &config);
    assert!(!py.contains("sqlite3.connect("));
}

/// The managed runtime the sandbox tests use (installed from PyPI once per target dir, by
/// whichever test needs it first).
fn runtime_python() -> PathBuf {
    let home = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dataref-runtime-home");
    match Runtime::ensure(&home, &|_| {}) {
        Ok(runtime) => runtime.python,
        Err(e) => panic!(
            "the managed Python runtime (pandas, pyarrow from PyPI) could not be installed \
             under {}: {e}",
            home.display()
        ),
    }
}

#[test]
fn exported_script_runs_against_the_sample() {
    let python = runtime_python();
    let (_home, config) = config();
    dataref_sources::ensure_sample(config.sample.as_ref().unwrap(), &|_| {}).unwrap();
    let work = tempfile::tempdir().unwrap();
    let path = work.path().join("session.py");
    std::fs::write(&path, script(&record(&canonical()), &meta(), &config)).unwrap();
    // Without the opt-in, nothing of the model's code runs.
    let refused = Command::new(&python)
        .arg(&path)
        .current_dir(work.path())
        .env_remove("DATAREF_RUN_AGENT_CODE")
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("DATAREF_RUN_AGENT_CODE=1"));
    assert!(!work.path().join("exports").exists());
    let out = Command::new(&python)
        .arg(&path)
        .current_dir(work.path())
        .env("DATAREF_RUN_AGENT_CODE", "1")
        .env_remove("DATAREF_SOURCE_SAMPLE_PATH")
        .env("MPLCONFIGDIR", work.path().join(".mpl"))
        .env("MPLBACKEND", "Agg")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the script failed:\n{stdout}\n{stderr}"
    );
    let csv = std::fs::read_to_string(work.path().join("exports").join("qoq.csv")).unwrap();
    assert!(csv.starts_with("line,previous,latest,delta,pct\n"), "{csv}");
    assert!(csv.lines().count() > 2, "{csv}");
    assert!(stdout.contains("sales_1: 100 rows"), "{stdout}");
    assert!(stdout.contains("step 2 result:"), "{stdout}");
    assert!(
        work.path().join("charts").join("losers.png").exists(),
        "{stdout}"
    );
}

/// `s` as a regular expression matching itself.
fn regex_lite_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            let special = "\\.+*?()|[]{}^$".contains(c);
            special
                .then_some('\\')
                .into_iter()
                .chain(std::iter::once(c))
        })
        .collect()
}

/// Whether a call failed is the kind the session kept, not how its text starts: a timeout
/// whose text says so in other words is not replayed, and a session written before kinds
/// were kept still knows its `error:` results.
#[test]
fn a_failure_is_known_by_its_outcome_not_its_text() {
    let (_home, config) = config();
    let code = "result = 1";
    let history = vec![
        Message::user("Go"),
        Message::assistant_calls(
            "",
            vec![
                call("a", "run_python", json!({"code": code})),
                call("b", "fetch_sales", json!({"since": "2025-01-01"})),
            ],
        ),
        Message::tool(
            "a",
            "stopped after 30 s",
            StepOutcome::Ran(OutcomeKind::TimedOut),
        ),
        serde_json::from_value(json!({
            "role": "tool",
            "content": "error: the source is down",
            "tool_call_id": "b",
        }))
        .unwrap(),
        Message::assistant("Nothing."),
    ];
    let py = script(&record(&history), &meta(), &config);
    assert!(
        py.contains("`run_python` failed, so it is not reproduced"),
        "{py}"
    );
    assert!(!py.contains(code), "a failed run is not replayed: {py}");
    assert!(
        py.contains("`fetch_sales` failed, so it is not reproduced:\n#\n# > the source is down"),
        "{py}"
    );
}
