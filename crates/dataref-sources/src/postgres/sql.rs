//! Reading PostgreSQL SQL text without parsing it: `:name` placeholders become `$1..$n`,
//! and calls to `set_config` are found, both outside string literals, quoted identifiers,
//! dollar-quoted strings, comments and `::` casts.

/// SQL with `:name` placeholders replaced by `$1..$n`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Numbered {
    pub sql: String,
    /// `names[i]` is bound to `$(i + 1)`; a name used twice has one number.
    pub names: Vec<String>,
}

/// What the scanner is inside of.
#[derive(Clone, Copy)]
enum State {
    Code,
    /// `'…'`; `escapes` for `E'…'`, where a backslash escapes the next character.
    Literal {
        escapes: bool,
    },
    QuotedIdent,
    LineComment,
    /// Nesting depth (PostgreSQL block comments nest).
    BlockComment(u32),
}

fn ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_' || c >= 0x80
}

fn ident_char(c: u8) -> bool {
    ident_start(c) || c.is_ascii_digit() || c == b'$'
}

/// One pass over `sql`, calling `on_ident` for every identifier in code (quoted ones with
/// their quotes removed, keyword-like ones lower-cased) and `on_param` for every `:name`.
/// Returns the SQL with each `:name` replaced by what `on_param` returned.
fn scan(
    sql: &str,
    on_ident: &mut dyn FnMut(&str),
    on_param: &mut dyn FnMut(&str) -> String,
) -> String {
    let b = sql.as_bytes();
    let mut out = String::with_capacity(sql.len() + 8);
    let mut state = State::Code;
    let mut i = 0;
    // Start of the text not yet copied to `out`.
    let mut copied = 0;
    let mut quoted = String::new();
    while i < b.len() {
        let c = b[i];
        match state {
            State::Code => match c {
                b'\'' => {
                    let escapes = i > 0
                        && (b[i - 1] == b'E' || b[i - 1] == b'e')
                        && (i < 2 || !ident_char(b[i - 2]));
                    state = State::Literal { escapes };
                    i += 1;
                }
                b'"' => {
                    state = State::QuotedIdent;
                    quoted.clear();
                    i += 1;
                }
                b'-' if b.get(i + 1) == Some(&b'-') => {
                    state = State::LineComment;
                    i += 2;
                }
                b'/' if b.get(i + 1) == Some(&b'*') => {
                    state = State::BlockComment(1);
                    i += 2;
                }
                b'$' => {
                    // `$tag$ … $tag$` (tag possibly empty); `$1` is a positional parameter.
                    let mut j = i + 1;
                    while j < b.len() && ident_char(b[j]) && b[j] != b'$' {
                        j += 1;
                    }
                    let tag_ok =
                        j < b.len() && b[j] == b'$' && (j == i + 1 || !b[i + 1].is_ascii_digit());
                    if tag_ok {
                        let tag = &sql[i..=j];
                        match sql[j + 1..].find(tag) {
                            Some(end) => i = j + 1 + end + tag.len(),
                            None => i = b.len(),
                        }
                    } else {
                        i += 1;
                    }
                }
                b':' if b.get(i + 1) == Some(&b':') => i += 2,
                b':' if b.get(i + 1).is_some_and(|&n| ident_start(n)) => {
                    let mut j = i + 1;
                    while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
                        j += 1;
                    }
                    out.push_str(&sql[copied..i]);
                    out.push_str(&on_param(&sql[i + 1..j]));
                    copied = j;
                    i = j;
                }
                c if ident_start(c) => {
                    let mut j = i + 1;
                    while j < b.len() && ident_char(b[j]) {
                        j += 1;
                    }
                    on_ident(&sql[i..j].to_ascii_lowercase());
                    i = j;
                }
                _ => i += 1,
            },
            State::Literal { escapes } => {
                if escapes && c == b'\\' {
                    i += 2;
                } else if c == b'\'' {
                    if b.get(i + 1) == Some(&b'\'') {
                        i += 2;
                    } else {
                        state = State::Code;
                        i += 1;
                    }
                } else {
                    i += 1;
                }
            }
            State::QuotedIdent => {
                if c == b'"' {
                    if b.get(i + 1) == Some(&b'"') {
                        quoted.push('"');
                        i += 2;
                    } else {
                        on_ident(&quoted);
                        state = State::Code;
                        i += 1;
                    }
                } else {
                    let len = utf8_len(c);
                    quoted.push_str(sql.get(i..i + len).unwrap_or(""));
                    i += len;
                }
            }
            State::LineComment => {
                if c == b'\n' {
                    state = State::Code;
                }
                i += 1;
            }
            State::BlockComment(depth) => {
                if c == b'*' && b.get(i + 1) == Some(&b'/') {
                    state = if depth == 1 {
                        State::Code
                    } else {
                        State::BlockComment(depth - 1)
                    };
                    i += 2;
                } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
                    state = State::BlockComment(depth + 1);
                    i += 2;
                } else {
                    i += 1;
                }
            }
        }
    }
    out.push_str(&sql[copied.min(sql.len())..]);
    out
}

fn utf8_len(first: u8) -> usize {
    match first {
        0xF0.. => 4,
        0xE0.. => 3,
        0xC0.. => 2,
        _ => 1,
    }
}

/// `:name` → `$n`. `::` casts, `:=` and array slices with numbers (`a[1:2]`) are left alone.
pub(crate) fn number_params(sql: &str) -> Numbered {
    let mut names: Vec<String> = Vec::new();
    let sql = scan(sql, &mut |_| {}, &mut |name| {
        let n = match names.iter().position(|n| n == name) {
            Some(at) => at + 1,
            None => {
                names.push(name.to_owned());
                names.len()
            }
        };
        format!("${n}")
    });
    Numbered { sql, names }
}

/// The functions a model's SQL may not call: they change the role or settings of the
/// transaction (`set_config('role', …)` would leave the caller's role).
const REFUSED_FUNCTIONS: &[&str] = &["set_config"];

/// The first refused function `sql` names in code (quoted or not, schema-qualified or not).
pub(crate) fn refused_function(sql: &str) -> Option<&'static str> {
    let mut found = None;
    scan(
        sql,
        &mut |ident| {
            if found.is_none() {
                found = REFUSED_FUNCTIONS
                    .iter()
                    .find(|f| ident.eq_ignore_ascii_case(f))
                    .copied();
            }
        },
        &mut |name| format!(":{name}"),
    );
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_params_become_positional_outside_literals_comments_and_casts() {
        let n = number_params(
            "SELECT ':skip', \":odd\", x::date, $$ :no $$, $t$ :no $t$ -- :no\n\
             FROM t /* :no /* nested :no */ :no */ WHERE a = :since AND b < :until::date \
             AND c = :since AND d = E'\\' :no' AND f(p := 1) AND arr[1:2] = 1",
        );
        assert_eq!(n.names, ["since", "until"]);
        assert_eq!(
            n.sql,
            "SELECT ':skip', \":odd\", x::date, $$ :no $$, $t$ :no $t$ -- :no\n\
             FROM t /* :no /* nested :no */ :no */ WHERE a = $1 AND b < $2::date \
             AND c = $1 AND d = E'\\' :no' AND f(p := 1) AND arr[1:2] = 1"
        );
    }

    #[test]
    fn positional_parameters_and_unicode_are_kept() {
        let n = number_params("SELECT $1, 'é:x', \"ö\" FROM t WHERE a = :a");
        assert_eq!(n.sql, "SELECT $1, 'é:x', \"ö\" FROM t WHERE a = $1");
        assert_eq!(n.names, ["a"]);
    }

    #[test]
    fn set_config_is_found_however_written() {
        for sql in [
            "SELECT set_config('role', 'x', true)",
            "SELECT SET_CONFIG('role', 'x', true)",
            "SELECT pg_catalog.set_config('role', 'x', true)",
            "SELECT \"set_config\"('role', 'x', true)",
        ] {
            assert_eq!(refused_function(sql), Some("set_config"), "{sql}");
        }
        for sql in [
            "SELECT 'set_config'",
            "SELECT 1 -- set_config\n",
            "SELECT current_setting('role')",
            "SELECT $$set_config$$",
        ] {
            assert_eq!(refused_function(sql), None, "{sql}");
        }
    }
}
