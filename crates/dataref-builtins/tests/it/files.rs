//! The file tools (`read_file`, `list_files`, `copy_file`) through `execute_tool_call` on a
//! real workspace: windows and their notes, binary files, bounded listings, copies, and the
//! refusals the model reads. No result may name a host path.

use std::path::PathBuf;

use dataref_tool::{CallOutcome, ToolCall};
use dataref_workspace::{Overwrite, TEMP_PREFIX};
use serde_json::{Value, json};

use super::{Fixture, error_text, fixture_with};

/// Default limits (16,000-character results, a long timeout): what a server runs with.
pub(super) fn fixture() -> Fixture {
    fixture_with(|_| {})
}

pub(super) fn write(f: &Fixture, path: &str, bytes: &[u8]) {
    f.ctx
        .workspace
        .write_atomic(path, bytes, Overwrite::Refuse)
        .unwrap();
}

/// The workspace directory on the host, only for planting links the tools must refuse.
fn workspace_dir(f: &Fixture) -> PathBuf {
    f.ctx.workspace.host_path_for_logging().to_owned()
}

/// Calls a tool and checks that nothing of the host's paths or the planted secret got out.
async fn call(f: &Fixture, tool: &str, args: Value) -> CallOutcome {
    let o = super::run(f, ToolCall::new(tool, args.clone())).await;
    let home = f.home.path().to_str().unwrap();
    assert!(
        !o.text.contains(home),
        "`{tool}` {args} leaked the host path: {}",
        o.text
    );
    assert!(
        !o.text.contains("TOP SECRET"),
        "`{tool}` {args}: {}",
        o.text
    );
    o
}

fn ok(o: &CallOutcome) -> &Value {
    assert!(!o.is_error(), "{}", o.text);
    let v = o.structured.as_ref().unwrap();
    assert_eq!(serde_json::to_string(v).unwrap(), o.text);
    v
}

fn numbered(text: &str) -> Vec<(u64, &str)> {
    text.split('\n')
        .map(|l| {
            let (n, rest) = l.split_once('\t').unwrap();
            (n.trim_start().parse().unwrap(), rest)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_window_of_a_long_file_says_what_follows() {
    let f = fixture();
    let body: String = (1..=1_000).map(|i| format!("event {i}: ok\n")).collect();
    write(&f, "logs/app.log", body.as_bytes());

    let o = call(&f, "read_file", json!({"path": "logs/app.log"})).await;
    let v = ok(&o);
    assert_eq!(v["path"], "logs/app.log");
    assert_eq!(v["mimeType"], "text/plain");
    assert_eq!(v["bytes"], body.len());
    assert_eq!(
        (&v["startLine"], &v["endLine"], &v["totalLines"]),
        (&json!(1), &json!(200), &json!(1_000))
    );
    assert_eq!(
        v["note"],
        "lines 201–1,000 not shown; pass `offset: 201` to continue"
    );
    let text = v["text"].as_str().unwrap();
    assert!(text.starts_with("     1\tevent 1: ok\n     2\tevent 2: ok\n"));
    let lines = numbered(text);
    assert_eq!(lines.len(), 200);
    assert_eq!(lines[199], (200, "event 200: ok"));

    let o = call(
        &f,
        "read_file",
        json!({"path": "logs/app.log", "offset": 990, "limit": 50}),
    )
    .await;
    let v = ok(&o);
    assert_eq!(
        (&v["startLine"], &v["endLine"]),
        (&json!(990), &json!(1_000))
    );
    assert_eq!(v["totalLines"], 1_000);
    assert!(v.get("note").is_none(), "the window reaches the end: {v}");
    assert!(
        v["text"]
            .as_str()
            .unwrap()
            .ends_with("  1000\tevent 1000: ok")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_offset_past_the_end_is_refused_with_the_line_count() {
    let f = fixture();
    write(&f, "short.txt", b"one\ntwo\nthree\n");
    let o = call(&f, "read_file", json!({"path": "short.txt", "offset": 4})).await;
    assert_eq!(
        error_text(&o),
        "error: `offset` is 4, but `short.txt` has only 3 lines\nhint: pass an `offset` from 1 to 3"
    );
    write(&f, "empty.txt", b"");
    let v = call(&f, "read_file", json!({"path": "empty.txt"})).await;
    let v = ok(&v);
    assert_eq!(v["totalLines"], 0);
    assert_eq!(v["text"], "");
    assert_eq!(v["note"], "the file is empty");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_very_long_line_is_cut_with_a_marker() {
    let f = fixture();
    let line = format!("[{}]", "7,".repeat(24_999));
    assert_eq!(line.chars().count(), 50_000);
    write(&f, "export/min.json", format!("{line}\n{{}}\n").as_bytes());
    let o = call(&f, "read_file", json!({"path": "export/min.json"})).await;
    let v = ok(&o);
    assert_eq!(v["mimeType"], "application/json");
    assert_eq!(v["totalLines"], 2);
    assert_eq!(v["note"], "line 1 was cut at 2,000 characters");
    let lines = numbered(v["text"].as_str().unwrap());
    assert_eq!(lines.len(), 2);
    let (n, first) = lines[0];
    assert_eq!(n, 1);
    assert!(
        first.ends_with("…[line cut: 48,000 more characters]"),
        "{first}"
    );
    assert!(first.starts_with(&line[..2_000]));
    assert_eq!(lines[1], (2, "{}"));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_text_cap_stops_at_a_line_boundary() {
    let f = fixture();
    let body: String = (1..=400)
        .map(|i| format!("{i:03}{}\n", "y".repeat(97)))
        .collect();
    write(&f, "wide.txt", body.as_bytes());
    let o = call(&f, "read_file", json!({"path": "wide.txt", "limit": 400})).await;
    let v = ok(&o);
    let text = v["text"].as_str().unwrap();
    assert!(text.chars().count() <= 12_000, "{}", text.chars().count());
    assert!(o.text.chars().count() <= 16_000, "under the result cap");
    let lines = numbered(text);
    let end = v["endLine"].as_u64().unwrap();
    assert!((100..400).contains(&end), "{end}");
    assert_eq!(lines.len() as u64, end);
    for (n, line) in &lines {
        assert_eq!(line.len(), 100, "line {n} is whole");
        assert!(line.starts_with(&format!("{n:03}")));
    }
    assert_eq!(
        v["note"],
        format!(
            "lines {}–400 not shown because the text is capped at 12,000 characters; pass \
             `offset: {}` to continue",
            end + 1,
            end + 1
        )
    );

    // Going on from there picks up exactly the next line.
    let o = call(
        &f,
        "read_file",
        json!({"path": "wide.txt", "offset": end + 1, "limit": 1}),
    )
    .await;
    let v = ok(&o);
    let next = numbered(v["text"].as_str().unwrap());
    assert_eq!(next[0].0, end + 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_binary_file_gives_its_type_and_size_only() {
    let f = fixture();
    let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
    png.extend((0..=255u8).cycle().take(4_000));
    write(&f, "charts/revenue.png", &png);
    let o = call(&f, "read_file", json!({"path": "charts/revenue.png"})).await;
    let v = ok(&o);
    assert_eq!(v["path"], "charts/revenue.png");
    assert_eq!(v["mimeType"], "image/png");
    assert_eq!(v["bytes"], png.len());
    for absent in ["text", "startLine", "endLine", "totalLines"] {
        assert!(v.get(absent).is_none(), "{absent} in {v}");
    }
    assert!(v["note"].as_str().unwrap().contains("binary file"), "{v}");
    assert!(o.text.len() < 600, "{}", o.text);

    write(&f, "blob", b"\xff\xfe\x00\x01");
    let o = call(&f, "read_file", json!({"path": "blob"})).await;
    assert_eq!(ok(&o)["mimeType"], "application/octet-stream");
}

#[tokio::test(flavor = "multi_thread")]
async fn listings_are_bounded_and_hide_temporary_files() {
    let f = fixture();
    for p in ["data/a.csv", "data/b.csv", "data/deep/c.csv", "notes.md"] {
        write(&f, p, b"x,y\n1,2\n");
    }
    // A write of dataref's that was interrupted: never shown.
    write(&f, &format!("data/{TEMP_PREFIX}1234-0-00ff"), b"partial");
    std::os::unix::fs::symlink("data/a.csv", workspace_dir(&f).join("latest.csv")).unwrap();

    let o = call(&f, "list_files", json!({})).await;
    let v = ok(&o);
    let entries = v["entries"].as_array().unwrap();
    let summary: Vec<(&str, &str)> = entries
        .iter()
        .map(|e| (e["path"].as_str().unwrap(), e["kind"].as_str().unwrap()))
        .collect();
    assert_eq!(
        summary,
        [
            ("data", "directory"),
            ("latest.csv", "symlink"),
            ("notes.md", "file")
        ]
    );
    assert_eq!(entries[2]["bytes"], 8);
    assert!(entries[0].get("bytes").is_none(), "no size for a directory");
    let modified = entries[2]["modified"].as_str().unwrap();
    assert!(
        dataref_protocol::Timestamp::parse_rfc3339(modified).is_some(),
        "{modified}"
    );
    assert_eq!(v["truncated"], false);
    assert!(v.get("note").is_none());

    let paths = |o: &CallOutcome| -> Vec<String> {
        ok(o)["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["path"].as_str().unwrap().to_owned())
            .collect()
    };
    let o = call(&f, "list_files", json!({"glob": "**/*.csv"})).await;
    assert_eq!(
        paths(&o),
        ["data/a.csv", "data/b.csv", "data/deep/c.csv", "latest.csv"]
    );
    let o = call(&f, "list_files", json!({"path": "data", "glob": "*.csv"})).await;
    assert_eq!(paths(&o), ["data/a.csv", "data/b.csv"]);
    // What models write: alternatives in braces.
    let o = call(&f, "list_files", json!({"glob": "**/*.{md,csv}"})).await;
    assert_eq!(
        paths(&o),
        [
            "data/a.csv",
            "data/b.csv",
            "data/deep/c.csv",
            "latest.csv",
            "notes.md"
        ]
    );
    let o = call(&f, "list_files", json!({"glob": "{notes,data/a}.*"})).await;
    assert_eq!(paths(&o), ["data/a.csv", "notes.md"]);
    let o = call(&f, "list_files", json!({"path": "data"})).await;
    assert_eq!(paths(&o), ["data/a.csv", "data/b.csv", "data/deep"]);
    let o = call(
        &f,
        "list_files",
        json!({"path": "./data/", "recursive": true}),
    )
    .await;
    assert_eq!(
        paths(&o),
        ["data/a.csv", "data/b.csv", "data/deep", "data/deep/c.csv"]
    );

    let o = call(
        &f,
        "list_files",
        json!({"recursive": true, "maxEntries": 2}),
    )
    .await;
    let v = ok(&o);
    assert_eq!(paths(&o), ["data", "data/a.csv"]);
    assert_eq!(v["truncated"], true);
    assert_eq!(
        v["note"],
        "only the first 2 entries are shown; narrow it with `glob` (e.g. `**/*.csv`) or a deeper \
         `path`, or raise `maxEntries` (at most 1,000)"
    );

    let o = call(&f, "list_files", json!({"glob": "**/*.parquet"})).await;
    let v = ok(&o);
    assert_eq!(v["entries"], json!([]));
    assert_eq!(v["note"], "nothing below `.` matches `**/*.parquet`");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_copy_can_be_read_back_and_is_not_overwritten_unasked() {
    let f = fixture();
    write(&f, "spill/result-1.csv", b"region,revenue\nnorth,10\n");
    write(
        &f,
        "spill/result-2.csv",
        b"region,revenue\nsouth,20\nwest,5\n",
    );

    let o = call(
        &f,
        "copy_file",
        json!({"src": "spill/result-1.csv", "dst": "kept/q3 sales.csv"}),
    )
    .await;
    assert_eq!(ok(&o), &json!({"path": "kept/q3 sales.csv", "bytes": 24}));
    let o = call(&f, "read_file", json!({"path": "kept/q3 sales.csv"})).await;
    let v = ok(&o);
    assert_eq!(v["mimeType"], "text/csv");
    assert_eq!(v["text"], "     1\tregion,revenue\n     2\tnorth,10");

    let o = call(
        &f,
        "copy_file",
        json!({"src": "spill/result-2.csv", "dst": "kept/q3 sales.csv"}),
    )
    .await;
    assert_eq!(
        error_text(&o),
        "error: `kept/q3 sales.csv` already exists\nhint: pass `overwrite: true` to replace it, \
         or pick another `dst`"
    );
    let o = call(&f, "read_file", json!({"path": "kept/q3 sales.csv"})).await;
    assert_eq!(ok(&o)["totalLines"], 2, "the refused copy changed nothing");

    let o = call(
        &f,
        "copy_file",
        json!({"src": "spill/result-2.csv", "dst": "kept/q3 sales.csv", "overwrite": true}),
    )
    .await;
    assert_eq!(ok(&o)["bytes"], 31);
    let o = call(&f, "read_file", json!({"path": "kept/q3 sales.csv"})).await;
    assert_eq!(ok(&o)["totalLines"], 3);
}

/// Everything the file tools refuse, as the model reads it.
#[tokio::test(flavor = "multi_thread")]
async fn what_the_model_reads_when_a_file_call_is_refused() {
    let f = fixture();
    write(&f, "notes.md", b"# notes\n");
    write(&f, "data/a.csv", b"x\n1\n");
    std::fs::write(f.home.path().join("secret.txt"), "TOP SECRET\n").unwrap();
    let ws = workspace_dir(&f);
    std::os::unix::fs::symlink("../../secret.txt", ws.join("leak.txt")).unwrap();
    std::os::unix::fs::symlink(f.home.path().join("secret.txt"), ws.join("abs-leak.txt")).unwrap();
    std::os::unix::fs::symlink("../..", ws.join("up")).unwrap();
    std::os::unix::fs::symlink("data", ws.join("data-link")).unwrap();
    std::fs::hard_link(f.home.path().join("secret.txt"), ws.join("hard.txt")).unwrap();

    let cases: Vec<(&str, &str, Value)> = vec![
        ("absolute", "read_file", json!({"path": "/etc/passwd"})),
        ("parent", "read_file", json!({"path": "../../secret"})),
        ("parent_inside", "read_file", json!({"path": "a/../b"})),
        ("link_outside", "read_file", json!({"path": "leak.txt"})),
        (
            "link_absolute",
            "read_file",
            json!({"path": "abs-leak.txt"}),
        ),
        (
            "through_link_dir",
            "read_file",
            json!({"path": "up/secret.txt"}),
        ),
        ("hard_link", "read_file", json!({"path": "hard.txt"})),
        ("nul", "read_file", json!({"path": "notes\u{0}.md"})),
        ("missing", "read_file", json!({"path": "Notes.md"})),
        ("directory", "read_file", json!({"path": "data"})),
        (
            "offset_past_end",
            "read_file",
            json!({"path": "notes.md", "offset": 5}),
        ),
        (
            "limit_too_large",
            "read_file",
            json!({"path": "notes.md", "limit": 5_000}),
        ),
        ("list_absolute", "list_files", json!({"path": "/etc"})),
        ("list_escape", "list_files", json!({"path": "up"})),
        ("list_a_file", "list_files", json!({"path": "notes.md"})),
        (
            "list_long_glob",
            "list_files",
            json!({"glob": "*".repeat(600)}),
        ),
        (
            "copy_from_outside",
            "copy_file",
            json!({"src": "/etc/passwd", "dst": "passwd"}),
        ),
        (
            "copy_through_link",
            "copy_file",
            json!({"src": "leak.txt", "dst": "mine.txt"}),
        ),
        (
            "copy_to_parent",
            "copy_file",
            json!({"src": "notes.md", "dst": "../notes.md"}),
        ),
        (
            "copy_onto_directory",
            "copy_file",
            json!({"src": "notes.md", "dst": "data"}),
        ),
        (
            "copy_into_linked_dir",
            "copy_file",
            json!({"src": "notes.md", "dst": "data-link/notes.md"}),
        ),
        (
            "copy_existing",
            "copy_file",
            json!({"src": "notes.md", "dst": "data/a.csv"}),
        ),
    ];
    let mut all = String::new();
    for (name, tool, args) in cases {
        let o = call(&f, tool, args).await;
        all.push_str(&format!("## {name}\n{}\n\n", error_text(&o)));
    }
    insta::assert_snapshot!("file_refusals", all);
    let o = call(&f, "list_files", json!({"path": "data"})).await;
    assert_eq!(
        ok(&o)["entries"].as_array().unwrap().len(),
        1,
        "nothing was written"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn file_tools_are_registered_with_their_annotations() {
    let f = fixture();
    let names = f.registry.names();
    let at = |n: &str| names.iter().position(|x| x == n).unwrap();
    assert!(at("list_artifacts") < at("read_file"));
    assert!(at("read_file") < at("list_files") && at("list_files") < at("copy_file"));
    for (name, read_only) in [
        ("read_file", true),
        ("list_files", true),
        ("copy_file", false),
    ] {
        let spec = f.registry.get(name).unwrap().spec().clone();
        assert_eq!(spec.annotations.read_only, read_only, "{name}");
        assert!(spec.description.contains("your workspace"), "{name}");
        assert_eq!(spec.input_schema["additionalProperties"], false, "{name}");
    }
}
