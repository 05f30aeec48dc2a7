//! JWT bearer tokens (`[http.jwt]`): HS256 with a shared secret or RS256 with the RSA keys
//! of a JWKS file (chosen by `kid`). The header's `alg` must be the configured one (never
//! `none`), and a header with `crit` is refused: this server understands no extension, and
//! RFC 7515 §4.1.11 says a token whose critical extensions are not understood is invalid.
//! `exp` is required, `nbf` checked when present, `iss` and `aud` must match when
//! configured (and `audience`, and for RS256 `issuer`, must be configured unless the
//! operator turned that off), with `leeway` on the times; the principal is the string in
//! `principal_claim` and must be a valid principal name.

use std::collections::HashMap;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use dataref_config::{JwtConfig, JwtKey};
use dataref_protocol::Principal;
use ring::hmac;
use ring::signature::{RSA_PKCS1_2048_8192_SHA256, RsaPublicKeyComponents};
use serde::Deserialize;
use serde_json::Value;

use crate::error::{HttpError, expand_setting};

/// Longer tokens are refused before any decoding.
const MAX_TOKEN_BYTES: usize = 16 * 1024;

pub(crate) struct Verifier {
    key: Key,
    principal_claim: String,
    issuer: Option<String>,
    audience: Option<String>,
    leeway: i64,
}

enum Key {
    Hs256(hmac::Key),
    /// By `kid` (`""` for a key without one).
    Rs256(HashMap<String, Rsa>),
}

struct Rsa {
    n: Vec<u8>,
    e: Vec<u8>,
}

#[derive(Deserialize)]
struct Header {
    alg: String,
    kid: Option<String>,
    /// Present at all (even `[]`, which RFC 7515 forbids): refused.
    crit: Option<Value>,
}

#[derive(Deserialize)]
struct Jwks {
    keys: Vec<Jwk>,
}

#[derive(Deserialize)]
struct Jwk {
    kty: String,
    kid: Option<String>,
    n: Option<String>,
    e: Option<String>,
    alg: Option<String>,
    #[serde(rename = "use")]
    usage: Option<String>,
}

/// Three base64url parts: worth trying as a JWT (opaque tokens have no dots).
pub(crate) fn looks_like_jwt(token: &str) -> bool {
    token.bytes().filter(|b| *b == b'.').count() == 2
}

impl Verifier {
    pub(crate) fn new(
        config: &JwtConfig,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, HttpError> {
        let key = match &config.key {
            JwtKey::Hs256 { secret } => {
                let secret = expand_setting("http.jwt.secret", secret, lookup)?;
                if secret.len() < 32 {
                    return Err(HttpError::Setting {
                        key: "http.jwt.secret",
                        message: format!(
                            "an HS256 secret of {} bytes is too short to be safe",
                            secret.len()
                        ),
                        hint: "use at least 32 random bytes, e.g. `openssl rand -base64 48`".into(),
                    });
                }
                Key::Hs256(hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes()))
            }
            JwtKey::Rs256 { jwks_file } => Key::Rs256(load_jwks(jwks_file)?),
            other => {
                return Err(HttpError::Setting {
                    key: "http.jwt.algorithm",
                    message: format!("{other:?} is not supported by this server"),
                    hint: "use `HS256` or `RS256`".into(),
                });
            }
        };
        if config.require_audience && config.audience.is_none() {
            return Err(HttpError::Setting {
                key: "http.jwt.audience",
                message: "is not set, so tokens minted for any other service would be accepted".into(),
                hint: "set `audience` to the `aud` your identity provider gives this server, or accept every audience with `require_audience = false`".into(),
            });
        }
        if config.require_issuer && config.issuer.is_none() && matches!(key, Key::Rs256(_)) {
            return Err(HttpError::Setting {
                key: "http.jwt.issuer",
                message: "is not set, so RS256 tokens of any issuer would be accepted".into(),
                hint: "set `issuer` to your identity provider's `iss`, or accept every issuer with `require_issuer = false`".into(),
            });
        }
        Ok(Self {
            key,
            principal_claim: config.principal_claim.clone(),
            issuer: config.issuer.clone(),
            audience: config.audience.clone(),
            leeway: i64::try_from(config.leeway.as_secs()).unwrap_or(i64::MAX),
        })
    }

    pub(crate) fn issuer(&self) -> Option<&str> {
        self.issuer.as_deref()
    }

    /// The principal a valid token names; otherwise why not (for the log).
    pub(crate) fn verify(&self, token: &str, now: i64) -> Result<Principal, String> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err("the JWT is too long".into());
        }
        let mut parts = token.split('.');
        let (Some(h), Some(c), Some(s), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err("not a JWT (three parts)".into());
        };
        let header: Header = decode_json(h).map_err(|e| format!("JWT header: {e}"))?;
        if let Some(crit) = &header.crit {
            let shown = dataref_protocol::truncate_echo(&crit.to_string());
            return Err(format!(
                "the JWT header's `crit` names extensions this server does not understand: {shown}"
            ));
        }
        let signature = URL_SAFE_NO_PAD
            .decode(s)
            .map_err(|_| "JWT signature is not base64url".to_owned())?;
        let signed = &token.as_bytes()[..h.len() + 1 + c.len()];
        match &self.key {
            Key::Hs256(key) => {
                if header.alg != "HS256" {
                    return Err(format!("JWT `alg` is `{}`, expected HS256", header.alg));
                }
                hmac::verify(key, signed, &signature)
                    .map_err(|_| "JWT signature does not verify".to_owned())?;
            }
            Key::Rs256(keys) => {
                if header.alg != "RS256" {
                    return Err(format!("JWT `alg` is `{}`, expected RS256", header.alg));
                }
                let rsa = match &header.kid {
                    Some(kid) => keys.get(kid),
                    None if keys.len() == 1 => keys.values().next(),
                    None => None,
                }
                .ok_or_else(|| format!("no JWKS key has `kid` {:?}", header.kid))?;
                RsaPublicKeyComponents {
                    n: &rsa.n,
                    e: &rsa.e,
                }
                .verify(&RSA_PKCS1_2048_8192_SHA256, signed, &signature)
                .map_err(|_| "JWT signature does not verify".to_owned())?;
            }
        }
        let claims: serde_json::Map<String, Value> =
            decode_json(c).map_err(|e| format!("JWT claims: {e}"))?;
        let time = |name: &str| -> Result<Option<i64>, String> {
            match claims.get(name) {
                None => Ok(None),
                Some(v) => v
                    .as_i64()
                    .or_else(|| v.as_f64().map(|f| f as i64))
                    .map(Some)
                    .ok_or_else(|| format!("JWT `{name}` is not a number")),
            }
        };
        let exp = time("exp")?.ok_or("the JWT has no `exp`")?;
        if now > exp.saturating_add(self.leeway) {
            return Err("the JWT has expired".into());
        }
        if let Some(nbf) = time("nbf")?
            && now.saturating_add(self.leeway) < nbf
        {
            return Err("the JWT is not valid yet (`nbf`)".into());
        }
        if let Some(issuer) = &self.issuer
            && claims.get("iss").and_then(Value::as_str) != Some(issuer.as_str())
        {
            return Err("the JWT's `iss` is not the configured issuer".into());
        }
        if let Some(audience) = &self.audience {
            let ok = match claims.get("aud") {
                Some(Value::String(a)) => a == audience,
                Some(Value::Array(list)) => list.iter().any(|a| a.as_str() == Some(audience)),
                _ => false,
            };
            if !ok {
                return Err("the JWT's `aud` does not include the configured audience".into());
            }
        }
        let name = claims
            .get(&self.principal_claim)
            .and_then(Value::as_str)
            .ok_or_else(|| format!("the JWT has no string claim `{}`", self.principal_claim))?;
        Principal::new(name).map_err(|e| format!("the JWT names an invalid principal: {e}"))
    }
}

fn decode_json<T: serde::de::DeserializeOwned>(part: &str) -> Result<T, String> {
    let bytes = URL_SAFE_NO_PAD
        .decode(part)
        .map_err(|_| "not base64url".to_owned())?;
    serde_json::from_slice(&bytes).map_err(|e| format!("not the expected JSON: {e}"))
}

/// The RSA signing keys of a JWKS file, by `kid`.
fn load_jwks(path: &std::path::Path) -> Result<HashMap<String, Rsa>, HttpError> {
    let bad = |message: String| {
        HttpError::Setting {
        key: "http.jwt.jwks_file",
        message,
        hint: "give a JWKS file: `{\"keys\": [{\"kty\": \"RSA\", \"kid\": \"…\", \"n\": \"…\", \"e\": \"…\"}]}`".into(),
    }
    };
    #[expect(
        clippy::disallowed_methods,
        reason = "an operator's config file, read once at start"
    )]
    let text = std::fs::read_to_string(path)
        .map_err(|e| bad(format!("cannot read `{}`: {e}", path.display())))?;
    let jwks: Jwks = serde_json::from_str(&text)
        .map_err(|e| bad(format!("`{}` is not a JWKS: {e}", path.display())))?;
    let mut keys = HashMap::new();
    for k in jwks.keys {
        let signing = k.usage.as_deref().is_none_or(|u| u == "sig")
            && k.alg.as_deref().is_none_or(|a| a == "RS256");
        if k.kty != "RSA" || !signing {
            continue;
        }
        let part = |v: Option<String>, name: &str| {
            v.and_then(|v| URL_SAFE_NO_PAD.decode(v.trim_end_matches('=')).ok())
                .ok_or_else(|| bad(format!("a key's `{name}` is missing or not base64url")))
        };
        let rsa = Rsa {
            n: part(k.n, "n")?,
            e: part(k.e, "e")?,
        };
        keys.insert(k.kid.unwrap_or_default(), rsa);
    }
    if keys.is_empty() {
        return Err(bad(format!("`{}` has no RSA signing key", path.display())));
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const SECRET: &str = "0123456789abcdef0123456789abcdef-test";

    fn hs256(claims: &Value, secret: &str) -> String {
        let h = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
        let c = URL_SAFE_NO_PAD.encode(claims.to_string());
        let input = format!("{h}.{c}");
        let key = hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes());
        let sig = URL_SAFE_NO_PAD.encode(hmac::sign(&key, input.as_bytes()));
        format!("{input}.{sig}")
    }

    fn verifier() -> Verifier {
        let config = JwtConfig {
            key: JwtKey::Hs256 {
                secret: "${SECRET}".into(),
            },
            principal_claim: "sub".into(),
            issuer: Some("https://idp.example.com".into()),
            audience: Some("dataref".into()),
            require_audience: true,
            require_issuer: true,
            leeway: Duration::from_secs(60),
        };
        Verifier::new(&config, &|n| (n == "SECRET").then(|| SECRET.to_owned()))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn claims_are_checked() {
        let v = verifier();
        let now = 1_800_000_000;
        let ok = serde_json::json!({"sub": "eu_analyst", "exp": now + 300, "iss": "https://idp.example.com", "aud": ["x", "dataref"]});
        assert_eq!(
            v.verify(&hs256(&ok, SECRET), now).unwrap().as_str(),
            "eu_analyst"
        );
        let mut expired = ok.clone();
        expired["exp"] = (now - 61).into();
        assert!(
            v.verify(&hs256(&expired, SECRET), now)
                .unwrap_err()
                .contains("expired")
        );
        let mut within_leeway = ok.clone();
        within_leeway["exp"] = (now - 30).into();
        assert!(v.verify(&hs256(&within_leeway, SECRET), now).is_ok());
        let mut no_exp = ok.clone();
        no_exp.as_object_mut().unwrap().remove("exp");
        assert!(
            v.verify(&hs256(&no_exp, SECRET), now)
                .unwrap_err()
                .contains("exp")
        );
        let mut early = ok.clone();
        early["nbf"] = (now + 600).into();
        assert!(
            v.verify(&hs256(&early, SECRET), now)
                .unwrap_err()
                .contains("nbf")
        );
        let mut aud = ok.clone();
        aud["aud"] = "other".into();
        assert!(
            v.verify(&hs256(&aud, SECRET), now)
                .unwrap_err()
                .contains("aud")
        );
        let mut iss = ok.clone();
        iss["iss"] = "https://evil.example.com".into();
        assert!(
            v.verify(&hs256(&iss, SECRET), now)
                .unwrap_err()
                .contains("iss")
        );
        let mut bad_name = ok.clone();
        bad_name["sub"] = "a b".into();
        assert!(
            v.verify(&hs256(&bad_name, SECRET), now)
                .unwrap_err()
                .contains("principal")
        );
        let forged = hs256(&ok, "another secret of enough length!!!!");
        assert!(v.verify(&forged, now).unwrap_err().contains("signature"));
    }

    #[test]
    fn alg_none_and_junk_are_refused() {
        let v = verifier();
        let h = URL_SAFE_NO_PAD.encode(br#"{"alg":"none"}"#);
        let c = URL_SAFE_NO_PAD.encode(br#"{"sub":"a","exp":9999999999}"#);
        assert!(
            v.verify(&format!("{h}.{c}."), 0)
                .unwrap_err()
                .contains("alg")
        );
        assert!(v.verify("a.b.c", 0).is_err());
        assert!(v.verify("..", 0).is_err());
    }

    /// A validly signed token whose header makes an extension critical is refused, whatever
    /// the extension (this server understands none), and so is the forbidden empty list.
    #[test]
    fn crit_headers_are_refused() {
        let v = verifier();
        let now = 1_800_000_000;
        let claims = serde_json::json!({"sub": "eu_analyst", "exp": now + 300, "iss": "https://idp.example.com", "aud": "dataref"});
        let signed = |header: &Value| {
            let h = URL_SAFE_NO_PAD.encode(header.to_string());
            let c = URL_SAFE_NO_PAD.encode(claims.to_string());
            let input = format!("{h}.{c}");
            let key = hmac::Key::new(hmac::HMAC_SHA256, SECRET.as_bytes());
            let sig = URL_SAFE_NO_PAD.encode(hmac::sign(&key, input.as_bytes()));
            format!("{input}.{sig}")
        };
        let plain = serde_json::json!({"alg": "HS256"});
        assert!(v.verify(&signed(&plain), now).is_ok());
        for crit in [
            serde_json::json!({"alg": "HS256", "crit": ["exp_v2"], "exp_v2": 1}),
            serde_json::json!({"alg": "HS256", "crit": ["b64"], "b64": false}),
            serde_json::json!({"alg": "HS256", "crit": []}),
        ] {
            let e = v.verify(&signed(&crit), now).unwrap_err();
            assert!(e.contains("crit"), "{crit}: {e}");
        }
    }

    #[test]
    fn audience_and_rs256_issuer_must_be_configured_or_waived() {
        let mut config = JwtConfig {
            key: JwtKey::Hs256 {
                secret: SECRET.into(),
            },
            principal_claim: "sub".into(),
            issuer: None,
            audience: None,
            require_audience: true,
            require_issuer: true,
            leeway: Duration::from_secs(0),
        };
        let e = Verifier::new(&config, &|_| None).err().unwrap();
        assert!(e.to_string().contains("http.jwt.audience"), "{e}");
        assert!(
            e.hint().contains("require_audience = false"),
            "{}",
            e.hint()
        );
        // HS256 needs no issuer: the secret's holder is the only possible one.
        config.audience = Some("dataref".into());
        assert!(Verifier::new(&config, &|_| None).is_ok());
        config.audience = None;
        config.require_audience = false;
        let v = Verifier::new(&config, &|_| None).unwrap_or_else(|e| panic!("{e}"));
        let now = 1_800_000_000;
        let any_aud = hs256(&serde_json::json!({"sub": "a", "exp": now + 10}), SECRET);
        assert!(v.verify(&any_aud, now).is_ok(), "waived explicitly");
    }

    #[test]
    fn short_or_unset_secrets_are_setting_errors() {
        let mut config = JwtConfig {
            key: JwtKey::Hs256 {
                secret: "${NOPE}".into(),
            },
            principal_claim: "sub".into(),
            issuer: None,
            audience: None,
            require_audience: false,
            require_issuer: false,
            leeway: Duration::from_secs(0),
        };
        let e = Verifier::new(&config, &|_| None).err().unwrap();
        assert!(e.to_string().contains("`${NOPE}`"), "{e}");
        config.key = JwtKey::Hs256 {
            secret: "short".into(),
        };
        let e = Verifier::new(&config, &|_| None).err().unwrap();
        assert!(e.hint().contains("openssl rand"), "{}", e.hint());
    }
}
