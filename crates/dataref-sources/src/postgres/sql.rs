//! Reading PostgreSQL SQL text without parsing it: `:name` placeholders become `$1..$n`,
//! and calls to `set_config` are found, both outside string literals, quoted identifiers,
//! dollar-quoted strings, comments and `::` casts.

/// SQL with `:name` placeholders replaced by `$1..$n`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Numbered {
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
                b'U' | b'u'
                    if b.get(i + 1) == Some(&b'&')
                        && b.get(i + 2) == Some(&b'"')
                        && (i == 0 || !ident_char(b[i - 1])) =>
                {
                    // `U&"…"` [UESCAPE 'c']: a quoted identifier with Unicode escapes,
                    // decoded as the server does (`U&"set\005fconfig"` is `set_config`).
                    let (raw, end) = quoted_body(sql, i + 3);
                    let (escape, end) = uescape(sql, end);
                    on_ident(&unicode_unescape(&raw, escape));
                    i = end;
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
                // The server ends a `--` comment at a carriage return too.
                if c == b'\n' || c == b'\r' {
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

/// The text of a `"…"` identifier whose body starts at `start` (`""` is one quote), and
/// the index after its closing quote (the end of `sql` if unclosed).
fn quoted_body(sql: &str, start: usize) -> (String, usize) {
    let b = sql.as_bytes();
    let mut out = String::new();
    let mut i = start;
    while i < b.len() {
        if b[i] == b'"' {
            if b.get(i + 1) == Some(&b'"') {
                out.push('"');
                i += 2;
                continue;
            }
            return (out, i + 1);
        }
        let len = utf8_len(b[i]);
        out.push_str(sql.get(i..i + len).unwrap_or(""));
        i += len;
    }
    (out, b.len())
}

/// Whitespace and comments from `i` on.
fn skip_blank(sql: &str, mut i: usize) -> usize {
    let b = sql.as_bytes();
    loop {
        match b.get(i) {
            Some(c) if c.is_ascii_whitespace() => i += 1,
            Some(b'-') if b.get(i + 1) == Some(&b'-') => {
                while i < b.len() && b[i] != b'\n' && b[i] != b'\r' {
                    i += 1;
                }
            }
            Some(b'/') if b.get(i + 1) == Some(&b'*') => {
                let mut depth = 0u32;
                while i < b.len() {
                    if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                        depth += 1;
                        i += 2;
                    } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
            }
            _ => return i,
        }
    }
}

/// `UESCAPE 'c'` after a `U&` identifier ending at `end`: the escape character and the
/// index after the clause; else `\` and `end`.
fn uescape(sql: &str, end: usize) -> (char, usize) {
    let b = sql.as_bytes();
    let i = skip_blank(sql, end);
    let is_kw = sql
        .get(i..i + 7)
        .is_some_and(|w| w.eq_ignore_ascii_case("uescape"))
        && b.get(i + 7).is_none_or(|&c| !ident_char(c));
    if !is_kw {
        return ('\\', end);
    }
    let j = skip_blank(sql, i + 7);
    if b.get(j) != Some(&b'\'') {
        return ('\\', end);
    }
    match sql.get(j + 1..).and_then(|rest| rest.chars().next()) {
        Some(c) if sql[j + 1 + c.len_utf8()..].starts_with('\'') => (c, j + 2 + c.len_utf8()),
        _ => ('\\', end),
    }
}

/// `\XXXX` and `\+XXXXXX` (with `escape` for the backslash) decoded; `\\` is a backslash.
/// What the server would reject is kept as written.
fn unicode_unescape(raw: &str, escape: char) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        if c != escape {
            out.push(c);
            continue;
        }
        let rest = &raw[at + c.len_utf8()..];
        if rest.starts_with(escape) {
            out.push(escape);
            chars.next();
            continue;
        }
        let (digits, skip) = match rest.strip_prefix('+') {
            Some(r) => (r.get(..6), 7),
            None => (rest.get(..4), 4),
        };
        match digits
            .filter(|d| d.bytes().all(|x| x.is_ascii_hexdigit()))
            .and_then(|d| u32::from_str_radix(d, 16).ok())
            .and_then(char::from_u32)
        {
            Some(decoded) => {
                out.push(decoded);
                for _ in 0..skip {
                    chars.next();
                }
            }
            None => out.push(c),
        }
    }
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

/// The same SQL for psycopg's `pyformat` style, as a session's replay runs it: each `:name`
/// found by the scan the source binds parameters with becomes `%(name)s`, and every `%` is doubled
/// (psycopg reads `%` everywhere, literals and comments included). `%` changes no state of
/// the scan, so doubling first finds the same placeholders.
pub fn pyformat_params(sql: &str) -> String {
    scan(&sql.replace('%', "%%"), &mut |_| {}, &mut |name| {
        format!("%({name})s")
    })
}

/// `:name` → `$n`. `::` casts, `:=` and array slices with numbers (`a[1:2]`) are left alone.
pub fn number_params(sql: &str) -> Numbered {
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
    fn pyformat_rewrites_placeholders_only_in_code() {
        assert_eq!(
            pyformat_params(
                "SELECT '%:x' AS a, x::int, 5 % 2 FROM t WHERE d >= :since -- :no\n AND \"c:y\" = :y"
            ),
            "SELECT '%%:x' AS a, x::int, 5 %% 2 FROM t WHERE d >= %(since)s -- :no\n AND \"c:y\" = %(y)s"
        );
        assert_eq!(
            pyformat_params("SELECT $$ :a % $$, :b"),
            "SELECT $$ :a %% $$, %(b)s"
        );
        assert_eq!(
            pyformat_params("SELECT E'it\\' :a', :b"),
            "SELECT E'it\\' :a', %(b)s"
        );
    }

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
            "SELECT U&\"set\\005fconfig\"('role', 'x', true)",
            "SELECT u&\"SET\\005FCONFIG\"('role', 'x', true)",
            "SELECT U&\"set!005fconfig\" UESCAPE '!'('role', 'x', true)",
            "SELECT U&\"set!+00005fconfig\" /* c */ uescape\n'!'('role', 'x', true)",
            "SELECT pg_catalog.U&\"set\\005fconfig\"('role', 'x', true)",
            "SELECT U&\"\\0073et_config\"('role', 'x', true)",
            "SELECT 1 -- a comment\r, set_config('role', 'x', true)",
            "SELECT set_config/**/('role', 'x', true)",
        ] {
            assert_eq!(refused_function(sql), Some("set_config"), "{sql}");
        }
        for sql in [
            "SELECT 'set_config'",
            "SELECT 1 -- set_config\n",
            "SELECT current_setting('role')",
            "SELECT $$set_config$$",
            "SELECT U&'set\\005fconfig'",
            "SELECT U&\"set\\005fconfi\"",
        ] {
            assert_eq!(refused_function(sql), None, "{sql}");
        }
    }
}
