use async_trait::async_trait;
use dataref_protocol::ToolSpec;
use serde_json::{Map, Value};

use crate::{RunContext, ToolError};

/// Something for the person, not the model (MCP `audience: ["user"]`).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Attachment {
    /// A link to a resource the owner can read (`dataref://…`).
    ResourceLink {
        uri: String,
        name: String,
        mime_type: Option<String>,
        description: Option<String>,
    },
    /// An image to show the person, e.g. a chart (MCP image content).
    Image { data: Vec<u8>, mime_type: String },
    /// Markdown for the person, e.g. a table (MCP text content).
    Markdown { text: String },
    /// A document given inline, e.g. an HTML table, named by the `dataref://` URI it can
    /// also be read at (MCP embedded resource).
    Document {
        uri: String,
        mime_type: String,
        text: String,
    },
    /// A file given whole for the person to save, named by `uri` (MCP embedded resource
    /// with a blob), e.g. what the view's grid shows, downloaded: never written anywhere.
    File {
        uri: String,
        mime_type: String,
        data: Vec<u8>,
    },
}

/// A successful result: a small JSON value for the model (`structuredContent`, with its
/// JSON text as the text fallback) and attachments for the person.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    pub structured: Value,
    pub attachments: Vec<Attachment>,
    /// What the model reads instead of the JSON text of `structured`, for results that
    /// are text to begin with (an upstream MCP server's text blocks). `None` for our tools.
    pub text: Option<String>,
}

impl ToolOutput {
    pub fn new(structured: Value) -> Self {
        Self {
            structured,
            attachments: Vec::new(),
            text: None,
        }
    }
}

/// A tool. Its spec is the model-facing contract; `call` gets arguments that already
/// passed the input schema.
#[async_trait]
pub trait Tool: Send + Sync {
    fn spec(&self) -> &dataref_protocol::ToolSpec;

    /// The result is already a synopsis made for the model (a dataRef with its schema and
    /// statistics, a run's capped result): it is not spilled unless `[spill.tools.NAME]`
    /// says so. Default false: a large result is written to the workspace.
    fn result_is_synopsis(&self) -> bool {
        false
    }

    /// The schemas are dataref's own, so the registry lists them in their portable form
    /// (`crate::listed`). False for a tool mounted from an upstream MCP server: its
    /// schemas are listed as that server gives them.
    fn schemas_are_ours(&self) -> bool {
        true
    }

    /// The call may change something outside the result it returns (writes a file,
    /// stores an artifact, calls out): everything not annotated read-only. An agent loop
    /// can ask before such a call, or refuse to repeat it.
    fn is_mutating(&self) -> bool {
        !self.spec().annotations.read_only
    }

    async fn call(
        &self,
        args: Map<String, Value>,
        ctx: &RunContext,
    ) -> Result<ToolOutput, ToolError>;
}

/// A tool whose arguments arrive already deserialised into its own type. Every such tool
/// is a [`Tool`] through the impl below, so the parsing step is written once (and
/// [`Tool::schemas_are_ours`] and [`Tool::is_mutating`] keep their defaults).
#[async_trait]
pub trait TypedTool: Send + Sync {
    type Args: serde::de::DeserializeOwned + Send;

    fn spec(&self) -> &ToolSpec;

    /// See [`Tool::result_is_synopsis`].
    fn result_is_synopsis(&self) -> bool {
        false
    }

    async fn run(&self, args: Self::Args, ctx: &RunContext) -> Result<ToolOutput, ToolError>;
}

#[async_trait]
impl<T: TypedTool> Tool for T {
    fn spec(&self) -> &ToolSpec {
        TypedTool::spec(self)
    }

    fn result_is_synopsis(&self) -> bool {
        TypedTool::result_is_synopsis(self)
    }

    async fn call(
        &self,
        args: Map<String, Value>,
        ctx: &RunContext,
    ) -> Result<ToolOutput, ToolError> {
        let args = parse_args(args)?;
        self.run(args, ctx).await
    }
}

/// Arguments that passed the input schema, as the tool's own type. A failure here means the
/// schema and the type disagree, which the model can still act on.
pub fn parse_args<T: serde::de::DeserializeOwned>(
    args: Map<String, Value>,
) -> Result<T, ToolError> {
    serde_json::from_value(Value::Object(args))
        .map_err(|e| ToolError::respond(format!("invalid arguments: {e}"), None))
}

/// The whole of an opened workspace file, at most `max` bytes: checked on its size first and
/// again while reading (it may grow meanwhile). Over the cap is `too_big(size)`.
pub fn read_capped(
    file: std::fs::File,
    shown: &str,
    max: u64,
    too_big: impl Fn(u64) -> ToolError,
) -> Result<Vec<u8>, ToolError> {
    use std::io::Read;
    let size = file
        .metadata()
        .map_err(|e| ToolError::Fatal(format!("inspecting `{shown}`: {e}")))?
        .len();
    if size > max {
        return Err(too_big(size));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| ToolError::Fatal(format!("reading `{shown}`: {e}")))?;
    if bytes.len() as u64 > max {
        return Err(too_big(bytes.len() as u64));
    }
    Ok(bytes)
}
