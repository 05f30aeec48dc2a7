//! `serve --http` end to end: a real `HttpServer` on a loopback port, rmcp's Streamable
//! HTTP client (both protocol revisions) and raw reqwest for the HTTP-level answers; the
//! answers that need no connection (routing, the guard, the 401s, the page) through the
//! same server's router with `oneshot`.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers fail the test on setup errors"
)]

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use dataref_config::{HttpConfig, JwtConfig, JwtKey, PrincipalConfig};
use dataref_http::{HttpError, HttpOptions, HttpServer};
use dataref_mcp::DatarefServer;
use dataref_mcp::rmcp::model::{
    CallToolRequestParams, CallToolResult, ProtocolVersion, ReadResourceRequestParams,
};
use dataref_mcp::rmcp::service::RunningService;
use dataref_mcp::rmcp::transport::StreamableHttpClientTransport;
use dataref_mcp::rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use dataref_mcp::rmcp::{ClientLifecycleMode, ClientServiceExt, RoleClient, ServiceExt};
use dataref_protocol::Principal;
use dataref_tool::SharedContext;
use http_body_util::BodyExt;
use ring::{digest, hmac, rand, signature};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

use crate::support::Env;

const EU: &str = "eu-token-0123456789abcdef0123456789abcdef";
const US: &str = "us-token-0123456789abcdef0123456789abcdef";
const SIGNING_KEY: &str = "download-signing-key-for-tests-0123456789";
const HS_SECRET: &str = "hs256-secret-for-tests-0123456789abcdef";

type Client = RunningService<RoleClient, ()>;

struct Served {
    /// `http://127.0.0.1:PORT`
    base: String,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), HttpError>>,
}

impl Served {
    fn mcp(&self) -> String {
        format!("{}/mcp", self.base)
    }

    async fn stop(self) {
        self.stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(15), self.task).await;
    }
}

fn sha256(token: &str) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(digest::digest(&digest::SHA256, token.as_bytes()).as_ref());
    out
}

fn principals() -> BTreeMap<Principal, PrincipalConfig> {
    [("eu_analyst", EU), ("us_analyst", US)]
        .into_iter()
        .map(|(name, token)| {
            let p = Principal::new(name).unwrap();
            let c = PrincipalConfig {
                name: p.clone(),
                token_sha256: vec![sha256(token)],
                pg_role: None,
                pg_password: None,
                mysql_user: None,
                mysql_password: None,
                adbc: Default::default(),
            };
            (p, c)
        })
        .collect()
}

fn http_config() -> HttpConfig {
    HttpConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        signing_key: Some(SIGNING_KEY.into()),
        max_concurrent: 64,
        rate_per_minute: 1_000_000,
        ..HttpConfig::default()
    }
}

fn shared(env: &Env) -> SharedContext {
    SharedContext {
        home: env.home.path().to_path_buf(),
        store: env.store.clone(),
        limits: env.config.limits.clone(),
        clock: std::sync::Arc::new(dataref_store::SystemClock),
        mirrors: None,
    }
}

/// The server of `env` with `http`, bound to its address but not serving yet.
async fn bound(env: &Env, http: HttpConfig) -> HttpServer {
    dataref_config::tls::install_provider();
    let server = DatarefServer::per_request(env.registry.clone(), shared(env));
    let options = HttpOptions {
        http,
        principals: principals(),
        anonymous: Principal::new("local").unwrap(),
    };
    HttpServer::bind(server, options)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

async fn serve(env: &Env, http: HttpConfig) -> Served {
    let http = bound(env, http).await;
    let base = format!("http://{}", http.local_addr().unwrap());
    assert_eq!(http.mcp_url(), format!("{base}/mcp"));
    let stop = CancellationToken::new();
    let task = tokio::spawn(http.serve(stop.clone()));
    Served { base, stop, task }
}

/// A server bound but not serving: each request goes through its router with `oneshot`,
/// with the `Host` a client of `base` sends.
struct Routed {
    app: axum::Router,
    /// `http://127.0.0.1:PORT`
    base: String,
}

/// What a request through [`Routed`] got.
struct Answer {
    status: u16,
    headers: http::HeaderMap,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

async fn routed(env: &Env, http: HttpConfig) -> Routed {
    let http = bound(env, http).await;
    let base = format!("http://{}", http.local_addr().unwrap());
    Routed {
        app: http.router(),
        base,
    }
}

impl Routed {
    fn mcp(&self) -> String {
        format!("{}/mcp", self.base)
    }

    /// `method path` with `headers` (a `Host` of its own replaces the server's) and `body`.
    async fn send(
        &self,
        method: http::Method,
        path: &str,
        headers: &[(&str, &str)],
        body: String,
    ) -> Answer {
        let mut request = http::Request::builder().method(method).uri(path);
        if !headers.iter().any(|(name, _)| *name == "host") {
            request = request.header("host", self.base.trim_start_matches("http://"));
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = self
            .app
            .clone()
            .oneshot(request.body(body).unwrap())
            .await
            .unwrap_or_else(|never| match never {});
        let (parts, body) = response.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        Answer {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        }
    }

    async fn get(&self, path: &str, headers: &[(&str, &str)]) -> Answer {
        self.send(http::Method::GET, path, headers, String::new())
            .await
    }

    /// A raw `initialize` POST to `/mcp`, with `headers` besides the MCP ones.
    async fn initialize(&self, headers: &[(&str, &str)]) -> Answer {
        let mut all = vec![
            ("accept", MCP_ACCEPT),
            ("content-type", "application/json"),
            ("mcp-protocol-version", "2025-11-25"),
        ];
        all.extend_from_slice(headers);
        self.send(http::Method::POST, "/mcp", &all, initialize_body())
            .await
    }
}

async fn connect(url: &str, token: &str, version: &ProtocolVersion) -> Client {
    let config = StreamableHttpClientTransportConfig::with_uri(url).auth_header(token);
    let transport = StreamableHttpClientTransport::from_config(config);
    let client = if version == &ProtocolVersion::V_2026_07_28 {
        ().serve_with_lifecycle(
            transport,
            ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
        )
        .await
    } else {
        ().serve(transport).await
    };
    let client = client.unwrap_or_else(|e| panic!("connecting with {version}: {e}"));
    let negotiated = client
        .peer_info()
        .map(|i| i.protocol_version.clone())
        .unwrap_or_else(|| panic!("no server info"));
    assert_eq!(&negotiated, version);
    client
}

async fn call(client: &Client, tool: &str, args: Value) -> CallToolResult {
    let Value::Object(map) = args else {
        panic!("args must be an object")
    };
    client
        .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(map))
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e}"))
}

async fn read(client: &Client, uri: String) -> Result<(), String> {
    client
        .read_resource(ReadResourceRequestParams::new(uri))
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

fn text(r: &CallToolResult) -> String {
    r.content
        .first()
        .and_then(|c| c.as_text())
        .map(|t| t.text.clone())
        .unwrap_or_default()
}

fn http_client() -> reqwest::Client {
    dataref_config::tls::install_provider();
    reqwest::Client::builder().build().unwrap()
}

const MCP_ACCEPT: &str = "application/json, text/event-stream";

fn initialize_body() -> String {
    json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
    })
    .to_string()
}

/// A raw POST to `/mcp`.
async fn post(
    c: &reqwest::Client,
    url: &str,
    token: Option<&str>,
    session: Option<&str>,
    body: String,
) -> reqwest::Response {
    let mut r = c
        .post(url)
        .header("accept", MCP_ACCEPT)
        .header("content-type", "application/json")
        .header("mcp-protocol-version", "2025-11-25")
        .body(body);
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    if let Some(s) = session {
        r = r.header("mcp-session-id", s);
    }
    r.send().await.unwrap()
}

/// eu's data, files and resources are invisible to us: each answer is the one for a
/// thing that does not exist, over both protocol revisions.
#[tokio::test(flavor = "multi_thread")]
async fn principals_cannot_reach_each_others_artifacts_files_or_resources() {
    let env = Env::new(500).unwrap();
    let served = serve(&env, http_config()).await;
    for version in [ProtocolVersion::V_2025_11_25, ProtocolVersion::V_2026_07_28] {
        let eu = connect(&served.mcp(), EU, &version).await;
        let us = connect(&served.mcp(), US, &version).await;

        let fetched = call(&eu, "fetch_sales", json!({"since": "2025-01-01"})).await;
        assert_ne!(fetched.is_error, Some(true), "{}", text(&fetched));
        let data_ref = fetched.structured_content.as_ref().unwrap()["dataRef"]
            .as_str()
            .unwrap()
            .to_owned();
        let exported = call(
            &eu,
            "export_data",
            json!({"source": data_ref, "format": "csv", "filename": "sales"}),
        )
        .await;
        assert_ne!(exported.is_error, Some(true), "{}", text(&exported));
        let path = exported.structured_content.as_ref().unwrap()["path"]
            .as_str()
            .unwrap()
            .to_owned();

        // The export links the file for the person twice: as a resource, and as a signed
        // download URL that needs no token.
        let links: Vec<String> = exported
            .content
            .iter()
            .filter_map(|c| c.as_resource_link())
            .map(|l| l.uri.clone())
            .collect();
        assert_eq!(links.len(), 2, "{links:?}");
        assert!(
            links[0].starts_with("dataref://files/exports/"),
            "{links:?}"
        );
        assert!(
            links[1].starts_with(&format!("{}/files/exports/", served.base)),
            "{links:?}"
        );
        let r = http_client().get(&links[1]).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["content-type"], "text/csv");

        // describe_data: eu's ref answers like a ref nobody minted.
        let own = call(&eu, "describe_data", json!({"dataRef": data_ref})).await;
        assert_ne!(own.is_error, Some(true), "{}", text(&own));
        let theirs = call(&us, "describe_data", json!({"dataRef": data_ref})).await;
        let unknown_ref = "data_AAAAAAAAAAAAAAAAAAAAAA";
        let unknown = call(&us, "describe_data", json!({"dataRef": unknown_ref})).await;
        assert_eq!(theirs.is_error, Some(true));
        assert_eq!(
            text(&theirs).replace(&data_ref, "REF"),
            text(&unknown).replace(unknown_ref, "REF"),
            "{version}"
        );

        // read_file: eu's export is not in us's workspace.
        let own = call(&eu, "read_file", json!({"path": path})).await;
        assert_ne!(own.is_error, Some(true), "{}", text(&own));
        let theirs = call(&us, "read_file", json!({"path": path})).await;
        let missing = call(&us, "read_file", json!({"path": "exports/nothing.csv"})).await;
        assert_eq!(theirs.is_error, Some(true));
        assert_eq!(
            text(&theirs).replace(&path, "P"),
            text(&missing).replace("exports/nothing.csv", "P")
        );

        // resources/read: the same "not found" for someone else's and for nobody's.
        let artifact = |r: &str| format!("dataref://artifacts/{r}");
        assert!(read(&eu, artifact(&data_ref)).await.is_ok());
        let theirs = read(&us, artifact(&data_ref)).await.unwrap_err();
        let nobody = read(&us, artifact(unknown_ref)).await.unwrap_err();
        assert_eq!(
            theirs.replace(&data_ref, "REF"),
            nobody.replace(unknown_ref, "REF")
        );
        assert!(read(&eu, format!("dataref://files/{path}")).await.is_ok());
        let theirs = read(&us, format!("dataref://files/{path}"))
            .await
            .unwrap_err();
        let nobody = read(&us, "dataref://files/exports/nothing.csv".into())
            .await
            .unwrap_err();
        assert_eq!(
            theirs.replace(&path, "P"),
            nobody.replace("exports/nothing.csv", "P")
        );

        // Downloads with a token: eu gets the file, us the same 404 as for a missing one.
        let c = http_client();
        let get = |token: &str, p: &str| {
            c.get(format!("{}/files/{p}", served.base))
                .bearer_auth(token)
                .send()
        };
        let own = get(EU, &path).await.unwrap();
        assert_eq!(own.status(), 200);
        assert_eq!(own.headers()["content-type"], "text/csv");
        assert!(
            own.headers()["content-disposition"]
                .to_str()
                .unwrap()
                .starts_with("attachment; filename=\"sales")
        );
        let body = own.text().await.unwrap();
        assert!(body.starts_with("order_id") || body.contains(','), "{body}");
        let theirs = get(US, &path).await.unwrap();
        assert_eq!(theirs.status(), 404);
        let theirs = theirs.text().await.unwrap();
        let missing = get(US, "exports/nothing.csv").await.unwrap();
        assert_eq!(missing.status(), 404);
        assert_eq!(theirs, missing.text().await.unwrap());

        // A signed link made by eu works without a token; with another principal, another
        // path, another expiry or after expiry it is the same 404.
        let signed: Value = serde_json::from_str(
            &c.post(format!("{}/files/sign", served.base))
                .bearer_auth(EU)
                .body(json!({"path": path}).to_string())
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap(),
        )
        .unwrap();
        let url = signed["url"].as_str().unwrap().to_owned();
        assert!(signed["expires_at"].as_i64().unwrap() > 0);
        let r = c.get(&url).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.text().await.unwrap(), body);
        for forged in [
            url.replace("principal=eu_analyst", "principal=us_analyst"),
            url.replace("expires=", "expires=1"),
            url.replace("sig=", "sig=A"),
        ] {
            let r = c.get(&forged).send().await.unwrap();
            assert_eq!(r.status(), 404, "{forged}");
            assert_eq!(r.text().await.unwrap(), theirs);
        }
        // An expired link, correctly signed.
        let expired = 1_000;
        let key = hmac::Key::new(hmac::HMAC_SHA256, SIGNING_KEY.as_bytes());
        let m = format!("dataref-download-v1\neu_analyst\n{path}\n{expired}");
        let sig = URL_SAFE_NO_PAD.encode(hmac::sign(&key, m.as_bytes()));
        let r = c
            .get(format!(
                "{}/files/{path}?principal=eu_analyst&expires={expired}&sig={sig}",
                served.base
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404);
        assert_eq!(r.text().await.unwrap(), theirs);
        // Signing someone else's (or a missing) file is the same 404.
        let r = c
            .post(format!("{}/files/sign", served.base))
            .bearer_auth(US)
            .body(json!({"path": path}).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404);

        eu.cancel().await.unwrap();
        us.cancel().await.unwrap();
    }
    served.stop().await;
}

/// A 2025-11-25 session belongs to the principal that opened it.
#[tokio::test(flavor = "multi_thread")]
async fn a_session_used_with_another_token_is_an_unknown_session() {
    let env = Env::new(100).unwrap();
    let served = serve(&env, http_config()).await;
    let c = http_client();
    let init = post(&c, &served.mcp(), Some(EU), None, initialize_body()).await;
    assert_eq!(init.status(), 200);
    let session = init.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    drop(init.text().await);
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string();
    let r = post(&c, &served.mcp(), Some(EU), Some(&session), initialized).await;
    assert!(r.status().is_success(), "{}", r.status());
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).to_string();

    let own = post(&c, &served.mcp(), Some(EU), Some(&session), list.clone()).await;
    assert_eq!(own.status(), 200);
    assert!(own.text().await.unwrap().contains("describe_data"));

    let borrowed = post(&c, &served.mcp(), Some(US), Some(&session), list.clone()).await;
    assert_eq!(borrowed.status(), 404);
    let borrowed_body = borrowed.text().await.unwrap();
    let made_up = post(
        &c,
        &served.mcp(),
        Some(US),
        Some("00000000000000000000000000000000"),
        list.clone(),
    )
    .await;
    assert_eq!(made_up.status(), 404);
    assert_eq!(borrowed_body, made_up.text().await.unwrap());
    assert_eq!(borrowed_body, "Not Found: Session not found");

    // Nor can us end eu's session.
    let r = c
        .delete(served.mcp())
        .bearer_auth(US)
        .header("mcp-session-id", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let still = post(&c, &served.mcp(), Some(EU), Some(&session), list).await;
    assert_eq!(still.status(), 200);
    served.stop().await;
}

fn assert_challenge(r: &Answer, base: &str, invalid: bool) {
    assert_eq!(r.status, 401);
    let value = r.headers["www-authenticate"].to_str().unwrap();
    let expected =
        format!("Bearer resource_metadata=\"{base}/.well-known/oauth-protected-resource\"");
    if invalid {
        assert_eq!(value, format!("{expected}, error=\"invalid_token\""));
    } else {
        assert_eq!(value, expected);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_or_bad_tokens_get_401_with_the_metadata_url() {
    let env = Env::new(100).unwrap();
    let served = routed(&env, http_config()).await;
    let none = served.initialize(&[]).await;
    assert_challenge(&none, &served.base, false);
    let body = none.json();
    assert!(
        body["hint"].as_str().unwrap().contains("dataref token new"),
        "{body}"
    );

    let bad = served
        .initialize(&[("authorization", "Bearer not-a-token")])
        .await;
    assert_challenge(&bad, &served.base, true);
    assert_eq!(bad.json()["error"], "invalid_token");

    // A JWT when none are configured is just an unknown token.
    let jwt = served
        .initialize(&[("authorization", "Bearer a.b.c")])
        .await;
    assert_challenge(&jwt, &served.base, true);

    // Downloads and signing ask for a token the same way.
    let r = served.get("/files/x.csv", &[]).await;
    assert_challenge(&r, &served.base, false);
    let r = served
        .send(http::Method::POST, "/files/sign", &[], "{}".into())
        .await;
    assert_challenge(&r, &served.base, false);

    // The metadata itself needs no token.
    for (path, resource) in [
        ("/.well-known/oauth-protected-resource", served.base.clone()),
        ("/.well-known/oauth-protected-resource/mcp", served.mcp()),
    ] {
        let r = served.get(path, &[]).await;
        assert_eq!(r.status, 200);
        let doc = r.json();
        assert_eq!(doc["resource"], resource.as_str());
        assert_eq!(doc["bearer_methods_supported"], json!(["header"]));
        assert_eq!(doc["resource_name"], "dataref");
    }
}

fn jwt(header: &Value, claims: &Value, sign: impl Fn(&[u8]) -> Vec<u8>) -> String {
    let input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let sig = URL_SAFE_NO_PAD.encode(sign(input.as_bytes()));
    format!("{input}.{sig}")
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Each token tried on `initialize`: 200 or 401.
async fn accepted(c: &reqwest::Client, url: &str, token: &str) -> bool {
    let r = post(c, url, Some(token), None, initialize_body()).await;
    match r.status().as_u16() {
        200 => true,
        401 => false,
        other => panic!("unexpected {other}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn jwts_hs256_and_rs256_are_checked() {
    let env = Env::new(100).unwrap();
    let c = http_client();
    let claims = json!({"sub": "eu_analyst", "exp": now() + 300, "aud": "dataref", "iss": "https://idp.example.com"});

    // HS256, the secret from the environment of the server (here: a lookup-free literal).
    let mut http = http_config();
    http.jwt = Some(JwtConfig {
        key: JwtKey::Hs256 {
            secret: HS_SECRET.into(),
        },
        principal_claim: "sub".into(),
        issuer: Some("https://idp.example.com".into()),
        audience: Some("dataref".into()),
        require_audience: true,
        require_issuer: true,
        leeway: Duration::from_secs(5),
    });
    let served = serve(&env, http).await;
    let hs = |secret: &'static str| {
        move |input: &[u8]| {
            let key = hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes());
            hmac::sign(&key, input).as_ref().to_vec()
        }
    };
    let header = json!({"alg": "HS256", "typ": "JWT"});
    assert!(accepted(&c, &served.mcp(), &jwt(&header, &claims, hs(HS_SECRET))).await);
    assert!(
        !accepted(
            &c,
            &served.mcp(),
            &jwt(&header, &claims, hs("another-secret-of-some-length-000000"))
        )
        .await
    );
    let mut expired = claims.clone();
    expired["exp"] = (now() - 60).into();
    assert!(!accepted(&c, &served.mcp(), &jwt(&header, &expired, hs(HS_SECRET))).await);
    let mut wrong_aud = claims.clone();
    wrong_aud["aud"] = "someone-else".into();
    assert!(!accepted(&c, &served.mcp(), &jwt(&header, &wrong_aud, hs(HS_SECRET))).await);
    // The issuer is named as the authorization server.
    let doc: Value = serde_json::from_str(
        &c.get(format!(
            "{}/.well-known/oauth-protected-resource",
            served.base
        ))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap(),
    )
    .unwrap();
    assert_eq!(
        doc["authorization_servers"],
        json!(["https://idp.example.com"])
    );
    // A JWT principal gets its own workspace and artifacts like a token's.
    let token = jwt(&header, &claims, hs(HS_SECRET));
    let client = connect(&served.mcp(), &token, &ProtocolVersion::V_2025_11_25).await;
    let listed = call(&client, "list_artifacts", json!({})).await;
    assert_ne!(listed.is_error, Some(true), "{}", text(&listed));
    client.cancel().await.unwrap();
    served.stop().await;

    // RS256 with a JWKS file; the key pair is a committed test fixture.
    let pkcs8 = include_bytes!("../fixtures/rs256_test_key.pk8");
    let pair = signature::RsaKeyPair::from_pkcs8(pkcs8).unwrap();
    let public = signature::RsaPublicKeyComponents::<Vec<u8>>::from(pair.public());
    let dir = tempfile::tempdir().unwrap();
    let jwks = dir.path().join("jwks.json");
    std::fs::write(
        &jwks,
        json!({"keys": [
            {"kty": "EC", "kid": "ignored", "crv": "P-256"},
            {"kty": "RSA", "kid": "k1", "use": "sig", "alg": "RS256",
             "n": URL_SAFE_NO_PAD.encode(&public.n), "e": URL_SAFE_NO_PAD.encode(&public.e)}
        ]})
        .to_string(),
    )
    .unwrap();
    let mut http = http_config();
    http.jwt = Some(JwtConfig {
        key: JwtKey::Rs256 {
            jwks_file: jwks.clone(),
        },
        principal_claim: "email".into(),
        // Waived explicitly: any issuer these keys sign for.
        issuer: None,
        audience: Some("dataref".into()),
        require_audience: true,
        require_issuer: false,
        leeway: Duration::from_secs(5),
    });
    let served = serve(&env, http).await;
    let rs = |input: &[u8]| {
        let mut sig = vec![0u8; pair.public().modulus_len()];
        pair.sign(
            &signature::RSA_PKCS1_SHA256,
            &rand::SystemRandom::new(),
            input,
            &mut sig,
        )
        .unwrap();
        sig
    };
    let claims = json!({"email": "us_analyst", "exp": now() + 300, "aud": ["dataref"]});
    let header = json!({"alg": "RS256", "kid": "k1"});
    assert!(accepted(&c, &served.mcp(), &jwt(&header, &claims, rs)).await);
    // Another kid, a tampered payload, HS256 with the public key as secret, expiry, audience.
    assert!(
        !accepted(
            &c,
            &served.mcp(),
            &jwt(&json!({"alg": "RS256", "kid": "k2"}), &claims, rs)
        )
        .await
    );
    let good = jwt(&header, &claims, rs);
    let mut parts: Vec<&str> = good.split('.').collect();
    let tampered_claims = URL_SAFE_NO_PAD
        .encode(json!({"email": "eu_analyst", "exp": now() + 300, "aud": "dataref"}).to_string());
    parts[1] = &tampered_claims;
    assert!(!accepted(&c, &served.mcp(), &parts.join(".")).await);
    let confused = jwt(&json!({"alg": "HS256", "kid": "k1"}), &claims, |input| {
        let key = hmac::Key::new(hmac::HMAC_SHA256, &public.n);
        hmac::sign(&key, input).as_ref().to_vec()
    });
    assert!(!accepted(&c, &served.mcp(), &confused).await);
    let mut expired = claims.clone();
    expired["exp"] = (now() - 60).into();
    assert!(!accepted(&c, &served.mcp(), &jwt(&header, &expired, rs)).await);
    let mut wrong_aud = claims.clone();
    wrong_aud["aud"] = json!(["other"]);
    assert!(!accepted(&c, &served.mcp(), &jwt(&header, &wrong_aud, rs)).await);
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn foreign_hosts_and_origins_get_403_on_every_route() {
    let env = Env::new(100).unwrap();
    let served = routed(&env, http_config()).await;
    let bearer = format!("Bearer {EU}");
    for path in [
        "/mcp",
        "/files/x.csv",
        "/.well-known/oauth-protected-resource",
    ] {
        let r = served
            .get(
                path,
                &[("authorization", &bearer), ("host", "evil.example.com")],
            )
            .await;
        assert_eq!(r.status, 403, "{path}");
        let body = r.json();
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .contains("evil.example.com"),
            "{body}"
        );
        assert!(
            body["hint"].as_str().unwrap().contains("allowed_hosts"),
            "{body}"
        );
        let r = served
            .get(
                path,
                &[
                    ("authorization", &bearer),
                    ("origin", "https://evil.example.com"),
                ],
            )
            .await;
        assert_eq!(r.status, 403, "{path}");
        assert!(r.body.contains("allowed_origins"));
    }
    // The server's own origin passes.
    let r = served.initialize(&[("authorization", &bearer)]).await;
    assert_eq!(r.status, 200);
    let r = served
        .initialize(&[("authorization", &bearer), ("origin", &served.base)])
        .await;
    assert_eq!(r.status, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn over_the_rate_gets_429_with_retry_after() {
    let env = Env::new(100).unwrap();
    let mut http = http_config();
    // A bucket of 10, refilled at one per 6 s.
    http.rate_per_minute = 10;
    let served = serve(&env, http).await;
    let c = http_client();
    for i in 0..10 {
        let r = post(&c, &served.mcp(), Some(EU), None, initialize_body()).await;
        assert_eq!(r.status(), 200, "request {i}");
    }
    let r = post(&c, &served.mcp(), Some(EU), None, initialize_body()).await;
    assert_eq!(r.status(), 429);
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=6).contains(&retry), "{retry}");
    // Refused before its body was read: the connection is closed after the answer, and
    // the answer says so.
    assert_eq!(r.headers()["connection"], "close");
    let body: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
    assert_eq!(body["limit"], "rate_per_minute");
    // Another principal has its own bucket.
    let r = post(&c, &served.mcp(), Some(US), None, initialize_body()).await;
    assert_eq!(r.status(), 200);
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn auth_off_is_one_principal_and_loopback_only() {
    let env = Env::new(100).unwrap();
    let mut http = http_config();
    http.auth = false;
    let served = serve(&env, http.clone()).await;
    let client = connect(&served.mcp(), "ignored", &ProtocolVersion::V_2025_11_25).await;
    let listed = call(&client, "list_artifacts", json!({})).await;
    assert_ne!(listed.is_error, Some(true), "{}", text(&listed));
    client.cancel().await.unwrap();
    // No token at all is fine too.
    let c = http_client();
    let r = post(&c, &served.mcp(), None, None, initialize_body()).await;
    assert_eq!(r.status(), 200);
    served.stop().await;
    assert!(env.home.path().join("workspaces/local").is_dir());

    http.listen = "0.0.0.0:0".parse().unwrap();
    let server = DatarefServer::per_request(env.registry.clone(), shared(&env));
    let options = HttpOptions {
        http,
        principals: principals(),
        anonymous: Principal::new("local").unwrap(),
    };
    let e = HttpServer::bind(server, options).await.unwrap_err();
    assert!(matches!(e, HttpError::AuthOffNotLoopback { .. }), "{e}");
    assert!(e.hint().contains("127.0.0.1"), "{}", e.hint());
}

/// Without the HTTP layer, a per-request server has no principal to run as: it refuses
/// rather than picking one.
#[tokio::test(flavor = "multi_thread")]
async fn a_request_without_a_principal_is_refused() {
    let env = Env::new(100).unwrap();
    let server = DatarefServer::per_request(env.registry.clone(), shared(&env));
    assert!(server.principal().is_none());
    let session = dataref_mcp::connect_in_process(server, ()).await.unwrap();
    let e = session
        .client
        .call_tool(CallToolRequestParams::new("list_artifacts"))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no authenticated principal"), "{e}");
    session.client.cancel().await.unwrap();
}

/// A download the client does not read holds a download slot, never a tool call's: with
/// `max_concurrent = 1` and `max_downloads = 1` the same principal still initializes, a
/// second download gets 429 naming `max_downloads`, another principal's does not.
#[tokio::test(flavor = "multi_thread")]
async fn downloads_have_slots_of_their_own() {
    let env = Env::new(100).unwrap();
    let mut http = http_config();
    http.max_concurrent = 1;
    http.max_downloads = 1;
    let served = serve(&env, http).await;
    for who in ["eu_analyst", "us_analyst"] {
        let dir = env.home.path().join("workspaces").join(who);
        std::fs::create_dir_all(&dir).unwrap();
        // Larger than what socket buffers hold.
        std::fs::write(dir.join("big.bin"), vec![7u8; 64 << 20]).unwrap();
    }
    let c = http_client();
    let download = |token: &'static str| {
        c.get(format!("{}/files/big.bin", served.base))
            .bearer_auth(token)
            .send()
    };
    let held = download(EU).await.unwrap();
    assert_eq!(held.status(), 200);
    assert_eq!(held.headers()["content-type"], "application/octet-stream");
    let r = post(&c, &served.mcp(), Some(EU), None, initialize_body()).await;
    assert_eq!(
        r.status(),
        200,
        "a download does not take a tool call's slot"
    );
    let r = download(EU).await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "1");
    let body: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
    assert_eq!(body["limit"], "max_downloads");
    let other = download(US).await.unwrap();
    assert_eq!(other.status(), 200);
    drop(other);
    // Reading the download to its end gives the slot back.
    assert_eq!(held.bytes().await.unwrap().len(), 64 << 20);
    let mut freed = false;
    for _ in 0..50 {
        let r = download(EU).await.unwrap();
        if r.status() == 200 {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(freed, "the slot came back after the download");

    // A tool call's slot is held while its request is open (here: a body still arriving).
    let addr = served.base.trim_start_matches("http://").to_owned();
    let mut open = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {EU}\r\n\
         Accept: {MCP_ACCEPT}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{"
    );
    tokio::io::AsyncWriteExt::write_all(&mut open, head.as_bytes())
        .await
        .unwrap();
    let mut refused = false;
    for _ in 0..50 {
        let r = post(&c, &served.mcp(), Some(EU), None, initialize_body()).await;
        if r.status() == 429 {
            let body: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
            assert_eq!(body["limit"], "max_concurrent");
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(refused, "the open call holds the only slot");
    let r = post(&c, &served.mcp(), Some(US), None, initialize_body()).await;
    assert_eq!(r.status(), 200, "another principal's slots are its own");
    drop(open);
    served.stop().await;
}

/// Uploads land whole in the caller's own workspace or not at all: over the cap (declared
/// or streamed), a stall, a path out of the workspace, no token, a signed link and an
/// existing name are refused with nothing kept; the other principal cannot see the file;
/// `load_file` makes it a table.
#[tokio::test(flavor = "multi_thread")]
async fn uploads_land_whole_in_the_callers_workspace_or_not_at_all() {
    let env = Env::new(100).unwrap();
    let mut http = http_config();
    http.max_upload_bytes = 64 << 10;
    http.body_timeout = Duration::from_secs(1);
    let served = serve(&env, http).await;
    let c = http_client();
    let eu_dir = env.home.path().join("workspaces").join("eu_analyst");
    let url = |p: &str| format!("{}/files/{p}", served.base);
    let put = |p: &str, token: Option<&'static str>, body: Vec<u8>| {
        let mut r = c.put(url(p)).body(body);
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        r.send()
    };
    let csv = b"region;revenue\nEMEA;1.234,50\nAPAC;99,25\n".to_vec();

    let r = put("uploads/sales.csv", Some(EU), csv.clone())
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        body,
        json!({"path": "uploads/sales.csv", "bytes": csv.len()})
    );
    assert_eq!(
        std::fs::read(eu_dir.join("uploads/sales.csv")).unwrap(),
        csv
    );

    // The name is taken: kept, unless the caller asks to replace it.
    let r = put("uploads/sales.csv", Some(EU), b"x\n1\n".to_vec())
        .await
        .unwrap();
    assert_eq!(r.status(), 409);
    let body: Value = r.json().await.unwrap();
    assert!(
        body["hint"].as_str().unwrap().contains("?overwrite=true"),
        "{body}"
    );
    assert_eq!(
        std::fs::read(eu_dir.join("uploads/sales.csv")).unwrap(),
        csv
    );
    let r = put("uploads/sales.csv?overwrite=true", Some(EU), csv.clone())
        .await
        .unwrap();
    assert_eq!(r.status(), 201);

    // Over the cap by its Content-Length: refused before a byte is read.
    let r = put("big.csv", Some(EU), vec![b'a'; (64 << 10) + 1])
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    assert_eq!(
        r.headers()["connection"],
        "close",
        "the unread body ends the connection, so the client does not reuse it"
    );
    // Out of the workspace, no token, another principal's token on a signed path.
    let r = put("..%2F..%2Fescape.csv", Some(EU), csv.clone())
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = put("/abs.csv", Some(EU), csv.clone()).await.unwrap();
    assert_eq!(r.status(), 400);
    let r = put("anon.csv", None, csv.clone()).await.unwrap();
    assert_eq!(r.status(), 401);
    let signed = c
        .post(format!("{}/files/sign", served.base))
        .bearer_auth(EU)
        .json(&json!({"path": "uploads/sales.csv"}))
        .send()
        .await
        .unwrap();
    let link: Value = signed.json().await.unwrap();
    let link = link["url"].as_str().unwrap().to_owned();
    let r = c.put(&link).body(b"evil\n".to_vec()).send().await.unwrap();
    assert_eq!(r.status(), 401, "a signed link reads; it never writes");
    let r = c
        .get(url("uploads/sales.csv"))
        .bearer_auth(US)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404, "the other principal cannot see it");

    // Streamed without a length, past the cap; then a body that stalls. Neither is kept.
    let addr = served.base.trim_start_matches("http://").to_owned();
    for (name, chunks, stall) in [("stream.csv", 80, false), ("stall.csv", 1, true)] {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let head = format!(
            "PUT /files/{name} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {EU}\r\n\
             Transfer-Encoding: chunked\r\n\r\n"
        );
        tokio::io::AsyncWriteExt::write_all(&mut s, head.as_bytes())
            .await
            .unwrap();
        let chunk = format!("400\r\n{}\r\n", "b".repeat(1024));
        for _ in 0..chunks {
            if tokio::io::AsyncWriteExt::write_all(&mut s, chunk.as_bytes())
                .await
                .is_err()
            {
                break;
            }
        }
        let mut answer = vec![0u8; 4096];
        let n = tokio::time::timeout(
            Duration::from_secs(10),
            tokio::io::AsyncReadExt::read(&mut s, &mut answer),
        )
        .await
        .unwrap()
        .unwrap();
        let answer = String::from_utf8_lossy(&answer[..n]).into_owned();
        let want = if stall { "408" } else { "413" };
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {want}")),
            "{name}: {answer}"
        );
        assert!(!eu_dir.join(name).exists(), "{name} was kept");
    }
    let leftovers: Vec<_> = std::fs::read_dir(&eu_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");

    // The uploaded file becomes a table of the caller's.
    let client = connect(&served.mcp(), EU, &ProtocolVersion::V_2025_11_25).await;
    let r = call(&client, "load_file", json!({"path": "uploads/sales.csv"})).await;
    assert_eq!(r.is_error, Some(false), "{}", text(&r));
    let d: Value = serde_json::from_str(&text(&r)).unwrap();
    assert_eq!(d["rows"], 2);
    assert_eq!(
        d["columns"],
        json!({"region": "string", "revenue": "float"})
    );
    client.cancel().await.ok();
    served.stop().await;
}

/// 2026-07-28 requests are served statelessly: each POST stands alone, answered without
/// a session id, and runs as the principal of its own token.
#[tokio::test(flavor = "multi_thread")]
async fn the_2026_revision_is_stateless() {
    let env = Env::new(100).unwrap();
    let served = serve(&env, http_config()).await;
    let c = http_client();
    let request = |id: u64, method: &str, params: Value| {
        let mut params = params;
        params["_meta"] = json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
            "io.modelcontextprotocol/clientCapabilities": {},
        });
        json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string()
    };
    let send = |token: &'static str, method: &'static str, body: String| {
        let mut r = c
            .post(served.mcp())
            .bearer_auth(token)
            .header("accept", MCP_ACCEPT)
            .header("content-type", "application/json")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", method)
            .body(body);
        if method == "tools/call" {
            r = r.header("mcp-name", "list_artifacts");
        }
        r.send()
    };
    let r = send(EU, "tools/list", request(1, "tools/list", json!({})))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("mcp-session-id").is_none());
    assert!(r.text().await.unwrap().contains("describe_data"));
    let r = send(
        US,
        "tools/call",
        request(
            2,
            "tools/call",
            json!({"name": "list_artifacts", "arguments": {}}),
        ),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("mcp-session-id").is_none());
    let body = r.text().await.unwrap();
    assert!(body.contains("\"result\""), "{body}");
    served.stop().await;
}

/// Routing answers before authentication: an unknown path is a 404 naming the MCP
/// endpoint, a wrong method on a files route a 405 with `Allow`, an undecodable download
/// path the downloads' 404, all without a token; the metadata needs none either. With a
/// token the same paths get the same answers (no route behind a route).
#[tokio::test(flavor = "multi_thread")]
async fn routes_answer_by_path_and_method_before_any_token_is_asked_for() {
    let env = Env::new(100).unwrap();
    let served = routed(&env, http_config()).await;
    let bearer = format!("Bearer {EU}");
    for token in [None, Some(bearer.as_str())] {
        let headers: Vec<(&str, &str)> = token.map(|t| ("authorization", t)).into_iter().collect();
        let send = |method: http::Method, path: &'static str| {
            served.send(method, path, &headers, String::new())
        };
        let r = send(http::Method::GET, "/nowhere").await;
        assert_eq!(r.status, 404, "{token:?}");
        let body = r.json();
        assert_eq!(body["error"], "not_found");
        assert_eq!(body["message"], "nothing is served at `/nowhere`");
        assert_eq!(body["hint"], "the MCP endpoint is `/mcp`");

        // `HEAD` where only `GET` is served is a method like any other.
        for (method, path, allow) in [
            (http::Method::GET, "/files/sign", "POST"),
            (http::Method::POST, "/files/a.csv", "GET, PUT"),
            (http::Method::HEAD, "/files/a.csv", "GET, PUT"),
            (http::Method::HEAD, "/agent/agents", "GET"),
            (
                http::Method::POST,
                "/.well-known/oauth-protected-resource",
                "GET",
            ),
        ] {
            let r = send(method.clone(), path).await;
            assert_eq!(r.status, 405, "{method} {path} {token:?}");
            assert_eq!(r.headers["allow"], allow, "{method} {path}");
        }

        let r = send(http::Method::GET, "/files/bad%zz").await;
        assert_eq!(r.status, 404, "{token:?}");
        let body = r.json();
        assert!(
            body["hint"].as_str().unwrap().contains("POST /files/sign"),
            "{body}"
        );

        let r = send(
            http::Method::GET,
            "/.well-known/oauth-protected-resource/mcp",
        )
        .await;
        assert_eq!(r.status, 200, "{token:?}");
        assert_eq!(r.json()["resource"], served.mcp());
    }
    // A download without a token or a signature is asked for one.
    let r = served.get("/files/a.csv", &[]).await;
    assert_eq!(r.status, 401);
}

/// `/` is the page: served without a token (it holds no data), with a policy that allows
/// only its own script and style, this origin for requests, and no framing; other methods
/// are refused. The view's tools reach the page (it declares MCP Apps) as the caller.
#[tokio::test(flavor = "multi_thread")]
async fn the_page_is_served_with_a_strict_policy_and_no_token() {
    let env = Env::new(100).unwrap();
    let served = routed(&env, http_config()).await;
    let r = served.get("/", &[]).await;
    assert_eq!(r.status, 200);
    let h = &r.headers;
    assert_eq!(h["content-type"], "text/html; charset=utf-8");
    assert_eq!(h["x-content-type-options"], "nosniff");
    let csp = h["content-security-policy"].to_str().unwrap().to_owned();
    for part in [
        "default-src 'none'",
        "script-src 'sha256-",
        "style-src 'sha256-",
        "connect-src 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
        "form-action 'none'",
    ] {
        assert!(csp.contains(part), "{part} in {csp}");
    }
    assert!(!csp.contains("unsafe"), "{csp}");
    assert_eq!(r.body, dataref_mcp::VIEW_HTML);
    let r = served
        .send(http::Method::POST, "/", &[], String::new())
        .await;
    assert_eq!(r.status, 405);
    assert_eq!(r.headers["allow"], "GET, HEAD");
}
