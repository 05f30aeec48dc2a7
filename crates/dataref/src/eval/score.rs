//! An answer held against a case's expected values.
//!
//! Numbers are read from the answer as the grounding check reads them
//! ([`dataref_agent::ground::numbers`]: `1,234.5`, `12.3%`, `1.2M`; code left out). A number
//! matches an expected one when it is within the relative tolerance of it, or of it × 100 (a
//! share asked for and answered as a percent), or when it is the expected value rounded to
//! the decimals it shows (`3.4%` for 0.0342) with two significant digits at least. Signs
//! are not compared (`lost 211,258.49` answers −211,258.49). Names match as whole words,
//! ignoring case and runs of spaces.

use super::suite::{Match, Value};

/// How one answer scored.
#[derive(Debug, Clone, PartialEq)]
pub struct Score {
    pub pass: bool,
    /// What was found (the matching number, what is missing), for the report.
    pub got: String,
}

/// Scores `answer` against `expected` with `matching` and relative `tolerance`.
pub fn score(answer: &str, expected: &[Value], matching: Match, tolerance: f64) -> Score {
    let numbers = dataref_agent::ground::numbers(answer);
    let text = normalize(answer);
    // Where each expected value is first found at or after `from` (byte offsets for names,
    // indices into `numbers` for numbers: one kind per list).
    let find = |v: &Value, from: usize| -> Option<usize> {
        match v {
            Value::Number(want) => numbers
                .iter()
                .enumerate()
                .skip(from)
                .find(|(_, got)| close(**got, *want, tolerance))
                .map(|(i, _)| i),
            Value::Text(name) => find_word(&text, &normalize(name), from),
        }
    };
    match matching {
        Match::Number | Match::Text => {
            let Some(want) = expected.first() else {
                return fail("nothing expected");
            };
            match (find(want, 0), want) {
                (Some(i), Value::Number(_)) => pass(&fmt_number(numbers[i])),
                (Some(_), Value::Text(t)) => pass(t),
                (None, Value::Number(_)) if numbers.is_empty() => fail("no number"),
                (None, Value::Number(_)) => {
                    let shown: Vec<String> =
                        numbers.iter().take(6).map(|n| fmt_number(*n)).collect();
                    let more = if numbers.len() > 6 { ", …" } else { "" };
                    fail(&format!("{}{more}", shown.join(", ")))
                }
                (None, Value::Text(_)) => fail("not named"),
            }
        }
        Match::Set | Match::Ordered => {
            let missing: Vec<String> = expected
                .iter()
                .filter(|v| find(v, 0).is_none())
                .map(show)
                .collect();
            if !missing.is_empty() {
                return fail(&format!("missing {}", missing.join(", ")));
            }
            if matching == Match::Set {
                return pass(&format!("all {} named", expected.len()));
            }
            // Each after the one before: the earliest such placing exists if any does.
            let mut from = 0;
            for (k, v) in expected.iter().enumerate() {
                match find(v, from) {
                    Some(at) => from = at + 1,
                    None => {
                        return fail(&format!(
                            "all named, {} not after {}",
                            show(v),
                            expected
                                .get(k.wrapping_sub(1))
                                .map(show)
                                .unwrap_or_default()
                        ));
                    }
                }
            }
            pass(&format!("all {} in order", expected.len()))
        }
    }
}

fn pass(got: &str) -> Score {
    Score {
        pass: true,
        got: got.to_owned(),
    }
}

fn fail(got: &str) -> Score {
    Score {
        pass: false,
        got: got.to_owned(),
    }
}

/// `got` (as read from an answer) is `want`, within `tolerance`, as a percent, or rounded.
pub fn close(got: f64, want: f64, tolerance: f64) -> bool {
    let g = got.abs();
    [want.abs(), want.abs() * 100.0]
        .into_iter()
        .any(|w| (g - w).abs() <= tolerance * w + 1e-9 * w.max(1.0) || rounded_as_shown(g, w))
}

/// `g` is `w` rounded to the decimals `g` shows (up to 6), keeping two significant digits.
fn rounded_as_shown(g: f64, w: f64) -> bool {
    let Some(decimals) = (0..=6).find(|&d| {
        let scaled = g * 10f64.powi(d);
        (scaled - scaled.round()).abs() < 1e-6 * scaled.abs().max(1.0)
    }) else {
        return false;
    };
    let unit = 10f64.powi(decimals);
    g >= 10.0 / unit && ((w * unit).round() - (g * unit).round()).abs() < 0.5
}

/// Lower case, every run of whitespace one space.
fn normalize(s: &str) -> String {
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

/// The first occurrence of `needle` at or after byte `from` that is a whole word (neither
/// end glued to a letter or digit).
fn find_word(hay: &str, needle: &str, from: usize) -> Option<usize> {
    if needle.is_empty() {
        return None;
    }
    let mut start = from;
    while let Some(i) = hay.get(start..).and_then(|rest| rest.find(needle)) {
        let at = start + i;
        let end = at + needle.len();
        let glued = |c: Option<char>| c.is_some_and(char::is_alphanumeric);
        if !glued(hay[..at].chars().next_back()) && !glued(hay[end..].chars().next()) {
            return Some(at);
        }
        start = at + hay[at..].chars().next().map_or(1, char::len_utf8);
    }
    None
}

fn show(v: &Value) -> String {
    match v {
        Value::Number(n) => fmt_number(*n),
        Value::Text(t) => t.clone(),
    }
}

/// A number for the report: thousands separated, two decimals (four significant digits
/// below 1), trailing zeros dropped.
pub fn fmt_number(n: f64) -> String {
    let abs = n.abs();
    let decimals = if abs != 0.0 && abs < 1.0 {
        (3 - abs.log10().floor() as i32).clamp(2, 10) as usize
    } else {
        2
    };
    let s = format!("{abs:.decimals$}");
    let (int, frac) = s.split_once('.').unwrap_or((&s, ""));
    let frac = frac.trim_end_matches('0');
    let mut grouped = String::new();
    for (i, c) in int.chars().enumerate() {
        if i > 0 && (int.len() - i).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(c);
    }
    let sign = if n < 0.0 && s.chars().any(|c| matches!(c, '1'..='9')) {
        "-"
    } else {
        ""
    };
    if frac.is_empty() {
        format!("{sign}{grouped}")
    } else {
        format!("{sign}{grouped}.{frac}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(x: f64) -> Vec<Value> {
        vec![Value::Number(x)]
    }

    fn names(xs: &[&str]) -> Vec<Value> {
        xs.iter().map(|x| Value::Text((*x).to_owned())).collect()
    }

    #[test]
    fn numbers_within_tolerance_as_percent_or_rounded() {
        let t = 0.005;
        for (answer, want) in [
            ("Q4 revenue was 12,421,073.90.", 12_421_073.9),
            ("About 12.4M in Q4.", 12_421_073.9),
            ("Revenue fell by 32,988.57 (a loss).", -32_988.57),
            ("EMEA brought 27.79% of revenue.", 0.277_874_6),
            ("EMEA brought 27.8% of revenue.", 0.277_874_6),
            ("Growth was 2.4%.", 0.024_108),
            ("The share is 0.2779.", 0.277_874_6),
            ("7,009 order lines.", 7_009.0),
            ("Average 13.73 units.", 13.732_856),
        ] {
            let s = score(answer, &n(want), Match::Number, t);
            assert!(s.pass, "{answer} for {want}: {s:?}");
        }
        for (answer, want) in [
            ("About 12M in Q4.", 12_421_073.9),
            ("7,100 order lines.", 7_009.0),
            ("Growth was 2%.", 0.024_108),
            ("The value is 1.", 0.5),
            ("Nothing to say.", 3.0),
            ("Use `SELECT 27.79`.", 0.277_874_6),
        ] {
            let s = score(answer, &n(want), Match::Number, t);
            assert!(!s.pass, "{answer} for {want}: {s:?}");
        }
        assert_eq!(
            score("About 12M.", &n(1.0), Match::Number, t).got,
            "12,000,000"
        );
        assert_eq!(score("none", &n(1.0), Match::Number, t).got, "no number");
    }

    #[test]
    fn names_as_sets_in_order_and_alone() {
        let top = names(&[
            "Falcon Office Chair",
            "Cedar Office Chair",
            "Prairie Table Fan",
        ]);
        let listed = "1. **Falcon Office Chair** (−211,258.49)\n2. Cedar  office chair\n3. Prairie Table Fan";
        assert!(score(listed, &top, Match::Ordered, 0.0).pass);
        assert!(score(listed, &top, Match::Set, 0.0).pass);
        let swapped = "Cedar Office Chair, then Falcon Office Chair, then Prairie Table Fan";
        assert!(score(swapped, &top, Match::Set, 0.0).pass);
        let s = score(swapped, &top, Match::Ordered, 0.0);
        assert!(!s.pass);
        assert_eq!(
            s.got,
            "all named, Cedar Office Chair not after Falcon Office Chair"
        );
        // Mentioned out of order first, then listed in order: the list counts.
        let both = format!("{swapped}. In order: {listed}");
        assert!(score(&both, &top, Match::Ordered, 0.0).pass);
        let s = score("Falcon Office Chair only", &top, Match::Set, 0.0);
        assert_eq!(s.got, "missing Cedar Office Chair, Prairie Table Fan");
        // Whole words only.
        assert!(!score("EMEAX led", &names(&["EMEA"]), Match::Text, 0.0).pass);
        assert!(score("It was August.", &names(&["August"]), Match::Text, 0.0).pass);
        // Numbers in order.
        let nums = vec![Value::Number(3.0e6), Value::Number(2.0e6)];
        assert!(score("3,000,000 then 2,000,000", &nums, Match::Ordered, 0.0).pass);
        assert!(!score("2,000,000 then 3,000,000", &nums, Match::Ordered, 0.0).pass);
    }

    #[test]
    fn report_numbers() {
        assert_eq!(fmt_number(49_118_471.05), "49,118,471.05");
        assert_eq!(fmt_number(-211_258.49), "-211,258.49");
        assert_eq!(fmt_number(0.277_874_6), "0.2779");
        assert_eq!(fmt_number(7_009.0), "7,009");
        assert_eq!(fmt_number(0.0), "0");
    }
}
