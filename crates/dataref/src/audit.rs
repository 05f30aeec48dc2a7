//! `dataref audit`: `verify` walks the trail's hash chain and names the first line that is
//! edited, removed, reordered or torn, a file missing between two others, or lines cut off
//! the end (the writer's head is ahead of the files); `show` prints
//! its lines, filtered. And [`install`], which every command that serves tools calls at
//! start so their data accesses are recorded.
#![expect(
    clippy::disallowed_methods,
    reason = "the trail's own files are read here, outside every workspace and the store"
)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Subcommand;
use dataref_config::Config;
use dataref_ops::audit::{self, AuditLog, Verified};

use crate::{Common, settings};

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check the hash chain of every file, in order, and its end against the writer's head:
    /// exit 0 when it is whole, 3 naming the first file and line that is edited, removed,
    /// reordered or torn, a missing file, or lines cut off the end (`truncated`).
    Verify {
        /// The trail's directory (default: `[audit] dir`, else `<data dir>/audit`).
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// Print one JSON object: files, lines, first and last seq, and the problem.
        #[arg(long)]
        json: bool,
        /// Also check the shared index's copy (`[shared]`): each line gives its hash and
        /// chains, and each is in the files as written; a line the index holds past the
        /// files' end means the files were cut.
        #[arg(long)]
        index: bool,
    },
    /// Print the trail's lines (JSON), oldest first, filtered.
    Show {
        /// The trail's directory (default: `[audit] dir`, else `<data dir>/audit`).
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// Lines at or after this UTC date or time (`2026-12-07`, `2026-12-07T10:00:00Z`).
        #[arg(long, value_name = "DATE")]
        since: Option<String>,
        /// Lines of this principal only.
        #[arg(long, value_name = "NAME")]
        principal: Option<String>,
        /// Lines of this event only (`tool_call`, `download`, `approval_asked`,
        /// `approval_answered`, `auth_failed`).
        #[arg(long, value_name = "KIND")]
        event: Option<String>,
    },
}

/// Opens and installs the process's audit trail when `[audit]` keeps one. A trail that
/// cannot be opened stops the start: serving unaudited is not what the config asked for.
pub fn install(config: &Config) -> Result<()> {
    if !config.audit.enabled {
        return Ok(());
    }
    let log = AuditLog::open(&config.audit.dir, config.audit.rotate)
        .map_err(|e| anyhow::anyhow!("{e}\nhint: {}", e.hint()))?;
    tracing::debug!(dir = %config.audit.dir.display(), "audit trail open");
    // A second install (two commands in one process, tests) keeps the first.
    if !audit::install(log) {
        tracing::debug!("an audit trail was open already; it is kept");
    }
    Ok(())
}

/// With `[shared]`, each line of the installed trail is also copied to the index's
/// `dataref_audit`, in the background.
pub fn copy_to_index(app: &dataref_app::App) {
    if let (Some(shared), Some(trail)) = (&app.shared_backend, audit::log_id()) {
        audit::forward_to(shared.audit_forward(trail));
    }
}

pub fn run(common: &Common, command: Command) -> Result<ExitCode> {
    match command {
        Command::Verify { dir, json, index } => {
            let copy = if index {
                let config = settings::config(common)?;
                let dir = dir.clone().unwrap_or_else(|| config.audit.dir.clone());
                Some(index_copy(&config, &dir)?)
            } else {
                None
            };
            verify(&dir_of(common, dir)?, json, copy)
        }
        Command::Show {
            dir,
            since,
            principal,
            event,
        } => show(
            &dir_of(common, dir)?,
            since.as_deref(),
            principal.as_deref(),
            event.as_deref(),
        ),
    }
}

fn dir_of(common: &Common, dir: Option<PathBuf>) -> Result<PathBuf> {
    match dir {
        Some(d) => Ok(d),
        None => Ok(settings::config(common)?.audit.dir),
    }
}

/// The shared index's copy of the trail in `dir`: its lines, by seq.
fn index_copy(config: &Config, dir: &Path) -> Result<Vec<(u64, String)>> {
    let Some(shared) = dataref_app::look_at_shared(config)? else {
        anyhow::bail!(
            "`--index` checks the shared index's copy, and this config has no `[shared]`\n\
             hint: run it with the config of a replica, or leave `--index` out"
        );
    };
    if !shared.pending_migrations().is_empty() {
        anyhow::bail!(
            "the shared index has no audit copy yet: no server of this version has set it up\n\
             hint: start one `dataref serve` with this config first"
        );
    }
    let Some(id) = audit::trail_id_in(dir)
        .with_context(|| format!("reading the trail's id in {}", dir.display()))?
    else {
        anyhow::bail!(
            "{} has no `audit.id`: no trail was written there\nhint: name the trail's \
             directory with `--dir`",
            dir.display()
        );
    };
    shared
        .audit_lines(&id)
        .map_err(|e| anyhow::anyhow!("reading the index's copy of trail {id}: {e}"))
}

fn verify(dir: &Path, json: bool, copy: Option<Vec<(u64, String)>>) -> Result<ExitCode> {
    let hint = |e: audit::AuditError| {
        anyhow::anyhow!(
            "{e}\nhint: name the trail's directory with `--dir`, or check `[audit] dir`"
        )
    };
    let v = audit::verify(dir).map_err(hint)?;
    let c = copy
        .map(|rows| audit::verify_copy(dir, &rows))
        .transpose()
        .map_err(hint)?;
    let whole = v.problem.is_none() && c.as_ref().is_none_or(|c| c.problem.is_none());
    let mut out = std::io::stdout().lock();
    if json {
        let mut value = serde_json::to_value(&v)?;
        value["dir"] = dir.display().to_string().into();
        value["ok"] = whole.into();
        if let Some(c) = &c {
            value["index"] = serde_json::to_value(c)?;
        }
        writeln!(out, "{value}")?;
    } else {
        report(&mut out, dir, &v)?;
        if let Some(c) = &c {
            report_copy(&mut out, c)?;
        }
    }
    Ok(if whole {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(3)
    })
}

fn report_copy(out: &mut impl Write, c: &audit::CopyVerified) -> Result<()> {
    match &c.problem {
        None => writeln!(
            out,
            "the shared index's copy is whole and matches the files: {} lines, {} found in \
             the files{}",
            c.lines,
            c.matched,
            if c.gaps > 0 {
                format!(
                    "; {} seqs were never copied (dropped on the way, the files keep them)",
                    c.gaps
                )
            } else {
                String::new()
            }
        )?,
        Some(p) => writeln!(
            out,
            "the shared index's copy disagrees at seq {}: {}: {}",
            p.line,
            p.kind.as_str(),
            p.detail
        )?,
    }
    Ok(())
}

fn report(out: &mut impl Write, dir: &Path, v: &Verified) -> Result<()> {
    let span = match (v.first_seq, v.last_seq) {
        (Some(a), Some(b)) => format!(" (seq {a} to {b})"),
        _ => String::new(),
    };
    match &v.problem {
        None => {
            writeln!(
                out,
                "the audit trail in {} is whole: {} lines in {} files{span}",
                dir.display(),
                v.lines,
                v.files
            )?;
            if v.lines > 0 && !v.from_genesis {
                writeln!(
                    out,
                    "note: it starts at seq {}: older files were archived or removed",
                    v.first_seq.unwrap_or_default()
                )?;
            }
        }
        Some(p) => {
            let at = if p.line == 0 {
                p.file.clone()
            } else {
                format!("{} line {}", p.file, p.line)
            };
            writeln!(
                out,
                "the audit trail in {} is broken at {at}: {}: {}",
                dir.display(),
                p.kind.as_str(),
                p.detail
            )?;
            writeln!(
                out,
                "{} lines before it are whole{span}\nhint: compare with the copy your log \
                 shipper sent on (SIEM, object storage); the lines from there on cannot be \
                 trusted as written",
                v.lines
            )?;
        }
    }
    Ok(())
}

fn show(
    dir: &Path,
    since: Option<&str>,
    principal: Option<&str>,
    event: Option<&str>,
) -> Result<ExitCode> {
    if let Some(s) = since
        && !valid_since(s)
    {
        anyhow::bail!(
            "`--since {s}` is not a UTC date or time\nhint: write `2026-12-07` or `2026-12-07T10:00:00Z`"
        );
    }
    let mut files: Vec<(u32, PathBuf)> = std::fs::read_dir(dir)
        .with_context(|| format!("reading the audit directory {}", dir.display()))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_owned();
            let n = name
                .strip_prefix("audit-")?
                .strip_suffix(".jsonl")?
                .parse()
                .ok()?;
            Some((n, e.path()))
        })
        .collect();
    files.sort();
    let mut out = std::io::stdout().lock();
    for (_, path) in files {
        let f =
            std::fs::File::open(&path).with_context(|| format!("reading {}", path.display()))?;
        for line in BufReader::new(f).lines() {
            let line = line?;
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            let field = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or_default();
            if since.is_some_and(|s| field("at") < s)
                || principal.is_some_and(|p| field("principal") != p)
                || event.is_some_and(|e| field("event") != e)
            {
                continue;
            }
            writeln!(out, "{line}")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `YYYY-MM-DD`, or the same with `THH:MM[:SS…]Z`: compared as text with each line's `at`.
fn valid_since(s: &str) -> bool {
    let b = s.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| b.get(r).is_some_and(|d| d.iter().all(u8::is_ascii_digit));
    let date = b.len() >= 10
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10);
    date && (b.len() == 10
        || (b[10] == b'T' && b.len() >= 16 && digits(11..13) && b[13] == b':' && digits(14..16)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_forms() {
        assert!(valid_since("2026-12-07"));
        assert!(valid_since("2026-12-07T10:00:00Z"));
        assert!(valid_since("2026-12-07T10:00"));
        assert!(!valid_since("yesterday"));
        assert!(!valid_since("2026-12-0"));
        assert!(!valid_since("2026-12-07 10:00"));
    }
}
