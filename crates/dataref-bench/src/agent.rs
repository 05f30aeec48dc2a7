//! `dataref bench agent`: what the agent loop itself costs and what the model receives.
//!
//! 1. The loop's own time per turn, model time excluded: the sample's `default` agent
//!    (resolved by [`AgentHost::build`] from [`Config::builtin_sample`] without an endpoint)
//!    answered by an in-process model that answers at once, over a 200-message session
//!    history of ~100k tokens: a final text, and a `list_artifacts` call then the final text
//!    (the tool's own time, from its `ToolCallStarted`/`ToolCallFinished` events, apart).
//!    [`Agent::run`] with its token counts cached, against the same run with a fresh
//!    [`TokenCounter`] (what a loop without a count cache pays); and [`AgentHost::send`]
//!    (the history loaded from SQLite, the run appended).
//! 2. Context assembly: [`window::fit`] of that history into a budget below its size, with
//!    the counts cached, against counting every message afresh and fitting.
//! 3. The tokens the model receives for the seed's question answered by the scripted
//!    analyst on the sample at each size, against returning the fetched rows as JSON.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use async_trait::async_trait;
use clap::Args;
use dataref_agent::SendRequest;
use dataref_agent::llm::{ChatModel, ChatRequest, ChatResponse, LlmError, TextSink};
use dataref_agent::scripted::{QUESTION, ScriptedAnalyst};
use dataref_agent::tokens::TokenCounter;
use dataref_agent::{
    Agent, AgentEvent, AgentHost, AssistantToolCall, EventSink, Message, NoOneToAsk, Role,
    RunInput, RunOutcome, StepOutcome, Usage, window,
};
use dataref_app::Sample;
use dataref_config::Config;
use dataref_protocol::DataRef;
use dataref_store::ArtifactStore;
use dataref_tool::{OutcomeKind, RunContext};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Args)]
pub struct AgentArgs {
    /// Sample sizes the scripted analyst answers the seed's question on (the token table),
    /// comma-separated; the loop and context tables run on the smallest.
    #[arg(long, value_delimiter = ',', default_value = "48210,1000000,10000000")]
    rows: Vec<u64>,
    /// Runs of each timed step (p50/p95 over them).
    #[arg(long, default_value_t = 200, value_name = "N")]
    runs: usize,
}

/// The principal of every run here.
const PRINCIPAL: &str = "bench-agent";

/// Messages of the session history the loop and the context manager work on.
const HISTORY_MESSAGES: usize = 200;

/// Rows whose JSON is tokenized to estimate returning every fetched row (as `demo` does).
const NAIVE_SAMPLE_ROWS: usize = 2_000;

/// The person's message that the instant model answers with a final text.
const PLAIN_MESSAGE: &str = "Thanks. Anything else I should know before the meeting?";

/// The person's message that the instant model answers with a `list_artifacts` call first.
const TOOL_MESSAGE: &str = "Which tables do I have in this session? List them.";

/// The goals, as the tables state them.
const LOOP_GOAL_MS: f64 = 2.0;
const FIT_GOAL_MS: f64 = 5.0;

/// The token table's tolerance: totals within this share of the smallest are "the same"
/// (only row counts in observations depend on the size).
const SAME_TOTAL_SHARE: f64 = 0.01;

pub fn run(args: &AgentArgs) -> Result<()> {
    if args.runs == 0 {
        bail!("`--runs` must be at least 1");
    }
    let Some(&smallest) = args.rows.iter().min() else {
        bail!("`--rows` names no size");
    };
    let home = dataref_app::home(None)?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "\ndataref bench agent — {} cores, {} build",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        if cfg!(debug_assertions) {
            "debug (numbers are not representative)"
        } else {
            "release"
        }
    )?;
    drop(out);

    dataref_app::progress_line(&format!(
        "the agent loop: {} runs of each step on the {smallest}-row sample…",
        args.runs
    ));
    let sample = Sample::prepare(home.clone(), smallest, PRINCIPAL)?;
    let sessions_home = sessions_dir(&home);
    let loop_result =
        sample
            .runtime
            .block_on(loop_tables(&sample, &sessions_home, smallest, args.runs));
    let _ = std::fs::remove_dir_all(&sessions_home);
    let (loop_rows, fit_rows, ground_rows, history) = loop_result?;
    drop(sample);
    let mut out = std::io::stdout().lock();
    print_loop_table(&mut out, &history, args.runs, &loop_rows)?;
    print_fit_table(&mut out, &history, args.runs, &fit_rows)?;
    print_ground_table(&mut out, &history, args.runs, &ground_rows)?;
    drop(out);

    let bpe = dataref_agent::tokens::o200k_base();
    let mut sizes = Vec::new();
    for &n in &args.rows {
        dataref_app::progress_line(&format!(
            "the seed's question through the scripted analyst on {n} rows…"
        ));
        let sample = Sample::prepare(home.clone(), n, PRINCIPAL)?;
        let measured = sample
            .runtime
            .block_on(seed_run(&sample, &home, n, bpe))
            .with_context(|| format!("the scripted analyst on {n} rows"))?;
        sizes.push(measured);
    }
    print_token_table(&mut std::io::stdout().lock(), &sizes)
}

// ---------------------------------------------------------------------------------------
// The session history.

/// A small deterministic generator (xorshift64*), so every run benches the same history.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// In `lo..=hi`.
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.range(0, items.len() - 1)]
    }

    fn hex(&mut self, n: usize) -> String {
        (0..n)
            .map(|_| char::from(b"0123456789abcdef"[(self.next() % 16) as usize]))
            .collect()
    }
}

const LINES: &[&str] = &[
    "Outdoor", "Kitchen", "Garden", "Lighting", "Textiles", "Audio", "Office", "Toys", "Bath",
    "Storage", "Sports", "Pets",
];
const REGIONS: &[&str] = &["North", "South", "East", "West", "Central", "Export"];
const CHANNELS: &[&str] = &["web", "retail", "wholesale", "marketplace"];
const QUARTERS: &[&str] = &["2025Q1", "2025Q2", "2025Q3", "2025Q4", "2026Q1"];
const ASKS: &[&str] = &[
    "Which product lines lost the most revenue in {q} compared with the quarter before?",
    "Break the revenue of {l} down by region for {q}, and tell me where it fell.",
    "How did the {c} channel do in {q}? Compare units and revenue with the year before.",
    "Is the discount rate in {r} higher than elsewhere? Show it per quarter.",
    "Make a chart of monthly revenue for {l} and {l2} since the start of 2025.",
    "Export the table of {r} by channel as a CSV file, please.",
    "Which region had the biggest share of {l} sales in {q}, and how big was it?",
    "Did the returns in {c} change after the price update in {q}?",
];

/// One of the person's questions, 100–400 characters.
fn question(rng: &mut Rng) -> String {
    let mut text = String::new();
    for _ in 0..rng.range(1, 3) {
        let s = rng
            .pick(ASKS)
            .replace("{q}", rng.pick(QUARTERS))
            .replace("{l2}", rng.pick(LINES))
            .replace("{l}", rng.pick(LINES))
            .replace("{r}", rng.pick(REGIONS))
            .replace("{c}", rng.pick(CHANNELS));
        if !text.is_empty() {
            text.push(' ');
        }
        text.push_str(&s);
    }
    text
}

/// Pandas code the way a model writes it for `run_python`, 500–1,500 characters.
fn python_code(rng: &mut Rng) -> String {
    let target = rng.range(500, 1_500);
    let mut code =
        String::from("q = sales.assign(quarter=sales['date'].dt.to_period('Q').astype(str))\n");
    while code.len() < target {
        let by = rng.pick(&["line", "region", "channel"]);
        let v = rng.pick(&["revenue", "units", "discount"]);
        let name = format!("t_{}", rng.hex(4));
        code.push_str(&format!(
            "{name} = q.pivot_table(index='{by}', columns='quarter', values='{v}', aggfunc='sum', fill_value=0)\n\
             {name}['delta'] = {name}.iloc[:, -1] - {name}.iloc[:, -2]\n\
             outputs['{name}'] = {name}.sort_values('delta').reset_index()\n"
        ));
    }
    code.push_str("result = {k: len(v) for k, v in outputs.items()}\n");
    code
}

fn data_ref(rng: &mut Rng) -> String {
    format!("art_{}", rng.hex(20))
}

/// A tool result of 200–2,000 characters: a dataRef, its schema and sample rows.
fn tool_result(rng: &mut Rng) -> String {
    let target = rng.range(200, 2_000);
    let mut rows = Vec::new();
    let mut v = json!({
        "dataRef": data_ref(rng),
        "rows": rng.range(50, 5_000_000),
        "columns": ["date", "line", "region", "channel", "units", "revenue", "discount"],
        "sample": [],
    });
    loop {
        let text = v.to_string();
        if text.len() >= target || rows.len() >= 40 {
            return text;
        }
        rows.push(json!({
            "date": format!("2025-{:02}-{:02}", rng.range(1, 12), rng.range(1, 28)),
            "line": rng.pick(LINES),
            "region": rng.pick(REGIONS),
            "channel": rng.pick(CHANNELS),
            "units": rng.range(1, 400),
            "revenue": rng.range(100, 9_999_999) as f64 / 100.0,
            "discount": rng.range(0, 35) as f64 / 100.0,
        }));
        v["sample"] = Value::Array(rows.clone());
    }
}

/// The assistant's answer: a sentence or two and a Markdown table, 800–4,800 characters.
fn answer(rng: &mut Rng) -> String {
    let target = rng.range(800, 4_800);
    let mut text = format!(
        "From {} to {}, {} lost the most revenue, mostly in {} through the {} channel. \
         The table has every line; the chart and the CSV are in your workspace.\n\n\
         | line | region | previous | latest | change | % |\n|---|---|---:|---:|---:|---:|\n",
        rng.pick(QUARTERS),
        rng.pick(QUARTERS),
        rng.pick(LINES),
        rng.pick(REGIONS),
        rng.pick(CHANNELS)
    );
    while text.len() < target {
        let prev = rng.range(10_000, 9_000_000) as f64 / 100.0;
        let last = rng.range(10_000, 9_000_000) as f64 / 100.0;
        text.push_str(&format!(
            "| {} | {} | {prev:.2} | {last:.2} | {:+.2} | {:+.1}% |\n",
            rng.pick(LINES),
            rng.pick(REGIONS),
            last - prev,
            (last - prev) / prev * 100.0
        ));
    }
    text
}

fn tool_call(rng: &mut Rng, name: &str, arguments: Value) -> AssistantToolCall {
    AssistantToolCall {
        id: format!("call_{}", rng.hex(24)),
        name: name.to_owned(),
        arguments: arguments.to_string(),
    }
}

/// One exchange of the person and the agent: `calls` tool calls (0–2) and the answer.
fn exchange(rng: &mut Rng, calls: usize, out: &mut Vec<Message>) {
    out.push(Message::user(question(rng)));
    if calls > 0 {
        let since = json!({"since": format!("2025-{:02}-01", rng.range(1, 12))});
        let mut list = vec![tool_call(rng, "fetch_sales", since)];
        if calls > 1 {
            let code = python_code(rng);
            let sales = data_ref(rng);
            list.push(tool_call(
                rng,
                "run_python",
                json!({"code": code, "inputs": {"sales": sales}}),
            ));
        }
        let ids: Vec<String> = list.iter().map(|c| c.id.clone()).collect();
        out.push(Message::assistant_calls("", list));
        for id in ids {
            out.push(Message::tool(
                id,
                tool_result(rng),
                StepOutcome::Ran(OutcomeKind::Ok),
            ));
        }
    }
    out.push(Message::assistant(answer(rng)));
}

/// A session of exactly [`HISTORY_MESSAGES`] messages: questions, calls with JSON
/// arguments, results of 200–2,000 characters and answers, well formed (every call
/// answered), ending with an answer.
fn session_history() -> Vec<Message> {
    let mut rng = Rng(0x5EED_DA7A_2E5F_0001);
    let mut out = Vec::with_capacity(HISTORY_MESSAGES);
    while out.len() < HISTORY_MESSAGES {
        let left = HISTORY_MESSAGES - out.len();
        if left < 10 {
            // The last ones exactly (an exchange is 2, 4 or 5 messages, and each step
            // before this leaves at least five).
            let plan: &[usize] = match left {
                9 => &[2, 1],
                8 => &[1, 1],
                7 => &[2, 0],
                6 => &[1, 0],
                5 => &[2],
                4 => &[1],
                2 => &[0],
                _ => &[],
            };
            for &c in plan {
                exchange(&mut rng, c, &mut out);
            }
            break;
        }
        // Mostly analyses with two calls, some with one, a few plain questions.
        let c = match rng.range(0, 9) {
            0 => 0,
            1..=3 => 1,
            _ => 2,
        };
        exchange(&mut rng, c, &mut out);
    }
    out
}

/// The history's size, as the tables print it.
struct HistoryInfo {
    messages: usize,
    tool_results: usize,
    tokens: usize,
    bytes: usize,
}

fn history_info(history: &[Message], counter: &TokenCounter) -> HistoryInfo {
    HistoryInfo {
        messages: history.len(),
        tool_results: history.iter().filter(|m| m.role == Role::Tool).count(),
        tokens: counter.count_messages(history).iter().sum(),
        bytes: history
            .iter()
            .map(|m| {
                m.content.len()
                    + m.tool_calls
                        .iter()
                        .map(|c| c.arguments.len())
                        .sum::<usize>()
            })
            .sum(),
    }
}

// ---------------------------------------------------------------------------------------
// The instant model and the events.

/// A model that answers at once: a `list_artifacts` call first when the person's latest
/// message is [`TOOL_MESSAGE`] and no result came back yet, else a final text.
struct InstantModel;

#[async_trait]
impl ChatModel for InstantModel {
    fn endpoint(&self) -> &str {
        "in-process instant model (bench)"
    }

    async fn complete(
        &self,
        request: &ChatRequest,
        _sink: &dyn TextSink,
        cancel: &CancellationToken,
    ) -> Result<ChatResponse, LlmError> {
        if cancel.is_cancelled() {
            return Err(LlmError::Cancelled);
        }
        let start = request
            .messages
            .iter()
            .rposition(|m| m.role == Role::User)
            .unwrap_or(0);
        let asked_tool = request.messages[start].content == TOOL_MESSAGE;
        let answered = request.messages[start..]
            .iter()
            .any(|m| m.role == Role::Tool);
        let message = if asked_tool && !answered {
            Message::assistant_calls(
                "",
                vec![AssistantToolCall {
                    id: "call_bench_list".into(),
                    name: "list_artifacts".into(),
                    arguments: "{}".into(),
                }],
            )
        } else {
            Message::assistant("Nothing else: the numbers above are the latest.")
        };
        Ok(ChatResponse {
            message,
            usage: Some(Usage {
                prompt_tokens: 0,
                completion_tokens: 0,
            }),
            finish_reason: Some("stop".into()),
        })
    }
}

/// The tool calls of a run, timed from their events.
#[derive(Default)]
struct ToolTimes {
    started: Mutex<Option<Instant>>,
    calls: Mutex<Vec<ToolTime>>,
}

struct ToolTime {
    tool: String,
    outcome: String,
    summary: String,
    /// From `ToolCallStarted` to `ToolCallFinished`.
    span: Duration,
    /// The `ms` the finished event reports (whole milliseconds).
    ms: u64,
}

impl ToolTimes {
    fn take(&self) -> Vec<ToolTime> {
        std::mem::take(&mut *self.calls.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl EventSink for ToolTimes {
    fn event(&self, event: AgentEvent) {
        match event {
            AgentEvent::ToolCallStarted { .. } => {
                *self.started.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
            }
            AgentEvent::ToolCallFinished {
                tool,
                outcome,
                summary,
                ms,
                ..
            } => {
                let span = self
                    .started
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take()
                    .map_or(Duration::ZERO, |t| t.elapsed());
                self.calls
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(ToolTime {
                        tool,
                        outcome,
                        summary,
                        span,
                        ms,
                    });
            }
            _ => {}
        }
    }
}

// ---------------------------------------------------------------------------------------
// Tables 1 and 2: the loop and the context manager.

/// p50 and p95 of some timings, in milliseconds.
#[derive(Clone, Copy)]
struct Spread {
    p50: f64,
    p95: f64,
}

impl Spread {
    fn of(ms: &[f64]) -> Self {
        let mut v = ms.to_vec();
        v.sort_by(f64::total_cmp);
        let at = |p: f64| {
            if v.is_empty() {
                return f64::NAN;
            }
            // Nearest rank.
            let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
            v[rank.clamp(1, v.len()) - 1]
        };
        Self {
            p50: at(50.0),
            p95: at(95.0),
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// One row of the loop table.
struct LoopRow {
    what: String,
    turns: usize,
    /// The whole run (or send), tool time included.
    run: Spread,
    /// Per turn, the tool's time taken out.
    per_turn: Option<Spread>,
    baseline: bool,
    note: String,
}

/// One row of the context table.
struct FitRow {
    what: &'static str,
    time: Spread,
    baseline: bool,
    kept: usize,
    dropped: usize,
    tokens: usize,
    budget: usize,
    total: usize,
}

/// A run's timings: the whole, the tool's span, the turns.
struct Timed {
    total: Duration,
    tool: Duration,
    tool_ms: u64,
    turns: usize,
    tool_calls: usize,
}

impl Timed {
    fn loop_per_turn(&self) -> f64 {
        ms(self.total.saturating_sub(self.tool)) / self.turns.max(1) as f64
    }
}

fn check_outcome(what: &str, out: &RunOutcome, tools: &[ToolTime], want_tool: bool) -> Result<()> {
    if let Some(s) = &out.stopped {
        bail!("{what}: the run stopped: {}", s.sentence());
    }
    if want_tool {
        match tools {
            [t] if t.outcome == "ok" || t.outcome == "spilled" => {}
            [t] => bail!(
                "{what}: `{}` answered `{}`: {}",
                t.tool,
                t.outcome,
                t.summary
            ),
            _ => bail!(
                "{what}: expected one tool call, the run made {}",
                tools.len()
            ),
        }
    }
    Ok(())
}

async fn timed_run(
    agent: &Agent,
    ctx: &RunContext,
    history: &[Message],
    message: &str,
    model: &Arc<dyn ChatModel>,
) -> Result<Timed> {
    let events = ToolTimes::default();
    let history = history.to_vec();
    let t = Instant::now();
    let out = agent
        .run(RunInput {
            ctx: ctx.clone(),
            history,
            message: message.to_owned(),
            model: Some(model.clone()),
            events: &events,
            approver: &NoOneToAsk,
            cancel: CancellationToken::new(),
            checkpoint: None,
        })
        .await;
    let total = t.elapsed();
    let tools = events.take();
    check_outcome("Agent::run", &out, &tools, message == TOOL_MESSAGE)?;
    Ok(Timed {
        total,
        tool: tools.iter().map(|t| t.span).sum(),
        tool_ms: tools.iter().map(|t| t.ms).sum(),
        turns: out.requests.len(),
        tool_calls: tools.len(),
    })
}

/// A send on a fresh session holding `history` (stored beforehand, removed after).
async fn timed_send(
    host: &AgentHost,
    ctx: &RunContext,
    history: &[Message],
    message: &str,
) -> Result<Timed> {
    let id = dataref_agent::SessionStore::new_id();
    let seeded = RunOutcome {
        messages: history.to_vec(),
        answer: String::new(),
        stopped: None,
        requests: Vec::new(),
        usage: Usage::default(),
        tool_calls: 0,
        saved: 0,
        grounding: None,
    };
    host.sessions
        .append_run(
            &ctx.principal,
            &id,
            host.default_name(),
            ctx.clock.now(),
            &seeded,
        )
        .context("storing the bench session's history")?;
    let events = ToolTimes::default();
    let t = Instant::now();
    let sent = host
        .send(SendRequest {
            ctx: ctx.clone(),
            agent: None,
            session: Some(id.clone()),
            message: message.to_owned(),
            events: &events,
            approver: &NoOneToAsk,
            cancel: CancellationToken::new(),
        })
        .await;
    let total = t.elapsed();
    let _ = host.sessions.delete(&ctx.principal, &id);
    let sent = sent.map_err(|e| anyhow::anyhow!("AgentHost::send: {e}"))?;
    let tools = events.take();
    check_outcome(
        "AgentHost::send",
        &sent.run,
        &tools,
        message == TOOL_MESSAGE,
    )?;
    Ok(Timed {
        total,
        tool: tools.iter().map(|t| t.span).sum(),
        tool_ms: tools.iter().map(|t| t.ms).sum(),
        turns: sent.run.requests.len(),
        tool_calls: tools.len(),
    })
}

/// The sample's config without an endpoint (the instant or the scripted model answers,
/// whatever `DATAREF_LLM_URL` says), its data dir `home`.
fn config_without_endpoint(home: &Path, rows: u64) -> Config {
    Config::builtin_sample_with_env(home.to_path_buf(), rows, &|_| None)
}

fn loop_row(what: &str, timed: &[Timed], baseline: bool, note: String) -> LoopRow {
    let with_tool = timed.iter().any(|t| t.tool_calls > 0);
    LoopRow {
        what: what.to_owned(),
        turns: timed.first().map_or(0, |t| t.turns),
        run: Spread::of(&timed.iter().map(|t| ms(t.total)).collect::<Vec<_>>()),
        per_turn: Some(Spread::of(
            &timed.iter().map(Timed::loop_per_turn).collect::<Vec<_>>(),
        )),
        baseline,
        note: if with_tool && note.is_empty() {
            "tool time taken out".into()
        } else {
            note
        },
    }
}

async fn loop_tables(
    sample: &Sample,
    sessions_home: &Path,
    rows: u64,
    runs: usize,
) -> Result<(Vec<LoopRow>, Vec<FitRow>, Vec<GroundRow>, HistoryInfo)> {
    std::fs::create_dir_all(sessions_home)
        .with_context(|| format!("creating `{}`", sessions_home.display()))?;
    let mut config = config_without_endpoint(sessions_home, rows);
    config.principal = sample.ctx.principal.clone();
    let host = AgentHost::build(&config, &sample.registry)
        .map_err(|e| anyhow::anyhow!("building the sample's agents: {e}"))?;
    let model: Arc<dyn ChatModel> = Arc::new(InstantModel);
    host.set_fallback(model.clone());
    let agent = host
        .agent(None)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .clone();
    let profile = config
        .agents
        .get(host.default_name())
        .context("the sample has no default agent")?
        .clone();
    let ctx = &sample.ctx;
    let history = session_history();
    let info = history_info(&history, &agent.counter);

    let mut rows_out = Vec::new();
    for message in [PLAIN_MESSAGE, TOOL_MESSAGE] {
        let kind = if message == TOOL_MESSAGE {
            "`list_artifacts`, then the final text"
        } else {
            "final text"
        };
        // Warm: the history's counts are cached by the first run.
        timed_run(&agent, ctx, &history, message, &model).await?;
        let mut warm = Vec::with_capacity(runs);
        for _ in 0..runs {
            warm.push(timed_run(&agent, ctx, &history, message, &model).await?);
        }
        // Cold: a freshly resolved agent (a new TokenCounter) every run, resolved untimed.
        let mut cold = Vec::with_capacity(runs);
        for _ in 0..runs {
            let fresh = Agent::resolve(&profile, &config, &sample.registry)
                .map_err(|e| anyhow::anyhow!("resolving the agent: {e}"))?;
            cold.push(timed_run(&fresh, ctx, &history, message, &model).await?);
        }
        rows_out.push(loop_row(
            &format!("`Agent::run`, {kind}, token counts cached"),
            &warm,
            false,
            String::new(),
        ));
        rows_out.push(loop_row(
            &format!("baseline: `Agent::run`, {kind}, a fresh `TokenCounter` each run"),
            &cold,
            true,
            if message == TOOL_MESSAGE {
                "tool time taken out; turn 2 reuses turn 1's counts".into()
            } else {
                String::new()
            },
        ));
        if message == TOOL_MESSAGE {
            let span = Spread::of(&warm.iter().map(|t| ms(t.tool)).collect::<Vec<_>>());
            let events_ms = Spread::of(&warm.iter().map(|t| t.tool_ms as f64).collect::<Vec<_>>());
            rows_out.push(LoopRow {
                what: "its `list_artifacts` call alone (from the events)".into(),
                turns: 0,
                run: span,
                per_turn: None,
                baseline: false,
                note: format!(
                    "ToolCallStarted → ToolCallFinished; the events' `ms`: p50 {:.0}, p95 {:.0}",
                    events_ms.p50, events_ms.p95
                ),
            });
        }

        // The same through AgentHost::send: history from SQLite, the run appended.
        timed_send(&host, ctx, &history, message).await?;
        let mut sends = Vec::with_capacity(runs);
        for _ in 0..runs {
            sends.push(timed_send(&host, ctx, &history, message).await?);
        }
        rows_out.push(loop_row(
            &format!("`AgentHost::send`, {kind} (history loaded from SQLite, run appended)"),
            &sends,
            false,
            String::new(),
        ));
    }

    let fit_rows = fit_table(&agent, ctx, &history, runs)?;
    let ground_rows = ground_table(&history, runs);
    Ok((rows_out, fit_rows, ground_rows, info))
}

/// One timed grounding check.
struct GroundRow {
    what: &'static str,
    time: Spread,
    unmatched: usize,
}

/// [`dataref_agent::ground::unmatched`] of an answer against the whole history: one with
/// ten numbers (some of them the history's, some not), and one with none (no history read).
fn ground_table(history: &[Message], runs: usize) -> Vec<GroundRow> {
    let numeric = "Revenue was 1,234,567.89 (up 12.5%), 48,210 rows; Falcon Office Chair \
                   lost 211,258.49 (-65.2%), Cedar 185.6K; 3.4M in Q4, $12,345 on 2025-03-01, \
                   about 1.2M in total.";
    let plain = "The biggest loser is Falcon Office Chair; the chart and the file are ready.";
    [
        ("an answer with ten numbers and a date", numeric),
        ("an answer with no number (the history is not read)", plain),
    ]
    .into_iter()
    .map(|(what, answer)| {
        let unmatched = dataref_agent::ground::unmatched(answer, history, None).len();
        let mut times = Vec::with_capacity(runs);
        for _ in 0..runs {
            let t = Instant::now();
            let u = dataref_agent::ground::unmatched(answer, history, None);
            times.push(ms(t.elapsed()));
            drop(u);
        }
        GroundRow {
            what,
            time: Spread::of(&times),
            unmatched,
        }
    })
    .collect()
}

fn print_ground_table(
    out: &mut impl Write,
    history: &HistoryInfo,
    runs: usize,
    rows: &[GroundRow],
) -> Result<()> {
    writeln!(
        out,
        "\ngrounding: an answer's numbers matched against every tool result of the {}-message \
         history (`dataref_agent::ground::unmatched`, as the loop checks a final answer); {runs} runs each",
        history.messages
    )?;
    writeln!(out)?;
    writeln!(out, "| answer | p50 | p95 | unmatched |")?;
    writeln!(out, "|---|---:|---:|---:|")?;
    for r in rows {
        writeln!(
            out,
            "| {} | {} | {} | {} |",
            r.what,
            fmt_ms(r.time.p50),
            fmt_ms(r.time.p95),
            r.unmatched
        )?;
    }
    let worst = rows.iter().map(|r| r.time.p50).fold(0.0, f64::max);
    writeln!(
        out,
        "\ngoal: under {FIT_GOAL_MS} ms p50, like context assembly: {} ({})",
        if worst < FIT_GOAL_MS {
            "met"
        } else {
            "NOT met"
        },
        fmt_ms(worst)
    )?;
    Ok(())
}

fn fit_table(
    agent: &Agent,
    ctx: &RunContext,
    history: &[Message],
    runs: usize,
) -> Result<Vec<FitRow>> {
    let system = Message::system(
        agent
            .system_prompt(ctx)
            .map_err(|e| anyhow::anyhow!("the system prompt: {e}"))?,
    );
    let mut history = history.to_vec();
    history.push(Message::user(PLAIN_MESSAGE));
    let counter = &agent.counter;
    let total = counter.count_message(&system)
        + counter.count_tools(&agent.definitions)
        + counter.count_messages(&history).iter().sum::<usize>()
        + dataref_agent::tokens::REPLY_PRIMING;
    // Below the whole, so the oldest turns are trimmed.
    let budget = total * 3 / 5;
    let fit = |counter: &TokenCounter| {
        window::fit(&system, &agent.definitions, &history, counter, budget)
            .map_err(|e| anyhow::anyhow!("window::fit: {e}"))
    };
    let mut rows = Vec::new();
    // Warm.
    let fitted = fit(counter)?;
    let mut warm = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        let f = fit(counter)?;
        warm.push(ms(t.elapsed()));
        drop(f);
    }
    let kept = fitted.messages.len() - 1;
    rows.push(FitRow {
        what: "`window::fit`, token counts cached",
        time: Spread::of(&warm),
        baseline: false,
        kept,
        dropped: fitted.dropped,
        tokens: fitted.tokens,
        budget,
        total,
    });
    let mut cold = Vec::with_capacity(runs);
    let mut cold_fitted = None;
    for _ in 0..runs {
        let t = Instant::now();
        let fresh =
            TokenCounter::for_model(agent.model_name(), agent.config.model.encoding.as_deref())
                .map_err(|e| anyhow::anyhow!("the tokenizer: {e}"))?;
        let f = fit(&fresh)?;
        cold.push(ms(t.elapsed()));
        cold_fitted = Some(f);
    }
    let cold_fitted = cold_fitted.context("no cold run")?;
    rows.push(FitRow {
        what: "baseline: every message counted afresh (no cache), then `window::fit`",
        time: Spread::of(&cold),
        baseline: true,
        kept: cold_fitted.messages.len() - 1,
        dropped: cold_fitted.dropped,
        tokens: cold_fitted.tokens,
        budget,
        total,
    });
    Ok(rows)
}

fn fmt_ms(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.3} ms")
    } else {
        format!("{v:.1} ms")
    }
}

fn print_loop_table(
    out: &mut impl Write,
    history: &HistoryInfo,
    runs: usize,
    rows: &[LoopRow],
) -> Result<()> {
    writeln!(
        out,
        "\nthe agent loop per turn, model time excluded (an in-process model that answers at once), \
         over a {}-message session history ({} tool results, {} chars, {} tokens); {runs} runs each",
        history.messages,
        history.tool_results,
        thousands(history.bytes),
        thousands(history.tokens)
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "| step | turns | per run p50 | per run p95 | per turn p50 | per turn p95 | note |"
    )?;
    writeln!(out, "|---|---:|---:|---:|---:|---:|---|")?;
    for r in rows {
        let what = if r.baseline {
            format!("*{}*", r.what)
        } else {
            r.what.clone()
        };
        let (t50, t95) = match r.per_turn {
            Some(s) => (fmt_ms(s.p50), fmt_ms(s.p95)),
            None => ("".into(), "".into()),
        };
        let turns = if r.turns == 0 {
            String::new()
        } else {
            r.turns.to_string()
        };
        writeln!(
            out,
            "| {what} | {turns} | {} | {} | {t50} | {t95} | {} |",
            fmt_ms(r.run.p50),
            fmt_ms(r.run.p95),
            r.note
        )?;
    }
    let worst = rows
        .iter()
        .filter(|r| !r.baseline && r.what.starts_with("`Agent::run`"))
        .filter_map(|r| r.per_turn.map(|s| s.p50))
        .fold(0.0_f64, f64::max);
    writeln!(
        out,
        "\ngoal: the loop's own time under {LOOP_GOAL_MS} ms p50 per turn (`Agent::run`, counts cached): {} (worst p50 {})",
        if worst < LOOP_GOAL_MS {
            "met"
        } else {
            "NOT met"
        },
        fmt_ms(worst)
    )?;
    Ok(())
}

fn print_fit_table(
    out: &mut impl Write,
    history: &HistoryInfo,
    runs: usize,
    rows: &[FitRow],
) -> Result<()> {
    writeln!(
        out,
        "\ncontext assembly: `window::fit` of the system prompt, the tools and the {}-message history \
         (+ the new question) into a budget below their size; {runs} runs each",
        history.messages
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "| step | p50 | p95 | tokens in all | budget | messages kept | dropped | tokens sent |"
    )?;
    writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|")?;
    for r in rows {
        let what = if r.baseline {
            format!("*{}*", r.what)
        } else {
            r.what.to_owned()
        };
        writeln!(
            out,
            "| {what} | {} | {} | {} | {} | {} | {} | {} |",
            fmt_ms(r.time.p50),
            fmt_ms(r.time.p95),
            thousands(r.total),
            thousands(r.budget),
            r.kept,
            r.dropped,
            thousands(r.tokens)
        )?;
    }
    let ours = rows
        .iter()
        .find(|r| !r.baseline)
        .map_or(f64::NAN, |r| r.time.p50);
    writeln!(
        out,
        "\ngoal: `window::fit` under {FIT_GOAL_MS} ms p50: {} ({})",
        if ours < FIT_GOAL_MS { "met" } else { "NOT met" },
        fmt_ms(ours)
    )?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Table 3: the seed's question at each size.

struct SeedRun {
    rows: u64,
    /// Rows the fetch returned.
    fetched: u64,
    tokens_per_turn: Vec<u64>,
    tool_calls: Vec<String>,
    secs: f64,
    /// Tokens of the fetched rows as JSON (estimated from the first rows), once.
    naive_tokens: usize,
    naive_bytes: usize,
    naive_from: usize,
}

impl SeedRun {
    fn total(&self) -> u64 {
        self.tokens_per_turn.iter().sum()
    }
}

async fn seed_run(
    sample: &Sample,
    home: &Path,
    rows: u64,
    bpe: &dataref_agent::tokens::CoreBPE,
) -> Result<SeedRun> {
    let config = config_without_endpoint(home, rows);
    let profile = config
        .agents
        .get(dataref_config::agent::DEFAULT_AGENT)
        .context("the sample has no default agent")?;
    let agent = Agent::resolve(profile, &config, &sample.registry)
        .map_err(|e| anyhow::anyhow!("resolving the sample's agent: {e}"))?;
    let events = ToolTimes::default();
    let t = Instant::now();
    let out = agent
        .run(RunInput {
            ctx: sample.ctx.clone(),
            history: Vec::new(),
            message: QUESTION.to_owned(),
            model: Some(Arc::new(ScriptedAnalyst)),
            events: &events,
            approver: &NoOneToAsk,
            cancel: CancellationToken::new(),
            checkpoint: None,
        })
        .await;
    let secs = t.elapsed().as_secs_f64();
    let tools = events.take();
    if let Some(s) = &out.stopped {
        bail!("the run stopped: {}", s.sentence());
    }
    if let Some(bad) = tools
        .iter()
        .find(|t| t.outcome != "ok" && t.outcome != "spilled")
    {
        bail!("`{}` answered `{}`: {}", bad.tool, bad.outcome, bad.summary);
    }
    // The fetch's observation: its dataRef and rows.
    let fetched = out
        .observations()
        .map(|m| serde_json::from_str::<Value>(&m.content).unwrap_or(Value::Null))
        .find(|v| v.get("dataRef").is_some() && v.get("rows").is_some())
        .context("no observation with the fetch's dataRef")?;
    let data_ref = fetched
        .get("dataRef")
        .and_then(Value::as_str)
        .context("the fetch's dataRef")?;
    let data_ref = DataRef::parse(data_ref).map_err(|e| anyhow::anyhow!("{e}"))?;
    let (naive_bytes, naive_tokens, naive_from) =
        naive_cost(sample.store.as_ref(), &sample.ctx, &data_ref, bpe)?;
    Ok(SeedRun {
        rows,
        fetched: fetched.get("rows").and_then(Value::as_u64).unwrap_or(0),
        tokens_per_turn: out.requests.iter().map(|r| r.context_tokens).collect(),
        tool_calls: tools
            .iter()
            .map(|t| format!("{} {:.1} s", t.tool, t.span.as_secs_f64()))
            .collect(),
        secs,
        naive_tokens,
        naive_bytes,
        naive_from,
    })
}

/// Bytes and o200k tokens of every fetched row as JSON records, estimated from the first
/// [`NAIVE_SAMPLE_ROWS`] (and how many that was).
fn naive_cost(
    store: &dyn ArtifactStore,
    ctx: &RunContext,
    data_ref: &DataRef,
    bpe: &dataref_agent::tokens::CoreBPE,
) -> Result<(usize, usize, usize)> {
    let table = store.open_table(&ctx.principal, data_ref)?;
    let total = table.meta.rows as usize;
    let (text, sampled) = dataref_store::records_json(&table.batches, NAIVE_SAMPLE_ROWS);
    let n = sampled.max(1);
    let tokens = bpe.encode_with_special_tokens(&text).len();
    Ok((text.len() * total / n, tokens * total / n, sampled))
}

fn print_token_table(out: &mut impl Write, sizes: &[SeedRun]) -> Result<()> {
    writeln!(
        out,
        "\nwhat the model receives: the seed's question through the loop, answered by the scripted analyst \
         (`dataref_agent::scripted::QUESTION`); tokens sent per turn as the context manager counts them"
    )?;
    writeln!(out, "question: {QUESTION}")?;
    writeln!(out)?;
    writeln!(
        out,
        "| rows | rows fetched | turns | tokens sent per turn | total | Δ total vs {} rows | *baseline: the fetched rows as JSON, once* | run time | tool calls |",
        sizes.first().map_or(0, |s| s.rows)
    )?;
    writeln!(out, "|---:|---:|---:|---|---:|---:|---:|---:|---|")?;
    let first = sizes.first().map_or(0, SeedRun::total) as i64;
    for s in sizes {
        writeln!(
            out,
            "| {} | {} | {} | {} | {} | {:+} | ≈{} tokens (≈{} B; from the first {} rows) | {:.1} s | {} |",
            s.rows,
            s.fetched,
            s.tokens_per_turn.len(),
            s.tokens_per_turn
                .iter()
                .map(|t| thousands(*t as usize))
                .collect::<Vec<_>>()
                .join(" · "),
            thousands(s.total() as usize),
            s.total() as i64 - first,
            thousands(s.naive_tokens),
            thousands(s.naive_bytes),
            s.naive_from,
            s.secs,
            s.tool_calls.join(", ")
        )?;
    }
    let totals: Vec<u64> = sizes.iter().map(SeedRun::total).collect();
    let (min, max) = (
        totals.iter().copied().min().unwrap_or(0),
        totals.iter().copied().max().unwrap_or(0),
    );
    let spread = max - min;
    let allowed = (min as f64 * SAME_TOTAL_SHARE).ceil() as u64;
    writeln!(
        out,
        "\ngoal: the same total at every size (only the row counts in the observations depend on it): {} \
         (spread {spread} tokens over {} sizes, allowed {allowed} = {:.0}% of {min})",
        if spread <= allowed {
            "holds"
        } else {
            "does NOT hold"
        },
        sizes.len(),
        SAME_TOTAL_SHARE * 100.0
    )?;
    writeln!(
        out,
        "the baseline is a lower bound: a loop that returned the rows would send them again on every later turn"
    )?;
    Ok(())
}

/// `12345` → `12,345`.
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Where the loop table's sessions live (a directory of this process under the data dir,
/// removed after).
fn sessions_dir(home: &Path) -> PathBuf {
    home.join(format!("bench-agent-{}", std::process::id()))
}
