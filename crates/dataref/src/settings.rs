//! Config resolution, with the precedence written as code: flag > environment > file >
//! default. What is built from the resolved config is `dataref-app`'s.

use std::path::PathBuf;

use anyhow::{Context, Result};
use dataref_config::{Config, env};
use dataref_http::{HttpError, HttpOptions};
use dataref_protocol::Principal;
use dataref_sources::{SAMPLE_ROWS_DEFAULT, SAMPLE_ROWS_MAX};

use crate::Common;

pub fn init_tracing() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{EnvFilter, Layer};
    let filter =
        EnvFilter::try_from_env(env::DATAREF_LOG).unwrap_or_else(|_| EnvFilter::new("warn"));
    // stdout is the MCP channel: logs only ever go to stderr. Each layer has its own
    // filter: `DATAREF_LOG` says what the log shows, not which spans are traced.
    let log = tracing_subscriber::fmt::layer()
        .with_writer(crate::log::BoundedStderr)
        .with_ansi(false)
        .with_filter(filter);
    let _ = tracing_subscriber::registry()
        .with(log)
        .with(dataref_ops::trace::layer())
        .try_init();
}

/// Starts exporting spans when the config has `[traces]` (once; a later config of the
/// same process, e.g. a reload, does not restart it).
fn start_traces(config: &Config) -> Result<()> {
    let Some(traces) = &config.traces else {
        return Ok(());
    };
    if dataref_ops::trace::enabled() {
        return Ok(());
    }
    let headers = traces.headers(&env::process)?;
    dataref_config::tls::install_provider();
    dataref_ops::trace::start(dataref_ops::trace::Settings {
        endpoint: traces.endpoint.clone(),
        service_name: traces.service_name.clone(),
        headers,
        include_text: traces.include_text,
        sample: traces.sample,
    })?;
    Ok(())
}

/// Sends the spans still queued, before the process exits.
pub fn flush_traces() {
    dataref_ops::trace::flush(std::time::Duration::from_secs(5));
}

/// The data directory: `--home`, else as [`dataref_app::home`] finds it.
pub fn home(common: &Common) -> Result<PathBuf> {
    Ok(dataref_app::home(common.home.as_deref())?)
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
            let config = Config::load(&p, home)?;
            start_traces(&config)?;
            Ok(config)
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

pub const NO_SOURCES_HINT: &str = "add a `[sources.NAME]` table (docs/src/configure.md), or leave out `--config` to try the built-in sample";

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
    let from_env = env::process(env::DATAREF_PRINCIPAL).filter(|p| !p.is_empty());
    match flag.map(str::to_owned).or(from_env) {
        Some(p) => Principal::new(&p).with_context(|| format!("invalid principal `{p}`")),
        None => Ok(config.principal.clone()),
    }
}

/// One line of progress for the person, on stderr.
pub use dataref_app::progress_line;
