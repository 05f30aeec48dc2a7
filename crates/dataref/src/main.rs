//! The `dataref` binary: thin glue over the library crates.
//!
//! `serve` (MCP over stdio, or Streamable HTTP with `--http`), `token` (bearer tokens for
//! HTTP callers), `demo` (the canonical analysis, played as an MCP client would),
//! `replay` (a table made again from its receipt, and what changed), `eval` (an agent
//! scored on a suite of questions with answers computed on the sources),
//! `doctor` (what is missing and how to fix it), `bench` (runs the `dataref-bench`
//! executable beside this one). Logs go to stderr; stdout is the MCP channel for `serve`
//! and the report for the others.
//!
//! Owns argument parsing, config resolution (flag > environment > file > default:
//! `settings`), tracing to stderr (`log`), exit codes and what each command prints.
//! What a server is built from (store, sources, sandbox, upstreams, registry, sweepers, the
//! per-call context) is `dataref-app`'s. Must not import the benchmarks, the test support,
//! or anything only they use (tokio-postgres, a throwaway PostgreSQL).
#![expect(
    clippy::disallowed_methods,
    reason = "the binary owns its data directory checks (doctor), and config paths"
)]

mod audit;
mod chat;
mod demo;
mod doctor;
mod eval;
mod forward;
mod log;
mod replay;
mod serve;
mod sessions;
mod settings;
mod store;
mod usage;

use std::ffi::OsString;
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
    /// Data directory (artifacts, index, workspaces). Default: `$DATAREF_HOME`, else
    /// `$XDG_DATA_HOME/dataref`, else `/var/lib/dataref` for root, else
    /// `~/.local/share/dataref`.
    #[arg(long, global = true, value_name = "DIR")]
    home: Option<PathBuf>,
    /// `dataref.toml`. Default: `$DATAREF_CONFIG`; without either, the built-in sample (a
    /// config file replaces it: only its own `[sources]` are served).
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Rows of the built-in sample database (used when no config is given).
    #[arg(long, global = true, value_name = "N")]
    rows: Option<u64>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the tools over MCP: on stdio (one principal), or over Streamable HTTP with
    /// `--http` (many principals, each authenticated by a bearer token or JWT).
    #[command(long_about = SERVE_HELP)]
    Serve {
        #[command(flatten)]
        common: Common,
        /// The principal of this session (default: `$DATAREF_PRINCIPAL`, else config, else
        /// `local`). With `--http`, the principal of every caller when `[http] auth = false`.
        #[arg(long, value_name = "NAME")]
        principal: Option<String>,
        /// The directory file tools work in (default: the principal's own,
        /// `<data dir>/workspaces/<principal>`). It must exist. Not with `--http`.
        #[arg(long, value_name = "DIR", conflicts_with = "http")]
        workspace: Option<PathBuf>,
        /// Serve MCP over Streamable HTTP at `ADDR` (e.g. `127.0.0.1:8750`; port 0 picks a
        /// free one) instead of stdio. Without a value: `[http] listen`.
        #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "")]
        http: Option<String>,
    },
    /// The page for people on this machine: `serve --http` on loopback with a token made
    /// for this run, and the address to open printed (chat with the agent, tables, charts,
    /// downloads).
    Web {
        #[command(flatten)]
        common: Common,
        /// Whose data (default: `$DATAREF_PRINCIPAL`, else config, else `local`).
        #[arg(long, value_name = "NAME")]
        principal: Option<String>,
        /// Listen at `ADDR`, a loopback address (default `127.0.0.1:0`, a free port).
        #[arg(long, value_name = "ADDR", default_value = "")]
        http: String,
    },
    /// Bearer tokens for `serve --http`.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Play the canonical analysis on the built-in sample as an MCP client would, and show
    /// exactly what the model receives.
    Demo {
        #[command(flatten)]
        common: Common,
    },
    /// Talk with an agent on the terminal: streamed answers, one line per tool step,
    /// approvals asked here. Ctrl-C cancels the turn; /exit or Ctrl-D leaves.
    #[command(long_about = CHAT_HELP)]
    Chat {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        agent: AgentArgs,
    },
    /// Ask an agent one question; the answer on stdout (`--json` for scripts).
    Ask {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        agent: AgentArgs,
        /// The question.
        question: String,
        /// Print one JSON object: answer, session, steps, stop reason and token usage.
        #[arg(long)]
        json: bool,
        /// Approve every call the profile's policy would ask about (there is no one to ask).
        #[arg(long)]
        yes: bool,
    },
    /// Ask an agent every question of a suite and score the answers against values computed
    /// by SQL on the sources: accuracy, grounded rate, tokens, tool calls, time and cost.
    #[command(long_about = EVAL_HELP)]
    Eval {
        #[command(flatten)]
        common: Common,
        /// The suite: a TOML file of `[[case]]`s (`evals/sample.toml` for the built-in sample).
        #[arg(value_name = "SUITE")]
        suite: PathBuf,
        /// The `[agents.NAME]` profile (default: `default`, or the only one).
        #[arg(long, value_name = "NAME")]
        agent: Option<String>,
        /// Whose tools, tables and sessions (default: `$DATAREF_PRINCIPAL`, else config).
        #[arg(long, value_name = "NAME")]
        principal: Option<String>,
        /// Ask each question this many times (each in a session of its own).
        #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
        runs: u32,
        /// Exit 3 when the share of passed runs is under this (0 to 1), e.g. 0.9.
        #[arg(long, value_name = "X")]
        min_accuracy: Option<f64>,
        /// Print one JSON object instead of the table: every case's runs and the totals.
        #[arg(long)]
        json: bool,
        /// Approve every call the profile's policy would ask about (there is no one to ask).
        #[arg(long)]
        yes: bool,
    },
    /// A principal's agent sessions: list them, show or delete one, or export one as a
    /// notebook or a Python script that re-runs its queries and code against the sources.
    Sessions {
        #[command(flatten)]
        common: Common,
        /// Whose sessions (default: `$DATAREF_PRINCIPAL`, else config).
        #[arg(long, value_name = "NAME", global = true)]
        principal: Option<String>,
        #[command(subcommand)]
        command: Option<SessionsCommand>,
    },
    /// Make a stored table again from its receipt (the same SQL and parameters on its
    /// sources, or its SQL or code over its parents) and say whether it is identical,
    /// changed (rows added, removed, changed) or unavailable.
    #[command(long_about = REPLAY_HELP)]
    Replay {
        #[command(flatten)]
        common: Common,
        /// The table's dataRef.
        #[arg(value_name = "REF")]
        data_ref: String,
        /// Whose table, run as whom (default: `$DATAREF_PRINCIPAL`, else config).
        #[arg(long, value_name = "NAME")]
        principal: Option<String>,
        /// Derive a `run_sql` or `run_python` table from its parents as stored, instead of
        /// replaying each parent from its sources first.
        #[arg(long)]
        stored_parents: bool,
        /// Print one JSON object: the outcome, the diff, the parents' outcomes.
        #[arg(long)]
        json: bool,
    },
    /// The artifact store itself: `verify` hashes every stored table against the checksum
    /// written with it and names what is damaged.
    Store {
        #[command(flatten)]
        common: Common,
        #[command(subcommand)]
        command: StoreCommand,
    },
    /// Model requests, tokens and cost by agent, principal or model (every replica's with
    /// `[shared]`), and each budget of `[budgets]` against its cap.
    Usage {
        #[command(flatten)]
        common: Common,
        /// Group by `agent`, `principal` or `model`.
        #[arg(long, value_name = "WHAT", default_value = "agent")]
        by: String,
        /// The first UTC day counted (YYYY-MM-DD); default: from the first request.
        #[arg(long, value_name = "DATE")]
        since: Option<String>,
        /// The last UTC day counted (YYYY-MM-DD); default: up to now.
        #[arg(long, value_name = "DATE")]
        until: Option<String>,
        /// Print one JSON object instead of the tables.
        #[arg(long)]
        json: bool,
    },
    /// The audit trail of every data access: `verify` checks its hash chain (exit 3 naming
    /// the first broken line), `show` prints its lines.
    Audit {
        #[command(flatten)]
        common: Common,
        #[command(subcommand)]
        command: audit::Command,
    },
    /// Check the data dir, config, sources and runtimes; say what is missing and how to fix it.
    Doctor {
        #[command(flatten)]
        common: Common,
        /// Also check the config as `serve --http ADDR` would (without a value: `[http]
        /// listen`), failing what it would refuse. Without the flag that check runs only
        /// when the config has an `[http]` table or gives a principal a token.
        #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "")]
        http: Option<String>,
    },
    /// Measure fetch and describe speed and memory, against pandas in the same run.
    ///
    /// Runs `dataref-bench`, the executable beside this one, with the same arguments
    /// (`dataref bench --help` lists them) and exits with its exit code.
    #[command(disable_help_flag = true)]
    Bench {
        /// The arguments of `dataref-bench`.
        #[arg(
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "ARGS"
        )]
        args: Vec<OsString>,
    },
    /// The worker an `adbc` source runs its driver in: reads one request on stdin, writes
    /// the result as an Arrow IPC stream on stdout (started by the server, not by people).
    #[command(hide = true)]
    AdbcWorker,
}

#[derive(Debug, Subcommand)]
enum StoreCommand {
    /// Hash every live table (local, or every replica's shared bucket and index) against
    /// its checksum; list the damaged ones with their owners. Exits 1 when any is damaged
    /// and not dropped.
    Verify {
        /// Remove the tables that fail (their rows, then what is left of their bytes).
        #[arg(long)]
        drop: bool,
    },
}

#[derive(Debug, Subcommand)]
enum SessionsCommand {
    /// The sessions, the most recently used first (the default).
    List,
    /// One session's messages and tool calls.
    Show {
        /// The session's id (`dataref sessions` lists them).
        id: String,
    },
    /// Delete one session.
    Delete {
        /// The session's id.
        id: String,
    },
    /// Write one session as a notebook (`ipynb`) or a Python script (`script`): the
    /// questions, the queries and code (re-run against the sources with your own
    /// credentials), the answers; no rows.
    Export {
        /// The session's id.
        id: String,
        /// `ipynb` (a notebook) or `script` (a Python script).
        #[arg(long, default_value = "ipynb")]
        format: String,
        /// Where to write it (default: `<id>.ipynb`, `<id>.py` or `<id>.toml` here).
        #[arg(long, short, value_name = "FILE")]
        out: Option<PathBuf>,
        /// Write an eval case instead (`[[case]]` TOML for `dataref eval`): the first
        /// question, and the SQL of the last `query` as the expected value (else the
        /// answer's numbers).
        #[arg(long, conflicts_with = "format")]
        eval: bool,
    },
}

/// Which agent, session and principal `chat` and `ask` use.
#[derive(Debug, Clone, Args)]
pub struct AgentArgs {
    /// The `[agents.NAME]` profile (default: `default`, or the only one).
    #[arg(long, value_name = "NAME")]
    agent: Option<String>,
    /// Continue this session (or start one with this id); default: a new session.
    #[arg(long, value_name = "ID")]
    session: Option<String>,
    /// Whose tools, artifacts and sessions (default: `$DATAREF_PRINCIPAL`, else config).
    #[arg(long, value_name = "NAME")]
    principal: Option<String>,
}

impl AgentArgs {
    fn options(&self) -> chat::Options<'_> {
        chat::Options {
            agent: self.agent.as_deref(),
            session: self.session.clone(),
            principal: self.principal.as_deref(),
        }
    }
}

const CHAT_HELP: &str = "\
Talk with an agent on the terminal.

The agent is an `[agents.NAME]` profile of dataref.toml; without one, the default agent
runs on the endpoint of `DATAREF_LLM_URL` (an OpenAI-compatible base URL such as
https://api.openai.com/v1, http://localhost:8000/v1 for vLLM, http://localhost:8080/v1 for
llama.cpp's server or http://localhost:11434/v1 for Ollama), with `DATAREF_LLM_MODEL` and
`DATAREF_LLM_API_KEY`. Answers stream to stdout; each tool step is one line on stderr.
Calls the profile's approval policy says `ask` about are shown with the arguments that
will really be sent, and wait for y/N. Ctrl-C cancels the running turn (the tool in it
too); /new starts a new session; /exit or Ctrl-D leaves. Sessions are kept under the data
dir: `--session ID` continues one.";

#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// Print a fresh random token (256 bits, base64url) for principal `NAME` and the
    /// `[principals.NAME]` lines that accept it (its SHA-256; the token is never stored).
    New {
        /// The principal the token authenticates as (letters, digits and `._@-`).
        name: String,
    },
}

const EVAL_HELP: &str = "\
Ask an agent every question of a suite and score the answers.

Each `[[case]]` of the suite has a question and the SQL that computes its answer on a source
(run read-only as the principal before any question is asked), and says how the answer is
scored: `number` (some number of the answer within the tolerance, 0.5% by default, of the
first cell; a share may be answered as a percent), `set` (every value of the first column
named, any order), `ordered` (in that order) or `text` (the first cell named). Each question
runs in a session of its own (`dataref sessions show ID` replays one), `--runs N` times.

The report is a Markdown table per case (result, expected, got, grounded, tokens in and out,
tool calls, seconds) and the totals: accuracy (passed runs over all runs), grounded rate
(answers whose every number matched a tool's value), tokens, tool calls, wall time, and the
cost when the profile declares `price_input` and `price_output`. `--json` prints the same as
one JSON object. It needs a model: `DATAREF_LLM_URL` (and `DATAREF_LLM_MODEL`) or the
profile's `url`. Exit codes: 0 done (and at or over `--min-accuracy`), 3 under
`--min-accuracy`, 1 an error (a bad suite, a case's SQL failing, no model).";

const REPLAY_HELP: &str = "\
Make a stored table again from its receipt and compare it with the table as stored.

A producer's table (`fetch_*`, `query`, `load_file`) is read again with the same SQL and
parameters from its source as it is now, as the same principal; a named query only while the
config still has it with the same SQL. A `run_sql` or `run_python` table is derived again
from its parents, each replayed from its own sources first (`--stored-parents`: from the
parents as stored). The original is left as it was; the table made again is a new table of
the principal's, kept until its TTL.

Identical: the same rows (in the same order where the SQL has a top-level ORDER BY). Changed:
rows added, removed and changed, matched by the first column unique in both versions, with a
few examples. Unavailable: no receipt, a parent expired, the source gone or refusing the
principal. Exit codes: 0 identical, 3 changed, 4 unavailable, 1 an error of dataref's.";

const SERVE_HELP: &str = "\
Serve the tools over MCP.

On stdio (the default) the server runs as one principal (`--principal`) in its workspace.

With `--http ADDR` it serves Streamable HTTP at `http://ADDR/mcp` for many principals in one
process, both protocol revisions: 2025-11-25 (sessions, `Mcp-Session-Id`, each bound to the
principal that opened it) and 2026-07-28 (stateless). Callers send `Authorization: Bearer
<token>`; the token's SHA-256 is looked up in `[principals.NAME] token_sha256` (make one with
`dataref token new NAME`), or a JWT is checked against `[http.jwt]`. Without a valid token:
401 with `WWW-Authenticate` naming `/.well-known/oauth-protected-resource`. `[http] auth =
false` serves everyone as `--principal` and is allowed on a loopback address only.

Also served: `GET /files/{path}` (the caller's workspace files) and `POST /files/sign` (a
short-lived signed link to one). Requests are refused with 403 when `Host` or `Origin` is not
allowed (`[http] allowed_hosts`, `allowed_origins`), and with 429 + `Retry-After` over
`[http] max_concurrent` or `rate_per_minute` per principal. SIGINT or SIGTERM stops it
gracefully.";

fn main() -> ExitCode {
    let cli = Cli::parse();
    settings::init_tracing();
    let result = match cli.command {
        Command::Serve {
            common,
            principal,
            workspace,
            http: None,
        } => serve::run(&common, principal.as_deref(), workspace.as_deref()),
        Command::Serve {
            common,
            principal,
            http: Some(addr),
            ..
        } => serve::run_http(&common, principal.as_deref(), &addr),
        Command::Web {
            common,
            principal,
            http,
        } => serve::run_web(&common, principal.as_deref(), &http),
        Command::Token {
            command: TokenCommand::New { name },
        } => serve::new_token(&name),
        Command::Demo { common } => demo::run(&common),
        Command::Chat { common, agent } => chat::chat(&common, agent.options()),
        Command::Ask {
            common,
            agent,
            question,
            json,
            yes,
        } => chat::ask(&common, agent.options(), &question, json, yes),
        Command::Eval {
            common,
            suite,
            agent,
            principal,
            runs,
            min_accuracy,
            json,
            yes,
        } => eval::run(
            &common,
            eval::Options {
                suite: &suite,
                agent: agent.as_deref(),
                principal: principal.as_deref(),
                runs,
                json,
                min_accuracy,
                yes,
            },
        ),
        Command::Sessions {
            common,
            principal,
            command,
        } => {
            let action = match &command {
                None | Some(SessionsCommand::List) => sessions::Action::List,
                Some(SessionsCommand::Show { id }) => sessions::Action::Show(id),
                Some(SessionsCommand::Delete { id }) => sessions::Action::Delete(id),
                Some(SessionsCommand::Export {
                    id,
                    format,
                    out,
                    eval,
                }) => sessions::Action::Export {
                    id,
                    format: if *eval { "eval" } else { format.as_str() },
                    out: out.as_deref(),
                },
            };
            sessions::run(&common, principal.as_deref(), action)
        }
        Command::Replay {
            common,
            data_ref,
            principal,
            stored_parents,
            json,
        } => replay::run(
            &common,
            principal.as_deref(),
            &data_ref,
            stored_parents,
            json,
        ),
        Command::Store {
            common,
            command: StoreCommand::Verify { drop },
        } => store::verify(&common, drop),
        Command::Usage {
            common,
            by,
            since,
            until,
            json,
        } => usage::run(
            &common,
            usage::Options {
                by: &by,
                since: since.as_deref(),
                until: until.as_deref(),
                json,
            },
        ),
        Command::Audit { common, command } => audit::run(&common, command),
        Command::Doctor { common, http } => doctor::run(&common, http.as_deref()),
        Command::Bench { args } => forward::bench(&args),
        Command::AdbcWorker => Ok(
            if dataref_sources::adbc::worker(
                std::io::stdin().lock(),
                std::io::BufWriter::with_capacity(1 << 20, std::io::stdout().lock()),
                std::io::stderr(),
            ) {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(3)
            },
        ),
    };
    settings::flush_traces();
    // The audit events still queued (and the shared index's copy), before the exit.
    dataref_ops::audit::flush(std::time::Duration::from_secs(5));
    match result {
        Ok(code) => code,
        Err(e) => {
            // The one place errors reach a person: the whole chain, no backtrace noise, and
            // once (not also as a log line: both go to stderr).
            eprintln_error(&e);
            ExitCode::FAILURE
        }
    }
}

#[expect(clippy::print_stderr, reason = "the CLI's last word on a fatal error")]
fn eprintln_error(e: &anyhow::Error) {
    eprintln!("error: {e:#}");
}
