//! An upstream `tools/call` result as our [`ToolOutput`] or [`ToolError`].

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use dataref_tool::{Attachment, ToolError, ToolOutput};
use rmcp::model::{CallToolResult, ContentBlock, ResourceContents};
use serde_json::Value;

/// Text blocks, joined with newlines, are what the model reads; `structuredContent` (or
/// `null`) is the structured result. Images and embedded text documents go to the person
/// as attachments, resource links too; each leaves a short note in the model's text, and
/// what has no attachment kind (audio, binary resources) only the note. `isError: true`
/// is an error the model reads, attributed to the upstream server.
pub(crate) fn to_output(upstream: &str, result: CallToolResult) -> Result<ToolOutput, ToolError> {
    let mut text: Vec<String> = Vec::new();
    let mut attachments = Vec::new();
    for block in result.content {
        match block {
            ContentBlock::Text(t) => text.push(t.text),
            ContentBlock::Image(image) => match BASE64.decode(image.data.as_bytes()) {
                Ok(data) => {
                    text.push(format!("[{} image, shown to the person]", image.mime_type));
                    attachments.push(Attachment::Image {
                        data,
                        mime_type: image.mime_type,
                    });
                }
                Err(_) => text.push(format!(
                    "[{} image left out: its data is not base64]",
                    image.mime_type
                )),
            },
            ContentBlock::Audio(audio) => {
                text.push(format!("[{} audio left out]", audio.mime_type));
            }
            ContentBlock::ResourceLink(link) => {
                text.push(format!("[resource `{}`: {}]", link.name, link.uri));
                attachments.push(Attachment::ResourceLink {
                    uri: link.uri,
                    name: link.name,
                    mime_type: link.mime_type,
                    description: link.description,
                });
            }
            ContentBlock::Resource(embedded) => match embedded.resource {
                ResourceContents::TextResourceContents {
                    uri,
                    mime_type,
                    text: body,
                    ..
                } => {
                    let mime_type = mime_type.unwrap_or_else(|| "text/plain".into());
                    text.push(format!(
                        "[document `{uri}` ({mime_type}, {} characters), shown to the person]",
                        body.chars().count()
                    ));
                    attachments.push(Attachment::Document {
                        uri,
                        mime_type,
                        text: body,
                    });
                }
                ResourceContents::BlobResourceContents { uri, mime_type, .. } => {
                    text.push(format!(
                        "[binary resource `{uri}` ({}) left out]",
                        mime_type.as_deref().unwrap_or("unknown type")
                    ));
                }
                // Non-exhaustive across crates: a kind of resource newer than this build.
                _ => text.push("[a resource of a kind dataref cannot relay left out]".into()),
            },
            // Non-exhaustive across crates: a kind of content newer than this build.
            _ => text.push("[content of a kind dataref cannot relay left out]".into()),
        }
    }
    let text = text.join("\n");
    if result.is_error == Some(true) {
        let message = if text.trim().is_empty() {
            "the upstream tool failed and gave no message".to_owned()
        } else {
            text
        };
        return Err(ToolError::respond(
            message,
            Some(format!(
                "the upstream server `{upstream}` reported this error"
            )),
        ));
    }
    let structured = result.structured_content.unwrap_or(Value::Null);
    // With no text at all, the JSON of `structured` is what the model reads.
    let text = (!text.is_empty() || structured.is_null()).then_some(text);
    Ok(ToolOutput {
        structured,
        attachments,
        text,
    })
}

#[cfg(test)]
mod tests {
    use rmcp::model::{EmbeddedResource, ImageContent, Resource};
    use serde_json::json;

    use super::*;

    #[test]
    fn text_blocks_are_joined_and_structured_content_kept() {
        let mut r = CallToolResult::success(vec![ContentBlock::text("a"), ContentBlock::text("b")]);
        r.structured_content = Some(json!({"n": 1}));
        let out = to_output("up", r).unwrap();
        assert_eq!(out.text.as_deref(), Some("a\nb"));
        assert_eq!(out.structured, json!({"n": 1}));
        assert!(out.attachments.is_empty());
    }

    #[test]
    fn structured_only_leaves_the_text_to_the_json() {
        let mut r = CallToolResult::success(vec![]);
        r.structured_content = Some(json!({"n": 1}));
        assert_eq!(to_output("up", r).unwrap().text, None);
        let empty = to_output("up", CallToolResult::success(vec![])).unwrap();
        assert_eq!(
            (empty.structured, empty.text),
            (Value::Null, Some(String::new()))
        );
    }

    #[test]
    fn errors_carry_the_text_and_name_the_upstream() {
        let r = CallToolResult::error(vec![ContentBlock::text("no such city")]);
        assert_eq!(
            to_output("weather", r).unwrap_err(),
            ToolError::RespondToModel {
                message: "no such city".into(),
                hint: Some("the upstream server `weather` reported this error".into()),
            }
        );
        let silent = to_output("weather", CallToolResult::error(vec![])).unwrap_err();
        assert!(silent.to_string().contains("gave no message"));
    }

    #[test]
    fn images_documents_and_links_become_attachments_with_a_note() {
        let r = CallToolResult::success(vec![
            ContentBlock::Image(ImageContent::new("iVBORw==", "image/png")),
            ContentBlock::Image(ImageContent::new("%%%", "image/png")),
            ContentBlock::Resource(EmbeddedResource::new(
                ResourceContents::TextResourceContents {
                    uri: "test://a".into(),
                    mime_type: None,
                    text: "hello".into(),
                    meta: None,
                },
            )),
            ContentBlock::Resource(EmbeddedResource::new(
                ResourceContents::BlobResourceContents {
                    uri: "test://b".into(),
                    mime_type: Some("application/zip".into()),
                    blob: "AAAA".into(),
                    meta: None,
                },
            )),
            ContentBlock::resource_link(Resource::new("https://x/y", "y")),
        ]);
        let out = to_output("up", r).unwrap();
        assert_eq!(
            out.text.as_deref(),
            Some(
                "[image/png image, shown to the person]\n\
                 [image/png image left out: its data is not base64]\n\
                 [document `test://a` (text/plain, 5 characters), shown to the person]\n\
                 [binary resource `test://b` (application/zip) left out]\n\
                 [resource `y`: https://x/y]"
            )
        );
        assert_eq!(
            out.attachments,
            vec![
                Attachment::Image {
                    data: vec![0x89, b'P', b'N', b'G'],
                    mime_type: "image/png".into()
                },
                Attachment::Document {
                    uri: "test://a".into(),
                    mime_type: "text/plain".into(),
                    text: "hello".into()
                },
                Attachment::ResourceLink {
                    uri: "https://x/y".into(),
                    name: "y".into(),
                    mime_type: None,
                    description: None
                },
            ]
        );
    }
}
