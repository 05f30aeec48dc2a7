//! Config resolution, with the precedence written as code: flag > environment > file >
//! default.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use dataref_config::{Config, env};
use dataref_http::{HttpError, HttpOptions};
use dataref_protocol::Principal;
use dataref_sources::{SAMPLE_ROWS_DEFAULT, SAMPLE_ROWS_MAX};
use dataref_store::{LocalStore, StoreLimits, SystemClock};

use crate::Common;

pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env(env::DATAREF_LOG)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // stdout is the MCP channel: logs only ever go to stderr.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(crate::log::BoundedStderr)
        .with_ansi(false)
        .try_init();
}

/// The data directory of a dataref run by root.
pub const ROOT_HOME: &str = "/var/lib/dataref";

/// The data directory: `--home`, else `$DATAREF_HOME`, else `$XDG_DATA_HOME/dataref`, else
/// `/var/lib/dataref` for root (sandboxed jobs run as an unprivileged uid that cannot
/// enter `/root`), else `~/.local/share/dataref`.
pub fn home(common: &Common) -> Result<PathBuf> {
    let given = common.home.clone().or_else(|| {
        std::env::var_os(env::DATAREF_HOME)
            .filter(|h| !h.is_empty())
            .map(PathBuf::from)
    });
    if let Some(h) = given {
        // Absolute, so paths handed to the sandbox mean the same inside it.
        return std::path::absolute(&h)
            .with_context(|| format!("resolving the data directory `{}`", h.display()));
    }
    if let Some(x) = std::env::var_os(env::XDG_DATA_HOME).filter(|h| !h.is_empty()) {
        return Ok(PathBuf::from(x).join("dataref"));
    }
    if rustix::process::geteuid().is_root() {
        return Ok(PathBuf::from(ROOT_HOME));
    }
    if let Some(h) = std::env::var_os(env::HOME).filter(|h| !h.is_empty()) {
        return Ok(PathBuf::from(h).join(".local/share/dataref"));
    }
    anyhow::bail!(
        "cannot find a data directory: none of `--home`, `{}`, `{}`, `{}` is set\nhint: pass `--home DIR`",
        env::DATAREF_HOME,
        env::XDG_DATA_HOME,
        env::HOME
    )
}

/// The sample size from `--rows`, checked.
pub fn sample_rows(common: &Common) -> Result<u64> {
    let rows = common.rows.unwrap_or(SAMPLE_ROWS_DEFAULT);
    if rows == 0 || rows > SAMPLE_ROWS_MAX {
        anyhow::bail!("`--rows` must be between 1 and {SAMPLE_ROWS_MAX}, got {rows}");
    }
    Ok(rows)
}

/// The config file: `--config`, else `$DATAREF_CONFIG`; `None` means the built-in sample.
pub fn config_path(common: &Common) -> Option<PathBuf> {
    common.config.clone().or_else(|| {
        std::env::var_os(env::DATAREF_CONFIG)
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
    })
}

/// `--config`, else `$DATAREF_CONFIG`, else the built-in sample.
pub fn config(common: &Common) -> Result<Config> {
    let home = home(common)?;
    match config_path(common) {
        Some(p) => {
            if common.rows.is_some() {
                anyhow::bail!(
                    "`--rows` sizes the built-in sample; it does not apply with a config file"
                );
            }
            Ok(Config::load(&p, home)?)
        }
        None => Ok(Config::builtin_sample(home, sample_rows(common)?)),
    }
}

/// A config file replaces the built-in sample whole: one that declares no `[sources]`
/// serves no data, and says so at start rather than leaving the person to find no
/// `fetch_*` tools.
pub fn note_no_sources(common: &Common, config: &Config) {
    if let Some(path) = without_sources(common, config) {
        progress_line(&format!(
            "note: {}\nhint: {NO_SOURCES_HINT}",
            no_sources(&path)
        ));
    }
}

/// The config file, when it declares neither `[sources]` nor `[[upstream]]` servers (whose
/// tools may bring data of their own).
pub fn without_sources(common: &Common, config: &Config) -> Option<PathBuf> {
    config_path(common).filter(|_| {
        config.sample.is_none() && config.sources.is_empty() && config.upstreams.is_empty()
    })
}

/// What `serve` notes and `doctor` warns of for a config file without `[sources]`.
pub fn no_sources(path: &std::path::Path) -> String {
    format!(
        "`{}` declares no `[sources]`, so there is no data to fetch (the built-in sample is served only when no config file is given)",
        path.display()
    )
}

pub const NO_SOURCES_HINT: &str = "add a `[sources.NAME]` table (README, \"Configure\"), or leave out `--config` to try the built-in sample";

/// `--http ADDR` over `[http] listen` (an empty `ADDR`: keep `[http] listen`).
pub fn http_listen(config: &mut Config, addr: &str) -> Result<()> {
    if !addr.is_empty() {
        config.http.listen = addr.parse().map_err(|_| {
            anyhow::anyhow!(
                "`--http {addr}` is not an address and port\nhint: e.g. `--http 127.0.0.1:8750`, or `--http 0.0.0.0:8750` to listen on every interface (needs tokens)"
            )
        })?;
    }
    Ok(())
}

/// What `serve --http` runs with, checked as it checks them at start
/// ([`dataref_http::validate`]); the error is the one `serve --http` stops with.
pub fn http_options(config: &Config, anonymous: Principal) -> Result<HttpOptions> {
    let options = HttpOptions {
        http: config.http.clone(),
        principals: config.principals.clone(),
        anonymous,
    };
    dataref_http::validate(&options).map_err(|e| http_error(&e))?;
    Ok(options)
}

/// An [`HttpError`] with its hint, as the binary prints it.
pub fn http_error(e: &HttpError) -> anyhow::Error {
    anyhow::anyhow!("{e}\nhint: {}", e.hint())
}

/// `--principal`, else `$DATAREF_PRINCIPAL`, else config.
pub fn principal(flag: Option<&str>, config: &Config) -> Result<Principal> {
    let from_env = std::env::var(env::DATAREF_PRINCIPAL)
        .ok()
        .filter(|p| !p.is_empty());
    match flag.map(str::to_owned).or(from_env) {
        Some(p) => Principal::new(&p).with_context(|| format!("invalid principal `{p}`")),
        None => Ok(config.principal.clone()),
    }
}

/// Generates the built-in sample when this config is it, reporting progress on stderr.
pub fn ensure_sample(config: &Config) -> Result<()> {
    let Some(spec) = &config.sample else {
        return Ok(());
    };
    if spec.path.exists() {
        return Ok(());
    }
    let total = spec.rows;
    progress_line(&format!("generating the sample database ({total} rows)…"));
    dataref_sources::ensure_sample(spec, &|done| {
        progress_line(&format!(
            "generating the sample database: {done}/{total} rows"
        ));
    })
    .with_context(|| {
        format!(
            "generating the sample database at `{}`",
            spec.path.display()
        )
    })?;
    progress_line(&format!("sample database ready: {}", spec.path.display()));
    Ok(())
}

#[expect(clippy::print_stderr, reason = "progress for the person, on stderr")]
pub fn progress_line(msg: &str) {
    eprintln!("{msg}");
}

/// The session's workspace: the directory named with `--workspace`, else the principal's
/// own under the data dir (created on first use).
pub fn workspace(
    flag: Option<&std::path::Path>,
    config: &Config,
    principal: &Principal,
) -> Result<Arc<dataref_workspace::Workspace>> {
    let ws = match flag {
        Some(dir) => dataref_workspace::Workspace::open(dir)
            .with_context(|| format!("opening the workspace `{}`", dir.display()))?,
        // The principal's own workspace is bounded; a directory the operator names is theirs.
        None => dataref_workspace::Workspace::for_principal(&config.home, principal)
            .and_then(|w| w.with_quota(config.limits.workspace_quota_bytes))
            .with_context(|| format!("creating the workspace of `{principal}`"))?,
    };
    Ok(Arc::new(ws))
}

/// Opens the store under the config's home.
pub fn open_store(config: &Config) -> Result<Arc<LocalStore>> {
    let limits = StoreLimits {
        ttl: config.store.ttl,
        max_artifact_bytes: config.store.max_artifact_bytes,
        owner_quota_bytes: config.store.owner_quota_bytes,
    };
    let store = LocalStore::open(&config.home, limits, Arc::new(SystemClock)).with_context(|| {
        format!(
            "opening the artifact store in `{}`\nhint: check that the directory is writable, or pass `--home DIR`",
            config.home.display()
        )
    })?;
    Ok(Arc::new(store))
}

/// `run_python`'s sandbox for `config` (`None` when `[python] enabled = false`). When the
/// runtime is already installed, the warm pool starts filling now, in the background, while
/// the server starts and the client does its handshake; a first call that arrives before
/// the first warm sandbox is ready waits for it. Nothing is downloaded here (the first call
/// does that, with progress).
pub fn python_sandbox(config: &Config) -> Option<Arc<dataref_sandbox::pool::PythonSandbox>> {
    if !config.python.enabled {
        return None;
    }
    let sandbox = Arc::new(dataref_sandbox::pool::PythonSandbox::new(
        dataref_tools::sandbox_settings(config),
    ));
    // Returns at once: the pool's own thread finds the runtime and starts the sandboxes.
    sandbox.prewarm();
    Some(sandbox)
}

/// How long a stdio server waits for its first warm sandbox before it reads the handshake.
pub const FIRST_WARM_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

/// Waits (at most [`FIRST_WARM_PATIENCE`]) for the first warm sandbox, when one is on its
/// way: a client that calls `run_python` right after its handshake then gets a warm run
/// instead of waiting for the sandbox inside its first call. Returns at once without a
/// pool, a runtime, or when the sandbox cannot start.
pub fn await_first_warm(python: Option<&dataref_sandbox::pool::PythonSandbox>) {
    if let Some(sandbox) = python
        && !sandbox.wait_warm(FIRST_WARM_PATIENCE)
        && sandbox.status().filling
    {
        tracing::warn!(
            "the first warm sandbox was not ready after {} s; serving anyway",
            FIRST_WARM_PATIENCE.as_secs()
        );
    }
}
