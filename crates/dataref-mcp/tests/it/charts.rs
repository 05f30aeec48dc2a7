//! Charts and tables over MCP: the image and the table reach the client as content blocks
//! for the user, while the model's block stays small.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use dataref_mcp::rmcp::model::{ContentBlock, ResourceContents, Role};
use serde_json::json;

use crate::support::{Env, call, is_error, text};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chart_is_an_image_block_for_the_user() -> anyhow::Result<()> {
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
    assert!(text(&result).len() < 300, "{}", text(&result));
    let first = result.content[0].as_text().expect("text first");
    assert!(
        first.annotations.is_none(),
        "the model's block has no audience"
    );

    let image = result
        .content
        .iter()
        .find_map(ContentBlock::as_image)
        .expect("an image block");
    assert_eq!(image.mime_type, "image/png");
    let audience = image.annotations.as_ref().and_then(|a| a.audience.clone());
    assert_eq!(audience, Some(vec![Role::User]));
    let png = BASE64
        .decode(&image.data)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));

    let links: Vec<_> = result
        .content
        .iter()
        .filter_map(|c| match c {
            ContentBlock::ResourceLink(r) => Some(r),
            _ => None,
        })
        .collect();
    assert_eq!(links.len(), 2);
    for link in &links {
        assert!(
            link.uri.starts_with("dataref://files/charts/"),
            "{}",
            link.uri
        );
    }
    // The linked PNG is the image that was sent.
    let read = session
        .client
        .read_resource(dataref_mcp::rmcp::model::ReadResourceRequestParams::new(
            links[0].uri.clone(),
        ))
        .await?;
    match &read.contents[0] {
        ResourceContents::BlobResourceContents { blob, .. } => {
            assert_eq!(
                BASE64.decode(blob).map_err(|e| anyhow::anyhow!("{e}"))?,
                png
            );
        }
        other => anyhow::bail!("expected a blob, got {other:?}"),
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_is_markdown_and_html_for_the_user() -> anyhow::Result<()> {
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
    let v = serde_json::to_value(&result.content)?;
    assert_eq!(v[1]["type"], "text");
    assert_eq!(v[1]["annotations"]["audience"], json!(["user"]));
    assert!(
        v[1]["text"]
            .as_str()
            .unwrap_or_default()
            .starts_with("| date | region | revenue |")
    );
    assert_eq!(v[2]["type"], "resource");
    assert_eq!(v[2]["annotations"]["audience"], json!(["user"]));
    assert_eq!(v[2]["resource"]["mimeType"], "text/html");
    Ok(())
}
