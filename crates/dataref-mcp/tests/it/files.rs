use std::time::{Duration, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use dataref_mcp::InProcessSession;
use dataref_mcp::rmcp::ServiceError;
use dataref_mcp::rmcp::model::{
    ErrorCode, PaginatedRequestParams, ReadResourceRequestParams, Resource, ResourceContents,
};
use dataref_protocol::Principal;
use dataref_workspace::{Overwrite, TEMP_PREFIX, Workspace};
use serde_json::json;

use crate::support::{Env, Recorder, call, is_error, text};

const CSV: &str = "region,revenue\r\nnorth,10\r\nsouth,20\r\n";
/// A PNG signature and bytes that are not UTF-8.
const PNG: &[u8] = &[
    0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0xff, 0xfe, 0x80,
];
const MD: &str = "# Q1\n\nRevenue *up*.\n";

fn workspace(env: &Env, principal: &str) -> anyhow::Result<Workspace> {
    Ok(Workspace::for_principal(
        env.home.path(),
        &Principal::new(principal)?,
    )?)
}

/// alice's files: text, binary, markdown, one in a subdirectory, one with a space, one
/// without an extension, and debris of an unfinished write.
fn alices_files(env: &Env) -> anyhow::Result<Workspace> {
    let ws = workspace(env, "alice")?;
    ws.write_atomic("sales.csv", CSV.as_bytes(), Overwrite::Refuse)?;
    ws.write_atomic("charts/revenue.png", PNG, Overwrite::Refuse)?;
    ws.write_atomic("notes.md", MD.as_bytes(), Overwrite::Refuse)?;
    ws.write_atomic(
        "reports/q1/summary.json",
        b"{\"ok\":true}",
        Overwrite::Refuse,
    )?;
    ws.write_atomic("my report.txt", b"spaced out", Overwrite::Refuse)?;
    ws.write_atomic("Makefile", b"all:\n", Overwrite::Refuse)?;
    std::fs::write(
        env.home
            .path()
            .join(format!("workspaces/alice/{TEMP_PREFIX}half-written")),
        b"partial",
    )?;
    // The oldest, so it comes last in a listing that is newest first.
    std::fs::File::options()
        .write(true)
        .open(env.home.path().join("workspaces/alice/notes.md"))?
        .set_modified(SystemTime::now() - Duration::from_secs(86_400 * 365))?;
    Ok(ws)
}

fn files(listed: &[Resource]) -> Vec<&Resource> {
    listed
        .iter()
        .filter(|r| r.uri.starts_with("dataref://files/"))
        .collect()
}

async fn read(
    session: &InProcessSession<Recorder>,
    uri: &str,
) -> Result<ResourceContents, ServiceError> {
    let mut read = session
        .client
        .read_resource(ReadResourceRequestParams::new(uri))
        .await?;
    assert_eq!(read.contents.len(), 1, "{uri}");
    Ok(read.contents.remove(0))
}

/// (mime type, text) of a text resource.
async fn read_text(
    session: &InProcessSession<Recorder>,
    uri: &str,
) -> anyhow::Result<(String, String)> {
    match read(session, uri).await? {
        ResourceContents::TextResourceContents {
            uri: got,
            mime_type,
            text,
            ..
        } => {
            assert_eq!(got, uri);
            Ok((mime_type.unwrap_or_default(), text))
        }
        other => anyhow::bail!("expected text contents for {uri}, got {other:?}"),
    }
}

/// (mime type, decoded bytes) of a blob resource.
async fn read_blob(
    session: &InProcessSession<Recorder>,
    uri: &str,
) -> anyhow::Result<(String, Vec<u8>)> {
    match read(session, uri).await? {
        ResourceContents::BlobResourceContents {
            mime_type, blob, ..
        } => Ok((
            mime_type.unwrap_or_default(),
            BASE64.decode(blob).map_err(|e| anyhow::anyhow!("{e}"))?,
        )),
        other => anyhow::bail!("expected blob contents for {uri}, got {other:?}"),
    }
}

async fn read_err(session: &InProcessSession<Recorder>, uri: &str) -> dataref_mcp::rmcp::ErrorData {
    match read(session, uri).await {
        Ok(contents) => panic!("{uri} was served: {contents:?}"),
        Err(ServiceError::McpError(e)) => e,
        Err(other) => panic!("expected an MCP error for {uri}, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_files_are_listed_with_types_and_sizes() -> anyhow::Result<()> {
    let env = Env::new(100)?;
    alices_files(&env)?;
    let session = env.connect("alice").await?;

    let templates = session.client.list_all_resource_templates().await?;
    let template = templates
        .iter()
        .find(|t| t.uri_template == "dataref://files/{path}")
        .expect("a files template");
    assert!(template.description.is_some());

    let listed = session.client.list_all_resources().await?;
    let listed = files(&listed);
    let names: Vec<&str> = listed.iter().map(|r| r.name.as_str()).collect();
    // Newest first, ties by path: all but notes.md were written within a moment, so the
    // order among them depends on the clock's seconds; notes.md is a year older.
    assert_eq!(names.len(), 6, "{names:?}");
    assert_eq!(names.last(), Some(&"notes.md"), "oldest last: {names:?}");
    let mut sorted = names.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        [
            "Makefile",
            "charts/revenue.png",
            "my report.txt",
            "notes.md",
            "reports/q1/summary.json",
            "sales.csv",
        ],
        "no directories, no temp files"
    );
    let by_name = |name: &str| {
        *listed
            .iter()
            .find(|r| r.name == name)
            .unwrap_or_else(|| panic!("{name} listed"))
    };
    let expect = [
        (
            "sales.csv",
            "dataref://files/sales.csv",
            Some("text/csv"),
            CSV.len(),
        ),
        (
            "charts/revenue.png",
            "dataref://files/charts/revenue.png",
            Some("image/png"),
            PNG.len(),
        ),
        (
            "notes.md",
            "dataref://files/notes.md",
            Some("text/markdown"),
            MD.len(),
        ),
        (
            "reports/q1/summary.json",
            "dataref://files/reports/q1/summary.json",
            Some("application/json"),
            11,
        ),
        (
            "my report.txt",
            "dataref://files/my%20report.txt",
            Some("text/plain"),
            10,
        ),
        // Unknown until read: a listing does not look inside.
        ("Makefile", "dataref://files/Makefile", None, 5),
    ];
    for (name, uri, mime, size) in expect {
        let r = by_name(name);
        assert_eq!(r.uri, uri, "{name}");
        assert_eq!(r.mime_type.as_deref(), mime, "{name}");
        assert_eq!(r.size, Some(size as u64), "{name}");
        let description = r.description.as_deref().unwrap_or_default();
        assert!(
            description.starts_with(&format!(
                "File in your workspace, {size} bytes, modified 20"
            )),
            "{description}"
        );
        let annotations = r.annotations.as_ref().expect("annotations");
        assert!(annotations.last_modified.is_some());
    }
    session.client.cancel().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_read_as_text_or_blob() -> anyhow::Result<()> {
    let env = Env::new(100)?;
    alices_files(&env)?;
    let session = env.connect("alice").await?;

    let (mime, body) = read_text(&session, "dataref://files/sales.csv").await?;
    assert_eq!((mime.as_str(), body.as_str()), ("text/csv", CSV));

    let (mime, bytes) = read_blob(&session, "dataref://files/charts/revenue.png").await?;
    assert_eq!(mime, "image/png");
    assert_eq!(bytes, PNG);

    let (mime, body) = read_text(&session, "dataref://files/notes.md").await?;
    assert_eq!((mime.as_str(), body.as_str()), ("text/markdown", MD));

    let (mime, body) = read_text(&session, "dataref://files/reports/q1/summary.json").await?;
    assert_eq!(
        (mime.as_str(), body.as_str()),
        ("application/json", "{\"ok\":true}")
    );

    // Encoded as listed, encoded all the way, or as a client may send it raw.
    for uri in [
        "dataref://files/my%20report.txt",
        "dataref://files/my%20%72%65port%2Etxt",
        "dataref://files/my report.txt",
    ] {
        let (mime, body) = read_text(&session, uri).await?;
        assert_eq!((mime.as_str(), body.as_str()), ("text/plain", "spaced out"));
    }

    // No extension: the contents decide.
    let (mime, body) = read_text(&session, "dataref://files/Makefile").await?;
    assert_eq!((mime.as_str(), body.as_str()), ("text/plain", "all:\n"));
    let ws = workspace(&env, "alice")?;
    ws.write_atomic("blob", PNG, Overwrite::Refuse)?;
    let (mime, bytes) = read_blob(&session, "dataref://files/blob").await?;
    assert_eq!(
        (mime.as_str(), bytes.as_slice()),
        ("application/octet-stream", PNG)
    );
    // Named like text but not UTF-8: the exact bytes, still with their type.
    ws.write_atomic("latin1.csv", b"caf\xe9\r\n", Overwrite::Refuse)?;
    let (mime, bytes) = read_blob(&session, "dataref://files/latin1.csv").await?;
    assert_eq!(
        (mime.as_str(), bytes.as_slice()),
        ("text/csv", &b"caf\xe9\r\n"[..])
    );
    session.client.cancel().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_paths_are_not_found_and_name_no_host_path() -> anyhow::Result<()> {
    let env = Env::new(100)?;
    alices_files(&env)?;
    let home = env.home.path();
    let alice_dir = home.join("workspaces/alice");
    std::fs::write(home.join("secret.txt"), b"outside")?;
    std::os::unix::fs::symlink(home.join("secret.txt"), alice_dir.join("abs-link.txt"))?;
    std::os::unix::fs::symlink("../../secret.txt", alice_dir.join("up-link.txt"))?;
    std::fs::hard_link(home.join("secret.txt"), alice_dir.join("hard.txt"))?;
    let session = env.connect("alice").await?;

    let cases = [
        (
            "dataref://files/../secret.txt",
            "`../secret.txt` contains a `..` component",
        ),
        (
            "dataref://files//etc/passwd",
            "`/etc/passwd` is an absolute path",
        ),
        (
            "dataref://files/%2e%2e/x",
            "`../x` contains a `..` component",
        ),
        (
            "dataref://files/%2Fetc%2Fpasswd",
            "`/etc/passwd` is an absolute path",
        ),
        (
            "dataref://files/abs-link.txt",
            "`abs-link.txt` goes through the symbolic link `abs-link.txt`, which points to an \
             absolute path",
        ),
        (
            "dataref://files/up-link.txt",
            "`up-link.txt` leads outside the workspace through the symbolic link `up-link.txt`",
        ),
        (
            "dataref://files/hard.txt",
            "`hard.txt` has 2 names (hard links)",
        ),
        (
            "dataref://files/nope.csv",
            "`nope.csv` does not exist in the workspace",
        ),
        (
            "dataref://files/reports",
            "`reports` is a directory, not a regular file",
        ),
        ("dataref://files/", "`.` is a directory"),
        (
            "dataref://files/a%00b",
            "`a\\u{0}b` contains a NUL character",
        ),
        (
            "dataref://files/%ff.csv",
            "`\u{fffd}.csv` is not valid UTF-8",
        ),
        ("dataref://files/bad%zz", "`bad%zz` is not a valid path"),
    ];
    for (uri, message) in cases {
        let e = read_err(&session, uri).await;
        assert_eq!(
            e.code,
            ErrorCode::RESOURCE_NOT_FOUND,
            "{uri}: {}",
            e.message
        );
        assert!(
            e.message.starts_with(message),
            "{uri}: {:?} does not start with {message:?}",
            e.message
        );
        let whole = format!("{} {:?}", e.message, e.data);
        assert!(
            !whole.contains(&*home.to_string_lossy()),
            "{uri} leaks the host path: {whole}"
        );
    }
    // The links and the hard link are not offered either.
    let listed = session.client.list_all_resources().await?;
    let names: Vec<&str> = files(&listed).iter().map(|r| r.name.as_str()).collect();
    assert!(!names.contains(&"abs-link.txt") && !names.contains(&"up-link.txt"));

    // The session goes on serving.
    let (_, body) = read_text(&session, "dataref://files/sales.csv").await?;
    assert_eq!(body, CSV);
    let r = call(&session, "fetch_sales", json!({"since": "2025-01-01"})).await?;
    assert!(!is_error(&r), "{}", text(&r));
    session.client.cancel().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_over_the_cap_is_listed_but_not_served() -> anyhow::Result<()> {
    let env = Env::new(100)?;
    let ws = workspace(&env, "alice")?;
    let size = 20 * 1024 * 1024 + 1;
    ws.write_atomic("big.parquet", &vec![0u8; size], Overwrite::Refuse)?;
    let session = env.connect("alice").await?;

    let listed = session.client.list_all_resources().await?;
    let listed = files(&listed);
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0].mime_type.as_deref(),
        Some("application/vnd.apache.parquet")
    );
    assert_eq!(listed[0].size, Some(size as u64));

    let e = read_err(&session, "dataref://files/big.parquet").await;
    assert_eq!(e.code, ErrorCode::INVALID_PARAMS);
    assert_eq!(
        e.message,
        "`big.parquet` is too large to serve as a resource: 20971521 bytes; the limit is \
         20971520 bytes (20 MiB)"
    );
    session.client.cancel().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_principal_neither_sees_nor_reads_them() -> anyhow::Result<()> {
    let env = Env::new(100)?;
    alices_files(&env)?;
    let alice = env.connect("alice").await?;
    let bob = env.connect("bob").await?;

    assert!(files(&bob.client.list_all_resources().await?).is_empty());
    for (alices, nobodys) in [
        ("sales.csv", "nothing.csv"),
        ("charts/revenue.png", "charts/nothing.png"),
    ] {
        let stolen = read_err(&bob, &format!("dataref://files/{alices}")).await;
        let missing = read_err(&alice, &format!("dataref://files/{nobodys}")).await;
        assert_eq!(stolen.code, ErrorCode::RESOURCE_NOT_FOUND);
        assert_eq!(
            stolen.message.replace(alices, "NAME"),
            missing.message.replace(nobodys, "NAME"),
            "bob learns only that he has no such file"
        );
    }
    // A file of bob's own under the same name is his, not alice's.
    workspace(&env, "bob")?.write_atomic("sales.csv", b"bob's", Overwrite::Refuse)?;
    let (_, body) = read_text(&bob, "dataref://files/sales.csv").await?;
    assert_eq!(body, "bob's");
    let (_, body) = read_text(&alice, "dataref://files/sales.csv").await?;
    assert_eq!(body, CSV);
    alice.client.cancel().await?;
    bob.client.cancel().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn artifacts_then_files_page_by_page() -> anyhow::Result<()> {
    let env = Env::new(100)?;
    let ws = workspace(&env, "alice")?;
    for i in 0..210 {
        ws.write_atomic(&format!("out/{i:03}.csv"), b"x\r\n", Overwrite::Refuse)?;
    }
    let session = env.connect("alice").await?;
    let r = call(&session, "fetch_sales", json!({"since": "2025-01-01"})).await?;
    assert!(!is_error(&r), "{}", text(&r));

    let page = |cursor: Option<&str>| {
        let params = cursor.map(|c| PaginatedRequestParams::default().with_cursor(Some(c.into())));
        session.client.list_resources(params)
    };
    let first = page(None).await?;
    assert_eq!(first.resources.len(), 100);
    assert!(first.resources[0].uri.starts_with("dataref://artifacts/"));
    assert!(files(&first.resources).len() == 99);
    assert_eq!(first.next_cursor.as_deref(), Some("files:99"));
    let second = page(Some("files:99")).await?;
    assert_eq!(second.resources.len(), 100);
    assert_eq!(second.next_cursor.as_deref(), Some("files:199"));
    assert!(second.meta.is_none());
    let third = page(Some("files:199")).await?;
    assert_eq!(third.resources.len(), 1);
    assert_eq!(third.next_cursor, None);
    let note = &third.meta.as_ref().expect("a note on the cut").0;
    assert_eq!(note["dataref/filesTruncated"], json!(true));

    let all = session.client.list_all_resources().await?;
    let mut names: Vec<&str> = files(&all).iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names.len(), 200);
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), 200, "no file twice");

    let bad = session
        .client
        .list_resources(Some(
            PaginatedRequestParams::default().with_cursor(Some("files:x".into())),
        ))
        .await
        .expect_err("bad cursor");
    let ServiceError::McpError(bad) = bad else {
        panic!("expected an MCP error, got {bad:?}");
    };
    assert_eq!(bad.code, ErrorCode::INVALID_PARAMS);
    session.client.cancel().await?;
    Ok(())
}
