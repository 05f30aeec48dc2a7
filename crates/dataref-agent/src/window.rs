//! The context manager: what of the conversation goes to the provider each turn.
//!
//! - [`repair`] makes a history well formed: every tool call has exactly one result, right
//!   after its assistant message (an interrupted run leaves calls without results; they get
//!   an explicit "interrupted" result), and no result stands without its call.
//! - [`fit`] fits the system prompt, the tool definitions and the history into a token
//!   budget. It trims whole *units* (a user message; an assistant message with all its tool
//!   results; a lone assistant text), so a call is never split from its result: first the
//!   oldest turns before the latest user message, then, when the current run alone is over
//!   budget, the oldest steps of the run itself — never the latest user message and never
//!   the newest unit.
//! - [`cap_result`] cuts one tool result to a number of tokens, keeping its head and its
//!   tail, with a note saying what was cut and where the whole is.

use std::collections::HashSet;

use crate::message::{Message, Role, StepOutcome, ToolDefinition};
use crate::tokens::{REPLY_PRIMING, TokenCounter};
use dataref_tool::OutcomeKind;

/// The result given to a tool call that has none (the run stopped before it finished).
pub const INTERRUPTED_RESULT: &str = "error: interrupted: this call did not finish (the run was stopped before its result); call it again if it is still needed";

/// What goes to the provider this turn.
#[derive(Debug, Clone, PartialEq)]
pub struct Fitted {
    /// The system prompt first, then the history kept, the latest user message last.
    pub messages: Vec<Message>,
    /// Messages of the history left out (oldest first).
    pub dropped: usize,
    /// The tokens of `messages` plus the tool definitions (and the reply's priming).
    pub tokens: usize,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum WindowError {
    #[error(
        "the system prompt, the tools and the latest message need {needed} tokens, over the budget of {budget}"
    )]
    TooSmall { needed: usize, budget: usize },
}

/// Makes `history` well formed for a provider: a tool call without a result gets an
/// explicit "interrupted" result ([`INTERRUPTED_RESULT`]) among the results of its
/// assistant message, which are put in call order right after it; a result whose call is not in the assistant message it follows (possibly after
/// other results) is dropped, and so is a second result for one call. System messages in
/// the history stay as they are.
pub fn repair(history: &mut Vec<Message>) {
    if is_well_formed(history) {
        return;
    }
    let old = std::mem::take(history);
    let mut out = Vec::with_capacity(old.len());
    let mut iter = old.into_iter().peekable();
    while let Some(message) = iter.next() {
        match message.role {
            // A result not taken by an assistant message before it: orphaned.
            Role::Tool => {}
            Role::Assistant if !message.tool_calls.is_empty() => {
                let mut results: Vec<Message> = Vec::new();
                while let Some(next) = iter.next_if(|m| m.role == Role::Tool) {
                    let wanted = next.tool_call_id.as_deref().is_some_and(|id| {
                        message.tool_calls.iter().any(|c| c.id == id)
                            && !results
                                .iter()
                                .any(|r| r.tool_call_id.as_deref() == Some(id))
                    });
                    if wanted {
                        results.push(next);
                    }
                }
                out.push(message);
                let message = &out[out.len() - 1];
                let mut ordered: Vec<Message> = Vec::with_capacity(message.tool_calls.len());
                for call in &message.tool_calls {
                    if ordered
                        .iter()
                        .any(|r| r.tool_call_id.as_deref() == Some(&call.id))
                    {
                        // The same id twice in one message: one result answers both.
                        continue;
                    }
                    match results
                        .iter()
                        .position(|r| r.tool_call_id.as_deref() == Some(&call.id))
                    {
                        Some(i) => ordered.push(results.swap_remove(i)),
                        None => ordered.push(Message::tool(
                            call.id.clone(),
                            INTERRUPTED_RESULT,
                            StepOutcome::Ran(OutcomeKind::Cancelled),
                        )),
                    }
                }
                out.extend(ordered);
            }
            _ => out.push(message),
        }
    }
    *history = out;
}

/// True when every result follows its own assistant message, in call order, once, and
/// every call has one.
pub(crate) fn is_well_formed(history: &[Message]) -> bool {
    let mut i = 0;
    while i < history.len() {
        let message = &history[i];
        match message.role {
            Role::Tool => return false,
            Role::Assistant if !message.tool_calls.is_empty() => {
                let mut seen: HashSet<&str> = HashSet::new();
                for call in &message.tool_calls {
                    if !seen.insert(call.id.as_str()) {
                        return false;
                    }
                    i += 1;
                    match history.get(i) {
                        Some(r)
                            if r.role == Role::Tool
                                && r.tool_call_id.as_deref() == Some(call.id.as_str()) => {}
                        _ => return false,
                    }
                }
                if history.get(i + 1).is_some_and(|m| m.role == Role::Tool) {
                    return false;
                }
            }
            _ => {}
        }
        i += 1;
    }
    true
}

/// One unit of the history: `start..end`, its tokens, whether it is a user message or a
/// result without its call.
#[derive(Debug, Clone, Copy)]
struct Unit {
    start: usize,
    end: usize,
    tokens: usize,
    role: Role,
}

fn units(history: &[Message], counts: &[usize]) -> Vec<Unit> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < history.len() {
        let start = i;
        let message = &history[i];
        i += 1;
        if message.role == Role::Assistant && !message.tool_calls.is_empty() {
            while history.get(i).is_some_and(|m| m.role == Role::Tool) {
                i += 1;
            }
        }
        out.push(Unit {
            start,
            end: i,
            tokens: counts[start..i].iter().sum(),
            role: message.role,
        });
    }
    out
}

/// Fits the system prompt, the tools and `history` (the latest user message, or the current
/// run's latest tool results, last) into `budget` tokens.
///
/// `history` should be [`repair`]ed. The system prompt, the latest user message (the last
/// message with role User) and the newest unit are always kept — if they do not fit, the
/// error says how many tokens they need. Then everything after the latest user message (the
/// current run) is kept if it fits, and older turns are added newest first while they fit;
/// the kept older part starts at a user message (some chat templates served by vLLM or
/// Ollama need user and assistant turns to alternate). If the current run does not fit,
/// older turns are all left out and the run's oldest steps are dropped (whole units: a call
/// is never split from its results). The window never starts with a tool result.
pub fn fit(
    system: &Message,
    tools: &[ToolDefinition],
    history: &[Message],
    counter: &TokenCounter,
    budget: usize,
) -> Result<Fitted, WindowError> {
    let base = counter.count_message(system) + counter.count_tools(tools) + REPLY_PRIMING;
    let counts = counter.count_messages(history);
    let units = units(history, &counts);
    let Some(last) = units.len().checked_sub(1) else {
        if base > budget {
            return Err(WindowError::TooSmall {
                needed: base,
                budget,
            });
        }
        return Ok(Fitted {
            messages: vec![system.clone()],
            dropped: 0,
            tokens: base,
        });
    };
    // The anchor: the latest user message, or the newest unit when there is none.
    let anchor = units
        .iter()
        .rposition(|u| u.role == Role::User)
        .unwrap_or(last);
    let mut needed = base + units[anchor].tokens;
    if last != anchor {
        needed += units[last].tokens;
    }
    if needed > budget {
        return Err(WindowError::TooSmall { needed, budget });
    }

    // Units kept, as a sorted list of indexes into `units`.
    let run_tokens: usize = units[anchor..].iter().map(|u| u.tokens).sum();
    let mut kept: Vec<usize> = Vec::with_capacity(units.len());
    let mut tokens;
    if base + run_tokens <= budget {
        // The whole run; older units newest first while they fit.
        tokens = base + run_tokens;
        let mut first = anchor;
        while first > 0 && tokens + units[first - 1].tokens <= budget {
            first -= 1;
            tokens += units[first].tokens;
        }
        // Start the older part at a user message.
        while first < anchor && units[anchor].role == Role::User && units[first].role != Role::User
        {
            tokens -= units[first].tokens;
            first += 1;
        }
        kept.extend(first..units.len());
    } else {
        // The latest user message, the newest unit, and the run's newest steps that fit.
        tokens = needed;
        let mut first = last;
        while first > anchor + 1 && tokens + units[first - 1].tokens <= budget {
            first -= 1;
            tokens += units[first].tokens;
        }
        kept.push(anchor);
        kept.extend((first..units.len()).filter(|&u| u != anchor));
    }
    // Never a result without its call first (only for a history that was not repaired).
    while kept.len() > 1 && units[kept[0]].role == Role::Tool && kept[0] != anchor {
        tokens -= units[kept[0]].tokens;
        kept.remove(0);
    }

    let kept_messages: usize = kept.iter().map(|&u| units[u].end - units[u].start).sum();
    let mut messages = Vec::with_capacity(kept_messages + 1);
    messages.push(system.clone());
    for &u in &kept {
        messages.extend_from_slice(&history[units[u].start..units[u].end]);
    }
    Ok(Fitted {
        messages,
        dropped: history.len() - kept_messages,
        tokens,
    })
}

/// A tool result cut to `max_tokens`, with a note saying what was cut and where the whole is
/// (`whole_at`: the spill file, when there is one).
///
/// A result within `max_tokens` is returned as is. Otherwise about 80% of what the note
/// leaves is the result's head and 20% its tail, cut at character boundaries, at line ends
/// where one is near. The output, the note included, is within `max_tokens` as `counter`
/// counts it (when `max_tokens` cannot even hold a short note, the output is empty).
pub fn cap_result(
    text: &str,
    counter: &TokenCounter,
    max_tokens: usize,
    whole_at: Option<&str>,
) -> String {
    let ends = counter.token_ends(text);
    let total = ends.len();
    if total <= max_tokens {
        return text.to_string();
    }
    // The note's tokens with the largest numbers it can show.
    let note_room = counter.count_text(&note(total, total, whole_at)) + 2;
    if note_room > max_tokens {
        let short = format!("[… {} tokens not shown]", thousands(total));
        if counter.count_text(&short) <= max_tokens {
            return short;
        }
        return String::new();
    }
    let mut room = max_tokens - note_room;
    loop {
        let head_tokens = room * 4 / 5;
        let tail_tokens = room - head_tokens;
        let (head_end, tail_start) = cuts(text, &ends, head_tokens, tail_tokens);
        let shown = tokens_before(&ends, head_end) + (total - tokens_before(&ends, tail_start));
        let out = format!(
            "{}{}{}",
            &text[..head_end],
            note(total.saturating_sub(shown), total, whole_at),
            &text[tail_start..]
        );
        let n = counter.count_text(&out);
        if n <= max_tokens {
            return out;
        }
        if room == 0 {
            return note(total, total, whole_at);
        }
        // Cuts can merge differently than the whole did: shrink by the excess and retry.
        room = room.saturating_sub(n - max_tokens + 1);
    }
}

/// The byte offsets to cut at: the head `..head_end`, the tail `tail_start..`.
fn cuts(text: &str, ends: &[usize], head_tokens: usize, tail_tokens: usize) -> (usize, usize) {
    let total = ends.len();
    let mut head_end = if head_tokens == 0 {
        0
    } else {
        ends[head_tokens.min(total) - 1]
    };
    while !text.is_char_boundary(head_end) {
        head_end -= 1;
    }
    // Prefer a line end in the head's last fifth.
    if head_end > 0 {
        let floor = head_end - head_end / 5;
        if let Some(nl) = text[..head_end].rfind('\n')
            && nl >= floor
        {
            head_end = nl + 1;
        }
    }
    let mut tail_start = if tail_tokens == 0 || tail_tokens >= total {
        if tail_tokens == 0 { text.len() } else { 0 }
    } else {
        ends[total - tail_tokens - 1]
    };
    while !text.is_char_boundary(tail_start) {
        tail_start += 1;
    }
    tail_start = tail_start.max(head_end);
    // Prefer a line start in the tail's first fifth.
    let tail_len = text.len() - tail_start;
    if tail_len > 0
        && let Some(nl) = text[tail_start..].find('\n')
        && nl < tail_len / 5
    {
        tail_start += nl + 1;
    }
    (head_end, tail_start)
}

/// How many tokens end at or before byte `at`.
fn tokens_before(ends: &[usize], at: usize) -> usize {
    ends.partition_point(|&end| end <= at)
}

fn note(cut: usize, total: usize, whole_at: Option<&str>) -> String {
    let rest = match whole_at {
        Some(path) => format!("the whole result is in {path} — read it with read_file"),
        None => "the whole result is not kept — narrow the request (filter, fewer columns, a limit) to see the rest".to_string(),
    };
    format!(
        "\n[… cut: {} of {} tokens not shown; {rest}]\n",
        thousands(cut),
        thousands(total)
    )
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
