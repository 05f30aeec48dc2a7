//! Every environment variable dataref reads, in one place, and [`expand`]: `${NAME}` in
//! config values (upstream `env`/`headers`, a source's `url`, `[http]` secrets), expanded
//! from the environment when they are used, so secrets stay out of the file.

/// Declares each variable as a `pub const` holding its own name, with its doc comment, and
/// [`ALL`]: the same list as data, which the environment reference page is generated from
/// ([`crate::reference::environment_markdown`]).
macro_rules! variables {
    ($($(#[doc = $doc:literal])+ $name:ident;)+) => {
        $(
            $(#[doc = $doc])+
            pub const $name: &str = stringify!($name);
        )+

        /// Every variable above, in order: its name and its doc comment (lines joined by
        /// `\n`).
        pub const ALL: &[(&str, &str)] = &[$((stringify!($name), concat!($($doc, "\n"),+))),+];
    };
}

variables! {
    /// The data directory: artifacts, `index.sqlite`, workspaces, the sample, the managed
    /// Python runtime, running jobs. `--home` wins. Default: `$XDG_DATA_HOME/dataref`, else
    /// `/var/lib/dataref` when run as root, else `~/.local/share/dataref`. When dataref
    /// runs as root, uid 65534 (the sandbox's) must be able to enter it (not under `/root`).
    DATAREF_HOME;
    /// The path of `dataref.toml`; `--config` wins. Without either, dataref serves the
    /// built-in sample database.
    DATAREF_CONFIG;
    /// The principal of stdio sessions; `--principal` wins. Default: `server.principal` in
    /// the config, else `local`.
    DATAREF_PRINCIPAL;
    /// The log filter for stderr, in `tracing`'s `EnvFilter` syntax (e.g. `dataref=debug`,
    /// `dataref_mcp=debug` for what upstream commands write to stderr).
    DATAREF_LOG;
    /// The base URL of the OpenAI-compatible Chat Completions endpoint an agent profile uses
    /// when it names no `url` (e.g. `https://api.openai.com/v1`,
    /// `http://localhost:11434/v1`). Without either, no model is configured.
    DATAREF_LLM_URL;
    /// The model an agent profile uses when it names no `model` (e.g. `gpt-4o-mini`).
    DATAREF_LLM_MODEL;
    /// The API key sent to the model endpoint when a profile names no `api_key`. Read when
    /// the model is called, never kept in the resolved config (which holds
    /// `${DATAREF_LLM_API_KEY}`).
    DATAREF_LLM_API_KEY;
    /// The object store's access key for `[shared]` and for `files` sources on S3 (read
    /// from the environment only, never from the file, and never passed on to
    /// `run_python`'s sandbox).
    AWS_ACCESS_KEY_ID;
    /// The object store's secret key, like `AWS_ACCESS_KEY_ID`.
    AWS_SECRET_ACCESS_KEY;
    /// A session token that goes with temporary object store credentials (optional).
    AWS_SESSION_TOKEN;
    /// Where the default data directory is (`$XDG_DATA_HOME/dataref`) when `DATAREF_HOME`
    /// is not set.
    XDG_DATA_HOME;
    /// Where the default data directory of a user other than root is
    /// (`~/.local/share/dataref`) when neither `DATAREF_HOME` nor `XDG_DATA_HOME` is set.
    HOME;
}

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
