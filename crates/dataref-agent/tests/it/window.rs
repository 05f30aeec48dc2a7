//! The context manager with the real tokenizer: repair, fitting into a budget, the result
//! cap, cached counts, the encoding by model name.

use std::cell::Cell;
use std::time::Instant;

use dataref_agent::message::{AssistantToolCall, Message, Role, StepOutcome, ToolDefinition};
use dataref_agent::tokens::{REPLY_PRIMING, TokenCounter};
use dataref_agent::window::{INTERRUPTED_RESULT, WindowError, cap_result, fit, repair};
use dataref_tool::OutcomeKind;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::json;

fn counter() -> TokenCounter {
    TokenCounter::for_model("gpt-4o", None).unwrap()
}

fn call(id: &str) -> AssistantToolCall {
    AssistantToolCall {
        id: id.to_string(),
        name: "query".to_string(),
        arguments: format!(r#"{{"sql":"select * from t where id = '{id}'"}}"#),
    }
}

fn tools() -> Vec<ToolDefinition> {
    vec![
        ToolDefinition {
            name: "query".to_string(),
            description: "Runs a saved or ad-hoc SQL query into an artifact.".to_string(),
            parameters: json!({"type": "object", "properties": {"sql": {"type": "string"}}}),
        },
        ToolDefinition {
            name: "run_python".to_string(),
            description: "Runs Python on dataRefs.".to_string(),
            parameters: json!({"type": "object", "properties": {"code": {"type": "string"}}}),
        },
    ]
}

/// Text of about `words` words, some of them not ASCII.
fn text(seed: usize, words: usize) -> String {
    const WORDS: &[&str] = &[
        "revenue",
        "by",
        "region",
        "매출",
        "분기",
        "выручка",
        "за",
        "квартал",
        "2024",
        "—",
        "total",
        "🙂",
        "rows",
        "\n",
    ];
    (0..words)
        .map(|i| WORDS[(seed * 31 + i * 7) % WORDS.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

fn roles(messages: &[Message]) -> Vec<Role> {
    messages.iter().map(|m| m.role).collect()
}

/// Every call is answered by the tool messages right after its assistant message, once, in
/// call order; every tool message answers a call of the assistant message it follows.
fn assert_paired(messages: &[Message]) {
    let mut i = 0;
    while i < messages.len() {
        let m = &messages[i];
        assert_ne!(m.role, Role::Tool, "result without its call at {i}: {m:?}");
        i += 1;
        if m.role == Role::Assistant && !m.tool_calls.is_empty() {
            for c in &m.tool_calls {
                let r = messages
                    .get(i)
                    .unwrap_or_else(|| panic!("no result for {}", c.id));
                assert_eq!(r.role, Role::Tool, "no result for {} at {i}", c.id);
                assert_eq!(r.tool_call_id.as_deref(), Some(c.id.as_str()));
                i += 1;
            }
        }
    }
}

#[test]
fn repair_inserts_an_interrupted_result_in_call_order() {
    let mut history = vec![
        Message::user("q"),
        Message::assistant_calls("", vec![call("a"), call("b"), call("c")]),
        Message::tool("c", "result c", StepOutcome::Ran(OutcomeKind::Ok)),
        Message::tool("a", "result a", StepOutcome::Ran(OutcomeKind::Ok)),
        Message::user("next"),
    ];
    repair(&mut history);
    assert_eq!(
        roles(&history),
        [
            Role::User,
            Role::Assistant,
            Role::Tool,
            Role::Tool,
            Role::Tool,
            Role::User
        ]
    );
    let ids: Vec<_> = history[2..5]
        .iter()
        .map(|m| m.tool_call_id.clone().unwrap())
        .collect();
    assert_eq!(ids, ["a", "b", "c"]);
    assert_eq!(history[2].content, "result a");
    assert_eq!(history[3].content, INTERRUPTED_RESULT);
    assert_eq!(history[4].content, "result c");
    assert_paired(&history);

    // The run stopped right after the model asked: the history ends with the call.
    let mut history = vec![
        Message::user("q"),
        Message::assistant_calls("", vec![call("x")]),
    ];
    repair(&mut history);
    assert_eq!(history.len(), 3);
    assert_eq!(
        history[2],
        Message::tool(
            "x",
            INTERRUPTED_RESULT,
            StepOutcome::Ran(OutcomeKind::Cancelled)
        )
    );
}

#[test]
fn repair_drops_orphans_and_duplicates() {
    let mut history = vec![
        Message::system("a note in the history"),
        Message::tool(
            "ghost",
            "orphan before anything",
            StepOutcome::Ran(OutcomeKind::Ok),
        ),
        Message::user("q"),
        Message::tool(
            "ghost",
            "orphan after a user message",
            StepOutcome::Ran(OutcomeKind::Ok),
        ),
        Message::assistant_calls("", vec![call("a")]),
        Message::tool("a", "first", StepOutcome::Ran(OutcomeKind::Ok)),
        Message::tool("a", "second", StepOutcome::Ran(OutcomeKind::Ok)),
        Message::tool(
            "z",
            "not a call of this message",
            StepOutcome::Ran(OutcomeKind::Ok),
        ),
        Message::assistant("done"),
        Message::tool(
            "a",
            "late, after a text answer",
            StepOutcome::Ran(OutcomeKind::Ok),
        ),
    ];
    repair(&mut history);
    assert_eq!(
        roles(&history),
        [
            Role::System,
            Role::User,
            Role::Assistant,
            Role::Tool,
            Role::Assistant
        ]
    );
    assert_eq!(history[3].content, "first");
    assert_paired(&history);

    // Well formed already: unchanged.
    let before = history.clone();
    repair(&mut history);
    assert_eq!(history, before);
}

/// u1 a1 | u2 [c1 r1] a2 | u3: 7 messages of ~100 words each.
fn three_turns() -> Vec<Message> {
    vec![
        Message::user(text(1, 100)),
        Message::assistant(text(2, 100)),
        Message::user(text(3, 100)),
        Message::assistant_calls(text(4, 100), vec![call("c1")]),
        Message::tool("c1", text(5, 100), StepOutcome::Ran(OutcomeKind::Ok)),
        Message::assistant(text(6, 100)),
        Message::user(text(7, 100)),
    ]
}

#[test]
fn fit_keeps_everything_that_fits() {
    let c = counter();
    let system = Message::system("You are a data analyst.");
    let history = three_turns();
    let f = fit(&system, &tools(), &history, &c, 100_000).unwrap();
    assert_eq!(f.dropped, 0);
    assert_eq!(f.messages.len(), 8);
    assert_eq!(f.messages[0], system);
    let expected: usize = f.messages.iter().map(|m| c.count_message(m)).sum::<usize>()
        + c.count_tools(&tools())
        + REPLY_PRIMING;
    assert_eq!(f.tokens, expected);
}

#[test]
fn fit_trims_the_oldest_turns_first_and_starts_at_a_user_message() {
    let c = counter();
    let system = Message::system("You are a data analyst.");
    let tools = tools();
    let history = three_turns();
    let counts: Vec<usize> = history.iter().map(|m| c.count_message(m)).collect();
    let base = c.count_message(&system) + c.count_tools(&tools) + REPLY_PRIMING;

    // Room for the last turn and the one before, and half of the first one.
    let budget = base + counts[2..].iter().sum::<usize>() + counts[1] / 2 + counts[0];
    let f = fit(&system, &tools, &history, &c, budget).unwrap();
    assert_eq!(f.dropped, 2);
    assert_eq!(&f.messages[1..], &history[2..]);
    assert!(f.tokens <= budget);

    // Room for the last turn and the end of the turn before (a2 and the call): the older
    // part would start with an assistant message, so it starts at u3.
    let budget = base + counts[3..].iter().sum::<usize>();
    let f = fit(&system, &tools, &history, &c, budget).unwrap();
    assert_eq!(f.dropped, 6);
    assert_eq!(&f.messages[1..], &history[6..]);

    // One token short of the latest message: too small.
    let needed = base + counts[6];
    let err = fit(&system, &tools, &history, &c, needed - 1).unwrap_err();
    assert_eq!(
        err,
        WindowError::TooSmall {
            needed,
            budget: needed - 1
        }
    );
    assert!(err.to_string().contains(&needed.to_string()));
}

#[test]
fn fit_drops_the_oldest_steps_of_a_long_run_but_never_the_newest() {
    let c = counter();
    let system = Message::system("You are a data analyst.");
    let mut history = vec![Message::user(text(1, 50)), Message::assistant(text(2, 50))];
    history.push(Message::user(
        "Compare revenue by region for the last four quarters.",
    ));
    for i in 0..4 {
        let id = format!("s{i}");
        history.push(Message::assistant_calls("", vec![call(&id)]));
        history.push(Message::tool(
            &id,
            text(10 + i, 400),
            StepOutcome::Ran(OutcomeKind::Ok),
        ));
    }
    let counts: Vec<usize> = history.iter().map(|m| c.count_message(m)).collect();
    let base = c.count_message(&system) + REPLY_PRIMING;
    // The latest user message, the last two steps, and a bit.
    let budget = base + counts[2] + counts[7..].iter().sum::<usize>() + 10;
    let f = fit(&system, &[], &history, &c, budget).unwrap();
    assert_eq!(f.messages[1], history[2]);
    assert_eq!(&f.messages[2..], &history[7..]);
    assert_eq!(f.dropped, 6);
    assert!(f.tokens <= budget);

    // Only the user message and the newest step fit.
    let budget = base + counts[2] + counts[9] + counts[10];
    let f = fit(&system, &[], &history, &c, budget).unwrap();
    assert_eq!(
        f.messages[1..],
        [history[2].clone(), history[9].clone(), history[10].clone()]
    );

    // Not even those: too small, naming what they need.
    let err = fit(&system, &[], &history, &c, budget - 1).unwrap_err();
    assert_eq!(
        err,
        WindowError::TooSmall {
            needed: budget,
            budget: budget - 1
        }
    );
}

#[test]
fn fit_of_an_empty_history_is_the_system_prompt() {
    let c = counter();
    let system = Message::system("You are a data analyst.");
    let f = fit(&system, &[], &[], &c, 1000).unwrap();
    assert_eq!(f.messages, std::slice::from_ref(&system));
    assert!(matches!(
        fit(&system, &tools(), &[], &c, 3),
        Err(WindowError::TooSmall { .. })
    ));
}

fn long_result() -> String {
    (0..3000)
        .map(|i| format!("{i},Seoul 서울,Москва,{}.50,🙂\n", i * 17))
        .collect()
}

#[test]
fn cap_result_keeps_head_and_tail_within_max() {
    let c = counter();
    let whole = long_result();
    let total = c.count_text(&whole);
    assert!(total > 20_000, "{total}");
    for max in [300, 1000, 4000] {
        let capped = cap_result(&whole, &c, max, Some(".spill/call_7.json"));
        let n = c.count_text(&capped);
        assert!(n <= max, "{n} tokens over {max}");
        assert!(n > max * 3 / 4, "{n} tokens, far under {max}");
        assert!(capped.contains(".spill/call_7.json"), "{capped}");
        assert!(capped.contains("read_file"));
        assert!(capped.contains(&format!("of {} tokens not shown", thousands(total))));
        assert!(capped.starts_with("0,Seoul 서울,Москва,0.50,🙂\n"));
        assert!(capped.ends_with("2999,Seoul 서울,Москва,50983.50,🙂\n"));
        // Cut at line ends: every line but the note is a whole line of the result.
        for line in capped
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with("[…"))
        {
            assert!(
                whole.contains(&format!("{line}\n")),
                "partial line {line:?}"
            );
        }
    }
    // Within max: as is.
    assert_eq!(cap_result("small", &c, 10, None), "small");
}

#[test]
fn cap_result_without_a_spill_file_says_so_and_is_utf8_safe() {
    let c = counter();
    // One long line of multi-byte characters: no line end to cut at.
    let whole = "매출분기выручка🙂".repeat(2000);
    for max in [50, 333, 1000] {
        let capped = cap_result(&whole, &c, max, None);
        assert!(c.count_text(&capped) <= max);
        assert!(capped.contains("not kept"), "{capped}");
        assert!(capped.contains("narrow the request"));
        assert!(capped.starts_with("매출"));
        assert!(capped.ends_with("🙂"));
    }
    // Too small for the note: something short, never over.
    for max in [0, 3, 8] {
        assert!(c.count_text(&cap_result(&whole, &c, max, None)) <= max);
    }
}

fn thousands(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

#[test]
fn message_counts_are_cached_and_follow_openai() {
    let c = counter();
    let m = Message::user("hello world");
    let first = c.count_message(&m);
    // 3 of framing + "user" + "hello world".
    assert_eq!(
        first,
        3 + c.count_text("user") + c.count_text("hello world")
    );
    assert_eq!(c.count_message(&m), first);
    let calls = Message::assistant_calls("", vec![call("a"), call("b")]);
    assert!(
        c.count_message(&calls) > c.count_message(&Message::assistant_calls("", vec![call("a")]))
    );
    let result = Message::tool("call_abc", "hello world", StepOutcome::Ran(OutcomeKind::Ok));
    assert!(c.count_message(&result) > first);
    let all = [m.clone(), calls.clone(), result.clone()];
    assert_eq!(
        c.count_messages(&all),
        [
            c.count_message(&m),
            c.count_message(&calls),
            c.count_message(&result)
        ]
    );
    assert!(c.count_tools(&tools()) > c.count_text(&tools()[0].description));
    assert_eq!(c.count_tools(&tools()), c.count_tools(&tools()));
    assert_eq!(c.count_tools(&[]), 0);
}

#[test]
fn the_encoding_follows_the_model_name() {
    for (model, encoding, approximate) in [
        ("gpt-4o", "o200k_base", false),
        ("gpt-4o-mini", "o200k_base", false),
        ("gpt-4.1", "o200k_base", false),
        ("o3", "o200k_base", false),
        ("gpt-5-mini", "o200k_base", false),
        ("gpt-4", "cl100k_base", false),
        ("gpt-3.5-turbo", "cl100k_base", false),
        ("openai/gpt-4o", "o200k_base", false),
        ("llama3.1:8b", "o200k_base", true),
        ("Qwen/Qwen2.5-7B-Instruct", "o200k_base", true),
    ] {
        let c = TokenCounter::for_model(model, None).unwrap();
        assert_eq!(c.encoding(), encoding, "{model}");
        assert_eq!(c.is_approximate(), approximate, "{model}");
    }
    let c = TokenCounter::for_model("llama3.1:8b", Some("cl100k_base")).unwrap();
    assert_eq!(c.encoding(), "cl100k_base");
    assert!(!c.is_approximate());
    let err = TokenCounter::for_model("gpt-4o", Some("o100k")).unwrap_err();
    assert!(
        err.contains("o100k") && err.contains("o200k_base") && err.contains("cl100k_base"),
        "{err}"
    );
    // The same text, different encodings: both real tokenizers.
    let s = "Выручка по регионам за квартал";
    assert_ne!(
        TokenCounter::for_model("gpt-4o", None)
            .unwrap()
            .count_text(s),
        TokenCounter::for_model("gpt-4", None)
            .unwrap()
            .count_text(s)
    );
}

/// A 200-message history of ~100k tokens: fit with warm counts. Prints the time.
#[test]
fn fit_of_a_long_history_is_fast() {
    let c = counter();
    let system = Message::system(text(0, 300));
    let mut history = Vec::new();
    for turn in 0..40 {
        history.push(Message::user(text(turn, 100)));
        for step in 0..2 {
            let id = format!("t{turn}s{step}");
            history.push(Message::assistant_calls("", vec![call(&id)]));
            history.push(Message::tool(
                &id,
                text(turn * 3 + step, 780),
                StepOutcome::Ran(OutcomeKind::Ok),
            ));
        }
    }
    assert_eq!(history.len(), 200);
    let total: usize = history.iter().map(|m| c.count_message(m)).sum();
    eprintln!("history: {} messages, {total} tokens", history.len());
    let tools = tools();
    let _ = fit(&system, &tools, &history, &c, 64_000).unwrap();
    let rounds = 50;
    let start = Instant::now();
    let mut dropped = 0;
    for _ in 0..rounds {
        dropped = fit(&system, &tools, &history, &c, 64_000).unwrap().dropped;
    }
    let each = start.elapsed() / rounds;
    eprintln!(
        "fit of {} messages / {total} tokens into 64,000: {each:?} each, {dropped} dropped",
        history.len()
    );
    let mut h = history.clone();
    let start = Instant::now();
    repair(&mut h);
    eprintln!("repair (well formed): {:?}", start.elapsed());
}

/// What a random history is made of.
#[derive(Debug, Clone)]
enum Step {
    User(usize),
    Text(usize),
    /// Calls with their result plans: 0 missing, 1 present, 2 duplicated; shuffled order.
    Calls(Vec<(u8, usize)>, bool),
    Orphan(usize),
    System,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (1usize..200).prop_map(Step::User),
        2 => (1usize..200).prop_map(Step::Text),
        4 => (prop::collection::vec((0u8..3, 1usize..300), 0..4), any::<bool>())
            .prop_map(|(calls, reversed)| Step::Calls(calls, reversed)),
        1 => (1usize..50).prop_map(Step::Orphan),
        1 => Just(Step::System),
    ]
}

fn build(steps: &[Step]) -> Vec<Message> {
    let mut out = Vec::new();
    for (n, s) in steps.iter().enumerate() {
        match s {
            Step::User(w) => out.push(Message::user(text(n, *w))),
            Step::Text(w) => out.push(Message::assistant(text(n, *w))),
            Step::System => out.push(Message::system("a note")),
            Step::Orphan(w) => out.push(Message::tool(
                format!("orphan{n}"),
                text(n, *w),
                StepOutcome::Ran(OutcomeKind::Ok),
            )),
            Step::Calls(calls, reversed) => {
                let ids: Vec<String> = (0..calls.len()).map(|i| format!("c{n}_{i}")).collect();
                out.push(Message::assistant_calls(
                    "",
                    ids.iter().map(|id| call(id)).collect(),
                ));
                let mut results = Vec::new();
                for ((plan, w), id) in calls.iter().zip(&ids) {
                    for _ in 0..*plan {
                        results.push(Message::tool(
                            id,
                            text(n, *w),
                            StepOutcome::Ran(OutcomeKind::Ok),
                        ));
                    }
                }
                if *reversed {
                    results.reverse();
                }
                out.extend(results);
            }
        }
    }
    out
}

#[test]
fn random_histories_fit_well_formed_within_budget() {
    let c = counter();
    let system = Message::system("You are a data analyst. Work by reference.");
    let tools = tools();
    let base = c.count_message(&system) + c.count_tools(&tools) + REPLY_PRIMING;
    let mut runner = TestRunner::new(Config {
        cases: 300,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (prop::collection::vec(step(), 0..30), 0usize..6000);
    // How many cases kept all, trimmed, were too small: all three must happen.
    let seen = [Cell::new(0usize), Cell::new(0), Cell::new(0)];
    runner
        .run(&strategy, |(steps, budget)| {
            let mut history = build(&steps);
            repair(&mut history);
            assert_paired(&history);
            let again = history.clone();
            repair(&mut history);
            prop_assert_eq!(&history, &again);

            let last_user = history.iter().rposition(|m| m.role == Role::User);
            match fit(&system, &tools, &history, &c, budget) {
                Ok(f) => {
                    seen[usize::from(f.dropped > 0)]
                        .set(seen[usize::from(f.dropped > 0)].get() + 1);
                    prop_assert!(f.tokens <= budget, "{} over {}", f.tokens, budget);
                    let counted: usize =
                        f.messages.iter().map(|m| c.count_message(m)).sum::<usize>()
                            + c.count_tools(&tools)
                            + REPLY_PRIMING;
                    prop_assert_eq!(f.tokens, counted);
                    prop_assert_eq!(&f.messages[0], &system);
                    prop_assert_ne!(f.messages.get(1).map(|m| m.role), Some(Role::Tool));
                    assert_paired(&f.messages[1..]);
                    prop_assert_eq!(f.dropped + f.messages.len() - 1, history.len());
                    if let Some(u) = last_user {
                        // The latest user message and the newest message are kept.
                        prop_assert!(f.messages.contains(&history[u]));
                        let kept_users = f.messages.iter().filter(|m| m.role == Role::User).count();
                        prop_assert!(kept_users >= 1);
                        prop_assert_eq!(
                            f.messages
                                .iter()
                                .rposition(|m| m.role == Role::User)
                                .map(|i| &f.messages[i]),
                            Some(&history[u])
                        );
                    }
                    prop_assert_eq!(f.messages.last(), history.last().or(Some(&system)));
                    // Kept messages are in history order.
                    let mut at = 0;
                    for m in &f.messages[1..] {
                        let found = history[at..].iter().position(|h| h == m);
                        prop_assert!(found.is_some(), "{m:?} not in order");
                        at += found.unwrap_or(0) + 1;
                    }
                }
                Err(WindowError::TooSmall { needed, budget: b }) => {
                    seen[2].set(seen[2].get() + 1);
                    prop_assert_eq!(b, budget);
                    prop_assert!(needed > budget);
                    let min = base + last_user.map_or(0, |u| c.count_message(&history[u]));
                    prop_assert!(needed >= min);
                }
            }
            Ok(())
        })
        .unwrap();
    let seen = seen.map(Cell::into_inner);
    eprintln!("kept all / trimmed / too small: {seen:?}");
    assert!(seen.iter().all(|&n| n > 0), "{seen:?}");
}
