//! Who is calling: `Authorization: Bearer <token>`, the token's SHA-256 looked up in
//! `[principals]` (or a JWT, [`super::jwt`]), or for downloads a signed link
//! ([`crate::links`]); and the 401 that tells a client where to learn how to get one. The
//! principal goes into the request's extensions as a [`Caller`], where the later layers
//! and [`dataref_mcp::DatarefServer::per_request`] find it.
//!
//! Tokens are compared by their digests: a lookup in a map keyed by SHA-256 leaks nothing
//! useful through timing, since nobody can choose a token with a given digest prefix.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use dataref_config::{HttpConfig, PrincipalConfig};
use dataref_mcp::Caller;
use dataref_protocol::Principal;
use http::{HeaderMap, StatusCode, header};
use ring::digest;
use ring::rand::{SecureRandom, SystemRandom};
use serde_json::json;

use super::jwt;
use crate::error::HttpError;
use crate::links::{self, Signer};
use crate::paths::METADATA_PATH;
use crate::response::{json_response, now_secs, refused_unread};

/// What the authentication layer accepts: a bearer token or JWT, and for downloads a
/// signed link too.
#[derive(Clone)]
pub(crate) struct Auth {
    pub(crate) tokens: Arc<Authenticator>,
    /// `Some`: a signed link (`?principal=…&expires=…&sig=…`) names the caller as well.
    pub(crate) links: Option<Arc<Signer>>,
}

/// The layer: the caller into the request's extensions, or the refusal.
pub(crate) async fn authenticate(
    State(auth): State<Auth>,
    mut request: Request,
    next: Next,
) -> Response {
    let signed = auth
        .links
        .as_ref()
        .and_then(|signer| links::signed_principal(signer, &request));
    let principal = match signed {
        Some(Ok(principal)) => principal,
        Some(Err(refused)) => {
            dataref_ops::metrics::auth_failed("signed_link");
            audit_refused(&request, "a signed link with a bad or expired signature");
            return refused_unread(request.headers(), refused);
        }
        None => match auth.tokens.authenticate(request.headers()) {
            Ok(principal) => principal,
            Err(failure) => {
                dataref_ops::metrics::auth_failed(match failure {
                    Failure::Missing => "missing",
                    Failure::Invalid(_) => "invalid",
                });
                if let Failure::Invalid(reason) = &failure {
                    audit_refused(&request, reason);
                }
                return refused_unread(request.headers(), auth.tokens.challenge(&failure));
            }
        },
    };
    request.extensions_mut().insert(Caller(principal));
    next.run(request).await
}

/// The address of the connection a request came on (the server puts it in each request's
/// extensions; a request through the router alone has none).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer(pub(crate) std::net::SocketAddr);

/// A refused credential into the audit trail: why, from where, for what; never the token.
fn audit_refused(request: &Request, reason: &str) {
    let remote = request.extensions().get::<Peer>().map(|p| p.0.to_string());
    dataref_ops::audit::auth_failed(
        reason,
        remote.as_deref(),
        request.method().as_str(),
        request.uri().path(),
    );
}

/// The caller [`authenticate`] put into the request; a request that passed no
/// authentication layer is a fault of ours (500), never served as nobody.
#[expect(
    clippy::result_large_err,
    reason = "the refusal is the response itself, made once per refused request"
)]
pub(crate) fn caller(request: &Request) -> Result<Principal, Response> {
    match request.extensions().get::<Caller>() {
        Some(Caller(principal)) => Ok(principal.clone()),
        None => {
            tracing::error!("a request passed the authentication layer without a principal");
            Err(json_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                json!({"error": "internal", "message": "the request carries no authenticated principal; the details are in the server log"}),
            ))
        }
    }
}

pub(crate) struct Authenticator {
    mode: Mode,
    /// The `WWW-Authenticate` value of a request without a token.
    challenge: String,
}

enum Mode {
    /// `[http] auth = false` (loopback only): everyone is this principal.
    Off(Principal),
    Tokens {
        by_digest: HashMap<[u8; 32], Principal>,
        jwt: Option<jwt::Verifier>,
    },
}

/// Why a request is not authenticated.
pub(crate) enum Failure {
    /// No `Authorization: Bearer` header.
    Missing,
    /// A token that names nobody; the reason is for the log, never for the caller.
    Invalid(String),
}

impl Authenticator {
    pub(crate) fn new(
        http: &HttpConfig,
        principals: &BTreeMap<Principal, PrincipalConfig>,
        anonymous: Principal,
        public_url: &str,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, HttpError> {
        let challenge = format!("Bearer resource_metadata=\"{public_url}{METADATA_PATH}\"");
        if !http.auth {
            return Ok(Self {
                mode: Mode::Off(anonymous),
                challenge,
            });
        }
        let by_digest: HashMap<[u8; 32], Principal> = principals
            .values()
            .flat_map(|p| p.token_sha256.iter().map(|d| (*d, p.name.clone())))
            .collect();
        let jwt = http
            .jwt
            .as_ref()
            .map(|j| jwt::Verifier::new(j, lookup))
            .transpose()?;
        if by_digest.is_empty() && jwt.is_none() {
            return Err(HttpError::NoCredentials);
        }
        Ok(Self {
            mode: Mode::Tokens { by_digest, jwt },
            challenge,
        })
    }

    /// The JWT issuer, named as the authorization server in the metadata.
    pub(crate) fn issuer(&self) -> Option<&str> {
        match &self.mode {
            Mode::Tokens { jwt: Some(j), .. } => j.issuer(),
            Mode::Off(_) | Mode::Tokens { jwt: None, .. } => None,
        }
    }

    pub(crate) fn authenticate(&self, headers: &HeaderMap) -> Result<Principal, Failure> {
        let (by_digest, jwt) = match &self.mode {
            Mode::Off(p) => return Ok(p.clone()),
            Mode::Tokens { by_digest, jwt } => (by_digest, jwt),
        };
        let token = bearer(headers)?;
        if let Some(verifier) = jwt
            && jwt::looks_like_jwt(token)
        {
            return verifier.verify(token, now_secs()).map_err(Failure::Invalid);
        }
        by_digest
            .get(&sha256(token.as_bytes()))
            .cloned()
            .ok_or_else(|| Failure::Invalid("no principal has this token".into()))
    }

    /// 401 with `WWW-Authenticate` and a JSON body saying what to send.
    fn challenge(&self, failure: &Failure) -> Response {
        let (value, body) = match failure {
            Failure::Missing => (
                self.challenge.clone(),
                json!({
                    "error": "unauthorized",
                    "message": "this server needs a bearer token",
                    "hint": "send `Authorization: Bearer <token>`; the operator makes a token with `dataref token new NAME`",
                }),
            ),
            Failure::Invalid(reason) => {
                tracing::info!(reason, "refused a bearer token");
                (
                    format!("{}, error=\"invalid_token\"", self.challenge),
                    json!({
                        "error": "invalid_token",
                        "message": "the bearer token is not valid (unknown, expired, or signed with another key)",
                        "hint": "ask the operator for a current token (`dataref token new NAME`), or get a fresh JWT from your identity provider",
                    }),
                )
            }
        };
        let mut r = json_response(StatusCode::UNAUTHORIZED, body);
        if let Ok(v) = header::HeaderValue::from_str(&value) {
            r.headers_mut().insert(header::WWW_AUTHENTICATE, v);
        }
        r
    }
}

/// The token of `Authorization: Bearer <token>` (the scheme in any case).
fn bearer(headers: &HeaderMap) -> Result<&str, Failure> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Err(Failure::Missing);
    };
    let value = value
        .to_str()
        .map_err(|_| Failure::Invalid("`Authorization` is not ASCII".into()))?;
    let (scheme, token) = value
        .split_once(' ')
        .ok_or_else(|| Failure::Invalid("`Authorization` has no scheme".into()))?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(Failure::Missing);
    }
    let token = token.trim();
    if token.is_empty() {
        return Err(Failure::Missing);
    }
    Ok(token)
}

pub(crate) fn sha256(bytes: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(digest::digest(&digest::SHA256, bytes).as_ref());
    out
}

/// A fresh bearer token and what goes into the config for it.
#[derive(Debug, Clone)]
pub struct NewToken {
    /// 256 random bits, base64url without padding (43 characters). Shown once.
    pub token: String,
    /// Its SHA-256, lower-case hex: the `token_sha256` value.
    pub sha256_hex: String,
}

/// Makes a token from the system's random source.
pub fn new_token() -> Result<NewToken, ring::error::Unspecified> {
    let mut bytes = [0u8; 32];
    SystemRandom::new().fill(&mut bytes)?;
    let token = URL_SAFE_NO_PAD.encode(bytes);
    let sha256_hex = sha256(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok(NewToken { token, sha256_hex })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_tokens_are_random_and_hashed() {
        let a = new_token().unwrap();
        let b = new_token().unwrap();
        assert_ne!(a.token, b.token);
        assert_eq!(a.token.len(), 43);
        assert_eq!(a.sha256_hex.len(), 64);
        // The digest of the text of the token, as the server computes it.
        let expected: String = sha256(a.token.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(a.sha256_hex, expected);
    }

    #[test]
    fn bearer_header_forms() {
        let mut h = HeaderMap::new();
        assert!(matches!(bearer(&h), Err(Failure::Missing)));
        h.insert(header::AUTHORIZATION, "bearer abc".parse().unwrap());
        assert_eq!(bearer(&h).ok(), Some("abc"));
        h.insert(header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert!(matches!(bearer(&h), Err(Failure::Missing)));
        h.insert(header::AUTHORIZATION, "Bearer ".parse().unwrap());
        assert!(matches!(bearer(&h), Err(Failure::Missing)));
    }
}
