use std::time::{Duration, Instant};

use dataref_mcp::rmcp::model::{CallToolRequestParams, ClientRequest, Request};
use dataref_mcp::rmcp::service::PeerRequestOptions;
use serde_json::json;

use crate::support::{Env, call, is_error, text};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_fetch_reports_rows_as_progress() -> anyhow::Result<()> {
    let env = Env::new(300_000)?;
    let session = env.connect("alice").await?;
    // rmcp's client puts a progressToken in every request's `_meta`.
    let fetched = call(&session, "fetch_sales", json!({"since": "2025-01-01"})).await?;
    assert!(!is_error(&fetched), "{}", text(&fetched));
    let rows = fetched.structured_content.expect("structured")["rows"]
        .as_u64()
        .expect("rows");
    assert_eq!(rows, 300_000);

    // Notifications precede the response on the wire, but the client hands them to its
    // handler on its own schedule.
    let deadline = Instant::now() + Duration::from_secs(5);
    let seen = loop {
        let seen = session
            .client
            .service()
            .progress
            .lock()
            .expect("lock")
            .clone();
        if seen.last().is_some_and(|p| p.progress == rows as f64) || Instant::now() > deadline {
            break seen;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(!seen.is_empty(), "no progress notifications");
    assert!(
        seen.windows(2).all(|w| w[0].progress < w[1].progress),
        "progress must increase: {seen:?}"
    );
    for p in &seen {
        assert_eq!(
            p.message.as_deref(),
            Some(format!("{} rows fetched", p.progress).as_str())
        );
    }
    // The final count always goes out, however fast the last batches came.
    assert_eq!(seen.last().map(|p| p.progress), Some(rows as f64));
    session.client.cancel().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_call_stops_it_and_keeps_nothing() -> anyhow::Result<()> {
    let env = Env::new(5_000)?;
    let session = env.connect("alice").await?;
    let endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c";
    let args = json!({"source": "sample", "sql": endless});
    let request = ClientRequest::CallToolRequest(Request::new(
        CallToolRequestParams::new("query").with_arguments(args.as_object().cloned().unwrap()),
    ));
    let handle = session
        .client
        .send_cancellable_request(request, PeerRequestOptions::no_options())
        .await?;

    // Wait until rows are flowing (a first batch is in a partial artifact file).
    let deadline = Instant::now() + Duration::from_secs(20);
    while session
        .client
        .service()
        .progress
        .lock()
        .expect("lock")
        .is_empty()
    {
        assert!(
            Instant::now() < deadline,
            "the query never reported progress"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        !env.artifact_files().is_empty(),
        "the partial artifact should exist"
    );

    handle
        .cancel(Some("the person changed their mind".into()))
        .await?;
    let cancelled_at = Instant::now();

    // The server keeps serving, and the fetch stops promptly: its partial file goes away.
    loop {
        let listed = call(&session, "list_artifacts", json!({})).await?;
        assert!(!is_error(&listed), "{}", text(&listed));
        assert_eq!(
            listed.structured_content.expect("structured")["total"],
            json!(0)
        );
        if env.artifact_files().is_empty() {
            break;
        }
        assert!(
            cancelled_at.elapsed() < Duration::from_secs(5),
            "the cancelled fetch kept writing: {:?}",
            env.artifact_files()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(cancelled_at.elapsed() < Duration::from_secs(5));

    // And the session is still good for real work.
    let ok = call(&session, "fetch_sales", json!({"since": "2025-12-01"})).await?;
    assert!(!is_error(&ok), "{}", text(&ok));
    session.client.cancel().await?;
    Ok(())
}

/// Reports far faster than anyone wants to hear: 2,000 reports in about 200 ms.
struct Chatty {
    spec: dataref_protocol::ToolSpec,
}

#[async_trait::async_trait]
impl dataref_tool::Tool for Chatty {
    fn spec(&self) -> &dataref_protocol::ToolSpec {
        &self.spec
    }

    async fn call(
        &self,
        _args: serde_json::Map<String, serde_json::Value>,
        ctx: &dataref_tool::RunContext,
    ) -> Result<dataref_tool::ToolOutput, dataref_tool::ToolError> {
        for i in 1..=2_000u32 {
            ctx.progress
                .report(f64::from(i), Some(2_000.0), Some(format!("{i} counted")));
            if i % 100 == 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        Ok(dataref_tool::ToolOutput::new(json!({"counted": 2_000})))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_is_throttled_and_ends_with_the_last_report() -> anyhow::Result<()> {
    let env = Env::new(1_000)?;
    let mut b = dataref_tool::ToolRegistry::builder();
    b.register(std::sync::Arc::new(Chatty {
        spec: dataref_protocol::ToolSpec {
            name: "chatty".into(),
            title: None,
            description: "Counts.".into(),
            input_schema: json!({"type": "object"}),
            output_schema: Some(json!({"type": "object"})),
            annotations: Default::default(),
            ui: Default::default(),
        },
    }));
    let registry = std::sync::Arc::new(b.build()?);
    let principal = dataref_protocol::Principal::new("alice")?;
    let workspace = std::sync::Arc::new(dataref_workspace::Workspace::for_principal(
        env.home.path(),
        &principal,
    )?);
    let ctx = dataref_tool::RunContext {
        principal,
        store: env.store.clone(),
        workspace,
        limits: env.config.limits.clone(),
        progress: std::sync::Arc::new(dataref_tool::NoProgress),
        cancel: tokio_util::sync::CancellationToken::new(),
        clock: std::sync::Arc::new(dataref_store::SystemClock),
    };
    let server = dataref_mcp::DatarefServer::new(registry, ctx);
    let session =
        dataref_mcp::connect_in_process(server, crate::support::Recorder::default()).await?;

    let started = Instant::now();
    let r = call(&session, "chatty", json!({})).await?;
    let elapsed = started.elapsed();
    assert!(!is_error(&r), "{}", text(&r));
    let deadline = Instant::now() + Duration::from_secs(5);
    let seen = loop {
        let seen = session
            .client
            .service()
            .progress
            .lock()
            .expect("lock")
            .clone();
        if seen.last().is_some_and(|p| p.progress == 2_000.0) || Instant::now() > deadline {
            break seen;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // One at the start, one per 100 ms, and the last.
    let bound = 2 + (elapsed.as_millis() / 100) as usize;
    assert!(
        (2..=bound).contains(&seen.len()),
        "{} notifications in {elapsed:?}",
        seen.len()
    );
    assert!(seen.windows(2).all(|w| w[0].progress < w[1].progress));
    let last = seen.last().expect("some");
    assert_eq!(last.progress, 2_000.0);
    assert_eq!(last.total, Some(2_000.0));
    assert_eq!(last.message.as_deref(), Some("2000 counted"));
    session.client.cancel().await?;
    Ok(())
}
