//! Upstream MCP servers: the real MCP Python SDK server of `tests/python/upstream_server.py`
//! (not ours), started over stdio and over Streamable HTTP, mounted, called, cancelled,
//! timed out and killed. No mocks: the Python SDK's venv from `scripts/test` is required.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dataref_config::{UpstreamConfig, UpstreamTransport};
use dataref_mcp::DatarefServer;
use dataref_mcp::upstream::{Upstream, UpstreamError, Upstreams, connect_with_env};
use dataref_tool::{Attachment, RunContext, Tool, ToolError, ToolOutput};
use serde_json::{Value, json};

use crate::support::{Env, Recorder, call, is_error, text};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The Python of `scripts/test`'s venv, which has the MCP Python SDK.
fn python() -> String {
    if let Some(p) = std::env::var_os("DATAREF_TEST_PYTHON").filter(|p| !p.is_empty()) {
        return p.to_string_lossy().into_owned();
    }
    let venv = workspace_root().join(".venv-test/bin/python");
    assert!(
        venv.exists(),
        "no Python with the MCP SDK at `{}`: run `scripts/test` once (it creates the venv), \
         or set DATAREF_TEST_PYTHON to a Python that has `mcp` installed",
        venv.display()
    );
    venv.to_string_lossy().into_owned()
}

fn script() -> String {
    workspace_root()
        .join("tests/python/upstream_server.py")
        .to_string_lossy()
        .into_owned()
}

fn stdio(name: &str) -> UpstreamConfig {
    UpstreamConfig {
        name: name.into(),
        transport: UpstreamTransport::Stdio {
            command: vec![python(), script()],
            env: BTreeMap::from([("UPSTREAM_GREETING".into(), "say ${GREETING}".into())]),
            cwd: None,
        },
        prefix: format!("{name}_"),
        tools: None,
        timeout: Duration::from_secs(30),
    }
}

fn http(name: &str, port: u16, token: &str) -> UpstreamConfig {
    UpstreamConfig {
        name: name.into(),
        transport: UpstreamTransport::Http {
            url: format!("http://127.0.0.1:{port}/mcp"),
            headers: BTreeMap::from([("X-Test-Token".into(), token.into())]),
        },
        prefix: format!("{name}_"),
        tools: None,
        timeout: Duration::from_secs(30),
    }
}

fn test_env(name: &str) -> Option<String> {
    match name {
        "GREETING" => Some("hello".into()),
        "TEST_TOKEN" => Some("t0ken".into()),
        _ => None,
    }
}

async fn mount(configs: &[UpstreamConfig]) -> Result<Upstreams, UpstreamError> {
    connect_with_env(configs, &test_env).await
}

fn tool(upstreams: &Upstreams, name: &str) -> Arc<dyn Tool> {
    upstreams
        .tools()
        .find(|t| t.spec().name == name)
        .unwrap_or_else(|| panic!("no tool `{name}`"))
}

async fn run(
    upstreams: &Upstreams,
    ctx: &RunContext,
    name: &str,
    args: Value,
) -> Result<ToolOutput, ToolError> {
    let Value::Object(args) = args else {
        panic!("arguments must be an object")
    };
    tool(upstreams, name).call(args, ctx).await
}

fn names(upstream: &Upstream) -> Vec<String> {
    upstream.tool_names()
}

/// Waits until `path` holds `cancelled`, the upstream's proof that the request was
/// cancelled there.
async fn wait_for_marker(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if std::fs::read_to_string(path).is_ok_and(|s| s == "cancelled") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "the upstream never saw `notifications/cancelled` (no marker at `{}`)",
        path.display()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_tools_are_listed_across_pages_prefixed_with_their_schemas_and_hints() {
    let upstreams = mount(&[stdio("up")]).await.unwrap();
    let server = &upstreams.servers()[0];
    assert_eq!(server.name(), "up");
    // The server lists three tools a page: all eight arrive.
    assert_eq!(
        names(server),
        [
            "up_records",
            "up_echo",
            "up_fail",
            "up_sleep",
            "up_weather",
            "up_picture",
            "up_env",
            "up_crash"
        ]
    );
    assert_eq!(server.listed(), 8);
    assert_eq!(
        server.server_info().await.as_deref(),
        Some("upstream-test"),
        "name and (empty) version from `initialize`"
    );
    let echo = tool(&upstreams, "up_echo");
    let spec = echo.spec();
    assert_eq!(
        spec.description,
        "[from upstream `up`] Returns the text it was given."
    );
    assert_eq!(spec.input_schema["type"], "object");
    assert_eq!(spec.input_schema["required"], json!(["text"]));
    assert!(spec.annotations.read_only);
    assert!(!spec.annotations.open_world);
    assert!(!echo.result_is_synopsis(), "large results get spilled");
    let weather = tool(&upstreams, "up_weather");
    let output = weather.spec().output_schema.as_ref().unwrap();
    assert_eq!(output["type"], "object");
    assert!(output["properties"]["celsius"].is_object(), "{output}");
    // No hints given: MCP's defaults.
    let records = tool(&upstreams, "up_records");
    assert!(!records.spec().annotations.read_only);
    assert!(records.spec().annotations.open_world);
    upstreams.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_allow_list_mounts_only_what_it_names_and_a_missing_name_is_an_error() {
    let mut c = stdio("up");
    c.prefix = "u-".into();
    c.tools = Some(vec!["weather".into(), "echo".into()]);
    let upstreams = mount(&[c.clone()]).await.unwrap();
    assert_eq!(names(&upstreams.servers()[0]), ["u-echo", "u-weather"]);
    assert_eq!(upstreams.servers()[0].listed(), 8);
    upstreams.shutdown().await;

    c.tools = Some(vec!["echo".into(), "sql".into()]);
    let e = mount(&[c]).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "upstream `up` has no tool `sql` (named in `tools`); it has `records`, `echo`, `fail`, \
         `sleep`, `weather`, `picture`, `env`, `crash`"
    );
    assert_eq!(e.hint(), "fix `tools` of this `[[upstream]]`");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_map_text_structured_content_errors_and_attachments() {
    let env = Env::new(100).unwrap();
    let ctx = env.context("alice").unwrap();
    let upstreams = mount(&[stdio("up")]).await.unwrap();

    let small = run(&upstreams, &ctx, "up_echo", json!({"text": "hi"}))
        .await
        .unwrap();
    assert_eq!(small.text.as_deref(), Some("echo: hi"));
    assert_eq!(small.structured, Value::Null);

    let large = run(&upstreams, &ctx, "up_records", json!({"count": 200}))
        .await
        .unwrap();
    let body = large.text.unwrap();
    assert!(body.len() > 1000, "{}", body.len());
    let rows: Vec<Value> = serde_json::from_str(&body).unwrap();
    assert_eq!(rows.len(), 200);
    assert_eq!(rows[199]["name"], "item-0199");

    let failed = run(&upstreams, &ctx, "up_fail", json!({"message": "boom"}))
        .await
        .unwrap_err();
    let ToolError::RespondToModel { message, hint } = failed else {
        panic!("{failed:?}")
    };
    assert!(message.contains("boom"), "{message}");
    assert_eq!(
        hint.as_deref(),
        Some("the upstream server `up` reported this error")
    );

    // Arguments the upstream's own validation refuses come back the same way.
    let refused = run(&upstreams, &ctx, "up_echo", json!({}))
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, ToolError::RespondToModel { hint: Some(h), .. } if h.contains("`up`")),
        "{refused:?}"
    );

    let weather = run(&upstreams, &ctx, "up_weather", json!({"city": "Oslo"}))
        .await
        .unwrap();
    assert_eq!(
        weather.structured,
        json!({"city": "Oslo", "celsius": 21.5, "conditions": "sunny"})
    );
    assert!(weather.text.unwrap().contains("Oslo"));

    let picture = run(&upstreams, &ctx, "up_picture", json!({}))
        .await
        .unwrap();
    assert_eq!(
        picture.text.as_deref(),
        Some(
            "a picture\n[image/png image, shown to the person]\n\
             [document `test://notes/1` (text/markdown, 8 characters), shown to the person]"
        )
    );
    assert!(
        matches!(&picture.attachments[0], Attachment::Image { data, mime_type } if data.starts_with(b"\x89PNG") && mime_type == "image/png")
    );
    assert_eq!(
        picture.attachments[1],
        Attachment::Document {
            uri: "test://notes/1".into(),
            mime_type: "text/markdown".into(),
            text: "# Notes\n".into()
        }
    );

    // `env` reached the child with `${GREETING}` expanded.
    let greeting = run(
        &upstreams,
        &ctx,
        "up_env",
        json!({"name": "UPSTREAM_GREETING"}),
    )
    .await
    .unwrap();
    assert_eq!(greeting.text.as_deref(), Some("say hello"));
    upstreams.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_call_times_out_and_the_upstream_is_told_to_cancel() {
    let env = Env::new(100).unwrap();
    let ctx = env.context("alice").unwrap();
    let mut c = stdio("up");
    c.timeout = Duration::from_millis(1500);
    let upstreams = mount(&[c]).await.unwrap();
    let marker = env.home.path().join("timeout-marker");
    let started = Instant::now();
    let e = run(
        &upstreams,
        &ctx,
        "up_sleep",
        json!({"seconds": 60, "marker": marker.to_string_lossy()}),
    )
    .await
    .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(
        e,
        ToolError::RespondToModel {
            message: "`sleep` of the upstream server `up` did not answer within 1500ms and was cancelled"
                .into(),
            hint: Some(
                "narrow the request; if the person expects it to take longer, an operator can raise `timeout` of `[[upstream]]` `up`"
                    .into()
            ),
        }
    );
    wait_for_marker(&marker).await;
    // The session is still good.
    let ok = run(&upstreams, &ctx, "up_echo", json!({"text": "after"}))
        .await
        .unwrap();
    assert_eq!(ok.text.as_deref(), Some("echo: after"));
    upstreams.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_the_call_cancels_it_upstream() {
    let env = Env::new(100).unwrap();
    let ctx = env.context("alice").unwrap();
    let upstreams = mount(&[stdio("up")]).await.unwrap();
    let marker = env.home.path().join("cancel-marker");
    let cancel = ctx.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        cancel.cancel();
    });
    let started = Instant::now();
    let e = run(
        &upstreams,
        &ctx,
        "up_sleep",
        json!({"seconds": 60, "marker": marker.to_string_lossy()}),
    )
    .await
    .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(e.to_string().contains("was cancelled"), "{e}");
    wait_for_marker(&marker).await;
    upstreams.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_dies_is_reported_then_started_again() {
    let env = Env::new(100).unwrap();
    let ctx = env.context("alice").unwrap();
    let upstreams = mount(&[stdio("up")]).await.unwrap();
    let e = run(&upstreams, &ctx, "up_crash", json!({}))
        .await
        .unwrap_err();
    let ToolError::RespondToModel { message, hint } = e else {
        panic!("{e:?}")
    };
    assert_eq!(
        message,
        "the upstream server `up` is not available: it closed the connection during the call"
    );
    assert!(hint.unwrap().contains("`[[upstream]]` `up`"));
    // The next call starts the server again.
    let ok = run(&upstreams, &ctx, "up_echo", json!({"text": "back"}))
        .await
        .unwrap();
    assert_eq!(ok.text.as_deref(), Some("echo: back"));
    upstreams.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_that_cannot_start_fail_with_the_upstream_named_and_a_hint() {
    let mut missing = stdio("ghost");
    missing.transport = UpstreamTransport::Stdio {
        command: vec!["/nonexistent/dataref-test-server".into()],
        env: BTreeMap::new(),
        cwd: None,
    };
    let e = mount(&[missing]).await.unwrap_err();
    assert!(
        e.to_string()
            .starts_with("upstream `ghost`: cannot start `/nonexistent/dataref-test-server`"),
        "{e}"
    );
    assert!(e.hint().contains("`command`"), "{}", e.hint());

    // Not an MCP server: it says why on stderr and exits.
    let mut broken = stdio("broken");
    broken.transport = UpstreamTransport::Stdio {
        command: vec![
            python(),
            "-c".into(),
            "import sys; print('no MCP here', file=sys.stderr); sys.exit(2)".into(),
        ],
        env: BTreeMap::new(),
        cwd: None,
    };
    let e = mount(&[stdio("up"), broken]).await.unwrap_err();
    assert_eq!(e.upstream(), "broken");
    let message = e.to_string();
    assert!(
        message.starts_with("upstream `broken`: the MCP handshake failed"),
        "{message}"
    );
    assert!(
        message.ends_with("its last words on stderr:\nno MCP here"),
        "{message}"
    );

    let mut unset = stdio("up");
    unset.transport = UpstreamTransport::Stdio {
        command: vec![python(), script()],
        env: BTreeMap::from([("TOKEN".into(), "${NOT_SET_ANYWHERE}".into())]),
        cwd: None,
    };
    let e = mount(&[unset]).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "upstream `up`: `env.TOKEN` uses `${NOT_SET_ANYWHERE}`, which is not set"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_tools_are_served_through_dataref_over_mcp() {
    let env = Env::new(100).unwrap();
    let upstreams = mount(&[stdio("up")]).await.unwrap();
    let mut builder = dataref_builtins::builtin_registry_builder(&env.config, None);
    for t in upstreams.tools() {
        builder.register(t);
    }
    let registry = Arc::new(builder.build().unwrap());
    let server = DatarefServer::new(registry, env.context("alice").unwrap());
    let session = dataref_mcp::connect_in_process(server, Recorder::default())
        .await
        .unwrap();
    let listed = session.client.list_all_tools().await.unwrap();
    let names: Vec<&str> = listed.iter().map(|t| t.name.as_ref()).collect();
    assert!(names.contains(&"describe_data"), "{names:?}");
    assert!(names.contains(&"up_echo"), "{names:?}");
    let echo = listed.iter().find(|t| t.name == "up_echo").unwrap();
    let hints = echo.annotations.as_ref().unwrap();
    assert_eq!(
        (hints.read_only_hint, hints.open_world_hint),
        (Some(true), Some(false))
    );

    let weather = call(&session, "up_weather", json!({"city": "Oslo"}))
        .await
        .unwrap();
    assert!(!is_error(&weather), "{}", text(&weather));
    assert_eq!(
        weather.structured_content,
        Some(json!({"city": "Oslo", "celsius": 21.5, "conditions": "sunny"}))
    );

    let failed = call(&session, "up_fail", json!({"message": "boom"}))
        .await
        .unwrap();
    assert!(is_error(&failed));
    assert!(
        text(&failed).ends_with("boom\nhint: the upstream server `up` reported this error"),
        "{}",
        text(&failed)
    );

    // dataref's own schema check runs before the upstream is asked.
    let bad = call(&session, "up_echo", json!({"text": 5})).await.unwrap();
    assert!(is_error(&bad), "{}", text(&bad));

    session.client.cancel().await.unwrap();
    session.server.await.unwrap().unwrap();
    upstreams.shutdown().await;
}

/// The upstream server over Streamable HTTP, killed when dropped.
struct HttpServer {
    child: tokio::process::Child,
    port: u16,
}

impl HttpServer {
    /// Starts it on a free port; it answers 401 without `X-Test-Token: t0ken`.
    async fn start() -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = tokio::process::Command::new(python())
            .arg(script())
            .args(["--http", &port.to_string()])
            .args(["--require-header", "X-Test-Token=t0ken"])
            .kill_on_drop(true)
            .spawn()?;
        let mut server = Self { child, port };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return Ok(server);
            }
            if let Some(status) = server.child.try_wait()? {
                anyhow::bail!("the HTTP upstream exited at start: {status}");
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "the HTTP upstream did not listen"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamable_http_upstreams_get_their_headers_calls_and_cancellation() {
    let env = Env::new(100).unwrap();
    let ctx = env.context("alice").unwrap();
    let mut server = HttpServer::start().await.unwrap();

    // Without the header the server refuses the handshake.
    let e = mount(&[http("web", server.port, "wrong")])
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("upstream `web`: the MCP handshake failed"),
        "{e}"
    );

    let upstreams = mount(&[http("web", server.port, "${TEST_TOKEN}")])
        .await
        .unwrap();
    assert_eq!(upstreams.servers()[0].tool_names().len(), 8);
    let small = run(&upstreams, &ctx, "web_echo", json!({"text": "over http"}))
        .await
        .unwrap();
    assert_eq!(small.text.as_deref(), Some("echo: over http"));
    let large = run(&upstreams, &ctx, "web_records", json!({"count": 200}))
        .await
        .unwrap();
    assert_eq!(
        serde_json::from_str::<Vec<Value>>(&large.text.unwrap())
            .unwrap()
            .len(),
        200
    );
    let failed = run(&upstreams, &ctx, "web_fail", json!({"message": "bad"}))
        .await
        .unwrap_err();
    assert!(failed.to_string().contains("bad"), "{failed}");

    let marker = env.home.path().join("http-marker");
    let cancel = ctx.cancel.child_token();
    let call_ctx = ctx.for_call(ctx.progress.clone(), cancel.clone());
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        cancel.cancel();
    });
    let e = run(
        &upstreams,
        &call_ctx,
        "web_sleep",
        json!({"seconds": 60, "marker": marker.to_string_lossy()}),
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("was cancelled"), "{e}");
    wait_for_marker(&marker).await;

    // The server goes away: calls say so, and the restart attempt fails the same way.
    server.child.kill().await.unwrap();
    let e = run(&upstreams, &ctx, "web_echo", json!({"text": "anyone?"}))
        .await
        .unwrap_err();
    let ToolError::RespondToModel { message, hint } = e else {
        panic!("{e:?}")
    };
    assert!(
        message.starts_with("the upstream server `web` is not available"),
        "{message}"
    );
    assert!(hint.unwrap().contains("`[[upstream]]` `web`"));
    let again = run(&upstreams, &ctx, "web_echo", json!({"text": "anyone?"}))
        .await
        .unwrap_err();
    assert!(
        again
            .to_string()
            .starts_with("the upstream server `web` is not available"),
        "{again}"
    );
    upstreams.shutdown().await;
}
