//! Every environment variable dataref reads, in one place, and [`expand`]: `${NAME}` in
//! config values (upstream `env`/`headers`, a source's `url`, `[http]` secrets), expanded
//! from the environment when they are used, so secrets stay out of the file.

/// Data directory (artifacts, index, workspaces, the managed Python runtime).
/// Default: `$XDG_DATA_HOME/dataref`, else `~/.local/share/dataref`.
pub const DATAREF_HOME: &str = "DATAREF_HOME";
/// Path of `dataref.toml`. Without it (and without `--config`), dataref serves the built-in
/// sample database.
pub const DATAREF_CONFIG: &str = "DATAREF_CONFIG";
/// The principal for stdio sessions. Default: `server.principal` in config, else `local`.
pub const DATAREF_PRINCIPAL: &str = "DATAREF_PRINCIPAL";
/// Log filter for stderr, in `tracing` `EnvFilter` syntax (e.g. `dataref=debug`).
pub const DATAREF_LOG: &str = "DATAREF_LOG";
/// Base URL of the OpenAI-compatible Chat Completions endpoint an agent profile uses when
/// it names no `url` (e.g. `https://api.openai.com/v1`, `http://localhost:11434/v1`).
/// Without either, no model is configured.
pub const DATAREF_LLM_URL: &str = "DATAREF_LLM_URL";
/// The model an agent profile uses when it names no `model` (e.g. `gpt-4o-mini`).
pub const DATAREF_LLM_MODEL: &str = "DATAREF_LLM_MODEL";
/// The API key sent to the model endpoint when a profile names no `api_key`. Read when the
/// model is called, never kept in the resolved config (which holds `${DATAREF_LLM_API_KEY}`).
pub const DATAREF_LLM_API_KEY: &str = "DATAREF_LLM_API_KEY";
/// The object store's access key for `[shared]` (read from the environment only, never
/// from the file, and never passed on to `run_python`'s sandbox).
pub const AWS_ACCESS_KEY_ID: &str = "AWS_ACCESS_KEY_ID";
/// The object store's secret key for `[shared]`.
pub const AWS_SECRET_ACCESS_KEY: &str = "AWS_SECRET_ACCESS_KEY";
/// A session token that goes with temporary object store credentials (optional).
pub const AWS_SESSION_TOKEN: &str = "AWS_SESSION_TOKEN";
/// Used to find the default data directory.
pub const XDG_DATA_HOME: &str = "XDG_DATA_HOME";
/// Used to find the default data directory.
pub const HOME: &str = "HOME";

/// The process environment as a lookup for [`expand`] and for resolution
/// (`Config::from_toml_str_with_env` takes any other, e.g. in tests).
pub fn process(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Why a value could not be expanded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExpandError {
    /// `${NAME}` names a variable that is not set.
    Unset(String),
    /// `${` without `}`, or a name that is not `[A-Za-z_][A-Za-z0-9_]*`.
    Malformed(String),
}

/// `value` with every `${NAME}` replaced by `lookup(NAME)`. `$$` is a literal `$`; any
/// other `$` is kept as it is.
pub fn expand(value: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, ExpandError> {
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
