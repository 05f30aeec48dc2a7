//! `[http_tools.NAME]` against a real HTTP server the test starts (a tokio listener with a
//! small HTTP/1.1 responder that records every request it saw): what comes back for
//! records, objects and text, how path values are encoded (and that no value reaches
//! another path), query, header and body parameters, the credential from the environment,
//! error statuses, the deadline, the cap on the answer, the schema and the annotation.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dataref_builtins::HttpTool;
use dataref_config::{Config, HttpToolConfig};
use dataref_tool::{OutcomeKind, Tool, ToolCall};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::{Fixture, fixture_with, run};

/// One request as the server saw it.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    /// The request target as sent: path and query.
    target: String,
    /// Lower-case names.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }
}

/// What the server answers.
struct Reply {
    status: u16,
    content_type: &'static str,
    body: Vec<u8>,
    /// Send `Content-Length` (else the body ends when the connection closes).
    length: bool,
    delay: Duration,
    extra: Vec<(&'static str, String)>,
}

impl Reply {
    fn json(status: u16, v: Value) -> Self {
        Self {
            status,
            content_type: "application/json",
            body: v.to_string().into_bytes(),
            length: true,
            delay: Duration::ZERO,
            extra: Vec::new(),
        }
    }
}

type Route = Arc<dyn Fn(&Seen) -> Reply + Send + Sync>;

struct Server {
    base: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Server {
    async fn start(route: impl Fn(&Seen) -> Reply + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let route: Route = Arc::new(route);
        let log = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let log = log.clone();
                let route = route.clone();
                tokio::spawn(async move {
                    let Some(req) = read_request(&mut stream).await else {
                        return;
                    };
                    log.lock().unwrap().push(req.clone());
                    let reply = route(&req);
                    tokio::time::sleep(reply.delay).await;
                    let mut head = format!(
                        "HTTP/1.1 {} X\r\nContent-Type: {}\r\nConnection: close\r\n",
                        reply.status, reply.content_type
                    );
                    if reply.length {
                        head.push_str(&format!("Content-Length: {}\r\n", reply.body.len()));
                    }
                    for (n, v) in &reply.extra {
                        head.push_str(&format!("{n}: {v}\r\n"));
                    }
                    head.push_str("\r\n");
                    let _ = stream.write_all(head.as_bytes()).await;
                    let _ = stream.write_all(&reply.body).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        Self { base, seen }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

async fn read_request(stream: &mut tokio::net::TcpStream) -> Option<Seen> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8(buf[..end].to_vec()).ok()?;
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let method = first.next()?.to_owned();
    let target = first.next()?.to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = buf[end + 4..].to_vec();
    while body.len() < length {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some(Seen {
        method,
        target,
        headers,
        body,
    })
}

/// `[http_tools...]` text (with `BASE` for the server's address) resolved.
fn tools_config(text: &str, base: &str) -> Config {
    let text = text.replace("BASE", base);
    Config::from_toml_str_with_env(&text, "/etc/dataref".as_ref(), "/tmp".into(), &|_| None)
        .unwrap_or_else(|e| panic!("{e}"))
}

const CRM: &str = r#"
[http_tools.crm_orders]
description = "A customer's orders from the CRM."
url = "BASE/api/customers/{customer_id}/orders?v=2"
headers = { Accept = "application/json", "X-Client" = "dataref-${CLIENT_ID}" }
auth_header = "Authorization"
auth_value = "Bearer ${CRM_TOKEN}"
timeout = "2s"
max_response_bytes = "1KiB"
principal_header = "X-Dataref-Principal"
[http_tools.crm_orders.params.customer_id]
in = "path"
description = "The customer's number."
[http_tools.crm_orders.params.status]
in = "query"
enum = ["open", "shipped", "a b&c"]
default = "open"
[http_tools.crm_orders.params.ids]
in = "query"
type = "array"
[http_tools.crm_orders.params.x_tenant]
in = "header"

[http_tools.crm_customer]
description = "One customer."
url = "BASE/api/customers/{id}"
timeout = "300ms"
[http_tools.crm_customer.params.id]
in = "path"
type = "integer"

[http_tools.crm_note]
description = "Adds a note to a customer."
method = "POST"
url = "BASE/api/customers/{id}/notes"
[http_tools.crm_note.params.id]
in = "path"
type = "integer"
[http_tools.crm_note.params.note]
in = "body"
required = true
[http_tools.crm_note.params.tags]
in = "body"
type = "array"

[http_tools.crm_search]
description = "Searches (a POST that changes nothing)."
method = "POST"
read_only = true
url = "BASE/api/search"
"#;

fn env(name: &str) -> Option<String> {
    match name {
        "CRM_TOKEN" => Some("s3cret-token".into()),
        "CLIENT_ID" => Some("tests".into()),
        _ => None,
    }
}

/// The caller `alice`'s fixture with the CRM tools on `server`, secrets from `lookup`.
fn crm(server: &Server, lookup: fn(&str) -> Option<String>) -> (Fixture, Config) {
    let mut f = fixture_with(|limits| limits.max_result_chars = 8_000);
    let config = tools_config(CRM, &server.base);
    // The built-in tools (none of them HTTP ones) and the CRM's, with the test's secrets.
    let mut b = dataref_builtins::builtin_registry_builder(&f_config(), None);
    for t in config.http_tools.values() {
        b.register(Arc::new(HttpTool::with_env(t.clone(), Arc::new(lookup))));
    }
    f.registry = b.build().unwrap();
    (f, config)
}

fn f_config() -> Config {
    Config::from_toml_str_with_env("", "/etc".as_ref(), "/tmp".into(), &|_| None).unwrap()
}

fn ok(o: &dataref_tool::CallOutcome) -> &Value {
    assert!(!o.is_error(), "{}", o.text);
    o.structured.as_ref().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn records_become_a_table_artifact_of_the_callers() {
    let server = Server::start(|_| {
        Reply::json(
            200,
            json!([
                {"id": 1, "total": 9.5, "status": "open"},
                {"id": 2, "total": null, "status": "open"},
                {"id": 3, "total": 12.25, "status": "open"},
            ]),
        )
    })
    .await;
    let (f, _) = crm(&server, env);
    let o = run(
        &f,
        ToolCall::new("crm_orders", json!({"customer_id": "42"})),
    )
    .await;
    let d = ok(&o);
    assert_eq!(d["rows"], 3, "{d}");
    assert_eq!(d["columns"]["id"], "integer", "{d}");
    assert_eq!(d["columns"]["total"], "float", "{d}");
    assert_eq!(d["nulls"]["total"], 1, "{d}");
    assert!(!d["sample"].as_array().unwrap().is_empty(), "{d}");
    let data_ref = d["dataRef"].as_str().unwrap().to_owned();
    // The table is alice's: she can describe it.
    let described = run(
        &f,
        ToolCall::new("describe_data", json!({"dataRef": data_ref})),
    )
    .await;
    assert_eq!(ok(&described)["rows"], 3);
    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].method, "GET");
    assert_eq!(seen[0].target, "/api/customers/42/orders?v=2&status=open");
    assert_eq!(seen[0].header("x-dataref-principal"), Some("alice"));
    assert_eq!(seen[0].header("x-client"), Some("dataref-tests"));
}

#[tokio::test(flavor = "multi_thread")]
async fn records_in_a_wrapper_keep_the_wrappers_other_fields_as_a_note() {
    let server = Server::start(|_| {
        Reply::json(
            200,
            json!({"items": [{"a": 1}, {"a": 2}], "next_cursor": "abc"}),
        )
    })
    .await;
    let (f, _) = crm(&server, env);
    let o = run(&f, ToolCall::new("crm_orders", json!({"customer_id": "1"}))).await;
    let d = ok(&o);
    assert_eq!(d["rows"], 2);
    let notes = d["notes"].to_string();
    assert!(
        notes.contains("next_cursor") && notes.contains("abc"),
        "{d}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn other_json_is_structured_and_text_is_text() {
    let server = Server::start(|seen| match seen.path() {
        "/api/customers/1" => Reply::json(
            200,
            json!({"id": 1, "name": "Ada", "tags": ["vip"], "address": {"city": "Lyon"}}),
        ),
        "/api/customers/2" => Reply::json(200, json!([1, 2, 3])),
        _ => Reply {
            status: 200,
            content_type: "text/plain; charset=utf-8",
            body: b"customer 3 is archived".to_vec(),
            length: true,
            delay: Duration::ZERO,
            extra: Vec::new(),
        },
    })
    .await;
    let (f, _) = crm(&server, env);
    let o = run(&f, ToolCall::new("crm_customer", json!({"id": 1}))).await;
    assert_eq!(
        ok(&o),
        &json!({"id": 1, "name": "Ada", "tags": ["vip"], "address": {"city": "Lyon"}})
    );
    let o = run(&f, ToolCall::new("crm_customer", json!({"id": 2}))).await;
    assert_eq!(ok(&o), &json!({"response": [1, 2, 3]}));
    let o = run(&f, ToolCall::new("crm_customer", json!({"id": 3}))).await;
    assert!(!o.is_error(), "{}", o.text);
    assert_eq!(o.text, "customer 3 is archived");
}

/// The attacker's test first: no path value reaches another endpoint. Every request the
/// server saw is `/api/customers/<one segment>/orders`, and the dot segments never leave.
#[tokio::test(flavor = "multi_thread")]
async fn path_values_are_one_segment_and_never_reach_another_path() {
    let server = Server::start(|_| Reply::json(200, json!({"ok": true}))).await;
    let (f, _) = crm(&server, env);
    for hostile in [
        "..",
        ".",
        "",
        "../admin",
        "../../admin/users",
        "..%2f..%2fadmin",
        "%2e%2e",
        "%2E%2E/admin",
        ".%2e",
        "a/../../admin",
        "?admin=1",
        "#frag",
        "a b",
        "/etc/passwd",
        "\\..\\admin",
    ] {
        let o = run(
            &f,
            ToolCall::new("crm_orders", json!({"customer_id": hostile})),
        )
        .await;
        if matches!(hostile, ".." | "." | "") {
            assert_eq!(o.kind, OutcomeKind::ToolFailed, "{hostile}: {}", o.text);
            assert!(o.text.contains("customer_id"), "{}", o.text);
        }
    }
    let seen = server.seen();
    assert_eq!(seen.len(), 12, "{seen:#?}");
    for s in &seen {
        let path = s.path();
        let segments: Vec<&str> = path.split('/').collect();
        assert_eq!(segments.len(), 5, "{path}");
        assert_eq!(&segments[..3], ["", "api", "customers"], "{path}");
        assert_eq!(segments[4], "orders", "{path}");
        assert!(!matches!(segments[3], "." | ".." | ""), "{path}");
        assert!(!s.target.contains("admin=1"), "{}", s.target);
    }
    let targets: Vec<&str> = seen.iter().map(|s| s.path()).collect();
    assert!(
        targets.contains(&"/api/customers/..%2Fadmin/orders"),
        "{targets:?}"
    );
    assert!(
        targets.contains(&"/api/customers/%252e%252e/orders"),
        "{targets:?}"
    );
    assert!(
        targets.contains(&"/api/customers/%3Fadmin%3D1/orders"),
        "{targets:?}"
    );
    assert!(
        targets.contains(&"/api/customers/%23frag/orders"),
        "{targets:?}"
    );
    assert!(
        targets.contains(&"/api/customers/a%20b/orders"),
        "{targets:?}"
    );
    assert!(
        targets.contains(&"/api/customers/%5C..%5Cadmin/orders"),
        "{targets:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn query_header_and_body_parameters() {
    let server = Server::start(|_| Reply::json(200, json!({"ok": true}))).await;
    let (f, _) = crm(&server, env);
    let o = run(
        &f,
        ToolCall::new(
            "crm_orders",
            json!({"customer_id": "a/b?c#d e", "status": "a b&c", "ids": [1, 2], "x_tenant": "eu"}),
        ),
    )
    .await;
    ok(&o);
    // A header value with a line break is refused before anything is sent.
    let o = run(
        &f,
        ToolCall::new(
            "crm_orders",
            json!({"customer_id": "1", "x_tenant": "eu\r\nX-Admin: yes"}),
        ),
    )
    .await;
    assert_eq!(o.kind, OutcomeKind::ToolFailed, "{}", o.text);
    assert!(o.text.contains("x_tenant"), "{}", o.text);
    let o = run(
        &f,
        ToolCall::new(
            "crm_note",
            json!({"id": 7, "note": "called back", "tags": ["a"]}),
        ),
    )
    .await;
    ok(&o);
    let seen = server.seen();
    assert_eq!(seen.len(), 2, "{seen:#?}");
    assert_eq!(
        seen[0].target,
        "/api/customers/a%2Fb%3Fc%23d%20e/orders?v=2&ids=1&ids=2&status=a+b%26c"
    );
    assert_eq!(seen[0].header("x-tenant"), Some("eu"));
    assert!(seen[0].header("x-admin").is_none());
    assert_eq!(seen[1].method, "POST");
    assert_eq!(seen[1].target, "/api/customers/7/notes");
    assert_eq!(seen[1].header("content-type"), Some("application/json"));
    let body: Value = serde_json::from_slice(&seen[1].body).unwrap();
    assert_eq!(body, json!({"note": "called back", "tags": ["a"]}));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_credential_comes_from_the_environment_at_call_time() {
    let server = Server::start(|_| Reply::json(200, json!({"ok": true}))).await;
    let (f, _) = crm(&server, env);
    ok(&run(&f, ToolCall::new("crm_orders", json!({"customer_id": "1"}))).await);
    let seen = server.seen();
    assert_eq!(seen[0].header("authorization"), Some("Bearer s3cret-token"));

    // Unset: the operator learns the variable's name; nothing is sent.
    let server = Server::start(|_| Reply::json(200, json!({"ok": true}))).await;
    let (f, _) = crm(&server, |n| (n == "CLIENT_ID").then(|| "x".to_owned()));
    let o = run(&f, ToolCall::new("crm_orders", json!({"customer_id": "1"}))).await;
    assert_eq!(o.kind, OutcomeKind::ToolFailed, "{}", o.text);
    assert!(o.text.contains("`CRM_TOKEN`"), "{}", o.text);
    assert!(o.text.contains("operator"), "{}", o.text);
    assert!(server.seen().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn error_statuses_say_what_the_api_said_with_a_hint() {
    let server = Server::start(|seen| match seen.path() {
        "/api/customers/404" => Reply::json(404, json!({"message": "no customer 404"})),
        "/api/customers/401" => Reply::json(401, json!({"error": "bad token"})),
        "/api/customers/302" => Reply {
            extra: vec![("Location", "http://elsewhere.example/".into())],
            ..Reply::json(302, json!({}))
        },
        _ => Reply {
            status: 500,
            content_type: "text/html",
            body: b"<h1>Internal\n Server Error</h1>".to_vec(),
            length: true,
            delay: Duration::ZERO,
            extra: Vec::new(),
        },
    })
    .await;
    let (f, _) = crm(&server, env);
    let o = run(&f, ToolCall::new("crm_customer", json!({"id": 404}))).await;
    assert_eq!(o.kind, OutcomeKind::ToolFailed);
    assert!(o.text.contains("404"), "{}", o.text);
    assert!(o.text.contains("no customer 404"), "{}", o.text);
    assert!(o.text.contains("check the path values"), "{}", o.text);
    let o = run(&f, ToolCall::new("crm_customer", json!({"id": 500}))).await;
    assert!(o.text.contains("500"), "{}", o.text);
    assert!(o.text.contains("Internal Server Error"), "{}", o.text);
    assert!(o.text.contains("try again later"), "{}", o.text);
    let o = run(&f, ToolCall::new("crm_customer", json!({"id": 401}))).await;
    assert!(
        o.text.contains("401") && o.text.contains("bad token"),
        "{}",
        o.text
    );
    assert!(o.text.contains("credentials"), "{}", o.text);
    let o = run(&f, ToolCall::new("crm_customer", json!({"id": 302}))).await;
    assert!(
        o.text.contains("302") && o.text.contains("does not follow"),
        "{}",
        o.text
    );
    // The redirect was not followed.
    assert_eq!(server.seen().len(), 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slow_api_times_out_and_a_gone_one_cannot_be_reached() {
    let server = Server::start(|_| Reply {
        delay: Duration::from_secs(3),
        ..Reply::json(200, json!({}))
    })
    .await;
    let (f, _) = crm(&server, env);
    let started = std::time::Instant::now();
    let o = run(&f, ToolCall::new("crm_customer", json!({"id": 1}))).await;
    assert_eq!(o.kind, OutcomeKind::ToolFailed, "{}", o.text);
    assert!(
        o.text.contains("did not answer within 300 ms"),
        "{}",
        o.text
    );
    assert!(started.elapsed() < Duration::from_secs(2));

    // A port nobody listens on.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let gone = Server {
        base: format!("http://127.0.0.1:{port}"),
        seen: Arc::default(),
    };
    let (f, _) = crm(&gone, env);
    let o = run(&f, ToolCall::new("crm_customer", json!({"id": 1}))).await;
    assert_eq!(o.kind, OutcomeKind::ToolFailed, "{}", o.text);
    assert!(o.text.contains("cannot be reached"), "{}", o.text);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_call_stops_waiting() {
    let server = Server::start(|_| Reply {
        delay: Duration::from_secs(5),
        ..Reply::json(200, json!({}))
    })
    .await;
    let (f, _) = crm(&server, env);
    let cancel = CancellationToken::new();
    let ctx = f
        .ctx
        .for_call(Arc::new(dataref_tool::NoProgress), cancel.clone());
    let tool = f.registry.get("crm_orders").unwrap().clone();
    let later = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        later.cancel();
    });
    let started = std::time::Instant::now();
    let args = json!({"customer_id": "1"}).as_object().unwrap().clone();
    let e = tool.call(args, &ctx).await.unwrap_err();
    assert!(e.to_string().contains("cancelled"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_answer_over_the_cap_is_refused() {
    let big = format!("[{}]", vec!["{\"a\": 1}"; 500].join(","));
    let body = big.into_bytes();
    let server = Server::start(move |seen| Reply {
        status: 200,
        content_type: "application/json",
        body: body.clone(),
        // One says its length, the other streams until the connection closes.
        length: seen.path().contains("/told/"),
        delay: Duration::ZERO,
        extra: Vec::new(),
    })
    .await;
    let (f, _) = crm(&server, env);
    for id in ["told", "streamed"] {
        let o = run(&f, ToolCall::new("crm_orders", json!({"customer_id": id}))).await;
        assert_eq!(o.kind, OutcomeKind::ToolFailed, "{}", o.text);
        assert!(o.text.contains("larger than this tool takes"), "{}", o.text);
        assert!(o.text.contains("max_response_bytes"), "{}", o.text);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn arguments_are_checked_against_the_declared_schema() {
    let server = Server::start(|_| Reply::json(200, json!({}))).await;
    let (f, config) = crm(&server, env);
    for args in [
        json!({"id": "seven"}),
        json!({}),
        json!({"id": 7, "extra": true}),
    ] {
        let o = run(&f, ToolCall::new("crm_customer", args.clone())).await;
        assert_eq!(o.kind, OutcomeKind::InvalidArguments, "{args}: {}", o.text);
    }
    let o = run(
        &f,
        ToolCall::new("crm_orders", json!({"customer_id": "1", "status": "lost"})),
    )
    .await;
    assert_eq!(o.kind, OutcomeKind::InvalidArguments, "{}", o.text);
    assert!(server.seen().is_empty());

    let tool = HttpTool::new(config.http_tools["crm_orders"].clone());
    let schema = &tool.spec().input_schema;
    assert_eq!(schema["required"], json!(["customer_id"]));
    assert_eq!(schema["additionalProperties"], json!(false));
    assert_eq!(
        schema["properties"]["status"],
        json!({"type": "string", "enum": ["open", "shipped", "a b&c"], "default": "open"})
    );
    assert_eq!(
        schema["properties"]["customer_id"]["description"],
        "The customer's number."
    );
    assert_eq!(schema["properties"]["ids"]["type"], "array");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_registry_has_each_declared_tool_and_its_annotation() {
    let config = tools_config(CRM, "http://127.0.0.1:9");
    let registry = dataref_builtins::builtin_registry_with(&config, None).unwrap();
    let mutating = |name: &str| registry.get(name).unwrap().is_mutating();
    assert!(!mutating("crm_orders"));
    assert!(!mutating("crm_customer"));
    assert!(mutating("crm_note"));
    assert!(!mutating("crm_search"));
    let config: HttpToolConfig = config.http_tools["crm_note"].clone();
    assert!(!HttpTool::new(config).spec().annotations.read_only);
    // The names the config refuses are the built-in tools' own.
    let builtin = dataref_builtins::builtin_registry_with(&f_config(), None).unwrap();
    let mut names: Vec<&str> = builtin
        .specs()
        .map(|s| s.name.as_str())
        .filter(|n| !n.starts_with("fetch_"))
        .collect();
    names.sort_unstable();
    let mut declared = dataref_config::http_tool::BUILTIN_TOOL_NAMES.to_vec();
    declared.sort_unstable();
    for n in &names {
        assert!(
            declared.contains(n),
            "`{n}` is missing from BUILTIN_TOOL_NAMES"
        );
    }
}
