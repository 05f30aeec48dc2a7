//! `dataref chat` (a terminal conversation with an agent) and `dataref ask` (one question,
//! for scripts), both through `AgentHost::send`: the same loop, sessions and tools as the
//! HTTP agent API. Text streams to stdout; tool steps go to stderr, one line each;
//! approvals are asked on the terminal; Ctrl-C cancels the running turn, not the program.

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;
use std::sync::Mutex;

use anyhow::{Result, bail};
use async_trait::async_trait;
use dataref_agent::{
    AgentEvent, ApprovalRequest, ApproveAll, Approver, Decision, EventSink, NoOneToAsk,
    SendRequest, SessionStore,
};
use dataref_app::{App, SpillSweep, spawn_sweepers};
use dataref_tool::RunContext;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::{Common, settings};

/// What `chat` and `ask` were asked for.
pub struct Options<'a> {
    pub agent: Option<&'a str>,
    pub session: Option<String>,
    pub principal: Option<&'a str>,
}

/// An app started for one principal's agent runs (`chat`, `ask`, `eval`).
pub(crate) struct Started {
    pub app: App,
    pub ctx: RunContext,
    pub config: dataref_config::Config,
}

/// Starts the app for `principal` and checks that `agent` has a model to ask.
pub(crate) fn start(
    common: &Common,
    principal: Option<&str>,
    agent: Option<&str>,
) -> Result<Started> {
    let config = settings::config(common)?;
    let principal = settings::principal(principal, &config)?;
    crate::audit::install(&config)?;
    let app = App::start(&config)?;
    crate::audit::copy_to_index(&app);
    let workspace = dataref_app::workspace(None, &app.shared, &principal)?;
    let chosen = app
        .agents
        .agent(agent)
        .map_err(|e| with_hint(&e.to_string(), e.hint()))?;
    if !app.agents.has_model(chosen) {
        let e = dataref_agent::ProfileError::NoEndpoint {
            agent: chosen.name.clone(),
        };
        bail!(with_hint(&e.to_string(), e.hint()));
    }
    let ctx = app.shared.context(principal, workspace.clone());
    let _guard = app.runtime.enter();
    spawn_sweepers(
        &config,
        app.shared.store.clone(),
        app.shared.clock.clone(),
        SpillSweep::Workspace(workspace),
    );
    Ok(Started { app, ctx, config })
}

pub(crate) fn with_hint(message: &str, hint: Option<String>) -> anyhow::Error {
    match hint {
        Some(h) => anyhow::anyhow!("{message}\nhint: {h}"),
        None => anyhow::anyhow!("{message}"),
    }
}

/// `dataref ask "question"`: one message, the answer on stdout (or, with `--json`, one JSON
/// object with the answer, the session, the steps and the usage).
pub fn ask(
    common: &Common,
    opts: Options<'_>,
    question: &str,
    json_out: bool,
    yes: bool,
) -> Result<ExitCode> {
    let Started { app, ctx, .. } = start(common, opts.principal, opts.agent)?;
    let printer = Printer::new(!json_out);
    let approver: Box<dyn Approver> = if yes {
        Box::new(ApproveAll)
    } else {
        Box::new(NoOneToAsk)
    };
    let cancel = CancellationToken::new();
    let sent = app.runtime.block_on(async {
        let run = app.agents.send(SendRequest {
            ctx,
            agent: opts.agent,
            session: opts.session,
            message: question.to_owned(),
            events: &printer,
            approver: approver.as_ref(),
            cancel: cancel.clone(),
        });
        tokio::pin!(run);
        tokio::select! {
            r = &mut run => r,
            _ = tokio::signal::ctrl_c() => {
                cancel.cancel();
                run.await
            }
        }
    });
    shutdown(&app);
    let sent = sent.map_err(|e| with_hint(&e.to_string(), e.hint()))?;
    let mut out = std::io::stdout().lock();
    if json_out {
        let steps: Vec<_> = printer.steps();
        let v = json!({
            "session": sent.session,
            "agent": sent.agent,
            "answer": sent.run.answer,
            "stopped": sent.run.stopped.as_ref().map(|s| s.as_str()),
            "grounded": sent.run.grounding.as_ref().map(|g| g.grounded()),
            "unmatched": sent.run.grounding.as_ref().map(|g| g.unmatched.clone()).unwrap_or_default(),
            "steps": steps,
            "usage": {
                "prompt_tokens": sent.run.usage.prompt_tokens,
                "completion_tokens": sent.run.usage.completion_tokens,
            },
            "requests": sent.run.requests.iter().map(|r| json!({
                "turn": r.turn,
                "context_tokens": r.context_tokens,
                "prompt_tokens": r.usage.prompt_tokens,
                "completion_tokens": r.usage.completion_tokens,
            })).collect::<Vec<_>>(),
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
    } else {
        writeln!(out)?;
        note(&format!(
            "session {} (continue with --session {})",
            sent.session, sent.session
        ));
    }
    Ok(if sent.run.stopped.is_some() {
        ExitCode::from(3)
    } else {
        ExitCode::SUCCESS
    })
}

/// `dataref chat`: a conversation on the terminal.
pub fn chat(common: &Common, opts: Options<'_>) -> Result<ExitCode> {
    let Started { app, ctx, .. } = start(common, opts.principal, opts.agent)?;
    let agent = app
        .agents
        .agent(opts.agent)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .clone();
    let mut session = match opts.session {
        Some(s) => {
            SessionStore::check_id(&s).map_err(|e| anyhow::anyhow!("{e}"))?;
            s
        }
        None => SessionStore::new_id(),
    };
    note(&format!(
        "dataref chat: agent `{}` ({}), {} tools, session {session}",
        agent.name,
        app.agents
            .model_of(&agent)
            .map(|m| m.endpoint().to_owned())
            .unwrap_or_default(),
        agent.definitions.len()
    ));
    note("Ctrl-C cancels a turn; /new starts a new session; /exit or Ctrl-D leaves");
    if let Ok(history) = app
        .agents
        .sessions
        .history(&ctx.principal, &session, Some(&agent.name))
    {
        note(&format!("resuming: {} messages so far", history.len()));
    }
    let printer = Printer::new(true);
    let result = app.runtime.block_on(async {
        let stdin = StdinLines::start();
        let approver = TerminalApprover {
            lines: stdin.clone(),
        };
        loop {
            let Some(line) = prompt_line(&stdin, "you> ").await else {
                break;
            };
            let line = line.trim().to_owned();
            if line.is_empty() {
                continue;
            }
            if line == "/exit" || line == "/quit" {
                break;
            }
            if line == "/new" {
                session = SessionStore::new_id();
                note(&format!("new session {session}"));
                continue;
            }
            let cancel = CancellationToken::new();
            let run = app.agents.send(SendRequest {
                ctx: ctx.clone(),
                agent: Some(&agent.name),
                session: Some(session.clone()),
                message: line,
                events: &printer,
                approver: &approver,
                cancel: cancel.clone(),
            });
            tokio::pin!(run);
            let sent = tokio::select! {
                r = &mut run => r,
                _ = tokio::signal::ctrl_c() => {
                    note("cancelling the turn…");
                    cancel.cancel();
                    run.await
                }
            };
            println_flush("");
            if let Err(e) = sent {
                note(&format!("error: {e}"));
            }
        }
        anyhow::Ok(())
    });
    note(&format!(
        "session {session}: resume with `dataref chat --session {session}`"
    ));
    shutdown(&app);
    // Do not wait for what is still running (a sweeper's tick).
    app.runtime
        .shutdown_timeout(std::time::Duration::from_millis(200));
    result?;
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn shutdown(app: &App) {
    dataref_app::shutdown_python(app.python.as_deref());
}

/// The lines of stdin, read by a thread of their own: the prompt and the approvals take
/// them one at a time, and a wait that is given up (Ctrl-C, a cancelled run) loses no line.
struct StdinLines {
    rx: tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<String>>,
}

impl StdinLines {
    fn start() -> std::sync::Arc<Self> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        // Not joined: a read still waiting when the chat ends goes with the process.
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        std::sync::Arc::new(Self {
            rx: tokio::sync::Mutex::new(rx),
        })
    }

    /// The next line; `None` at the end of input.
    async fn next(&self) -> Option<String> {
        self.rx.lock().await.recv().await
    }
}

/// One line at the prompt; `None` at the end of input or on Ctrl-C at the prompt.
async fn prompt_line(lines: &StdinLines, prompt: &str) -> Option<String> {
    if std::io::stdin().is_terminal() {
        print_flush(prompt);
    }
    tokio::select! {
        l = lines.next() => l,
        _ = tokio::signal::ctrl_c() => None,
    }
}

#[expect(clippy::print_stdout, reason = "the chat's own output")]
fn print_flush(s: &str) {
    print!("{s}");
    let _ = std::io::stdout().flush();
}

#[expect(clippy::print_stdout, reason = "the chat's own output")]
fn println_flush(s: &str) {
    println!("{s}");
    let _ = std::io::stdout().flush();
}

#[expect(
    clippy::print_stderr,
    reason = "the chat's notes and tool steps go to stderr"
)]
fn note(s: &str) {
    eprintln!("{s}");
}

/// Prints a run's events: text to stdout as it streams, each tool step to stderr.
struct Printer {
    text: bool,
    steps: Mutex<Vec<serde_json::Value>>,
}

impl Printer {
    fn new(text: bool) -> Self {
        Self {
            text,
            steps: Mutex::new(Vec::new()),
        }
    }

    fn steps(&self) -> Vec<serde_json::Value> {
        self.steps.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl EventSink for Printer {
    fn event(&self, event: AgentEvent) {
        match event {
            AgentEvent::TextDelta { text } => {
                if self.text {
                    print_flush(&text);
                }
            }
            AgentEvent::ToolCallStarted { summary, .. } => {
                if self.text {
                    print_flush("\n");
                }
                note(&format!("  → {summary}"));
            }
            AgentEvent::ToolCallFinished {
                tool,
                outcome,
                summary,
                ms,
                ..
            } => {
                let mark = if matches!(outcome.as_str(), "ok" | "spilled" | "too_large") {
                    "✓"
                } else {
                    "✗"
                };
                note(&format!("  {mark} {tool}: {summary} ({ms} ms)"));
                if let Ok(mut s) = self.steps.lock() {
                    s.push(json!({"tool": tool, "outcome": outcome, "summary": summary, "ms": ms}));
                }
            }
            AgentEvent::ApprovalNeeded { .. } | AgentEvent::Usage { .. } => {}
            AgentEvent::Checked { unmatched } => {
                if self.text {
                    print_flush("\n");
                }
                note(&format!(
                    "  ? numbers no tool produced: {}; the model checks them and answers again",
                    unmatched.join(", ")
                ));
            }
            AgentEvent::Final {
                stopped, unmatched, ..
            } => {
                if let Some(s) = stopped {
                    note(&format!("  (stopped: {s})"));
                }
                if !unmatched.is_empty() {
                    note(&format!(
                        "  ! not grounded: no tool produced {}",
                        unmatched.join(", ")
                    ));
                }
            }
            AgentEvent::Budget {
                budget,
                window,
                unit,
                used,
                estimate,
                cap,
                percent,
                resets,
                stopped,
            } => {
                let amounts = match unit.as_str() {
                    "micros" => format!(
                        "{} of {}",
                        dataref_agent::budget::money(used),
                        dataref_agent::budget::money(cap)
                    ),
                    _ => format!(
                        "{} of {} {unit}",
                        dataref_agent::budget::thousands(used),
                        dataref_agent::budget::thousands(cap)
                    ),
                };
                if stopped {
                    let next = match unit.as_str() {
                        "micros" => dataref_agent::budget::money(estimate),
                        _ => format!("{} {unit}", dataref_agent::budget::thousands(estimate)),
                    };
                    note(&format!(
                        "  ! budget `{budget}`: the next request (up to {next}) would go over its cap ({amounts} this UTC {window}; resets {resets})"
                    ));
                } else {
                    note(&format!(
                        "  ! budget `{budget}` is at {percent}% ({amounts} this UTC {window}; resets {resets})"
                    ));
                }
            }
            AgentEvent::Error { message, hint } => {
                note(&format!("error: {message}"));
                if let Some(h) = hint {
                    note(&format!("hint: {h}"));
                }
            }
        }
    }
}

/// Asks on the terminal: the call as it will really run, then y/N.
struct TerminalApprover {
    /// The answers (one question at a time: the lines are taken one at a time).
    lines: std::sync::Arc<StdinLines>,
}

#[async_trait]
impl Approver for TerminalApprover {
    async fn decide(&self, request: &ApprovalRequest) -> Decision {
        let shown = serde_json::to_string_pretty(&request.arguments).unwrap_or_default();
        let via = request
            .via
            .as_ref()
            .map(|v| format!(" (through `{v}`)"))
            .unwrap_or_default();
        let question = format!(
            "\napprove `{}`{via} with these arguments?\n{shown}\n[y/N] ",
            request.tool
        );
        note(question.trim_end());
        // The loop gives the wait up when the run is cancelled (Ctrl-C) or out of time.
        let answer = self.lines.next().await.unwrap_or_default();
        if matches!(answer.trim(), "y" | "Y" | "yes") {
            Decision::Approve
        } else {
            Decision::Deny(None)
        }
    }
}
