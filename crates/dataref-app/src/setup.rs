//! The parts a server is built from, one function each: the data dir, the built-in
//! sample, the store, a workspace, `run_python`'s sandbox. Progress for the person goes to
//! stderr ([`progress_line`]); stdout is the MCP channel of `serve`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use dataref_config::{Config, env};
use dataref_protocol::Principal;
use dataref_replica::Shared;
use dataref_sandbox::pool::PythonSandbox;
use dataref_store::{LocalStore, StoreLimits, SystemClock};
use dataref_tool::SharedContext;
use dataref_workspace::Workspace;

use crate::error::{Error, Result};

/// The data directory of a dataref run by root.
pub const ROOT_HOME: &str = "/var/lib/dataref";

/// The data directory: `flag` (`--home`), else `$DATAREF_HOME`, else
/// `$XDG_DATA_HOME/dataref`, else `/var/lib/dataref` for root (sandboxed jobs run as an
/// unprivileged uid that cannot enter `/root`), else `~/.local/share/dataref`.
pub fn home(flag: Option<&Path>) -> Result<PathBuf> {
    let given = flag.map(Path::to_path_buf).or_else(|| {
        std::env::var_os(env::DATAREF_HOME)
            .filter(|h| !h.is_empty())
            .map(PathBuf::from)
    });
    if let Some(h) = given {
        // Absolute, so paths handed to the sandbox mean the same inside it.
        return std::path::absolute(&h).map_err(|source| Error::DataDir { path: h, source });
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
    Err(Error::NoDataDir)
}

/// One line of progress for the person, on stderr.
#[expect(clippy::print_stderr, reason = "progress for the person, on stderr")]
pub fn progress_line(msg: &str) {
    eprintln!("{msg}");
}

/// Generates the built-in sample when this config is it, reporting progress on stderr.
#[expect(
    clippy::disallowed_methods,
    reason = "the sample database is the sources' file, outside any workspace"
)]
pub fn ensure_sample(config: &Config) -> Result<()> {
    let Some(spec) = &config.sample else {
        return Ok(());
    };
    let sample_error = |source| Error::Sample {
        path: spec.path.clone(),
        source: Box::new(source),
    };
    if spec.path.exists() {
        // Quietly: at most a table added to a sample made by an older version.
        return dataref_sources::ensure_sample(spec, &|_| {}).map_err(sample_error);
    }
    let total = spec.rows;
    progress_line(&format!("generating the sample database ({total} rows)…"));
    dataref_sources::ensure_sample(spec, &|done| {
        progress_line(&format!(
            "generating the sample database: {done}/{total} rows"
        ));
    })
    .map_err(sample_error)?;
    progress_line(&format!("sample database ready: {}", spec.path.display()));
    Ok(())
}

/// The session's workspace: the directory `dir` (`--workspace`), else the principal's own
/// under the data dir (created on first use, bounded by the workspace quota; with
/// `[shared]`, the local copy of the workspace every replica shares).
pub fn workspace(
    dir: Option<&Path>,
    shared: &SharedContext,
    principal: &Principal,
) -> Result<Arc<Workspace>> {
    let ws =
        match dir {
            Some(dir) => Workspace::open(dir).map_err(|source| Error::Workspace {
                dir: dir.to_path_buf(),
                source: Box::new(source),
            })?,
            // The principal's own workspace is bounded; a directory the operator names is theirs.
            None => shared.principal_workspace(principal).map_err(|source| {
                Error::PrincipalWorkspace {
                    principal: principal.clone(),
                    source: Box::new(source),
                }
            })?,
        };
    Ok(Arc::new(ws))
}

/// Connects to the shared object store and index when the config has `[shared]` (a server
/// starting: the index's schema is brought up to date).
pub fn connect_shared(config: &Config) -> Result<Option<Shared>> {
    config
        .shared
        .as_ref()
        .map(|s| Shared::connect(s, &config.home, &env::process))
        .transpose()
        .map_err(|e| Error::Shared(Box::new(e)))
}

/// [`connect_shared`] for a command that only looks (`doctor`, `sessions`): the index's
/// schema is left as it is, whatever this build would add to it.
pub fn look_at_shared(config: &Config) -> Result<Option<Shared>> {
    config
        .shared
        .as_ref()
        .map(|s| Shared::connect_without_migrating(s, &config.home, &env::process))
        .transpose()
        .map_err(|e| Error::Shared(Box::new(e)))
}

/// Opens the artifact store: under the config's home, or, with `shared`, over the shared
/// index and bucket (the home then holds this replica's cache of it).
pub fn open_store(config: &Config, shared: Option<&Shared>) -> Result<Arc<LocalStore>> {
    let limits = StoreLimits {
        ttl: config.store.ttl,
        max_artifact_bytes: config.store.max_artifact_bytes,
        owner_quota_bytes: config.store.owner_quota_bytes,
    };
    let clock = Arc::new(SystemClock);
    let store = match shared {
        Some(shared) => shared.artifact_store(limits, clock),
        None => LocalStore::open(&config.home, limits, clock),
    };
    let store = store.map_err(|source| Error::Store {
        home: config.home.clone(),
        source: Box::new(source),
    })?;
    Ok(Arc::new(store))
}

/// `run_python`'s sandbox for `config` (`None` when `[python] enabled = false`). When the
/// runtime is already installed, the warm pool starts filling now, in the background, while
/// the server starts and the client does its handshake; a first call that arrives before
/// the first warm sandbox is ready waits for it. Nothing is downloaded here (the first call
/// does that, with progress). The pool's start also sweeps the job cgroups and job
/// directories of servers that are gone.
pub fn python_sandbox(config: &Config) -> Option<Arc<PythonSandbox>> {
    if !config.python.enabled {
        return None;
    }
    let sandbox = Arc::new(PythonSandbox::new(dataref_builtins::sandbox_settings(
        config,
    )));
    // Returns at once: the pool's own thread finds the runtime and starts the sandboxes.
    sandbox.prewarm();
    Some(sandbox)
}

/// Stops `run_python`'s jobs and removes its warm sandboxes, cgroups and job directories.
pub fn shutdown_python(python: Option<&PythonSandbox>) {
    if let Some(python) = python {
        python.shutdown(std::time::Duration::from_secs(10));
    }
}

/// Many callers at once each hold a connection (and a cached workspace, up to a few hundred):
/// lift the soft limit on open files to the hard one, and warn when even that is low.
pub fn raise_open_files_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    const WANTED: u64 = 4096;
    let mut limit = getrlimit(Resource::Nofile);
    if let (Some(current), Some(maximum)) = (limit.current, limit.maximum)
        && current < maximum
    {
        limit.current = Some(maximum);
        if setrlimit(Resource::Nofile, limit).is_err() {
            limit.current = Some(current);
        }
    }
    if let Some(n) = limit.current.filter(|n| *n < WANTED) {
        tracing::warn!(
            "this process may open only {n} files; under load, connections beyond that are refused \
             (hint: raise the limit, e.g. `ulimit -n {WANTED}` or `LimitNOFILE={WANTED}` in a systemd unit)"
        );
    }
}
