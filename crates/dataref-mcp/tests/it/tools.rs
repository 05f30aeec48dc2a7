use dataref_mcp::rmcp::ServiceExt;
use dataref_protocol::DataRef;
use serde_json::{Value, json};

use crate::support::{Env, call, is_error, text};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initialize_names_the_server_and_teaches_the_rule() -> anyhow::Result<()> {
    let env = Env::new(5_000)?;
    // The plain way, as `dataref demo` does it: the server on one end of a pipe, an rmcp
    // client on the other.
    let (server_end, client_end) = tokio::io::duplex(64 * 1024);
    let server_task = tokio::spawn(env.server("alice")?.serve_io(server_end));
    let client = ().serve(client_end).await?;
    let info = client.peer_info().expect("handshake done");
    let server = info.server_info.clone().expect("server info");
    assert_eq!(server.name, "dataref");
    assert_eq!(server.version, env!("CARGO_PKG_VERSION"));
    assert!(info.capabilities.tools.is_some());
    assert!(info.capabilities.resources.is_some());
    let instructions = info.instructions.clone().expect("instructions");
    assert_eq!(instructions, dataref_mcp::INSTRUCTIONS);
    for needle in [
        "Never ask for raw rows",
        "dataRef",
        "`describe_data`",
        "`run_python` (when available)",
        "`export_data`",
        "fetch the data again",
    ] {
        assert!(
            instructions.contains(needle),
            "instructions lack {needle:?}"
        );
    }
    client.cancel().await?;
    // The client leaving is a normal end of the session.
    server_task.await??;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_tool_is_listed_with_both_schemas() -> anyhow::Result<()> {
    let env = Env::new(5_000)?;
    let session = env.connect("alice").await?;
    let tools = session.client.list_all_tools().await?;
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    // Every tool but the view's own (listed only to hosts with MCP Apps: `view.rs`).
    assert_eq!(names, env.registry.model_names());
    assert!(names.contains(&"fetch_sales"));
    assert!(names.contains(&"query"));
    for tool in ["read_file", "list_files", "copy_file", "run_python"] {
        assert!(names.contains(&tool), "{tool} missing: {names:?}");
    }
    for tool in &tools {
        assert_eq!(
            tool.input_schema.get("type"),
            Some(&json!("object")),
            "{}",
            tool.name
        );
        if tool.name == "call_tool" {
            // Its result is the target tool's, whatever that tool lists (maybe nothing).
            assert!(tool.output_schema.is_none());
            continue;
        }
        let output = tool.output_schema.as_ref().expect("output schema");
        assert_eq!(output.get("type"), Some(&json!("object")), "{}", tool.name);
        let hints = tool.annotations.as_ref().expect("annotations");
        // Only `copy_file` (replacing a file only when asked), `run_python` (files the
        // code writes replace those of the same name), `render_chart`/`render_table` (their
        // own files under `charts/` and `tables/`) and `export_data` (new files under
        // `exports/`) write into the caller's workspace, so hosts may ask before them;
        // every other tool is read-only.
        let writes = matches!(
            tool.name.as_ref(),
            "copy_file" | "run_python" | "render_chart" | "render_table" | "export_data"
        );
        assert_eq!(hints.read_only_hint, Some(!writes), "{}", tool.name);
        if !writes {
            assert_eq!(hints.destructive_hint, Some(false), "{}", tool.name);
        }
        assert!(hints.open_world_hint.is_some(), "{}", tool.name);
    }
    let fetch = tools
        .iter()
        .find(|t| t.name == "fetch_sales")
        .expect("fetch_sales");
    assert_eq!(fetch.input_schema["required"], json!(["since"]));
    assert_eq!(
        fetch.annotations.as_ref().and_then(|a| a.open_world_hint),
        Some(true)
    );
    session.client.cancel().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_then_describe() -> anyhow::Result<()> {
    let env = Env::new(5_000)?;
    let session = env.connect("alice").await?;

    let fetched = call(&session, "fetch_sales", json!({"since": "2025-01-01"})).await?;
    assert!(!is_error(&fetched), "{}", text(&fetched));
    let structured = fetched
        .structured_content
        .clone()
        .expect("structuredContent");
    // The text fallback is the same document.
    assert_eq!(serde_json::from_str::<Value>(text(&fetched))?, structured);
    assert_eq!(fetched.content.len(), 1);
    let data_ref = structured["dataRef"].as_str().expect("dataRef");
    DataRef::parse(data_ref)?;
    assert_eq!(structured["rows"], json!(5_000));
    let columns = structured["columns"].as_object().expect("columns");
    let names: Vec<&str> = columns.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "date", "line", "region", "channel", "units", "revenue", "discount"
        ]
    );
    // Two rows, each its values in `columns` order.
    let sample = structured["sample"].as_array().expect("sample");
    assert_eq!(sample.len(), 2);
    assert!(
        sample
            .iter()
            .all(|r| r.as_array().is_some_and(|r| r.len() == 7))
    );
    assert_eq!(structured.get("expiresAt"), None);

    let described = call(&session, "describe_data", json!({"dataRef": data_ref})).await?;
    assert!(!is_error(&described), "{}", text(&described));
    let stats = described
        .structured_content
        .clone()
        .expect("structuredContent");
    assert_eq!(stats["rows"], json!(5_000));
    // Every column shown: no echo of the ref or of the column count.
    assert_eq!(stats.get("dataRef"), None);
    assert_eq!(stats.get("totalColumns"), None);
    assert_eq!(stats["fields"][0], json!("type"));
    assert_eq!(stats["columns"]["date"][0], json!("date"));

    let listed = call(&session, "list_artifacts", json!({})).await?;
    assert_eq!(
        listed.structured_content.expect("structured")["total"],
        json!(1)
    );
    session.client.cancel().await?;
    Ok(())
}
