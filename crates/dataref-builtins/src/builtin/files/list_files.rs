//! `list_files(path?, glob?, recursive?, maxEntries?)`: a bounded listing of the workspace.

use async_trait::async_trait;
use dataref_protocol::{Timestamp, ToolSpec};
use dataref_tool::TypedTool;
use dataref_tool::{RunContext, ToolError, ToolOutput};
use dataref_workspace::{EntryKind, Glob, Listing, TEMP_PREFIX, TreeOptions};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::thousands;
use crate::support::{blocking, output, spec_for};

const DEFAULT_MAX_ENTRIES: usize = 200;
const MAX_ENTRIES: usize = 1_000;
/// Extra entries asked of the workspace, so that hiding dataref's own temporary files
/// still leaves `maxEntries` to show.
const HIDDEN_SLACK: usize = 32;

/// Arguments of `list_files`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListArgs {
    /// A directory relative to your workspace (default: its root).
    #[serde(default)]
    path: Option<String>,
    /// Only paths matching, e.g. `*.csv`, `**/*.csv` (any depth).
    #[serde(default)]
    glob: Option<String>,
    /// The whole tree below `path`.
    #[serde(default)]
    recursive: Option<bool>,
    /// At most this many entries (default 200).
    #[serde(default)]
    #[schemars(range(min = 1, max = 1000))]
    max_entries: Option<usize>,
}

/// What an entry is: `other` is a device, socket or pipe. Links are shown as links and
/// never followed in a listing.
#[derive(Debug, Clone, Copy, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
enum Kind {
    File,
    Directory,
    Symlink,
    Other,
}

impl From<EntryKind> for Kind {
    fn from(k: EntryKind) -> Self {
        match k {
            EntryKind::File => Self::File,
            EntryKind::Directory => Self::Directory,
            EntryKind::Symlink => Self::Symlink,
            EntryKind::Other => Self::Other,
        }
    }
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct FileEntry {
    /// Relative to your workspace: pass it as is to `read_file` or `copy_file`.
    path: String,
    kind: Kind,
    /// Size in bytes (files only).
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes: Option<u64>,
    /// Last modification, UTC.
    modified: Timestamp,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct ListResult {
    /// Sorted by path.
    entries: Vec<FileEntry>,
    /// More entries exist than are shown.
    truncated: bool,
    /// What was left out and how to see it.
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

pub struct ListFilesTool {
    spec: ToolSpec,
}

impl ListFilesTool {
    pub fn new() -> Self {
        Self {
            spec: spec_for::<ListArgs, ListResult>(
                "list_files",
                "List files in your workspace with sizes and times: a directory's entries, or \
                 the whole tree below it with `recursive` or a `glob`. `truncated` and `note` \
                 say when entries were left out. The paths can be passed to `read_file` and \
                 `copy_file` as they are.",
                true,
                false,
            ),
        }
    }

    /// The same listing as the view's own tool `view_files` (app-only: never a model's,
    /// never spilled), for the page's file list.
    pub fn for_view() -> Self {
        let mut spec = spec_for::<ListArgs, ListResult>(
            "view_files",
            "For the view: the files in your workspace, to download.",
            true,
            false,
        );
        spec.ui.app_only = true;
        spec.ui.resource_uri = Some(dataref_protocol::VIEW_URI.into());
        Self { spec }
    }
}

#[async_trait]
impl TypedTool for ListFilesTool {
    type Args = ListArgs;

    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, a: ListArgs, ctx: &RunContext) -> Result<ToolOutput, ToolError> {
        let max_entries = a
            .max_entries
            .unwrap_or(DEFAULT_MAX_ENTRIES)
            .clamp(1, MAX_ENTRIES);
        let glob = a
            .glob
            .as_deref()
            .map(Glob::new)
            .transpose()
            .map_err(|e| ToolError::respond(e.to_string(), e.hint()))?;
        let recursive = glob.is_some() || a.recursive.unwrap_or(false);
        let workspace = ctx.workspace.clone();
        let requested = a.path.unwrap_or_else(|| ".".to_owned());
        let (dir, listing, options) = blocking("list_files", move || {
            let dir = workspace.resolve(&requested)?;
            let ask = max_entries + HIDDEN_SLACK;
            let options = TreeOptions {
                glob,
                max_entries: ask,
                ..TreeOptions::default()
            };
            let listing = if recursive {
                workspace.list_tree(&dir, &options)?
            } else {
                workspace.list_dir(&dir, ask)?
            };
            Ok((dir, listing, options))
        })
        .await?;
        let Listing {
            entries,
            truncated,
            depth_limited,
            skipped_non_utf8,
        } = listing;
        let mut entries: Vec<FileEntry> = entries
            .into_iter()
            .filter(|e| {
                !e.path
                    .file_name()
                    .is_some_and(|name| name.starts_with(TEMP_PREFIX))
            })
            .map(|e| FileEntry {
                path: e.path.as_str().to_owned(),
                kind: e.kind.into(),
                bytes: (e.kind == EntryKind::File).then_some(e.size),
                modified: e.modified,
            })
            .collect();
        let truncated = truncated || entries.len() > max_entries;
        entries.truncate(max_entries);

        let mut notes = Vec::new();
        if truncated {
            let narrow = if recursive {
                "narrow it with `glob` (e.g. `**/*.csv`) or a deeper `path`"
            } else {
                "narrow it with `glob` (e.g. `*.csv`)"
            };
            notes.push(format!(
                "only the first {} entries are shown; {narrow}{}",
                thousands(entries.len() as u64),
                if max_entries < MAX_ENTRIES {
                    ", or raise `maxEntries` (at most 1,000)"
                } else {
                    ""
                }
            ));
        }
        if depth_limited {
            notes.push(format!(
                "directories more than {} levels below `{}` were not entered; list them with a \
                 deeper `path`",
                options.max_depth, dir
            ));
        }
        if skipped_non_utf8 > 0 {
            notes.push(format!(
                "{} entries were left out because their names are not UTF-8 (they cannot be \
                 named in a request)",
                thousands(skipped_non_utf8 as u64)
            ));
        }
        if entries.is_empty() && !truncated {
            notes.push(match &options.glob {
                Some(g) => format!("nothing below `{dir}` matches `{}`", g.as_str()),
                None => format!("`{dir}` is empty"),
            });
        }
        output(ListResult {
            entries,
            truncated,
            note: (!notes.is_empty()).then(|| notes.join("; ")),
        })
    }
}
