//! Downloads of workspace files (charts, exports) by their owner.
//!
//! - `GET /files/{path}` with the bearer token: the caller's own file, resolved and opened
//!   beneath the caller's workspace root, streamed with `Content-Type` from the extension
//!   and `Content-Disposition: attachment` (never rendered on this origin, so an SVG or HTML
//!   file cannot run script here).
//! - `POST /files/sign` with the bearer token and `{"path": "…"}`: a link a host can hand
//!   to the person, `…/files/{path}?principal=…&expires=…&sig=…`, where `sig` is
//!   HMAC-SHA256 (`[http] signing_key`, else a random key per process) over principal,
//!   path and expiry. A GET with a valid, unexpired signature needs no token.
//!
//! Another principal's file, a missing file, a bad signature and an expired link all get
//! the same 404: nothing tells a guesser which it was.

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use dataref_protocol::Principal;
use dataref_workspace::Workspace;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use serde_json::{Value, json};

use crate::conn::OpenRequest;
use crate::{Body, HttpError, State, body, json_response, now_secs};
use dataref_protocol::{mime_type, percent_decode, percent_encode};

/// `POST /files/sign` bodies are one small JSON object.
const MAX_SIGN_BODY: usize = 16 * 1024;
const SIG_VERSION: &str = "dataref-download-v1";

pub(crate) struct Signer {
    key: hmac::Key,
}

impl Signer {
    pub(crate) fn new(
        configured: Option<&str>,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, HttpError> {
        let bytes = match configured {
            Some(k) => {
                let k = crate::expand_setting("http.signing_key", k, lookup)?;
                if k.len() < 32 {
                    return Err(HttpError::Setting {
                        key: "http.signing_key",
                        message: format!("a key of {} bytes is too short", k.len()),
                        hint: "use at least 32 random bytes, e.g. `openssl rand -base64 48`".into(),
                    });
                }
                k.into_bytes()
            }
            None => {
                let mut k = vec![0u8; 32];
                SystemRandom::new()
                    .fill(&mut k)
                    .map_err(|_| HttpError::Setting {
                        key: "http.signing_key",
                        message: "the system's random source failed".into(),
                        hint: "set `signing_key` in `[http]`".into(),
                    })?;
                k
            }
        };
        Ok(Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, &bytes),
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

/// `POST /files/sign`.
pub(crate) async fn sign(state: &State, request: Request<Incoming>) -> Response<Body> {
    let principal = match state.auth.authenticate(request.headers()) {
        Ok(p) => p,
        Err(f) => return state.auth.challenge(&f),
    };
    if let Err(refused) = state.limits.admit(&principal) {
        return refused.response();
    }
    let (body, timed_out) = body::with_deadline(request.into_body(), state.body_timeout);
    let body = match http_body_util::Limited::new(body, MAX_SIGN_BODY)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(_) if timed_out.happened() => return crate::body_timed_out(state.body_timeout),
        Err(_) => return bad_request("the body is not a JSON object of at most 16 KiB"),
    };
    let requested = match serde_json::from_slice::<Value>(&body)
        .ok()
        .as_ref()
        .and_then(|v| v.get("path"))
        .and_then(Value::as_str)
    {
        Some(p) => p.to_owned(),
        None => return bad_request("send `{\"path\": \"<workspace-relative path>\"}`"),
    };
    let Some(workspace) = workspace(state, &principal) else {
        return server_fault();
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
        return not_found();
    };
    let ttl = i64::try_from(state.download_ttl.as_secs()).unwrap_or(i64::MAX);
    let expires = now_secs().saturating_add(ttl);
    let url = signed_url(&state.signer, &state.public_url, &principal, &path, expires);
    json_response(
        StatusCode::OK,
        json!({"url": url, "path": path, "expires_at": expires}),
    )
}

/// `GET /files/{path}`: signed (no token) when the query carries a signature, else with
/// the bearer token.
pub(crate) async fn download(
    state: &State,
    request: Request<Incoming>,
    encoded_path: &str,
    open: OpenRequest,
) -> Response<Body> {
    let Some(path) = percent_decode(encoded_path).and_then(|b| String::from_utf8(b).ok()) else {
        return not_found();
    };
    let query = request.uri().query().map(parse_query).unwrap_or_default();
    let get = |k: &str| query.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let principal = if let Some(sig) = get("sig") {
        let (Some(name), Some(expires)) = (get("principal"), get("expires")) else {
            return not_found();
        };
        let Ok(expires) = expires.parse::<i64>() else {
            return not_found();
        };
        if !state.signer.verify(name, &path, expires, sig) || now_secs() > expires {
            return not_found();
        }
        match Principal::new(name) {
            Ok(p) => p,
            Err(_) => return not_found(),
        }
    } else {
        match state.auth.authenticate(request.headers()) {
            Ok(p) => p,
            Err(f) => return state.auth.challenge(&f),
        }
    };
    if let Err(refused) = state.limits.admit(&principal) {
        return refused.response();
    }
    let permit = match state.limits.download_slot(&principal) {
        Ok(p) => p,
        Err(refused) => return refused.response(),
    };
    let Some(workspace) = workspace(state, &principal) else {
        return server_fault();
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
        return not_found();
    };
    // The download slot and the open-request count are held until the file has been sent
    // (or the client left, or stopped reading for `send_timeout`).
    let mut r = Response::new(body::file(file, len, (permit, open)));
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
    r
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

fn not_found() -> Response<Body> {
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
