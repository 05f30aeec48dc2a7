//! `dataref eval SUITE.toml`: asks an agent each question of a suite, scores each answer
//! against the value the case's SQL computes on the source, and reports accuracy, the
//! grounded rate, tokens, tool calls, wall time and cost, as a table or as JSON.
//!
//! One process, one app, a fresh session per question and run, through the same
//! `AgentHost::send` as `ask`. The expected values are computed first, read-only on the
//! sources as the eval's principal, so a broken case fails before any token is spent.
//! `sessions export --eval` turns a finished session into a case ([`case_from_session`]).

mod report;
mod score;
mod suite;

use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Result, bail};
use dataref_agent::{ApproveAll, Approver, Message, NoEvents, NoOneToAsk, Role, SendRequest};
use dataref_config::Config;
use dataref_protocol::Principal;
use dataref_sources::{FetchRequest, Sources, SqlPolicy};
use dataref_store::{ArtifactStore, Lineage};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::Common;
use crate::chat::{self, Started};
use report::{CaseResult, Report, RunResult};
use suite::{Expected, Match, Suite, Value};

/// The exit code when accuracy is under `--min-accuracy`.
pub const UNDER_THRESHOLD: u8 = 3;

/// What `dataref eval` was asked for.
pub struct Options<'a> {
    pub suite: &'a Path,
    pub agent: Option<&'a str>,
    pub principal: Option<&'a str>,
    pub runs: u32,
    pub json: bool,
    pub min_accuracy: Option<f64>,
    pub yes: bool,
}

pub fn run(common: &Common, opts: Options<'_>) -> Result<ExitCode> {
    if let Some(min) = opts.min_accuracy
        && !(0.0..=1.0).contains(&min)
    {
        bail!(
            "`--min-accuracy {min}` is not between 0 and 1\nhint: e.g. `--min-accuracy 0.9` fails the eval under 90%"
        );
    }
    let suite = Suite::load(opts.suite)?;
    let began = Instant::now();
    let Started { app, ctx, config } = chat::start(common, opts.principal, opts.agent)?;
    let outcome = (|| {
        let agent = app
            .agents
            .agent(opts.agent)
            .map_err(|e| chat::with_hint(&e.to_string(), e.hint()))?
            .clone();
        let profile = config.agents.get(&agent.name);
        let prices = profile.and_then(|p| p.prices);
        let expected = {
            let _entered = app.runtime.enter();
            expected_values(&suite, &config, app.shared.store.as_ref(), &ctx.principal)?
        };
        let approver: Box<dyn Approver> = if opts.yes {
            Box::new(ApproveAll)
        } else {
            Box::new(NoOneToAsk)
        };
        let mut cases: Vec<CaseResult<'_>> = suite
            .cases
            .iter()
            .zip(expected)
            .map(|(case, expected)| CaseResult {
                case,
                expected,
                runs: Vec::new(),
            })
            .collect();
        let total = cases.len() * opts.runs as usize;
        let mut done = 0;
        for run in 1..=opts.runs {
            for c in &mut cases {
                done += 1;
                let started = Instant::now();
                let cancel = CancellationToken::new();
                let (sent, interrupted) = app.runtime.block_on(async {
                    let send = app.agents.send(SendRequest {
                        ctx: ctx.clone(),
                        agent: Some(&agent.name),
                        session: None,
                        message: c.case.question.clone(),
                        events: &NoEvents,
                        approver: approver.as_ref(),
                        cancel: cancel.clone(),
                    });
                    tokio::pin!(send);
                    tokio::select! {
                        r = &mut send => (r, false),
                        _ = tokio::signal::ctrl_c() => {
                            cancel.cancel();
                            (send.await, true)
                        }
                    }
                });
                if interrupted {
                    bail!(
                        "interrupted at case `{}` ({done} of {total} runs)",
                        c.case.id
                    );
                }
                let sent = sent.map_err(|e| chat::with_hint(&e.to_string(), e.hint()))?;
                let seconds = started.elapsed().as_secs_f64();
                let r = &sent.run;
                // A run a limit or an error ended has no answer to score.
                let scored = match &r.stopped {
                    Some(s) => score::Score {
                        pass: false,
                        got: format!("stopped: {}", s.as_str()),
                    },
                    None => score::score(&r.answer, &c.expected, c.case.matching, c.case.tolerance),
                };
                let result = RunResult {
                    run,
                    pass: scored.pass,
                    got: scored.got,
                    answer: r.answer.clone(),
                    grounded: r.grounding.as_ref().map(|g| g.grounded()),
                    unmatched: r
                        .grounding
                        .as_ref()
                        .map(|g| g.unmatched.clone())
                        .unwrap_or_default(),
                    prompt_tokens: r.usage.prompt_tokens,
                    completion_tokens: r.usage.completion_tokens,
                    tool_calls: r.tool_calls,
                    seconds,
                    stopped: r.stopped.as_ref().map(|s| s.as_str().to_owned()),
                    session: sent.session.clone(),
                    cost: prices.map(|p| p.cost(r.usage.prompt_tokens, r.usage.completion_tokens)),
                };
                note(&format!(
                    "[{done}/{total}] {} {}: {} ({} tool call{}, {:.1} s)",
                    c.case.id,
                    if result.pass { "pass" } else { "FAIL" },
                    result.got,
                    result.tool_calls,
                    if result.tool_calls == 1 { "" } else { "s" },
                    seconds
                ));
                c.runs.push(result);
            }
        }
        Ok(Report {
            suite: &suite,
            agent: agent.name.clone(),
            model: profile.and_then(|p| p.model.model.clone()),
            runs: opts.runs,
            cases,
            seconds: began.elapsed().as_secs_f64(),
            priced: prices.is_some(),
            min_accuracy: opts.min_accuracy,
        })
    })();
    chat::shutdown(&app);
    let report = outcome?;
    let text = if opts.json {
        serde_json::to_string_pretty(&report.json())?
    } else {
        report.markdown()
    };
    print_out(&text);
    Ok(if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(UNDER_THRESHOLD)
    })
}

#[expect(clippy::print_stdout, reason = "the report is the command's output")]
fn print_out(text: &str) {
    println!("{}", text.trim_end());
}

#[expect(clippy::print_stderr, reason = "progress for the person, on stderr")]
fn note(s: &str) {
    eprintln!("{s}");
}

/// Each case's expected values: its literal, or its SQL's first column run read-only on its
/// source as `owner` (the result is a table of theirs, kept until its TTL like any other).
fn expected_values(
    suite: &Suite,
    config: &Config,
    store: &dyn ArtifactStore,
    owner: &Principal,
) -> Result<Vec<Vec<Value>>> {
    let sources = Sources::new(config);
    let no_columns = Default::default();
    suite
        .cases
        .iter()
        .map(|case| {
            let at = format!(
                "{}: case `{}` (line {})",
                suite.path.display(),
                case.id,
                case.line
            );
            let (source, sql) = match &case.expected {
                Expected::Literal(values) => return Ok(values.clone()),
                Expected::Sql { source, sql } => (source, sql),
            };
            let Some(source) = config.sources.get(source) else {
                let known: Vec<String> = config.sources.keys().map(|k| format!("`{k}`")).collect();
                bail!(
                    "{at}: no source `{source}` in this config\nhint: the sources are {}; name one with `source` in the case or in `[suite]`",
                    known.join(", ")
                );
            };
            let req = FetchRequest {
                source,
                sql,
                params: Vec::new(),
                declared: &no_columns,
                policy: SqlPolicy::Generic,
            };
            let lineage = Lineage::new(
                "eval",
                json!({"source": source.name, "sql": sql, "case": case.id}),
            );
            let fetched = sources
                .fetch(&req, store, owner, lineage, &|_| {}, &|| false)
                .map_err(|e| {
                    let hint = e
                        .hint()
                        .map(|h| format!("\nhint: {h}"))
                        .unwrap_or_default();
                    anyhow::anyhow!("{at}: the expected value's SQL failed: {e}{hint}")
                })?;
            let table = store
                .map_table(owner, &fetched.meta.data_ref)
                .and_then(|t| t.head(suite::MAX_EXPECTED + 1))
                .map_err(|e| anyhow::anyhow!("{at}: cannot read the expected values back: {e}"))?;
            let mut values = Vec::new();
            for batch in &table.batches {
                for row in 0..batch.num_rows() {
                    let (cell, _) = dataref_store::cell_to_json(batch.column(0), row, None);
                    let value = match cell {
                        serde_json::Value::Number(n) => n.as_f64().map(Value::Number),
                        serde_json::Value::String(s) => Some(Value::Text(s)),
                        serde_json::Value::Bool(b) => Some(Value::Text(b.to_string())),
                        _ => None,
                    };
                    let Some(value) = value else {
                        bail!(
                            "{at}: the SQL's row {} has no value to expect (NULL)\nhint: filter the NULLs out, or select the value the answer should hold",
                            values.len() + 1
                        );
                    };
                    values.push(value);
                }
            }
            if values.is_empty() {
                bail!(
                    "{at}: the SQL returned no rows\nhint: run it with `dataref ask` or a SQLite shell and check its filters"
                );
            }
            if let Err((message, hint)) = suite::check_values(case.matching, &values) {
                bail!("{at}: {message}\nhint: {hint}");
            }
            Ok(values)
        })
        .collect()
}

/// A finished session as an eval case (TOML to add to a suite): the question is its first
/// message; the expected value is the SQL of its last `query` call when it has one (matched
/// as a number for one row, as a list for more), else the answer's numbers as literals.
pub fn case_from_session(id: &str, history: &[Message], config: &Config) -> Result<String> {
    let Some(question) = history
        .iter()
        .find(|m| m.role == Role::User)
        .map(|m| m.content.trim().to_owned())
    else {
        bail!(
            "session `{id}` has no question\nhint: `dataref sessions show {id}` shows what it holds"
        );
    };
    let Some(answer) = history
        .iter()
        .rev()
        .find(|m| m.role == Role::Assistant && m.tool_calls.is_empty() && !m.content.is_empty())
        .map(|m| m.content.clone())
    else {
        bail!(
            "session `{id}` has no answer yet\nhint: only a finished session becomes an eval case"
        );
    };
    // The last call of `query` or `run_sql`, and the rows its result reported.
    let last = history
        .iter()
        .flat_map(|m| m.tool_calls.iter())
        .rfind(|c| matches!(c.name.as_str(), "query" | "run_sql"));
    let rows_of = |call_id: &str| {
        history
            .iter()
            .find(|m| m.role == Role::Tool && m.tool_call_id.as_deref() == Some(call_id))
            .and_then(|m| {
                let first = m.content.lines().next().unwrap_or_default();
                serde_json::from_str::<serde_json::Value>(first).ok()
            })
            .and_then(|v| v.get("rows").and_then(serde_json::Value::as_u64))
    };
    let mut out = String::new();
    out.push_str(&format!(
        "# From session {id}. Check the question and the expected value before adding it to a suite.\n"
    ));
    let slug: String = id.chars().filter(char::is_ascii_alphanumeric).collect();
    out.push_str(&format!(
        "[[case]]\nid = {}\nquestion = {}\n",
        toml_string(&format!("session-{slug}")),
        toml_string(&question)
    ));
    let args = last.and_then(|c| {
        serde_json::from_str::<serde_json::Value>(&c.arguments)
            .ok()
            .map(|a| (c, a))
    });
    let from_query = args.as_ref().and_then(|(call, a)| {
        let sql = a.get("sql")?.as_str()?;
        let source = a.get("source")?.as_str()?;
        (call.name == "query" && config.sources.contains_key(source)).then_some((call, source, sql))
    });
    match from_query {
        Some((call, source, sql)) => {
            let matching = match rows_of(&call.id) {
                Some(1) => Match::Number,
                _ if sql.to_ascii_lowercase().contains("order by") => Match::Ordered,
                _ => Match::Set,
            };
            out.push_str(&format!(
                "source = {}\nsql = {}\nmatch = \"{}\"\n",
                toml_string(source),
                toml_string(sql),
                matching.as_str()
            ));
            if matching == Match::Number {
                out.push_str(
                    "# A number is the first cell of the result: make the SQL select it first.\n",
                );
            }
        }
        None => {
            let why = match last {
                Some(c) if c.name == "run_sql" => {
                    "its last SQL ran on stored tables (`run_sql`), not on a source"
                }
                Some(_) => "its last query named no source of this config",
                None => "no SQL of the session computed the answer",
            };
            let numbers = dataref_agent::ground::numbers(&answer);
            out.push_str(&format!(
                "# The expected values are the answer's numbers: {why}.\n# Replace them with `sql` computing the answer on the source when you can.\n"
            ));
            match numbers.as_slice() {
                [] => bail!(
                    "session `{id}`'s answer has no number and no `query` computed it\nhint: write the case by hand: `expected = \"…\"` with `match = \"text\"`"
                ),
                [one] => out.push_str(&format!(
                    "expected = {}\nmatch = \"number\"\n",
                    toml_number(*one)
                )),
                many => out.push_str(&format!(
                    "expected = [{}]\nmatch = \"set\"\n",
                    many.iter()
                        .map(|n| toml_number(*n))
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
            }
        }
    }
    out.push_str(&format!(
        "# The answer then:\n{}",
        answer
            .lines()
            .map(|l| format!("#   {l}\n"))
            .collect::<String>()
    ));
    Ok(out)
}

/// A TOML basic string.
fn toml_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A TOML number that reads back as the same `f64`.
fn toml_number(n: f64) -> String {
    let s = format!("{n:?}");
    if s.contains(['.', 'e', 'E']) {
        s
    } else {
        format!("{s}.0")
    }
}

#[cfg(test)]
mod tests {
    use dataref_agent::AssistantToolCall;
    use dataref_tool::OutcomeKind;

    use super::*;

    fn call(name: &str, args: serde_json::Value) -> Message {
        let mut m = Message::assistant(String::new());
        m.tool_calls = vec![AssistantToolCall {
            id: "c1".into(),
            name: name.into(),
            arguments: args.to_string(),
        }];
        m
    }

    #[test]
    fn a_session_with_a_query_becomes_a_case_with_its_sql() {
        let config = Config::builtin_sample("/nowhere".into(), 100);
        let history = vec![
            Message::user("What was Q4's revenue?\nThanks \"boss\""),
            call(
                "query",
                json!({"source": "sample", "sql": "SELECT sum(revenue)\nFROM sales WHERE date >= '2025-10-01'"}),
            ),
            Message::tool(
                "c1",
                r#"{"dataRef": "data_x", "rows": 1}"#,
                OutcomeKind::Ok.into(),
            ),
            Message::assistant("Q4 revenue was 12,421,073.90."),
        ];
        let text = case_from_session("s-1a2b", &history, &config).unwrap();
        let suite = Suite::parse(&text, Path::new("case.toml")).unwrap();
        let case = &suite.cases[0];
        assert_eq!(case.id, "session-s1a2b");
        assert_eq!(case.question, "What was Q4's revenue?\nThanks \"boss\"");
        assert_eq!(case.matching, Match::Number);
        assert_eq!(
            case.expected,
            Expected::Sql {
                source: "sample".into(),
                sql: "SELECT sum(revenue)\nFROM sales WHERE date >= '2025-10-01'".into()
            }
        );
    }

    #[test]
    fn without_a_query_the_answers_numbers_are_expected() {
        let config = Config::builtin_sample("/nowhere".into(), 100);
        let history = vec![
            Message::user("How did EMEA and APAC do?"),
            call("run_sql", json!({"sql": "SELECT 1"})),
            Message::tool("c1", "{}", OutcomeKind::Ok.into()),
            Message::assistant("EMEA 13,648,777.26 and APAC 9,986,346.63."),
        ];
        let text = case_from_session("s-9", &history, &config).unwrap();
        assert!(text.contains("run_sql"), "{text}");
        let suite = Suite::parse(&text, Path::new("case.toml")).unwrap();
        assert_eq!(suite.cases[0].matching, Match::Set);
        assert_eq!(
            suite.cases[0].expected,
            Expected::Literal(vec![
                Value::Number(13_648_777.26),
                Value::Number(9_986_346.63)
            ])
        );
        let unanswered = &history[..3];
        let e = case_from_session("s-9", unanswered, &config).unwrap_err();
        assert!(format!("{e:#}").contains("no answer yet"), "{e:#}");
    }
}
