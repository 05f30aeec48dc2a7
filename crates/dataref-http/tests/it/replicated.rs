//! Servers made with [`HttpServer::bind_replicated`], as replicas of one deployment: a
//! download link signed by one verifies on another that was given the same shared key, and
//! `[http] signing_key` wins over the shared key; `/ready` answers what a `Readiness` says,
//! without a token, asking it at most once a second.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers fail the test on setup errors"
)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dataref_config::{HttpConfig, PrincipalConfig};
use dataref_http::{HttpError, HttpOptions, HttpServer, Readiness, Replicated, SigningKey};
use dataref_mcp::DatarefServer;
use dataref_protocol::Principal;
use dataref_tool::SharedContext;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::support::Env;

const EU: &str = "eu-token-0123456789abcdef0123456789abcdef";
const CONFIGURED: &str = "download-signing-key-for-tests-0123456789";

struct Served {
    base: String,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), HttpError>>,
}

impl Served {
    async fn stop(self) {
        self.stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(15), self.task).await;
    }
}

fn principals() -> BTreeMap<Principal, PrincipalConfig> {
    let p = Principal::new("eu_analyst").unwrap();
    let mut digest = [0u8; 32];
    digest.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, EU.as_bytes()).as_ref());
    let c = PrincipalConfig {
        name: p.clone(),
        token_sha256: vec![digest],
        pg_role: None,
        pg_password: None,
        mysql_user: None,
        mysql_password: None,
        adbc: Default::default(),
    };
    [(p, c)].into_iter().collect()
}

fn key(byte: u8) -> SigningKey {
    SigningKey::new(vec![byte; 32]).unwrap()
}

/// A server on the one `env` (so every server sees the same workspace files, as replicas
/// on a shared store do).
async fn serve(env: &Env, configured: Option<&str>, shared: Option<SigningKey>) -> Served {
    serve_with(
        env,
        configured,
        Replicated {
            signing_key: shared,
            ..Replicated::default()
        },
    )
    .await
}

async fn serve_with(env: &Env, configured: Option<&str>, replicated: Replicated) -> Served {
    dataref_config::tls::install_provider();
    let context = SharedContext {
        home: env.home.path().to_path_buf(),
        store: env.store.clone(),
        limits: env.config.limits.clone(),
        clock: std::sync::Arc::new(dataref_store::SystemClock),
        mirrors: None,
    };
    let server = DatarefServer::per_request(env.registry.clone(), context);
    let options = HttpOptions {
        http: HttpConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            signing_key: configured.map(str::to_owned),
            ..HttpConfig::default()
        },
        principals: principals(),
        anonymous: Principal::new("local").unwrap(),
    };
    let http = HttpServer::bind_replicated(server, options, replicated)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let base = format!("http://{}", http.local_addr().unwrap());
    let stop = CancellationToken::new();
    let task = tokio::spawn(http.serve(stop.clone()));
    Served { base, stop, task }
}

/// A link to eu's `report.txt` signed by `on`, with its query (the part every replica
/// checks).
async fn signed_query(c: &reqwest::Client, on: &Served) -> String {
    let text = c
        .post(format!("{}/files/sign", on.base))
        .bearer_auth(EU)
        .body(json!({"path": "report.txt"}).to_string())
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let signed: Value = serde_json::from_str(&text).unwrap();
    let url = signed["url"].as_str().unwrap();
    let (_, query) = url.split_once('?').unwrap();
    query.to_owned()
}

async fn download(c: &reqwest::Client, on: &Served, query: &str) -> u16 {
    c.get(format!("{}/files/report.txt?{query}", on.base))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_link_signed_on_one_replica_verifies_on_another() {
    let env = Env::new(100).unwrap();
    let dir = env.home.path().join("workspaces").join("eu_analyst");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("report.txt"), "q3").unwrap();
    let c = reqwest::Client::new();

    // No configured key: the shared one signs on both.
    let a = serve(&env, None, Some(key(1))).await;
    let b = serve(&env, None, Some(key(1))).await;
    // A server on its own makes a key of its own.
    let alone = serve(&env, None, None).await;
    let query = signed_query(&c, &a).await;
    assert_eq!(download(&c, &a, &query).await, 200);
    assert_eq!(
        download(&c, &b, &query).await,
        200,
        "verified by the other replica"
    );
    assert_eq!(download(&c, &alone, &query).await, 404);
    assert_eq!(download(&c, &a, &signed_query(&c, &alone).await).await, 404);

    // `[http] signing_key` set: it signs, whatever shared key each replica was given.
    let a2 = serve(&env, Some(CONFIGURED), Some(key(2))).await;
    let b2 = serve(&env, Some(CONFIGURED), Some(key(3))).await;
    let query = signed_query(&c, &a2).await;
    assert_eq!(download(&c, &b2, &query).await, 200);
    assert_eq!(
        download(&c, &b, &query).await,
        404,
        "not signed with the shared key"
    );
    let with_shared_2 = serve(&env, None, Some(key(2))).await;
    assert_eq!(download(&c, &with_shared_2, &query).await, 404);

    for s in [a, b, alone, a2, b2, with_shared_2] {
        s.stop().await;
    }
}

/// Counts its checks; each takes 100 ms and finds the object store out of reach.
struct Unreachable(AtomicUsize);

#[async_trait::async_trait]
impl Readiness for Unreachable {
    async fn check(&self) -> Result<(), String> {
        self.0.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(100)).await;
        Err("the object store is out of reach".into())
    }
}

/// `/ready` is open to anyone who reaches the port: many at once, or one asking fast, make
/// one check a second of the shared store, never one each.
#[tokio::test(flavor = "multi_thread")]
async fn ready_answers_without_a_token_and_asks_the_store_once_a_second() {
    let env = Env::new(100).unwrap();
    let alone = serve(&env, None, None).await;
    let c = reqwest::Client::new();
    let r = c.get(format!("{}/ready", alone.base)).send().await.unwrap();
    assert_eq!(
        r.status(),
        200,
        "a server of its own is ready while it serves"
    );
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"ready": true}));
    alone.stop().await;

    let readiness = Arc::new(Unreachable(AtomicUsize::new(0)));
    let replica = serve_with(
        &env,
        None,
        Replicated {
            readiness: Some(readiness.clone()),
            ..Replicated::default()
        },
    )
    .await;
    let url = format!("{}/ready", replica.base);
    let asked: Vec<_> = (0..20)
        .map(|_| {
            let (c, url) = (c.clone(), url.clone());
            tokio::spawn(async move { c.get(url).send().await.unwrap() })
        })
        .collect();
    for answer in asked {
        let r = answer.await.unwrap();
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()["retry-after"], "5");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["ready"], json!(false), "{body}");
        assert_eq!(
            body["message"], "the object store is out of reach",
            "{body}"
        );
    }
    assert_eq!(
        readiness.0.load(Ordering::SeqCst),
        1,
        "20 at once, one check"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let r = c.head(&url).send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(
        readiness.0.load(Ordering::SeqCst),
        2,
        "a second later, asked again"
    );
    let r = c.post(&url).send().await.unwrap();
    assert_eq!(r.status(), 405);
    replica.stop().await;
}
