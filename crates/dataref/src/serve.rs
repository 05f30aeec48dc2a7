//! `dataref serve`: MCP over stdio, or over Streamable HTTP (`--http`); `dataref token new`.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use dataref_config::{Config, UpstreamTransport};
use dataref_http::HttpServer;
use dataref_mcp::upstream::{self, Upstreams};
use dataref_mcp::{DatarefServer, SharedContext};
use dataref_protocol::Principal;
use dataref_store::{ArtifactStore, SystemClock};
use dataref_tool::{NoProgress, RunContext, ToolsError};
use dataref_tools::builtin_registry_builder;
use tokio_util::sync::CancellationToken;

use crate::{Common, settings};

pub fn run(
    common: &Common,
    principal: Option<&str>,
    workspace: Option<&std::path::Path>,
) -> Result<ExitCode> {
    let config = settings::config(common)?;
    let principal = settings::principal(principal, &config)?;
    let workspace = settings::workspace(workspace, &config, &principal)?;
    settings::note_no_sources(common, &config);
    let Started {
        runtime,
        store,
        upstreams,
        registry,
        python,
    } = start(&config)?;
    // The client's `initialize` waits in the pipe until the first warm sandbox is ready, so
    // that a `run_python` right after the handshake is a warm run.
    settings::await_first_warm(python.as_deref());
    let served = runtime.block_on(async move {
        spawn_sweeper(store.clone(), config.store.sweep_interval);
        if config.spill.enabled {
            dataref_tool::spawn_spill_sweeper(
                workspace.clone(),
                Arc::new(SystemClock),
                &config.spill,
            );
        }
        let ctx = RunContext {
            principal,
            store,
            workspace,
            limits: config.limits.clone(),
            progress: Arc::new(NoProgress),
            cancel: CancellationToken::new(),
            clock: Arc::new(SystemClock),
        };
        tracing::info!(tools = registry.len(), principal = %ctx.principal, "serving MCP on stdio");
        let served = DatarefServer::new(registry, ctx).serve_stdio().await;
        upstreams.shutdown().await;
        served
    });
    // The client closed stdin: stop the jobs and take the warm sandboxes down with their
    // cgroups and job directories, which an exiting process would leave behind.
    shutdown_python(python.as_deref());
    served?;
    Ok(ExitCode::SUCCESS)
}

/// `dataref serve --http ADDR` (`ADDR` empty: `[http] listen`).
pub fn run_http(common: &Common, principal: Option<&str>, addr: &str) -> Result<ExitCode> {
    let mut config = settings::config(common)?;
    settings::http_listen(&mut config, addr)?;
    let anonymous = settings::principal(principal, &config)?;
    // Before anything starts (the sample, the upstream servers), by the function `dataref
    // doctor` calls, so the two refuse the same configs with the same message.
    let options = settings::http_options(&config, anonymous.clone())?;
    settings::note_no_sources(common, &config);
    raise_open_files_limit();
    let Started {
        runtime,
        store,
        upstreams,
        registry,
        python,
    } = start(&config)?;
    let served = runtime.block_on(async move {
        spawn_sweeper(store.clone(), config.store.sweep_interval);
        let clock: Arc<dyn dataref_store::Clock> = Arc::new(SystemClock);
        if config.spill.enabled {
            dataref_tool::spawn_all_spill_sweeper(
                config.home.clone(),
                clock.clone(),
                &config.spill,
            );
        }
        let server = DatarefServer::per_request(
            registry.clone(),
            SharedContext {
                home: config.home.clone(),
                store,
                limits: config.limits.clone(),
                clock,
            },
        );
        let auth = if config.http.auth {
            format!(
                "bearer tokens of {} principal(s){}",
                config
                    .principals
                    .values()
                    .filter(|p| !p.token_sha256.is_empty())
                    .count(),
                if config.http.jwt.is_some() {
                    " and JWTs"
                } else {
                    ""
                }
            )
        } else {
            format!("off, every caller is `{anonymous}`")
        };
        let http = match HttpServer::bind(server, options).await {
            Ok(h) => h,
            Err(e) => {
                upstreams.shutdown().await;
                anyhow::bail!("{e}\nhint: {}", e.hint());
            }
        };
        // Where it listens, and where clients reach it when `public_url` says otherwise.
        let (listen, public) = (http.listen_url(), http.mcp_url());
        let reach = if public == listen {
            String::new()
        } else {
            format!("; clients reach it at {public}")
        };
        settings::progress_line(&format!(
            "serving MCP on {listen} ({} tools; auth: {auth}{reach})",
            registry.len()
        ));
        let shutdown = CancellationToken::new();
        tokio::spawn(stop_on_signal(shutdown.clone()));
        let served = http.serve(shutdown).await;
        upstreams.shutdown().await;
        settings::progress_line("stopped");
        served.map_err(|e| anyhow::anyhow!("{e}\nhint: {}", e.hint()))
    });
    shutdown_python(python.as_deref());
    served?;
    Ok(ExitCode::SUCCESS)
}

/// Many callers at once each hold a connection (and a cached workspace, up to a few hundred):
/// lift the soft limit on open files to the hard one, and warn when even that is low.
fn raise_open_files_limit() {
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

/// Stops `run_python`'s jobs and removes its warm sandboxes, cgroups and job directories.
fn shutdown_python(python: Option<&dataref_sandbox::pool::PythonSandbox>) {
    if let Some(python) = python {
        python.shutdown(Duration::from_secs(10));
    }
}

/// Cancels `shutdown` on SIGINT or SIGTERM.
async fn stop_on_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        tracing::warn!("cannot listen for SIGINT/SIGTERM; stop the server with SIGKILL");
        return;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
    settings::progress_line("shutting down: finishing open requests …");
    shutdown.cancel();
}

/// `dataref token new NAME`.
#[expect(
    clippy::print_stdout,
    reason = "the token and the config lines are this command's output"
)]
pub fn new_token(name: &str) -> Result<ExitCode> {
    let principal = Principal::new(name).map_err(|e| {
        anyhow::anyhow!(
            "invalid principal `{name}`: {e}\nhint: e.g. `dataref token new eu_analyst`"
        )
    })?;
    let t = dataref_http::new_token()
        .map_err(|_| anyhow::anyhow!("the system's random source failed"))?;
    let table = if principal
        .as_str()
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        principal.as_str().to_owned()
    } else {
        format!("\"{principal}\"")
    };
    println!("token: {}", t.token);
    println!();
    println!("[principals.{table}]");
    println!("token_sha256 = [\"{}\"]", t.sha256_hex);
    settings::progress_line(&format!(
        "Give the token to `{principal}` (shown only now; it is sent as `Authorization: Bearer <token>`).\n\
         Paste the two `[principals…]` lines into dataref.toml; if the table exists, add the digest to its `token_sha256` list.\n\
         The server reads tokens at start: restart `dataref serve --http` after editing."
    ));
    Ok(ExitCode::SUCCESS)
}

/// What both transports start with.
struct Started {
    runtime: tokio::runtime::Runtime,
    store: Arc<dyn ArtifactStore>,
    upstreams: Upstreams,
    registry: Arc<dataref_tool::ToolRegistry>,
    /// Kept to shut it down before exiting (the registry holds it too).
    python: Option<Arc<dataref_sandbox::pool::PythonSandbox>>,
}

/// The sample, the store, the runtime, the upstream servers and the tool registry.
fn start(config: &Config) -> Result<Started> {
    settings::ensure_sample(config)?;
    let store: Arc<dyn ArtifactStore> = settings::open_store(config)?;
    let python = settings::python_sandbox(config);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let upstreams = runtime.block_on(connect_upstreams(config))?;
    let mut builder = builtin_registry_builder(config, python.clone());
    for tool in upstreams.tools() {
        builder.register(tool);
    }
    let registry = match builder.build() {
        Ok(r) => Arc::new(r),
        Err(e) => {
            let e = registry_error(e, &upstreams);
            runtime.block_on(upstreams.shutdown());
            return Err(e.context("building the tool registry"));
        }
    };
    Ok(Started {
        runtime,
        store,
        upstreams,
        registry,
        python,
    })
}

/// Connects every `[[upstream]]` server, with a line of progress for each on stderr. A
/// server that cannot be reached stops the start: serving without its tools would leave
/// the model and the person wondering where they went.
pub async fn connect_upstreams(config: &Config) -> Result<Upstreams> {
    if config.upstreams.is_empty() {
        return Ok(Upstreams::default());
    }
    for u in &config.upstreams {
        settings::progress_line(&format!(
            "connecting to upstream MCP server `{}` ({}) …",
            u.name,
            describe(&u.transport)
        ));
    }
    let upstreams = upstream::connect(&config.upstreams)
        .await
        .map_err(|e| anyhow::anyhow!("{e}\nhint: {}", e.hint()))?;
    for s in upstreams.servers() {
        settings::progress_line(&format!(
            "upstream `{}`: {} of {} tools mounted",
            s.name(),
            s.tool_names().len(),
            s.listed()
        ));
    }
    Ok(upstreams)
}

/// The command or URL of an upstream, for people (never `env` or header values).
pub fn describe(transport: &UpstreamTransport) -> String {
    match transport {
        UpstreamTransport::Stdio { command, .. } => format!("`{}`", command.join(" ")),
        UpstreamTransport::Http { url, .. } => format!("`{url}`"),
        other => format!("{other:?}"),
    }
}

/// A registry error that involves an upstream tool says which upstream and what to set.
fn registry_error(e: ToolsError, upstreams: &Upstreams) -> anyhow::Error {
    let owner = |name: &str| {
        upstreams
            .servers()
            .iter()
            .find(|s| s.tool_names().iter().any(|n| n == name))
            .map(|s| s.name().to_owned())
    };
    match &e {
        ToolsError::DuplicateName(name) => match owner(name) {
            Some(u) => anyhow::anyhow!(
                "the tool `{name}` of upstream `{u}` has the name of another tool\nhint: set `prefix` of `[[upstream]]` `{u}` in dataref.toml (e.g. `prefix = \"{u}_\"`), or leave the tool out with `tools = [...]`"
            ),
            None => anyhow::Error::new(e),
        },
        ToolsError::BadSchema { name, .. } => match owner(name) {
            Some(u) => anyhow::anyhow!(
                "{e}\nhint: leave it out with `tools = [...]` of `[[upstream]]` `{u}` in dataref.toml"
            ),
            None => anyhow::Error::new(e),
        },
        // `ToolsError` is non-exhaustive across crates.
        _ => anyhow::Error::new(e),
    }
}

/// Removes expired artifacts every `interval` for as long as the server runs (reads check
/// expiry themselves; the sweep gives the disk back).
pub fn spawn_sweeper(store: Arc<dyn ArtifactStore>, interval: Duration) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        loop {
            tick.tick().await;
            let s = store.clone();
            match tokio::task::spawn_blocking(move || s.sweep()).await {
                Ok(Ok(r)) if r.removed > 0 => {
                    tracing::info!(
                        removed = r.removed,
                        bytes = r.bytes_freed,
                        "swept expired artifacts"
                    )
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!("sweeping expired artifacts failed: {e}"),
                Err(e) => tracing::warn!("sweeper task ended abnormally: {e}"),
            }
        }
    });
}
