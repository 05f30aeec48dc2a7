//! Notifications and completion over the real `serve --http`: two principals with their
//! own tokens, rmcp's Streamable HTTP client (2025-11-25 sessions, and 2026-07-28
//! `subscriptions/listen`), and the auth-off loopback server under a burst.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers fail the test on setup errors"
)]
#![expect(deprecated, reason = "MCP logging is what 2025-11-25 hosts use")]

use std::collections::BTreeMap;
use std::time::Duration;

use dataref_config::{HttpConfig, PrincipalConfig};
use dataref_http::{HttpError, HttpOptions, HttpServer};
use dataref_mcp::DatarefServer;
use dataref_mcp::rmcp::model::{
    CallToolRequestParams, LoggingLevel, ProtocolVersion, ServerNotification,
    SetLevelRequestParams, SubscriptionFilter,
};
use dataref_mcp::rmcp::service::RunningService;
use dataref_mcp::rmcp::transport::StreamableHttpClientTransport;
use dataref_mcp::rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use dataref_mcp::rmcp::{ClientLifecycleMode, ClientServiceExt, RoleClient, ServiceExt};
use dataref_protocol::Principal;
use dataref_tool::SharedContext;
use ring::digest;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::support::{Env, Seen, Watcher};

const EU: &str = "eu-token-notify-0123456789abcdef0123456789";
const US: &str = "us-token-notify-0123456789abcdef0123456789";

type Client = RunningService<RoleClient, Watcher>;

struct Served {
    mcp: String,
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
    [("eu_analyst", EU), ("us_analyst", US)]
        .into_iter()
        .map(|(name, token)| {
            let p = Principal::new(name).unwrap();
            let mut sha = [0u8; 32];
            sha.copy_from_slice(digest::digest(&digest::SHA256, token.as_bytes()).as_ref());
            let c = PrincipalConfig {
                name: p.clone(),
                token_sha256: vec![sha],
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

async fn serve(env: &Env, http: HttpConfig) -> Served {
    dataref_config::tls::install_provider();
    let shared = SharedContext {
        home: env.home.path().to_path_buf(),
        store: env.store.clone(),
        limits: env.config.limits.clone(),
        clock: std::sync::Arc::new(dataref_store::SystemClock),
        mirrors: None,
    };
    let server = DatarefServer::per_request(env.registry.clone(), shared);
    let options = HttpOptions {
        http,
        principals: principals(),
        anonymous: Principal::new("local").unwrap(),
    };
    let http = HttpServer::bind(server, options)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mcp = http.mcp_url();
    let stop = CancellationToken::new();
    let task = tokio::spawn(http.serve(stop.clone()));
    Served { mcp, stop, task }
}

fn config() -> HttpConfig {
    HttpConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        signing_key: Some("download-signing-key-for-notify-tests-0123".into()),
        max_concurrent: 64,
        rate_per_minute: 1_000_000,
        ..HttpConfig::default()
    }
}

async fn connect(url: &str, token: &str, version: &ProtocolVersion) -> (Client, Watcher) {
    let config = StreamableHttpClientTransportConfig::with_uri(url).auth_header(token);
    let transport = StreamableHttpClientTransport::from_config(config);
    let watcher = Watcher::default();
    let client = if version == &ProtocolVersion::V_2026_07_28 {
        watcher
            .clone()
            .serve_with_lifecycle(
                transport,
                ClientLifecycleMode::Discover {
                    preferred_versions: vec![ProtocolVersion::V_2026_07_28],
                },
            )
            .await
    } else {
        watcher.clone().serve(transport).await
    };
    (
        client.unwrap_or_else(|e| panic!("connecting: {e}")),
        watcher,
    )
}

async fn fetch(client: &Client) -> String {
    let args = json!({"since": "2025-06-01"});
    let r = client
        .call_tool(
            CallToolRequestParams::new("fetch_sales")
                .with_arguments(args.as_object().cloned().unwrap()),
        )
        .await
        .unwrap();
    assert_ne!(r.is_error, Some(true), "{r:?}");
    r.structured_content.unwrap()["dataRef"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_hear_only_their_own_principal_over_http() {
    let env = Env::new(2_000).unwrap();
    let served = serve(&env, config()).await;
    let v = ProtocolVersion::V_2025_11_25;
    let (eu, eu_seen) = connect(&served.mcp, EU, &v).await;
    let (us, us_seen) = connect(&served.mcp, US, &v).await;
    for c in [&eu, &us] {
        c.list_all_resources().await.unwrap();
        c.set_level(SetLevelRequestParams::new(LoggingLevel::Debug))
            .await
            .unwrap();
    }

    let eu_ref = fetch(&eu).await;
    let seen = eu_seen
        .until("eu's list_changed and a log step", |s| {
            s.contains(&Seen::ListChanged) && s.iter().any(|e| matches!(e, Seen::Log(..)))
        })
        .await;
    assert!(seen.iter().all(|s| match s {
        Seen::Log(_, d) => d["tool"] == "fetch_sales",
        _ => true,
    }));

    // us completes dataRefs: none of eu's, and nothing reached it from eu's call.
    let completion = us
        .complete_prompt_argument("analyse_table", "dataRef", "", None)
        .await
        .unwrap();
    assert_eq!(completion.values, Vec::<String>::new());
    let eu_completion = eu
        .complete_prompt_argument("analyse_table", "dataRef", "", None)
        .await
        .unwrap();
    assert_eq!(eu_completion.values, [eu_ref]);
    assert_eq!(us_seen.all(), []);

    // us's own fetch: its list_changed and its own steps.
    fetch(&us).await;
    let seen = us_seen
        .until("us's list_changed", |s| s.contains(&Seen::ListChanged))
        .await;
    assert_eq!(
        seen.iter().filter(|s| **s == Seen::ListChanged).count(),
        1,
        "{seen:?}"
    );
    eu.cancel().await.unwrap();
    us.cancel().await.unwrap();
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_streams_the_callers_changes_on_the_2026_revision() {
    let env = Env::new(500).unwrap();
    let served = serve(&env, config()).await;
    let v = ProtocolVersion::V_2026_07_28;
    let (eu, _) = connect(&served.mcp, EU, &v).await;
    let (us, _) = connect(&served.mcp, US, &v).await;
    let filter = || {
        SubscriptionFilter::builder()
            .resources_list_changed()
            .build()
    };
    let mut eu_sub = eu.listen(filter()).await.unwrap();
    let mut us_sub = us.listen(filter()).await.unwrap();
    assert_eq!(eu_sub.acknowledged().resources_list_changed, Some(true));

    fetch(&eu).await;
    let next = tokio::time::timeout(Duration::from_secs(30), eu_sub.next())
        .await
        .expect("eu heard nothing")
        .unwrap();
    assert!(
        matches!(
            next,
            Some(ServerNotification::ResourceListChangedNotification(_))
        ),
        "{next:?}"
    );
    // Nothing of eu's reached us's stream; then its own change does, once.
    let leaked = tokio::time::timeout(Duration::from_millis(300), us_sub.next()).await;
    assert!(leaked.is_err(), "us heard eu's change: {leaked:?}");
    fetch(&us).await;
    let next = tokio::time::timeout(Duration::from_secs(30), us_sub.next())
        .await
        .expect("us heard nothing")
        .unwrap();
    assert!(
        matches!(
            next,
            Some(ServerNotification::ResourceListChangedNotification(_))
        ),
        "{next:?}"
    );
    let more = tokio::time::timeout(Duration::from_millis(300), us_sub.next()).await;
    assert!(more.is_err(), "us got a second notification: {more:?}");
    drop(eu_sub);
    drop(us_sub);
    eu.cancel().await.unwrap();
    us.cancel().await.unwrap();
    served.stop().await;
}

/// The auth-off loopback server is one local user: a burst (a host starting up, the
/// conformance suite) is not refused with 429, however low `rate_per_minute` is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_off_loopback_is_not_rate_limited() {
    let env = Env::new(100).unwrap();
    let served = serve(
        &env,
        HttpConfig {
            auth: false,
            rate_per_minute: 60,
            ..config()
        },
    )
    .await;
    let c = reqwest::Client::new();
    let body = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
    })
    .to_string();
    for i in 0..100 {
        let r = c
            .post(&served.mcp)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .header("mcp-protocol-version", "2025-11-25")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "request {i}: {:?}", r.text().await);
        let session = r
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        if let Some(s) = session {
            let _ = c
                .delete(&served.mcp)
                .header("mcp-session-id", s)
                .send()
                .await;
        }
    }
    served.stop().await;
}
