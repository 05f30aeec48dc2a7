//! `dataref replay REF`: a stored table made again from its receipt, as its owner, and what
//! changed. Exit codes: 0 identical, 3 changed, 4 unavailable (1: dataref itself failed).

use std::io::Write;
use std::process::ExitCode;

use anyhow::Result;
use dataref_app::App;
use dataref_builtins::rederive::{self, Outcome, Parents, Replayed};
use dataref_protocol::DataRef;
use dataref_store::Example;

use crate::{Common, settings};

/// The exit code of a table whose rows differ.
const CHANGED: u8 = 3;
/// The exit code of a table that cannot be made again.
const UNAVAILABLE: u8 = 4;

pub fn run(
    common: &Common,
    principal: Option<&str>,
    data_ref: &str,
    stored_parents: bool,
    json_out: bool,
) -> Result<ExitCode> {
    let config = settings::config(common)?;
    let principal = settings::principal(principal, &config)?;
    let data_ref = DataRef::parse(data_ref).map_err(|e| {
        anyhow::anyhow!("`{data_ref}` is not a dataRef: {e}\nhint: `data_` and 22 characters, as the page or `list_artifacts` shows it")
    })?;
    let app = App::start(&config)?;
    let workspace = dataref_app::workspace(None, &app.shared, &principal)?;
    let ctx = app.shared.context(principal, workspace);
    let parents = if stored_parents {
        Parents::AsStored
    } else {
        Parents::Replay
    };
    let replayed = app.runtime.block_on(rederive::replay(
        &app.registry,
        &config,
        &ctx,
        &data_ref,
        parents,
    ));
    dataref_app::shutdown_python(app.python.as_deref());
    app.runtime.block_on(app.upstreams.shutdown());
    let mut out = std::io::stdout().lock();
    if json_out {
        writeln!(out, "{}", serde_json::to_string_pretty(&replayed)?)?;
    } else {
        print(&mut out, &replayed, "")?;
    }
    Ok(match replayed.outcome {
        Outcome::Identical => ExitCode::SUCCESS,
        Outcome::Changed { .. } => ExitCode::from(CHANGED),
        Outcome::Unavailable { .. } => ExitCode::from(UNAVAILABLE),
    })
}

/// One table's verdict, its diff and its parents', indented under it.
fn print(out: &mut impl Write, r: &Replayed, indent: &str) -> Result<()> {
    let what = match (&r.made_by, &r.name) {
        (Some(tool), Some(name)) => format!(" ({tool}: {name})"),
        _ => String::new(),
    };
    let verdict = match &r.outcome {
        Outcome::Identical => "identical".to_owned(),
        Outcome::Changed { .. } => "changed".to_owned(),
        Outcome::Unavailable { reason } => format!("unavailable: {reason}"),
    };
    writeln!(out, "{indent}{}{what}: {verdict}", r.data_ref)?;
    if let Outcome::Changed { diff } = &r.outcome {
        if let Some(c) = &diff.columns {
            writeln!(
                out,
                "{indent}  columns were [{}], are [{}]",
                c.before.join(", "),
                c.after.join(", ")
            )?;
        } else {
            let by = diff.key.as_ref().map_or_else(
                || " (no unique column: rows compared whole)".to_owned(),
                |k| format!(", matched by `{k}`"),
            );
            writeln!(
                out,
                "{indent}  rows {} → {}{by}: {} added, {} removed, {} changed{}",
                diff.rows_before,
                diff.rows_after,
                diff.added,
                diff.removed,
                diff.changed,
                if diff.reordered {
                    "; the same rows in another order"
                } else {
                    ""
                }
            )?;
        }
        for e in &diff.examples {
            match e {
                Example::Added { row } => {
                    writeln!(
                        out,
                        "{indent}  + {}",
                        serde_json::Value::Object(row.clone())
                    )?;
                }
                Example::Removed { row } => {
                    writeln!(
                        out,
                        "{indent}  - {}",
                        serde_json::Value::Object(row.clone())
                    )?;
                }
                Example::Changed { key, values } => {
                    let parts: Vec<String> = values
                        .iter()
                        .map(|c| format!("{}: {} → {}", c.column, c.before, c.after))
                        .collect();
                    let k = diff.key.as_deref().unwrap_or("key");
                    writeln!(out, "{indent}  ~ {k}={key}: {}", parts.join(", "))?;
                }
            }
        }
    }
    if let Some(made) = &r.replayed_as {
        writeln!(out, "{indent}  made again as {made}")?;
    }
    for p in &r.parents {
        writeln!(out, "{indent}  parent `{}`:", p.input)?;
        print(out, &p.table, &format!("{indent}    "))?;
    }
    Ok(())
}
