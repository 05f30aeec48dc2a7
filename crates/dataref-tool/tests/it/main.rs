//! `execute_tool_call` over the real built-in tools (real SQLite sample, real store, real
//! workspace) and tools that misbehave on purpose: every failure branch becomes a result
//! the model can act on, with its outcome kind, and what it reads is snapshotted.
#![expect(
    clippy::disallowed_methods,
    reason = "fixtures build files and hostile trees directly, outside the code under test"
)]
// `allow-unwrap-in-tests` covers `#[test]` functions, not the helpers they share.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers fail by panicking, like the tests that call them"
)]
#![expect(
    clippy::expect_used,
    reason = "test helpers fail the test on setup errors"
)]

mod outcome;
mod spill;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dataref_config::{CallLimits, Config};
use dataref_protocol::{Principal, ToolSpec};
use dataref_store::{LocalStore, StoreLimits, SystemClock};
use dataref_tool::{
    CallOutcome, NoProgress, RunContext, Tool, ToolCall, ToolError, ToolOutput, ToolRegistry,
    execute_tool_call,
};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

struct Fixture {
    /// The data directory; the caller's workspace is `workspaces/alice` in it.
    home: tempfile::TempDir,
    registry: ToolRegistry,
    ctx: RunContext,
}

/// A tool that misbehaves on purpose: panics, sleeps, or returns far too much.
struct Unruly {
    spec: ToolSpec,
}

impl Unruly {
    fn new() -> Self {
        let mut spec = ToolSpec::from_types::<Value, Value>("unruly", "misbehaves");
        spec.input_schema = json!({
            "type": "object",
            "properties": {"mode": {"type": "string", "enum": ["panic", "sleep", "flood"]}},
            "required": ["mode"],
        });
        Self { spec }
    }
}

#[async_trait]
impl Tool for Unruly {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(
        &self,
        args: Map<String, Value>,
        _: &RunContext,
    ) -> Result<ToolOutput, ToolError> {
        match args["mode"].as_str() {
            Some("panic") => panic!("a bug in a tool"),
            Some("sleep") => {
                tokio::time::sleep(Duration::from_secs(30)).await;
                Ok(ToolOutput::new(json!({})))
            }
            _ => Ok(ToolOutput::new(json!({"rows": "x".repeat(100_000)}))),
        }
    }
}

/// Short timeout and a small result cap, so those branches are quick to reach.
fn fixture() -> Fixture {
    fixture_with(|limits| {
        limits.tool_timeout = Duration::from_millis(300);
        limits.max_result_chars = 4_000;
    })
}

/// The built-in tools (and `unruly`) for the caller `alice`, with the sample's limits
/// changed by `tweak`.
fn fixture_with(tweak: impl FnOnce(&mut CallLimits)) -> Fixture {
    let home = tempfile::tempdir().unwrap();
    let mut config = Config::builtin_sample(home.path().to_owned(), 2_000);
    tweak(&mut config.limits);
    dataref_sources::ensure_sample(config.sample.as_ref().unwrap(), &|_| {}).unwrap();
    let store =
        LocalStore::open(home.path(), StoreLimits::default(), Arc::new(SystemClock)).unwrap();
    let mut builder = ToolRegistry::builder();
    let builtins = dataref_builtins::builtin_registry_with(&config, None).unwrap();
    for name in builtins.names() {
        builder.register(builtins.get(&name).unwrap().clone());
    }
    builder.register(Arc::new(Unruly::new()));
    builder.records_csv(Arc::new(dataref_builtins::ExportCsv));
    let registry = builder.build().unwrap();
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
async fn what_the_model_reads_when_a_call_is_wrong() {
    let f = fixture();
    let cases: Vec<(&str, ToolCall)> = vec![
        (
            "unknown_tool",
            ToolCall::new("fetch_sale", json!({"since": "2025-01-01"})),
        ),
        (
            "broken_json",
            ToolCall::from_json_text("fetch_sales", r#"{"since": "2025-01-01""#),
        ),
        (
            "not_an_object",
            ToolCall::new("fetch_sales", json!(["2025-01-01"])),
        ),
        (
            "wrong_type",
            ToolCall::new("fetch_sales", json!({"since": 20250101})),
        ),
        ("missing_required", ToolCall::new("fetch_sales", json!({}))),
        (
            "unexpected_field",
            ToolCall::new("fetch_sales", json!({"since": "2025-01-01", "until": "x"})),
        ),
        (
            "bad_date",
            ToolCall::new("fetch_sales", json!({"since": "2025-02-30"})),
        ),
        (
            "malformed_ref",
            ToolCall::new("describe_data", json!({"dataRef": "data_123"})),
        ),
        (
            "unknown_ref",
            ToolCall::new(
                "describe_data",
                json!({"dataRef": "data_AAAAAAAAAAAAAAAAAAAAAA"}),
            ),
        ),
        (
            "sql_error",
            ToolCall::new(
                "query",
                json!({"source": "sample", "sql": "SELECT nope FROM sales"}),
            ),
        ),
        (
            "refused_sql",
            ToolCall::new(
                "query",
                json!({"source": "sample", "sql": "DROP TABLE sales"}),
            ),
        ),
        (
            "unknown_source",
            ToolCall::new("query", json!({"source": "crm", "sql": "SELECT 1"})),
        ),
    ];
    let mut all = String::new();
    for (name, call) in cases {
        let o = run(&f, call).await;
        all.push_str(&format!("## {name}\n{}\n\n", error_text(&o)));
    }
    insta::assert_snapshot!("bad_calls", all);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_panicking_tool_is_an_internal_error_and_serving_goes_on() {
    // Not the 300 ms timeout: with `RUST_BACKTRACE=1` the panic hook symbolises a
    // backtrace first, which can take longer than that on a busy machine.
    let f = fixture_with(|limits| limits.max_result_chars = 4_000);
    let o = run(&f, ToolCall::new("unruly", json!({"mode": "panic"}))).await;
    insta::assert_snapshot!("panic", error_text(&o));
    let ok = run(&f, ToolCall::new("list_artifacts", json!({}))).await;
    assert!(!ok.is_error(), "{}", ok.text);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slow_tool_is_stopped_at_the_timeout() {
    let f = fixture();
    let started = std::time::Instant::now();
    let o = run(&f, ToolCall::new("unruly", json!({"mode": "sleep"}))).await;
    assert!(started.elapsed() < Duration::from_secs(10));
    insta::assert_snapshot!("timeout", error_text(&o));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_call_says_so() {
    let f = fixture();
    let ctx = f
        .ctx
        .for_call(Arc::new(NoProgress), CancellationToken::new());
    let cancel = ctx.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        cancel.cancel();
    });
    let o = execute_tool_call(
        &f.registry,
        ToolCall::new("unruly", json!({"mode": "sleep"})),
        &ctx,
    )
    .await;
    assert_eq!(error_text(&o), "error: `unruly` was cancelled");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_oversized_result_is_cut_and_the_cut_is_said() {
    // With spilling off; with it on, the result would be spilled instead (see `spill`).
    let mut f = fixture();
    let mut b = ToolRegistry::builder();
    for name in f.registry.names() {
        b.register(f.registry.get(&name).unwrap().clone());
    }
    b.spill(dataref_config::SpillConfig {
        enabled: false,
        ..Default::default()
    });
    f.registry = b.build().unwrap();
    let o = run(&f, ToolCall::new("unruly", json!({"mode": "flood"}))).await;
    assert!(!o.is_error());
    // Still JSON, still structured, and within the cap: the truncation object, which the
    // listed output schema admits (a client checking it accepts the result).
    assert!(o.text.chars().count() <= 4_000, "{}", o.text.len());
    let t = o.structured.clone().expect("structured content");
    assert_eq!(serde_json::to_string(&t).unwrap(), o.text);
    assert_eq!(t["truncated"], true, "{t}");
    assert_eq!(t["characters"], 100_011, "{t}");
    assert_eq!(t["maxCharacters"], 4_000, "{t}");
    assert!(
        t["preview"]
            .as_str()
            .unwrap()
            .starts_with("{\"rows\":\"xxx"),
        "{t}"
    );
    let spec = f.registry.specs().find(|s| s.name == "unruly").unwrap();
    let validator = jsonschema::validator_for(spec.output_schema.as_ref().unwrap()).unwrap();
    assert!(validator.is_valid(&t), "{t}");
    // The whole is in the workspace, where the hint points.
    let path = t["path"].as_str().unwrap();
    assert!(t["hint"].as_str().unwrap().contains(path), "{t}");
    let whole = f.ctx.workspace.resolve(path).unwrap();
    assert!(f.ctx.workspace.metadata(&whole).unwrap().size > 100_000);
}
