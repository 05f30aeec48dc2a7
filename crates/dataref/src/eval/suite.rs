//! An eval suite's file: `[suite]` and its `[[case]]`s, parsed strictly (an unknown key is
//! an error naming its line) and checked before anything runs.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use serde::Deserialize;
use toml::Spanned;

/// 0.5% of the expected value.
pub const DEFAULT_TOLERANCE: f64 = 0.005;
/// The source a case's SQL runs on when neither the case nor `[suite]` names one.
pub const DEFAULT_SOURCE: &str = "sample";
/// The most values a case may expect (the rows of its SQL's first column).
pub const MAX_EXPECTED: usize = 100;

/// How an answer is held against the expected values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Match {
    /// Some number of the answer is within the tolerance of the expected number.
    Number,
    /// Every expected value is named in the answer, in any order.
    Set,
    /// Every expected value is named in the answer, in the expected order.
    Ordered,
    /// The expected value (a name, a word) is in the answer.
    Text,
}

impl Match {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Number => "number",
            Self::Set => "set",
            Self::Ordered => "ordered",
            Self::Text => "text",
        }
    }
}

/// One expected value: a cell of the case's SQL, or a literal of the file.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Number(f64),
    Text(String),
}

/// Where a case's expected values come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Expected {
    /// Computed when the eval starts: `sql` on `source`, read-only.
    Sql { source: String, sql: String },
    /// Written in the file.
    Literal(Vec<Value>),
}

/// One question and how its answer is scored.
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    pub id: String,
    pub question: String,
    /// What the case exercises (`top-k`, `join`, …): reported, never scored.
    pub kind: Option<String>,
    pub matching: Match,
    /// Relative to the expected value.
    pub tolerance: f64,
    pub expected: Expected,
    /// The line of its `[[case]]` in the file.
    pub line: usize,
}

/// A suite, read and checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Suite {
    pub name: String,
    pub description: Option<String>,
    pub path: PathBuf,
    pub cases: Vec<Case>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    suite: RawSuite,
    #[serde(default)]
    case: Vec<Spanned<RawCase>>,
}

/// `[suite]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSuite {
    name: Option<String>,
    description: Option<String>,
    source: Option<String>,
    tolerance: Option<f64>,
}

/// `[[case]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCase {
    id: String,
    question: String,
    kind: Option<String>,
    source: Option<String>,
    sql: Option<String>,
    expected: Option<toml::Value>,
    #[serde(rename = "match")]
    matching: Option<Match>,
    tolerance: Option<f64>,
}

impl Suite {
    /// Reads and checks the suite at `path`.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            anyhow::anyhow!(
                "cannot read the eval suite `{}`: {e}\nhint: give the path of a suite file, e.g. `dataref eval evals/sample.toml`",
                path.display()
            )
        })?;
        Self::parse(&text, path)
    }

    /// Parses suite text; `path` names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Self> {
        let shown = path.display();
        let raw: RawFile = toml::from_str(text).map_err(|e| {
            anyhow::anyhow!(
                "{shown}: {}\nhint: a suite has `[suite]` (name, description, source, tolerance) and `[[case]]` tables (id, question, sql or expected, match, tolerance, source, kind)",
                e.to_string().trim_end()
            )
        })?;
        let suite_tolerance = match raw.suite.tolerance {
            Some(t) => check_tolerance(t).map_err(|m| {
                anyhow::anyhow!("{shown}: `[suite] tolerance`: {m}\nhint: {TOLERANCE_HINT}")
            })?,
            None => DEFAULT_TOLERANCE,
        };
        let default_source = raw
            .suite
            .source
            .unwrap_or_else(|| DEFAULT_SOURCE.to_owned());
        if raw.case.is_empty() {
            bail!(
                "{shown}: the suite has no cases\nhint: add `[[case]]` tables, each with `id`, `question` and `sql` (the SQL that computes the answer on the source)"
            );
        }
        let mut seen = HashSet::new();
        let mut cases = Vec::with_capacity(raw.case.len());
        for spanned in raw.case {
            let line = line_of(text, spanned.span().start);
            let c = spanned.into_inner();
            let at = format!("{shown}: case `{}` (line {line})", c.id);
            let fail = |message: &str, hint: &str| anyhow::anyhow!("{at}: {message}\nhint: {hint}");
            if c.id.is_empty()
                || !c
                    .id
                    .chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '-' | '_' | '.'))
            {
                return Err(fail(
                    "the id is not a name",
                    "use letters, digits, `-`, `_` and `.`, e.g. `id = \"q4-losers-top5\"`",
                ));
            }
            if !seen.insert(c.id.clone()) {
                return Err(fail(
                    "another case has this id",
                    "give each case an id of its own",
                ));
            }
            if c.question.trim().is_empty() {
                return Err(fail(
                    "the question is empty",
                    "write the question as a person would ask it",
                ));
            }
            let tolerance = match c.tolerance {
                Some(t) => check_tolerance(t).map_err(|m| fail(&m, TOLERANCE_HINT))?,
                None => suite_tolerance,
            };
            let matching = c.matching.unwrap_or(Match::Number);
            let expected = match (c.sql, c.expected) {
                (Some(_), Some(_)) => {
                    return Err(fail(
                        "`sql` and `expected` exclude each other",
                        "keep `sql` (computed on the source when the eval starts) or a literal `expected`",
                    ));
                }
                (None, None) => {
                    return Err(fail(
                        "no expected value",
                        "add `sql = \"SELECT …\"` computing the answer on the source, or `expected = …` (a number, a name, or a list of them)",
                    ));
                }
                (Some(sql), None) if sql.trim().is_empty() => {
                    return Err(fail(
                        "`sql` is empty",
                        "write the SELECT that computes the answer",
                    ));
                }
                (Some(sql), None) => Expected::Sql {
                    source: c.source.unwrap_or_else(|| default_source.clone()),
                    sql,
                },
                (None, Some(v)) => {
                    if c.source.is_some() {
                        return Err(fail(
                            "`source` is for `sql`; this case has a literal `expected`",
                            "leave `source` out, or compute the value with `sql`",
                        ));
                    }
                    let values = literal(v).map_err(|m| {
                        fail(&m, "e.g. `expected = 211258.49`, `expected = \"EMEA\"` or `expected = [\"EMEA\", \"APAC\"]`")
                    })?;
                    check_values(matching, &values).map_err(|(m, h)| fail(&m, &h))?;
                    Expected::Literal(values)
                }
            };
            cases.push(Case {
                id: c.id,
                question: c.question,
                kind: c.kind,
                matching,
                tolerance,
                expected,
                line,
            });
        }
        let name = raw.suite.name.unwrap_or_else(|| {
            path.file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "suite".to_owned())
        });
        Ok(Self {
            name,
            description: raw.suite.description,
            path: path.to_owned(),
            cases,
        })
    }
}

const TOLERANCE_HINT: &str =
    "a relative tolerance from 0 to 1: `0.005` accepts answers within 0.5% of the expected value";

fn check_tolerance(t: f64) -> Result<f64, String> {
    if t.is_finite() && (0.0..1.0).contains(&t) {
        Ok(t)
    } else {
        Err(format!("{t} is not a tolerance"))
    }
}

/// The 1-based line of byte `offset`.
fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset)
        .map_or(0, |before| before.matches('\n').count())
        + 1
}

fn literal(v: toml::Value) -> Result<Vec<Value>, String> {
    let one = |v: toml::Value| match v {
        toml::Value::Integer(i) => Ok(Value::Number(i as f64)),
        toml::Value::Float(f) if f.is_finite() => Ok(Value::Number(f)),
        toml::Value::String(s) if !s.trim().is_empty() => Ok(Value::Text(s)),
        other => Err(format!(
            "`expected` holds {}, not a number or a name",
            other.type_str()
        )),
    };
    match v {
        toml::Value::Array(items) if items.is_empty() => Err("`expected` is empty".to_owned()),
        toml::Value::Array(items) => items.into_iter().map(one).collect(),
        other => Ok(vec![one(other)?]),
    }
}

/// Whether `values` can be scored with `matching`: the message and its hint when not.
pub fn check_values(matching: Match, values: &[Value]) -> Result<(), (String, String)> {
    if values.len() > MAX_EXPECTED {
        return Err((
            format!("{} expected values, more than {MAX_EXPECTED}", values.len()),
            "ask about fewer: a top-k question with `LIMIT`".to_owned(),
        ));
    }
    match matching {
        Match::Number => match values {
            [Value::Number(_)] => Ok(()),
            [Value::Text(t)] => Err((
                format!("`match = \"number\"` expects a number, the value is `{t}`"),
                "use `match = \"text\"` for a name, or select a number".to_owned(),
            )),
            _ => Err((
                format!(
                    "`match = \"number\"` expects one value, there are {}",
                    values.len()
                ),
                "use `match = \"set\"` or `\"ordered\"` for a list".to_owned(),
            )),
        },
        Match::Text if values.len() != 1 => Err((
            format!(
                "`match = \"text\"` expects one value, there are {}",
                values.len()
            ),
            "use `match = \"set\"` or `\"ordered\"` for a list".to_owned(),
        )),
        Match::Text | Match::Set | Match::Ordered => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Suite> {
        Suite::parse(text, Path::new("s.toml"))
    }

    #[test]
    fn a_suite_with_defaults_and_overrides() {
        let s = parse(
            r#"
[suite]
name = "mine"
source = "warehouse"
tolerance = 0.01

[[case]]
id = "a"
question = "How much?"
sql = "SELECT 1"

[[case]]
id = "b"
question = "Which?"
match = "ordered"
expected = ["EMEA", "APAC"]
tolerance = 0
"#,
        )
        .unwrap();
        assert_eq!(s.name, "mine");
        assert_eq!(s.cases[0].matching, Match::Number);
        assert_eq!(s.cases[0].tolerance, 0.01);
        assert_eq!(s.cases[0].line, 7, "the line of `[[case]]`");
        assert_eq!(
            s.cases[0].expected,
            Expected::Sql {
                source: "warehouse".into(),
                sql: "SELECT 1".into()
            }
        );
        assert_eq!(s.cases[1].tolerance, 0.0);
        assert_eq!(
            s.cases[1].expected,
            Expected::Literal(vec![Value::Text("EMEA".into()), Value::Text("APAC".into())])
        );
    }

    #[test]
    fn mistakes_are_named_with_their_line_and_a_hint() {
        for (text, says) in [
            (
                "[[case]]\nid = \"a\"\nquestion = \"q\"\nsql = \"SELECT 1\"\nexpect = 3\n",
                "line 5",
            ),
            (
                "[[case]]\nid = \"a\"\nquestion = \"q\"\nsql = \"SELECT 1\"\nmatch = \"fuzzy\"\n",
                "fuzzy",
            ),
            ("[suite]\nname = \"x\"\n", "no cases"),
            (
                "\n[[case]]\nid = \"a\"\nquestion = \"q\"\n",
                "case `a` (line 2): no expected value",
            ),
            (
                "[[case]]\nid = \"a\"\nquestion = \"q\"\nsql = \"S\"\nexpected = 1\n",
                "exclude each other",
            ),
            (
                "[[case]]\nid = \"a b\"\nquestion = \"q\"\nsql = \"S\"\n",
                "not a name",
            ),
            (
                "[[case]]\nid = \"a\"\nquestion = \"q\"\nsql = \"S\"\ntolerance = 5\n",
                "not a tolerance",
            ),
            (
                "[[case]]\nid = \"a\"\nquestion = \"q\"\nexpected = \"EMEA\"\n",
                "expects a number",
            ),
            (
                "[[case]]\nid = \"a\"\nquestion = \"q\"\nexpected = [1, 2]\n",
                "expects one value",
            ),
            (
                "[[case]]\nid = \"a\"\nquestion = \"q\"\nexpected = true\n",
                "not a number or a name",
            ),
            (
                "[[case]]\nid = \"a\"\nquestion = \"q\"\nsql = \"S\"\n[[case]]\nid = \"a\"\nquestion = \"q\"\nsql = \"S\"\n",
                "(line 5): another case has this id",
            ),
        ] {
            let e = format!("{:#}", parse(text).unwrap_err());
            assert!(e.contains(says), "{text}: {e}");
            assert!(e.contains("hint:"), "{text}: {e}");
            assert!(e.starts_with("s.toml"), "{text}: {e}");
        }
    }
}
