//! `dataref serve`: MCP over stdio, or over Streamable HTTP (`--http`); `dataref token new`.
//! What a server is built from is `dataref-app`'s ([`App::start`]); this wires it to the
//! transport the person asked for.

use std::process::ExitCode;

use anyhow::Result;
use dataref_app::{App, SpillSweep, spawn_sweepers};
use dataref_http::{HttpServer, MetricsEndpoint};
use dataref_mcp::DatarefServer;
use dataref_protocol::Principal;
use tokio_util::sync::CancellationToken;

use crate::{Common, settings};

pub fn run(
    common: &Common,
    principal: Option<&str>,
    workspace: Option<&std::path::Path>,
) -> Result<ExitCode> {
    let config = settings::config(common)?;
    let principal = settings::principal(principal, &config)?;
    settings::note_no_sources(common, &config);
    crate::audit::install(&config)?;
    let metrics = bind_metrics(&config)?;
    let app = App::start(&config)?;
    crate::audit::copy_to_index(&app);
    if let Some(line) = serve_metrics(metrics, &app) {
        settings::progress_line(&line);
    }
    let App {
        runtime,
        shared,
        upstreams,
        registry,
        python,
        ..
    } = app;
    let workspace = match dataref_app::workspace(workspace, &shared, &principal) {
        Ok(w) => w,
        Err(e) => {
            // Nothing was served: take down what the start brought up, then say why.
            runtime.block_on(upstreams.shutdown());
            dataref_app::shutdown_python(python.as_deref());
            return Err(e.into());
        }
    };
    // The handshake is answered at once: the pool fills meanwhile, and a `run_python` that
    // arrives before the first warm sandbox is ready waits for that one (it is further
    // along than a cold start would be).
    let served = runtime.block_on(async move {
        spawn_sweepers(
            &config,
            shared.store.clone(),
            shared.clock.clone(),
            SpillSweep::Workspace(workspace.clone()),
        );
        let ctx = shared.context(principal, workspace);
        tracing::info!(tools = registry.len(), principal = %ctx.principal, "serving MCP on stdio");
        let served = DatarefServer::new(registry, ctx).serve_stdio().await;
        upstreams.shutdown().await;
        served
    });
    // The client closed stdin: stop the jobs and take the warm sandboxes down with their
    // cgroups and job directories, which an exiting process would leave behind.
    dataref_app::shutdown_python(python.as_deref());
    served?;
    Ok(ExitCode::SUCCESS)
}

/// `dataref serve --http ADDR` (`ADDR` empty: `[http] listen`).
pub fn run_http(common: &Common, principal: Option<&str>, addr: &str) -> Result<ExitCode> {
    let mut config = settings::config(common)?;
    settings::http_listen(&mut config, addr)?;
    let anonymous = settings::principal(principal, &config)?;
    serve_http(common, config, anonymous, None)
}

/// `dataref web [--http ADDR]`: `serve --http` on loopback for the person at this machine,
/// with a token made for this run only (the config's own tokens still work), and the page's
/// address with that token printed.
pub fn run_web(common: &Common, principal: Option<&str>, addr: &str) -> Result<ExitCode> {
    let mut config = settings::config(common)?;
    settings::http_listen(
        &mut config,
        if addr.is_empty() { "127.0.0.1:0" } else { addr },
    )?;
    if !config.http.listen.ip().is_loopback() {
        anyhow::bail!(
            "`dataref web` listens on this machine only, not on {}
             hint: to serve other people use `dataref serve --http` with tokens from `dataref token new`",
            config.http.listen
        );
    }
    let me = settings::principal(principal, &config)?;
    let t = dataref_http::new_token()
        .map_err(|_| anyhow::anyhow!("the system's random source failed"))?;
    let mut digest = [0u8; 32];
    for (i, byte) in digest.iter_mut().enumerate() {
        *byte = u8::from_str_radix(t.sha256_hex.get(2 * i..2 * i + 2).unwrap_or("00"), 16)?;
    }
    config.http.auth = true;
    config
        .principals
        .entry(me.clone())
        .or_insert_with(|| dataref_config::PrincipalConfig {
            name: me.clone(),
            token_sha256: Vec::new(),
            pg_role: None,
            pg_password: None,
            mysql_user: None,
            mysql_password: None,
            adbc: Default::default(),
        })
        .token_sha256
        .push(digest);
    serve_http(common, config, me, Some(t.token))
}

/// Serves `config` over HTTP until a signal; with `page_token`, prints the page's address
/// carrying it (in the fragment, which no request sends).
fn serve_http(
    common: &Common,
    config: dataref_config::Config,
    anonymous: Principal,
    page_token: Option<String>,
) -> Result<ExitCode> {
    // Before anything starts (the sample, the upstream servers), by the function `dataref
    // doctor` calls, so the two refuse the same configs with the same message.
    let options = settings::http_options(&config, anonymous.clone())?;
    settings::note_no_sources(common, &config);
    dataref_app::setup::raise_open_files_limit();
    crate::audit::install(&config)?;
    let metrics = bind_metrics(&config)?;
    let app = App::start(&config)?;
    crate::audit::copy_to_index(&app);
    // Said after the MCP address, which scripts look for first.
    let metrics_line = serve_metrics(metrics, &app);
    let App {
        runtime,
        shared,
        upstreams,
        registry,
        python,
        agents,
        shared_backend,
        ..
    } = app;
    let served = runtime.block_on(async move {
        spawn_sweepers(
            &config,
            shared.store.clone(),
            shared.clock.clone(),
            match &shared_backend {
                Some(backend) => SpillSweep::Shared(backend.clone()),
                None => SpillSweep::AllPrincipals,
            },
        );
        let server = DatarefServer::per_request(registry.clone(), shared.clone());
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
        // The agents over HTTP (`/agent/…`, `/v1/chat/completions`), each run as its caller
        // in the caller's workspace, like the MCP calls.
        let profiles = agents.names().join(", ");
        // With `[shared]`, every replica counts the same limits and signs links with the
        // same key.
        let replicated = match &shared_backend {
            Some(backend) => match backend.http(&config.http).await {
                Ok(replicated) => replicated,
                Err(e) => {
                    upstreams.shutdown().await;
                    anyhow::bail!("the limits and download-link key shared by the replicas: {e}");
                }
            },
            None => dataref_http::Replicated::default(),
        };
        let http = match HttpServer::bind_replicated(server, options, replicated).await {
            // With `[shared]`, a run's approval may be answered through any replica.
            Ok(h) => match &shared_backend {
                Some(backend) => h.with_agents_approvals(
                    agents,
                    shared,
                    backend.approvals(),
                    dataref_http::APPROVAL_TIMEOUT,
                ),
                None => h.with_agents(agents, shared),
            },
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
        let base = public.strip_suffix(dataref_http::MCP_PATH).unwrap_or(&public);
        settings::progress_line(&format!(
            "agents ({profiles}) at {base}/agent/sessions; OpenAI-compatible at {base}/v1/chat/completions"
        ));
        if let Some(line) = &metrics_line {
            settings::progress_line(line);
        }
        if shared_backend.is_some() {
            settings::progress_line(&format!(
                "shared with the other replicas: {}",
                dataref_http::sharing(&config.http, true)
            ));
        }
        match &page_token {
            Some(token) => settings::progress_line(&format!(
                "open {base}/#token={token} (a token for this run only; Ctrl-C stops)"
            )),
            None => settings::progress_line(&format!("the page for people is at {base}/")),
        }
        let shutdown = CancellationToken::new();
        tokio::spawn(stop_on_signal(shutdown.clone()));
        let served = http.serve(shutdown).await;
        upstreams.shutdown().await;
        settings::progress_line("stopped");
        served.map_err(|e| anyhow::anyhow!("{e}\nhint: {}", e.hint()))
    });
    dataref_app::shutdown_python(python.as_deref());
    served?;
    Ok(ExitCode::SUCCESS)
}

/// `[metrics]`'s endpoint, bound before anything starts: a port in use stops the start.
fn bind_metrics(config: &dataref_config::Config) -> Result<Option<MetricsEndpoint>> {
    config
        .metrics
        .as_ref()
        .map(|m| {
            MetricsEndpoint::bind(m)
                .map_err(|e| anyhow::anyhow!("the metrics endpoint: {e}\nhint: {}", e.hint()))
        })
        .transpose()
}

/// Serves `endpoint` on `app`'s runtime for the life of the process, with the collectors
/// of `app`'s store and sandbox; the line that says where, for the caller to print.
fn serve_metrics(endpoint: Option<MetricsEndpoint>, app: &App) -> Option<String> {
    let endpoint = endpoint?;
    app.collect_metrics();
    let line = format!("metrics for Prometheus at {}", endpoint.url());
    // Never cancelled: the runtime's end stops it.
    app.runtime.spawn(endpoint.serve(CancellationToken::new()));
    Some(line)
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
