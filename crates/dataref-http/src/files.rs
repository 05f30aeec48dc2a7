//! Downloads of workspace files (charts, exports) by their owner.
//!
//! - `GET /files/{path}` with the bearer token: the caller's own file, resolved and opened
//!   beneath the caller's workspace root, streamed with `Content-Type` from the extension
//!   and `Content-Disposition: attachment` (never rendered on this origin, so an SVG or HTML
//!   file cannot run script here).
//! - `POST /files/sign` with the bearer token and `{"path": "…"}`: a link a host can hand
//!   to the person, `…/files/{path}?principal=…&expires=…&sig=…`, where `sig` is
//!   HMAC-SHA256 over principal, path and expiry, keyed by `[http] signing_key`, else the
//!   key every replica reads from the shared index (`[shared]`), else a random key per
//!   process. A GET with a valid, unexpired signature needs no token.
//!
//! Another principal's file, a missing file, a bad signature and an expired link all get
//! the same 404: nothing tells a guesser which it was.

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use dataref_mcp::Caller;
use dataref_protocol::Principal;
use dataref_workspace::Workspace;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use serde_json::{Value, json};

use crate::body::{self, Body, Deadline};
use crate::pipeline::BoxFuture;
use crate::routes::FilePath;
use crate::server::State;
use crate::{HttpError, json_response, now_secs};
use dataref_protocol::{mime_type, percent_decode, percent_encode};

/// `POST /files/sign` bodies are one small JSON object.
const MAX_SIGN_BODY: usize = 16 * 1024;
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
            let k = crate::expand_setting("http.signing_key", k, lookup)?;
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

fn signed_url(
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

/// `POST /files/sign`, past authentication and the rate limit.
pub(crate) fn sign(state: Arc<State>, request: Request<Deadline>) -> BoxFuture {
    Box::pin(async move {
        let Some(principal) = caller(&request) else {
            return Ok(server_fault());
        };
        let body = match http_body_util::Limited::new(request.into_body(), MAX_SIGN_BODY)
            .collect()
            .await
        {
            Ok(b) => b.to_bytes(),
            // A body past `body_timeout` is answered 408 by the deadline layer.
            Err(_) => {
                return Ok(bad_request(
                    "the body is not a JSON object of at most 16 KiB",
                ));
            }
        };
        let requested = match serde_json::from_slice::<Value>(&body)
            .ok()
            .as_ref()
            .and_then(|v| v.get("path"))
            .and_then(Value::as_str)
        {
            Some(p) => p.to_owned(),
            None => {
                return Ok(bad_request(
                    "send `{\"path\": \"<workspace-relative path>\"}`",
                ));
            }
        };
        let Some(workspace) = workspace(&state, &principal) else {
            return Ok(server_fault());
        };
        let checked = tokio::task::spawn_blocking(move || {
            let path = workspace.resolve(&requested).ok()?;
            workspace.open_read(&path).ok()?;
            Some(path.as_str().to_owned())
        })
        .await
        .ok()
        .flatten();
        let Some(path) = checked else {
            return Ok(not_found());
        };
        let ttl = i64::try_from(state.download_ttl.as_secs()).unwrap_or(i64::MAX);
        let expires = now_secs().saturating_add(ttl);
        let url = signed_url(&state.signer, &state.public_url, &principal, &path, expires);
        Ok(json_response(
            StatusCode::OK,
            json!({"url": url, "path": path, "expires_at": expires}),
        ))
    })
}

/// The principal of a signed link (`?principal=…&expires=…&sig=…`) for the request's
/// [`FilePath`]: `None` when the query carries no signature (the bearer token decides),
/// else the principal, or the 404 of a bad or expired signature.
pub(crate) fn signed_principal<B>(
    state: &State,
    request: &Request<B>,
) -> Option<Result<Principal, Response<Body>>> {
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
    if !state.signer.verify(name, path, expires, sig) || now_secs() > expires {
        return Some(Err(not_found()));
    }
    Some(Principal::new(name).map_err(|_| not_found()))
}

/// `GET /files/{path}`, past authentication (signed link or token), the rate limit and a
/// download slot (held, with the open-request count, until the file has been sent, the
/// client left, or it stopped reading for `send_timeout`).
pub(crate) fn download(state: Arc<State>, request: Request<Incoming>) -> BoxFuture {
    Box::pin(async move {
        let (Some(principal), Some(FilePath(path))) = (
            caller(&request),
            request.extensions().get::<FilePath>().cloned(),
        ) else {
            return Ok(server_fault());
        };
        let Some(workspace) = workspace(&state, &principal) else {
            return Ok(server_fault());
        };
        let opened = tokio::task::spawn_blocking(move || {
            let p = workspace.resolve(&path).ok()?;
            let file = workspace.open_read(&p).ok()?;
            let len = file.metadata().ok().filter(|m| m.is_file())?.len();
            Some((p.as_str().to_owned(), file, len))
        })
        .await
        .ok()
        .flatten();
        let Some((path, file, len)) = opened else {
            return Ok(not_found());
        };
        let mut r = Response::new(body::file(file, len));
        let h = r.headers_mut();
        let mime = mime_type(&path, None).unwrap_or("application/octet-stream");
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static(mime));
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
        if let Ok(v) = HeaderValue::from_str(&disposition(&path)) {
            h.insert(header::CONTENT_DISPOSITION, v);
        }
        h.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static("sandbox"),
        );
        h.insert(
            header::CACHE_CONTROL,
            HeaderValue::from_static("private, no-store"),
        );
        Ok(r)
    })
}

/// The principal the authentication layer put into the request.
fn caller<B>(request: &Request<B>) -> Option<Principal> {
    request
        .extensions()
        .get::<Caller>()
        .map(|Caller(p)| p.clone())
}

fn workspace(state: &State, principal: &Principal) -> Option<Arc<Workspace>> {
    match state.server.workspace_of(principal) {
        Ok(w) => w,
        Err(e) => {
            tracing::error!(%principal, error = %e, "opening a workspace for a download failed");
            None
        }
    }
}

/// `attachment` with an ASCII fallback name and the UTF-8 one (RFC 6266).
fn disposition(path: &str) -> String {
    let name = path.rsplit('/').next().unwrap_or(path);
    let ascii: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() && c != '"' && c != '\\' || c == ' ' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!(
        "attachment; filename=\"{ascii}\"; filename*=UTF-8''{}",
        percent_encode(name).replace('/', "%2F")
    )
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

pub(crate) fn not_found() -> Response<Body> {
    json_response(
        StatusCode::NOT_FOUND,
        json!({
            "error": "not_found",
            "message": "no such file, or the link is not valid (wrong or expired signature)",
            "hint": "check the path (relative to your workspace, see `list_files`), or ask for a new link with `POST /files/sign`",
        }),
    )
}

fn bad_request(hint: &str) -> Response<Body> {
    json_response(
        StatusCode::BAD_REQUEST,
        json!({"error": "bad_request", "message": "cannot read the request", "hint": hint}),
    )
}

fn server_fault() -> Response<Body> {
    json_response(
        StatusCode::INTERNAL_SERVER_ERROR,
        json!({"error": "internal", "message": "the workspace could not be opened; the details are in the server log"}),
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

    #[test]
    fn disposition_names() {
        assert_eq!(
            disposition("charts/q1 sales.png"),
            "attachment; filename=\"q1 sales.png\"; filename*=UTF-8''q1%20sales.png"
        );
        assert_eq!(
            disposition("exports/ümsatz\".csv"),
            "attachment; filename=\"_msatz_.csv\"; filename*=UTF-8''%C3%BCmsatz%22.csv"
        );
    }
}
