//! What is wrong with a configuration: the error every resolver returns, and the small
//! checks they share. Uses nothing else of this crate, so the resolvers (`resolve` and the
//! sections beside it) import it and never each other.

use std::fmt;
use std::path::PathBuf;

/// What is wrong with the configuration, and what to do about it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error(
        "cannot read `{path}`: {source}\nhint: check the path given by `--config` or `DATAREF_CONFIG`"
    )]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("`{path}` is not valid dataref.toml: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{what}: {message}\nhint: {hint}")]
    Invalid {
        what: String,
        message: String,
        hint: String,
    },
}

pub(crate) fn invalid(
    what: impl fmt::Display,
    message: impl Into<String>,
    hint: impl Into<String>,
) -> ConfigError {
    ConfigError::Invalid {
        what: what.to_string(),
        message: message.into(),
        hint: hint.into(),
    }
}

pub(crate) fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && s.len() <= 48
}
