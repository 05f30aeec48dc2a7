//! A small glob matcher for listings: `*`, `?`, `**`, `[abc]`, `[a-z]`, `[!abc]`, `\x`.
//!
//! Matching is by path segments and runs in polynomial time (dynamic programming, no
//! backtracking), so a pattern like `**/**/**/x` cannot blow up on a deep tree.

use std::fmt;

/// Longest glob pattern accepted, in bytes. Matching costs pattern length times name
/// length for every entry scanned, so the pattern is bounded like the scan is.
pub const MAX_GLOB_BYTES: usize = 512;

/// Why a glob pattern was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GlobError {
    #[error("the glob pattern is {bytes} bytes long; the limit is {MAX_GLOB_BYTES} bytes")]
    TooLong { bytes: usize },
}

impl GlobError {
    /// What the model should do next.
    pub fn hint(&self) -> Option<String> {
        match self {
            Self::TooLong { .. } => Some(
                "use a shorter pattern, e.g. `**/*.csv`, and filter further by reading the list"
                    .into(),
            ),
        }
    }
}

/// A compiled glob pattern, matched against `/`-separated relative paths.
///
/// - `*` matches any run of characters within one name (including none, and leading dots);
/// - `?` matches one character within a name;
/// - `**` as a whole segment matches any number of directories, including none
///   (`**/*.csv` matches `a.csv` and `x/y/a.csv`); elsewhere it is the same as `*`;
/// - `[abc]`, `[a-z]`, `[!a-z]` (or `[^a-z]`) match one character of (not of) the set;
///   a `]` right after the opening `[` (or `[!`) is part of the set;
/// - `\` makes the next character literal.
///
/// Any pattern up to [`MAX_GLOB_BYTES`] is valid: an unclosed `[` matches itself.
/// Matching is case-sensitive.
#[derive(Clone, PartialEq, Eq)]
pub struct Glob {
    pattern: String,
    segments: Vec<Segment>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    AnyDirs,
    Name(Vec<Token>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Literal(char),
    AnyChar,
    Star,
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

impl Glob {
    pub fn new(pattern: &str) -> Result<Self, GlobError> {
        if pattern.len() > MAX_GLOB_BYTES {
            return Err(GlobError::TooLong {
                bytes: pattern.len(),
            });
        }
        let segments = pattern
            .split('/')
            .filter(|s| !s.is_empty() && *s != ".")
            .map(|s| {
                if s == "**" {
                    Segment::AnyDirs
                } else {
                    Segment::Name(tokens(s))
                }
            })
            .collect();
        Ok(Self {
            pattern: pattern.to_owned(),
            segments,
        })
    }

    /// The pattern as given.
    pub fn as_str(&self) -> &str {
        &self.pattern
    }

    /// Whether `path` (relative, `/`-separated) matches the whole pattern.
    pub fn matches(&self, path: &str) -> bool {
        let names: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let n = names.len();
        // next[j]: segments[i + 1..] match names[j..]; row[j]: segments[i..] match names[j..].
        let mut next = vec![false; n + 1];
        next[n] = true;
        for segment in self.segments.iter().rev() {
            let mut row = vec![false; n + 1];
            for j in (0..=n).rev() {
                row[j] = match segment {
                    Segment::AnyDirs => next[j] || (j < n && row[j + 1]),
                    Segment::Name(tokens) => {
                        j < n
                            && next[j + 1]
                            && names.get(j).is_some_and(|name| matches_name(tokens, name))
                    }
                };
            }
            next = row;
        }
        next[0]
    }
}

impl fmt::Debug for Glob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Glob({:?})", self.pattern)
    }
}

impl fmt::Display for Glob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.pattern)
    }
}

fn tokens(segment: &str) -> Vec<Token> {
    let chars: Vec<char> = segment.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(&c) = chars.get(i) {
        i += 1;
        match c {
            '*' => {
                if out.last() != Some(&Token::Star) {
                    out.push(Token::Star);
                }
            }
            '?' => out.push(Token::AnyChar),
            '\\' => match chars.get(i) {
                Some(&next) => {
                    out.push(Token::Literal(next));
                    i += 1;
                }
                None => out.push(Token::Literal('\\')),
            },
            '[' => match class(&chars, i) {
                Some((token, end)) => {
                    out.push(token);
                    i = end;
                }
                None => out.push(Token::Literal('[')),
            },
            c => out.push(Token::Literal(c)),
        }
    }
    out
}

/// Parses a class starting just after `[`; returns it and the index after its `]`.
fn class(chars: &[char], start: usize) -> Option<(Token, usize)> {
    let mut i = start;
    let negated = matches!(chars.get(i), Some('!' | '^'));
    if negated {
        i += 1;
    }
    let mut ranges = Vec::new();
    let mut first = true;
    loop {
        let c = *chars.get(i)?;
        if c == ']' && !first {
            return Some((Token::Class { negated, ranges }, i + 1));
        }
        first = false;
        if chars.get(i + 1) == Some(&'-') && chars.get(i + 2).is_some_and(|&e| e != ']') {
            let end = *chars.get(i + 2)?;
            ranges.push((c, end));
            i += 3;
        } else {
            ranges.push((c, c));
            i += 1;
        }
    }
}

fn matches_name(tokens: &[Token], name: &str) -> bool {
    let chars: Vec<char> = name.chars().collect();
    let n = chars.len();
    // next[j]: tokens[k + 1..] match chars[j..]; row[j]: tokens[k..] match chars[j..].
    let mut next = vec![false; n + 1];
    next[n] = true;
    for token in tokens.iter().rev() {
        let mut row = vec![false; n + 1];
        for j in (0..=n).rev() {
            let one =
                |pred: &dyn Fn(char) -> bool| chars.get(j).is_some_and(|&c| pred(c)) && next[j + 1];
            row[j] = match token {
                Token::Star => next[j] || (j < n && row[j + 1]),
                Token::AnyChar => one(&|_| true),
                Token::Literal(l) => one(&|c| c == *l),
                Token::Class { negated, ranges } => {
                    one(&|c| ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != *negated)
                }
            };
        }
        next = row;
    }
    next[0]
}

#[cfg(test)]
mod tests {
    use super::{Glob, GlobError};

    fn m(pattern: &str, path: &str) -> bool {
        Glob::new(pattern).unwrap().matches(path)
    }

    #[test]
    fn star_and_question_stay_in_one_name() {
        assert!(m("*.csv", "a.csv"));
        assert!(m("*.csv", ".csv"));
        assert!(!m("*.csv", "d/a.csv"));
        assert!(m("a?c", "abc"));
        assert!(!m("a?c", "a/c"));
        assert!(!m("a?c", "ac"));
        assert!(m("*", "anything"));
        assert!(!m("*", "a/b"));
        assert!(m("d/*.csv", "d/a.csv"));
        assert!(m("a*b*c", "aXXbYYc"));
        assert!(!m("a*b*c", "aXXbYY"));
    }

    #[test]
    fn double_star_spans_directories() {
        assert!(m("**/*.csv", "a.csv"));
        assert!(m("**/*.csv", "x/y/a.csv"));
        assert!(!m("**/*.csv", "x/y/a.txt"));
        assert!(m("x/**", "x/y/z"));
        assert!(m("x/**", "x"));
        assert!(m("x/**/z", "x/z"));
        assert!(m("x/**/z", "x/a/b/z"));
        assert!(!m("x/**/z", "y/a/z"));
        assert!(m("**", "a/b/c"));
        // Not a whole segment: the same as `*`.
        assert!(m("a**b", "aXb"));
        assert!(!m("a**b", "a/b"));
    }

    #[test]
    fn classes() {
        assert!(m("[abc].txt", "b.txt"));
        assert!(!m("[abc].txt", "d.txt"));
        assert!(m("[a-c]x", "bx"));
        assert!(!m("[!a-c]x", "bx"));
        assert!(m("[^a-c]x", "dx"));
        assert!(m("[]]", "]"));
        assert!(m("[a-]", "-"));
        // Unclosed: literal.
        assert!(m("[ab", "[ab"));
        assert!(m(r"\*", "*"));
        assert!(!m(r"\*", "x"));
    }

    #[test]
    fn many_double_stars_stay_fast() {
        let path = vec!["d"; 200].join("/");
        let pattern = format!("{}x", "**/".repeat(50));
        assert!(!m(&pattern, &path));
        assert!(m("**/*d*d*d*d*d*d*d*d*d*d*d*d*d*", &"d".repeat(300)));
    }

    #[test]
    fn overlong_patterns_are_refused() {
        let err = Glob::new(&"*".repeat(513)).unwrap_err();
        assert_eq!(err, GlobError::TooLong { bytes: 513 });
        assert!(err.hint().is_some());
        assert!(Glob::new(&"*".repeat(512)).is_ok());
    }

    #[test]
    fn unicode_names() {
        assert!(m("보고서*.xlsx", "보고서-2025.xlsx"));
        assert!(m("?.txt", "я.txt"));
    }
}
