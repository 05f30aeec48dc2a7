//! `dataref sessions`: a principal's agent sessions — list, show, delete, and export as the
//! reproducible analysis record (a notebook or a Python script that re-runs the producers
//! and the code against the sources, with no rows in it), or as an eval case.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use dataref_agent::{Role, SessionStore};
use dataref_builtins::replay::{ExportMeta, notebook, script};
use dataref_store::{Clock, SystemClock};

use crate::{Common, settings};

/// What `dataref sessions` was asked to do.
pub enum Action<'a> {
    List,
    Show(&'a str),
    Delete(&'a str),
    Export {
        id: &'a str,
        format: &'a str,
        out: Option<&'a Path>,
    },
}

pub fn run(common: &Common, principal: Option<&str>, action: Action<'_>) -> Result<ExitCode> {
    let config = settings::config(common)?;
    let principal = settings::principal(principal, &config)?;
    // With `[shared]`, the sessions every replica serves, not this data dir's.
    let sessions = match dataref_app::look_at_shared(&config)? {
        Some(shared) if !shared.pending_migrations().is_empty() => anyhow::bail!(
            "the shared index has no agent sessions yet: no server of this version has set it up\n\
             hint: start `dataref serve --http` with this config once (it brings the index up to date)"
        ),
        Some(shared) => shared.session_store(),
        None => SessionStore::open(&config.home).map_err(|e| anyhow::anyhow!("{e}"))?,
    };
    let nf = |e: dataref_agent::SessionError| {
        anyhow::anyhow!("{e}\nhint: `dataref sessions` lists the sessions of `{principal}`")
    };
    let mut out = std::io::stdout().lock();
    match action {
        Action::List => {
            let list = sessions.list(&principal).map_err(nf)?;
            if list.is_empty() {
                writeln!(out, "no sessions for `{principal}`")?;
            }
            for s in list {
                let ungrounded = match s.ungrounded {
                    0 => String::new(),
                    n => format!(", {n} not grounded"),
                };
                writeln!(
                    out,
                    "{}  {}  {} runs, {} messages, {} tokens{ungrounded}  agent {}  {}",
                    s.id,
                    s.updated,
                    s.runs,
                    s.messages,
                    s.usage.total(),
                    s.agent,
                    s.title
                )?;
            }
        }
        Action::Show(id) => {
            for m in sessions.history(&principal, id, None).map_err(nf)? {
                let who = match m.role {
                    Role::System => "system",
                    Role::User => "you",
                    Role::Assistant => "agent",
                    Role::Tool => "tool",
                };
                if !m.content.is_empty() {
                    writeln!(out, "{who}> {}", m.content)?;
                }
                for c in &m.tool_calls {
                    writeln!(out, "{who}> calls {} {}", c.name, c.arguments)?;
                }
            }
        }
        Action::Delete(id) => {
            sessions.delete(&principal, id).map_err(nf)?;
            writeln!(out, "deleted session {id}")?;
        }
        Action::Export {
            id,
            format,
            out: to,
        } => {
            let info = sessions.info(&principal, id).map_err(nf)?;
            let history = sessions.history(&principal, id, None).map_err(nf)?;
            let meta = ExportMeta {
                session: id.to_owned(),
                agent: info.agent,
                principal: principal.to_string(),
                exported: SystemClock.now(),
            };
            let (text, ext) = match format {
                "ipynb" | "notebook" => (
                    serde_json::to_string_pretty(&notebook(
                        &dataref_agent::record::record(&history),
                        &meta,
                        &config,
                    ))?,
                    "ipynb",
                ),
                "script" | "py" => (
                    script(&dataref_agent::record::record(&history), &meta, &config),
                    "py",
                ),
                // `--eval`: a case for `dataref eval`.
                "eval" => (
                    crate::eval::case_from_session(id, &history, &config)?,
                    "toml",
                ),
                other => anyhow::bail!(
                    "unknown export format `{other}`\nhint: use `--format ipynb` or `--format script`"
                ),
            };
            let path = match to {
                Some(p) => p.to_owned(),
                None => std::path::PathBuf::from(format!("{id}.{ext}")),
            };
            std::fs::write(&path, text).with_context(|| format!("writing `{}`", path.display()))?;
            writeln!(out, "wrote {}", path.display())?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
