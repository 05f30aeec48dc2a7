use std::path::Path;
use std::sync::Arc;

use serde_json::{Value, json};

use super::events::{scrub, tool_call_event};
use super::*;

use std::time::Duration;

fn event(i: usize) -> Event {
    Event::new("test", format!("p{}", i % 3)).with("i", i)
}

fn write(dir: &Path, rotate: u64, n: usize) -> AuditLog {
    let log = AuditLog::open(dir, rotate).unwrap();
    for i in 0..n {
        log.append(&event(i)).unwrap();
    }
    log
}

fn files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut f: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    f.sort();
    f
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn put_lines(path: &Path, lines: &[String]) {
    let mut text = lines.join("\n");
    text.push('\n');
    std::fs::write(path, text).unwrap();
}

fn problem(dir: &Path) -> Problem {
    verify(dir).unwrap().problem.expect("a problem")
}

#[test]
fn rfc3339_with_milliseconds() {
    assert_eq!(rfc3339_millis(0), "1970-01-01T00:00:00.000Z");
    assert_eq!(
        rfc3339_millis(1_700_000_000_123),
        "2023-11-14T22:13:20.123Z"
    );
    assert_eq!(rfc3339_millis(-1), "1969-12-31T23:59:59.999Z");
    let leap = dataref_protocol::days_from_civil(2024, 2, 29) * 86_400_000 + 86_399_999;
    assert_eq!(rfc3339_millis(leap), "2024-02-29T23:59:59.999Z");
    assert_eq!(rfc3339_millis(951_782_400_000), "2000-02-29T00:00:00.000Z");
    assert_eq!(
        rfc3339_millis(253_402_300_799_000),
        "9999-12-31T23:59:59.000Z"
    );
}

#[test]
fn a_line_has_its_fields_in_order_and_a_hash_of_prev_and_body() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), DEFAULT_ROTATE_BYTES, 2);
    let l = lines(&files(dir.path())[0]);
    assert_eq!(l.len(), 2);
    let v: Value = serde_json::from_str(&l[0]).unwrap();
    let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        ["seq", "at", "principal", "event", "i", "prev", "hash"]
    );
    assert_eq!(v["seq"], 1);
    assert_eq!(v["prev"], GENESIS);
    assert_eq!(v["event"], "test");
    // The hash, recomputed as the docs say: prev's text, then the line without `,"hash":…`.
    let body = format!("{}}}", &l[0][..l[0].find(",\"hash\":").unwrap()]);
    let mut h = blake3::Hasher::new();
    h.update(GENESIS.as_bytes());
    h.update(body.as_bytes());
    assert_eq!(v["hash"], h.finalize().to_hex().as_str());
    let w: Value = serde_json::from_str(&l[1]).unwrap();
    assert_eq!(w["prev"], v["hash"]);
    assert_eq!(w["seq"], 2);
    let at = v["at"].as_str().unwrap();
    assert_eq!(at.len(), 24, "{at}");
    assert!(at.ends_with('Z'));
}

#[test]
fn a_whole_chain_verifies() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), DEFAULT_ROTATE_BYTES, 50);
    let v = verify(dir.path()).unwrap();
    assert_eq!(v.problem, None);
    assert_eq!((v.files, v.lines), (1, 50));
    assert_eq!((v.first_seq, v.last_seq), (Some(1), Some(50)));
    assert!(v.from_genesis);
}

#[test]
fn an_empty_or_absent_trail_is_whole() {
    let dir = tempfile::tempdir().unwrap();
    let v = verify(dir.path()).unwrap();
    assert_eq!((v.files, v.lines, v.problem), (0, 0, None));
    assert!(verify(&dir.path().join("nothing")).is_err());
}

#[test]
fn an_edited_line_is_named() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), DEFAULT_ROTATE_BYTES, 10);
    let f = &files(dir.path())[0];
    let mut l = lines(f);
    l[6] = l[6].replace("\"principal\":\"p0\"", "\"principal\":\"mallory\"");
    assert!(l[6].contains("mallory"));
    put_lines(f, &l);
    let p = problem(dir.path());
    assert_eq!((p.kind, p.line), (ProblemKind::Edited, 7), "{p:?}");
    assert_eq!(p.file, "audit-000001.jsonl");
}

#[test]
fn an_edited_line_with_its_hash_recomputed_breaks_the_next_line() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), DEFAULT_ROTATE_BYTES, 10);
    let f = &files(dir.path())[0];
    let mut l = lines(f);
    let cut = l[3].find(",\"hash\":").unwrap();
    let body = format!("{}}}", &l[3][..cut]).replace("\"i\":3", "\"i\":33");
    let prev: Value = serde_json::from_str(&l[2]).unwrap();
    let mut h = blake3::Hasher::new();
    h.update(prev["hash"].as_str().unwrap().as_bytes());
    h.update(body.as_bytes());
    l[3] = format!(
        "{},\"hash\":\"{}\"}}",
        &body[..body.len() - 1],
        h.finalize().to_hex()
    );
    put_lines(f, &l);
    let p = problem(dir.path());
    assert_eq!((p.kind, p.line), (ProblemKind::Removed, 5), "{p:?}");
}

#[test]
fn a_removed_line_is_named() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), DEFAULT_ROTATE_BYTES, 10);
    let f = &files(dir.path())[0];
    let mut l = lines(f);
    l.remove(4);
    put_lines(f, &l);
    let p = problem(dir.path());
    assert_eq!((p.kind, p.line), (ProblemKind::Removed, 5), "{p:?}");
    assert!(p.detail.contains("from 4 to 6"), "{}", p.detail);
}

#[test]
fn swapped_lines_are_named() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), DEFAULT_ROTATE_BYTES, 10);
    let f = &files(dir.path())[0];
    let mut l = lines(f);
    l.swap(2, 3);
    put_lines(f, &l);
    let p = problem(dir.path());
    assert_eq!((p.kind, p.line), (ProblemKind::Reordered, 3), "{p:?}");
    assert!(p.detail.contains("line 4"), "{}", p.detail);
}

#[test]
fn a_torn_tail_is_named() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), DEFAULT_ROTATE_BYTES, 10);
    let f = &files(dir.path())[0];
    let text = std::fs::read(f).unwrap();
    std::fs::write(f, &text[..text.len() - 20]).unwrap();
    let p = problem(dir.path());
    assert_eq!((p.kind, p.line), (ProblemKind::Torn, 10), "{p:?}");
}

#[test]
fn a_missing_middle_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), 600, 30);
    let f = files(dir.path());
    assert!(f.len() >= 4, "{f:?}");
    std::fs::remove_file(&f[1]).unwrap();
    let p = problem(dir.path());
    assert_eq!(p.kind, ProblemKind::MissingFile, "{p:?}");
    assert_eq!(p.file, "audit-000002.jsonl");
}

#[test]
fn a_file_emptied_in_the_middle_is_named() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), 600, 30);
    let f = files(dir.path());
    std::fs::write(&f[1], "").unwrap();
    let p = problem(dir.path());
    assert_eq!(
        (p.kind, p.file.as_str(), p.line),
        (ProblemKind::Removed, "audit-000003.jsonl", 1),
        "{p:?}"
    );
}

#[test]
fn rotation_continues_the_chain_across_files() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), 600, 30);
    let f = files(dir.path());
    assert!(f.len() >= 4, "{f:?}");
    for path in &f {
        assert!(std::fs::metadata(path).unwrap().len() <= 600, "{path:?}");
    }
    let last_of_first: Value = serde_json::from_str(lines(&f[0]).last().unwrap()).unwrap();
    let first_of_second: Value = serde_json::from_str(&lines(&f[1])[0]).unwrap();
    assert_eq!(first_of_second["prev"], last_of_first["hash"]);
    let v = verify(dir.path()).unwrap();
    assert_eq!((v.problem, v.lines, v.files), (None, 30, f.len()));
    // Archiving the oldest file away is not a break, but the report says the chain no
    // longer starts at the genesis.
    std::fs::remove_file(&f[0]).unwrap();
    let v = verify(dir.path()).unwrap();
    assert_eq!(v.problem, None);
    assert!(!v.from_genesis);
}

#[test]
fn a_reopened_log_resumes_the_chain() {
    let dir = tempfile::tempdir().unwrap();
    drop(write(dir.path(), DEFAULT_ROTATE_BYTES, 5));
    drop(write(dir.path(), DEFAULT_ROTATE_BYTES, 5));
    let v = verify(dir.path()).unwrap();
    assert_eq!((v.problem, v.lines, v.files), (None, 10, 1));
}

#[test]
fn after_a_torn_tail_the_writer_starts_a_new_file() {
    let dir = tempfile::tempdir().unwrap();
    drop(write(dir.path(), DEFAULT_ROTATE_BYTES, 3));
    let f = files(dir.path());
    let mut text = std::fs::read(&f[0]).unwrap();
    text.extend_from_slice(b"{\"seq\":4,\"at\":\"2026-");
    std::fs::write(&f[0], &text).unwrap();
    drop(write(dir.path(), DEFAULT_ROTATE_BYTES, 2));
    let f = files(dir.path());
    assert_eq!(f.len(), 2);
    // The new file goes on from the last whole line.
    let first: Value = serde_json::from_str(&lines(&f[1])[0]).unwrap();
    assert_eq!(first["seq"], 4);
    let p = problem(dir.path());
    assert_eq!(
        (p.kind, p.file.as_str(), p.line),
        (ProblemKind::Torn, "audit-000001.jsonl", 4)
    );
    // With the torn bytes cut off (the operator's repair), the rest verifies.
    std::fs::write(&f[0], &text[..text.len() - 20]).unwrap();
    assert_eq!(verify(dir.path()).unwrap().problem, None);
}

#[test]
fn concurrent_writers_keep_one_linear_chain() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(AuditLog::open(dir.path(), 20_000).unwrap());
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let log = log.clone();
            std::thread::spawn(move || {
                for i in 0..100 {
                    log.append(&event(t * 1000 + i)).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let v = verify(dir.path()).unwrap();
    assert_eq!(v.problem, None, "{v:?}");
    assert_eq!((v.lines, v.last_seq), (1600, Some(1600)));
    assert!(v.files > 1);
}

#[test]
fn two_logs_on_one_directory_share_the_chain() {
    // Two processes on one data dir: each log is a lock and a file of its own.
    let dir = tempfile::tempdir().unwrap();
    let a = Arc::new(AuditLog::open(dir.path(), 5_000).unwrap());
    let b = Arc::new(AuditLog::open(dir.path(), 5_000).unwrap());
    let threads: Vec<_> = [a, b]
        .into_iter()
        .map(|log| {
            std::thread::spawn(move || {
                for i in 0..300 {
                    log.append(&event(i)).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let v = verify(dir.path()).unwrap();
    assert_eq!(v.problem, None, "{v:?}");
    assert_eq!(v.lines, 600);
}

#[test]
fn reserved_fields_are_not_overwritten() {
    let e = Event::new("x", "ana").with("hash", "forged").with("seq", 9);
    assert!(e.fields.is_empty());
}

#[test]
fn arguments_are_kept_without_bodies_and_long_strings_are_cut() {
    let code = "x = 1\n".repeat(2000);
    let args = json!({
        "code": code,
        "path": "notes.md",
        "content": "the secret body",
        "nested": [{"body": "b"}],
    });
    let s = scrub(&args);
    assert_eq!(s["path"], "notes.md");
    assert_eq!(s["content"]["bytes"], 15);
    assert_eq!(
        s["content"]["blake3"],
        blake3::hash(b"the secret body").to_hex().as_str()
    );
    assert!(!s.to_string().contains("secret"));
    assert_eq!(s["nested"][0]["body"]["bytes"], 1);
    assert_eq!(s["code"]["bytes"], 12_000);
    assert_eq!(s["code"]["head"].as_str().unwrap().len(), 4096);
    // A cut never splits a character.
    let wide = "é".repeat(3000);
    let w = scrub(&Value::String(wide.clone()));
    assert!(w["head"].as_str().unwrap().len() <= 4096);
    assert!(wide.starts_with(w["head"].as_str().unwrap()));
}

#[test]
fn a_tool_call_keeps_refs_rows_and_path_and_no_row_values() {
    let read = "data_AAAAAAAAAAAAAAAAAAAAAA";
    let made = "data_BBBBBBBBBBBBBBBBBBBBBA";
    let sql = format!("SELECT region, SUM(x) FROM {read} GROUP BY 1");
    let args = json!({"sql": sql, "params": {"since": "2024-01-01"}});
    let result = json!({
        "dataRef": made,
        "rows": 4,
        "columns": [{"name": "region", "type": "Utf8"}],
        "sample": [["Zanzibar-Unique-Cell", 1.5]],
        "inputs": [{"dataRef": read}],
    });
    let e = tool_call_event(ToolCallRecord {
        principal: "ana",
        call_id: "7",
        tool: "run_sql",
        target: "run_sql",
        arguments: Arguments::Json(&args),
        expanded: None,
        outcome: "ok",
        result: Some(&result),
    });
    let line = super::line::fields_fragment(&e);
    assert!(!line.contains("Zanzibar"), "{line}");
    let f = &e.fields;
    assert_eq!(f["read"], json!([read]));
    assert_eq!(f["created"], json!([made]));
    assert_eq!(f["rows"], 4);
    assert_eq!(f["args"]["params"]["since"], "2024-01-01");
    assert_eq!(f.get("target"), None);
    assert_eq!(f.get("query"), None);

    let text = r#"{"since": "2024-01-01"}"#;
    let e = tool_call_event(ToolCallRecord {
        principal: "ana",
        call_id: "8",
        tool: "call_tool",
        target: "fetch_sales",
        arguments: Arguments::Text(text),
        expanded: None,
        outcome: "tool_failed",
        result: None,
    });
    assert_eq!(e.fields["target"], "fetch_sales");
    assert_eq!(e.fields["query"], "sales");
    assert_eq!(e.fields["args"]["since"], "2024-01-01");
    assert_eq!(e.fields.get("rows"), None);
}

#[test]
fn a_write_that_fails_is_counted_and_never_fails_the_caller() {
    // The only test of this binary that installs the process's log.
    let dir = tempfile::tempdir().unwrap();
    let trail = dir.path().join("trail");
    // Every line in a file of its own, so each append creates one.
    assert!(install(AuditLog::open(&trail, 1).unwrap()));
    assert!(
        !install(AuditLog::open(&trail, 1).unwrap()),
        "the first install wins"
    );
    record(event(0));
    assert!(flush(Duration::from_secs(10)));
    assert_eq!(verify(&trail).unwrap().lines, 1);
    let before = dropped();
    std::fs::remove_dir_all(&trail).unwrap();
    record(event(1));
    assert!(flush(Duration::from_secs(10)));
    assert_eq!(dropped(), before + 1);
    // Once the directory is back, the writer goes on from the seq it wrote last, after a
    // line that says seq 1 is gone: a trail removed under it is not a fresh start.
    std::fs::create_dir(&trail).unwrap();
    record(event(2));
    assert!(flush(Duration::from_secs(10)));
    let v = verify(&trail).unwrap();
    let p = v.problem.expect("the removed line is reported");
    assert_eq!((p.kind, p.line), (ProblemKind::Truncated, 1), "{p:?}");
    assert!(p.detail.contains("seq 1 to 1"), "{}", p.detail);
    assert_eq!(log_id().map(str::len), Some(32));

    // Start over in a directory of its own (the installed log writes where `trail` is).
    std::fs::remove_dir_all(&trail).unwrap();
    std::fs::create_dir(&trail).unwrap();
    record(event(3));
    assert!(flush(Duration::from_secs(10)));
    let first: Value = serde_json::from_str(&lines(&files(&trail)[0])[0]).unwrap();
    assert_eq!(first["event"], "trail_truncated");
    let base = first["seq"].as_u64().unwrap() + 1;

    // Many threads recording at once: one linear chain, in order of arrival.
    let threads: Vec<_> = (0..8)
        .map(|t| {
            std::thread::spawn(move || {
                for i in 0..50 {
                    record(event(t * 1000 + i));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(flush(Duration::from_secs(30)));
    let all: Vec<Value> = files(&trail)
        .iter()
        .flat_map(|f| lines(f))
        .map(|l| serde_json::from_str(&l).unwrap())
        .collect();
    let seqs: Vec<u64> = all.iter().map(|v| v["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (base - 1..=base + 400).collect::<Vec<_>>());

    // A writer stuck on the directory's lock (another process holding it, a slow disk)
    // never holds up `record`: the queue takes what it can, the rest is dropped and
    // counted.
    let lock = std::fs::File::open(trail.join("audit.lock")).unwrap();
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive).unwrap();
    let before = dropped();
    let sent = QUEUE + 500;
    let started = std::time::Instant::now();
    for i in 0..sent {
        record(event(i));
    }
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "record waited: {took:?}");
    let lost = dropped() - before;
    assert!((499..=500).contains(&lost), "{lost} dropped");
    assert!(!flush(Duration::from_millis(50)), "the writer is stuck");
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::Unlock).unwrap();
    assert!(flush(Duration::from_secs(120)));
    let v = verify(&trail).unwrap();
    assert_eq!(
        v.problem.as_ref().map(|p| p.kind),
        Some(ProblemKind::Truncated),
        "{v:?}"
    );
    // Every line queued was written, in one chain after the `trail_truncated` line.
    let kept = sent as u64 - lost;
    let all: Vec<String> = files(&trail).iter().flat_map(|f| lines(f)).collect();
    assert_eq!(all.len() as u64, 402 + kept);
    let last: Value = serde_json::from_str(all.last().unwrap()).unwrap();
    assert_eq!(last["seq"].as_u64(), Some(base + 400 + kept));
    let mut rest = all[1..].join("\n");
    rest.push('\n');
    let copy = tempfile::tempdir().unwrap();
    std::fs::write(copy.path().join(file_name(1)), rest).unwrap();
    assert_eq!(verify(copy.path()).unwrap().problem, None);
}

#[test]
fn the_trail_is_private_and_its_parents_are_made_as_usual() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    std::fs::create_dir(dir.path().join("usual")).unwrap();
    let log = write(&dir.path().join("home/audit"), DEFAULT_ROTATE_BYTES, 1);
    // The data dir made on the way stays reachable (the sandbox's user needs it).
    assert_eq!(
        mode(&dir.path().join("home")),
        mode(&dir.path().join("usual"))
    );
    assert_eq!(mode(log.dir()), 0o700);
    assert_eq!(mode(&files(log.dir())[0]), 0o600);
}

fn chain_end(dir: &Path) -> (u64, String) {
    let all: Vec<String> = files(dir).iter().flat_map(|f| lines(f)).collect();
    let v: Value = serde_json::from_str(all.last().unwrap()).unwrap();
    (
        v["seq"].as_u64().unwrap(),
        v["hash"].as_str().unwrap().to_owned(),
    )
}

#[test]
fn lines_cut_off_the_end_are_truncated_and_their_seqs_never_reissued() {
    let dir = tempfile::tempdir().unwrap();
    drop(write(dir.path(), DEFAULT_ROTATE_BYTES, 10));
    let f = &files(dir.path())[0];
    let mut l = lines(f);
    l.truncate(8);
    put_lines(f, &l);
    // The lines left chain whole, but the writer's head says seq 10.
    let p = problem(dir.path());
    assert_eq!(p.kind, ProblemKind::Truncated, "{p:?}");
    assert!(
        p.detail.contains("end at seq 8") && p.detail.contains("up to seq 10"),
        "{}",
        p.detail
    );
    assert_eq!(p.kind.as_str(), "truncated");

    // Writing again: seqs 9 and 10 are not issued again; a new file starts with a line
    // naming them, chained from the head (and handed on, for a copy kept elsewhere).
    let log = AuditLog::open(dir.path(), DEFAULT_ROTATE_BYTES).unwrap();
    let mut noted = Vec::new();
    let w = log.append_noting(&event(0), |n| noted.push(n)).unwrap();
    assert_eq!(
        noted.iter().map(|n| (n.seq, n.event)).collect::<Vec<_>>(),
        [(11, "trail_truncated")]
    );
    assert_eq!((w.seq, w.prev.as_str()), (12, noted[0].hash.as_str()));
    log.append(&event(1)).unwrap();
    drop(log);
    let f = files(dir.path());
    assert_eq!(f.len(), 2);
    let new = lines(&f[1]);
    let first: Value = serde_json::from_str(&new[0]).unwrap();
    assert_eq!(first["event"], "trail_truncated");
    assert_eq!(
        (
            first["seq"].as_u64(),
            first["missing_from"].as_u64(),
            first["missing_to"].as_u64()
        ),
        (Some(11), Some(9), Some(10))
    );
    let second: Value = serde_json::from_str(&new[1]).unwrap();
    assert_eq!(second["seq"], 12);
    assert_eq!(second["prev"], first["hash"]);
    let p = problem(dir.path());
    assert_eq!(
        (p.kind, p.file.as_str(), p.line),
        (ProblemKind::Truncated, "audit-000002.jsonl", 1),
        "{p:?}"
    );
    assert!(p.detail.contains("seq 9 to 10"), "{}", p.detail);
}

#[test]
fn a_deleted_newest_file_is_truncated() {
    let dir = tempfile::tempdir().unwrap();
    drop(write(dir.path(), 600, 30));
    let f = files(dir.path());
    let newest = f.last().unwrap();
    let gone = lines(newest).len() as u64;
    std::fs::remove_file(newest).unwrap();
    let p = problem(dir.path());
    assert_eq!(p.kind, ProblemKind::Truncated, "{p:?}");
    assert!(
        p.detail.contains(&format!("end at seq {}", 30 - gone)),
        "{}",
        p.detail
    );
    drop(write(dir.path(), 600, 1));
    let p = problem(dir.path());
    assert_eq!(p.kind, ProblemKind::Truncated, "{p:?}");
    assert!(
        p.detail.contains(&format!("seq {} to 30", 31 - gone)),
        "{}",
        p.detail
    );
}

#[test]
fn a_replaced_last_line_is_named() {
    let dir = tempfile::tempdir().unwrap();
    drop(write(dir.path(), DEFAULT_ROTATE_BYTES, 5));
    let f = &files(dir.path())[0];
    let mut l = lines(f);
    // The last line rewritten whole, its hash recomputed: the chain reads whole.
    let cut = l[4].find(",\"hash\":").unwrap();
    let body = format!("{}}}", &l[4][..cut]).replace("\"i\":4", "\"i\":44");
    let prev: Value = serde_json::from_str(&l[3]).unwrap();
    let hash = super::line::hash(prev["hash"].as_str().unwrap(), body.as_bytes());
    l[4] = format!("{},\"hash\":\"{hash}\"}}", &body[..body.len() - 1]);
    put_lines(f, &l);
    let p = problem(dir.path());
    assert_eq!((p.kind, p.line), (ProblemKind::Truncated, 5), "{p:?}");
}

#[test]
fn a_file_started_by_a_crashed_writer_is_not_forked() {
    let dir = tempfile::tempdir().unwrap();
    let log = write(dir.path(), DEFAULT_ROTATE_BYTES, 3);
    // Another process started file 2 and wrote a line to it, then died before it updated
    // the head: this log's head and file look untouched.
    let (seq, prev) = chain_end(dir.path());
    let e = event(99);
    let (text, _) = super::line::build(
        seq + 1,
        "2026-12-07T00:00:00.000Z",
        &e,
        &super::line::fields_fragment(&e),
        &prev,
    );
    std::fs::write(dir.path().join(file_name(2)), text).unwrap();
    log.append(&event(4)).unwrap();
    let v = verify(dir.path()).unwrap();
    assert_eq!(
        (&v.problem, v.lines, v.last_seq),
        (&None, 5, Some(5)),
        "{v:?}"
    );
}

#[test]
fn verify_waits_for_a_line_being_written() {
    let dir = tempfile::tempdir().unwrap();
    drop(write(dir.path(), DEFAULT_ROTATE_BYTES, 3));
    // A writer, holding the lock, half way through its line.
    let lock = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dir.path().join("audit.lock"))
        .unwrap();
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive).unwrap();
    let (seq, prev) = chain_end(dir.path());
    let e = event(3);
    let (text, hash) = super::line::build(
        seq + 1,
        "2026-12-07T00:00:00.000Z",
        &e,
        &super::line::fields_fragment(&e),
        &prev,
    );
    let f = files(dir.path())[0].clone();
    let mut file = std::fs::OpenOptions::new().append(true).open(&f).unwrap();
    use std::io::Write as _;
    let (a, b) = text.split_at(20);
    file.write_all(a.as_bytes()).unwrap();
    let path = dir.path().to_owned();
    let verifying = std::thread::spawn(move || verify(&path).unwrap());
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !verifying.is_finished(),
        "verify read while the lock was held"
    );
    file.write_all(b.as_bytes()).unwrap();
    use std::os::unix::fs::FileExt as _;
    lock.write_at(format!("{:020} {hash}", seq + 1).as_bytes(), 0)
        .unwrap();
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::Unlock).unwrap();
    let v = verifying.join().unwrap();
    assert_eq!((v.problem, v.lines), (None, 4));
    assert!(v.head_checked);
}

#[test]
fn secrets_are_redacted_bodies_hashed_and_big_arguments_digested() {
    let args = json!({
        "Password": "hunter2",
        "db_password": "hunter3",
        "API_KEY": "k",
        "apiKey": "k2",
        "Authorization": "Bearer abc",
        "credentials": {"user": "u", "pass": "p"},
        "token": 42,
        "max_tokens": 100,
        "rows": [[1, "Zanzibar"], [2, "Pemba"]],
        "values": {"a": "Unguja"},
        "records": "r",
        "sql": "SELECT 1",
    });
    let s = scrub(&args);
    let text = s.to_string();
    for gone in ["hunter", "Bearer", "Zanzibar", "Unguja", "\"u\""] {
        assert!(!text.contains(gone), "{gone} in {text}");
    }
    for k in [
        "Password",
        "db_password",
        "API_KEY",
        "apiKey",
        "Authorization",
        "credentials",
        "token",
    ] {
        assert_eq!(s[k], "[redacted]", "{k}");
    }
    assert_eq!(s["max_tokens"], 100);
    assert_eq!(s["sql"], "SELECT 1");
    let rows = r#"[[1,"Zanzibar"],[2,"Pemba"]]"#;
    assert_eq!(s["rows"]["bytes"], rows.len());
    assert_eq!(
        s["rows"]["blake3"],
        blake3::hash(rows.as_bytes()).to_hex().as_str()
    );
    assert_eq!(s["values"]["bytes"], r#"{"a":"Unguja"}"#.len());
    assert_eq!(s["records"]["bytes"], 1);

    // Many small strings, none cut, past 16 KiB together: only a length and a hash, the
    // same whatever order the keys came in.
    let mut big = serde_json::Map::new();
    for i in 0..100 {
        big.insert(format!("k{i:03}"), Value::String("x".repeat(1000)));
    }
    let s = scrub(&Value::Object(big.clone()));
    let o = s.as_object().unwrap();
    assert_eq!(
        o.keys().map(String::as_str).collect::<Vec<_>>(),
        ["bytes", "blake3", "over"]
    );
    assert!(s["bytes"].as_u64().unwrap() > 100_000);
    assert_eq!(s["over"], 16 << 10);
    let reversed: serde_json::Map<String, Value> = big.into_iter().rev().collect();
    assert_eq!(scrub(&Value::Object(reversed)), s);
    // Just under the cap is kept as it is.
    let small = json!({"a": "y".repeat(4000), "b": "z".repeat(4000)});
    assert_eq!(scrub(&small), small);
}

#[test]
fn a_call_tool_call_keeps_what_ran_and_its_argument_file() {
    let given = json!({"tool": "run_sql", "args_file": "q/sales.json", "overrides": {"limit": 5}});
    let read = "data_AAAAAAAAAAAAAAAAAAAAAA";
    let ran = json!({"sql": format!("SELECT * FROM {read}"), "limit": 5, "password": "pw"});
    let e = tool_call_event(ToolCallRecord {
        principal: "ana",
        call_id: "9",
        tool: "call_tool",
        target: "run_sql",
        arguments: Arguments::Json(&given),
        expanded: Some(&ran),
        outcome: "ok",
        result: None,
    });
    let f = &e.fields;
    assert_eq!(f["target"], "run_sql");
    assert_eq!(f["args_file"], "q/sales.json");
    assert_eq!(f["args"]["sql"], ran["sql"]);
    assert_eq!(f["args"]["limit"], 5);
    assert_eq!(f["args"]["password"], "[redacted]");
    assert_eq!(f["read"], json!([read]));
}

#[test]
fn refused_logins_collapse_per_address_and_their_paths_are_cut() {
    use super::events::{AuthCollapse, auth_failed_event};
    let mut c = AuthCollapse::default();
    let t0 = std::time::Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    assert_eq!(c.admit("10.0.0.1".into(), at(0)), Some(1));
    for s in 1..=59 {
        assert_eq!(c.admit("10.0.0.1".into(), at(s)), None);
    }
    // Another address has a window of its own.
    assert_eq!(c.admit("10.0.0.2".into(), at(30)), Some(1));
    // A minute on: one line for this one and the 59 not written.
    assert_eq!(c.admit("10.0.0.1".into(), at(60)), Some(60));
    assert_eq!(c.admit("10.0.0.1".into(), at(61)), None);
    assert_eq!(c.admit("10.0.0.1".into(), at(200)), Some(2));
    // Many addresses: past the limit, those whose window is over are let go, the refusals
    // not yet written handed back.
    for i in 0..5000 {
        c.admit(format!("h{i}"), at(300));
    }
    c.admit("10.0.0.1".into(), at(201));
    let stale = c.prune(at(400));
    assert!(
        stale.contains(&("10.0.0.1".to_owned(), 1)),
        "{}",
        stale.len()
    );
    assert_eq!(stale.len(), 1);
    assert!(c.prune(at(400)).is_empty());

    let long = format!("/mcp/{}", "é".repeat(40_000));
    let e = auth_failed_event("bad token", Some("10.0.0.1:5000"), "POST", &long, 7);
    let path = e.fields["path"].as_str().unwrap();
    assert!(path.len() <= 256 && path.len() > 250, "{}", path.len());
    assert!(long.starts_with(path));
    assert_eq!(e.fields["count"], 7);
}

#[test]
fn a_copy_is_checked_against_the_files() {
    let dir = tempfile::tempdir().unwrap();
    drop(write(dir.path(), 600, 20));
    let all: Vec<String> = files(dir.path()).iter().flat_map(|f| lines(f)).collect();
    let copy: Vec<(u64, String)> = (1..).zip(all.iter().cloned()).collect();
    let c = verify_copy(dir.path(), &copy).unwrap();
    assert_eq!((c.problem, c.lines, c.matched, c.gaps), (None, 20, 20, 0));
    // Lines dropped on the way to the copy are gaps, not a problem.
    let mut sparse = copy.clone();
    sparse.remove(5);
    let c = verify_copy(dir.path(), &sparse).unwrap();
    assert_eq!((c.problem, c.gaps), (None, 1));
    // A copied line changed.
    let mut edited = copy.clone();
    edited[3].1 = edited[3].1.replace("\"p0\"", "\"p9\"");
    let p = verify_copy(dir.path(), &edited).unwrap().problem.unwrap();
    assert_eq!((p.kind, p.line), (ProblemKind::Edited, 4));
    // The files cut at their end, their head gone too: the copy shows it.
    let newest = files(dir.path()).pop().unwrap();
    std::fs::remove_file(&newest).unwrap();
    std::fs::remove_file(dir.path().join("audit.lock")).unwrap();
    assert_eq!(verify(dir.path()).unwrap().problem, None);
    let p = verify_copy(dir.path(), &copy).unwrap().problem.unwrap();
    assert_eq!(p.kind, ProblemKind::Truncated, "{p:?}");
    // A line removed from the middle of the files' chain and the chain re-hashed is not
    // what the copy holds.
    let first = files(dir.path())[0].clone();
    let mut l = lines(&first);
    l[1] = l[1].replace("\"p1\"", "\"p7\"");
    put_lines(&first, &l);
    let p = verify_copy(dir.path(), &copy).unwrap().problem.unwrap();
    assert_eq!((p.kind, p.line), (ProblemKind::Edited, 2), "{p:?}");
}
