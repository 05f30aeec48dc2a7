//! `dataref doctor`: checks what dataref needs and says how to fix what is missing.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;
use dataref_config::{Config, SourceKind};

use crate::{Common, settings};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Ok,
    /// Not needed by anything in this build, or degraded but working.
    Warn,
    Fail,
}

struct Check {
    status: Status,
    what: String,
    detail: String,
    hint: Option<String>,
}

fn check(status: Status, what: &str, detail: impl Into<String>, hint: Option<&str>) -> Check {
    Check {
        status,
        what: what.to_owned(),
        detail: detail.into(),
        hint: hint.map(str::to_owned),
    }
}

pub fn run(common: &Common) -> Result<ExitCode> {
    let mut checks = Vec::new();
    match settings::home(common) {
        Ok(home) => checks.push(data_dir(&home)),
        Err(e) => checks.push(check(Status::Fail, "data dir", format!("{e:#}"), None)),
    }
    match settings::config(common) {
        Ok(config) => {
            checks.push(match &config.sample {
                Some(s) => check(Status::Ok, "config", format!("built-in sample ({} rows); no config file given", s.rows), Some("to serve your own data, write a dataref.toml and pass `--config` or set `DATAREF_CONFIG`")),
                None => check(Status::Ok, "config", format!("{} sources, {} named queries", config.sources.len(), config.queries.len()), None),
            });
            checks.push(store(&config));
            checks.extend(sources(&config));
        }
        Err(e) => checks.push(check(Status::Fail, "config", format!("{e:#}"), None)),
    }
    if let Ok(home) = settings::home(common) {
        checks.push(python(&home));
    }
    checks.push(sandbox());

    let mut out = std::io::stdout().lock();
    writeln!(out, "dataref doctor")?;
    for c in &checks {
        let tag = match c.status {
            Status::Ok => "ok  ",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
        };
        writeln!(out, "  {tag}  {:<16} {}", c.what, c.detail)?;
        if let Some(h) = c.hint.as_ref().filter(|_| c.status != Status::Ok) {
            writeln!(out, "        {:<16} hint: {h}", "")?;
        }
    }
    let failed = checks.iter().filter(|c| c.status == Status::Fail).count();
    if failed > 0 {
        writeln!(out, "{failed} check(s) failed")?;
        return Ok(ExitCode::FAILURE);
    }
    writeln!(out, "all required checks passed")?;
    Ok(ExitCode::SUCCESS)
}

fn data_dir(home: &Path) -> Check {
    let probe = home.join(".doctor-probe");
    let result = std::fs::create_dir_all(home)
        .and_then(|()| std::fs::write(&probe, b"probe"))
        .and_then(|()| std::fs::remove_file(&probe));
    match result {
        Ok(()) => check(
            Status::Ok,
            "data dir",
            format!("{} (writable)", home.display()),
            None,
        ),
        Err(e) => check(
            Status::Fail,
            "data dir",
            format!("{}: {e}", home.display()),
            Some("make it writable, or pass `--home DIR` / set `DATAREF_HOME`"),
        ),
    }
}

fn store(config: &Config) -> Check {
    match settings::open_store(config) {
        Ok(_) => check(
            Status::Ok,
            "artifact store",
            format!("{}", config.home.join("index.sqlite").display()),
            None,
        ),
        Err(e) => check(Status::Fail, "artifact store", format!("{e:#}"), None),
    }
}

fn sources(config: &Config) -> Vec<Check> {
    config
        .sources
        .values()
        .map(|s| {
            let what = format!("source {}", s.name);
            match &s.kind {
                SourceKind::Sqlite { path } => {
                    let is_sample = config.sample.as_ref().is_some_and(|sp| &sp.path == path);
                    match std::fs::File::open(path) {
                        Ok(_) => check(
                            Status::Ok,
                            &what,
                            format!("sqlite {}", path.display()),
                            None,
                        ),
                        Err(_) if is_sample => check(
                            Status::Ok,
                            &what,
                            format!("sqlite {} (generated on first use)", path.display()),
                            None,
                        ),
                        Err(e) => check(
                            Status::Fail,
                            &what,
                            format!("sqlite {}: {e}", path.display()),
                            Some("fix `path` of this source in dataref.toml"),
                        ),
                    }
                }
                other => check(Status::Warn, &what, format!("{other:?}: not checked"), None),
            }
        })
        .collect()
}

fn python(home: &Path) -> Check {
    use dataref_sandbox::runtime::{Runtime, RuntimeStatus};
    // `run_python` is not a tool yet: report what is there, but nothing is required.
    match Runtime::check(home) {
        RuntimeStatus::Ready(rt) => check(
            Status::Ok,
            "python runtime",
            format!(
                "Python {} with {} packages (pandas {})",
                rt.versions.python,
                rt.versions.packages.len(),
                rt.versions
                    .packages
                    .get("pandas")
                    .map_or("?", String::as_str)
            ),
            None,
        ),
        RuntimeStatus::NotInstalled { .. } => check(
            Status::Warn,
            "python runtime",
            "not installed; `run_python` (which will install it) is not in this build yet",
            Some("nothing to do now"),
        ),
        RuntimeStatus::Outdated { .. } => check(
            Status::Warn,
            "python runtime",
            "installed with other versions than this build pins",
            Some("nothing to do now; `run_python` will rebuild it"),
        ),
        RuntimeStatus::Broken { reason, .. } => check(
            Status::Warn,
            "python runtime",
            format!("unusable: {reason}"),
            Some("remove the `python` folder in the data dir"),
        ),
        // `RuntimeStatus` is `#[non_exhaustive]`: a state this binary does not know yet.
        other => check(Status::Warn, "python runtime", format!("{other:?}"), None),
    }
}

fn sandbox() -> Check {
    let caps = dataref_sandbox::jail::probe();
    let missing = caps.missing(dataref_sandbox::jail::CgroupPolicy::RlimitFallback);
    if missing.is_empty() {
        let limits = if caps.cgroups.complete() {
            "cgroup limits"
        } else {
            "rlimits only (no usable cgroups)"
        };
        return check(
            Status::Ok,
            "sandbox",
            format!("bubblewrap, user namespaces, seccomp and {limits} work"),
            None,
        );
    }
    let what: Vec<String> = missing.iter().map(ToString::to_string).collect();
    let hints: Vec<&str> = missing.iter().map(|m| m.hint()).collect();
    check(
        Status::Warn,
        "sandbox",
        format!(
            "{}; `run_python` will need it (not in this build yet)",
            what.join("; ")
        ),
        Some(&hints.join("; ")),
    )
}
