//! Why the HTTP server cannot start ([`HttpError`]), and the `${NAME}` expansion of the
//! settings that may name a secret.

use std::net::SocketAddr;

use dataref_protocol::Principal;

/// Why the HTTP server cannot start. Each says what to change.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HttpError {
    #[error(
        "`[http] auth = false` serves everyone as `{principal}`, but `{addr}` is not a loopback address"
    )]
    AuthOffNotLoopback {
        addr: SocketAddr,
        principal: Principal,
    },
    #[error(
        "nobody could call this server: no `[principals.NAME]` has a `token_sha256` and `[http.jwt]` is not set"
    )]
    NoCredentials,
    #[error("`{key}`: {message}")]
    Setting {
        key: &'static str,
        message: String,
        hint: String,
    },
    #[error("cannot listen on `{addr}`: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

impl HttpError {
    /// What to do about it.
    pub fn hint(&self) -> String {
        match self {
            Self::AuthOffNotLoopback { .. } => "listen on `127.0.0.1:PORT` (or `[::1]:PORT`), or keep `auth = true` and give each caller a token with `dataref token new NAME`".into(),
            Self::NoCredentials => "make a token with `dataref token new NAME` and paste the `[principals.NAME]` line it prints into dataref.toml, or set `[http.jwt]`".into(),
            Self::Setting { hint, .. } => hint.clone(),
            Self::Bind { .. } => "choose a free port, or stop what is listening there".into(),
        }
    }
}

/// `value` of the setting `key` with `${NAME}` expanded; an unset or malformed reference is
/// an error naming the key.
pub(crate) fn expand_setting(
    key: &'static str,
    value: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<String, HttpError> {
    use dataref_config::env::{ExpandError, expand};
    expand(value, lookup).map_err(|e| match e {
        ExpandError::Unset(variable) => HttpError::Setting {
            key,
            message: format!("uses `${{{variable}}}`, which is not set"),
            hint: format!("set `{variable}` in the server's environment"),
        },
        ExpandError::Malformed(message) => HttpError::Setting {
            key,
            message,
            hint: "write `${NAME}` for an environment variable, `$$` for a `$`".into(),
        },
    })
}
