//! `dataref bench start`: how soon `dataref serve` on stdio answers a host. MCP hosts start
//! a server per conversation and wait for its `initialize` answer before anything else, so
//! the time from spawn to that answer is time every conversation waits. Measured against
//! the floor: the same executable's `--version` (spawn, start, exit). Each server runs on
//! the built-in sample with `run_python` on (its warm pool starts filling as it starts), is
//! asked `initialize`, then `tools/list`, and is closed.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::{Value, json};

use crate::median;

#[derive(Debug, Args)]
pub struct StartArgs {
    /// Servers started (and `--version` runs); the table prints their median, min and max.
    #[arg(long, default_value_t = 10, value_name = "N")]
    runs: usize,
    /// The `dataref` executable (default: the one beside this one).
    #[arg(long, value_name = "FILE")]
    dataref: Option<PathBuf>,
    /// The data dir the servers use (default: `serve`'s own). The Python runtime installed
    /// there makes the pool fill as the server starts.
    #[arg(long, value_name = "DIR")]
    home: Option<PathBuf>,
}

/// One server's start, in ms from spawn.
struct Started {
    initialize: f64,
    tools_list: f64,
}

pub fn run(args: &StartArgs) -> Result<()> {
    if args.runs == 0 {
        bail!("`--runs` must be at least 1");
    }
    let dataref = crate::server::dataref_exe(args.dataref.as_deref())?;
    // The data dir `serve` uses by default: the Python runtime is installed there, so the
    // pool fills as it would for a person.
    let home = match &args.home {
        Some(h) => h.clone(),
        None => dataref_app::home(None)?,
    };
    let python = home.join("python").is_dir();
    dataref_app::progress_line(&format!(
        "starting `{}` {} times (and its --version)…",
        dataref.display(),
        args.runs
    ));
    // One start first, not measured: it makes the sample database if it is missing.
    serve_once(&dataref, &home)?;
    let mut version = Vec::new();
    let mut initialize = Vec::new();
    let mut tools_list = Vec::new();
    for _ in 0..args.runs {
        let t = Instant::now();
        let out = Command::new(&dataref)
            .arg("--version")
            .output()
            .context("running --version")?;
        if !out.status.success() {
            bail!("`{} --version` failed", dataref.display());
        }
        version.push(ms(t.elapsed()));
        let s = serve_once(&dataref, &home)?;
        initialize.push(s.initialize);
        tools_list.push(s.tools_list);
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "\n`dataref serve` on stdio, spawn to answer ({} runs; run_python {}; ms)\n",
        args.runs,
        if python {
            "on, its pool filling meanwhile"
        } else {
            "on, but no runtime is installed in the data dir"
        }
    )?;
    writeln!(out, "| step | median | min | max | ÷ `--version` |")?;
    writeln!(out, "|---|---:|---:|---:|---:|")?;
    let floor = median(&mut version.clone());
    for (what, v) in [
        ("`--version` (spawn, start, exit)", &mut version),
        ("`initialize` answered", &mut initialize),
        (
            "`tools/list` answered (after `initialize`)",
            &mut tools_list,
        ),
    ] {
        let (min, max) = v.iter().fold((f64::INFINITY, 0f64), |(lo, hi), x| {
            (lo.min(*x), hi.max(*x))
        });
        let m = median(v);
        writeln!(
            out,
            "| {what} | {m:.1} | {min:.1} | {max:.1} | {:.1}× |",
            m / floor
        )?;
    }
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Starts `dataref serve`, times `initialize` and `tools/list`, then closes its stdin and
/// waits for it to exit.
fn serve_once(dataref: &Path, home: &Path) -> Result<Started> {
    let t = Instant::now();
    let mut child = Command::new(dataref)
        .arg("serve")
        .arg("--home")
        .arg(home)
        .env_remove("DATAREF_CONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", dataref.display()))?;
    let mut stdin = child.stdin.take().context("the server's stdin")?;
    let mut stdout = BufReader::new(child.stdout.take().context("the server's stdout")?);
    let mut send = |v: Value| -> Result<()> {
        writeln!(stdin, "{v}")?;
        stdin.flush()?;
        Ok(())
    };
    let mut answer = |id: u64| -> Result<()> {
        let mut line = String::new();
        loop {
            line.clear();
            if stdout.read_line(&mut line)? == 0 {
                bail!("the server closed stdout before answering request {id}");
            }
            let v: Value = serde_json::from_str(&line).context("reading the server's answer")?;
            if v["id"] == json!(id) {
                if v.get("error").is_some() {
                    bail!("request {id} failed: {v}");
                }
                return Ok(());
            }
        }
    };
    send(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "dataref-bench", "version": "0"},
        }}),
    )?;
    answer(1)?;
    let initialize = ms(t.elapsed());
    send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))?;
    send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}))?;
    answer(2)?;
    let tools_list = ms(t.elapsed());
    // The client goes away: the server exits.
    drop(stdin);
    child.wait().context("waiting for the server to exit")?;
    Ok(Started {
        initialize,
        tools_list,
    })
}
