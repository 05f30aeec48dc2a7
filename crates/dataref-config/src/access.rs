//! Who may call, and how: `[principals.NAME]` (bearer tokens stored as SHA-256 hashes, the
//! PostgreSQL role a principal runs as) and `[http]` (`dataref serve --http`: listen address,
//! public URL, Host and Origin checks, per-principal limits, signed downloads, JWTs).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use dataref_protocol::Principal;

use crate::error::{ConfigError, invalid};
use crate::raw::{RawHttp, RawJwt, RawPrincipal};
use crate::units::{duration, size};

/// One principal that may call over HTTP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrincipalConfig {
    pub name: Principal,
    /// SHA-256 digests of the bearer tokens that authenticate as this principal (the
    /// tokens themselves are never stored). `dataref token new NAME` makes one.
    pub token_sha256: Vec<[u8; 32]>,
    /// The PostgreSQL role this principal's producer calls run as. Default: its name.
    pub pg_role: Option<String>,
    /// The password model-written SQL logs in to PostgreSQL with as `pg_role` (`${NAME}`
    /// expanded when dataref connects). None: no password is sent (`peer`, `cert` or
    /// `trust` in `pg_hba.conf`).
    pub pg_password: Option<String>,
    /// The MySQL user its calls on `mysql` sources log in as.
    pub mysql_user: Option<String>,
    /// The password of `mysql_user` (`${NAME}` expanded when dataref connects).
    pub mysql_password: Option<String>,
    /// Its own options for each ADBC source, laid over the source's `options`.
    pub adbc: BTreeMap<String, BTreeMap<String, String>>,
}

/// `dataref serve --http`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpConfig {
    /// Where to listen when `--http` gives no address. Default `127.0.0.1:8750`.
    pub listen: SocketAddr,
    /// The URL people and hosts reach this server at (protected-resource metadata, signed
    /// download links). Default `http://{listen}`.
    pub public_url: Option<String>,
    /// Require a bearer token (or JWT). Default true. Off is allowed on loopback only;
    /// every caller is then `server.principal`.
    pub auth: bool,
    /// Accepted `Host` values (names, or `name:port`). Default: loopback names and the
    /// host of `public_url`.
    pub allowed_hosts: Vec<String>,
    /// Accepted `Origin` values (`scheme://host[:port]`). A request without `Origin` passes.
    /// Default: the origin of `public_url` only.
    pub allowed_origins: Vec<String>,
    /// Requests one principal may have in flight at once; more get 429. Default 8.
    pub max_concurrent: usize,
    /// Requests per minute one principal may make (a token bucket, bursts up to a tenth
    /// of it, at least 10); more get 429 with `Retry-After`. Default 600.
    pub rate_per_minute: u32,
    /// How long a signed download URL stays valid. Default 15 min.
    pub download_ttl: Duration,
    /// The HMAC key of signed download URLs, `${NAME}` expanded at start. Default: a
    /// random key per process (links die with a restart).
    pub signing_key: Option<String>,
    /// Downloads (`GET /files/…`, by token or signed link) one principal may have in
    /// flight at once, counted apart from `max_concurrent` so a stalled download cannot
    /// hold the slots of tool calls; more get 429. Default 8.
    pub max_downloads: usize,
    /// A request body must have arrived whole within this; a slower one gets 408 and its
    /// connection is closed. An upload may take longer, but not this long without a byte.
    /// Default 30 s.
    pub body_timeout: Duration,
    /// Bytes of one upload (`PUT /files/…`), at most. Default 256 MiB.
    pub max_upload_bytes: u64,
    /// A response (a download, a tool call's stream) the client stops reading for this
    /// long is abandoned and its connection closed. Default 30 s.
    pub send_timeout: Duration,
    /// Also accept JWTs as bearer tokens.
    pub jwt: Option<JwtConfig>,
    /// The file has an `[http]` table: it is meant for `serve --http`, so `dataref doctor`
    /// fails what the server would refuse. Default false.
    pub in_file: bool,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8750)),
            public_url: None,
            auth: true,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            max_concurrent: 8,
            rate_per_minute: 600,
            download_ttl: Duration::from_secs(15 * 60),
            signing_key: None,
            max_downloads: 8,
            body_timeout: Duration::from_secs(30),
            max_upload_bytes: 256 << 20,
            send_timeout: Duration::from_secs(30),
            jwt: None,
            in_file: false,
        }
    }
}

/// JWT bearer tokens: the signature checked with `key`, `exp` required, `nbf`, `iss` and
/// `aud` checked when configured, the principal read from `principal_claim`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtConfig {
    pub key: JwtKey,
    /// The claim that names the principal. Default `sub`.
    pub principal_claim: String,
    /// The `iss` every token must carry. Required for RS256 unless `require_issuer = false`.
    pub issuer: Option<String>,
    /// A value every token's `aud` must carry (tokens minted for another service are
    /// refused). Required unless `require_audience = false`.
    pub audience: Option<String>,
    /// `false`: the operator accepts tokens for any audience (no `audience` set).
    pub require_audience: bool,
    /// `false`: the operator accepts RS256 tokens of any issuer the JWKS signs for.
    pub require_issuer: bool,
    /// Clock skew allowed on `exp` and `nbf`. Default 60 s.
    pub leeway: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum JwtKey {
    /// HS256 with a shared secret (`${NAME}` expanded at start).
    Hs256 { secret: String },
    /// RS256 with the RSA keys of a JWKS file (`{"keys": [{"kty": "RSA", "kid", "n", "e"}]}`).
    Rs256 { jwks_file: PathBuf },
}

pub(crate) fn resolve_principals(
    raw: BTreeMap<String, RawPrincipal>,
) -> Result<BTreeMap<Principal, PrincipalConfig>, ConfigError> {
    let mut out = BTreeMap::new();
    let mut seen: BTreeMap<[u8; 32], String> = BTreeMap::new();
    for (name, p) in raw {
        let what = format!("principals.{name}");
        let principal = Principal::new(&name)
            .map_err(|e| invalid(&what, e.to_string(), "use letters, digits and `._@-`"))?;
        let mut hashes = Vec::with_capacity(p.token_sha256.len());
        for h in &p.token_sha256 {
            let digest = parse_sha256(h).ok_or_else(|| {
                invalid(
                    format!("{what}.token_sha256"),
                    format!("`{h}` is not a SHA-256 digest (64 hex digits)"),
                    "make a token with `dataref token new NAME` and paste the line it prints",
                )
            })?;
            if let Some(other) = seen.insert(digest, name.clone()) {
                return Err(invalid(
                    format!("{what}.token_sha256"),
                    format!("the same token is also given to `{other}`"),
                    "every token must name one principal; make another with `dataref token new NAME`",
                ));
            }
            hashes.push(digest);
        }
        if let Some(role) = &p.pg_role
            && (role.is_empty() || role.len() > 63 || role.contains('\0'))
        {
            return Err(invalid(
                format!("{what}.pg_role"),
                "must be a PostgreSQL role name (1 to 63 bytes)",
                "e.g. `pg_role = \"eu_analyst\"`",
            ));
        }
        if let Some(user) = &p.mysql_user
            && (user.is_empty() || user.chars().count() > 80 || user.contains('\0'))
        {
            return Err(invalid(
                format!("{what}.mysql_user"),
                "must be a MySQL user name (1 to 80 characters)",
                "e.g. `mysql_user = \"eu_analyst\"`",
            ));
        }
        out.insert(
            principal.clone(),
            PrincipalConfig {
                name: principal,
                token_sha256: hashes,
                pg_role: p.pg_role,
                pg_password: p.pg_password,
                mysql_user: p.mysql_user,
                mysql_password: p.mysql_password,
                adbc: p.adbc,
            },
        );
    }
    Ok(out)
}

fn parse_sha256(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.strip_prefix("sha256:").unwrap_or(hex);
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

pub(crate) fn resolve_http(raw: RawHttp, base: &Path) -> Result<HttpConfig, ConfigError> {
    let d = HttpConfig::default();
    let listen = match &raw.listen {
        None => d.listen,
        Some(l) => l.parse().map_err(|_| {
            invalid(
                "http.listen",
                format!("`{l}` is not an address and port"),
                "e.g. `listen = \"127.0.0.1:8750\"` or `\"0.0.0.0:8750\"`",
            )
        })?,
    };
    if let Some(url) = &raw.public_url
        && !(url.starts_with("http://") || url.starts_with("https://"))
    {
        return Err(invalid(
            "http.public_url",
            format!("`{url}` is not an http(s) URL"),
            "e.g. `public_url = \"https://dataref.example.com\"`",
        ));
    }
    let max_concurrent = raw.max_concurrent.unwrap_or(d.max_concurrent);
    if !(1..=1024).contains(&max_concurrent) {
        return Err(invalid(
            "http.max_concurrent",
            "must be between 1 and 1024",
            "the default is 8",
        ));
    }
    let rate_per_minute = raw.rate_per_minute.unwrap_or(d.rate_per_minute);
    if rate_per_minute == 0 {
        return Err(invalid(
            "http.rate_per_minute",
            "must be above zero",
            "the default is 600",
        ));
    }
    let download_ttl = duration("http.download_ttl", &raw.download_ttl, d.download_ttl)?;
    if download_ttl.is_zero() || download_ttl > Duration::from_secs(7 * 24 * 3600) {
        return Err(invalid(
            "http.download_ttl",
            "must be longer than zero and at most 7 days",
            "the default is `15m`",
        ));
    }
    for o in raw.allowed_origins.iter().flatten() {
        if o != "null" && !o.contains("://") {
            return Err(invalid(
                "http.allowed_origins",
                format!("`{o}` has no scheme"),
                "write origins as `https://app.example.com` or `http://localhost:*`",
            ));
        }
    }
    let max_downloads = raw.max_downloads.unwrap_or(d.max_downloads);
    if !(1..=1024).contains(&max_downloads) {
        return Err(invalid(
            "http.max_downloads",
            "must be between 1 and 1024",
            "the default is 8",
        ));
    }
    let body_timeout = duration("http.body_timeout", &raw.body_timeout, d.body_timeout)?;
    let send_timeout = duration("http.send_timeout", &raw.send_timeout, d.send_timeout)?;
    for (key, value) in [
        ("http.body_timeout", body_timeout),
        ("http.send_timeout", send_timeout),
    ] {
        if value.is_zero() || value > Duration::from_secs(3600) {
            return Err(invalid(
                key,
                "must be longer than zero and at most 1 hour",
                "the default is `30s`",
            ));
        }
    }
    let max_upload_bytes = size("http.max_upload", &raw.max_upload, d.max_upload_bytes)?;
    if max_upload_bytes == 0 {
        return Err(invalid(
            "http.max_upload",
            "must be more than zero",
            "the default is `256MiB`",
        ));
    }
    let jwt = raw.jwt.map(|j| resolve_jwt(j, base)).transpose()?;
    Ok(HttpConfig {
        listen,
        public_url: raw.public_url.map(|u| u.trim_end_matches('/').to_owned()),
        auth: raw.auth.unwrap_or(d.auth),
        allowed_hosts: raw.allowed_hosts.unwrap_or_default(),
        allowed_origins: raw.allowed_origins.unwrap_or_default(),
        max_concurrent,
        rate_per_minute,
        download_ttl,
        signing_key: raw.signing_key,
        max_downloads,
        body_timeout,
        max_upload_bytes,
        send_timeout,
        jwt,
        in_file: true,
    })
}

fn resolve_jwt(raw: RawJwt, base: &Path) -> Result<JwtConfig, ConfigError> {
    let key = match raw.algorithm.as_str() {
        "HS256" => {
            if raw.jwks_file.is_some() {
                return Err(invalid(
                    "http.jwt.jwks_file",
                    "HS256 takes `secret`, not `jwks_file`",
                    "set `algorithm = \"RS256\"` for a JWKS file",
                ));
            }
            let secret = raw.secret.ok_or_else(|| {
                invalid(
                    "http.jwt",
                    "HS256 needs `secret`",
                    "e.g. `secret = \"${DATAREF_JWT_SECRET}\"` (expanded from the environment)",
                )
            })?;
            JwtKey::Hs256 { secret }
        }
        "RS256" => {
            if raw.secret.is_some() {
                return Err(invalid(
                    "http.jwt.secret",
                    "RS256 takes `jwks_file`, not `secret`",
                    "set `algorithm = \"HS256\"` for a shared secret",
                ));
            }
            let file = raw.jwks_file.ok_or_else(|| {
                invalid(
                    "http.jwt",
                    "RS256 needs `jwks_file`",
                    "e.g. `jwks_file = \"jwks.json\"` (relative to this file)",
                )
            })?;
            JwtKey::Rs256 {
                jwks_file: base.join(file),
            }
        }
        other => {
            return Err(invalid(
                "http.jwt.algorithm",
                format!("unsupported algorithm `{other}`"),
                "use `HS256` or `RS256`",
            ));
        }
    };
    let require_audience = raw.require_audience.unwrap_or(true);
    if require_audience && raw.audience.is_none() {
        return Err(invalid(
            "http.jwt.audience",
            "is not set, so tokens your identity provider mints for any other service would be accepted here",
            "set `audience` to the value your identity provider puts into `aud` for this server (e.g. `audience = \"dataref\"`), or accept every audience with `require_audience = false`",
        ));
    }
    let require_issuer = raw.require_issuer.unwrap_or(true);
    if require_issuer && raw.issuer.is_none() && matches!(key, JwtKey::Rs256 { .. }) {
        return Err(invalid(
            "http.jwt.issuer",
            "is not set, so RS256 tokens of any issuer these keys sign for would be accepted",
            "set `issuer` to your identity provider's `iss` (e.g. `issuer = \"https://idp.example.com\"`), or accept every issuer with `require_issuer = false`",
        ));
    }
    Ok(JwtConfig {
        key,
        principal_claim: raw.principal_claim.unwrap_or_else(|| "sub".into()),
        issuer: raw.issuer,
        audience: raw.audience,
        require_audience,
        require_issuer,
        leeway: duration("http.jwt.leeway", &raw.leeway, Duration::from_secs(60))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::from_toml_str(text, Path::new("/etc/dataref"), "/tmp/home".into())
    }

    #[test]
    fn principals_and_http() {
        let hash = "a".repeat(64);
        let c = parse(&format!(
            r#"
[principals.eu_analyst]
token_sha256 = ["{hash}"]
[principals."us.analyst"]
pg_role = "us_analyst"
pg_password = "${{US_PG_PASSWORD}}"
[http]
listen = "0.0.0.0:9000"
public_url = "https://dataref.example.com/"
max_concurrent = 4
rate_per_minute = 120
download_ttl = "5m"
[http.jwt]
algorithm = "RS256"
jwks_file = "jwks.json"
principal_claim = "email"
issuer = "https://idp.example.com"
audience = "dataref"
"#
        ))
        .unwrap_or_else(|e| panic!("{e}"));
        let eu = Principal::new("eu_analyst").unwrap_or_else(|e| panic!("{e}"));
        let us = Principal::new("us.analyst").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.principals[&eu].token_sha256, vec![[0xaa; 32]]);
        assert_eq!(c.pg_role(&eu), "eu_analyst");
        assert_eq!(c.pg_role(&us), "us_analyst");
        assert_eq!(c.pg_password(&us), Some("${US_PG_PASSWORD}"));
        assert_eq!(c.pg_password(&eu), None);
        assert_eq!(c.http.listen.port(), 9000);
        assert_eq!(
            c.http.public_url.as_deref(),
            Some("https://dataref.example.com")
        );
        assert_eq!(c.http.download_ttl, Duration::from_secs(300));
        let jwt = c.http.jwt.unwrap_or_else(|| panic!("jwt"));
        assert_eq!(
            jwt.key,
            JwtKey::Rs256 {
                jwks_file: "/etc/dataref/jwks.json".into()
            }
        );
        assert_eq!(jwt.principal_claim, "email");
    }

    #[test]
    fn bad_values_name_the_key() {
        let cases = [
            (
                "[principals.a]\ntoken_sha256 = [\"abc\"]",
                "principals.a.token_sha256",
            ),
            (
                "[principals.a]\ntoken_sha256 = [\"{h}\"]\n[principals.b]\ntoken_sha256 = [\"{h}\"]",
                "principals.b.token_sha256",
            ),
            ("[principals.\"a b\"]", "principals.a b"),
            ("[http]\nlisten = \"nowhere\"", "http.listen"),
            ("[http]\nmax_concurrent = 0", "http.max_concurrent"),
            (
                "[http]\nallowed_origins = [\"example.com\"]",
                "http.allowed_origins",
            ),
            ("[http.jwt]\nalgorithm = \"none\"", "http.jwt.algorithm"),
            ("[http.jwt]\nalgorithm = \"HS256\"", "http.jwt"),
            ("[http]\nmax_downloads = 0", "http.max_downloads"),
            ("[http]\nbody_timeout = \"0s\"", "http.body_timeout"),
            (
                "[http.jwt]\nalgorithm = \"HS256\"\nsecret = \"s\"",
                "http.jwt.audience",
            ),
            (
                "[http.jwt]\nalgorithm = \"RS256\"\njwks_file = \"k.json\"\naudience = \"dataref\"",
                "http.jwt.issuer",
            ),
        ];
        let h = "b".repeat(64);
        for (text, key) in cases {
            let text = text.replace("{h}", &h);
            match parse(&text) {
                Err(ConfigError::Invalid { what, .. }) => assert_eq!(what, key, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
    }
}
