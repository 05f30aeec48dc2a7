use dataref_mcp::rmcp::ServiceError;
use dataref_mcp::rmcp::model::{ErrorCode, ReadResourceRequestParams, ResourceContents};
use dataref_protocol::DataRef;
use serde_json::json;

use crate::support::{Env, call, is_error, text};

async fn fetch(
    session: &dataref_mcp::InProcessSession<crate::support::Recorder>,
    since: &str,
) -> anyhow::Result<String> {
    let r = call(session, "fetch_sales", json!({"since": since})).await?;
    assert!(!is_error(&r), "{}", text(&r));
    r.structured_content
        .as_ref()
        .and_then(|s| s["dataRef"].as_str())
        .map(str::to_owned)
        .ok_or_else(|| anyhow::anyhow!("no dataRef in {}", text(&r)))
}

fn not_found(e: ServiceError) -> dataref_mcp::rmcp::ErrorData {
    match e {
        ServiceError::McpError(e) => e,
        other => panic!("expected an MCP error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_artifacts_are_listed_and_read_as_csv() -> anyhow::Result<()> {
    let env = Env::new(5_000)?;
    let session = env.connect("alice").await?;
    let all = fetch(&session, "2025-01-01").await?;
    let december = fetch(&session, "2025-12-01").await?;

    let templates = session.client.list_all_resource_templates().await?;
    let uris: Vec<&str> = templates.iter().map(|t| t.uri_template.as_str()).collect();
    assert_eq!(
        uris,
        ["dataref://artifacts/{dataRef}", "dataref://files/{path}"]
    );

    let listed = session.client.list_all_resources().await?;
    let names: Vec<&str> = listed.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, [december.as_str(), all.as_str()], "newest first");
    let first = &listed[1];
    assert_eq!(first.uri, format!("dataref://artifacts/{all}"));
    assert_eq!(first.mime_type.as_deref(), Some("text/csv"));
    let description = first.description.as_deref().expect("description");
    assert!(
        description.starts_with("5000 rows × 7 columns, made by `fetch_sales`, expires "),
        "{description}"
    );

    let read = session
        .client
        .read_resource(ReadResourceRequestParams::new(first.uri.clone()))
        .await?;
    assert_eq!(read.contents.len(), 1);
    let ResourceContents::TextResourceContents {
        uri,
        mime_type,
        text,
        meta,
    } = &read.contents[0]
    else {
        panic!("expected text contents");
    };
    assert_eq!(uri, &first.uri);
    assert_eq!(mime_type.as_deref(), Some("text/csv"));
    let lines: Vec<&str> = text.split_terminator("\r\n").collect();
    assert_eq!(lines[0], "date,line,region,channel,units,revenue,discount");
    assert_eq!(lines.len(), 1 + 1_000, "header and the first 1,000 rows");
    assert!(lines[1].starts_with("2025-01-01,"), "{}", lines[1]);
    assert!(text.len() <= 256 * 1024);
    let meta = &meta.as_ref().expect("_meta").0;
    assert_eq!(meta["dataref/rows"], json!(5_000));
    assert_eq!(meta["dataref/previewRows"], json!(1_000));
    assert_eq!(meta["dataref/complete"], json!(false));

    // The small table comes whole.
    let read = session
        .client
        .read_resource(ReadResourceRequestParams::new(format!(
            "dataref://artifacts/{december}"
        )))
        .await?;
    let ResourceContents::TextResourceContents { text, meta, .. } = &read.contents[0] else {
        panic!("expected text contents");
    };
    let rows = meta.as_ref().expect("_meta").0["dataref/rows"]
        .as_u64()
        .expect("rows");
    assert!(rows > 0 && rows < 1_000);
    assert_eq!(text.split_terminator("\r\n").count() as u64, 1 + rows);
    session.client.cancel().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_principal_sees_nothing() -> anyhow::Result<()> {
    let env = Env::new(5_000)?;
    let alice = env.connect("alice").await?;
    let bob = env.connect("bob").await?;
    let alices = fetch(&alice, "2025-01-01").await?;

    assert!(bob.client.list_all_resources().await?.is_empty());
    let listed = call(&bob, "list_artifacts", json!({})).await?;
    assert_eq!(
        listed.structured_content.expect("structured")["total"],
        json!(0)
    );

    let stolen = not_found(
        bob.client
            .read_resource(ReadResourceRequestParams::new(format!(
                "dataref://artifacts/{alices}"
            )))
            .await
            .expect_err("not bob's"),
    );
    let stranger = DataRef::from_random_bytes([9; 16]).to_string();
    let missing = not_found(
        bob.client
            .read_resource(ReadResourceRequestParams::new(format!(
                "dataref://artifacts/{stranger}"
            )))
            .await
            .expect_err("nobody's"),
    );
    assert_eq!(stolen.code, ErrorCode::RESOURCE_NOT_FOUND);
    assert_eq!(missing.code, ErrorCode::RESOURCE_NOT_FOUND);
    assert_eq!(
        stolen.message.replace(&alices, "REF"),
        missing.message.replace(&stranger, "REF")
    );
    assert_eq!(
        missing.message,
        format!(
            "dataRef `{stranger}` is unknown or expired; references expire and belong to the \
             caller who made them; fetch the data again"
        )
    );

    // Neither can bob use it as a tool argument; alice still can.
    let described = call(&bob, "describe_data", json!({"dataRef": alices})).await?;
    assert!(is_error(&described));
    assert!(text(&described).contains("unknown or expired"));
    let read = alice
        .client
        .read_resource(ReadResourceRequestParams::new(format!(
            "dataref://artifacts/{alices}"
        )))
        .await?;
    assert_eq!(read.contents.len(), 1);

    // Junk URIs get the same kind of answer.
    for uri in ["dataref://artifacts/data_nope", "file:///etc/passwd"] {
        let e = not_found(
            alice
                .client
                .read_resource(ReadResourceRequestParams::new(uri))
                .await
                .expect_err("junk"),
        );
        assert_eq!(e.code, ErrorCode::RESOURCE_NOT_FOUND, "{uri}");
    }
    alice.client.cancel().await?;
    bob.client.cancel().await?;
    Ok(())
}
