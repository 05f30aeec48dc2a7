//! Reading MySQL SQL text without parsing it: `:name` placeholders become `?`, outside
//! string literals (`'…'` and `"…"`, with backslash escapes and doubled quotes), backquoted
//! identifiers and comments (`-- `, `#`, `/* … */`).

/// SQL with `:name` placeholders replaced by `?`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Positional {
    pub sql: String,
    /// The name bound to each `?`, in order; a name used twice appears twice.
    pub names: Vec<String>,
}

#[derive(Clone, Copy)]
enum State {
    Code,
    /// Inside a quoted string or identifier closed by this byte; backquoted identifiers
    /// have no backslash escapes.
    Quoted(u8),
    LineComment,
    BlockComment,
}

fn ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_' || c >= 0x80
}

fn ident_char(c: u8) -> bool {
    ident_start(c) || c.is_ascii_digit() || c == b'$'
}

/// `:name` → `?` in code; `:=` (assignment) and `::` are left alone. With
/// `backslash_escapes`, a backslash in a string literal escapes the next character.
pub(crate) fn positional_params(sql: &str, backslash_escapes: bool) -> Positional {
    let b = sql.as_bytes();
    let mut out = String::with_capacity(sql.len());
    let mut names = Vec::new();
    let mut state = State::Code;
    let mut i = 0;
    let mut copied = 0;
    while i < b.len() {
        let c = b[i];
        match state {
            State::Code => match c {
                b'\'' | b'"' | b'`' => {
                    state = State::Quoted(c);
                    i += 1;
                }
                b'#' => {
                    state = State::LineComment;
                    i += 1;
                }
                // `--` starts a comment only when followed by whitespace (or the end).
                b'-' if b.get(i + 1) == Some(&b'-')
                    && b.get(i + 2).is_none_or(|c| c.is_ascii_whitespace()) =>
                {
                    state = State::LineComment;
                    i += 2;
                }
                b'/' if b.get(i + 1) == Some(&b'*') => {
                    state = State::BlockComment;
                    i += 2;
                }
                b':' if b.get(i + 1).is_some_and(|&n| ident_start(n))
                    && (i == 0 || b[i - 1] != b':') =>
                {
                    let mut j = i + 1;
                    while j < b.len() && ident_char(b[j]) {
                        j += 1;
                    }
                    out.push_str(&sql[copied..i]);
                    out.push('?');
                    names.push(sql[i + 1..j].to_owned());
                    copied = j;
                    i = j;
                }
                _ => i += 1,
            },
            State::Quoted(q) => {
                // A backslash escape, or a doubled quote, skips two bytes.
                if (backslash_escapes && c == b'\\' && q != b'`')
                    || (c == q && b.get(i + 1) == Some(&q))
                {
                    i += 2;
                } else {
                    if c == q {
                        state = State::Code;
                    }
                    i += 1;
                }
            }
            State::LineComment => {
                if c == b'\n' {
                    state = State::Code;
                }
                i += 1;
            }
            State::BlockComment => {
                if c == b'*' && b.get(i + 1) == Some(&b'/') {
                    state = State::Code;
                    i += 2;
                } else {
                    i += 1;
                }
            }
        }
    }
    out.push_str(&sql[copied.min(sql.len())..]);
    Positional { sql: out, names }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_become_question_marks_outside_strings_and_comments() {
        let p = positional_params(
            "SELECT ':a', \"it\\\":b\", `x:c`, @v := 1 -- :d\n\
             # :e\n/* :f */ FROM t WHERE a = :a AND b > :since AND c = :a",
            true,
        );
        assert_eq!(p.names, ["a", "since", "a"]);
        assert!(
            p.sql.ends_with("WHERE a = ? AND b > ? AND c = ?"),
            "{}",
            p.sql
        );
        assert!(p.sql.contains("':a'") && p.sql.contains("`x:c`") && p.sql.contains(":= 1"));
    }

    #[test]
    fn a_double_dash_without_a_space_is_minus_minus() {
        let p = positional_params("SELECT 1--:n", true);
        assert_eq!(p.names, ["n"]);
        assert_eq!(p.sql, "SELECT 1--?");
    }

    #[test]
    fn without_backslash_escapes_a_backslash_is_a_character() {
        let p = positional_params("SELECT 'C:\\' AS dir, ':x' AS s WHERE id = :id", false);
        assert_eq!(p.names, ["id"]);
        let p = positional_params("SELECT 'C:\\' AS dir, ':x' AS s WHERE id = :id", true);
        assert_ne!(p.names, ["id"], "MySQL reads the backslash as an escape");
    }

    #[test]
    fn an_unclosed_string_keeps_the_rest_as_written() {
        let p = positional_params("SELECT ':x", true);
        assert!(p.names.is_empty());
        assert_eq!(p.sql, "SELECT ':x");
    }
}
