//! `run_python` through `execute_tool_call`: the real sandbox, the real store and workspace.
//!
//! Every test shares one prewarmed sandbox (two warm slots, refilled one at a time), so
//! each run costs a sandbox start: checks that need no code to run are made without one.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use dataref_builtins::{RUNS_DIR, STREAM_SHOWN_BYTES};
use dataref_protocol::Principal;
use dataref_sandbox::pool::{PythonSandbox, SandboxSettings};
use dataref_sandbox::runtime::RuntimeSpec;
use dataref_tool::{NoProgress, RunContext, ToolCall, execute_tool_call};
use dataref_workspace::{Overwrite, Workspace};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::{Fixture, error_text, fixture_full, run};

/// A dataRef nobody minted.
pub(super) const RANDOM_REF: &str = "data_AAAAAAAAAAAAAAAAAAAAAA";

/// The runtime the sandbox crate's tests provision, shared (PyPI is hit once per target dir).
fn runtime_home() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dataref-runtime-home")
}

pub(super) fn sandbox() -> Arc<PythonSandbox> {
    static SANDBOX: OnceLock<Arc<PythonSandbox>> = OnceLock::new();
    Arc::clone(SANDBOX.get_or_init(|| {
        let config = dataref_config::Config::builtin_sample(runtime_home(), 10);
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

fn fixture() -> Fixture {
    fixture_full(
        |limits| limits.tool_timeout = Duration::from_secs(120),
        Some(sandbox()),
    )
}

async fn fetch_since(f: &Fixture, since: &str) -> (String, u64) {
    let o = run(f, ToolCall::new("fetch_sales", json!({"since": since}))).await;
    assert!(!o.is_error(), "{}", o.text);
    let d = o.structured.unwrap();
    (
        d["dataRef"].as_str().unwrap().to_owned(),
        d["rows"].as_u64().unwrap(),
    )
}

pub(super) async fn fetch(f: &Fixture) -> String {
    fetch_since(f, "2020-01-01").await.0
}

/// A `run_python` call that produced a result (`ok` may still be false).
pub(super) async fn python(f: &Fixture, args: Value) -> Value {
    let o = run(f, ToolCall::new("run_python", args)).await;
    assert!(!o.is_error(), "{}", o.text);
    let v = o.structured.unwrap();
    assert_eq!(serde_json::to_string(&v).unwrap(), o.text);
    // Clients validate structured content against the declared output schema (the MCP
    // Python SDK refuses the result otherwise): every answer must fit it.
    let spec = f.registry.get("run_python").unwrap().spec().clone();
    let validator = jsonschema::validator_for(spec.output_schema.as_ref().unwrap()).unwrap();
    let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "output schema violated: {errors:?}\n{v}");
    v
}

/// A `run_python` call the tool refused, as the model reads it.
async fn refused(f: &Fixture, args: Value) -> String {
    error_text(&run(f, ToolCall::new("run_python", args)).await)
}

/// The same store, another caller with a workspace of their own.
pub(super) fn as_bob(f: &Fixture) -> RunContext {
    let principal = Principal::new("bob").unwrap();
    let workspace = Arc::new(Workspace::for_principal(f.home.path(), &principal).unwrap());
    RunContext {
        principal,
        workspace,
        ..f.ctx.clone()
    }
}

/// A file of the caller's workspace, read through the workspace API.
fn workspace_file(f: &Fixture, path: &str) -> Vec<u8> {
    let ws = &f.ctx.workspace;
    let mut file = ws.open_read(&ws.resolve(path).unwrap()).unwrap();
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut file, &mut bytes).unwrap();
    bytes
}

fn workspace_has(f: &Fixture, path: &str) -> bool {
    let ws = &f.ctx.workspace;
    ws.resolve(path).is_ok_and(|p| ws.metadata(&p).is_ok())
}

/// `(line, code)` of each traceback frame, outermost first.
fn traceback(out: &Value) -> Vec<(u64, String)> {
    out["error"]["traceback"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["line"].as_u64().unwrap(),
                f["code"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// A failed run: `ok` false, no result, nothing stored. (A run that worked has no `ok`.)
fn assert_failed(out: &Value, kind: &str) {
    assert_eq!(out["ok"], json!(false), "{out}");
    assert_eq!(out["error"]["type"], json!(kind), "{out}");
    assert_eq!(out["result"], Value::Null, "{out}");
    assert_eq!(out.get("outputs"), None, "{out}");
}

fn hint(out: &Value) -> &str {
    out["error"]["hint"]
        .as_str()
        .unwrap_or_else(|| panic!("no hint in {out}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn totals_come_back_as_result_and_a_new_artifact() {
    let f = fixture();
    let sales = fetch(&f).await;
    let out = python(
        &f,
        json!({
            "code": "t = sales.groupby('line', as_index=False)['revenue'].sum()\nresult = {'rows': len(sales), 'lines': len(t)}\noutputs['totals'] = t\nprint('done')",
            "inputs": {"sales": sales},
        }),
    )
    .await;
    assert_eq!(out.get("ok"), None, "{out}");
    assert!(out.get("error").is_none(), "{out}");
    assert_eq!(out["result"]["rows"], json!(2000));
    assert_eq!(out["stdout"], json!({"text": "done\n"}));
    assert_eq!(out.get("stderr"), None, "nothing printed, no field");
    let totals = &out["outputs"]["totals"];
    let lines = out["result"]["lines"].as_u64().unwrap();
    assert!(lines > 1, "{out}");
    assert_eq!(totals["rows"].as_u64().unwrap(), lines);
    let columns: Vec<&String> = totals["columns"].as_object().unwrap().keys().collect();
    assert_eq!(columns, ["line", "revenue"], "{totals}");
    let totals_ref = totals["dataRef"].as_str().unwrap();
    assert_ne!(totals_ref, sales);

    // The new dataRef is the caller's: described and listed like any producer's result.
    let d = run(
        &f,
        ToolCall::new("describe_data", json!({"dataRef": totals_ref})),
    )
    .await;
    assert!(!d.is_error(), "{}", d.text);
    assert_eq!(d.structured.unwrap()["rows"].as_u64(), Some(lines));
    let listed = run(&f, ToolCall::new("list_artifacts", json!({}))).await;
    assert!(listed.text.contains(totals_ref), "{}", listed.text);

    // Anyone else gets the answer an unknown reference gets, word for word, whether they
    // describe it or pass it to their own run.
    let bob = as_bob(&f);
    let ask = |tool: &str, args: Value| {
        let call = ToolCall::new(tool, args);
        let registry = &f.registry;
        let bob = &bob;
        async move { error_text(&execute_tool_call(registry, call, bob).await) }
    };
    for (tool, args) in [
        ("describe_data", json!({"dataRef": "REF"})),
        (
            "run_python",
            json!({"code": "result = len(t)", "inputs": {"t": "REF"}}),
        ),
    ] {
        let with = |r: &str| serde_json::from_str(&args.to_string().replace("REF", r)).unwrap();
        let foreign = ask(tool, with(totals_ref)).await;
        let unknown = ask(tool, with(RANDOM_REF)).await;
        assert_eq!(foreign, unknown, "{tool}");
        assert!(foreign.contains("is unknown or expired"), "{foreign}");
        assert!(!foreign.contains(totals_ref), "{foreign}");
        assert!(foreign.contains("\nhint: "), "{foreign}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn two_inputs_arrive_as_two_dataframes() {
    let f = fixture();
    let (all, all_rows) = fetch_since(&f, "2020-01-01").await;
    let (recent, recent_rows) = fetch_since(&f, "2025-06-01").await;
    assert_ne!(all_rows, recent_rows);
    let out = python(
        &f,
        json!({
            "code": "result = {'all': len(everything), 'recent': len(recent), \
                     'same_columns': list(everything.columns) == list(recent.columns), \
                     'revenue': float(recent['revenue'].sum())}",
            "inputs": {"everything": all, "recent": recent},
        }),
    )
    .await;
    assert_eq!(out.get("ok"), None, "{out}");
    assert_eq!(out["result"]["all"].as_u64(), Some(all_rows), "{out}");
    assert_eq!(out["result"]["recent"].as_u64(), Some(recent_rows), "{out}");
    assert_eq!(out["result"]["same_columns"], json!(true), "{out}");
    assert!(out["result"]["revenue"].as_f64().unwrap() > 0.0, "{out}");
}

/// Every refusal that needs no code to run, as the model reads it.
#[tokio::test(flavor = "multi_thread")]
async fn what_the_model_reads_when_a_run_is_refused() {
    let f = fixture();
    let sales = fetch(&f).await;
    f.ctx
        .workspace
        .write_atomic("notes.txt", b"hello", Overwrite::Refuse)
        .unwrap();
    let code = "result = 1";
    f.ctx
        .workspace
        .write_atomic("scripts/ok.py", b"result = 1\n", Overwrite::Refuse)
        .unwrap();
    // One byte over the cap, comments only (it would run if it were taken).
    let mut big = "# padding\n".repeat(104_858).into_bytes();
    big.truncate((1 << 20) + 1);
    f.ctx
        .workspace
        .write_atomic("scripts/big.py", &big, Overwrite::Refuse)
        .unwrap();
    f.ctx
        .workspace
        .write_atomic(
            "scripts/latin1.py",
            b"name = '\xe9t\xe9'\n",
            Overwrite::Refuse,
        )
        .unwrap();
    f.ctx
        .workspace
        .write_atomic("scripts/empty.py", b"\n  \n", Overwrite::Refuse)
        .unwrap();
    let cases: Vec<(&str, Value)> = vec![
        ("missing_code", json!({"inputs": {"sales": sales}})),
        (
            "code_and_code_file",
            json!({"code": code, "code_file": "scripts/ok.py"}),
        ),
        ("code_file_missing", json!({"code_file": "scripts/nope.py"})),
        ("code_file_escapes", json!({"code_file": "../x.py"})),
        ("code_file_absolute", json!({"code_file": "/etc/passwd"})),
        ("code_file_directory", json!({"code_file": "scripts"})),
        ("code_file_too_big", json!({"code_file": "scripts/big.py"})),
        (
            "code_file_not_utf8",
            json!({"code_file": "scripts/latin1.py"}),
        ),
        ("code_file_empty", json!({"code_file": "scripts/empty.py"})),
        (
            "unknown_ref",
            json!({"code": code, "inputs": {"sales": RANDOM_REF}}),
        ),
        (
            "name_not_identifier",
            json!({"code": code, "inputs": {"2024-sales": sales}}),
        ),
        (
            "name_reserved_pd",
            json!({"code": code, "inputs": {"pd": sales}}),
        ),
        (
            "name_reserved_result",
            json!({"code": code, "inputs": {"result": sales}}),
        ),
        (
            "name_keyword",
            json!({"code": code, "inputs": {"class": sales}}),
        ),
        (
            "name_builtin",
            json!({"code": code, "inputs": {"len": sales}}),
        ),
        ("file_escapes", json!({"code": code, "files": ["../x"]})),
        (
            "file_missing",
            json!({"code": code, "files": ["nothere.csv"]}),
        ),
        ("timeout_over_max", json!({"code": code, "timeout_s": 601})),
        (
            "timeout_over_schema",
            json!({"code": code, "timeout_s": 4000}),
        ),
    ];
    let mut all = String::new();
    for (name, args) in cases {
        all.push_str(&format!("## {name}\n{}\n\n", refused(&f, args).await));
    }
    // `notes.txt` exists and is fine: only the refused arguments were the problem.
    let ok_file = refused(
        &f,
        json!({"code": code, "files": ["notes.txt"], "inputs": {"class": sales}}),
    )
    .await;
    assert!(ok_file.contains("`class`"), "{ok_file}");
    insta::assert_snapshot!("python_refusals", all);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_input_name_says_why_with_a_hint() {
    let f = fixture();
    let sales = fetch(&f).await;
    for (name, why) in [
        ("2024-sales", "identifier"),
        ("my sales", "identifier"),
        ("pd", "`pd`"),
        ("result", "`result`"),
        ("outputs", "`outputs`"),
        ("class", "keyword"),
        ("lambda", "keyword"),
    ] {
        let text = refused(&f, json!({"code": "result = 1", "inputs": {name: sales}})).await;
        assert!(
            text.starts_with(&format!("error: input name `{name}` is not allowed")),
            "{text}"
        );
        assert!(text.contains(why), "{name}: {text}");
        assert_eq!(text.matches("\nhint: ").count(), 1, "{text}");
        assert!(text.contains("identifier"), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_result_over_the_cap_or_not_json_is_refused_with_a_hint() {
    let f = fixture();
    let (big, odd) = tokio::join!(
        python(
            &f,
            json!({"code": "result = list(range(2000))\noutputs['x'] = pd.DataFrame({'a': [1]})"}),
        ),
        python(
            &f,
            json!({"code": "result = {'when': 1, 'what': object()}"})
        ),
    );

    assert_failed(&big, "ResultTooLarge");
    let message = big["error"]["message"].as_str().unwrap();
    assert!(message.contains("4096"), "{message}");
    assert!(hint(&big).contains("outputs[\"name\"]"), "{big}");
    assert!(big["error"].get("traceback").is_none(), "{big}");

    assert_failed(&odd, "ResultNotSerializable");
    let message = odd["error"]["message"].as_str().unwrap();
    assert!(message.contains("`object`"), "{message}");
    assert!(message.contains("result['what']"), "{message}");
    assert!(hint(&odd).contains("str()"), "{odd}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_exception_names_its_type_and_the_users_lines() {
    let f = fixture();
    let code = "def pick(d):\n    x = 1\n    return d['b']\n\n\
                open('out/files/before.txt', 'w').write('saved before the error')\n\
                result = pick({'a': 1})\n";
    let out = python(&f, json!({"code": code})).await;
    assert_failed(&out, "KeyError");
    assert_eq!(out["error"]["message"], json!("'b'"));
    assert_eq!(
        traceback(&out),
        [
            (6, "result = pick({'a': 1})".to_owned()),
            (3, "return d['b']".to_owned()),
        ],
        "{out}"
    );
    assert!(hint(&out).contains("df.columns"), "{out}");
    // Nothing of the runner or pandas leaks into what the model reads.
    assert!(!out.to_string().contains("runner.py"), "{out}");
    // A file written before the exception is still the person's.
    assert_eq!(out["files"][0]["path"], json!("before.txt"), "{out}");
    assert_eq!(workspace_file(&f, "before.txt"), b"saved before the error");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_module_says_there_is_no_network() {
    let f = fixture();
    let out = python(&f, json!({"code": "import pandas\nimport requests\n"})).await;
    assert_failed(&out, "ModuleNotFoundError");
    assert!(
        out["error"]["message"]
            .as_str()
            .unwrap()
            .contains("'requests'"),
        "{out}"
    );
    assert_eq!(traceback(&out), [(2, "import requests".to_owned())]);
    assert!(hint(&out).contains("no network"), "{out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn long_stdout_and_stderr_are_cut_and_kept_whole_in_the_workspace() {
    let f = fixture();
    let line =
        |stream: &str, c: char, i: usize| format!("{stream} {i:04} {}\n", c.to_string().repeat(40));
    let whole_out: String = (0..200).map(|i| line("out", 'o', i)).collect();
    let whole_err: String = (0..150).map(|i| line("err", 'e', i)).collect();
    let out = python(
        &f,
        json!({"code": "import sys\n\
                        for i in range(200):\n    print(f'out {i:04} ' + 'o' * 40)\n\
                        for i in range(150):\n    print(f'err {i:04} ' + 'e' * 40, file=sys.stderr)\n\
                        result = 'printed'"}),
    )
    .await;
    assert_eq!(out.get("ok"), None, "{out}");
    assert_eq!(out["result"], json!("printed"));

    let mut kept = Vec::new();
    for (name, whole) in [("stdout", &whole_out), ("stderr", &whole_err)] {
        let s = &out[name];
        let text = s["text"].as_str().unwrap();
        let half = STREAM_SHOWN_BYTES / 2;
        assert!(text.starts_with(&whole[..half]), "{name}: {text}");
        assert!(
            text.ends_with(&whole[whole.len() - half..]),
            "{name}: {text}"
        );
        assert!(
            text.len() < STREAM_SHOWN_BYTES + 100,
            "{name}: {} bytes",
            text.len()
        );
        let omitted = s["omittedBytes"].as_u64().unwrap();
        assert_eq!(omitted as usize, whole.len() - STREAM_SHOWN_BYTES, "{name}");
        assert!(text.contains(&format!("{omitted} bytes")), "{name}: {text}");
        let full = s["fullText"].as_str().unwrap().to_owned();
        assert!(full.starts_with(&format!("{RUNS_DIR}/")), "{full}");
        assert_eq!(
            String::from_utf8(workspace_file(&f, &full)).unwrap(),
            *whole,
            "{name}"
        );
        kept.push(full);
    }
    assert_ne!(kept[0], kept[1]);

    // The model can read it with its own tool.
    let o = run(
        &f,
        ToolCall::new(
            "read_file",
            json!({"path": kept[0], "offset": 101, "limit": 1}),
        ),
    )
    .await;
    assert!(!o.is_error(), "{}", o.text);
    let read = o.structured.unwrap();
    assert_eq!(read["totalLines"], json!(200), "{read}");
    assert_eq!(
        read["text"],
        json!(format!("   101\t{}", line("out", 'o', 100).trim_end())),
        "{read}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn files_come_in_from_the_workspace_and_go_back_to_it() {
    let f = fixture();
    f.ctx
        .workspace
        .write_atomic(
            "data/q1.csv",
            b"region,revenue\nnorth,10.5\nsouth,4\nnorth,1.5\n",
            Overwrite::Refuse,
        )
        .unwrap();
    let args = json!({
        "code": "df = pd.read_csv('in/files/data/q1.csv')\n\
                 t = df.groupby('region', as_index=False)['revenue'].sum()\n\
                 t.to_csv('out/files/report.csv', index=False)\n\
                 result = float(df['revenue'].sum())",
        "files": ["data/q1.csv"],
    });
    let report = b"region,revenue\nnorth,12.0\nsouth,4.0\n";

    let first = python(&f, args.clone()).await;
    assert_eq!(first.get("ok"), None, "{first}");
    assert_eq!(first["result"], json!(16.0));
    assert_eq!(
        first["files"],
        json!([{"path": "report.csv", "bytes": report.len()}]),
        "{first}"
    );
    assert_eq!(workspace_file(&f, "report.csv"), report);

    // The same run again replaces the file, and says so.
    f.ctx
        .workspace
        .write_atomic("report.csv", b"stale", Overwrite::Replace)
        .unwrap();
    let again = python(&f, args).await;
    assert_eq!(
        again["files"],
        json!([{"path": "report.csv", "bytes": report.len(), "replaced": true}]),
        "{again}"
    );
    assert_eq!(workspace_file(&f, "report.csv"), report);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_runaway_loop_stops_at_its_own_timeout() {
    let f = fixture();
    let started = Instant::now();
    let out = python(&f, json!({"code": "while True:\n    pass", "timeout_s": 1})).await;
    let took = started.elapsed();
    assert_failed(&out, "Timeout");
    assert!(
        out["error"]["message"].as_str().unwrap().contains("1 s"),
        "{out}"
    );
    assert!(hint(&out).contains("timeout_s"), "{out}");
    // Stopped by its own second (the job's time, from the hand-off), not by the call's 120 s
    // (the wall clock also counts waiting for a sandbox while other tests hold them).
    assert_eq!(
        out.get("durationMs"),
        None,
        "the model has no use for it: {out}"
    );
    assert!(took < Duration::from_secs(60), "{took:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn cancelling_the_call_stops_the_job() {
    let f = fixture();
    let ctx = f
        .ctx
        .for_call(Arc::new(NoProgress), CancellationToken::new());
    let cancel = ctx.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        cancel.cancel();
    });
    let started = Instant::now();
    let o = execute_tool_call(
        &f.registry,
        ToolCall::new(
            "run_python",
            json!({"code": "import time\ntime.sleep(1.5)\nopen('out/files/late.txt', 'w').write('x')"}),
        ),
        &ctx,
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(error_text(&o), "error: `run_python` was cancelled");
    // A job that went on would have saved its file by now.
    tokio::time::sleep(Duration::from_secs(5).saturating_sub(started.elapsed())).await;
    assert!(
        !workspace_has(&f, "late.txt"),
        "the job ran on after the cancel"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn run_python_is_listed_with_a_schema_that_takes_code_or_code_file() {
    let f = fixture();
    assert!(f.registry.names().contains(&"run_python".to_owned()));
    let spec = f.registry.get("run_python").unwrap().spec();
    assert_eq!(spec.name, "run_python");
    let schema = &spec.input_schema;
    assert_eq!(schema["type"], json!("object"));
    // Exactly one of the two is checked by the tool (with a hint), not by the schema.
    assert!(
        schema
            .get("required")
            .is_none_or(|r| r.as_array().unwrap().is_empty()),
        "{schema}"
    );
    let mut params: Vec<&String> = schema["properties"].as_object().unwrap().keys().collect();
    params.sort();
    assert_eq!(
        params,
        ["code", "code_file", "files", "inputs", "timeout_s"]
    );
    let validator = jsonschema::validator_for(schema).unwrap();
    assert!(validator.is_valid(&json!({"code": "result = 1"})));
    assert!(validator.is_valid(&json!({"code_file": "scripts/a.py"})));
    assert!(!validator.is_valid(&json!({"code": ""})));
    assert!(!validator.is_valid(&json!({"code_file": 3})));
    for needle in [
        "without network",
        "`inputs`",
        "`outputs[\"name\"] = df`",
        "out/files/",
        "4096 bytes",
        "60 s",
    ] {
        assert!(
            spec.description.contains(needle),
            "{needle}: {}",
            spec.description
        );
    }
    // Where the arguments' own words say it: a script kept in a file, files read in.
    let said = |arg: &str| schema["properties"][arg]["description"].as_str().unwrap();
    assert!(said("code_file").contains("instead of `code`"), "{schema}");
    assert!(said("files").contains("in/files/<path>"), "{schema}");
    // It writes (artifacts, workspace files), so it is not announced as read-only.
    assert!(!spec.annotations.read_only);
    let output = spec.output_schema.as_ref().unwrap();
    // Only `result` is always there: `ok`, the streams and `outputs` are left out when
    // constant or empty.
    let required = output["required"].as_array().unwrap();
    assert!(required.contains(&json!("result")), "{output}");
    for field in ["ok", "stdout", "stderr", "outputs"] {
        assert!(!required.contains(&json!(field)), "{field}: {output}");
    }
}

/// A script kept in the workspace: a run writes it, the next runs take it by path, and a
/// traceback points at the file's own lines.
#[tokio::test(flavor = "multi_thread")]
async fn a_code_file_runs_from_the_workspace_with_its_own_line_numbers() {
    let f = fixture();
    let sales = fetch(&f).await;
    let script = "# report: revenue by line\n\
                  \n\
                  def totals(df):\n\
                  \x20   return df.groupby('line', as_index=False)['revenue'].sum()\n\
                  \n\
                  t = totals(sales)\n\
                  outputs['totals'] = t\n\
                  result = {'lines': len(t), 'first': t['line'].iloc[0]}\n";
    // Written once by a run, as the description teaches.
    let saved = python(
        &f,
        json!({"code": format!(
            "import os\nos.makedirs('out/files/scripts', exist_ok=True)\n\
             open('out/files/scripts/report.py', 'w').write({script:?})"
        )}),
    )
    .await;
    assert_eq!(saved.get("ok"), None, "{saved}");
    assert_eq!(workspace_file(&f, "scripts/report.py"), script.as_bytes());

    // Padded with comments to exactly the cap: still taken.
    let mut padded = script.to_owned();
    padded.push_str(&"#".repeat((1 << 20) - script.len() - 1));
    padded.push('\n');
    assert_eq!(padded.len(), 1 << 20);
    f.ctx
        .workspace
        .write_atomic("scripts/padded.py", padded.as_bytes(), Overwrite::Refuse)
        .unwrap();
    for path in ["scripts/report.py", "scripts/padded.py"] {
        let out = python(&f, json!({"code_file": path, "inputs": {"sales": sales}})).await;
        assert_eq!(out.get("ok"), None, "{path}: {out}");
        assert!(out["result"]["lines"].as_u64().unwrap() > 1, "{out}");
        assert!(out["outputs"]["totals"]["dataRef"].is_string(), "{out}");
    }

    // An error deep in the file: the traceback gives the file's lines, caller first.
    f.ctx
        .workspace
        .write_atomic(
            "scripts/broken.py",
            script.replace("['revenue']", "['revenu']").as_bytes(),
            Overwrite::Refuse,
        )
        .unwrap();
    let out = python(
        &f,
        json!({"code_file": "scripts/broken.py", "inputs": {"sales": sales}}),
    )
    .await;
    assert_failed(&out, "KeyError");
    assert_eq!(
        traceback(&out),
        [
            (6, "t = totals(sales)".to_owned()),
            (
                4,
                "return df.groupby('line', as_index=False)['revenu'].sum()".to_owned()
            ),
        ],
        "{out}"
    );
}

/// Model code that writes its own output file and `result.json` (it shares a process with
/// the runner), the file a valid Arrow file whose footer's first block has a negative body
/// length.
const HOSTILE_OUTPUT: &str = r#"
import json, os, struct
import pyarrow as pa
t = pa.table({'n': [1, 2, 3]})
with pa.OSFile('out/outputs/evil.arrow', 'wb') as sink:
    with pa.ipc.new_file(sink, t.schema) as w:
        w.write_table(t)
b = bytearray(open('out/outputs/evil.arrow', 'rb').read())
flen = int.from_bytes(b[-10:-6], 'little')
fstart = len(b) - 10 - flen
# The first record batch follows the schema message: 8 bytes of magic, then the schema's
# continuation marker, length and flatbuffer.
slen = int.from_bytes(b[12:16], 'little')
off = 8 + 8 + slen
at = b.index(struct.pack('<q', off), fstart)
b[at + 16:at + 24] = struct.pack('<q', -1)
open('out/outputs/evil.arrow', 'wb').write(bytes(b))
open('out/result.json', 'w').write(json.dumps({'ok': True, 'result': 1, 'outputs': ['evil']}))
os._exit(0)
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_hostile_output_file_is_malformed_output_not_a_server_fault() {
    let f = fixture();
    let out = python(&f, json!({"code": HOSTILE_OUTPUT})).await;
    assert_eq!(out["ok"], json!(false), "{out}");
    assert_eq!(out["error"]["type"], json!("OutputMalformed"), "{out}");
    let message = out["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("your output `evil` is malformed:")
            && message.contains("negative body length (-1)"),
        "{message}"
    );
    assert!(hint(&out).contains("outputs[\"evil\"] = df"), "{out}");
    // Nothing was stored, and the server goes on.
    assert_eq!(out.get("outputs"), None, "{out}");
    let again = python(&f, json!({"code": "result = 2"})).await;
    assert_eq!(again["result"], json!(2), "{again}");
}

#[tokio::test(flavor = "multi_thread")]
async fn files_over_the_workspace_quota_are_refused_with_what_to_delete() {
    let f = fixture_full(
        |limits| {
            limits.tool_timeout = Duration::from_secs(120);
            limits.workspace_quota_bytes = 2 << 20;
        },
        Some(sandbox()),
    );
    f.ctx
        .workspace
        .write_atomic(
            "keep/big.bin",
            &vec![0; 1536 << 10],
            dataref_workspace::Overwrite::Refuse,
        )
        .unwrap();
    let o = run(
        &f,
        ToolCall::new(
            "run_python",
            json!({"code": "open('out/files/new.bin', 'wb').write(b'x' * (1 << 20))\nresult = 1"}),
        ),
    )
    .await;
    let text = error_text(&o);
    assert!(
        text.contains("writing `new.bin` would take your workspace over its quota of 2.0 MiB")
            && text.contains("`keep/` (1.5 MiB)"),
        "{text}"
    );
    assert!(!workspace_has(&f, "new.bin"));
}

/// Lists and schemas in a result are bounded by the result's own shape, not by the cap: a
/// run that writes 10,000 files and stores a 100,000-column table still gets a short,
/// whole result (no truncation object) that fits the declared output schema.
#[tokio::test(flavor = "multi_thread")]
async fn ten_thousand_files_and_a_hundred_thousand_columns_stay_a_short_result() {
    let f = fixture();
    let code = "import os\n\
                os.makedirs('out/files/many', exist_ok=True)\n\
                for i in range(10000):\n    open(f'out/files/many/f{i:05}.txt', 'w').write('x')\n\
                outputs['wide'] = pd.DataFrame({f'column_{i:06}': [i] for i in range(100000)})\n\
                result = 'done'";
    let out = python(&f, json!({"code": code})).await;
    let text = out.to_string();
    assert_eq!(out.get("ok"), None, "{text}");
    assert!(
        text.chars().count() <= f.ctx.limits.max_result_chars,
        "{} characters",
        text.len()
    );
    assert!(
        out.get("truncated").is_none(),
        "bounded by construction, not cut"
    );

    let listed = out["files"].as_array().unwrap().len() as u64;
    let skipped = out["skipped"].as_array().map_or(0, |s| s.len() as u64);
    assert!(
        listed <= 50 && skipped <= 50,
        "{listed} files, {skipped} skipped"
    );
    let more_files = out["moreFiles"].as_u64().unwrap_or(0);
    let more_skipped = out["moreSkipped"].as_u64().unwrap_or(0);
    // Past what a run may write, files are skipped with a reason; listed or counted, none
    // is left unsaid.
    assert!(listed + more_files >= 50, "{listed} + {more_files}");
    assert!(more_skipped > 0, "{text}");
    // Which files a run saves past its limit depends on the directory's order (a tmpfs
    // lists newest first): every one listed is in the workspace.
    for file in out["files"].as_array().unwrap() {
        let path = file["path"].as_str().unwrap();
        assert!(workspace_has(&f, path), "{path} was listed but not saved");
    }

    let wide = &out["outputs"]["wide"];
    assert_eq!(wide["columns"].as_object().unwrap().len(), 50, "{wide}");
    assert_eq!(wide["moreColumns"], json!(100_000 - 50), "{wide}");
    assert_eq!(wide["columns"]["column_000000"], json!("integer"), "{wide}");
    let data_ref = wide["dataRef"].as_str().unwrap();

    // The other tools on it stay short too.
    for (tool, args) in [
        ("describe_data", json!({"dataRef": data_ref})),
        ("list_artifacts", json!({})),
    ] {
        let o = run(&f, ToolCall::new(tool, args)).await;
        assert!(!o.is_error(), "{tool}: {}", o.text);
        assert!(
            o.text.chars().count() <= f.ctx.limits.max_result_chars,
            "{tool}: {} characters",
            o.text.len()
        );
        let v = o.structured.unwrap();
        assert!(v.get("truncated").is_none(), "{tool}: {v}");
        if tool == "list_artifacts" {
            let a = &v["artifacts"][0];
            assert_eq!(a["columns"].as_array().unwrap().len(), 20, "{a}");
            assert_eq!(a["moreColumns"], json!(100_000 - 20), "{a}");
        }
    }
}
