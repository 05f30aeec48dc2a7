//! The audit trail's copy in the shared index: every line a replica writes to its files is
//! in `dataref_audit` too, byte for byte, and the copy verifies as a chain of its own.

#![expect(
    clippy::disallowed_methods,
    reason = "the test reads the trail's files and writes the copy out, as an operator would"
)]

use std::time::{Duration, Instant};

use dataref_ops::audit::{AuditLog, Event, verify};

use crate::Services;

#[test]
fn each_line_is_copied_to_the_index_and_verifies_there() {
    let services = Services::start();
    let config = services.config();
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let mut trails = Vec::new();
    // Two replicas, each with its own trail, into one index.
    for (r, home) in dirs.iter().enumerate() {
        let shared = services.replica(home.path(), &config);
        let log = AuditLog::open(&home.path().join("audit"), 4096).unwrap();
        let forward = shared.audit_forward(log.id());
        for i in 0..40 {
            let e = Event::new("tool_call", format!("analyst{r}")).with("i", i);
            forward.forward(log.append(&e).unwrap());
        }
        trails.push((shared, log));
    }
    for (shared, log) in &trails {
        let deadline = Instant::now() + Duration::from_secs(30);
        let rows = loop {
            let rows = shared.audit_lines(log.id()).unwrap();
            if rows.len() >= 40 || Instant::now() > deadline {
                break rows;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_eq!(rows.len(), 40, "every line reached the index");
        let seqs: Vec<u64> = rows.iter().map(|(s, _)| *s).collect();
        assert_eq!(seqs, (1..=40).collect::<Vec<_>>());

        // Byte for byte the lines of the files, which rotated at 4 KiB.
        let mut files: Vec<_> = std::fs::read_dir(log.dir())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
            .collect();
        files.sort();
        assert!(files.len() > 1, "{files:?}");
        let on_disk: Vec<String> = files
            .iter()
            .flat_map(|f| {
                std::fs::read_to_string(f)
                    .unwrap()
                    .lines()
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .collect();
        let copied: Vec<String> = rows.into_iter().map(|(_, l)| l).collect();
        assert_eq!(copied, on_disk);

        // The copy, written out as one file, is a whole chain.
        let out = tempfile::tempdir().unwrap();
        std::fs::write(
            out.path().join("audit-000001.jsonl"),
            copied.join("\n") + "\n",
        )
        .unwrap();
        let v = verify(out.path()).unwrap();
        assert_eq!((v.problem, v.lines), (None, 40));
    }
    assert_ne!(trails[0].1.id(), trails[1].1.id());
}

#[test]
fn the_copy_drains_at_flush_and_a_conflicting_line_is_counted() {
    let services = Services::start();
    let config = services.config();
    let home = tempfile::tempdir().unwrap();
    let shared = services.replica(home.path(), &config);
    let log = AuditLog::open(&home.path().join("audit"), 1 << 20).unwrap();
    let forward = shared.audit_forward(log.id());
    let mut written = Vec::new();
    for i in 0..200 {
        let w = log
            .append(&Event::new("tool_call", "ana").with("i", i))
            .unwrap();
        written.push(w.clone());
        forward.forward(w);
    }
    // Flushed: every line is in the index, with no waiting after.
    assert!(forward.flush(Duration::from_secs(30)));
    assert_eq!(shared.audit_lines(log.id()).unwrap().len(), 200);

    // The same line again is no conflict; another line under a seq the index holds is.
    let before = shared.audit_conflicts();
    forward.forward(written[0].clone());
    assert!(forward.flush(Duration::from_secs(30)));
    assert_eq!(shared.audit_conflicts(), before);
    let other_dir = tempfile::tempdir().unwrap();
    let other = AuditLog::open(other_dir.path(), 1 << 20).unwrap();
    let forged = other.append(&Event::new("tool_call", "mallory")).unwrap();
    assert_eq!(forged.seq, 1);
    assert_ne!(forged.hash, written[0].hash);
    forward.forward(forged);
    assert!(forward.flush(Duration::from_secs(30)));
    assert_eq!(shared.audit_conflicts(), before + 1);
    // The index keeps the line it had.
    let rows = shared.audit_lines(log.id()).unwrap();
    assert_eq!(rows[0].1, written[0].line);
}
