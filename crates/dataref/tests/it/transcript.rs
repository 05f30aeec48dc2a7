//! The seed's transcript replayed word for word against the real binary over stdio at the
//! seed's 48,210 rows: every call works as the seed writes it, and every payload the model
//! may read (each text block whatever its audience, `structuredContent`, the other blocks,
//! and `tools/list`) is snapshotted with its byte size, so any change to what the model
//! reads is a reviewed diff. `dataref bench context` measures the same calls in tokens.

use std::collections::BTreeMap;
use std::path::PathBuf;

use rmcp::model::CallToolResult;
use serde_json::{Value, json};

use super::{call, connect, text};

/// The seed's `run_python` call, character for character.
const SEED_QOQ_CODE: &str = r#"q = sales.assign(q=sales.date.dt.to_period("Q"))
pivot = q.pivot_table(index="line", columns="q", values="revenue", aggfunc="sum")
delta = (pivot.iloc[:, -1] - pivot.iloc[:, -2]).sort_values()
outputs["qoq"] = delta.rename("delta").reset_index()
result = delta.head(5).round(2).to_dict()"#;

/// Stable placeholders for what changes from run to run, each the length of what it
/// replaces, so the byte sizes in the snapshot are the real ones (a run's `durationMs`
/// counts as four digits).
struct Redactor {
    refs: BTreeMap<String, String>,
}

impl Redactor {
    fn redact(&mut self, s: &str) -> String {
        let mut out = String::with_capacity(s.len());
        let b = s.as_bytes();
        let mut i = 0;
        while i < b.len() {
            if let Some(n) = self.data_ref_at(s, i) {
                out.push_str(&n);
                i += n.len();
            } else if let Some(len) = timestamp_at(b, i) {
                out.push_str(
                    &"<time>"
                        .chars()
                        .chain(std::iter::repeat('_'))
                        .take(len)
                        .collect::<String>(),
                );
                i += len;
            } else if let Some(len) = chart_hash_at(b, i) {
                out.push_str("<hash>__");
                i += len;
            } else if let Some(rest) = ["durationMs\\\":", "durationMs\": ", "durationMs\":"]
                .iter()
                .find(|p| {
                    s[i..].starts_with(**p) && b.get(i + p.len()).is_some_and(u8::is_ascii_digit)
                })
            {
                // A run's duration: always four characters, so sizes do not move with it.
                out.push_str(rest);
                i += rest.len();
                while b.get(i).is_some_and(u8::is_ascii_digit) {
                    i += 1;
                }
                out.push_str("<ms>");
            } else if let Some(len) = compact_time_at(b, i) {
                out.push_str(
                    &"<stamp>"
                        .chars()
                        .chain(std::iter::repeat('_'))
                        .take(len)
                        .collect::<String>(),
                );
                i += len;
            } else {
                let c = s[i..].chars().next().expect("char boundary");
                out.push(c);
                i += c.len_utf8();
            }
        }
        out
    }

    /// `data_` and 22 base64url characters at `i`: `data_<ref N>___…`, N in order of first
    /// appearance.
    fn data_ref_at(&mut self, s: &str, i: usize) -> Option<String> {
        let r = s.get(i..i + 27)?;
        let tail = r.strip_prefix("data_")?;
        if !tail
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
        {
            return None;
        }
        if i > 0 && s.as_bytes()[i - 1].is_ascii_alphanumeric() {
            return None;
        }
        let n = self.refs.len() + 1;
        let placeholder = self.refs.entry(r.to_owned()).or_insert_with(|| {
            format!("data_<ref{n}>{}", "_".repeat(27 - 10 - n.to_string().len()))
        });
        Some(placeholder.clone())
    }
}

/// An RFC 3339 time at `i` (`2026-12-01T18:02:47` and an optional fraction and zone).
fn timestamp_at(b: &[u8], i: usize) -> Option<usize> {
    let shape = b"dddd-dd-ddTdd:dd:dd";
    let s = b.get(i..i + shape.len())?;
    let fits = s.iter().zip(shape).all(|(c, p)| {
        if *p == b'd' {
            c.is_ascii_digit()
        } else {
            c == p
        }
    });
    if !fits {
        return None;
    }
    let mut j = i + shape.len();
    if b.get(j) == Some(&b'.') {
        j += 1;
        while b.get(j).is_some_and(u8::is_ascii_digit) {
            j += 1;
        }
    }
    match b.get(j) {
        Some(b'Z') => j += 1,
        Some(b'+' | b'-') if b.get(j + 1..j + 6).is_some() => j += 6,
        _ => {}
    }
    Some(j - i)
}

/// A chart file's argument hash at `i`: eight hex digits between `-` and `.`.
fn chart_hash_at(b: &[u8], i: usize) -> Option<usize> {
    if i == 0 || b[i - 1] != b'-' || b.get(i + 8) != Some(&b'.') {
        return None;
    }
    let s = b.get(i..i + 8)?;
    s.iter()
        .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
        .then_some(8)
}

/// A file-name time at `i`: `20261201-180247` (eight digits, `-`, six digits).
fn compact_time_at(b: &[u8], i: usize) -> Option<usize> {
    let s = b.get(i..i + 15)?;
    let fits = s.iter().enumerate().all(|(k, c)| {
        if k == 8 {
            *c == b'-'
        } else {
            c.is_ascii_digit()
        }
    });
    fits.then_some(15)
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).expect("JSON")
}

/// One step of the transcript: the call, then everything the model may be given.
fn section(red: &mut Redactor, tool: &str, args: &Value, r: &CallToolResult) -> String {
    let text = red.redact(&text(r));
    let structured = r
        .structured_content
        .as_ref()
        .map(|v| red.redact(&serde_json::to_string(v).expect("JSON")))
        .unwrap_or_default();
    let mut doc = format!(
        "## {tool} {}\n\ntext content: {} bytes\nstructuredContent: {} bytes\nboth: {} bytes\n\n",
        red.redact(&args.to_string()),
        text.len(),
        structured.len(),
        text.len() + structured.len()
    );
    for (k, block) in r.content.iter().enumerate() {
        let mut v = serde_json::to_value(block).expect("JSON");
        let size = red.redact(&serde_json::to_string(&v).expect("JSON")).len();
        // An image is kept by its size: its pixels are the chart's, not the model's text.
        if let Some(data) = v.get_mut("data") {
            let n = data.as_str().map_or(0, str::len);
            *data = json!(format!("<{n} bytes of base64>"));
        }
        doc.push_str(&format!(
            "### content[{k}] ({size} bytes as sent)\n{}\n\n",
            red.redact(&pretty(&v))
        ));
    }
    if let Some(s) = &r.structured_content {
        doc.push_str(&format!(
            "### structuredContent ({} bytes)\n{}\n\n",
            structured.len(),
            red.redact(&pretty(s))
        ));
    }
    doc
}

/// What one result puts in front of a host that passes every block to the model: the
/// content (a text block by its text, any other block by its JSON as sent) and
/// `structuredContent`, in bytes, placeholders not applied (the real sizes).
fn sizes(r: &CallToolResult) -> (usize, usize) {
    let content = r
        .content
        .iter()
        .map(|block| {
            let v = serde_json::to_value(block).expect("JSON");
            match v.get("type").and_then(Value::as_str) {
                Some("text") => v["text"].as_str().map_or(0, str::len),
                _ => serde_json::to_string(&v).expect("JSON").len(),
            }
        })
        .sum();
    let structured = r
        .structured_content
        .as_ref()
        .map_or(0, |v| serde_json::to_string(v).expect("JSON").len());
    (content, structured)
}

/// One call of the transcript, which must succeed as written, added to the snapshot.
async fn step(
    client: &super::Client,
    tool: &str,
    args: Value,
    doc: &mut String,
    red: &mut Redactor,
) -> CallToolResult {
    let r = call(client, tool, args.clone()).await;
    assert_ne!(
        r.is_error,
        Some(true),
        "`{tool}` as the seed writes it was refused: {}",
        text(&r)
    );
    doc.push_str(&section(red, tool, &args, &r));
    r
}

#[tokio::test(flavor = "multi_thread")]
async fn the_seeds_transcript_works_as_written_and_every_payload_is_snapshotted() {
    // The data dir where the sandbox tests provision the Python runtime (installed once
    // per target dir); a principal of its own.
    let home = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dataref-runtime-home");
    let client = connect(&home, "transcript", &["--rows", "48210"]).await;
    let mut red = Redactor {
        refs: BTreeMap::new(),
    };

    let tools = client.list_all_tools().await.expect("tools/list");
    let visible: Vec<Value> = tools
        .iter()
        .map(|t| json!({"name": t.name, "description": t.description, "inputSchema": t.input_schema}))
        .collect();
    let visible_bytes = serde_json::to_string(&visible).expect("JSON").len();
    let whole = json!({ "tools": tools });
    let whole_bytes = serde_json::to_string(&whole).expect("JSON").len();
    let mut doc = format!(
        "# the seed's transcript at 48210 rows\n\n## tools/list\n\n{} tools; name + description + inputSchema: {visible_bytes} bytes; the whole result: {whole_bytes} bytes\n\n{}\n\n",
        tools.len(),
        pretty(&whole)
    );

    let at = |r: &CallToolResult, p: &str| -> String {
        r.structured_content
            .as_ref()
            .and_then(|s| s.pointer(p))
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("no `{p}` in {:?}", r.structured_content))
            .to_owned()
    };

    let fetched = step(
        &client,
        "fetch_sales",
        json!({"since": "2025-01-01"}),
        &mut doc,
        &mut red,
    )
    .await;
    assert_eq!(fetched.structured_content.as_ref().unwrap()["rows"], 48210);
    let sales = at(&fetched, "/dataRef");
    step(
        &client,
        "describe_data",
        json!({ "dataRef": sales }),
        &mut doc,
        &mut red,
    )
    .await;
    let python = step(
        &client,
        "run_python",
        json!({"inputs": {"sales": sales}, "code": SEED_QOQ_CODE}),
        &mut doc,
        &mut red,
    )
    .await;
    let qoq = at(&python, "/outputs/qoq/dataRef");
    step(
        &client,
        "render_chart",
        json!({"dataRef": qoq, "x": "line", "y": "delta", "kind": "bar"}),
        &mut doc,
        &mut red,
    )
    .await;
    step(
        &client,
        "export_data",
        json!({"source": qoq, "format": "csv"}),
        &mut doc,
        &mut red,
    )
    .await;
    client.cancel().await.ok();
    insta::assert_snapshot!("seed_transcript_48210", doc);
}

/// The five results of the seed's transcript, measured as a host that passes every block
/// to the model sees them: together within issue #14's budget (with a margin for the
/// larger numbers of 1M and 10M rows), and each step no larger than the seed's.
#[tokio::test(flavor = "multi_thread")]
async fn the_seeds_five_results_fit_the_context_budget() {
    let home = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dataref-runtime-home");
    let client = connect(&home, "transcript-sizes", &["--rows", "48210"]).await;
    let ok = |r: CallToolResult, tool: &str| {
        assert_ne!(r.is_error, Some(true), "{tool}: {}", text(&r));
        r
    };
    let fetched = ok(
        call(&client, "fetch_sales", json!({"since": "2025-01-01"})).await,
        "fetch_sales",
    );
    let sales = fetched.structured_content.as_ref().unwrap()["dataRef"].clone();
    let described = ok(
        call(&client, "describe_data", json!({ "dataRef": sales })).await,
        "describe_data",
    );
    let python = ok(
        call(
            &client,
            "run_python",
            json!({"inputs": {"sales": sales}, "code": SEED_QOQ_CODE}),
        )
        .await,
        "run_python",
    );
    let qoq = python.structured_content.as_ref().unwrap()["outputs"]["qoq"]["dataRef"].clone();
    let chart = ok(
        call(
            &client,
            "render_chart",
            json!({"dataRef": qoq, "x": "line", "y": "delta", "kind": "bar"}),
        )
        .await,
        "render_chart",
    );
    let export = ok(
        call(
            &client,
            "export_data",
            json!({"source": qoq, "format": "csv"}),
        )
        .await,
        "export_data",
    );
    client.cancel().await.ok();
    let seed = [1_988, 2_046, 896, 222, 224];
    let (mut content, mut both) = (0, 0);
    for ((tool, r), seed) in [
        ("fetch_sales", &fetched),
        ("describe_data", &described),
        ("run_python", &python),
        ("render_chart", &chart),
        ("export_data", &export),
    ]
    .into_iter()
    .zip(seed)
    {
        let (c, s) = sizes(r);
        assert!(
            c + s <= seed,
            "{tool}: {c} + {s} bytes, the seed's was {seed}"
        );
        content += c;
        both += c + s;
    }
    assert!(content <= 1_380, "content of the five: {content} bytes");
    assert!(
        both <= 2_650,
        "content + structuredContent of the five: {both} bytes"
    );
}

/// What a model following the seed writes when it gets a shape slightly wrong: refused,
/// with the exact fix in the hint, and the fixed call works.
#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_but_obvious_argument_gets_the_exact_fix() {
    let home = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dataref-runtime-home");
    let client = connect(&home, "transcript-fixes", &["--rows", "48210"]).await;
    let r = call(&client, "fetch_sales", json!({"since": "2025-01-01"})).await;
    let sales = r.structured_content.as_ref().unwrap()["dataRef"]
        .as_str()
        .unwrap()
        .to_owned();
    for (tool, wrong, fix, fixed) in [
        (
            "export_data",
            json!({"dataRef": sales, "format": "csv"}),
            "write `source` instead of `dataRef`",
            json!({"source": sales, "format": "csv"}),
        ),
        (
            "describe_data",
            json!({"data_ref": sales}),
            "write `dataRef` instead of `data_ref`",
            json!({"dataRef": sales}),
        ),
        (
            "export_data",
            json!({"source": sales, "format": "CSV"}),
            "write `format: \"csv\"`",
            json!({"source": sales, "format": "csv"}),
        ),
        (
            "render_chart",
            json!({"dataRef": sales, "x": "region", "y": "revenue", "kind": "Bar"}),
            "write `kind: \"bar\"`",
            json!({"dataRef": sales, "x": "region", "y": "revenue", "kind": "bar"}),
        ),
        (
            "render_chart",
            json!({"dataRef": sales, "x": "region", "y": 3, "kind": "bar"}),
            "`y` (string or array)",
            json!({"dataRef": sales, "x": "region", "y": ["revenue"], "kind": "bar"}),
        ),
    ] {
        let r = call(&client, tool, wrong.clone()).await;
        assert_eq!(r.is_error, Some(true), "{tool} {wrong}: {}", text(&r));
        assert!(text(&r).contains(fix), "{tool} {wrong}: {}", text(&r));
        let r = call(&client, tool, fixed.clone()).await;
        assert_ne!(r.is_error, Some(true), "{tool} {fixed}: {}", text(&r));
    }
    client.cancel().await.ok();
}
