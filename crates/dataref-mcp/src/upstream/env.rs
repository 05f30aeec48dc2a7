//! `${NAME}` in upstream `env` and `headers` values.

use dataref_config::env::{ExpandError, expand as expand_vars};

use super::UpstreamError;

/// `value` with every `${NAME}` replaced by `lookup(NAME)`. `$$` is a literal `$`; any
/// other `$` is kept as it is. An unset variable, an unterminated `${` or a name that is
/// not `[A-Za-z_][A-Za-z0-9_]*` is an error naming the upstream and the key.
pub(super) fn expand(
    value: &str,
    upstream: &str,
    key: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<String, UpstreamError> {
    expand_vars(value, lookup).map_err(|e| match e {
        ExpandError::Malformed(message) => UpstreamError::BadValue {
            upstream: upstream.to_owned(),
            key: key.to_owned(),
            message,
        },
        ExpandError::Unset(variable) => UpstreamError::UnsetVariable {
            upstream: upstream.to_owned(),
            key: key.to_owned(),
            variable,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "TOKEN" => Some("s3cret".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    fn x(value: &str) -> Result<String, String> {
        expand(value, "docs", "headers.Authorization", &env).map_err(|e| e.to_string())
    }

    #[test]
    fn variables_are_replaced() {
        assert_eq!(x("Bearer ${TOKEN}").unwrap(), "Bearer s3cret");
        assert_eq!(x("${TOKEN}${TOKEN}").unwrap(), "s3crets3cret");
        assert_eq!(x("a${EMPTY}b").unwrap(), "ab");
        assert_eq!(x("no variables").unwrap(), "no variables");
        assert_eq!(
            x("cost: $5, $$ and $${TOKEN}").unwrap(),
            "cost: $5, $ and ${TOKEN}"
        );
        assert_eq!(x("trailing $").unwrap(), "trailing $");
    }

    #[test]
    fn an_unset_variable_names_the_upstream_key_and_variable() {
        let e = expand(
            "Bearer ${DOCS_TOKEN}",
            "docs",
            "headers.Authorization",
            &env,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "upstream `docs`: `headers.Authorization` uses `${DOCS_TOKEN}`, which is not set"
        );
        assert!(e.hint().contains("set `DOCS_TOKEN`"), "{}", e.hint());
    }

    #[test]
    fn malformed_references_are_errors() {
        assert!(x("${TOKEN").unwrap_err().contains("closing"));
        assert!(x("${}").unwrap_err().contains("not a variable name"));
        assert!(x("${1A}").unwrap_err().contains("not a variable name"));
        assert!(x("${A-B}").unwrap_err().contains("not a variable name"));
    }
}
