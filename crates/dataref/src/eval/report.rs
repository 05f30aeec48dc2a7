//! What an eval found: per case and in total, as a Markdown table or one JSON object.

use std::fmt::Write as _;

use serde_json::{Value, json};

use super::score::fmt_number;
use super::suite::{Case, Suite};

/// One run of one case.
#[derive(Debug, Clone, PartialEq)]
pub struct RunResult {
    pub run: u32,
    pub pass: bool,
    pub got: String,
    pub answer: String,
    /// `None`: the run ended without an answer of the model's.
    pub grounded: Option<bool>,
    pub unmatched: Vec<String>,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub tool_calls: u32,
    pub seconds: f64,
    /// The limit or error that ended the run early.
    pub stopped: Option<String>,
    pub session: String,
    pub cost: Option<f64>,
}

/// A case's expected values and its runs.
#[derive(Debug, Clone, PartialEq)]
pub struct CaseResult<'a> {
    pub case: &'a Case,
    pub expected: Vec<super::suite::Value>,
    pub runs: Vec<RunResult>,
}

impl CaseResult<'_> {
    fn passed(&self) -> usize {
        self.runs.iter().filter(|r| r.pass).count()
    }

    fn grounded(&self) -> usize {
        self.runs
            .iter()
            .filter(|r| r.grounded == Some(true))
            .count()
    }
}

/// The whole eval.
#[derive(Debug, Clone, PartialEq)]
pub struct Report<'a> {
    pub suite: &'a Suite,
    pub agent: String,
    pub model: Option<String>,
    pub runs: u32,
    pub cases: Vec<CaseResult<'a>>,
    /// The eval's wall time, expected values included.
    pub seconds: f64,
    /// Whether the profile declares prices (a cost is reported only then).
    pub priced: bool,
    pub min_accuracy: Option<f64>,
}

/// The sums over every run of every case.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Totals {
    pub runs: usize,
    pub passed: usize,
    pub grounded: usize,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub tool_calls: u64,
    pub cost: Option<f64>,
}

impl Totals {
    pub fn accuracy(&self) -> f64 {
        ratio(self.passed, self.runs)
    }

    pub fn grounded_rate(&self) -> f64 {
        ratio(self.grounded, self.runs)
    }
}

fn ratio(n: usize, of: usize) -> f64 {
    if of == 0 { 0.0 } else { n as f64 / of as f64 }
}

impl Report<'_> {
    pub fn totals(&self) -> Totals {
        let all = || self.cases.iter().flat_map(|c| c.runs.iter());
        Totals {
            runs: all().count(),
            passed: all().filter(|r| r.pass).count(),
            grounded: all().filter(|r| r.grounded == Some(true)).count(),
            prompt_tokens: all().map(|r| r.prompt_tokens).sum(),
            completion_tokens: all().map(|r| r.completion_tokens).sum(),
            tool_calls: all().map(|r| u64::from(r.tool_calls)).sum(),
            cost: self.priced.then(|| all().filter_map(|r| r.cost).sum()),
        }
    }

    /// Whether accuracy reaches `min_accuracy` (always, without one).
    pub fn ok(&self) -> bool {
        self.min_accuracy
            .is_none_or(|min| self.totals().accuracy() >= min)
    }

    /// The table a person reads (Markdown: it renders in a CI summary as it is).
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let model = self
            .model
            .as_deref()
            .map(|m| format!(", model `{m}`"))
            .unwrap_or_default();
        let runs = if self.runs > 1 {
            format!(", {} runs per case", self.runs)
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "## Eval `{}`: agent `{}`{model}{runs}\n",
            self.suite.name, self.agent
        );
        let _ = writeln!(
            out,
            "| case | result | expected | got | grounded | tokens in | tokens out | tool calls | seconds |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---:|---:|---:|---:|");
        for c in &self.cases {
            let n = c.runs.len().max(1) as f64;
            let result = if self.runs == 1 {
                match c.runs.first() {
                    Some(r) if r.pass => "pass".to_owned(),
                    Some(r) => match &r.stopped {
                        Some(s) => format!("**FAIL** ({s})"),
                        None => "**FAIL**".to_owned(),
                    },
                    None => "-".to_owned(),
                }
            } else if c.passed() == c.runs.len() {
                format!("{}/{}", c.passed(), c.runs.len())
            } else {
                format!("**{}/{}**", c.passed(), c.runs.len())
            };
            let grounded = if self.runs == 1 {
                match c.runs.first().and_then(|r| r.grounded) {
                    Some(true) => "yes".to_owned(),
                    Some(false) => "**no**".to_owned(),
                    None => "-".to_owned(),
                }
            } else {
                format!("{}/{}", c.grounded(), c.runs.len())
            };
            // The last failing run's, else the last run's.
            let got = c
                .runs
                .iter()
                .rev()
                .find(|r| !r.pass)
                .or(c.runs.last())
                .map(|r| r.got.clone())
                .unwrap_or_default();
            let mean = |f: &dyn Fn(&RunResult) -> f64| c.runs.iter().map(f).sum::<f64>() / n;
            let _ = writeln!(
                out,
                "| `{}` | {result} | {} | {} | {grounded} | {:.0} | {:.0} | {} | {:.1} |",
                c.case.id,
                cell(&expected_text(&c.expected)),
                cell(&got),
                mean(&|r| r.prompt_tokens as f64),
                mean(&|r| r.completion_tokens as f64),
                trim_mean(mean(&|r| f64::from(r.tool_calls))),
                mean(&|r| r.seconds),
            );
        }
        let t = self.totals();
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "**Accuracy {:.1}%** ({} of {} runs) · grounded {:.1}% · tokens {} in, {} out · {} tool calls · {:.1} s{}",
            100.0 * t.accuracy(),
            t.passed,
            t.runs,
            100.0 * t.grounded_rate(),
            t.prompt_tokens,
            t.completion_tokens,
            t.tool_calls,
            self.seconds,
            t.cost
                .map(|c| format!(" · cost {c:.4}"))
                .unwrap_or_default(),
        );
        if let Some(min) = self.min_accuracy {
            let _ = writeln!(
                out,
                "\n{} the minimum accuracy of {:.1}%",
                if self.ok() { "Meets" } else { "**Under**" },
                100.0 * min
            );
        }
        out
    }

    /// The same as one JSON object.
    pub fn json(&self) -> Value {
        let t = self.totals();
        json!({
            "suite": self.suite.name,
            "file": self.suite.path.display().to_string(),
            "agent": self.agent,
            "model": self.model,
            "runs": self.runs,
            "cases": self.cases.iter().map(|c| json!({
                "id": c.case.id,
                "question": c.case.question,
                "kind": c.case.kind,
                "match": c.case.matching.as_str(),
                "tolerance": c.case.tolerance,
                "expected": c.expected.iter().map(|v| match v {
                    super::suite::Value::Number(n) => json!(n),
                    super::suite::Value::Text(s) => json!(s),
                }).collect::<Vec<_>>(),
                "passed": c.passed(),
                "pass_rate": ratio(c.passed(), c.runs.len()),
                "results": c.runs.iter().map(|r| json!({
                    "run": r.run,
                    "pass": r.pass,
                    "got": r.got,
                    "answer": r.answer,
                    "grounded": r.grounded,
                    "unmatched": r.unmatched,
                    "stopped": r.stopped,
                    "prompt_tokens": r.prompt_tokens,
                    "completion_tokens": r.completion_tokens,
                    "tool_calls": r.tool_calls,
                    "seconds": round3(r.seconds),
                    "cost": r.cost,
                    "session": r.session,
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "totals": {
                "runs": t.runs,
                "passed": t.passed,
                "accuracy": t.accuracy(),
                "grounded": t.grounded,
                "grounded_rate": t.grounded_rate(),
                "prompt_tokens": t.prompt_tokens,
                "completion_tokens": t.completion_tokens,
                "tool_calls": t.tool_calls,
                "seconds": round3(self.seconds),
                "cost": t.cost,
            },
            "min_accuracy": self.min_accuracy,
            "ok": self.ok(),
        })
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// `2` for 2.0, `2.5` for 2.5.
fn trim_mean(x: f64) -> String {
    if x.fract() == 0.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}

fn expected_text(values: &[super::suite::Value]) -> String {
    let shown: Vec<String> = values
        .iter()
        .take(5)
        .map(|v| match v {
            super::suite::Value::Number(n) => fmt_number(*n),
            super::suite::Value::Text(s) => s.clone(),
        })
        .collect();
    let more = if values.len() > 5 { ", …" } else { "" };
    format!("{}{more}", shown.join(", "))
}

/// A table cell: one line, no `|`, at most 60 characters.
fn cell(s: &str) -> String {
    let one: String = s
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|");
    if one.chars().count() > 60 {
        format!("{}…", one.chars().take(59).collect::<String>())
    } else {
        one
    }
}
