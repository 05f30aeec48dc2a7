//! MCP Apps: a host that declares `io.modelcontextprotocol/ui` lists the view's own tools
//! (`visibility: ["app"]`) and the `_meta.ui.resourceUri` of the tools the view shows,
//! and reads the view; a host without it lists exactly what it listed before the view.

use dataref_mcp::rmcp::ClientHandler;
use dataref_mcp::rmcp::model::{ClientConfig, ReadResourceRequestParams, ResourceContents};
use dataref_mcp::{UI_EXTENSION, VIEW_HTML, VIEW_MIME, VIEW_URI, connect_in_process};
use serde_json::{Value, json};

use crate::support::Env;

/// A client that can show views.
#[derive(Debug, Clone, Default)]
struct UiHost;

impl ClientHandler for UiHost {
    fn get_info(&self) -> ClientConfig {
        let mut info = ClientConfig::default();
        let mut ui = dataref_mcp::rmcp::model::JsonObject::new();
        ui.insert("mimeTypes".into(), json!([VIEW_MIME]));
        let mut extensions = dataref_mcp::rmcp::model::ExtensionCapabilities::new();
        extensions.insert(UI_EXTENSION.into(), ui);
        info.capabilities.extensions = Some(extensions);
        info
    }
}

fn ui_of(tools: &[dataref_mcp::rmcp::model::Tool], name: &str) -> Option<Value> {
    let tool = tools.iter().find(|t| t.name == name)?;
    let v = serde_json::to_value(tool).ok()?;
    Some(
        v.get("_meta")
            .and_then(|m| m.get("ui"))
            .cloned()
            .unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn a_host_without_the_extension_never_sees_the_views_tools() -> anyhow::Result<()> {
    let env = Env::new(50)?;
    let session = env.connect("alice").await?;
    let tools = session.client.list_all_tools().await?;
    assert!(tools.iter().all(|t| !t.name.starts_with("view_")));
    assert!(
        tools.iter().all(|t| t.meta.is_none()),
        "no _meta.ui for such a host"
    );
    // Not listed is not enough: a client that names one anyway is told there is no such
    // tool, as for any unknown name, and the view's tools are not offered as close ones.
    for name in [
        "view_rows",
        "view_chart",
        "view_artifacts",
        "view_files",
        "view_download",
    ] {
        let r = crate::support::call(&session, name, json!({})).await?;
        assert!(crate::support::is_error(&r), "{name}");
        let text = crate::support::text(&r);
        assert!(text.contains(&format!("unknown tool `{name}`")), "{text}");
        assert_eq!(text.matches("`view_").count(), 1, "{text}");
    }
    // A host with the extension calls them.
    let host = connect_in_process(env.server("alice")?, UiHost).await?;
    let r = host
        .client
        .call_tool(dataref_mcp::rmcp::model::CallToolRequestParams::new(
            "view_artifacts",
        ))
        .await?;
    assert_ne!(r.is_error, Some(true), "{r:?}");
    Ok(())
}

#[tokio::test]
async fn a_host_with_the_extension_lists_the_view_and_reads_it() -> anyhow::Result<()> {
    let env = Env::new(50)?;
    let plain = env.connect("alice").await?.client.list_all_tools().await?;
    let session = connect_in_process(env.server("alice")?, UiHost).await?;
    let server = session
        .client
        .peer_info()
        .map(|i| serde_json::to_value(&i.capabilities))
        .transpose()?;
    assert_eq!(
        server.and_then(|c| c["extensions"][UI_EXTENSION]["mimeTypes"].get(0).cloned()),
        Some(json!(VIEW_MIME))
    );
    let tools = session.client.list_all_tools().await?;
    assert_eq!(tools.len(), plain.len() + 5, "the five view tools more");
    for name in [
        "view_rows",
        "view_chart",
        "view_artifacts",
        "view_files",
        "view_download",
    ] {
        assert_eq!(
            ui_of(&tools, name),
            Some(json!({"resourceUri": VIEW_URI, "visibility": ["app"]})),
            "{name}"
        );
    }
    for name in ["render_chart", "render_table", "fetch_sales", "run_sql"] {
        assert_eq!(
            ui_of(&tools, name),
            Some(json!({"resourceUri": VIEW_URI})),
            "{name}"
        );
    }
    assert_eq!(ui_of(&tools, "describe_data"), Some(Value::Null));
    // The view is the first resource such a host lists; a plain client's list has no view.
    let listed = session.client.list_all_resources().await?;
    assert_eq!(listed.first().map(|r| r.uri.as_str()), Some(VIEW_URI));
    assert_eq!(listed[0].mime_type.as_deref(), Some(VIEW_MIME));
    let plain_listed = env
        .connect("alice")
        .await?
        .client
        .list_all_resources()
        .await?;
    assert!(plain_listed.iter().all(|r| r.uri != VIEW_URI));
    let read = session
        .client
        .read_resource(ReadResourceRequestParams::new(VIEW_URI))
        .await?;
    let [
        ResourceContents::TextResourceContents {
            mime_type,
            text,
            meta,
            ..
        },
    ] = read.contents.as_slice()
    else {
        panic!("one text content: {read:?}");
    };
    assert_eq!(mime_type.as_deref(), Some(VIEW_MIME));
    assert_eq!(text, VIEW_HTML);
    assert_eq!(
        meta.as_ref().and_then(|m| m.get("ui")).cloned(),
        Some(json!({"prefersBorder": true}))
    );
    Ok(())
}
