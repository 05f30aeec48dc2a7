//! Grounded answers: every number in an answer matched to a value a tool produced in the
//! session (a result's numbers, the numbers and dates inside its strings, the lengths of its
//! lists, row counts, statistics) or one the person wrote.
//!
//! A claim matches when it equals such a value as it would be shown: rounded to the
//! decimals written (`1,234.5`), abbreviated (`1.2M`, `12.3K`, `3 billion`), rounded to its
//! trailing zeros (`211,000` for 211,258.49), without its sign (`lost 211,258.49`), as a
//! percent of a fraction (`12.3%` for 0.123) or as written. Dates (`2025-03-01`,
//! `March 1, 2025`) must appear among the values' dates. What it cannot catch: a number
//! that equals some unrelated value of the session, and small counts (integers up to 10
//! without a unit, which are mostly list positions and counts of things shown).

use std::collections::HashSet;
use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::message::{Message, Role};

/// How an answer's numbers held up: kept with the assistant message that gave it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Grounding {
    /// The numbers and dates of the answer that match nothing, as written.
    #[serde(default)]
    pub unmatched: Vec<String>,
    /// This answer was a draft: the model was shown `unmatched` and asked to answer again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub asked_again: bool,
}

impl Grounding {
    /// Every number of the answer matched a value.
    pub fn grounded(&self) -> bool {
        self.unmatched.is_empty()
    }
}

/// Unmatched claims named, at most.
pub const MAX_UNMATCHED: usize = 10;
/// Integers up to this, written without decimals, unit or separator, are not checked.
const SMALL: f64 = 10.0;

/// An ISO date (with an optional time), or a date with its month spelled out. (Patterns
/// without Unicode classes: the boundaries are checked by hand.)
static DATES: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?x)
        (?P<iso>[0-9]{4}-[0-9]{2}-[0-9]{2})(?:[T\ ][0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:\.[0-9]+)?)?Z?)?
        | (?P<m1>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.?\ (?P<d1>[0-9]{1,2}),?\ (?P<y1>[0-9]{4})
        | (?P<d2>[0-9]{1,2})\ (?P<m2>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.?,?\ (?P<y2>[0-9]{4})",
    )
    .unwrap_or_else(|e| unreachable!("the date pattern: {e}"))
});

/// A number as people write one: a sign, a currency, thousands separators, decimals, and
/// a percent or a scale after it (a scale glued to a longer word is refused by the check
/// after the match).
static NUMBERS: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?x)
        (?P<sign>[-−+])?
        (?P<cur>[$€£¥])?
        (?P<num>[0-9]{1,3}(?:[,\u{202F}\u{00A0}][0-9]{3})+(?:\.[0-9]+)?|[0-9]+(?:\.[0-9]+)?|\.[0-9]+)
        (?P<suf>\ ?(?:%|percent|pp|bn|mn|million|billion|thousand|[kKMB]))?",
    )
    .unwrap_or_else(|e| unreachable!("the number pattern: {e}"))
});

/// Fenced code blocks and inline code: what the answer quotes, not what it claims.
static CODE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?s)```.*?(?:```|\z)|`[^`\n]*`")
        .unwrap_or_else(|e| unreachable!("the code pattern: {e}"))
});

/// One number of an answer.
#[derive(Debug, Clone, PartialEq)]
struct Claim {
    /// As written, trimmed.
    text: String,
    value: f64,
    /// How far from `value` a source value may be and still read as it.
    tolerance: f64,
    percent: bool,
    /// A bare integer that may be a year.
    year: bool,
    /// A bare small integer, not checked.
    small: bool,
}

/// What the session's tools produced and the person wrote.
#[derive(Debug, Default)]
struct Known {
    numbers: Vec<f64>,
    dates: HashSet<String>,
}

impl Known {
    fn add_text(&mut self, text: &str) {
        let (claims, dates) = scan(text);
        self.dates.extend(dates);
        self.numbers.extend(claims.iter().map(|c| c.value));
    }

    fn add_json(&mut self, v: &Value) {
        match v {
            Value::Number(n) => self.numbers.extend(n.as_f64()),
            Value::String(s) => {
                // The common cells first, without a pattern: a date, a number.
                let b = s.as_bytes();
                if b.len() == 10
                    && b[4] == b'-'
                    && b[7] == b'-'
                    && s.bytes().filter(u8::is_ascii_digit).count() == 8
                {
                    self.dates.insert(s.clone());
                } else if let Ok(n) = s.trim().parse::<f64>() {
                    self.numbers.push(n);
                } else {
                    self.add_text(s);
                }
            }
            Value::Array(items) => {
                self.numbers.push(items.len() as f64);
                for i in items {
                    self.add_json(i);
                }
            }
            Value::Object(map) => {
                self.numbers.push(map.len() as f64);
                for (k, v) in map {
                    // A key names (`2025Q3`, `2025-12-01`): its dates count, its digits
                    // are a name's.
                    if k.bytes().any(|b| b.is_ascii_digit()) {
                        self.add_text(k);
                    }
                    self.add_json(v);
                }
            }
            Value::Bool(_) | Value::Null => {}
        }
    }

    /// A tool's observation: its JSON (whole, or its first line before the lines naming
    /// the files it made, whose text is read too), else every number and date in its text.
    fn add_observation(&mut self, text: &str) {
        if let Ok(v) = serde_json::from_str::<Value>(text) {
            return self.add_json(&v);
        }
        let (first, rest) = text.split_once('\n').unwrap_or((text, ""));
        match serde_json::from_str::<Value>(first) {
            Ok(v) => {
                self.add_json(&v);
                self.add_text(rest);
            }
            Err(_) => self.add_text(text),
        }
    }

    fn matches(&self, c: &Claim) -> bool {
        let close = |v: f64| (c.value - v).abs() <= c.tolerance + 1e-9 * v.abs().max(1.0);
        self.numbers.iter().any(|&v| {
            close(v)
                || close(v.abs())
                || (c.percent && (close(v * 100.0) || close(v.abs() * 100.0)))
        }) || (c.year && self.dates.iter().any(|d| d.starts_with(&c.text)))
    }
}

/// The claims of `text` and its dates (as `YYYY-MM-DD`), code left out.
fn scan(text: &str) -> (Vec<Claim>, Vec<String>) {
    // Most strings of a result (names, categories, keys) hold no digit at all.
    if !text.bytes().any(|b| b.is_ascii_digit()) {
        return (Vec::new(), Vec::new());
    }
    let text = if text.contains('`') {
        CODE.replace_all(text, " ")
    } else {
        std::borrow::Cow::Borrowed(text)
    };
    let mut dates = Vec::new();
    let mut blanked = text.to_string();
    for m in DATES.captures_iter(&text) {
        let Some(whole) = m.get(0) else { continue };
        let glued_before = text[..whole.start()]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_');
        let glued_after = text[whole.end()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_alphanumeric() || c == '_');
        if glued_before || glued_after {
            continue;
        }
        let iso = if let Some(iso) = m.name("iso") {
            Some(iso.as_str().to_owned())
        } else {
            let (mo, d, y) = match (m.name("m1"), m.name("d1"), m.name("y1")) {
                (Some(mo), Some(d), Some(y)) => (mo, d, y),
                _ => match (m.name("m2"), m.name("d2"), m.name("y2")) {
                    (Some(mo), Some(d), Some(y)) => (mo, d, y),
                    _ => continue,
                },
            };
            month(mo.as_str())
                .zip(d.as_str().parse::<u32>().ok())
                .map(|(mo, d)| format!("{}-{mo:02}-{d:02}", y.as_str()))
        };
        dates.extend(iso);
        // The date's digits are not numbers of their own.
        blanked.replace_range(whole.range(), &" ".repeat(whole.len()));
    }
    let bytes = blanked.as_bytes();
    let mut claims = Vec::new();
    for m in NUMBERS.captures_iter(&blanked) {
        let (Some(whole), Some(num)) = (m.get(0), m.name("num")) else {
            continue;
        };
        let start = whole.start();
        let before = blanked[..start].chars().next_back();
        let sign = m.name("sign");
        // A number glued to a word, a path or another number is part of a name
        // (`Q3`, `qoq-delta-2.csv`, `3.11.2`); a sign after a word is a hyphen.
        if before.is_some_and(|c| c.is_alphanumeric() || matches!(c, '_' | '.' | '/' | '\\')) {
            continue;
        }
        let after = &blanked[whole.end()..];
        let mut rest = after.chars();
        match rest.next() {
            Some(c) if c.is_alphanumeric() || c == '_' => continue,
            Some('.' | '/' | '-') if rest.next().is_some_and(|c| c.is_alphanumeric()) => {
                continue;
            }
            _ => {}
        }
        let negative = sign.is_some_and(|s| s.as_str() != "+")
            // `5-10`: a range, not minus ten.
            && !start.checked_sub(1).is_some_and(|i| bytes[i].is_ascii_digit());
        let digits: String = num
            .as_str()
            .chars()
            .filter(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        let Ok(mut value) = digits.parse::<f64>() else {
            continue;
        };
        let decimals = digits.split_once('.').map_or(0, |(_, d)| d.len());
        let suffix = m.name("suf").map(|s| s.as_str().trim()).unwrap_or_default();
        let scale = match suffix {
            "k" | "K" | "thousand" => 1e3,
            "M" | "mn" | "million" => 1e6,
            "B" | "bn" | "billion" => 1e9,
            _ => 1.0,
        };
        let percent = matches!(suffix, "%" | "percent" | "pp");
        let separated = num.as_str().contains([',', '\u{202F}', '\u{00A0}']);
        // Rounded to its trailing zeros (`211,000`) or to its decimals.
        let zeros = if decimals == 0 {
            digits.len() - digits.trim_end_matches('0').len()
        } else {
            0
        };
        let unit = 10f64.powi(zeros as i32 - decimals as i32);
        let plain = decimals == 0 && scale == 1.0 && !percent && m.name("cur").is_none();
        value *= scale;
        if negative {
            value = -value;
        }
        claims.push(Claim {
            text: whole.as_str().trim().to_owned(),
            value,
            tolerance: 0.5 * unit * scale,
            percent,
            year: plain && !separated && (1900.0..=2100.0).contains(&value.abs()),
            small: plain && value.abs() <= SMALL,
        });
    }
    (claims, dates)
}

fn month(name: &str) -> Option<u32> {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    MONTHS
        .iter()
        .position(|m| name.starts_with(m))
        .and_then(|i| u32::try_from(i + 1).ok())
}

/// The numbers and dates of `answer`, as written, that match nothing a tool of `history`
/// produced or the person (or the system prompt) wrote; at most [`MAX_UNMATCHED`].
pub fn unmatched(answer: &str, history: &[Message], system: Option<&str>) -> Vec<String> {
    let (claims, dates) = scan(answer);
    // Most answers hold nothing to check: the session's results are then not read at all.
    if dates.is_empty() && claims.iter().all(|c| c.small) {
        return Vec::new();
    }
    let mut known = Known::default();
    for m in history {
        match m.role {
            Role::Tool => known.add_observation(&m.content),
            Role::User => known.add_text(&m.content),
            Role::System | Role::Assistant => {}
        }
    }
    if let Some(s) = system {
        known.add_text(s);
    }
    let mut out: Vec<String> = Vec::new();
    let mut push = |text: String| {
        if out.len() < MAX_UNMATCHED && !out.contains(&text) {
            out.push(text);
        }
    };
    for c in claims {
        if !c.small && !known.matches(&c) {
            push(c.text);
        }
    }
    for d in dates {
        if !known.dates.contains(&d) {
            push(d);
        }
    }
    out
}

/// Every number written in `text` (code left out), with its percent or scale applied
/// (`1.2M` is 1,200,000; `12.3%` is 12.3): for scoring an answer against an expected value.
pub fn numbers(text: &str) -> Vec<f64> {
    scan(text).0.into_iter().map(|c| c.value).collect()
}

/// What the model is told, once, when its answer holds numbers nothing produced.
pub fn note(unmatched: &[String]) -> String {
    format!(
        "dataref checked the answer above: {} match{} no value a tool returned in this session \
         or the person wrote. Check each against the tool results (compute a derived number \
         with a tool), or say where it comes from; then give the whole answer again.",
        unmatched.join(", "),
        if unmatched.len() == 1 { "es" } else { "" }
    )
}

#[cfg(test)]
mod tests {
    use dataref_tool::OutcomeKind;
    use serde_json::json;

    use super::*;

    fn session(results: &[Value]) -> Vec<Message> {
        let mut h = vec![Message::user(
            "Which product lines lost the most revenue since 2025-01-01? Top 5.",
        )];
        for (i, r) in results.iter().enumerate() {
            h.push(Message::tool(
                format!("c{i}"),
                r.to_string(),
                OutcomeKind::Ok.into(),
            ));
        }
        h
    }

    fn qoq() -> Vec<Message> {
        session(&[
            json!({"dataRef": "data_x", "rows": 48210, "columns": {"date": "date"}}),
            json!({"result": {"from": "2025Q3", "to": "2025Q4", "lost_most": [
                {"line": "Falcon Office Chair", "delta": -211258.49, "pct": -65.2},
                {"line": "Cedar Office Chair", "delta": -185627.19, "pct": -60.1},
                {"line": "Prairie Table Fan", "delta": -84812.79, "share": 0.1234},
            ]}, "outputs": {"qoq": {"dataRef": "data_y", "rows": 300}}}),
            Value::String("{\"path\":\"exports/qoq-delta-2.csv\",\"rows\":300}\nmade `qoq-delta-2.csv` for the person: dataref://files/exports/qoq-delta-2.csv".into()),
        ])
    }

    #[test]
    fn the_canonical_answer_and_its_rounded_forms_are_grounded() {
        let h = qoq();
        for answer in [
            "From 2025Q3 to 2025Q4 these lost the most:\n- Falcon Office Chair: -211258.49 (-65.2%)\n- Cedar Office Chair: −185,627.19 (−60.1%)\n\nThe file: exports/qoq-delta-2.csv (300 rows).",
            "Falcon Office Chair lost $211,258.49, about 65% of its revenue.",
            "Falcon lost 211.3K; Cedar lost $185.6k; Prairie Table Fan lost 0.08M.",
            "Falcon lost roughly 211,000 and Cedar about 190,000 — out of 48,210 rows.",
            "Prairie Table Fan is 12.3% of the loss (0.1234 as a fraction).",
            "Of the 3 lines listed, 2 are chairs; see `SELECT sum(x) FROM t WHERE id = 99123`.",
            "Since January 1, 2025, the 5 lines below lost the most.",
            "```\nrevenue 99999.99\n```\nSee the table above.",
        ] {
            assert_eq!(
                unmatched(answer, &h, None),
                Vec::<String>::new(),
                "{answer}"
            );
        }
    }

    #[test]
    fn every_planted_number_is_flagged() {
        let h = qoq();
        let cases: &[(&str, &[&str])] = &[
            (
                "Falcon Office Chair lost 211,358.49 (-65.2%).",
                &["211,358.49"],
            ),
            ("Cedar lost 185,627.91.", &["185,627.91"]),
            ("The loss was 1.2M in total.", &["1.2M"]),
            ("Falcon's share was 34%.", &["34%"]),
            ("It fell by $12,345.", &["$12,345"]),
            ("That is 48,211 rows.", &["48,211"]),
            ("Sales peaked on 2025-07-14.", &["2025-07-14"]),
            ("Sales peaked on March 3, 2025.", &["2025-03-03"]),
            ("Compared with 2023, it fell.", &["2023"]),
            ("Revenue: 211,258.49 then 17 and 42.5.", &["17", "42.5"]),
        ];
        for (answer, planted) in cases {
            assert_eq!(&unmatched(answer, &h, None), planted, "{answer}");
        }
    }

    #[test]
    fn names_paths_and_versions_are_not_numbers() {
        let h = session(&[]);
        for answer in [
            "See exports/qoq-delta-2.csv and charts/a-123.png, data_AbC123.",
            "Python 3.11.2 with pandas; Q3 and 2025Q4; the 1st and 22nd lines; item-42.",
            "Ranges like 5-10 are fine: only small numbers.",
        ] {
            assert_eq!(
                unmatched(answer, &h, None),
                Vec::<String>::new(),
                "{answer}"
            );
        }
    }

    #[test]
    fn the_persons_numbers_and_the_prompts_date_are_allowed() {
        let h = vec![Message::user("What if prices rose by 7.5% from 1,250?")];
        assert!(unmatched("A 7.5% rise on 1,250 gives about that.", &h, None).is_empty());
        assert_eq!(unmatched("Today is 2026-12-07.", &h, None), ["2026-12-07"]);
        assert!(unmatched("Today is 2026-12-07.", &h, Some("Today is 2026-12-07.")).is_empty());
    }

    #[test]
    fn at_most_ten_are_named_once_each() {
        let h = session(&[]);
        let answer: Vec<String> = (0..30).map(|i| format!("{}.5", 100 + i % 15)).collect();
        let got = unmatched(&answer.join(", "), &h, None);
        assert_eq!(got.len(), MAX_UNMATCHED);
        assert_eq!(got[0], "100.5");
        assert!(note(&got).contains("100.5, 101.5"));
    }
}
