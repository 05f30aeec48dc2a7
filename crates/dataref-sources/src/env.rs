//! `${NAME}` in a source's connection URL, expanded from the environment at connect time,
//! so a password need not be written into dataref.toml.

/// Why a value could not be expanded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ExpandError {
    /// `${NAME}` names a variable that is not set.
    Unset(String),
    /// `${` without `}`, or a name that is not `[A-Za-z_][A-Za-z0-9_]*`.
    Malformed(String),
}

/// `value` with every `${NAME}` replaced by `lookup(NAME)`. `$$` is a literal `$`; any
/// other `$` is kept as it is.
pub(crate) fn expand(
    value: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<String, ExpandError> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(tail) = after.strip_prefix('{') {
            let Some(end) = tail.find('}') else {
                return Err(ExpandError::Malformed(
                    "`${` without its closing `}`".into(),
                ));
            };
            let name = &tail[..end];
            let valid = name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(ExpandError::Malformed(format!(
                    "`${{{name}}}` is not a variable name (letters, digits and `_`)"
                )));
            }
            out.push_str(&lookup(name).ok_or_else(|| ExpandError::Unset(name.to_owned()))?);
            rest = &tail[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        (name == "PGPASSWORD").then(|| "s3cret".to_owned())
    }

    #[test]
    fn variables_are_replaced_and_dollars_kept() {
        assert_eq!(
            expand("postgresql://u:${PGPASSWORD}@h/db", &env).unwrap(),
            "postgresql://u:s3cret@h/db"
        );
        assert_eq!(expand("a$$b $5 $", &env).unwrap(), "a$b $5 $");
        assert_eq!(
            expand("${NOPE}", &env).unwrap_err(),
            ExpandError::Unset("NOPE".into())
        );
        assert!(matches!(
            expand("${A-B}", &env),
            Err(ExpandError::Malformed(_))
        ));
        assert!(matches!(
            expand("${A", &env),
            Err(ExpandError::Malformed(_))
        ));
    }
}
