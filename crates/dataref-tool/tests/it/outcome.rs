//! Every branch of `execute_tool_call` ends in its own outcome kind, the caller's call id
//! comes back on the outcome, and `is_mutating` follows the read-only annotation.

use std::sync::Arc;

use async_trait::async_trait;
use dataref_protocol::ToolSpec;
use dataref_tool::{
    OutcomeKind, RunContext, Tool, ToolCall, ToolError, ToolOutput, ToolRegistry, execute_tool_call,
};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use crate::{Fixture, fixture, run};

/// A tool whose every call is a server fault.
struct Faulty {
    spec: ToolSpec,
}

#[async_trait]
impl Tool for Faulty {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, _: Map<String, Value>, _: &RunContext) -> Result<ToolOutput, ToolError> {
        Err(ToolError::Fatal("the disk controller said no".into()))
    }
}

/// The fixture's tools and `faulty`, with `spill` on or off.
fn with_faulty(spill: bool) -> Fixture {
    let mut f = fixture();
    let mut b = ToolRegistry::builder();
    for name in f.registry.names() {
        b.register(f.registry.get(&name).expect("listed").clone());
    }
    b.register(Arc::new(Faulty {
        spec: ToolSpec::from_types::<Value, Value>("faulty", "fails"),
    }));
    b.spill(dataref_config::SpillConfig {
        enabled: spill,
        ..Default::default()
    });
    b.records_csv(Arc::new(dataref_builtins::ExportCsv));
    f.registry = b.build().expect("registry");
    f
}

#[tokio::test(flavor = "multi_thread")]
async fn each_branch_has_its_kind() {
    let f = with_faulty(true);
    let cases: Vec<(ToolCall, OutcomeKind)> = vec![
        (ToolCall::new("list_artifacts", json!({})), OutcomeKind::Ok),
        (
            ToolCall::new("unruly", json!({"mode": "flood"})),
            OutcomeKind::Spilled,
        ),
        (
            ToolCall::new("fetch_sale", json!({"since": "2025-01-01"})),
            OutcomeKind::UnknownTool,
        ),
        (
            ToolCall::new("call_tool", json!({"tool": "ech", "args_file": "a.json"})),
            OutcomeKind::UnknownTool,
        ),
        (
            ToolCall::from_json_text("fetch_sales", r#"{"since": "2025-01-01""#),
            OutcomeKind::InvalidArguments,
        ),
        (
            ToolCall::new("fetch_sales", json!(["2025-01-01"])),
            OutcomeKind::InvalidArguments,
        ),
        (
            ToolCall::new("fetch_sales", json!({"since": 20250101})),
            OutcomeKind::InvalidArguments,
        ),
        (
            ToolCall::new(
                "call_tool",
                json!({"tool": "list_artifacts", "args_file": "missing.json"}),
            ),
            OutcomeKind::InvalidArguments,
        ),
        (
            ToolCall::new(
                "describe_data",
                json!({"dataRef": "data_AAAAAAAAAAAAAAAAAAAAAA"}),
            ),
            OutcomeKind::ToolFailed,
        ),
        (ToolCall::new("faulty", json!({})), OutcomeKind::ServerFault),
        (
            ToolCall::new("unruly", json!({"mode": "panic"})),
            OutcomeKind::Panicked,
        ),
        (
            ToolCall::new("unruly", json!({"mode": "sleep"})),
            OutcomeKind::TimedOut,
        ),
    ];
    for (call, kind) in cases {
        let shown = format!("{} {:?}", call.name, call.arguments);
        let o = run(&f, call).await;
        assert_eq!(o.kind, kind, "{shown}: {}", o.text);
        assert_eq!(o.is_error(), kind.is_error(), "{shown}");
    }

    // Over the cap with spilling off: the truncation object.
    let f = with_faulty(false);
    let o = run(&f, ToolCall::new("unruly", json!({"mode": "flood"}))).await;
    assert_eq!(o.kind, OutcomeKind::TooLarge, "{}", o.text);
    assert!(!o.is_error());

    let ctx = f
        .ctx
        .for_call(Arc::new(dataref_tool::NoProgress), CancellationToken::new());
    ctx.cancel.cancel();
    let o = execute_tool_call(
        &f.registry,
        ToolCall::new("unruly", json!({"mode": "sleep"})),
        &ctx,
    )
    .await;
    assert_eq!(o.kind, OutcomeKind::Cancelled, "{}", o.text);
    assert!(o.is_error());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_call_id_comes_back() {
    let f = fixture();
    let o = run(
        &f,
        ToolCall::new("list_artifacts", json!({})).with_id("toolu_42"),
    )
    .await;
    assert_eq!(o.call_id, "toolu_42");
    // On every branch, also a failed one.
    let o = run(&f, ToolCall::new("nope", json!({})).with_id("7")).await;
    assert_eq!(
        (o.call_id.as_str(), o.kind),
        ("7", OutcomeKind::UnknownTool)
    );
    // None given: one is made, a different one each call.
    let a = run(&f, ToolCall::new("list_artifacts", json!({}))).await;
    let b = run(&f, ToolCall::new("list_artifacts", json!({}))).await;
    assert!(a.call_id.starts_with("call-"), "{}", a.call_id);
    assert_ne!(a.call_id, b.call_id);
}

#[test]
fn mutating_follows_the_read_only_annotation() {
    let f = fixture_registry();
    let tool = |name: &str| f.get(name).expect(name).clone();
    assert!(!tool("describe_data").is_mutating(), "read-only");
    assert!(!tool("list_files").is_mutating(), "read-only");
    assert!(tool("copy_file").is_mutating(), "writes a file");
    assert!(tool("call_tool").is_mutating(), "its target may write");
    // A spec that says nothing is not read-only.
    let faulty = Faulty {
        spec: ToolSpec::from_types::<Value, Value>("faulty", "fails"),
    };
    assert!(faulty.is_mutating());
}

fn fixture_registry() -> ToolRegistry {
    let home = tempfile::tempdir().expect("tempdir");
    let config = dataref_config::Config::builtin_sample(home.path().to_owned(), 10);
    dataref_builtins::builtin_registry_with(&config, None).expect("registry")
}

/// A tool that logs one event while it runs.
struct Chatty {
    spec: ToolSpec,
}

#[async_trait]
impl Tool for Chatty {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, _: Map<String, Value>, _: &RunContext) -> Result<ToolOutput, ToolError> {
        tracing::info!("working");
        Ok(ToolOutput::new(json!({"done": true})))
    }
}

/// What the layer saw: each `tool_call` span's fields, and the span each event was in.
#[derive(Default)]
struct Seen {
    spans: Vec<Vec<(String, String)>>,
    events_in: Vec<Option<String>>,
}

struct Record(Arc<std::sync::Mutex<Seen>>);

struct Fields(Vec<(String, String)>);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }
}

impl<S> tracing_subscriber::Layer<S> for Record
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _: &tracing::span::Id,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if attrs.metadata().name() == "tool_call" {
            let mut fields = Fields(Vec::new());
            attrs.record(&mut fields);
            self.0.lock().expect("lock").spans.push(fields.0);
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: tracing_subscriber::layer::Context<'_, S>) {
        let span = ctx.event_span(event).map(|s| s.name().to_owned());
        self.0.lock().expect("lock").events_in.push(span);
    }
}

#[tokio::test]
async fn each_call_runs_in_a_span_with_principal_tool_and_id() {
    use tracing_subscriber::layer::SubscriberExt;

    let mut f = fixture();
    let mut b = ToolRegistry::builder();
    b.register(Arc::new(Chatty {
        spec: ToolSpec::from_types::<Value, Value>("chatty", "logs"),
    }));
    f.registry = b.build().expect("registry");
    let seen = Arc::new(std::sync::Mutex::new(Seen::default()));
    let subscriber = tracing_subscriber::registry().with(Record(seen.clone()));
    let _guard = tracing::subscriber::set_default(subscriber);

    let o = run(&f, ToolCall::new("chatty", json!({})).with_id("toolu_7")).await;
    assert_eq!(o.kind, OutcomeKind::Ok, "{}", o.text);

    let seen = seen.lock().expect("lock");
    assert_eq!(
        seen.spans,
        vec![vec![
            ("principal".to_owned(), "alice".to_owned()),
            ("tool".to_owned(), "chatty".to_owned()),
            ("call_id".to_owned(), "toolu_7".to_owned()),
            // The OpenTelemetry names an exporter reads (`outcome` comes at the end).
            ("otel.name".to_owned(), "execute_tool chatty".to_owned()),
            (
                "gen_ai.operation.name".to_owned(),
                "\"execute_tool\"".to_owned()
            ),
            ("gen_ai.tool.name".to_owned(), "chatty".to_owned()),
        ]]
    );
    // What the tool logs is under its call.
    assert!(
        seen.events_in.contains(&Some("tool_call".to_owned())),
        "{:?}",
        seen.events_in
    );
}
