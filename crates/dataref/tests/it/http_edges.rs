//! The edges of `serve --http`, each through the real binary: JWT headers and claims,
//! repeated and contradicting `Host`/`Origin`, many principals against the descriptor
//! limit, stalled downloads, slow request bodies, SIGTERM with a call open, and the log.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use dataref_test_support::ServeHttp;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::BIN;

const TOKEN: &str = "edge-token-0123456789abcdef0123456789abcdef";
const HS_SECRET: &str = "hs256-secret-for-the-edge-tests-0123456789";

/// `[principals.eu_analyst]` with [`TOKEN`].
fn principal_lines() -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, TOKEN.as_bytes());
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("[principals.eu_analyst]\ntoken_sha256 = [\"{hex}\"]\n")
}

/// A running `dataref serve --http 127.0.0.1:0`, its stderr collected.
struct Server {
    serve: ServeHttp,
    /// `127.0.0.1:PORT`
    addr: String,
}

impl Server {
    fn base(&self) -> String {
        self.serve.base()
    }

    fn mcp(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    fn log(&self) -> Vec<String> {
        self.serve.log_lines()
    }

    fn pid(&mut self) -> u32 {
        self.serve.child().id()
    }

    /// Whether a line matching `pred` reaches the log (read by another thread) within 10 s.
    fn log_has(&self, pred: impl Fn(&str) -> bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if self.log().iter().any(|l| pred(l)) {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = rustix::process::Pid::from_raw(self.pid() as i32).expect("pid");
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.serve.child().try_wait().expect("wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "no exit within 30 s of SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `dataref serve` with `config`; `wrap` runs it under another command (e.g. `prlimit`).
/// An error is what it wrote before it stopped.
fn spawn(home: &Path, config: &str, wrap: &[&str]) -> Result<Server, String> {
    let config_path = home.with_extension("toml");
    std::fs::write(&config_path, config).expect("write config");
    let mut cmd = match wrap.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(BIN);
            c
        }
        None => Command::new(BIN),
    };
    cmd.arg("serve")
        .arg("--config")
        .arg(&config_path)
        .arg("--home")
        .arg(home)
        .args(["--http", "127.0.0.1:0"])
        .env_remove("DATAREF_CONFIG")
        .env_remove("DATAREF_HOME")
        .env("DATAREF_LOG", "info");
    let serve =
        ServeHttp::start(&mut cmd, Duration::from_secs(60)).map_err(|e| format!("{e:#}"))?;
    let addr = serve.addr().to_owned();
    Ok(Server { serve, addr })
}

fn start(home: &Path, config: &str) -> Server {
    spawn(home, config, &[]).unwrap_or_else(|log| panic!("the server did not start:\n{log}"))
}

fn client() -> reqwest::Client {
    dataref_config::tls::install_provider();
    reqwest::Client::builder().build().expect("client")
}

/// A stateless (2026-07-28) `tools/call`: one POST, answered with the result.
async fn stateless_call(
    c: &reqwest::Client,
    url: &str,
    token: &str,
    tool: &str,
    args: Value,
) -> (u16, String) {
    stateless_call_as(c, url, token, tool, args, json!({})).await
}

/// [`stateless_call`] from a client whose capabilities are `capabilities`.
async fn stateless_call_as(
    c: &reqwest::Client,
    url: &str,
    token: &str,
    tool: &str,
    args: Value,
    capabilities: Value,
) -> (u16, String) {
    let body = json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": tool, "arguments": args, "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "edge", "version": "0"},
            "io.modelcontextprotocol/clientCapabilities": capabilities,
        }},
    });
    let r = c
        .post(url)
        .bearer_auth(token)
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", tool)
        .body(body.to_string())
        .send()
        .await
        .expect("send tools/call");
    let status = r.status().as_u16();
    (status, r.text().await.unwrap_or_default())
}

fn initialize_body() -> String {
    json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
    })
    .to_string()
}

/// `request` as written on one connection, and the status and text of the answer.
async fn raw(addr: &str, request: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(request.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}

fn hs256(header: &Value, claims: &Value) -> String {
    let input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, HS_SECRET.as_bytes());
    let sig = URL_SAFE_NO_PAD.encode(ring::hmac::sign(&key, input.as_bytes()));
    format!("{input}.{sig}")
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64
}

/// A critical header extension is refused, an audience is required (at start, unless
/// waived), and a token without the configured `aud` is refused.
#[tokio::test(flavor = "multi_thread")]
async fn http_jwt_crit_and_audience() {
    let dir = tempfile::tempdir().expect("tempdir");
    let jwt = format!(
        "[python]\nenabled = false\n\n[http.jwt]\nalgorithm = \"HS256\"\nsecret = \"{HS_SECRET}\"\n"
    );
    // No audience and no waiver: refused at start, with the way out.
    let refused = spawn(&dir.path().join("a"), &jwt, &[])
        .err()
        .expect("refused");
    assert!(
        refused.contains("http.jwt.audience") && refused.contains("require_audience = false"),
        "{refused}"
    );

    let mut server = start(
        &dir.path().join("b"),
        &format!("{jwt}audience = \"dataref\"\n"),
    );
    let c = client();
    let status = |token: String| {
        let c = c.clone();
        let url = server.mcp();
        async move {
            c.post(url)
                .bearer_auth(token)
                .header("accept", "application/json, text/event-stream")
                .header("content-type", "application/json")
                .body(initialize_body())
                .send()
                .await
                .expect("send")
                .status()
                .as_u16()
        }
    };
    let claims = json!({"sub": "eu_analyst", "exp": now() + 300, "aud": "dataref"});
    let header = json!({"alg": "HS256", "typ": "JWT"});
    assert_eq!(status(hs256(&header, &claims)).await, 200);
    for crit in [
        json!({"alg": "HS256", "crit": ["exp_v2"], "exp_v2": true}),
        json!({"alg": "HS256", "crit": []}),
    ] {
        assert_eq!(status(hs256(&crit, &claims)).await, 401, "{crit}");
    }
    let no_aud = json!({"sub": "eu_analyst", "exp": now() + 300});
    assert_eq!(status(hs256(&header, &no_aud)).await, 401);
    assert!(
        server.log_has(|l| l.contains("`crit`")),
        "the log says why: {:?}",
        server.log()
    );
    assert!(server.terminate().success());

    // Waived explicitly: any audience.
    let mut server = start(
        &dir.path().join("c"),
        &format!("{jwt}require_audience = false\n"),
    );
    let c = client();
    let r = c
        .post(server.mcp())
        .bearer_auth(hs256(&header, &no_aud))
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .body(initialize_body())
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
    assert!(server.terminate().success());
}

/// Two `Origin` headers (one allowed), two `Host` headers, and an absolute-form target
/// naming another host: each refused with 400 and a hint, on the MCP endpoint and on a
/// file download alike.
#[tokio::test(flavor = "multi_thread")]
async fn http_refuses_repeated_host_origin_and_foreign_targets() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let ws = home.join("workspaces/eu_analyst");
    std::fs::create_dir_all(&ws).expect("mkdir");
    std::fs::write(ws.join("a.csv"), "x\n1\n").expect("write");
    let mut server = start(
        &home,
        &format!("[python]\nenabled = false\n\n{}", principal_lines()),
    );
    let addr = server.addr.clone();
    let get = |extra: &str, target: &str| {
        format!(
            "GET {target} HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\n{extra}Connection: close\r\n\r\n"
        )
    };
    let host = format!("Host: {addr}\r\n");
    let origin = format!("Origin: http://{addr}\r\n");
    let (status, text) = raw(&addr, &get(&format!("{host}{origin}"), "/files/a.csv")).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.ends_with("x\n1\n"), "{text}");
    let cases = [
        (
            get(
                &format!("{host}{origin}Origin: https://evil.example.com\r\n"),
                "/files/a.csv",
            ),
            "more than one `origin`",
        ),
        (
            get(&format!("{host}Host: evil.example.com\r\n"), "/files/a.csv"),
            "more than one `host`",
        ),
        (
            get(&host, "http://evil.example.com/files/a.csv"),
            "names the host `evil.example.com`",
        ),
        (
            format!(
                "POST http://evil.example.com/mcp HTTP/1.1\r\n{host}Authorization: Bearer {TOKEN}\r\n\
                 Accept: application/json, text/event-stream\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{}",
                initialize_body().len(),
                initialize_body()
            ),
            "names the host `evil.example.com`",
        ),
        (
            format!(
                "POST /mcp HTTP/1.1\r\n{host}Host: evil.example.com\r\nAuthorization: Bearer {TOKEN}\r\n\
                 Accept: application/json, text/event-stream\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{}",
                initialize_body().len(),
                initialize_body()
            ),
            "more than one `host`",
        ),
    ];
    for (request, expect) in cases {
        let (status, text) = raw(&addr, &request).await;
        assert_eq!(status, 400, "{request}\n{text}");
        assert!(text.contains(expect), "{text}");
        assert!(text.contains("\"hint\""), "{text}");
        assert!(!text.contains("x\n1\n"), "the file was served: {text}");
    }
    assert!(server.terminate().success());
}

/// 1,100 JWT principals, one call each, against 1,024 descriptors: every call works (the
/// open workspaces are bounded), and so do a new principal's and the first one's again.
#[tokio::test(flavor = "multi_thread")]
async fn http_many_principals_do_not_exhaust_descriptors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = format!(
        "[python]\nenabled = false\n\n[http]\nrate_per_minute = 100000\n\n[http.jwt]\nalgorithm = \"HS256\"\n\
         secret = \"{HS_SECRET}\"\naudience = \"dataref\"\n"
    );
    let mut server = spawn(
        &dir.path().join("home"),
        &config,
        &["prlimit", "--nofile=1024"],
    )
    .unwrap_or_else(|log| panic!("{log}"));
    let c = client();
    let header = json!({"alg": "HS256"});
    let token = |name: &str| {
        hs256(
            &header,
            &json!({"sub": name, "exp": now() + 600, "aud": "dataref"}),
        )
    };
    let mut failures = Vec::new();
    for i in 0..1100 {
        let name = format!("p{i:04}");
        let (status, body) = stateless_call(
            &c,
            &server.mcp(),
            &token(&name),
            "list_artifacts",
            json!({}),
        )
        .await;
        if status != 200 || !body.contains("\"result\"") || body.contains("\"isError\":true") {
            failures.push(format!("{name}: {status} {body}"));
        }
    }
    for name in ["p0000", "late_comer"] {
        let (status, body) =
            stateless_call(&c, &server.mcp(), &token(name), "list_artifacts", json!({})).await;
        if status != 200 || !body.contains("\"result\"") || body.contains("\"isError\":true") {
            failures.push(format!("{name}: {status} {body}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} calls failed, first: {}",
        failures.len(),
        failures[0]
    );
    let fds = std::fs::read_dir(format!("/proc/{}/fd", server.pid()))
        .map(|d| d.count())
        .unwrap_or(0);
    assert!(fds < 512, "the server holds {fds} descriptors");
    assert!(server.terminate().success());
}

/// Eight signed-link downloads nobody reads do not take principal A's tool-call slots, a
/// ninth is refused with its own limit, and the stalled ones are closed after
/// `send_timeout`, which gives their slots back.
#[tokio::test(flavor = "multi_thread")]
async fn http_stalled_signed_downloads_neither_block_calls_nor_last() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let ws = home.join("workspaces/eu_analyst");
    std::fs::create_dir_all(&ws).expect("mkdir");
    // Far more than socket buffers hold.
    std::fs::write(ws.join("big.bin"), vec![7u8; 64 << 20]).expect("write");
    let mut server = start(
        &home,
        &format!(
            "[python]\nenabled = false\n\n[http]\nsend_timeout = \"5s\"\n\n{}",
            principal_lines()
        ),
    );
    let c = client();
    let signed: Value = c
        .post(format!("{}/files/sign", server.base()))
        .bearer_auth(TOKEN)
        .body(r#"{"path": "big.bin"}"#)
        .send()
        .await
        .expect("sign")
        .json()
        .await
        .expect("json");
    let url = signed["url"].as_str().expect("url").to_owned();
    // Each on a connection of its own, headers read, body never.
    let mut stalled = Vec::new();
    for _ in 0..8 {
        let r = client().get(&url).send().await.expect("download");
        assert_eq!(r.status(), 200);
        stalled.push(r);
    }
    let (status, body) =
        stateless_call(&c, &server.mcp(), TOKEN, "list_artifacts", json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"result\""), "{body}");
    let r = client().get(&url).send().await.expect("download");
    assert_eq!(r.status(), 429);
    let refused: Value = r.json().await.expect("json");
    assert_eq!(refused["limit"], "max_downloads", "{refused}");

    // Stalled for longer than `send_timeout`: the server gives up on them, and each ends
    // short of the file when finally read.
    tokio::time::sleep(Duration::from_secs(8)).await;
    for r in stalled {
        let read = tokio::time::timeout(Duration::from_secs(60), r.bytes()).await;
        match read {
            Ok(Ok(b)) => panic!("a stalled download was sent whole ({} bytes)", b.len()),
            Ok(Err(_)) => {}
            Err(_) => panic!("a stalled download was still open after 60 s"),
        }
    }
    let mut whole = None;
    for _ in 0..100 {
        let r = client().get(&url).send().await.expect("download");
        if r.status() == 200 {
            whole = Some(r.bytes().await.expect("body").len());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(whole, Some(64 << 20), "the slots came back");
    assert!(server.terminate().success());
}

/// A body sent a byte at a time is cut off with 408 and its connection closed, on the MCP
/// endpoint and on `/files/sign`.
#[tokio::test(flavor = "multi_thread")]
async fn http_slow_request_bodies_time_out() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut server = start(
        &dir.path().join("home"),
        &format!(
            "[python]\nenabled = false\n\n[http]\nbody_timeout = \"2s\"\n\n{}",
            principal_lines()
        ),
    );
    for path in ["/mcp", "/files/sign"] {
        let mut s = TcpStream::connect(&server.addr).await.expect("connect");
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {TOKEN}\r\n\
             Accept: application/json, text/event-stream\r\nContent-Type: application/json\r\n\
             Content-Length: 1000\r\n\r\n{{",
            server.addr
        );
        s.write_all(head.as_bytes()).await.expect("write");
        let (mut rd, mut wr) = s.into_split();
        let trickle = tokio::spawn(async move {
            for _ in 0..60 {
                tokio::time::sleep(Duration::from_millis(500)).await;
                if wr.write_all(b" ").await.is_err() {
                    return;
                }
            }
        });
        let mut out = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(25), rd.read_to_end(&mut out)).await;
        trickle.abort();
        let text = String::from_utf8_lossy(&out);
        assert!(read.is_ok(), "{path}: still open after 25 s: {text}");
        assert!(text.starts_with("HTTP/1.1 408"), "{path}: {text}");
        assert!(text.contains("body_timeout"), "{path}: {text}");
    }
    assert!(server.terminate().success());
}

/// SIGTERM while a `run_python` call runs: the call's result still arrives, then the
/// server exits cleanly.
#[tokio::test(flavor = "multi_thread")]
async fn http_sigterm_lets_an_open_call_finish() {
    // The data dir where the sandbox tests provision the Python runtime (once per target).
    let home = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dataref-runtime-home");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("dataref.toml");
    std::fs::write(&config, principal_lines()).expect("write config");
    let config_text = std::fs::read_to_string(&config).expect("read");
    let mut server = start(&home, &config_text);
    // The job writes a marker into its `out/`, a tmpfs inside the sandbox that the host
    // sees only through the jailed process's root (`/proc/<pid>/root/job/out`).
    let name = format!("started-{}.txt", std::process::id());
    let marker = {
        let name = name.clone();
        move || {
            std::fs::read_dir("/proc")
                .into_iter()
                .flatten()
                .flatten()
                .any(|e| e.path().join("root/job/out").join(&name).exists())
        }
    };
    let c = client();
    let url = server.mcp();
    let call = tokio::spawn(async move {
        stateless_call(
            &c,
            &url,
            TOKEN,
            "run_python",
            json!({"code": format!("import time\nopen('out/{name}', 'w').write('x')\ntime.sleep(4)\nresult = {{'slept': 4}}")}),
        )
        .await
    });
    let started = Instant::now();
    while !marker() {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "the call never started: {:?}",
            server.log()
        );
        assert!(!call.is_finished(), "the call ended before SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let status = tokio::task::spawn_blocking(move || {
        let status = server.terminate();
        (status, server)
    });
    let (code, body) = call.await.expect("call task");
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"slept\":4"), "{body}");
    let (status, server) = status.await.expect("terminate");
    assert!(status.success(), "{status:?}: {:?}", server.log());
}

/// Requests refused with a 1 MB value in them leave bounded lines in the server's log.
#[tokio::test(flavor = "multi_thread")]
async fn http_log_lines_are_bounded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut server = start(
        &dir.path().join("home"),
        &format!("[python]\nenabled = false\n\n{}", principal_lines()),
    );
    let c = client();
    let huge = "A".repeat(1 << 20);
    let send = |body: Value| {
        c.post(server.mcp())
            .bearer_auth(TOKEN)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
    };
    let init = |name: &str| {
        json!({
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": name, "version": "0"}}
        })
    };
    let r = send(init("edge")).await.expect("initialize");
    let session = r
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .expect("session")
        .to_owned();
    let in_session = |body: Value| {
        c.post(server.mcp())
            .bearer_auth(TOKEN)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .header("mcp-session-id", session.as_str())
            .header("mcp-protocol-version", "2025-11-25")
            .body(body.to_string())
            .send()
    };
    let _ = in_session(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
    for body in [
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "list_artifacts", "arguments": huge}}),
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": huge}}),
        json!({"jsonrpc": "2.0", "id": 4, "method": "resources/read", "params": {"uri": huge}}),
        json!({"jsonrpc": "2.0", "id": 5, "method": huge, "params": {}}),
    ] {
        let _ = in_session(body).await;
    }
    let _ = send(init(&huge)).await;
    assert!(server.terminate().success());
    // `stopped` is the server's last line: the log is read to its end.
    assert!(server.log_has(|l| l == "stopped"), "{:?}", server.log());
    let log = server.log();
    let lens: Vec<usize> = log.iter().map(String::len).collect();
    println!("log line lengths: {lens:?}");
    let longest = lens.iter().copied().max().unwrap_or(0);
    assert!(longest < 8 * 1024, "a log line of {longest} bytes");
    assert!(
        log.iter()
            .any(|l| l.contains("more bytes of this log line cut")),
        "a refused request's value reached the log, cut: {log:?}"
    );
}

/// `dataref web`: loopback only, a token of its own printed in the page's address (the
/// fragment, which no request carries), the page at `/` and the tools behind that token.
#[tokio::test(flavor = "multi_thread")]
async fn web_serves_the_page_on_loopback_with_a_token_of_its_own() {
    let home = tempfile::tempdir().expect("tempdir");
    let web = |extra: &[&str]| {
        let mut c = Command::new(BIN);
        c.args(["web", "--rows", "50", "--home"])
            .arg(home.path())
            .args(extra)
            .env_remove("DATAREF_CONFIG")
            .env_remove("DATAREF_HOME");
        c
    };
    let refused = web(&["--http", "0.0.0.0:0"])
        .output()
        .expect("run dataref web");
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("listens on this machine only"), "{said}");
    assert!(said.contains("hint: to serve other people"), "{said}");

    let mut child = web(&[])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dataref web");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(at) = line.find("open http://") {
                let url = line[at + 5..].split_whitespace().next().unwrap_or("");
                let _ = tx.send(url.to_owned());
            }
        }
    });
    let url = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("dataref web printed the page's address");
    let (base, token) = url.split_once("/#token=").expect("an address with a token");
    assert!(base.starts_with("http://127.0.0.1:"), "{base}");
    let c = client();
    let page = c.get(format!("{base}/")).send().await.expect("GET /");
    assert_eq!(page.status(), 200);
    assert!(page.headers().contains_key("content-security-policy"));
    let mcp = format!("{base}/mcp");
    // The page declares the view's extension, as an MCP Apps host does.
    let page_caps = json!({"extensions": {"io.modelcontextprotocol/ui": {"mimeTypes": ["text/html;profile=mcp-app"]}}});
    let (status, body) =
        stateless_call_as(&c, &mcp, token, "view_artifacts", json!({}), page_caps).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"total\":0"), "{body}");
    // A client without it has no such tool, called or listed.
    let (status, body) = stateless_call(&c, &mcp, token, "view_artifacts", json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("unknown tool `view_artifacts`"), "{body}");
    let (status, _) = stateless_call(&c, &mcp, "not-the-token", "view_artifacts", json!({})).await;
    assert_eq!(status, 401);
    let _ = child.kill();
    let _ = child.wait();
}
