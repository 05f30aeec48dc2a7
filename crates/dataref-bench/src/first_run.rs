//! `dataref bench first-run`: what the first `run_python` of a session costs against a warm
//! one. Each round starts a fresh in-process server on the built-in sample (the server
//! `serve` runs, spoken to over MCP as `bench context` does), does the handshake, sends the
//! seed's quarter-over-quarter pivot at once, then the same call `--warm-runs` times with
//! the pool full; and the same with the pool turned off (`pool_size = 0`: every run starts
//! its sandbox), the baseline. Like `serve` on stdio, the server answers the handshake at
//! once and the first call waits for the warm sandbox on its way, so the first-call column
//! shows what that costs and the last column the whole wait of a client that calls at once.
//! Rounds alternate between the two so both see the same page cache; the table prints each
//! round and the medians.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use dataref_mcp::rmcp;
use dataref_mcp::{DatarefServer, connect_in_process};
use serde_json::{Value, json};

use super::context::{SEED_QOQ_CODE, call, pointer};
use dataref_app::Sample;

use crate::{median, result_text};

#[derive(Debug, Args)]
pub struct FirstRunArgs {
    /// Rows of the sample (the seed's `fetch_sales since 2025-01-01` returns them all).
    #[arg(long, default_value_t = 48_210, value_name = "N")]
    rows: u64,
    /// Fresh servers of each kind (pool on, pool off); the table prints their median.
    #[arg(long, default_value_t = 3, value_name = "N")]
    servers: usize,
    /// Runs after the first, each with the pool full again.
    #[arg(long, default_value_t = 5, value_name = "N")]
    warm_runs: usize,
}

/// The principal whose artifact every round reads.
const PRINCIPAL: &str = "bench-first-run";

/// One fresh server's calls.
struct Round {
    pool: bool,
    /// How the first call was served (the pool's count of warm runs).
    first_warm: bool,
    /// From the start of the server to the end of the handshake.
    start_ms: f64,
    /// The first call as the client sees it.
    first_ms: f64,
    /// The median of the later calls.
    warm_ms: f64,
}

pub fn run(args: &FirstRunArgs) -> Result<()> {
    if args.servers == 0 || args.warm_runs == 0 {
        bail!("`--servers` and `--warm-runs` must be at least 1");
    }
    let home = dataref_app::home(None)?;
    dataref_app::progress_line(&format!(
        "first run_python against warm ones, {} fresh servers of each kind on {} rows…",
        args.servers, args.rows
    ));
    let sales = fetch_sales(&home, args.rows)?;
    let mut rounds = Vec::new();
    for i in 0..args.servers {
        for pool in [true, false] {
            dataref_app::progress_line(&format!(
                "round {} of {}: pool {}",
                i + 1,
                args.servers,
                if pool { "on" } else { "off" }
            ));
            rounds.push(round(&home, args, &sales, pool)?);
        }
    }
    print_table(&mut std::io::stdout().lock(), args, &rounds)
}

/// The seed's `fetch_sales`, once, by a server of its own: its dataRef stays in the store
/// for every round (the same principal, the same data dir).
fn fetch_sales(home: &std::path::Path, rows: u64) -> Result<String> {
    let sample = Sample::prepare_with(home.to_path_buf(), rows, PRINCIPAL, Some(0))?;
    sample.runtime.block_on(async {
        let session = connect_in_process(
            DatarefServer::new(sample.registry.clone(), sample.ctx.clone()),
            (),
        )
        .await
        .context("MCP handshake with the in-process server")?;
        let fetched = call(
            &session.client,
            "fetch_sales",
            json!({"since": "2025-01-01"}),
        )
        .await?;
        session.client.cancel().await.ok();
        session.server.abort();
        pointer(&fetched, "/dataRef")
    })
}

fn round(home: &std::path::Path, args: &FirstRunArgs, sales: &str, pool: bool) -> Result<Round> {
    let started = Instant::now();
    let sample = Sample::prepare_with(
        home.to_path_buf(),
        args.rows,
        PRINCIPAL,
        (!pool).then_some(0),
    )?;
    let sandbox = sample
        .python
        .clone()
        .context("the sample has `[python] enabled = false`")?;
    let pool_size = sandbox.settings().pool_size;
    let code = json!({"inputs": {"sales": sales}, "code": SEED_QOQ_CODE});
    sample.runtime.block_on(async {
        let session = connect_in_process(
            DatarefServer::new(sample.registry.clone(), sample.ctx.clone()),
            (),
        )
        .await
        .context("MCP handshake with the in-process server")?;
        let start_ms = ms(started.elapsed());
        let client = &session.client;
        let first_ms = timed(client, &code).await?;
        let first_warm = sandbox.status().warm_runs == 1;
        let mut warm = Vec::new();
        for _ in 0..args.warm_runs {
            // Warm means a full pool: wait for the refill of the previous run.
            let until = Instant::now() + Duration::from_secs(120);
            while sandbox.warm_count() < pool_size {
                if Instant::now() > until {
                    bail!("the warm pool did not fill within two minutes");
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            warm.push(timed(client, &code).await?);
        }
        session.client.cancel().await.ok();
        session.server.abort();
        Ok(Round {
            pool,
            first_warm,
            start_ms,
            first_ms,
            warm_ms: median(&mut warm),
        })
    })
}

/// One `run_python` call: the client's wall clock (the run's own duration is logged, not
/// returned).
async fn timed(
    client: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
    args: &Value,
) -> Result<f64> {
    let t = Instant::now();
    let r = call(client, "run_python", args.clone()).await?;
    let wall = ms(t.elapsed());
    // A failed run says `ok: false` (success leaves `ok` out).
    if r.structured_content.as_ref().and_then(|s| s.get("ok")) == Some(&Value::Bool(false)) {
        bail!("the seed's run_python failed: {}", result_text(&r));
    }
    Ok(wall)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn print_table(out: &mut impl Write, args: &FirstRunArgs, rounds: &[Round]) -> Result<()> {
    writeln!(
        out,
        "\nthe first run_python of a session against warm ones ({} rows, the seed's pivot; ms, \
         the client's wall clock; warm = median of {})",
        args.rows, args.warm_runs
    )?;
    writeln!(
        out,
        "| server | start + handshake | first | warm | first / warm | start to first result | first served by |"
    )?;
    writeln!(out, "|---|---:|---:|---:|---:|---:|---|")?;
    let row = |out: &mut dyn Write, name: String, r: &Round| -> Result<()> {
        writeln!(
            out,
            "| {name} | {:.0} | {:.0} | {:.0} | {:.2} | {:.0} | {} |",
            r.start_ms,
            r.first_ms,
            r.warm_ms,
            r.first_ms / r.warm_ms,
            r.start_ms + r.first_ms,
            if r.first_warm {
                "a warm sandbox"
            } else {
                "a cold start"
            }
        )?;
        Ok(())
    };
    for (i, r) in rounds.iter().enumerate() {
        let kind = if r.pool { "pool on" } else { "pool off" };
        row(out, format!("{} #{}", kind, i / 2 + 1), r)?;
    }
    for pool in [true, false] {
        let of: Vec<&Round> = rounds.iter().filter(|r| r.pool == pool).collect();
        let med = |f: fn(&Round) -> f64| median(&mut of.iter().map(|r| f(r)).collect::<Vec<_>>());
        let r = Round {
            pool,
            first_warm: of.iter().all(|r| r.first_warm),
            start_ms: med(|r| r.start_ms),
            first_ms: med(|r| r.first_ms),
            warm_ms: med(|r| r.warm_ms),
        };
        let kind = if pool {
            "**median, pool on**"
        } else {
            "**median, pool off (baseline)**"
        };
        row(out, kind.to_owned(), &r)?;
    }
    Ok(())
}
