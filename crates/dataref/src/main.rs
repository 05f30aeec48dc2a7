//! The `dataref` binary: thin glue over the library crates.
//!
//! `serve` (MCP over stdio), `demo` (the canonical analysis, played as an MCP client would),
//! `doctor` (what is missing and how to fix it), `bench` (speed and memory against pandas).
//! Logs go to stderr; stdout is the MCP channel for `serve` and the report for the others.
#![expect(
    clippy::disallowed_methods,
    reason = "the binary owns its data directory checks (doctor), benchmark files and config paths"
)]

mod bench;
mod demo;
mod doctor;
mod serve;
mod settings;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

/// dataref: agents analyse data they never see.
#[derive(Debug, Parser)]
#[command(name = "dataref", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Where data lives and what config to use; shared by every command.
#[derive(Debug, Clone, Args)]
pub struct Common {
    /// Data directory (artifacts, index, workspaces). Default: `$DATAREF_HOME`, else the
    /// XDG data dir (`~/.local/share/dataref`).
    #[arg(long, global = true, value_name = "DIR")]
    home: Option<PathBuf>,
    /// `dataref.toml`. Default: `$DATAREF_CONFIG`; without either, the built-in sample.
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Rows of the built-in sample database (used when no config is given).
    #[arg(long, global = true, value_name = "N")]
    rows: Option<u64>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the tools over MCP on stdio.
    Serve {
        #[command(flatten)]
        common: Common,
        /// The principal of this session (default: `$DATAREF_PRINCIPAL`, else config, else `local`).
        #[arg(long, value_name = "NAME")]
        principal: Option<String>,
        /// The directory file tools work in (default: the principal's own,
        /// `<data dir>/workspaces/<principal>`). It must exist.
        #[arg(long, value_name = "DIR")]
        workspace: Option<PathBuf>,
    },
    /// Play the canonical analysis on the built-in sample as an MCP client would, and show
    /// exactly what the model receives.
    Demo {
        #[command(flatten)]
        common: Common,
    },
    /// Check the data dir, config, sources and runtimes; say what is missing and how to fix it.
    Doctor {
        #[command(flatten)]
        common: Common,
    },
    /// Measure fetch and describe speed and memory, against pandas in the same run.
    Bench(bench::BenchArgs),
    /// (internal) one measured step of `bench`, in a process of its own.
    #[command(hide = true)]
    BenchWorker(bench::WorkerArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    settings::init_tracing();
    let result = match cli.command {
        Command::Serve {
            common,
            principal,
            workspace,
        } => serve::run(&common, principal.as_deref(), workspace.as_deref()),
        Command::Demo { common } => demo::run(&common),
        Command::Doctor { common } => doctor::run(&common),
        Command::Bench(args) => bench::run(&args),
        Command::BenchWorker(args) => bench::worker(&args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            // The one place errors reach a person: the whole chain, no backtrace noise.
            tracing::error!("{e:#}");
            eprintln_error(&e);
            ExitCode::FAILURE
        }
    }
}

#[expect(clippy::print_stderr, reason = "the CLI's last word on a fatal error")]
fn eprintln_error(e: &anyhow::Error) {
    eprintln!("error: {e:#}");
}
