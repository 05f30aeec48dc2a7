//! Download links: the key ([`SigningKey`]), the signature over principal, path and expiry
//! (HMAC-SHA256, [`Signer`]), the links tool results attach ([`Links`]), the workspace path
//! a download names ([`FilePath`]) and the one 404 every failed download gets. Signing is
//! `POST /files/sign`'s (`route::files`), checking a link the authentication layer's.
//!
//! The key is `[http] signing_key`, else the one every replica reads from the shared index
//! (`[shared]`), else a random key per process. Another principal's file, a missing file, a
//! bad signature and an expired link all get the same 404: nothing tells a guesser which it
//! was.

use std::sync::Arc;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use dataref_protocol::{Principal, percent_decode, percent_encode};
use http::StatusCode;
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

use crate::error::{HttpError, expand_setting};
use crate::response::{error, now_secs};

const SIG_VERSION: &str = "dataref-download-v1";

/// An HMAC key for download links, at least [`SigningKey::MIN_BYTES`] long. Its bytes
/// never leave it: `Debug` shows a fingerprint only.
#[derive(Clone)]
pub struct SigningKey(Arc<[u8]>);

impl SigningKey {
    pub const MIN_BYTES: usize = 32;

    /// A key of `bytes`; fewer than [`Self::MIN_BYTES`] is refused.
    pub fn new(bytes: Vec<u8>) -> Result<Self, HttpError> {
        if bytes.len() < Self::MIN_BYTES {
            return Err(HttpError::Setting {
                key: "http.signing_key",
                message: format!("a key of {} bytes is too short", bytes.len()),
                hint: "use at least 32 random bytes, e.g. `openssl rand -base64 48`".into(),
            });
        }
        Ok(Self(bytes.into()))
    }

    /// The first 8 bytes of the key's SHA-256, in hex: enough to tell whether two
    /// replicas sign with the same key, nothing to sign with.
    pub fn fingerprint(&self) -> String {
        ring::digest::digest(&ring::digest::SHA256, &self.0)
            .as_ref()
            .iter()
            .take(8)
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SigningKey(sha256:{}…)", self.fingerprint())
    }
}

/// `[http] signing_key`, `${NAME}` expanded, when set.
pub(crate) fn configured_key(
    configured: Option<&str>,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<SigningKey>, HttpError> {
    configured
        .map(|k| {
            let k = expand_setting("http.signing_key", k, lookup)?;
            SigningKey::new(k.into_bytes())
        })
        .transpose()
}

pub(crate) struct Signer {
    key: hmac::Key,
}

impl Signer {
    #[cfg(test)]
    pub(crate) fn new(
        configured: Option<&str>,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, HttpError> {
        Self::with_shared(configured, None, lookup)
    }

    /// Signs with the configured key, else `shared` (every replica's), else a random key
    /// of this process.
    pub(crate) fn with_shared(
        configured: Option<&str>,
        shared: Option<&SigningKey>,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, HttpError> {
        let key = match configured_key(configured, lookup)? {
            Some(key) => key,
            None => match shared {
                Some(key) => key.clone(),
                None => {
                    let mut k = vec![0u8; SigningKey::MIN_BYTES];
                    SystemRandom::new()
                        .fill(&mut k)
                        .map_err(|_| HttpError::Setting {
                            key: "http.signing_key",
                            message: "the system's random source failed".into(),
                            hint: "set `signing_key` in `[http]`".into(),
                        })?;
                    SigningKey::new(k)?
                }
            },
        };
        Ok(Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, &key.0),
        })
    }

    fn message(principal: &str, path: &str, expires: i64) -> String {
        format!("{SIG_VERSION}\n{principal}\n{path}\n{expires}")
    }

    fn sign(&self, principal: &Principal, path: &str, expires: i64) -> String {
        let m = Self::message(principal.as_str(), path, expires);
        URL_SAFE_NO_PAD.encode(hmac::sign(&self.key, m.as_bytes()))
    }

    fn verify(&self, principal: &str, path: &str, expires: i64, sig: &str) -> bool {
        let Ok(sig) = URL_SAFE_NO_PAD.decode(sig) else {
            return false;
        };
        let m = Self::message(principal, path, expires);
        hmac::verify(&self.key, m.as_bytes(), &sig).is_ok()
    }
}

/// Signed links for the files tool results attach (see [`dataref_mcp::DatarefServer`]).
pub(crate) struct Links {
    pub(crate) signer: Arc<Signer>,
    pub(crate) public_url: String,
    pub(crate) ttl: std::time::Duration,
}

impl dataref_mcp::DownloadLinks for Links {
    fn link(&self, principal: &Principal, path: &str) -> Option<(String, i64)> {
        let ttl = i64::try_from(self.ttl.as_secs()).unwrap_or(i64::MAX);
        let expires = now_secs().saturating_add(ttl);
        Some((
            signed_url(&self.signer, &self.public_url, principal, path, expires),
            expires,
        ))
    }
}

pub(crate) fn signed_url(
    signer: &Signer,
    public_url: &str,
    principal: &Principal,
    path: &str,
    expires: i64,
) -> String {
    let sig = signer.sign(principal, path, expires);
    format!(
        "{public_url}/files/{}?principal={}&expires={expires}&sig={sig}",
        percent_encode(path),
        percent_encode(principal.as_str()),
    )
}

/// The workspace path of `GET /files/{path}`, percent-decoded, in the request's
/// extensions for the download stack.
#[derive(Clone)]
pub(crate) struct FilePath(pub(crate) String);

/// The first layer of the download route: the path after `/files/`, percent-decoded into
/// the request's extensions as a [`FilePath`]; one that does not decode is the downloads'
/// 404, before anyone is asked for a token.
pub(crate) async fn file_path(mut request: Request, next: Next) -> Response {
    let rest = request
        .uri()
        .path()
        .strip_prefix("/files/")
        .unwrap_or_default();
    let Some(decoded) = percent_decode(rest).and_then(|b| String::from_utf8(b).ok()) else {
        return not_found();
    };
    request.extensions_mut().insert(FilePath(decoded));
    next.run(request).await
}

/// The principal of a signed link (`?principal=…&expires=…&sig=…`) for the request's
/// [`FilePath`]: `None` when the query carries no signature (the bearer token decides),
/// else the principal, or the 404 of a bad or expired signature.
pub(crate) fn signed_principal(
    signer: &Signer,
    request: &Request,
) -> Option<Result<Principal, Response>> {
    let query = request.uri().query().map(parse_query).unwrap_or_default();
    let get = |k: &str| query.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let sig = get("sig")?;
    let Some(FilePath(path)) = request.extensions().get::<FilePath>() else {
        return Some(Err(not_found()));
    };
    let (Some(name), Some(expires)) = (get("principal"), get("expires")) else {
        return Some(Err(not_found()));
    };
    let Ok(expires) = expires.parse::<i64>() else {
        return Some(Err(not_found()));
    };
    if !signer.verify(name, path, expires, sig) || now_secs() > expires {
        return Some(Err(not_found()));
    }
    Some(Principal::new(name).map_err(|_| not_found()))
}

fn parse_query(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter_map(|pair| {
            let (k, v) = pair.split_once('=')?;
            let v = String::from_utf8(percent_decode(&v.replace('+', " "))?).ok()?;
            Some((k.to_owned(), v))
        })
        .collect()
}

pub(crate) fn not_found() -> Response {
    error(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such file, or the link is not valid (wrong or expired signature)",
        "check the path (relative to your workspace, see `list_files`), or ask for a new link \
         with `POST /files/sign`",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_cover_principal_path_and_expiry() {
        let s =
            Signer::new(Some("${K}"), &|_| Some("k".repeat(40))).unwrap_or_else(|e| panic!("{e}"));
        let p = Principal::new("eu_analyst").unwrap();
        let sig = s.sign(&p, "charts/a.png", 100);
        assert!(s.verify("eu_analyst", "charts/a.png", 100, &sig));
        assert!(!s.verify("us_analyst", "charts/a.png", 100, &sig));
        assert!(!s.verify("eu_analyst", "charts/b.png", 100, &sig));
        assert!(!s.verify("eu_analyst", "charts/a.png", 101, &sig));
        assert!(!s.verify("eu_analyst", "charts/a.png", 100, "junk!"));
        let other = Signer::new(None, &|_| None).unwrap_or_else(|e| panic!("{e}"));
        assert!(!other.verify("eu_analyst", "charts/a.png", 100, &sig));
    }
}
