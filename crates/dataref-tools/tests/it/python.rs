//! `run_python` through `execute_tool_call`: the real sandbox, the real store and workspace.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use dataref_sandbox::pool::{PythonSandbox, SandboxSettings};
use dataref_sandbox::runtime::RuntimeSpec;
use dataref_tools::ToolCall;
use serde_json::{Value, json};

use super::{Fixture, fixture_full, run};

/// The runtime the sandbox crate's tests provision, shared (PyPI is hit once per target dir).
fn runtime_home() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dataref-runtime-home")
}

fn sandbox() -> Arc<PythonSandbox> {
    static SANDBOX: OnceLock<Arc<PythonSandbox>> = OnceLock::new();
    Arc::clone(SANDBOX.get_or_init(|| {
        let config = dataref_config::Config::builtin_sample(runtime_home(), 10);
        let settings = SandboxSettings {
            home: runtime_home(),
            runtime: RuntimeSpec::Managed { base: None },
            ..dataref_tools::sandbox_settings(&config)
        };
        let sandbox = Arc::new(PythonSandbox::new(settings));
        sandbox.runtime(&|_| {}).unwrap();
        sandbox.prewarm();
        sandbox
    }))
}

fn fixture() -> Fixture {
    fixture_full(
        |limits| limits.tool_timeout = std::time::Duration::from_secs(120),
        Some(sandbox()),
    )
}

async fn fetch(f: &Fixture) -> String {
    let o = run(
        f,
        ToolCall::new("fetch_sales", json!({"since": "2020-01-01"})),
    )
    .await;
    assert!(!o.is_error, "{}", o.text);
    o.structured.unwrap()["dataRef"]
        .as_str()
        .unwrap()
        .to_owned()
}

async fn python(f: &Fixture, args: Value) -> Value {
    let o = run(f, ToolCall::new("run_python", args)).await;
    assert!(!o.is_error, "{}", o.text);
    o.structured.unwrap()
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
    assert_eq!(out["ok"], json!(true), "{out}");
    assert_eq!(out["result"]["rows"], json!(2000));
    assert_eq!(out["stdout"]["text"], json!("done\n"));
    let totals = &out["outputs"]["totals"];
    let lines = out["result"]["lines"].as_u64().unwrap();
    assert_eq!(totals["rows"].as_u64().unwrap(), lines);
    // The new dataRef is the caller's and can be described like any producer result.
    let d = run(
        &f,
        ToolCall::new("describe_data", json!({"dataRef": totals["dataRef"]})),
    )
    .await;
    assert!(!d.is_error, "{}", d.text);
}
