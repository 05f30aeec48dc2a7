//! Charts and tables over MCP: each reaches the client as a link to its workspace file,
//! with no pixels or rows in any block a host may pass to the model.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use dataref_mcp::rmcp::model::{ContentBlock, ResourceContents};
use serde_json::json;

use crate::support::{Env, call, is_error, text};

/// The content is one resource link (no image bytes, no text block repeating the JSON),
/// and the linked PNG reads back over `resources/read`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chart_is_a_link_to_its_png() -> anyhow::Result<()> {
    let env = Env::new(3_000)?;
    let session = env.connect("alice").await?;
    let fetched = call(&session, "fetch_sales", json!({"since": "2025-01-01"})).await?;
    let data_ref = fetched.structured_content.as_ref().expect("structured")["dataRef"].clone();

    let result = call(
        &session,
        "render_chart",
        json!({"dataRef": data_ref, "x": "date", "y": ["revenue"], "kind": "line"}),
    )
    .await?;
    assert!(!is_error(&result), "{}", text(&result));
    let structured = result.structured_content.clone().expect("structured");
    let path = structured["path"].as_str().expect("path").to_owned();
    let [ContentBlock::ResourceLink(link)] = &result.content[..] else {
        anyhow::bail!("expected one resource link, got {:?}", result.content);
    };
    assert_eq!(link.uri, format!("dataref://files/{path}"));
    assert!(link.annotations.is_none(), "the model reads the path too");
    assert!(link.description.is_none());
    assert!(result.content.iter().all(|c| c.as_image().is_none()));

    let read = session
        .client
        .read_resource(dataref_mcp::rmcp::model::ReadResourceRequestParams::new(
            link.uri.clone(),
        ))
        .await?;
    match &read.contents[0] {
        ResourceContents::BlobResourceContents { blob, .. } => {
            let png = BASE64.decode(blob).map_err(|e| anyhow::anyhow!("{e}"))?;
            assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
        }
        other => anyhow::bail!("expected a blob, got {other:?}"),
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_is_a_link_to_its_html() -> anyhow::Result<()> {
    let env = Env::new(3_000)?;
    let session = env.connect("alice").await?;
    let fetched = call(&session, "fetch_sales", json!({"since": "2025-01-01"})).await?;
    let data_ref = fetched.structured_content.as_ref().expect("structured")["dataRef"].clone();
    let result = call(
        &session,
        "render_table",
        json!({"dataRef": data_ref, "columns": ["date", "region", "revenue"], "limit": 20}),
    )
    .await?;
    assert!(!is_error(&result), "{}", text(&result));
    let structured = result.structured_content.clone().expect("structured");
    assert_eq!(structured["rowsShown"], 20);
    assert_eq!(structured["rowsTotal"], 3_000);
    assert_eq!(structured["columns"], 3);
    // No rows in any block: the JSON, then the link to the HTML file (`[tables] inline`
    // would add the Markdown and the HTML for the person).
    let v = serde_json::to_value(&result.content)?;
    assert_eq!(v.as_array().map(Vec::len), Some(2), "{v}");
    assert_eq!(v[0]["type"], "text");
    assert!(!v[0]["text"].as_str().unwrap_or_default().contains("| date"));
    assert_eq!(v[1]["type"], "resource_link");
    assert_eq!(
        v[1]["uri"],
        json!(format!(
            "dataref://files/{}",
            structured["path"].as_str().unwrap_or_default()
        ))
    );
    Ok(())
}
