//! `call_tool(tool, args_file, overrides?)`: a delegated call. The arguments come from a
//! JSON file in the caller's workspace with the model's `overrides` merged on top, so data
//! the server already wrote (a spill file, a run's output) reaches the next tool without
//! passing through the model's output.
//!
//! [`execute_tool_call`](crate::execute_tool_call) expands the call just before the target
//! runs: the schema check (and every later check) sees the expanded arguments, while the
//! caller's history keeps the short call it made.

use async_trait::async_trait;
use dataref_protocol::ToolSpec;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::{RunContext, Tool, ToolError, ToolOutput};

/// The delegating tool's name.
pub const CALL_TOOL: &str = "call_tool";

/// Largest argument file `call_tool` reads: far more than a model could write by hand.
pub const MAX_ARGS_FILE_BYTES: u64 = 1 << 20;

/// `call_tool`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CallToolArgs {
    /// The tool to call.
    pub tool: String,
    /// A workspace JSON file holding the tool's arguments as one object.
    pub args_file: String,
    /// Arguments you decide yourself; they win over the file's, key by key.
    #[serde(default)]
    pub overrides: Option<Map<String, Value>>,
}

const DESCRIPTION: &str = "\
Call a tool with arguments read from a workspace JSON file, so data the server holds reaches \
it without you copying it. Two steps: (1) `run_python` reads the spill file or dataRef and \
writes the arguments to `out/files/args.json`; (2) `call_tool(tool, \"args.json\", \
overrides)` with only your own decisions.";

/// The spec of `call_tool`. Its calls never reach [`Tool::call`]: `execute_tool_call`
/// expands and runs the target itself.
pub struct CallToolTool {
    spec: ToolSpec,
}

impl CallToolTool {
    pub fn new() -> Self {
        let mut spec = ToolSpec::from_types::<CallToolArgs, ()>(CALL_TOOL, DESCRIPTION);
        spec.title = Some("Call a tool with arguments from a file".into());
        // The result is the target's, whatever its shape.
        spec.output_schema = None;
        spec.annotations.read_only = false;
        spec.annotations.open_world = true;
        Self { spec }
    }
}

impl Default for CallToolTool {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl Tool for CallToolTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, _: Map<String, Value>, _: &RunContext) -> Result<ToolOutput, ToolError> {
        Err(ToolError::Fatal(
            "call_tool reached Tool::call; it must go through execute_tool_call".into(),
        ))
    }
}

/// Reads `args_file` (a JSON object, at most [`MAX_ARGS_FILE_BYTES`]) from the caller's
/// workspace.
pub(crate) fn read_args_file(
    ctx: &RunContext,
    requested: &str,
) -> Result<Map<String, Value>, ToolError> {
    let path = ctx.workspace.resolve(requested)?;
    let too_big = |size: u64| {
        ToolError::respond(
            format!(
                "`{}` has {size} bytes; an argument file may have at most {MAX_ARGS_FILE_BYTES} (1 MiB)",
                path.as_str()
            ),
            Some(
                "put the data in a file or a table the target tool reads by path or dataRef, \
                 and keep the arguments small"
                    .into(),
            ),
        )
    };
    let file = ctx.workspace.open_read(&path)?;
    let bytes = crate::tool::read_capped(file, path.as_str(), MAX_ARGS_FILE_BYTES, too_big)?;
    let hint =
        || Some("write exactly one JSON object whose keys are the target tool's parameters".into());
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ToolError::respond(
            format!("`{}` must hold one JSON object", path.as_str()),
            hint(),
        )),
        Err(e) => Err(ToolError::respond(
            format!("`{}` is not valid JSON: {e}", path.as_str()),
            hint(),
        )),
    }
}

/// `overrides` merged over `base`: objects key by key (recursively), anything else replaced.
pub(crate) fn merge(base: &mut Map<String, Value>, overrides: Map<String, Value>) {
    for (key, value) in overrides {
        match (base.get_mut(&key), value) {
            (Some(Value::Object(into)), Value::Object(from)) => merge(into, from),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn overrides_win_key_by_key() {
        let Value::Object(mut base) = json!({
            "title": "from file",
            "body": "long text",
            "labels": ["a", "b"],
            "meta": {"owner": "x", "priority": 1}
        }) else {
            unreachable!()
        };
        let Value::Object(over) = json!({
            "title": "mine",
            "labels": ["c"],
            "meta": {"priority": 3}
        }) else {
            unreachable!()
        };
        merge(&mut base, over);
        assert_eq!(
            Value::Object(base),
            json!({
                "title": "mine",
                "body": "long text",
                "labels": ["c"],
                "meta": {"owner": "x", "priority": 3}
            })
        );
    }
}
