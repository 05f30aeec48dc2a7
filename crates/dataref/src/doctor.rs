//! `dataref doctor`: checks what dataref needs and says how to fix what is missing.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;
use dataref_config::{Config, SourceKind};
use dataref_http::HttpOptions;

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

/// `dataref doctor [--http [ADDR]]`.
pub fn run(common: &Common, http_addr: Option<&str>) -> Result<ExitCode> {
    let mut checks = Vec::new();
    match settings::home(common) {
        Ok(home) => checks.push(data_dir(&home)),
        Err(e) => checks.push(check(Status::Fail, "data dir", format!("{e:#}"), None)),
    }
    match settings::config(common) {
        Ok(config) => {
            checks.push(match &config.sample {
                Some(s) => check(Status::Ok, "config", format!("built-in sample ({} rows); no config file given", s.rows), Some("to serve your own data, write a dataref.toml and pass `--config` or set `DATAREF_CONFIG`")),
                None => match settings::without_sources(common, &config) {
                    Some(path) => check(Status::Warn, "config", settings::no_sources(&path), Some(settings::NO_SOURCES_HINT)),
                    None => check(Status::Ok, "config", format!("{} sources, {} named queries", config.sources.len(), config.queries.len()), None),
                },
            });
            checks.push(http(config.clone(), http_addr));
            checks.push(metrics(&config));
            checks.push(store(&config));
            checks.extend(sources(&config));
            if config.python.enabled {
                checks.push(python(&config));
                checks.push(sandbox(&config));
            } else {
                checks.push(check(
                    Status::Ok,
                    "run_python",
                    "disabled by `[python] enabled = false`",
                    None,
                ));
            }
            checks.extend(upstreams(&config));
            checks.extend(agents(&config));
        }
        Err(e) => checks.push(check(Status::Fail, "config", format!("{e:#}"), None)),
    }

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

/// Each agent profile's model endpoint (`chat`, `ask` and the HTTP agent API need one; the
/// demo answers with its scripted analyst without), asked for its models: whether it
/// answers, takes the key and serves the model. Its tools and template are checked
/// against the registry when a server starts.
fn agents(config: &Config) -> Vec<Check> {
    config
        .agents
        .values()
        .map(|a| {
            let what = format!("agent {}", a.name);
            match (&a.model.url, &a.model.model) {
                (Some(url), Some(model)) => endpoint(&what, a, url, model),
                (Some(url), None) => check(
                    Status::Warn,
                    &what,
                    format!("{url}, but no model name"),
                    Some("set DATAREF_LLM_MODEL, or `model` in the profile"),
                ),
                (None, _) => check(
                    Status::Warn,
                    &what,
                    "no model endpoint: `chat`, `ask` and the HTTP agent API cannot answer",
                    Some(
                        "set DATAREF_LLM_URL (an OpenAI-compatible base URL, e.g. http://localhost:11434/v1) \
                         and DATAREF_LLM_MODEL, or `url` and `model` in [agents.NAME]",
                    ),
                ),
            }
        })
        .collect()
}

/// A profile's endpoint asked for its models (`GET …/models`).
fn endpoint(what: &str, agent: &dataref_config::AgentConfig, url: &str, model: &str) -> Check {
    let keyed = if agent.model.api_key.is_some() {
        " with the key"
    } else {
        ""
    };
    let client = match dataref_agent::endpoint_client(agent) {
        Ok(Some(client)) => client,
        Ok(None) => return check(Status::Warn, what, "no model endpoint", None),
        Err(e) => return check(Status::Warn, what, e.to_string(), e.hint().as_deref()),
    };
    let runtime = match runtime(what) {
        Ok(r) => r,
        Err(failed) => return failed,
    };
    match runtime.block_on(client.models()) {
        Ok(models) if models.is_empty() || models.iter().any(|m| m == model) => check(
            Status::Ok,
            what,
            format!("{model} at {url}: the endpoint answers{keyed}"),
            None,
        ),
        Ok(models) => {
            let shown: Vec<&str> = models.iter().take(12).map(String::as_str).collect();
            check(
                Status::Warn,
                what,
                format!("{url} answers{keyed}, but does not list the model `{model}`"),
                Some(&format!(
                    "set DATAREF_LLM_MODEL (or the profile's `model`) to one it lists: {}{}",
                    shown.join(", "),
                    if models.len() > shown.len() {
                        ", …"
                    } else {
                        ""
                    }
                )),
            )
        }
        Err(e) => check(Status::Warn, what, e.to_string(), e.hint()),
    }
}

/// `serve --http`: the config checked by the function the server runs at start, so what
/// it would refuse fails here with the same message. Without `--http` a config that sets
/// up nothing for HTTP (no `[http]`, no tokens) is reported as such, not failed: it may be
/// meant for stdio only.
fn http(mut config: Config, addr: Option<&str>) -> Check {
    const WHAT: &str = "serve --http";
    let set_up = config.http.in_file
        || config
            .principals
            .values()
            .any(|p| !p.token_sha256.is_empty());
    let Some(addr) = addr.or(set_up.then_some("")) else {
        return check(
            Status::Ok,
            WHAT,
            "not set up (no `[http]`, no tokens); `dataref doctor --http` checks it as `serve --http` would",
            None,
        );
    };
    if let Err(e) = settings::http_listen(&mut config, addr) {
        return check(Status::Fail, WHAT, format!("{e:#}"), None);
    }
    let anonymous = match settings::principal(None, &config) {
        Ok(p) => p,
        Err(e) => return check(Status::Fail, WHAT, format!("{e:#}"), None),
    };
    let options = HttpOptions {
        http: config.http.clone(),
        principals: config.principals.clone(),
        anonymous,
    };
    if let Err(e) = dataref_http::validate(&options) {
        return check(Status::Fail, WHAT, e.to_string(), Some(&e.hint()));
    }
    let auth = if config.http.auth {
        let tokens = config
            .principals
            .values()
            .filter(|p| !p.token_sha256.is_empty())
            .count();
        let jwt = if config.http.jwt.is_some() {
            " and JWTs"
        } else {
            ""
        };
        format!("bearer tokens of {tokens} principal(s){jwt}")
    } else {
        format!("off, every caller is `{}`", options.anonymous)
    };
    let public = config
        .http
        .public_url
        .as_ref()
        .map_or_else(String::new, |u| format!(", reached at {u}"));
    check(
        Status::Ok,
        WHAT,
        format!(
            "would listen on {}{public}; auth: {auth}; {}",
            config.http.listen,
            dataref_http::sharing(&config.http, config.shared.is_some())
        ),
        None,
    )
}

/// `[metrics]`: where the endpoint would listen, and whether its token can be read.
fn metrics(config: &Config) -> Check {
    const WHAT: &str = "metrics";
    let Some(m) = &config.metrics else {
        return check(
            Status::Ok,
            WHAT,
            "no endpoint (`[metrics]` has no `listen`)",
            None,
        );
    };
    if let Err(e) = dataref_http::validate_metrics(m) {
        return check(Status::Fail, WHAT, e.to_string(), Some(&e.hint()));
    }
    let auth = if m.token.is_some() {
        "a bearer token"
    } else {
        "no token (loopback)"
    };
    check(
        Status::Ok,
        WHAT,
        format!("Prometheus scrapes http://{}{}; {auth}", m.listen, m.path),
        None,
    )
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
    let opened = dataref_app::look_at_shared(config)
        .and_then(|shared| dataref_app::open_store(config, shared.as_ref()).map(|_| shared));
    match opened {
        Ok(Some(shared)) => {
            let s = shared.config();
            let bucket = if s.prefix.is_empty() {
                s.bucket.clone()
            } else {
                format!("{}/{}", s.bucket, s.prefix)
            };
            let pending = shared.pending_migrations();
            check(
                Status::Ok,
                "artifact store",
                format!(
                    "shared: s3://{bucket} and the PostgreSQL index (cache in {}){}",
                    config.home.join("cache").display(),
                    if pending.is_empty() {
                        String::new()
                    } else {
                        format!(
                            "; the index lacks {} migration(s) ({}) the first server to start applies",
                            pending.len(),
                            pending.join(", ")
                        )
                    }
                ),
                None,
            )
        }
        Ok(None) => check(
            Status::Ok,
            "artifact store",
            format!("{}", config.home.join("index.sqlite").display()),
            None,
        ),
        Err(e) => check(
            Status::Fail,
            "artifact store",
            format!("{:#}", anyhow::Error::from(e)),
            None,
        ),
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
                SourceKind::Postgres { .. } => postgres(config, &s.name, &what),
                SourceKind::Mysql { .. } => mysql(config, s, &what),
                SourceKind::Adbc { .. } => adbc(config, s, &what),
                SourceKind::Files { location, .. } => files(s, location, &what),
                _ => check(
                    Status::Warn,
                    &what,
                    "a source kind this build does not check",
                    None,
                ),
            }
        })
        .collect()
}

/// A runtime for one check's async probes, or the failed check.
fn runtime(what: &str) -> Result<tokio::runtime::Runtime, Check> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            check(
                Status::Fail,
                what,
                format!("cannot start the async runtime: {e}"),
                None,
            )
        })
}

/// A `files` source: lists its files and reads their schema, as a query would.
fn files(source: &dataref_config::SourceConfig, location: &str, what: &str) -> Check {
    let runtime = match runtime(what) {
        Ok(r) => r,
        Err(failed) => return failed,
    };
    match runtime.block_on(dataref_builtins::probe_files(source)) {
        Ok(columns) => check(
            Status::Ok,
            what,
            format!("files {location}: {} columns", columns.len()),
            None,
        ),
        Err(e) => check(
            Status::Fail,
            what,
            format!("files {location}: {e}"),
            Some("fix `path` or `url` of this source, or the server's AWS_* credentials"),
        ),
    }
}

/// A PostgreSQL source: connects (a fresh connection, as `serve` would), names the login
/// role, and lists which principals' roles it may `SET ROLE` to. With `allow_sql`, also
/// logs in as each principal's own role (the login of model-written SQL) and asks the
/// database which other principals' roles that login can become: any is a failure,
/// unless the source sets `allow_sql_shared_roles = true`.
/// Every configured principal, then the stdio one if it is not among them.
fn every_principal(config: &Config) -> Vec<&dataref_protocol::Principal> {
    let mut principals: Vec<&dataref_protocol::Principal> = config.principals.keys().collect();
    if !principals.contains(&&config.principal) {
        principals.push(&config.principal);
    }
    principals
}

/// Logs in as every principal (and the stdio one) and says who each is on the server and
/// whether its login can only read (else `query` is refused on it).
fn mysql(config: &Config, s: &dataref_config::SourceConfig, what: &str) -> Check {
    let runtime = match runtime(what) {
        Ok(r) => r,
        Err(failed) => return failed,
    };
    let sources = dataref_sources::Sources::new(config);
    let Some(source) = sources.mysql_source(&s.name) else {
        return check(Status::Fail, what, "internal: no such source", None);
    };
    let shared = matches!(
        s.kind,
        SourceKind::Mysql {
            allow_shared_login: true,
            ..
        }
    );
    let principals = every_principal(config);
    let mut status = Status::Ok;
    let mut version = None;
    let mut logins = Vec::new();
    let mut hint = None;
    for p in principals {
        let probed = sources
            .mysql_login(&s.name, p, shared)
            .and_then(|login| runtime.block_on(dataref_sources::mysql::probe(source, &login)));
        match probed {
            Ok(pr) if pr.beyond_reading.is_empty() => {
                logins.push(format!("{p} → {} (reads only)", pr.account));
                version = Some(pr.server_version);
            }
            Ok(pr) => {
                logins.push(format!(
                    "{p} → {} (also holds {}{})",
                    pr.account,
                    pr.beyond_reading.join(", "),
                    if s.allow_sql {
                        ": `query` is refused"
                    } else {
                        ""
                    }
                ));
                version = Some(pr.server_version);
                if s.allow_sql {
                    if status == Status::Ok {
                        status = Status::Warn;
                    }
                    hint.get_or_insert_with(|| {
                        "`REVOKE` the privileges listed: a login for model-written SQL may hold only `SELECT` and `SHOW VIEW`".to_owned()
                    });
                }
            }
            Err(e) => {
                logins.push(format!("{p}: {e}"));
                status = Status::Fail;
                hint = e.hint();
            }
        }
    }
    check(
        status,
        what,
        format!(
            "mysql {}; logins: {}",
            version.as_deref().unwrap_or("(unreached)"),
            logins.join("; ")
        ),
        hint.as_deref(),
    )
}

/// Starts the driver in its worker and connects as every principal (and the stdio one).
fn adbc(config: &Config, s: &dataref_config::SourceConfig, what: &str) -> Check {
    let (
        SourceKind::Adbc {
            allow_shared_login, ..
        },
        Some(source),
    ) = (&s.kind, dataref_sources::adbc::AdbcSource::of(s))
    else {
        return check(Status::Fail, what, "internal: not an adbc source", None);
    };
    let sources = dataref_sources::Sources::new(config);
    let worker = match sources.adbc_worker() {
        Ok(w) => w,
        Err(e) => return check(Status::Fail, what, e.to_string(), None),
    };
    let principals = every_principal(config);
    let mut status = Status::Ok;
    let mut hint = None;
    let mut logins = Vec::new();
    for p in principals {
        let probed = sources
            .adbc_login(&s.name, p, *allow_shared_login)
            .and_then(|login| {
                let own = !login.options.is_empty();
                dataref_sources::adbc::probe(
                    &worker,
                    &source,
                    &login,
                    &dataref_config::env::process,
                    s.timeout.min(std::time::Duration::from_secs(30)),
                )
                .map(|()| own)
            });
        match probed {
            Ok(true) => logins.push(format!("{p} connects (own credentials)")),
            Ok(false) => logins.push(format!("{p} connects")),
            Err(e) => {
                logins.push(format!("{p}: {e}"));
                status = Status::Fail;
                hint = e.hint();
            }
        }
    }
    check(
        status,
        what,
        format!("adbc {}: {}", source.driver.display(), logins.join("; ")),
        hint.as_deref(),
    )
}

fn postgres(config: &Config, source: &str, what: &str) -> Check {
    use dataref_sources::postgres::{RoleStatus, probe, probe_login};
    let runtime = match runtime(what) {
        Ok(r) => r,
        Err(failed) => return failed,
    };
    let sources = dataref_sources::Sources::new(config);
    let Some(pool) = sources.pool(source) else {
        return check(
            Status::Fail,
            what,
            "internal: no pool for this source",
            None,
        );
    };
    let Some(s) = config.sources.get(source) else {
        return check(Status::Fail, what, "internal: no such source", None);
    };
    let shared_sql = matches!(
        s.kind,
        SourceKind::Postgres {
            allow_sql_shared_roles: true,
            ..
        }
    );
    // Every configured principal, and the stdio principal, by the role each runs as.
    let principals = every_principal(config);
    let roles: Vec<String> = principals
        .iter()
        .map(|p| sources.role(p).to_owned())
        .collect();
    let p = match runtime.block_on(probe(pool, &roles)) {
        Ok(p) => p,
        Err(e) => return check(Status::Fail, what, e.to_string(), e.hint().as_deref()),
    };
    let mut usable = Vec::new();
    let mut broken = Vec::new();
    for (principal, (role, status)) in principals.iter().zip(&p.roles) {
        let shown = format!("{principal} → {role}");
        match status {
            RoleStatus::Usable => usable.push(shown),
            RoleStatus::Missing => broken.push(format!("{shown} (no such role)")),
            RoleStatus::NotGranted => broken.push(format!("{shown} (not granted)")),
            _ => broken.push(format!("{shown} (unknown)")),
        }
    }
    let mut detail = format!(
        "postgres {} as `{}`; can run as: {}",
        p.server_version,
        p.login_role,
        if usable.is_empty() {
            "none".into()
        } else {
            usable.join(", ")
        }
    );
    let mut status = Status::Ok;
    let mut hints: Vec<String> = Vec::new();
    if !broken.is_empty() {
        detail.push_str(&format!("; cannot: {}", broken.join(", ")));
        status = Status::Warn;
        hints.push("`CREATE ROLE` the missing roles (`LOGIN` for principals that use `query`) and `GRANT` each to the login role (or set `pg_role` in `[principals.NAME]`)".into());
    }
    if p.login_is_superuser || p.login_inherits {
        detail.push_str(if p.login_is_superuser {
            "; the login role is a superuser"
        } else {
            "; the login role inherits its roles' privileges"
        });
        status = Status::Warn;
        hints.push("log in as a role made `LOGIN NOINHERIT NOSUPERUSER` and granted only the callers' roles".into());
    }
    if s.allow_sql && shared_sql {
        if usable.len() > 1 {
            detail.push_str(&format!(
                "; model SQL runs on this shared login (`allow_sql_shared_roles = true`), so a \
                 statement can become any of {} principals' roles",
                usable.len()
            ));
            status = Status::Warn;
            hints.push("remove `allow_sql_shared_roles` to run model SQL logged in as each caller's own role".into());
        }
    } else if s.allow_sql {
        let mut logins = Vec::new();
        let mut unsafe_or_broken = false;
        for principal in &principals {
            let Some(sql_pool) = sources.sql_pool(source, principal) else {
                continue;
            };
            let Some(l) = runtime.block_on(probe_login(&sql_pool)) else {
                continue;
            };
            logins.push(match &l.result {
                Ok(reach) if reach.is_empty() => format!("{} → {} (safe)", l.principal, l.role),
                Ok(reach) => {
                    unsafe_or_broken = true;
                    format!(
                        "{} → {} (UNSAFE: can become {})",
                        l.principal,
                        l.role,
                        reach.join(", ")
                    )
                }
                Err(e) => {
                    unsafe_or_broken = true;
                    format!("{} → {} (login fails: {e})", l.principal, l.role)
                }
            });
        }
        detail.push_str(&format!("; model SQL logs in as: {}", logins.join(", ")));
        if unsafe_or_broken {
            status = Status::Fail;
            hints.insert(0, "model SQL (`allow_sql`) logs in as each principal's own role: make it `LOGIN`, allow it in `pg_hba.conf` (with `pg_password` in `[principals.NAME]` if it needs one), and `REVOKE` from it every other principal's role; or set `allow_sql_shared_roles = true` on the source to accept the shared login".into());
        }
    }
    let hint = (!hints.is_empty()).then(|| hints.join("; "));
    check(status, what, detail, hint.as_deref())
}

fn python(config: &Config) -> Check {
    use dataref_sandbox::runtime::{Runtime, RuntimeSpec, RuntimeStatus};
    let ready = |rt: &Runtime| {
        check(
            Status::Ok,
            "python runtime",
            format!(
                "Python {} with {} packages (pandas {}) at `{}`",
                rt.versions.python,
                rt.versions.packages.len(),
                rt.versions
                    .packages
                    .get("pandas")
                    .map_or("?", String::as_str),
                rt.prefix.display()
            ),
            None,
        )
    };
    if let Some(python) = &config.python.interpreter {
        return match Runtime::ensure_with(
            &config.home,
            &RuntimeSpec::Interpreter(python.clone()),
            &|_| {},
        ) {
            Ok(rt) => ready(&rt),
            Err(e) => check(
                Status::Fail,
                "python runtime",
                format!("the configured interpreter is unusable: {e}"),
                Some("fix `[python] interpreter`, or remove it to let dataref manage its own"),
            ),
        };
    }
    match Runtime::check(&config.home) {
        RuntimeStatus::Ready(rt) => ready(&rt),
        RuntimeStatus::NotInstalled { dir } => check(
            Status::Warn,
            "python runtime",
            format!("not installed yet (`{}`)", dir.display()),
            Some(
                "the first `run_python` installs it from PyPI (about 100 MB, with progress); \
                 `dataref demo` does it too",
            ),
        ),
        RuntimeStatus::Outdated { .. } => check(
            Status::Warn,
            "python runtime",
            "installed with other versions than this build pins",
            Some("the next `run_python` rebuilds it"),
        ),
        RuntimeStatus::Broken { reason, dir } => check(
            Status::Warn,
            "python runtime",
            format!("unusable: {reason}"),
            Some(&format!(
                "remove `{}`; the next `run_python` builds it again",
                dir.display()
            )),
        ),
        // `RuntimeStatus` is `#[non_exhaustive]`: a state this binary does not know yet.
        other => check(Status::Warn, "python runtime", format!("{other:?}"), None),
    }
}

fn sandbox(config: &Config) -> Check {
    use dataref_sandbox::jail::{self, CgroupPolicy};
    let policy = if config.python.require_cgroups {
        CgroupPolicy::Required
    } else {
        CgroupPolicy::RlimitFallback
    };
    let caps = jail::probe();
    let missing = caps.missing(policy);
    if !missing.is_empty() {
        let what: Vec<String> = missing.iter().map(ToString::to_string).collect();
        let hints: Vec<&str> = missing.iter().map(|m| m.hint()).collect();
        return check(
            Status::Fail,
            "sandbox",
            format!("{}; `run_python` refuses to run code", what.join("; ")),
            Some(&hints.join("; ")),
        );
    }
    if !jail::jail_can_read(&config.home) {
        return check(
            Status::Fail,
            "sandbox",
            format!(
                "jobs run as uid {} and cannot reach the data dir `{}`",
                jail::JAIL_UID,
                config.home.display()
            ),
            Some(
                "use a data dir outside private directories such as `/root` (the default for root is `/var/lib/dataref`)",
            ),
        );
    }
    if caps.cgroups.complete() {
        check(
            Status::Ok,
            "sandbox",
            "bubblewrap, user namespaces, seccomp and cgroup limits work",
            None,
        )
    } else {
        check(
            Status::Warn,
            "sandbox",
            "bubblewrap, user namespaces and seccomp work; no usable cgroups, so memory and \
             process limits fall back to rlimits",
            Some(
                "run as root or give dataref a delegated cgroup v2 subtree; set `[python] require_cgroups = true` to refuse instead",
            ),
        )
    }
}

/// One check per `[[upstream]]`: it starts (or answers), completes the MCP handshake and
/// lists its tools; the session is closed again.
fn upstreams(config: &Config) -> Vec<Check> {
    if config.upstreams.is_empty() {
        return Vec::new();
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            return vec![check(
                Status::Fail,
                "upstreams",
                format!("cannot start the async runtime: {e}"),
                None,
            )];
        }
    };
    config
        .upstreams
        .iter()
        .map(|u| {
            let what = format!("upstream {}", u.name);
            let target = dataref_app::describe(&u.transport);
            runtime.block_on(async {
                match dataref_mcp::upstream::connect_one(u).await {
                    Ok(server) => {
                        let info = server
                            .server_info()
                            .await
                            .map_or_else(String::new, |i| format!(" ({i})"));
                        let detail = format!(
                            "{target}{info}: {} of {} tools mounted as `{}*`",
                            server.tool_names().len(),
                            server.listed(),
                            u.prefix
                        );
                        server.shutdown().await;
                        check(Status::Ok, &what, detail, None)
                    }
                    Err(e) => check(
                        Status::Fail,
                        &what,
                        format!("{target}: {e}"),
                        Some(&e.hint()),
                    ),
                }
            })
        })
        .collect()
}
