use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A tool as the model and the MCP client see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolSpec {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// The model-facing contract: what the tool does and how to use what it returns.
    pub description: String,
    /// JSON Schema (an object schema) of the arguments.
    pub input_schema: Value,
    /// JSON Schema (an object schema) of `structuredContent` on success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    #[serde(default)]
    pub annotations: ToolAnnotations,
    /// How an MCP Apps host shows the tool (the `io.modelcontextprotocol/ui` extension).
    #[serde(default, skip_serializing_if = "ToolUi::is_plain")]
    pub ui: ToolUi,
}

/// The one view dataref serves (MCP Apps): charts and tables for the person.
pub const VIEW_URI: &str = "ui://dataref/view";

/// The view a host renders a tool's result in, and who may call the tool.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolUi {
    /// The `ui://` resource that shows the result to the person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_uri: Option<String>,
    /// Called by the view only: never listed to a model (MCP Apps `visibility: ["app"]`),
    /// never in an agent profile.
    #[serde(default)]
    pub app_only: bool,
}

impl ToolUi {
    /// No view and visible to the model: the tool as every host sees it.
    pub fn is_plain(&self) -> bool {
        self.resource_uri.is_none() && !self.app_only
    }
}

impl ToolSpec {
    /// A spec whose schemas come from Rust types.
    pub fn from_types<I: JsonSchema, O: JsonSchema>(name: &str, description: &str) -> Self {
        Self {
            name: name.to_owned(),
            title: None,
            description: description.to_owned(),
            input_schema: object_schema::<I>(),
            output_schema: Some(object_schema::<O>()),
            annotations: ToolAnnotations::default(),
            ui: ToolUi::default(),
        }
    }

    /// The same spec shown in the view at `uri` by hosts that have the extension.
    #[must_use]
    pub fn with_view(mut self, uri: &str) -> Self {
        self.ui.resource_uri = Some(uri.to_owned());
        self
    }
}

/// The JSON Schema of `T`, inlined (no `$ref`s to definitions), as MCP hosts expect.
pub fn object_schema<T: JsonSchema>() -> Value {
    let settings = schemars::generate::SchemaSettings::draft2020_12().with(|s| {
        s.inline_subschemas = true;
    });
    let schema = settings.into_generator().into_root_schema_for::<T>();
    let mut v = schema.to_value();
    if let Some(o) = v.as_object_mut() {
        o.remove("$schema");
        o.remove("title");
    }
    v
}

/// Hints for hosts (MCP tool annotations).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolAnnotations {
    /// Does not change anything the caller can see outside dataref's own store.
    pub read_only: bool,
    /// Talks to systems outside dataref (a database, an API).
    pub open_world: bool,
}
