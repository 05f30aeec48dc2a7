//! The built-in tools through `execute_tool_call` (real SQLite sample, real store, real
//! workspace, the real sandbox): what each returns and refuses, and what the model reads
//! when a call is wrong, snapshotted. The framework's own branches are tested in
//! `dataref-tool`.
#![expect(
    clippy::disallowed_methods,
    reason = "fixtures build files and hostile trees directly, outside the code under test"
)]
// `allow-unwrap-in-tests` covers `#[test]` functions, not the helpers they share.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers fail by panicking, like the tests that call them"
)]

mod charts;
mod export;
mod files;
mod http_tool;
mod load;
mod postgres;
mod python;
mod replay;
mod sql;
mod view;

use std::sync::Arc;
use std::time::Duration;

use dataref_config::{CallLimits, Config};
use dataref_protocol::Principal;
use dataref_store::{LocalStore, StoreLimits, SystemClock};
use dataref_tool::{
    CallOutcome, NoProgress, RunContext, ToolCall, ToolRegistry, execute_tool_call,
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

struct Fixture {
    /// The data directory; the caller's workspace is `workspaces/alice` in it.
    home: tempfile::TempDir,
    registry: ToolRegistry,
    ctx: RunContext,
}

/// Short timeout and a small result cap, so those branches are quick to reach.
fn fixture() -> Fixture {
    fixture_with(|limits| {
        limits.tool_timeout = Duration::from_millis(300);
        limits.max_result_chars = 4_000;
    })
}

/// The built-in tools for the caller `alice`, with the sample's limits
/// changed by `tweak`.
fn fixture_with(tweak: impl FnOnce(&mut CallLimits)) -> Fixture {
    fixture_full(tweak, None)
}

/// [`fixture_with`], with `run_python` on a sandbox of the test's own.
fn fixture_full(
    tweak: impl FnOnce(&mut CallLimits),
    python: Option<Arc<dataref_sandbox::pool::PythonSandbox>>,
) -> Fixture {
    let home = tempfile::tempdir().unwrap();
    let mut config = Config::builtin_sample(home.path().to_owned(), 2_000);
    tweak(&mut config.limits);
    dataref_sources::ensure_sample(config.sample.as_ref().unwrap(), &|_| {}).unwrap();
    let store =
        LocalStore::open(home.path(), StoreLimits::default(), Arc::new(SystemClock)).unwrap();
    let registry = dataref_builtins::builtin_registry_with(&config, python).unwrap();
    let principal = Principal::new("alice").unwrap();
    let workspace = Arc::new(
        dataref_workspace::Workspace::for_principal(home.path(), &principal)
            .unwrap()
            .with_quota(config.limits.workspace_quota_bytes)
            .unwrap(),
    );
    let ctx = RunContext {
        principal,
        store: Arc::new(store),
        workspace,
        limits: config.limits.clone(),
        progress: Arc::new(NoProgress),
        cancel: CancellationToken::new(),
        clock: Arc::new(SystemClock),
    };
    Fixture {
        home,
        registry,
        ctx,
    }
}

async fn run(f: &Fixture, call: ToolCall) -> CallOutcome {
    execute_tool_call(&f.registry, call, &f.ctx).await
}

/// The error text with the random parts taken out.
fn error_text(o: &CallOutcome) -> String {
    assert!(o.is_error(), "expected an error, got {}", o.text);
    assert!(o.structured.is_none());
    let mut out = String::new();
    let mut rest = o.text.as_str();
    while let Some(i) = rest.find("data_") {
        out.push_str(&rest[..i]);
        let candidate = rest.get(i..i + 27).unwrap_or("");
        if dataref_protocol::DataRef::parse(candidate).is_ok() {
            out.push_str("data_REF");
            rest = &rest[i + 27..];
        } else {
            out.push_str("data_");
            rest = &rest[i + 5..];
        }
    }
    out.push_str(rest);
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_column_suggests_the_close_one() {
    let f = fixture();
    let ok = run(
        &f,
        ToolCall::new("fetch_sales", json!({"since": "2025-06-01"})),
    )
    .await;
    assert!(!ok.is_error(), "{}", ok.text);
    let data_ref = ok.structured.as_ref().unwrap()["dataRef"].clone();
    let o = run(
        &f,
        ToolCall::new(
            "describe_data",
            json!({"dataRef": data_ref, "columns": ["Revenu"]}),
        ),
    )
    .await;
    insta::assert_snapshot!("unknown_column", error_text(&o));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fetch_returns_a_small_description() {
    let f = fixture();
    let o = run(
        &f,
        ToolCall::from_json_text("fetch_sales", r#"{"since":"2025-01-01"}"#),
    )
    .await;
    assert!(!o.is_error(), "{}", o.text);
    let d = o.structured.unwrap();
    assert_eq!(d["rows"], 2_000);
    assert_eq!(serde_json::to_string(&d).unwrap(), o.text);
    assert!(o.text.len() < 1_500, "{} bytes", o.text.len());
}

/// A named query from config is listed by the same rules as the built-in tools: no
/// `format` (a date or a timestamp says how to write it instead), its declared default
/// kept; its arguments are still checked against its own schema.
#[tokio::test(flavor = "multi_thread")]
async fn a_named_querys_parameters_are_listed_portably() {
    use dataref_config::{ParamConfig, ParamType};
    let mut f = fixture();
    let home = tempfile::tempdir().unwrap();
    let mut config = Config::builtin_sample(home.path().to_owned(), 2_000);
    let mut query = config.queries.get("sales").unwrap().clone();
    query.name = "by_day".into();
    query.sql = "SELECT date, revenue FROM sales WHERE date >= :since AND id > :n".into();
    let param = |name: &str, ty, default: Option<Value>, description: Option<&str>| ParamConfig {
        name: name.into(),
        ty,
        required: false,
        default,
        description: description.map(str::to_owned),
    };
    query.params = vec![
        param(
            "since",
            ParamType::Date,
            Some(json!("2025-01-01")),
            Some("First day"),
        ),
        param("at", ParamType::Timestamp, None, None),
        param("n", ParamType::Integer, Some(json!(0)), None),
    ];
    config.queries.insert("by_day".into(), query);
    f.registry = dataref_builtins::builtin_registry(&config).unwrap();
    let spec = f
        .registry
        .specs()
        .find(|s| s.name == "fetch_by_day")
        .unwrap();
    assert_eq!(
        spec.input_schema["properties"],
        json!({
            "since": {"type": "string", "description": "First day (YYYY-MM-DD)", "default": "2025-01-01"},
            "at": {"type": "string", "description": "RFC 3339"},
            "n": {"type": "integer", "default": 0}
        }),
        "{}",
        spec.input_schema
    );
    // The tool's own schema still knows the formats; the hint says what a date is.
    let o = run(&f, ToolCall::new("fetch_by_day", json!({"n": "one"}))).await;
    assert!(o.is_error());
    assert!(o.text.contains("`since` (string, date)"), "{}", o.text);
}
