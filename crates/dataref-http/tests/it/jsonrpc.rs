//! Over HTTP, a POST body that is not a JSON-RPC message is answered with HTTP 400 and a
//! JSON-RPC error (its `id` when it can be read), and the server goes on serving.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers fail the test on setup errors"
)]

use std::time::Duration;

use dataref_config::HttpConfig;
use dataref_http::{HttpOptions, HttpServer};
use dataref_mcp::DatarefServer;
use dataref_protocol::Principal;
use dataref_tool::SharedContext;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::support::Env;

async fn post(c: &reqwest::Client, url: &str, body: Vec<u8>) -> (u16, String) {
    let r = c
        .post(url)
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .header("mcp-protocol-version", "2025-11-25")
        .body(body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_bodies_get_a_json_rpc_error_and_the_server_keeps_serving() {
    dataref_config::tls::install_provider();
    let env = Env::new(50).unwrap();
    let shared = SharedContext {
        home: env.home.path().to_path_buf(),
        store: env.store.clone(),
        limits: env.config.limits.clone(),
        clock: std::sync::Arc::new(dataref_store::SystemClock),
        mirrors: None,
    };
    let server = DatarefServer::per_request(env.registry.clone(), shared);
    let options = HttpOptions {
        http: HttpConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            auth: false,
            ..HttpConfig::default()
        },
        principals: Default::default(),
        anonymous: Principal::new("local").unwrap(),
    };
    let http = HttpServer::bind(server, options).await.unwrap();
    let url = http.mcp_url();
    let stop = CancellationToken::new();
    let task = tokio::spawn(http.serve(stop.clone()));
    let c = reqwest::Client::new();

    let deep = format!(
        r#"{{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{{"name":"x","arguments":{{"a":{}{}}}}}}}"#,
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    let cases: Vec<(Vec<u8>, i64, Value)> = vec![
        (deep.into_bytes(), -32700, json!(10)),
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":11,\"method\":\"initialize\",\"params\":{\"x\":\"\xc3\x28\"}}"
                .to_vec(),
            -32700,
            json!(11),
        ),
        (
            br#"{"jsonrpc":"2.0","id":12,"method":"initialize","params":{"x":"\udfff"}}"#.to_vec(),
            -32700,
            json!(12),
        ),
        (b"[]".to_vec(), -32600, Value::Null),
        (b"true".to_vec(), -32600, Value::Null),
        (b"".to_vec(), -32700, Value::Null),
        (
            br#"{"jsonrpc":"2.0","id":13,"method":null}"#.to_vec(),
            -32600,
            json!(13),
        ),
    ];
    for (line, code, id) in cases {
        let shown = String::from_utf8_lossy(&line[..line.len().min(80)]).into_owned();
        let (status, body) = post(&c, &url, line).await;
        assert_eq!(status, 400, "{shown}: {body}");
        let e: Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{shown}: {e}: {body}"));
        assert_eq!(e["jsonrpc"], "2.0", "{shown}: {e}");
        assert_eq!(e["error"]["code"], code, "{shown}: {e}");
        assert_eq!(e["id"], id, "{shown}: {e}");
        assert!(e["error"]["data"]["hint"].is_string(), "{shown}: {e}");
    }
    // A good request still gets rmcp's answer.
    let (status, body) = post(
        &c,
        &url,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"}}})
        .to_string()
        .into_bytes(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("serverInfo"), "{body}");

    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(15), task).await;
}
