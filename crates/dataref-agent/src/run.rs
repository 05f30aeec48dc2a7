//! The ReAct loop: the model thinks and calls tools, every call goes through
//! [`execute_tool_call`], and the observations go back, until a final answer or a limit —
//! which the final message then says.
//!
//! Per turn: the history is repaired and fitted into the budget; the model answers
//! (streamed as [`AgentEvent::TextDelta`]); each call is expanded ([`expand_call`]: for
//! `call_tool`, the target with the arguments from its file), checked against the profile's
//! approval policy on what will really run, asked for when the policy says `ask`, and run:
//! read-only calls of a turn in parallel, mutating ones one at a time, results in call
//! order. A call repeated with identical arguments runs once more with a warning, and is
//! refused after that. The history keeps the calls as the model wrote them.

use dataref_protocol::truncate_chars;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use dataref_config::Approval;
use dataref_tool::{
    CallArguments, CallOutcome, OutcomeKind, RunContext, ToolCall, execute_tool_call, expand_call,
};
use futures_util::future::join_all;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::approval::{ApprovalRequest, Approver, Asked, Decision};
use crate::budget::{BudgetUse, RunMeter};
use crate::event::{AgentEvent, EventSink};
use crate::ground::{self, Grounding};
use crate::llm::{ChatModel, ChatRequest, LlmError, TextSink};
use crate::message::{AssistantToolCall, Message, Role, Shown, StepOutcome, Usage};
use crate::profile::Agent;
use crate::window::{self, WindowError};

/// Why a run ended before the model gave its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stopped {
    MaxTurns(u32),
    MaxToolCalls(u32),
    WallTime(Duration),
    Cancelled,
    /// The model could not be reached or answered something unreadable.
    Model(String),
    /// The context budget cannot hold even the system prompt, the tools and the message.
    Context(String),
    /// The next model request would take a budget of `[budgets]` over its cap (what was
    /// used plus the request's prompt and largest answer): no request until it resets.
    Budget(BudgetUse),
}

impl Stopped {
    /// `max_turns`, `max_tool_calls`, …: as events and the API name it.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::MaxTurns(_) => "max_turns",
            Self::MaxToolCalls(_) => "max_tool_calls",
            Self::WallTime(_) => "wall_time",
            Self::Cancelled => "cancelled",
            Self::Model(_) => "model_error",
            Self::Context(_) => "context_budget",
            Self::Budget(_) => "budget",
        }
    }

    /// The sentence the final message carries.
    pub fn sentence(&self) -> String {
        match self {
            Self::MaxTurns(n) => format!(
                "I stopped before finishing: this run reached its limit of {n} model turns \
                 (max_turns). Ask me to continue, or raise the limit."
            ),
            Self::MaxToolCalls(n) => format!(
                "I stopped before finishing: this run reached its limit of {n} tool calls \
                 (max_tool_calls). Ask me to continue, or raise the limit."
            ),
            Self::WallTime(d) => format!(
                "I stopped before finishing: this run reached its time limit of {}s \
                 (wall_time). Ask me to continue, or raise the limit.",
                d.as_secs()
            ),
            Self::Cancelled => "The run was cancelled.".to_owned(),
            Self::Model(m) => format!("I could not finish: {m}"),
            Self::Context(m) => format!("I stopped: {m}"),
            Self::Budget(u) => format!(
                "I stopped before finishing: the next model request would take the budget \
                 `{}` over its cap ({} this UTC {}); it resets at {}. Ask the platform team \
                 to raise it, or continue after it resets.",
                u.budget,
                u.over_by(),
                u.window.as_str(),
                u.resets
            ),
        }
    }
}

/// One run's inputs besides the agent.
pub struct RunInput<'a> {
    /// The caller's context: principal, workspace, store, limits, clock.
    pub ctx: RunContext,
    /// The conversation so far (no system prompt).
    pub history: Vec<Message>,
    /// The person's new message.
    pub message: String,
    /// The model to use when the profile names none (the demo's scripted model).
    pub model: Option<std::sync::Arc<dyn ChatModel>>,
    pub events: &'a dyn EventSink,
    pub approver: &'a dyn Approver,
    /// Cancels the turn and the tool running in it.
    pub cancel: CancellationToken,
    /// Where the run's messages are kept as it goes (the person's message first, then each
    /// finished round of tool calls), so a process killed mid-run keeps them; `None` keeps
    /// nothing before the end.
    pub checkpoint: Option<&'a dyn Checkpoint>,
}

/// Keeps a run's messages as the run goes ([`RunInput::checkpoint`]).
#[async_trait::async_trait]
pub trait Checkpoint: Send + Sync {
    /// Keeps `messages`, which follow those of the calls before (the first call of a run
    /// carries the person's message and starts the run). An error is logged by the run,
    /// which then keeps nothing more before its end: [`RunOutcome::saved`] says how many
    /// of its messages were kept.
    async fn save(&self, messages: &[Message]) -> Result<(), String>;

    /// The session the run's messages are kept in, for the usage ledger's rows.
    fn session(&self) -> Option<&str> {
        None
    }
}

/// One model request of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestStats {
    pub turn: u32,
    /// What the provider counted (0 when it sent no usage).
    pub usage: Usage,
    /// What our tokenizer counted for the request (messages and tools).
    pub context_tokens: u64,
    /// History messages left out to fit the budget.
    pub dropped: usize,
}

/// What a run did.
#[derive(Debug, Clone, PartialEq)]
pub struct RunOutcome {
    /// The messages this run added, the person's first (append them to the session).
    pub messages: Vec<Message>,
    /// The final text the person reads (the limit's sentence included when one ended it).
    pub answer: String,
    pub stopped: Option<Stopped>,
    pub requests: Vec<RequestStats>,
    /// Sum of the provider's usage.
    pub usage: Usage,
    /// Tool calls run (or refused) in this run.
    pub tool_calls: u32,
    /// How many of `messages` (from the first) the run's [`Checkpoint`] kept already.
    pub saved: usize,
    /// How the answer's numbers held up against what the tools produced; `None` when the
    /// run ended without an answer of the model's (a limit, an error).
    pub grounding: Option<Grounding>,
}

impl RunOutcome {
    /// Every tool-call observation of the run, by call id (the tool messages).
    pub fn observations(&self) -> impl Iterator<Item = &Message> {
        self.messages.iter().filter(|m| m.role == Role::Tool)
    }
}

/// A run's [`Checkpoint`] and how much of the run it has kept.
struct Kept<'a> {
    checkpoint: Option<&'a dyn Checkpoint>,
    first_new: usize,
    /// The run's messages kept so far; nothing more once a save failed.
    saved: usize,
}

impl Kept<'_> {
    /// Keeps the run's messages in `history` not kept yet.
    async fn save(&mut self, history: &[Message]) {
        let Some(checkpoint) = self.checkpoint else {
            return;
        };
        let new = &history[self.first_new + self.saved..];
        if new.is_empty() {
            return;
        }
        match checkpoint.save(new).await {
            Ok(()) => self.saved += new.len(),
            Err(e) => {
                tracing::warn!(error = %e, "a run's messages could not be kept as it went; they are kept at its end");
                self.checkpoint = None;
            }
        }
    }
}

/// How often an identical call runs: the second time with a warning, never a third.
const REPEAT_WARN: u32 = 2;

struct Streamed<'a> {
    events: &'a dyn EventSink,
    /// The text streamed so far: a request cut short is counted from it.
    text: std::sync::Mutex<String>,
}

impl TextSink for Streamed<'_> {
    fn text(&self, delta: &str) {
        self.text
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push_str(delta);
        self.events.event(AgentEvent::TextDelta {
            text: delta.to_owned(),
        });
    }
}

/// A call after its checks: either ready to run (expanded) or already answered.
enum Prepared {
    Run {
        call: ToolCall,
        shown: String,
        warn: Option<String>,
        mutating: bool,
    },
    Answered {
        tool: String,
        outcome: StepOutcome,
        text: String,
    },
}

impl Agent {
    /// Runs one message of the person to the agent's answer (or a limit).
    pub async fn run(&self, input: RunInput<'_>) -> RunOutcome {
        // One trace per run (a child of the request's span when a server runs it): the
        // model calls and the tool calls are its children. The person's message is recorded
        // only when `[traces] include_text` says so (then exported, and in the log too).
        let span = tracing::info_span!(
            "agent_run",
            otel.name = %format_args!("invoke_agent {}", self.name),
            gen_ai.operation.name = "invoke_agent",
            gen_ai.agent.name = %self.name,
            gen_ai.request.model = %self.model_name(),
            principal = %input.ctx.principal,
            gen_ai.prompt = tracing::field::Empty,
            gen_ai.usage.input_tokens = tracing::field::Empty,
            gen_ai.usage.output_tokens = tracing::field::Empty,
            tool_calls = tracing::field::Empty,
            stopped = tracing::field::Empty,
        );
        if dataref_ops::trace::include_text() {
            span.record("gen_ai.prompt", &*input.message);
        }
        let out = self.run_in_span(input).instrument(span.clone()).await;
        span.record("gen_ai.usage.input_tokens", out.usage.prompt_tokens);
        span.record("gen_ai.usage.output_tokens", out.usage.completion_tokens);
        span.record("tool_calls", out.tool_calls);
        if let Some(stopped) = &out.stopped {
            span.record("stopped", stopped.as_str());
        }
        out
    }

    async fn run_in_span(&self, input: RunInput<'_>) -> RunOutcome {
        let RunInput {
            ctx,
            mut history,
            message,
            model,
            events,
            approver,
            cancel,
            checkpoint,
        } = input;
        let limits = &self.config.limits;
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + limits.wall_time;
        let first_new = {
            window::repair(&mut history);
            history.push(Message::user(message));
            history.len() - 1
        };
        let mut out = RunOutcome {
            messages: Vec::new(),
            answer: String::new(),
            stopped: None,
            requests: Vec::new(),
            usage: Usage::default(),
            tool_calls: 0,
            saved: 0,
            grounding: None,
        };
        let Some(model) = self.model.clone().or(model) else {
            return finish(
                out,
                history,
                first_new,
                events,
                Some(Stopped::Model(format!(
                    "agent `{}` has no model endpoint; set DATAREF_LLM_URL and DATAREF_LLM_MODEL",
                    self.name
                ))),
                String::new(),
            );
        };
        let system = match self.system_prompt(&ctx) {
            Ok(s) => Message::system(s),
            Err(e) => {
                return finish(
                    out,
                    history,
                    first_new,
                    events,
                    Some(Stopped::Context(e)),
                    String::new(),
                );
            }
        };
        // The person's message is kept before the first model request: a run killed from
        // here on keeps its question.
        let mut keep = Kept {
            checkpoint,
            first_new,
            saved: 0,
        };
        let meter = self.metering.as_ref().map(|metering| RunMeter {
            metering,
            agent: &self.name,
            model: self.model_name(),
            principal: ctx.principal.as_str(),
            session: checkpoint.and_then(|c| c.session()).unwrap_or(""),
            prices: self.config.prices.as_ref(),
            state: Default::default(),
        });
        keep.save(&history).await;
        let budget = limits.context_tokens.saturating_sub(limits.answer_tokens);
        let mut seen: HashMap<(String, String), u32> = HashMap::new();
        let mut last_text = String::new();
        let mut asked_again = false;
        let mut turn: u32 = 0;
        let stop = loop {
            if cancel.is_cancelled() {
                break Some(Stopped::Cancelled);
            }
            if started.elapsed() >= limits.wall_time {
                break Some(Stopped::WallTime(limits.wall_time));
            }
            if turn >= limits.max_turns {
                break Some(Stopped::MaxTurns(limits.max_turns));
            }
            let fitted =
                match window::fit(&system, &self.definitions, &history, &self.counter, budget) {
                    Ok(f) => f,
                    Err(WindowError::TooSmall { needed, budget }) => {
                        break Some(Stopped::Context(format!(
                            "the system prompt, the tool definitions and the latest message need \
                         {needed} tokens, over this agent's context budget of {budget} \
                         (context_tokens minus answer_tokens)"
                        )));
                    }
                };
            // Budgets: checked with what this request may take at most (its prompt and its
            // largest answer), so a run stops before a request that would go over.
            let prompt_tokens = fitted.tokens as u64;
            if let Some(m) = &meter {
                let next = Usage {
                    prompt_tokens,
                    completion_tokens: self
                        .config
                        .model
                        .max_tokens
                        .map_or(limits.answer_tokens as u64, u64::from),
                };
                if let Some(over) = m.check(ctx.clock.now(), next, events).await {
                    break Some(Stopped::Budget(over));
                }
            }
            turn += 1;
            let request = ChatRequest {
                model: self.model_name().to_owned(),
                messages: fitted.messages,
                tools: self.definitions.clone(),
                temperature: self.config.model.temperature,
                max_tokens: self.config.model.max_tokens,
            };
            let sink = Streamed {
                events,
                text: std::sync::Mutex::default(),
            };
            // A request the provider did not count: its prompt and what streamed so far.
            let estimate = |sink: &Streamed<'_>| Usage {
                prompt_tokens,
                completion_tokens: self.counter.count_text(
                    &sink
                        .text
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner),
                ) as u64,
            };
            let asked = Instant::now();
            // The GenAI semantic conventions' client span for one model request.
            let call_span = tracing::info_span!(
                "model_call",
                otel.name = %format_args!("chat {}", request.model),
                otel.kind = "client",
                gen_ai.operation.name = "chat",
                gen_ai.system = "openai",
                gen_ai.provider.name = "openai",
                gen_ai.request.model = %request.model,
                gen_ai.agent.name = %self.name,
                turn,
                gen_ai.usage.input_tokens = tracing::field::Empty,
                gen_ai.usage.output_tokens = tracing::field::Empty,
                gen_ai.response.finish_reasons = tracing::field::Empty,
                otel.status_code = tracing::field::Empty,
            );
            let answer = tokio::select! {
                r = model.complete(&request, &sink, &cancel).instrument(call_span.clone()) => r,
                () = tokio::time::sleep_until(deadline) => {
                    let waited = asked.elapsed().as_secs_f64();
                    dataref_ops::metrics::model_request_timed_out(
                        &self.name, &request.model, waited,
                    );
                    call_span.record("otel.status_code", "ERROR");
                    if let Some(m) = &meter {
                        m.record(ctx.clock.now(), estimate(&sink), true, events).await;
                    }
                    break Some(Stopped::WallTime(limits.wall_time));
                }
            };
            match &answer {
                Ok(r) => {
                    let usage = r.usage.unwrap_or_default();
                    call_span.record("gen_ai.usage.input_tokens", usage.prompt_tokens);
                    call_span.record("gen_ai.usage.output_tokens", usage.completion_tokens);
                    if let Some(reason) = &r.finish_reason {
                        call_span.record("gen_ai.response.finish_reasons", reason.as_str());
                    }
                }
                Err(_) => {
                    call_span.record("otel.status_code", "ERROR");
                }
            }
            drop(call_span);
            // A cancelled request is the caller's doing, not the model's: not counted.
            if !matches!(answer, Err(LlmError::Cancelled)) {
                let usage = answer
                    .as_ref()
                    .ok()
                    .and_then(|r| r.usage)
                    .unwrap_or_default();
                dataref_ops::metrics::model_request(
                    &self.name,
                    &request.model,
                    usage.prompt_tokens,
                    usage.completion_tokens,
                    asked.elapsed().as_secs_f64(),
                    answer.is_ok(),
                );
            }
            // A request cut short or failed is kept with an estimate: repeating a cancel just
            // before the end must not dodge the budgets. A provider's refusal (4xx but a
            // timeout) processed nothing and is not counted.
            if let (Some(m), Err(e)) = (&meter, &answer)
                && !matches!(e, LlmError::Status { status: 400..=407 | 409..=499, .. })
            {
                m.record(ctx.clock.now(), estimate(&sink), true, events)
                    .await;
            }
            let response = match answer {
                Ok(r) => r,
                Err(LlmError::Cancelled) => break Some(Stopped::Cancelled),
                Err(e) => {
                    let hint = e.hint().map(str::to_owned);
                    events.event(AgentEvent::Error {
                        message: e.to_string(),
                        hint: hint.clone(),
                    });
                    let text = match hint {
                        Some(h) => format!("{e} ({h})"),
                        None => e.to_string(),
                    };
                    break Some(Stopped::Model(text));
                }
            };
            let usage = response.usage.unwrap_or_default();
            if let Some(m) = &meter {
                match response.usage {
                    Some(u) => m.record(ctx.clock.now(), u, false, events).await,
                    // No usage from the provider: the prompt and the answer as counted here.
                    None => {
                        let mut answered = response.message.content.clone();
                        for c in &response.message.tool_calls {
                            answered.push_str(&c.name);
                            answered.push_str(&c.arguments);
                        }
                        let counted = Usage {
                            prompt_tokens,
                            completion_tokens: self.counter.count_text(&answered) as u64,
                        };
                        m.record(ctx.clock.now(), counted, true, events).await;
                    }
                }
            }
            out.usage.add(usage);
            let stats = RequestStats {
                turn,
                usage,
                context_tokens: fitted.tokens as u64,
                dropped: fitted.dropped,
            };
            out.requests.push(stats);
            events.event(AgentEvent::Usage {
                turn,
                prompt_tokens: usage.prompt_tokens,
                completion_tokens: usage.completion_tokens,
                context_tokens: stats.context_tokens,
            });
            let mut reply = response.message;
            reply.role = Role::Assistant;
            reply.tool_call_id = None;
            if reply.tool_calls.is_empty() {
                // The answer's numbers against what the session's tools produced: what
                // matches nothing goes back to the model once, then is marked.
                let unmatched = ground::unmatched(&reply.content, &history, Some(&system.content));
                last_text = reply.content.clone();
                let again = !unmatched.is_empty() && !asked_again && turn < limits.max_turns;
                let grounding = Grounding {
                    unmatched,
                    asked_again: again,
                };
                out.grounding = Some(Grounding {
                    asked_again: false,
                    ..grounding.clone()
                });
                reply.grounding = Some(grounding.clone());
                history.push(reply);
                if !again {
                    break None;
                }
                asked_again = true;
                events.event(AgentEvent::Checked {
                    unmatched: grounding.unmatched.clone(),
                });
                history.push(Message::system(ground::note(&grounding.unmatched)));
                keep.save(&history).await;
                continue;
            }
            if !reply.content.trim().is_empty() {
                last_text = reply.content.clone();
            }
            unique_ids(&mut reply.tool_calls, &history, turn);
            let calls = reply.tool_calls.clone();
            history.push(reply);
            let limit_hit = self
                .run_calls(
                    &calls,
                    &ctx,
                    &mut history,
                    &mut seen,
                    &mut out.tool_calls,
                    events,
                    approver,
                    &cancel,
                    deadline,
                )
                .await;
            // A whole round (the calls and every result) is kept; a round cut short is
            // repaired at the end and kept then.
            if window::is_well_formed(&history[first_new..]) {
                keep.save(&history).await;
            }
            if cancel.is_cancelled() {
                break Some(Stopped::Cancelled);
            }
            if let Some(s) = limit_hit {
                break Some(s);
            }
        };
        out.saved = keep.saved;
        finish(out, history, first_new, events, stop, last_text)
    }

    /// The system prompt for this run: the template with the built-in variables (the
    /// date and time from the context's clock, the principal) and the profile's.
    pub fn system_prompt(&self, ctx: &RunContext) -> Result<String, String> {
        let now = ctx.clock.now();
        let mut vars = self.vars.clone();
        let rfc = now.to_string();
        vars.insert(
            "today".into(),
            Value::String(rfc.chars().take(10).collect()),
        );
        vars.insert("now".into(), Value::String(rfc));
        vars.insert("principal".into(), Value::String(ctx.principal.to_string()));
        self.template.render(&vars).map_err(|e| e.to_string())
    }

    /// Runs one turn's calls; returns the limit that stopped the run, if one did.
    #[expect(
        clippy::too_many_arguments,
        reason = "the loop's state, passed down once"
    )]
    async fn run_calls(
        &self,
        calls: &[AssistantToolCall],
        ctx: &RunContext,
        history: &mut Vec<Message>,
        seen: &mut HashMap<(String, String), u32>,
        count: &mut u32,
        events: &dyn EventSink,
        approver: &dyn Approver,
        cancel: &CancellationToken,
        deadline: tokio::time::Instant,
    ) -> Option<Stopped> {
        let limits = &self.config.limits;
        let call_ctx = ctx.for_call(ctx.progress.clone(), cancel.child_token());
        // The results of one turn go back together and cannot be trimmed apart: each gets
        // its share of half the budget (at least 1,000 tokens), within `result_tokens`.
        let budget = limits.context_tokens.saturating_sub(limits.answer_tokens);
        let share = (budget / (2 * calls.len().max(1))).max(1_000);
        let cap = limits.result_tokens.min(share);
        let mut stopped = None;
        let mut prepared = Vec::with_capacity(calls.len());
        for c in calls {
            if *count >= limits.max_tool_calls {
                stopped = Some(Stopped::MaxToolCalls(limits.max_tool_calls));
                prepared.push((
                    c,
                    Prepared::Answered {
                        tool: c.name.clone(),
                        outcome: StepOutcome::Refused,
                        text: format!(
                            "error: not run: this run reached its limit of {} tool calls\nhint: \
                             the run stops here; the person can ask to continue",
                            limits.max_tool_calls
                        ),
                    },
                ));
                continue;
            }
            *count += 1;
            prepared.push((
                c,
                self.prepare(c, &call_ctx, seen, events, approver, deadline)
                    .await,
            ));
        }
        // Consecutive read-only calls run together; a mutating call runs alone.
        let mut results: Vec<Option<Message>> = vec![None; prepared.len()];
        let mut i = 0;
        while i < prepared.len() {
            let mut j = i;
            let alone = matches!(&prepared[i].1, Prepared::Run { mutating: true, .. });
            if alone {
                j = i + 1;
            } else {
                while j < prepared.len()
                    && !matches!(&prepared[j].1, Prepared::Run { mutating: true, .. })
                {
                    j += 1;
                }
            }
            let batch = (i..j).map(|k| {
                let (c, p) = &prepared[k];
                self.finish_call(c, p, &call_ctx, events, deadline, cap)
            });
            for (k, m) in (i..j).zip(join_all(batch).await) {
                results[k] = Some(m);
            }
            i = j;
            if cancel.is_cancelled() {
                break;
            }
        }
        for m in results.into_iter().flatten() {
            history.push(m);
        }
        stopped
    }

    /// The checks before a call runs: repetition, expansion, policy, approval.
    async fn prepare(
        &self,
        c: &AssistantToolCall,
        ctx: &RunContext,
        seen: &mut HashMap<(String, String), u32>,
        events: &dyn EventSink,
        approver: &dyn Approver,
        deadline: tokio::time::Instant,
    ) -> Prepared {
        let call = ToolCall::from_json_text(c.name.clone(), c.arguments.clone()).with_id(&c.id);
        let expanded = match expand_call(&self.registry, call, ctx).await {
            Ok(e) => e,
            Err(o) => {
                return Prepared::Answered {
                    tool: c.name.clone(),
                    outcome: o.kind.into(),
                    text: o.text,
                };
            }
        };
        let args = match &expanded.arguments {
            dataref_tool::CallArguments::Json(v) => v.clone(),
            dataref_tool::CallArguments::Text(t) => Value::String(t.clone()),
        };
        let key = (expanded.name.clone(), canonical(&args));
        let n = seen.entry(key).or_insert(0);
        *n += 1;
        let warn = match *n {
            1 => None,
            REPEAT_WARN => Some(
                "note: this call repeats an earlier call of this run with identical \
                 arguments; its result will not change. Use the result you have; an \
                 identical call again will be refused."
                    .to_owned(),
            ),
            _ => {
                return Prepared::Answered {
                    tool: expanded.name.clone(),
                    outcome: StepOutcome::Refused,
                    text: format!(
                        "error: not run: `{}` was already called {} times in this run with \
                         identical arguments\nhint: use the earlier result, or change the \
                         arguments",
                        expanded.name,
                        *n - 1
                    ),
                };
            }
        };
        let via = (expanded.name != c.name).then(|| c.name.clone());
        // Through `call_tool`, the stricter of its own policy and the target's.
        let policy = match &via {
            Some(v) => strictest(self.approval(v), self.approval(&expanded.name)),
            None => self.approval(&expanded.name),
        };
        match policy {
            Approval::Allow => {}
            Approval::Deny => {
                return Prepared::Answered {
                    tool: expanded.name.clone(),
                    outcome: StepOutcome::Denied,
                    text: format!(
                        "error: not run: agent `{}` may not call `{}` (its approval policy \
                         denies it)\nhint: answer without it, or tell the person what you \
                         would need",
                        self.name, expanded.name
                    ),
                };
            }
            Approval::Ask => {
                let request = ApprovalRequest {
                    call_id: c.id.clone(),
                    tool: expanded.name.clone(),
                    arguments: args.clone(),
                    via,
                };
                dataref_ops::audit::approval_asked(
                    ctx.principal.as_str(),
                    &request.call_id,
                    &request.tool,
                    &request.arguments,
                );
                // The person is told only once the question can be answered: an answer
                // given the moment they see it must find it.
                let asked = async {
                    match approver.ask(&request).await {
                        Asked::Waiting(answer) => {
                            events.event(AgentEvent::ApprovalNeeded {
                                call_id: request.call_id.clone(),
                                tool: request.tool.clone(),
                                arguments: request.arguments.clone(),
                            });
                            answer.await
                        }
                        Asked::Decided(decision) => decision,
                    }
                };
                // The wait for a person is bounded by the run's own limits.
                let decision = tokio::select! {
                    d = asked => d,
                    () = ctx.cancel.cancelled() => Decision::Deny(Some("the run was cancelled".into())),
                    () = tokio::time::sleep_until(deadline) => {
                        Decision::Deny(Some("the run reached its time limit while waiting".into()))
                    }
                };
                dataref_ops::audit::approval_answered(
                    ctx.principal.as_str(),
                    &request.call_id,
                    &request.tool,
                    match &decision {
                        Decision::Approve => Ok(()),
                        Decision::Deny(reason) => Err(reason.as_deref()),
                    },
                );
                if let Decision::Deny(reason) = decision {
                    let why = reason.map(|r| format!(": {r}")).unwrap_or_default();
                    return Prepared::Answered {
                        tool: expanded.name.clone(),
                        outcome: StepOutcome::Denied,
                        text: format!(
                            "error: not run: the person did not approve `{}`{why}\nhint: ask \
                             the person, or go on without it",
                            expanded.name
                        ),
                    };
                }
            }
        }
        let mutating = self
            .registry
            .get(&expanded.name)
            .is_some_and(|t| t.is_mutating());
        Prepared::Run {
            shown: summary_of_args(&expanded.name, &args),
            call: expanded,
            warn,
            mutating,
        }
    }

    /// Runs a prepared call (or reports the answer it already has) and makes its
    /// observation, capped to `cap` tokens.
    async fn finish_call(
        &self,
        c: &AssistantToolCall,
        p: &Prepared,
        ctx: &RunContext,
        events: &dyn EventSink,
        deadline: tokio::time::Instant,
        cap: usize,
    ) -> Message {
        let t0 = Instant::now();
        match p {
            Prepared::Answered {
                tool,
                outcome,
                text,
            } => {
                let shown = Shown {
                    summary: first_line(text),
                    ..Shown::default()
                };
                events.event(AgentEvent::finished(
                    &c.id,
                    tool,
                    outcome.as_str(),
                    shown.clone(),
                ));
                Message::tool(&c.id, text.clone(), *outcome).with_shown(shown)
            }
            Prepared::Run {
                call, shown, warn, ..
            } => {
                events.event(AgentEvent::ToolCallStarted {
                    call_id: c.id.clone(),
                    tool: call.name.clone(),
                    summary: shown.clone(),
                    arguments: match &call.arguments {
                        CallArguments::Json(v) => v.clone(),
                        CallArguments::Text(t) => Value::String(t.clone()),
                    },
                });
                let run = execute_tool_call(&self.registry, call.clone(), ctx);
                let outcome = tokio::select! {
                    o = run => o,
                    () = tokio::time::sleep_until(deadline) => {
                        ctx.cancel.cancel();
                        CallOutcome {
                            call_id: c.id.clone(),
                            kind: OutcomeKind::Cancelled,
                            structured: None,
                            text: format!("error: `{}` was stopped: the run reached its time limit", call.name),
                            attachments: Vec::new(),
                        }
                    }
                };
                let whole_at = whole_at(&outcome);
                let mut text = window::cap_result(
                    &outcome.model_text(),
                    &self.counter,
                    cap,
                    whole_at.as_deref(),
                );
                if let Some(w) = warn {
                    text = format!("{text}\n{w}");
                }
                let shown = Shown {
                    summary: summary_of_outcome(&outcome),
                    ms: t0.elapsed().as_millis() as u64,
                    data_ref: result_field(&outcome, "dataRef"),
                    path: result_field(&outcome, "path"),
                };
                events.event(AgentEvent::finished(
                    &c.id,
                    &call.name,
                    outcome.kind.as_str(),
                    shown.clone(),
                ));
                Message::tool(&c.id, text, outcome.kind.into()).with_shown(shown)
            }
        }
    }
}

/// A string field of a successful call's structured result.
fn result_field(outcome: &CallOutcome, key: &str) -> Option<String> {
    if outcome.is_error() {
        return None;
    }
    let v = outcome.structured.as_ref()?.get(key)?.as_str()?;
    Some(v.to_owned())
}

/// Ends a run: the final message (the limit's sentence when one stopped it), the event,
/// and the messages this run added.
fn finish(
    mut out: RunOutcome,
    mut history: Vec<Message>,
    first_new: usize,
    events: &dyn EventSink,
    stopped: Option<Stopped>,
    last_text: String,
) -> RunOutcome {
    let answer = match &stopped {
        None => last_text,
        Some(s) => {
            let sentence = s.sentence();
            let answer = if last_text.trim().is_empty() {
                sentence
            } else {
                format!("{last_text}\n\n{sentence}")
            };
            // The history then ends with the answer the person read, so a resumed session
            // sees why the run stopped.
            history.push(Message::assistant(answer.clone()));
            answer
        }
    };
    events.event(AgentEvent::Final {
        text: answer.clone(),
        stopped: stopped.as_ref().map(|s| s.as_str().to_owned()),
        grounded: out.grounding.as_ref().map(Grounding::grounded),
        unmatched: out
            .grounding
            .as_ref()
            .map(|g| g.unmatched.clone())
            .unwrap_or_default(),
    });
    window::repair(&mut history);
    out.messages = history.split_off(first_new.min(history.len()));
    out.answer = answer;
    out.stopped = stopped;
    out
}

/// Deny over ask over allow.
fn strictest(a: Approval, b: Approval) -> Approval {
    let rank = |p: Approval| match p {
        Approval::Allow => 0,
        Approval::Ask => 1,
        Approval::Deny => 2,
    };
    if rank(a) >= rank(b) { a } else { b }
}

/// Gives every call of a reply an id no other call of the history has: some servers send
/// empty ids, or the same id for every parallel call, and a result must answer one call.
fn unique_ids(calls: &mut [AssistantToolCall], history: &[Message], turn: u32) {
    let mut taken: std::collections::HashSet<String> = history
        .iter()
        .flat_map(|m| m.tool_calls.iter().map(|c| c.id.clone()))
        .collect();
    for (i, c) in calls.iter_mut().enumerate() {
        if c.id.is_empty() || taken.contains(&c.id) {
            let mut n = 0;
            let mut id = format!("call_{turn}_{i}");
            while taken.contains(&id) {
                n += 1;
                id = format!("call_{turn}_{i}_{n}");
            }
            c.id = id;
        }
        taken.insert(c.id.clone());
    }
}

/// The spill file of a spilled or cut result, for the cap's note.
fn whole_at(o: &CallOutcome) -> Option<String> {
    let s = o.structured.as_ref()?;
    ["path", "wholeAt", "file"]
        .iter()
        .find_map(|k| s.get(*k).and_then(Value::as_str))
        .map(str::to_owned)
}

/// JSON with sorted keys, so `{"a":1,"b":2}` and `{"b":2,"a":1}` are one call.
fn canonical(v: &Value) -> String {
    fn sort(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                Value::Object(keys.into_iter().map(|k| (k.clone(), sort(&m[k]))).collect())
            }
            Value::Array(a) => Value::Array(a.iter().map(sort).collect()),
            other => other.clone(),
        }
    }
    sort(v).to_string()
}

fn first_line(text: &str) -> String {
    truncate_chars(text.lines().next().unwrap_or(""), 160)
}

/// `fetch_sales since=2025-01-01`: the tool and its arguments on one line.
fn summary_of_args(tool: &str, args: &Value) -> String {
    let mut parts = vec![tool.to_owned()];
    if let Value::Object(m) = args {
        for (k, v) in m {
            let v = match v {
                Value::String(s) => s.lines().next().unwrap_or("").to_owned(),
                other => other.to_string(),
            };
            parts.push(format!("{k}={}", truncate_chars(&v, 40)));
        }
    }
    truncate_chars(&parts.join(" "), 160)
}

/// What came back, on one line: a dataRef and its rows, a file, or the error.
fn summary_of_outcome(o: &CallOutcome) -> String {
    if o.is_error() {
        return first_line(&o.text);
    }
    let Some(s) = o.structured.as_ref() else {
        return first_line(&o.text);
    };
    let mut parts = Vec::new();
    if let Some(r) = s.get("dataRef").and_then(Value::as_str) {
        parts.push(r.to_owned());
    }
    if let Some(n) = s.get("rows").and_then(Value::as_u64) {
        parts.push(format!("{n} rows"));
    }
    if let Some(p) = s.get("path").and_then(Value::as_str) {
        parts.push(p.to_owned());
    }
    if let Some(outs) = s.get("outputs").and_then(Value::as_object) {
        parts.push(format!("{} outputs", outs.len()));
    }
    if parts.is_empty() {
        return first_line(&o.text);
    }
    if o.kind == OutcomeKind::Spilled {
        parts.insert(0, "spilled to".into());
    }
    truncate_chars(&parts.join(" · "), 160)
}
