//! `copy_file(src, dst, overwrite?)`: a copy within the workspace, written atomically.

use std::io;

use async_trait::async_trait;
use dataref_protocol::ToolSpec;
use dataref_tool::TypedTool;
use dataref_tool::{RunContext, ToolError, ToolOutput};
use dataref_workspace::{EntryKind, Overwrite, WorkspacePathError};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::support::{blocking, output, spec_for};

/// Arguments of `copy_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CopyArgs {
    /// The file to copy, relative to your workspace.
    src: String,
    /// The new path, e.g. `reports/q3-sales.csv`.
    dst: String,
    /// Replace an existing `dst`.
    #[serde(default)]
    overwrite: Option<bool>,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct CopyResult {
    /// The new file, relative to your workspace.
    path: String,
    /// Its size in bytes.
    bytes: u64,
}

pub struct CopyFileTool {
    spec: ToolSpec,
}

impl CopyFileTool {
    pub fn new() -> Self {
        Self {
            spec: spec_for::<CopyArgs, CopyResult>(
                "copy_file",
                "Copy a file within your workspace, e.g. to keep a spilled result or an export \
                 under a name the person chose. Missing directories are created; an existing \
                 `dst` is replaced only with `overwrite: true`.",
                false,
                false,
            ),
        }
    }
}

#[async_trait]
impl TypedTool for CopyFileTool {
    type Args = CopyArgs;

    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, a: CopyArgs, ctx: &RunContext) -> Result<ToolOutput, ToolError> {
        let overwrite = if a.overwrite.unwrap_or(false) {
            Overwrite::Replace
        } else {
            Overwrite::Refuse
        };
        let workspace = ctx.workspace.clone();
        let result = blocking("copy_file", move || {
            // The steps of `Workspace::copy`, taken one at a time so that a refusal can say
            // whether `src` or `dst` caused it, and the size comes from the copy itself.
            let src = workspace.resolve(&a.src)?;
            let mut from = workspace.open_read(&src)?;
            let mut to = workspace
                .create_atomic(&a.dst, overwrite)
                .map_err(dst_error)?;
            let bytes = io::copy(&mut from, &mut to).map_err(|e| {
                let to = to.path().as_str().to_owned();
                match WorkspacePathError::write_failed(&to, e) {
                    quota @ WorkspacePathError::QuotaExceeded { .. } => ToolError::from(quota),
                    other => ToolError::Fatal(format!("copying `{src}` to `{to}`: {other}")),
                }
            })?;
            let path = to.commit().map_err(dst_error)?;
            Ok(CopyResult {
                path: path.as_str().to_owned(),
                bytes,
            })
        })
        .await?;
        output(result)
    }
}

/// Refusals about `dst` with hints for this tool (the workspace's own hints are about
/// reading).
fn dst_error(e: WorkspacePathError) -> ToolError {
    match &e {
        WorkspacePathError::AlreadyExists { .. } => ToolError::respond(
            e.to_string(),
            Some("pass `overwrite: true` to replace it, or pick another `dst`".into()),
        ),
        WorkspacePathError::NotAFile {
            found: EntryKind::Directory,
            ..
        } => ToolError::respond(
            e.to_string(),
            Some("`dst` names the new file itself, e.g. `reports/sales.csv`".into()),
        ),
        _ => e.into(),
    }
}
