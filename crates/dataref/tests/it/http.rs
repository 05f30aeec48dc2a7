//! The real binary over Streamable HTTP: `dataref token new`, `serve --http` (the URL line,
//! load from 50 concurrent clients, memory, SIGTERM), and its refusals at start.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dataref_test_support::ServeHttp;
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;

use super::BIN;

/// `dataref token new NAME`: the token and the config lines, from stdout.
fn new_token(name: &str) -> (String, String) {
    let out = Command::new(BIN)
        .args(["token", "new", name])
        .output()
        .expect("run dataref token new");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    let token = stdout
        .lines()
        .find_map(|l| l.strip_prefix("token: "))
        .expect("a token line")
        .to_owned();
    let config: String = stdout
        .lines()
        .skip_while(|l| !l.starts_with("[principals."))
        .map(|l| format!("{l}\n"))
        .collect();
    (token, config)
}

/// Starts `dataref serve --http 127.0.0.1:0` and returns it with its MCP URL.
fn start(home: &Path, config: &Path) -> (ServeHttp, String) {
    let mut cmd = Command::new(BIN);
    cmd.arg("serve")
        .arg("--config")
        .arg(config)
        .arg("--home")
        .arg(home)
        .args(["--http", "127.0.0.1:0"])
        .env_remove("DATAREF_CONFIG")
        .env_remove("DATAREF_HOME");
    let server = ServeHttp::start(&mut cmd, Duration::from_secs(60)).expect("dataref serve --http");
    let url = format!("{}/mcp", server.base());
    (server, url)
}

fn vm_hwm_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmHWM")
}

fn terminate(child: &mut Child) -> std::process::ExitStatus {
    let pid = rustix::process::Pid::from_raw(child.id() as i32).expect("pid");
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        assert!(Instant::now() < deadline, "no exit within 20 s of SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// 50 clients (two principals) × 100 `list_artifacts` calls, all at once: no errors,
/// bounded memory, and SIGTERM ends the server cleanly afterwards.
#[tokio::test(flavor = "multi_thread")]
async fn http_load_50_clients_by_100_calls() {
    dataref_config::tls::install_provider();
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let (eu, eu_lines) = new_token("eu_analyst");
    let (us, us_lines) = new_token("us_analyst");
    assert_eq!(eu.len(), 43, "256 bits in base64url");
    assert!(eu_lines.starts_with("[principals.eu_analyst]\ntoken_sha256 = [\""));
    let config = dir.path().join("dataref.toml");
    std::fs::write(
        &config,
        format!(
            "[python]\nenabled = false\n\n[http]\nmax_concurrent = 64\nrate_per_minute = 1000000\n\n{eu_lines}\n{us_lines}"
        ),
    )
    .expect("write config");
    let (mut server, url) = start(&home, &config);
    assert!(url.ends_with("/mcp"), "{url}");

    const CLIENTS: usize = 50;
    const CALLS: usize = 100;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..CLIENTS {
        let token = if i % 2 == 0 { eu.clone() } else { us.clone() };
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let config = StreamableHttpClientTransportConfig::with_uri(url).auth_header(token);
            let transport = StreamableHttpClientTransport::from_config(config);
            let client = match ().serve(transport).await {
                Ok(c) => c,
                Err(e) => return Err(format!("connect: {e}")),
            };
            let mut errors = Vec::new();
            for _ in 0..CALLS {
                match client
                    .call_tool(CallToolRequestParams::new("list_artifacts"))
                    .await
                {
                    Ok(r) if r.is_error != Some(true) => {}
                    Ok(r) => errors.push(format!("isError: {:?}", r.content)),
                    Err(e) => errors.push(e.to_string()),
                }
            }
            let _ = client.cancel().await;
            if errors.is_empty() {
                Ok(())
            } else {
                Err(format!("{} errors, first: {}", errors.len(), errors[0]))
            }
        }));
    }
    let mut failures = Vec::new();
    for t in tasks {
        match t.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failures.push(e),
            Err(e) => failures.push(e.to_string()),
        }
    }
    let elapsed = started.elapsed();
    let hwm = vm_hwm_kib(server.child().id());
    println!(
        "http load: {CLIENTS} clients x {CALLS} calls in {:.2} s ({:.0} calls/s), server VmHWM {} MiB",
        elapsed.as_secs_f64(),
        (CLIENTS * CALLS) as f64 / elapsed.as_secs_f64(),
        hwm / 1024
    );
    let status = terminate(server.child());
    assert!(
        failures.is_empty(),
        "{} clients failed: {failures:?}",
        failures.len()
    );
    assert!(hwm < 256 * 1024, "server peak RSS {hwm} KiB");
    assert!(status.success(), "exit after SIGTERM: {status:?}");
}

/// `auth = false` anywhere but loopback, or no way to authenticate anyone, stops the start
/// with a hint.
#[test]
fn http_refuses_to_start_open_to_the_network_or_with_nobody_allowed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = |toml: &str, addr: &str| {
        let config = dir.path().join("dataref.toml");
        std::fs::write(&config, toml).expect("write config");
        let out = Command::new(BIN)
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .arg("--home")
            .arg(dir.path().join("home"))
            .args(["--http", addr])
            .env_remove("DATAREF_CONFIG")
            .stdin(Stdio::null())
            .output()
            .expect("run");
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = run("[http]\nauth = false\n", "0.0.0.0:0");
    assert!(
        e.contains("not a loopback address") && e.contains("hint:"),
        "{e}"
    );
    let e = run("[python]\nenabled = false\n", "127.0.0.1:0");
    assert!(e.contains("dataref token new"), "{e}");
    let e = run("[python]\nenabled = false\n", "nowhere");
    assert!(e.contains("is not an address"), "{e}");
}

/// The whole path as a team would run it: one `serve --http` process, two tokens, a
/// PostgreSQL source with row-level security. The same named query gives each principal
/// its own rows (as its own role), a table only one role may read is a clear error for the
/// other, and the other principal's dataRef is as unknown as a made-up one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_two_tokens_get_their_own_postgres_rows() {
    dataref_config::tls::install_provider();
    let pg = dataref_test_support::TestPostgres::start().expect("start PostgreSQL");
    pg.execute(
        "CREATE ROLE dataref_login LOGIN NOINHERIT;
         CREATE ROLE eu_analyst NOLOGIN;
         CREATE ROLE us_analyst NOLOGIN;
         GRANT eu_analyst, us_analyst TO dataref_login;
         CREATE TABLE orders (id int, region text, amount numeric(12,2));
         INSERT INTO orders VALUES (1, 'EU', 10.50), (2, 'US', 20.00), (3, 'EU', 30.25);
         ALTER TABLE orders ENABLE ROW LEVEL SECURITY;
         CREATE POLICY eu_rows ON orders FOR SELECT TO eu_analyst USING (region = 'EU');
         CREATE POLICY us_rows ON orders FOR SELECT TO us_analyst USING (region = 'US');
         GRANT SELECT ON orders TO eu_analyst, us_analyst;
         CREATE TABLE salaries (name text, salary int);
         GRANT SELECT ON salaries TO eu_analyst;",
    )
    .await
    .expect("set up roles and policies");
    let dir = tempfile::tempdir().expect("tempdir");
    let (eu, eu_lines) = new_token("eu_analyst");
    let (us, us_lines) = new_token("us_analyst");
    let config = dir.path().join("dataref.toml");
    std::fs::write(
        &config,
        format!(
            "[python]\nenabled = false\n\n\
             [sources.warehouse]\nkind = \"postgres\"\nurl = \"{}\"\n\n\
             [queries.orders]\nsource = \"warehouse\"\ndescription = \"Orders.\"\n\
             sql = \"SELECT id, region, amount FROM orders ORDER BY id\"\n\n\
             [queries.salaries]\nsource = \"warehouse\"\ndescription = \"Salaries.\"\n\
             sql = \"SELECT name, salary FROM salaries\"\n\n{eu_lines}\n{us_lines}",
            pg.conninfo("dataref_login")
        ),
    )
    .expect("write config");
    let (mut server, url) = start(&dir.path().join("home"), &config);
    let connect = |token: String| {
        let config = StreamableHttpClientTransportConfig::with_uri(url.clone()).auth_header(token);
        ().serve(StreamableHttpClientTransport::from_config(config))
    };
    let eu = connect(eu).await.expect("eu connects");
    let us = connect(us).await.expect("us connects");
    let call = |client: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
                tool: &str,
                args: serde_json::Value| {
        let params = CallToolRequestParams::new(tool.to_owned())
            .with_arguments(args.as_object().cloned().unwrap_or_default());
        let peer = client.peer().clone();
        async move { peer.call_tool(params).await.expect("call") }
    };

    let mine = call(&eu, "fetch_orders", serde_json::json!({})).await;
    assert_ne!(mine.is_error, Some(true), "{:?}", mine.content);
    let mine = mine.structured_content.expect("structured");
    assert_eq!(mine["rows"], 2, "{mine}");
    let theirs = call(&us, "fetch_orders", serde_json::json!({})).await;
    let theirs = theirs.structured_content.expect("structured");
    assert_eq!(theirs["rows"], 1, "{theirs}");
    assert!(theirs.to_string().contains("US") && !theirs.to_string().contains("\"EU\""));

    let refused = call(&us, "fetch_salaries", serde_json::json!({})).await;
    assert_eq!(refused.is_error, Some(true));
    let text = format!("{:?}", refused.content);
    assert!(
        text.contains("us_analyst") && text.contains("no access"),
        "{text}"
    );

    // eu's table, asked for by us, answers like a reference nobody made.
    let eu_ref = mine["dataRef"].as_str().expect("dataRef").to_owned();
    let stolen = call(
        &us,
        "describe_data",
        serde_json::json!({ "dataRef": eu_ref }),
    )
    .await;
    let made_up = call(
        &us,
        "describe_data",
        serde_json::json!({ "dataRef": "data_AAAAAAAAAAAAAAAAAAAAAA" }),
    )
    .await;
    assert_eq!(stolen.is_error, Some(true));
    let strip = |r: &rmcp::model::CallToolResult| {
        format!("{:?}", r.content)
            .replace(&eu_ref, "REF")
            .replace("data_AAAAAAAAAAAAAAAAAAAAAA", "REF")
    };
    assert_eq!(strip(&stolen), strip(&made_up));

    let _ = eu.cancel().await;
    let _ = us.cancel().await;
    assert!(terminate(server.child()).success());
}
