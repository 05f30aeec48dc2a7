//! `dataref replay REF`: a stored table made again from its receipt, and compared with the
//! table as stored.
//!
//! A producer's table (`fetch_*`, `query`, `load_file`, an HTTP tool) is made by calling the
//! same tool with the same arguments, as the same principal, on the sources as they are
//! now: a named query only while the config still holds it with the SQL the receipt
//! recorded (operator SQL the config no longer has is never run). A derived table
//! (`run_sql`, `run_python`) is made by running its SQL or code again over its parents:
//! each parent replayed first ([`Parents::Replay`], so a change at the source shows all
//! the way down) or read as stored ([`Parents::AsStored`], which checks only the
//! derivation, and needs the parents still stored with the checksums they had).
//!
//! The original is never touched: the table made again is a new table of the principal's
//! (it expires like any other), and the verdict is [`Outcome::Identical`],
//! [`Outcome::Changed`] with a short diff ([`dataref_store::compare_tables`]), or
//! [`Outcome::Unavailable`] with the reason (no receipt, a parent or the source gone, the
//! principal refused by the source).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;

use dataref_config::Config;
use dataref_protocol::{DataRef, Receipt};
use dataref_store::{ArtifactMeta, TableDiff, compare_tables};
use dataref_tool::{RunContext, ToolError, ToolRegistry};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::support::blocking;

/// What to derive a `run_sql` or `run_python` table from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parents {
    /// Replay each parent first, from its own receipt, and derive from those.
    Replay,
    /// Derive from the parents as they are stored (they must still be, unchanged).
    AsStored,
}

/// What a replay found.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "outcome", rename_all = "camelCase")]
pub enum Outcome {
    /// The same rows (in the same order, where the SQL sorted them).
    Identical,
    /// The rows differ.
    Changed { diff: TableDiff },
    /// The table cannot be made again; why.
    Unavailable { reason: String },
}

/// One table's replay, and its parents' when they were replayed first.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Replayed {
    pub data_ref: DataRef,
    /// The tool that made it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub made_by: Option<String>,
    /// What a person knows it by.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(flatten)]
    pub outcome: Outcome,
    /// The table made again: a new table of the principal's, until its TTL.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replayed_as: Option<DataRef>,
    /// The parents as each was replayed (with [`Parents::Replay`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub parents: Vec<ReplayedParent>,
}

/// A parent's replay, under the name the SQL or code knew it by.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayedParent {
    /// The name the SQL or code knew it by.
    pub input: String,
    #[serde(flatten)]
    pub table: Replayed,
}

impl Replayed {
    fn unavailable(data_ref: &DataRef, meta: Option<&ArtifactMeta>, reason: String) -> Self {
        Self {
            data_ref: data_ref.clone(),
            made_by: meta.map(|m| m.lineage.tool.clone()),
            name: meta.map(|m| m.lineage.name()),
            outcome: Outcome::Unavailable { reason },
            replayed_as: None,
            parents: Vec::new(),
        }
    }
}

/// Tables deep a lineage is replayed, at most: each level is a table derived from the one
/// below, so a deeper chain is refused rather than followed without end.
pub const MAX_REPLAY_DEPTH: usize = 64;

/// Makes `data_ref` again as `ctx`'s principal through `registry`'s tools and compares.
pub async fn replay(
    registry: &ToolRegistry,
    config: &Config,
    ctx: &RunContext,
    data_ref: &DataRef,
    parents: Parents,
) -> Replayed {
    let walk = Walk {
        registry,
        config,
        ctx,
        parents,
        done: Mutex::new(HashMap::new()),
    };
    walk.replay(data_ref.clone(), 0).await
}

/// One replay's walk down a lineage: a parent two tables share is made again once.
struct Walk<'a> {
    registry: &'a ToolRegistry,
    config: &'a Config,
    ctx: &'a RunContext,
    parents: Parents,
    /// The tables replayed so far in this walk.
    done: Mutex<HashMap<DataRef, Replayed>>,
}

impl Walk<'_> {
    fn replay(
        &self,
        data_ref: DataRef,
        depth: usize,
    ) -> Pin<Box<dyn Future<Output = Replayed> + Send + '_>> {
        Box::pin(async move {
            let seen = self
                .done
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get(&data_ref)
                .cloned();
            if let Some(r) = seen {
                return r;
            }
            let r = replay_one(self, data_ref.clone(), depth).await;
            self.done
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(data_ref, r.clone());
            r
        })
    }
}

async fn replay_one(walk: &Walk<'_>, data_ref: DataRef, depth: usize) -> Replayed {
    let Walk {
        registry,
        config,
        ctx,
        parents,
        ..
    } = *walk;
    {
        if depth > MAX_REPLAY_DEPTH {
            return Replayed::unavailable(
                &data_ref,
                None,
                format!(
                    "its lineage is more than {MAX_REPLAY_DEPTH} tables deep; replay a table \
                     nearer its sources, or use --stored-parents"
                ),
            );
        }
        let meta = {
            let (store, owner, r) = (ctx.store.clone(), ctx.principal.clone(), data_ref.clone());
            blocking("replay", move || Ok(store.meta(&owner, &r)?)).await
        };
        let meta = match meta {
            Ok(m) => m,
            // Unknown, expired and another principal's answer alike.
            Err(e) => return Replayed::unavailable(&data_ref, None, said(&e)),
        };
        let Some(receipt) = meta.lineage.receipt.clone() else {
            return Replayed::unavailable(
                &data_ref,
                Some(&meta),
                "it has no receipt: it was stored before dataref kept them".into(),
            );
        };
        let mut out = Replayed::unavailable(&data_ref, Some(&meta), String::new());
        let args = match meta.lineage.args.as_object() {
            Some(a) => a.clone(),
            None => Map::new(),
        };
        let tool = meta.lineage.tool.as_str();
        let call = match tool {
            "run_sql" | "run_python" => {
                let mut inputs = Map::new();
                for parent in &receipt.parents {
                    let from = match parents {
                        Parents::Replay => {
                            let r = walk.replay(parent.data_ref.clone(), depth + 1).await;
                            let made = r.replayed_as.clone();
                            let reason = match &r.outcome {
                                Outcome::Unavailable { reason } => Some(reason.clone()),
                                Outcome::Identical | Outcome::Changed { .. } => None,
                            };
                            out.parents.push(ReplayedParent {
                                input: parent.name.clone(),
                                table: r,
                            });
                            match (made, reason) {
                                (Some(made), None) => made,
                                (_, reason) => {
                                    out.outcome = Outcome::Unavailable {
                                        reason: format!(
                                            "its parent `{}` cannot be made again: {}",
                                            parent.name,
                                            reason.unwrap_or_default()
                                        ),
                                    };
                                    return out;
                                }
                            }
                        }
                        Parents::AsStored => {
                            let (store, owner, r) = (
                                ctx.store.clone(),
                                ctx.principal.clone(),
                                parent.data_ref.clone(),
                            );
                            let stored =
                                blocking("replay", move || Ok(store.meta(&owner, &r)?)).await;
                            let now = stored.as_ref().ok().and_then(|m| m.checksum);
                            let same = match (&parent.checksum, now) {
                                (Some(then), Some(now)) => *then == now.to_string(),
                                _ => true,
                            };
                            if stored.is_err() || !same {
                                out.outcome = Outcome::Unavailable {
                                    reason: format!(
                                        "its parent `{}` (`{}`) is no longer stored as it was \
                                         (expired?); replay it from its sources instead",
                                        parent.name, parent.data_ref
                                    ),
                                };
                                return out;
                            }
                            parent.data_ref.clone()
                        }
                    };
                    inputs.insert(parent.name.clone(), Value::String(from.as_str().to_owned()));
                }
                let mut call = Map::new();
                call.insert("inputs".into(), Value::Object(inputs));
                if tool == "run_sql" {
                    call.insert(
                        "sql".into(),
                        Value::from(receipt.sql.clone().unwrap_or_default()),
                    );
                } else {
                    // The code as it ran (a `code_file` may have changed since).
                    call.insert(
                        "code".into(),
                        Value::from(receipt.code.clone().unwrap_or_default()),
                    );
                    if let Some(files) = args.get("files") {
                        call.insert("files".into(), files.clone());
                    }
                }
                call
            }
            named if config.queries.values().any(|q| q.tool_name() == named) => {
                let query = config.queries.values().find(|q| q.tool_name() == named);
                if query.map(|q| q.sql.as_str()) != receipt.sql.as_deref() {
                    out.outcome = Outcome::Unavailable {
                        reason: format!(
                            "the SQL of `{named}` in the config is not the SQL this table was \
                             read with (the operator changed it since)"
                        ),
                    };
                    return out;
                }
                args
            }
            other if other.starts_with("fetch_") => {
                out.outcome = Outcome::Unavailable {
                    reason: format!("the config no longer has the query behind `{other}`"),
                };
                return out;
            }
            _ => args,
        };
        let Some(runner) = registry.get(tool) else {
            out.outcome = Outcome::Unavailable {
                reason: format!("this server has no tool `{tool}` now"),
            };
            return out;
        };
        let made = match runner.call(call, ctx).await {
            Ok(o) => made_ref(&o.structured, receipt.output.as_deref()),
            Err(ToolError::RespondToModel {
                message,
                hint: Some(h),
            }) => Err(format!("{message} (hint: {h})")),
            Err(e) => Err(said(&e)),
        };
        let made = match made {
            Ok(r) => r,
            Err(reason) => {
                out.outcome = Outcome::Unavailable { reason };
                return out;
            }
        };
        out.replayed_as = Some(made.clone());
        out.outcome = compare(ctx, &data_ref, &made, &receipt, tool).await;
        out
    }
}

/// The table a re-run made, from its result: `dataRef`, or run_python's output of that name.
fn made_ref(result: &Value, output: Option<&str>) -> Result<DataRef, String> {
    let found = match output {
        Some(name) => {
            if result.get("ok") == Some(&Value::Bool(false)) {
                let error = result
                    .pointer("/error/message")
                    .and_then(Value::as_str)
                    .unwrap_or("no message");
                return Err(format!("the code failed this time: {error}"));
            }
            result
                .pointer(&format!(
                    "/outputs/{}/dataRef",
                    name.replace('~', "~0").replace('/', "~1")
                ))
                .ok_or_else(|| format!("the code made no output `{name}` this time"))?
        }
        None => result
            .get("dataRef")
            .ok_or_else(|| "the re-run stored no table".to_owned())?,
    };
    found
        .as_str()
        .and_then(|s| DataRef::parse(s).ok())
        .ok_or_else(|| "the re-run answered without a dataRef".to_owned())
}

async fn compare(
    ctx: &RunContext,
    before: &DataRef,
    after: &DataRef,
    receipt: &Receipt,
    tool: &str,
) -> Outcome {
    // Python's row order is the code's own business; SQL's only when it sorts.
    let ordered = tool != "run_python" && receipt.sql_is_ordered();
    let (store, owner) = (ctx.store.clone(), ctx.principal.clone());
    let (before, after) = (before.clone(), after.clone());
    let diff = blocking("replay", move || {
        let a = store.open_table(&owner, &before)?;
        let b = store.open_table(&owner, &after)?;
        Ok(compare_tables(
            (a.meta.schema.as_ref(), &a.batches),
            (b.meta.schema.as_ref(), &b.batches),
            ordered,
        ))
    })
    .await;
    match diff {
        Ok(d) if d.is_identical() => Outcome::Identical,
        Ok(diff) => Outcome::Changed { diff },
        Err(e) => Outcome::Unavailable { reason: said(&e) },
    }
}

fn said(e: &ToolError) -> String {
    match e {
        ToolError::RespondToModel { message, .. } => message.clone(),
        // `ToolError` is `#[non_exhaustive]`; `Fatal` says "internal error: …".
        other => other.to_string(),
    }
}
