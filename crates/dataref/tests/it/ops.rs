//! What an operator meets first, through the real binary: `doctor` refuses what `serve
//! --http` refuses, with the same message; an error is printed once; `--help` names the
//! data dir the README names; the start line gives the address and the public URL; the
//! README's minimal HTTP config starts as written and a client with its token gets in; no
//! tool schema has a bare boolean where a host expects a schema object.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use rmcp::ServiceExt;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::Value;

use super::BIN;

/// An environment variable no test sets, for `${NAME}` that must be unset.
const UNSET: &str = "DATAREF_TEST_OPS_NEVER_SET";

fn run(args: &[&str], home: &Path, config: Option<&Path>) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .arg("--home")
        .arg(home)
        .env_remove("DATAREF_CONFIG")
        .env_remove("DATAREF_HOME")
        .env_remove("DATAREF_PRINCIPAL")
        .env_remove(UNSET)
        .stdin(Stdio::null());
    if let Some(c) = config {
        cmd.arg("--config").arg(c);
    }
    cmd.output().expect("run dataref")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `dataref token new NAME`: the token, and the `[principals.NAME]` lines it printed.
fn new_token(name: &str) -> (String, String) {
    let out = Command::new(BIN)
        .args(["token", "new", name])
        .output()
        .expect("run dataref token new");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let token = stdout
        .lines()
        .find_map(|l| l.strip_prefix("token: "))
        .expect("a token line")
        .to_owned();
    let lines = stdout
        .lines()
        .skip_while(|l| !l.starts_with("[principals."))
        .map(|l| format!("{l}\n"))
        .collect();
    (token, lines)
}

/// What every `[http.jwt]` must name (so the refusals below are about what they test).
const JWT_CLAIMS: &str = "issuer = \"https://idp.example.com\"\naudience = \"dataref\"\n";

/// Every config `serve --http` refuses at start is failed by `doctor --config` with the
/// very message and hint the server stops with, and the server prints its error once.
#[test]
fn doctor_fails_every_config_serve_http_refuses_with_the_same_message() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, token_lines) = new_token("eu_analyst");
    let refused: Vec<(&str, String)> = vec![
        (
            "a JWKS file that does not exist",
            format!(
                "{token_lines}\n[http.jwt]\nalgorithm = \"RS256\"\njwks_file = \"no-such-jwks.json\"\n{JWT_CLAIMS}"
            ),
        ),
        (
            "nobody with a token and no JWT",
            "[principals.eu_analyst]\npg_role = \"eu\"\n\n[http]\nlisten = \"127.0.0.1:0\"\n"
                .into(),
        ),
        (
            "a short HS256 secret",
            format!("[http.jwt]\nalgorithm = \"HS256\"\nsecret = \"too-short\"\n{JWT_CLAIMS}"),
        ),
        (
            "an HS256 secret from an unset variable",
            format!("[http.jwt]\nalgorithm = \"HS256\"\nsecret = \"${{{UNSET}}}\"\n{JWT_CLAIMS}"),
        ),
        (
            "auth off on every interface",
            "[http]\nauth = false\nlisten = \"0.0.0.0:0\"\n".into(),
        ),
        (
            "a signing key from an unset variable",
            format!("{token_lines}\n[http]\nsigning_key = \"${{{UNSET}}}\"\n"),
        ),
    ];
    for (i, (what, toml)) in refused.iter().enumerate() {
        let config = dir.path().join(format!("refused-{i}.toml"));
        std::fs::write(&config, format!("[python]\nenabled = false\n\n{toml}")).expect("write");
        let home = dir.path().join(format!("home-{i}"));

        let served = run(&["serve", "--http"], &home, Some(&config));
        assert!(!served.status.success(), "{what}: serve --http started");
        let stderr = text(&served.stderr);
        let message = stderr
            .lines()
            .find_map(|l| l.strip_prefix("error: "))
            .unwrap_or_else(|| panic!("{what}: no `error:` line in {stderr}"));
        let hint = stderr
            .lines()
            .find_map(|l| l.strip_prefix("hint: "))
            .unwrap_or_else(|| panic!("{what}: no `hint:` line in {stderr}"));
        assert_eq!(
            stderr.matches(message).count(),
            1,
            "{what}: the error is printed more than once:\n{stderr}"
        );

        let doctor = run(&["doctor"], &home, Some(&config));
        let report = text(&doctor.stdout);
        assert!(!doctor.status.success(), "{what}: doctor passed:\n{report}");
        let fail = report
            .lines()
            .find(|l| l.trim_start().starts_with("FAIL  serve --http"))
            .unwrap_or_else(|| panic!("{what}: no failed `serve --http` check:\n{report}"));
        assert!(
            fail.ends_with(message),
            "{what}: doctor says\n{fail}\nserve said\n{message}"
        );
        assert!(
            report
                .lines()
                .any(|l| l.trim_start().strip_prefix("hint: ") == Some(hint)),
            "{what}: doctor's hint differs from `{hint}`:\n{report}"
        );
    }
}

/// `doctor --http ADDR` checks what `serve --http ADDR` would listen on: a loopback-only
/// config is fine until the address says every interface.
#[test]
fn doctor_http_addr_checks_the_address_serve_would_use() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("dataref.toml");
    std::fs::write(
        &config,
        "[python]\nenabled = false\n\n[http]\nauth = false\n",
    )
    .expect("write");
    let home = dir.path().join("home");
    let ok = run(&["doctor"], &home, Some(&config));
    let report = text(&ok.stdout);
    assert!(ok.status.success(), "{report}");
    assert!(
        report.contains("would listen on 127.0.0.1:8750"),
        "{report}"
    );

    let open = run(&["doctor", "--http", "0.0.0.0:8750"], &home, Some(&config));
    let report = text(&open.stdout);
    assert!(!open.status.success(), "{report}");
    let served = run(&["serve", "--http", "0.0.0.0:8750"], &home, Some(&config));
    let stderr = text(&served.stderr);
    let message = stderr
        .lines()
        .find_map(|l| l.strip_prefix("error: "))
        .unwrap_or_else(|| panic!("no `error:` line in {stderr}"));
    assert!(message.contains("not a loopback address"), "{message}");
    assert!(report.contains(message), "{report}");

    // A config with nothing for HTTP may be meant for stdio: said, not failed.
    std::fs::write(&config, "[python]\nenabled = false\n").expect("write");
    let stdio = run(&["doctor"], &home, Some(&config));
    assert!(stdio.status.success(), "{}", text(&stdio.stdout));
    let forced = run(&["doctor", "--http"], &home, Some(&config));
    assert!(!forced.status.success(), "{}", text(&forced.stdout));
    assert!(text(&forced.stdout).contains("dataref token new"));
}

/// The default data dir as the README's table states it, root's included.
#[test]
fn help_states_the_default_data_dirs() {
    for command in ["serve", "doctor", "demo"] {
        let out = Command::new(BIN)
            .args([command, "--help"])
            .output()
            .expect("run --help");
        let help = text(&out.stdout);
        for dir in [
            "$DATAREF_HOME",
            "$XDG_DATA_HOME/dataref",
            "/var/lib/dataref` for root",
            "~/.local/share/dataref",
        ] {
            assert!(
                help.contains(dir),
                "`{command} --help` lacks {dir}:\n{help}"
            );
        }
    }
    let readme = readme();
    assert!(
        readme.contains(
            "default `$XDG_DATA_HOME/dataref`, else `/var/lib/dataref` for root, else `~/.local/share/dataref`"
        ),
        "the docs' `DATAREF_HOME` row (docs/src/configure.md) changed: update `--help` with it"
    );
    let out = Command::new(BIN)
        .args(["doctor", "--help"])
        .output()
        .expect("run doctor --help");
    insta::assert_snapshot!("doctor_help", text(&out.stdout));
}

/// A config file without `[sources]` says at start that it serves no data.
#[test]
fn a_config_without_sources_says_so_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("dataref.toml");
    std::fs::write(&config, "[store]\nttl = \"forever\"\n").expect("write");
    let home = dir.path().join("home");
    // A bad config says what is wrong and nothing else.
    let out = run(&["serve"], &home, Some(&config));
    assert!(!text(&out.stderr).contains("no `[sources]`"));

    std::fs::write(&config, "[python]\nenabled = false\n").expect("write");
    let doctor = run(&["doctor"], &home, Some(&config));
    let report = text(&doctor.stdout);
    assert!(
        report.contains("declares no `[sources]`") && report.contains("hint:"),
        "{report}"
    );
    let mut child = Command::new(BIN)
        .arg("serve")
        .arg("--home")
        .arg(&home)
        .arg("--config")
        .arg(&config)
        .env_remove("DATAREF_CONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn serve");
    let stderr = child.stderr.take().expect("stderr");
    let first = BufReader::new(stderr)
        .lines()
        .next()
        .expect("a line")
        .expect("utf-8");
    drop(child.stdin.take());
    let _ = child.wait();
    assert!(
        first.starts_with("note: ") && first.contains("declares no `[sources]`"),
        "{first}"
    );
}

/// `serve --http` as started by the tests: the process, and its first stderr line.
struct Started {
    child: Child,
    line: String,
}

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_http(home: &Path, config: &Path, addr: &str) -> Started {
    let mut child = Command::new(BIN)
        .arg("serve")
        .arg("--config")
        .arg(config)
        .arg("--home")
        .arg(home)
        .args(["--http", addr])
        .env_remove("DATAREF_CONFIG")
        .env_remove("DATAREF_HOME")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dataref serve --http");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.starts_with("serving MCP on ") {
                let _ = tx.send(line);
            }
        }
    });
    let line = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the server printed its start line");
    Started { child, line }
}

/// The first `http://…` in `line`, up to a space, `;` or `)`.
fn first_url(line: &str, scheme: &str) -> String {
    let at = line
        .find(scheme)
        .unwrap_or_else(|| panic!("no {scheme} in {line}"));
    line[at..]
        .split([' ', ';', ')'])
        .next()
        .unwrap_or("")
        .to_owned()
}

async fn list_tools(url: &str, token: &str) -> Vec<String> {
    dataref_config::tls::install_provider();
    let config = StreamableHttpClientTransportConfig::with_uri(url.to_owned()).auth_header(token);
    let client =
        ().serve(StreamableHttpClientTransport::from_config(config))
            .await
            .expect("connect with the token");
    let tools = client.list_all_tools().await.expect("tools/list");
    let _ = client.cancel().await;
    tools.into_iter().map(|t| t.name.to_string()).collect()
}

/// With `public_url` set, the start line gives both where it listens and where clients
/// reach it; the listen address is the one that answers.
#[tokio::test(flavor = "multi_thread")]
async fn start_line_names_listen_address_and_public_url() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (token, lines) = new_token("eu_analyst");
    let config = dir.path().join("dataref.toml");
    std::fs::write(
        &config,
        format!(
            "[python]\nenabled = false\n\n[http]\npublic_url = \"https://dataref.example.test\"\n\n{lines}"
        ),
    )
    .expect("write config");
    let started = start_http(&dir.path().join("home"), &config, "127.0.0.1:0");
    let listen = first_url(&started.line, "http://127.0.0.1:");
    assert!(
        listen.ends_with("/mcp") && !listen.ends_with(":0/mcp"),
        "{}",
        started.line
    );
    assert!(
        started
            .line
            .contains("clients reach it at https://dataref.example.test/mcp"),
        "{}",
        started.line
    );
    let tools = list_tools(&listen, &token).await;
    assert!(tools.iter().any(|t| t == "list_artifacts"), "{tools:?}");

    // Without `public_url` the two are one, printed once.
    std::fs::write(&config, format!("[python]\nenabled = false\n\n{lines}")).expect("write");
    let plain = start_http(&dir.path().join("home"), &config, "127.0.0.1:0");
    assert!(!plain.line.contains("clients reach it"), "{}", plain.line);
    assert_eq!(plain.line.matches("http://").count(), 1, "{}", plain.line);
}

/// The README and the book's pages (`docs/src/*.md`), one after another: what a person reads.
fn readme() -> String {
    let root: PathBuf = [env!("CARGO_MANIFEST_DIR"), "..", ".."].iter().collect();
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root.join("docs/src"))
        .expect("read docs/src")
        .map(|e| e.expect("a docs entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    // (Its folders hold generated reference pages: no blocks to check there.)
    std::iter::once(root.join("README.md"))
        .chain(pages)
        .map(|p| std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The fenced block of `lang` that follows the line `<!-- check: NAME -->` in the README.
fn readme_block(name: &str, lang: &str) -> String {
    let readme = readme();
    let marker = format!("<!-- check: {name} -->");
    let at = readme
        .find(&marker)
        .unwrap_or_else(|| panic!("neither README.md nor docs/src has `{marker}`"));
    let rest = &readme[at + marker.len()..];
    let fence = format!("```{lang}\n");
    let start = rest.find(&fence).expect("a fenced block after the marker") + fence.len();
    let end = rest[start..].find("```").expect("the block's end");
    rest[start..start + end].to_owned()
}

/// The README's minimal HTTP config, as written but for the digest of a real token, starts
/// (on a free port instead of 8750) and lets a client with that token in.
#[tokio::test(flavor = "multi_thread")]
async fn readme_minimal_http_config_starts_as_written() {
    let block = readme_block("http-minimal", "toml");
    let (token, lines) = new_token("eu_analyst");
    let digest = lines
        .lines()
        .find_map(|l| l.strip_prefix("token_sha256 = [\""))
        .and_then(|l| l.strip_suffix("\"]"))
        .expect("a digest line");
    // The README shows the lines `dataref token new eu_analyst` prints, the digest cut.
    let header = lines.lines().next().expect("a table line");
    assert!(
        block.contains(header),
        "README block:\n{block}\nprinted:\n{lines}"
    );
    let placeholder = block
        .lines()
        .find_map(|l| l.strip_prefix("token_sha256 = [\""))
        .and_then(|l| l.split('"').next())
        .expect("a token_sha256 line in the README block");
    let toml = block.replace(placeholder, digest);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("dataref.toml");
    std::fs::write(&config, &toml).expect("write");

    let doctor = run(&["doctor"], &dir.path().join("home"), Some(&config));
    let report = text(&doctor.stdout);
    assert!(
        report
            .lines()
            .any(|l| l.trim_start().starts_with("ok    serve --http")),
        "{report}"
    );
    let started = start_http(&dir.path().join("home"), &config, "127.0.0.1:0");
    let url = first_url(&started.line, "http://");
    let tools = list_tools(&url, &token).await;
    assert!(tools.iter().any(|t| t == "describe_data"), "{tools:?}");
}

/// Every schema position of every tool's input and output schema, as listed over stdio on
/// the built-in sample, holds a schema object: a bare `true`/`false` is refused by hosts
/// that map tool schemas onto a stricter dialect (the MCP Inspector's `--strict` lint calls
/// it an error). Booleans stay allowed where JSON Schema means them as flags of a kind
/// (`additionalProperties` and friends).
#[tokio::test(flavor = "multi_thread")]
async fn no_tool_schema_has_a_bare_boolean_schema() {
    let home = tempfile::tempdir().expect("tempdir");
    let client = super::connect(home.path(), "alice", &["--rows", "100"]).await;
    let tools = client.list_all_tools().await.expect("tools/list");
    client.cancel().await.ok();
    assert!(tools.iter().any(|t| t.name == "describe_data"));
    let mut bare = Vec::new();
    for t in &tools {
        let input = Value::Object((*t.input_schema).clone());
        walk(&input, &format!("{}.inputSchema", t.name), None, &mut bare);
        if let Some(output) = &t.output_schema {
            let output = Value::Object((**output).clone());
            walk(
                &output,
                &format!("{}.outputSchema", t.name),
                None,
                &mut bare,
            );
        }
    }
    assert!(bare.is_empty(), "bare boolean schemas: {bare:#?}");

    // Descriptions come from doc comments: a rustdoc link (`[`Item`]`) means nothing to a
    // model and must not reach one.
    let listed = serde_json::to_string(&tools).expect("serialise");
    assert!(
        !listed.contains("[`"),
        "a rustdoc link in a model-facing description: {}",
        &listed[listed.find("[`").unwrap_or(0)..][..120.min(listed.len())]
    );
}

/// Keywords whose value is one schema, a list of schemas, or a map of schemas.
const ONE: &[&str] = &[
    "items",
    "contains",
    "not",
    "propertyNames",
    "if",
    "then",
    "else",
    "additionalProperties",
    "unevaluatedProperties",
    "additionalItems",
    "unevaluatedItems",
    "contentSchema",
];
const LIST: &[&str] = &["allOf", "anyOf", "oneOf", "prefixItems"];
const MAP: &[&str] = &[
    "properties",
    "patternProperties",
    "dependentSchemas",
    "$defs",
    "definitions",
];
/// Where `true`/`false` is the usual spelling (allowed / forbidden), not a schema.
const FLAG: &[&str] = &[
    "additionalProperties",
    "unevaluatedProperties",
    "additionalItems",
    "unevaluatedItems",
];

fn walk(node: &Value, path: &str, keyword: Option<&str>, bare: &mut Vec<String>) {
    match node {
        Value::Bool(b) if !keyword.is_some_and(|k| FLAG.contains(&k)) => {
            bare.push(format!("{path}: {b}"));
        }
        Value::Object(o) => {
            for (k, v) in o {
                let at = format!("{path}.{k}");
                if ONE.contains(&k.as_str()) {
                    match v {
                        Value::Array(items) if k == "items" => {
                            for (i, s) in items.iter().enumerate() {
                                walk(s, &format!("{at}[{i}]"), Some(k), bare);
                            }
                        }
                        _ => walk(v, &at, Some(k), bare),
                    }
                } else if LIST.contains(&k.as_str()) {
                    for (i, s) in v.as_array().into_iter().flatten().enumerate() {
                        walk(s, &format!("{at}[{i}]"), Some(k), bare);
                    }
                } else if MAP.contains(&k.as_str()) {
                    for (name, s) in v.as_object().into_iter().flatten() {
                        walk(s, &format!("{at}.{name}"), Some(k), bare);
                    }
                }
            }
        }
        _ => {}
    }
}
