//! Our tool specs and call outcomes in rmcp's shapes.

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use dataref_protocol::{Principal, ToolSpec, percent_decode};
use dataref_tool::{Attachment, CallOutcome};
use rmcp::model::{
    Annotations, CallToolResult, ContentBlock, EmbeddedResource, ImageContent, JsonObject,
    Resource, ResourceContents, Role, TextContent, Tool, ToolAnnotations,
};
use serde_json::Value;

use crate::host::DownloadLinks;

/// `tools/list` entry for one spec: schemas, title and hints.
pub(crate) fn to_mcp_tool(spec: &ToolSpec) -> Tool {
    let mut annotations = ToolAnnotations::new()
        .read_only(spec.annotations.read_only)
        .open_world(spec.annotations.open_world);
    if spec.annotations.read_only {
        // MCP defaults `destructiveHint` to true; hosts ask before destructive calls.
        annotations = annotations.destructive(false);
    }
    annotations.title.clone_from(&spec.title);
    let mut tool = Tool::new_with_raw(
        spec.name.clone(),
        Some(spec.description.clone().into()),
        Arc::new(schema_object(&spec.name, &spec.input_schema)),
    )
    .with_annotations(annotations);
    if let Some(title) = &spec.title {
        tool = tool.with_title(title.clone());
    }
    if let Some(output) = &spec.output_schema {
        tool = tool.with_raw_output_schema(Arc::new(schema_object(&spec.name, output)));
    }
    tool
}

/// The `tools/list` entry for a host with the MCP Apps extension: the plain entry plus
/// `_meta.ui` (the view, and `visibility: ["app"]` for a tool only the view calls).
pub(crate) fn to_mcp_app_tool(spec: &ToolSpec) -> Tool {
    let mut tool = to_mcp_tool(spec);
    if spec.ui.is_plain() {
        return tool;
    }
    let mut ui = JsonObject::new();
    if let Some(uri) = &spec.ui.resource_uri {
        ui.insert("resourceUri".into(), Value::String(uri.clone()));
    }
    if spec.ui.app_only {
        ui.insert("visibility".into(), serde_json::json!(["app"]));
    }
    let mut meta = JsonObject::new();
    meta.insert("ui".into(), Value::Object(ui));
    tool.meta = Some(meta.into());
    tool
}

/// MCP wants schemas as JSON objects. Ours always are (the registry compiles them); a
/// non-object would be a programming error, so it degrades to "any object" with a log line
/// rather than taking the session down.
fn schema_object(tool: &str, schema: &Value) -> JsonObject {
    match schema {
        Value::Object(o) => o.clone(),
        other => {
            tracing::error!(tool, schema = %other, "tool schema is not a JSON object");
            let mut o = JsonObject::new();
            o.insert("type".into(), Value::String("object".into()));
            o
        }
    }
}

/// One text block for the model (the JSON of the result, or the error with its hint),
/// `structuredContent` when there is one, and the attachments: resource links (read by
/// both: the path is in the URI) and, marked `audience: ["user"]`, images, Markdown and
/// embedded documents. An empty text with attachments is no text block at all: a result
/// whose content is its link (a chart, an export) says everything in the link and in
/// `structuredContent`, and a copy of that JSON would cost a host that passes every
/// block to the model as much again.
pub(crate) fn to_call_result(outcome: CallOutcome) -> CallToolResult {
    let is_error = outcome.is_error();
    let CallOutcome {
        structured,
        text,
        attachments,
        ..
    } = outcome;
    let mut content = Vec::with_capacity(1 + attachments.len());
    if !text.is_empty() || attachments.is_empty() {
        content.push(ContentBlock::text(text));
    }
    content.extend(attachments.into_iter().filter_map(attachment_block));
    let mut result = if is_error {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    };
    result.structured_content = structured;
    result
}

/// For each workspace file linked for the person (`dataref://files/{path}`), one more
/// resource link: a signed HTTP URL that downloads it without a token, for a host that
/// cannot read MCP resources (`serve --http` only).
pub(crate) fn add_download_links(
    result: &mut CallToolResult,
    principal: &Principal,
    links: &dyn DownloadLinks,
) {
    let extra: Vec<ContentBlock> = result
        .content
        .iter()
        .filter_map(ContentBlock::as_resource_link)
        .filter_map(|link| {
            let encoded = link.uri.strip_prefix("dataref://files/")?;
            let path = String::from_utf8(percent_decode(encoded)?).ok()?;
            let (url, expires_at) = links.link(principal, &path)?;
            let mut download = Resource::new(url, link.name.clone())
                .with_annotations(Annotations::default().with_audience(vec![Role::User]));
            download.mime_type.clone_from(&link.mime_type);
            download.description = Some(format!(
                "Download link for `{path}`, valid until {expires_at} (Unix time); no token needed."
            ));
            Some(ContentBlock::resource_link(download))
        })
        .collect();
    result.content.extend(extra);
}

fn attachment_block(attachment: Attachment) -> Option<ContentBlock> {
    // Images and inline tables are for the person; the model's part is the text block.
    let for_user = || Annotations::default().with_audience(vec![Role::User]);
    match attachment {
        Attachment::ResourceLink {
            uri,
            name,
            mime_type,
            description,
        } => {
            // Not marked for the person only: the model reads the file's path in it.
            let mut link = Resource::new(uri, name);
            link.mime_type = mime_type;
            link.description = description;
            Some(ContentBlock::resource_link(link))
        }
        Attachment::Image { data, mime_type } => Some(ContentBlock::Image(
            ImageContent::new(BASE64.encode(data), mime_type).with_annotations(for_user()),
        )),
        Attachment::Markdown { text } => Some(ContentBlock::Text(
            TextContent::new(text).with_annotations(for_user()),
        )),
        Attachment::Document {
            uri,
            mime_type,
            text,
        } => Some(ContentBlock::Resource(
            EmbeddedResource::new(ResourceContents::TextResourceContents {
                uri,
                mime_type: Some(mime_type),
                text,
                meta: None,
            })
            .with_annotations(for_user()),
        )),
        Attachment::File {
            uri,
            mime_type,
            data,
        } => Some(ContentBlock::Resource(
            EmbeddedResource::new(ResourceContents::BlobResourceContents {
                uri,
                mime_type: Some(mime_type),
                blob: BASE64.encode(data),
                meta: None,
            })
            .with_annotations(for_user()),
        )),
        // `Attachment` is non-exhaustive across crates; a kind this server cannot show
        // yet is left out (the model's text result is complete without it).
        other => {
            tracing::warn!(attachment = ?other, "attachment kind not supported over MCP");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use dataref_tool::OutcomeKind;
    use serde_json::json;

    use super::*;

    #[test]
    fn read_only_tools_are_not_destructive() {
        let mut spec = ToolSpec {
            name: "describe_data".into(),
            title: Some("Describe data".into()),
            description: "Stats.".into(),
            input_schema: json!({"type": "object", "properties": {}}),
            output_schema: Some(json!({"type": "object"})),
            annotations: Default::default(),
            ui: Default::default(),
        };
        spec.annotations.read_only = true;
        let tool = serde_json::to_value(to_mcp_tool(&spec)).unwrap();
        assert_eq!(
            tool,
            json!({
                "name": "describe_data",
                "title": "Describe data",
                "description": "Stats.",
                "inputSchema": {"type": "object", "properties": {}},
                "outputSchema": {"type": "object"},
                "annotations": {
                    "title": "Describe data",
                    "readOnlyHint": true,
                    "destructiveHint": false,
                    "openWorldHint": false
                }
            })
        );
    }

    /// A chart or an export: its content is the link alone, nothing repeats the JSON.
    #[test]
    fn an_empty_text_with_a_link_is_the_link_alone() {
        let outcome = CallOutcome {
            call_id: "1".into(),
            kind: OutcomeKind::Ok,
            structured: Some(json!({"path": "charts/c.png", "points": 3})),
            text: String::new(),
            attachments: vec![Attachment::ResourceLink {
                uri: "dataref://files/charts/c.png".into(),
                name: "c.png".into(),
                mime_type: Some("image/png".into()),
                description: None,
            }],
        };
        let v = serde_json::to_value(to_call_result(outcome)).unwrap();
        assert_eq!(
            v["content"],
            json!([{"type": "resource_link", "uri": "dataref://files/charts/c.png", "name": "c.png", "mimeType": "image/png"}])
        );
        assert_eq!(v["structuredContent"]["points"], json!(3));
    }

    #[test]
    fn outcome_becomes_text_structured_and_links() {
        let outcome = CallOutcome {
            call_id: "1".into(),
            kind: OutcomeKind::Ok,
            structured: Some(json!({"a": 1})),
            text: r#"{"a":1}"#.into(),
            attachments: vec![Attachment::ResourceLink {
                uri: "dataref://files/file_x".into(),
                name: "chart.png".into(),
                mime_type: Some("image/png".into()),
                description: None,
            }],
        };
        let v = serde_json::to_value(to_call_result(outcome)).unwrap();
        assert_eq!(v["isError"], json!(false));
        assert_eq!(v["structuredContent"], json!({"a": 1}));
        assert_eq!(
            v["content"][0],
            json!({"type": "text", "text": "{\"a\":1}"})
        );
        assert_eq!(v["content"][1]["type"], json!("resource_link"));
        assert_eq!(
            v["content"][1].get("annotations"),
            None,
            "the model reads it too"
        );
        assert_eq!(v["content"][1]["mimeType"], json!("image/png"));
    }

    #[test]
    fn images_tables_and_documents_are_for_the_user() {
        let outcome = CallOutcome {
            call_id: "1".into(),
            kind: OutcomeKind::Ok,
            structured: Some(json!({"points": 3})),
            text: r#"{"points":3}"#.into(),
            attachments: vec![
                Attachment::Image {
                    data: vec![0x89, b'P', b'N', b'G'],
                    mime_type: "image/png".into(),
                },
                Attachment::Markdown {
                    text: "| a |\n| --- |\n| 1 |\n".into(),
                },
                Attachment::Document {
                    uri: "dataref://files/tables/t.html".into(),
                    mime_type: "text/html".into(),
                    text: "<table></table>".into(),
                },
            ],
        };
        let v = serde_json::to_value(to_call_result(outcome)).unwrap();
        assert_eq!(
            v["content"][0]["annotations"],
            Value::Null,
            "the model's block"
        );
        assert_eq!(
            v["content"][1],
            json!({
                "type": "image",
                "data": "iVBORw==",
                "mimeType": "image/png",
                "annotations": {"audience": ["user"]}
            })
        );
        assert_eq!(v["content"][2]["type"], json!("text"));
        assert_eq!(v["content"][2]["annotations"]["audience"], json!(["user"]));
        assert_eq!(v["content"][3]["type"], json!("resource"));
        assert_eq!(v["content"][3]["resource"]["mimeType"], json!("text/html"));
        assert_eq!(v["content"][3]["annotations"]["audience"], json!(["user"]));
    }
}
