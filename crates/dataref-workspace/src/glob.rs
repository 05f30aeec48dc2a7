//! A small glob matcher for listings: `*`, `?`, `**`, `[abc]`, `[a-z]`, `[!abc]`, `{a,b}`,
//! `\x`.
//!
//! Matching is by path segments and runs in polynomial time (dynamic programming, no
//! backtracking), so a pattern like `**/**/**/x` cannot blow up on a deep tree. Braces are
//! expanded once, when the pattern is compiled, into a bounded number of alternatives.
//!
//! Why not `globset`: its regexes run with Unicode off, so `?` matches one byte rather than
//! one character (`?.txt` would miss `я.txt`), and `x/**` does not match `x` itself.

use std::fmt;

/// Longest glob pattern accepted, in bytes. Matching costs pattern length times name
/// length for every entry scanned, so the pattern is bounded like the scan is.
pub const MAX_GLOB_BYTES: usize = 512;

/// Most alternatives a pattern's braces may expand to (`{a,b}/{c,d}` is four).
pub const MAX_GLOB_ALTERNATIVES: usize = 64;

/// Why a glob pattern was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GlobError {
    #[error("the glob pattern is {bytes} bytes long; the limit is {MAX_GLOB_BYTES} bytes")]
    TooLong { bytes: usize },
    #[error("the glob pattern's braces expand to more than {MAX_GLOB_ALTERNATIVES} alternatives")]
    TooManyAlternatives,
}

impl GlobError {
    /// What the model should do next.
    pub fn hint(&self) -> Option<String> {
        match self {
            Self::TooLong { .. } => Some(
                "use a shorter pattern, e.g. `**/*.csv`, and filter further by reading the list"
                    .into(),
            ),
            Self::TooManyAlternatives => Some(
                "use fewer `{a,b}` groups, e.g. `**/*.{csv,xlsx}`, or list a directory and \
                 filter further by reading the list"
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
/// - `{a,b}` matches either alternative (`*.{csv,xlsx}`, `{data,exports}/**`); braces nest,
///   and expand to at most [`MAX_GLOB_ALTERNATIVES`] patterns;
/// - `\` makes the next character literal.
///
/// Any pattern up to [`MAX_GLOB_BYTES`] is valid: an unclosed `[` matches itself, and so
/// does a `{` without its `}` (or without a `,` inside).
/// Matching is case-sensitive.
#[derive(Clone, PartialEq, Eq)]
pub struct Glob {
    pattern: String,
    /// One list of segments per alternative the braces expand to (one without braces).
    alternatives: Vec<Vec<Segment>>,
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
        let alternatives = expand_braces(pattern)?
            .iter()
            .map(|p| {
                p.split('/')
                    .filter(|s| !s.is_empty() && *s != ".")
                    .map(|s| {
                        if s == "**" {
                            Segment::AnyDirs
                        } else {
                            Segment::Name(tokens(s))
                        }
                    })
                    .collect()
            })
            .collect();
        Ok(Self {
            pattern: pattern.to_owned(),
            alternatives,
        })
    }

    /// The pattern as given.
    pub fn as_str(&self) -> &str {
        &self.pattern
    }

    /// Whether `path` (relative, `/`-separated) matches the whole pattern.
    pub fn matches(&self, path: &str) -> bool {
        let names: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        self.alternatives
            .iter()
            .any(|segments| matches_segments(segments, &names))
    }
}

fn matches_segments(segments: &[Segment], names: &[&str]) -> bool {
    let n = names.len();
    // next[j]: segments[i + 1..] match names[j..]; row[j]: segments[i..] match names[j..].
    let mut next = vec![false; n + 1];
    next[n] = true;
    for segment in segments.iter().rev() {
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

/// The pattern with its braces expanded: one pattern per alternative, in order. Escapes and
/// classes are copied as they are (a `{` inside `[…]` or after `\\` is no brace); a `{`
/// without a matching `}` or without a `,` between them stays a literal `{`.
fn expand_braces(pattern: &str) -> Result<Vec<String>, GlobError> {
    let chars: Vec<char> = pattern.chars().collect();
    expand(&chars)
}

fn expand(chars: &[char]) -> Result<Vec<String>, GlobError> {
    let mut outs = vec![String::new()];
    let push = |outs: &mut Vec<String>, text: &[char]| {
        for o in outs.iter_mut() {
            o.extend(text);
        }
    };
    let mut i = 0;
    while let Some(&c) = chars.get(i) {
        let end = match c {
            '\\' => (i + 2).min(chars.len()),
            '[' => class(chars, i + 1).map_or(i + 1, |(_, end)| end),
            '{' => match brace_end(chars, i) {
                Some((close, commas)) => {
                    let mut alternatives = Vec::new();
                    let mut from = i + 1;
                    for to in commas.into_iter().chain([close]) {
                        alternatives.extend(expand(chars.get(from..to).unwrap_or_default())?);
                        from = to + 1;
                    }
                    if outs.len() * alternatives.len() > MAX_GLOB_ALTERNATIVES {
                        return Err(GlobError::TooManyAlternatives);
                    }
                    outs = outs
                        .iter()
                        .flat_map(|o| alternatives.iter().map(move |a| format!("{o}{a}")))
                        .collect();
                    i = close + 1;
                    continue;
                }
                None => i + 1,
            },
            _ => i + 1,
        };
        push(&mut outs, chars.get(i..end).unwrap_or_default());
        i = end;
    }
    Ok(outs)
}

/// For the `{` at `open`: the index of its `}` and of the `,`s at its own depth, if it is
/// closed and has at least one `,`.
fn brace_end(chars: &[char], open: usize) -> Option<(usize, Vec<usize>)> {
    let mut depth = 0usize;
    let mut commas = Vec::new();
    let mut j = open + 1;
    while let Some(&c) = chars.get(j) {
        match c {
            '\\' => j += 1,
            '[' => {
                if let Some((_, end)) = class(chars, j + 1) {
                    j = end;
                    continue;
                }
            }
            '{' => depth += 1,
            '}' if depth == 0 => return (!commas.is_empty()).then_some((j, commas)),
            '}' => depth -= 1,
            ',' if depth == 0 => commas.push(j),
            _ => {}
        }
        j += 1;
    }
    None
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
    fn braces_give_alternatives() {
        assert!(m("*.{csv,xlsx}", "a.csv"));
        assert!(m("*.{csv,xlsx}", "a.xlsx"));
        assert!(!m("*.{csv,xlsx}", "a.json"));
        assert!(m("**/*.{csv,xlsx}", "exports/q/a.xlsx"));
        assert!(m("{data,exports}/**", "exports/a/b.csv"));
        assert!(!m("{data,exports}/**", "charts/a.png"));
        // Alternatives may hold `/`, classes and nested braces.
        assert!(m("{a/b,c}.txt", "a/b.txt"));
        assert!(m("{a/b,c}.txt", "c.txt"));
        assert!(m("x{[0-9],y{1,2}}", "x7"));
        assert!(m("x{[0-9],y{1,2}}", "xy2"));
        assert!(!m("x{[0-9],y{1,2}}", "xy3"));
        assert!(m("a{,.bak}", "a"));
        assert!(m("a{,.bak}", "a.bak"));
        // Not braces: literal.
        assert!(m("{a", "{a"));
        assert!(m("{a}", "{a}"));
        assert!(m(r"\{a,b}", "{a,b}"));
        assert!(m("[{]a,b}", "{a,b}"));
    }

    #[test]
    fn brace_expansion_is_bounded() {
        // 4 × 4 × 4 = 64 is allowed; one more group is refused with a hint.
        let four = "{a,b,c,d}";
        assert!(Glob::new(&four.repeat(3)).is_ok());
        let err = Glob::new(&four.repeat(4)).unwrap_err();
        assert_eq!(err, GlobError::TooManyAlternatives);
        assert!(err.hint().is_some_and(|h| h.contains("{csv,xlsx}")));
        // Nested groups count too.
        assert!(Glob::new(&"{a,".repeat(40)).is_ok());
        assert_eq!(
            Glob::new(&format!("{}{}", "{a,{b,".repeat(40), "c}}".repeat(40))).unwrap_err(),
            GlobError::TooManyAlternatives
        );
    }

    #[test]
    fn unicode_names() {
        assert!(m("보고서*.xlsx", "보고서-2025.xlsx"));
        assert!(m("?.txt", "я.txt"));
    }
}
