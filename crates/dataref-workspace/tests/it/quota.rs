//! The byte quota: every write through `AtomicFile` counts, a write that would go past it
//! fails before its bytes reach the disk, and the refusal names what to delete.

use std::io::Write;

use dataref_workspace::{Overwrite, Workspace, WorkspacePathError};

use crate::Fixture;

const KIB: usize = 1024;

fn quota_ws(f: &Fixture, bytes: u64) -> Workspace {
    Workspace::open(&f.root).unwrap().with_quota(bytes).unwrap()
}

/// Bytes of regular files under the root, temporary ones included.
fn on_disk(f: &Fixture) -> u64 {
    fn walk(dir: &std::path::Path) -> u64 {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| {
                let meta = e.path().symlink_metadata().unwrap();
                if meta.is_dir() {
                    walk(&e.path())
                } else {
                    meta.len()
                }
            })
            .sum()
    }
    walk(&f.root)
}

#[test]
fn a_stream_is_stopped_at_the_quota_not_after_it() {
    let f = Fixture::new();
    f.file("logs/old.txt", &"x".repeat(300 * KIB));
    let ws = quota_ws(&f, (1024 * KIB) as u64);
    // An attacker's writer: one chunk after another, as if it never meant to stop.
    let mut file = ws.create_atomic("big.bin", Overwrite::Refuse).unwrap();
    let chunk = vec![7u8; 64 * KIB];
    let mut written = 0usize;
    let err = loop {
        match file.write(&chunk) {
            Ok(n) => written += n,
            Err(e) => break e,
        }
        assert!(written <= 2048 * KIB, "the quota never stopped the writer");
    };
    // Everything that reached the disk fits the quota, the old file included.
    assert!(on_disk(&f) <= (1024 * KIB) as u64, "{}", on_disk(&f));
    assert_eq!(written, 704 * KIB);
    let err = WorkspacePathError::write_failed("big.bin", err);
    match &err {
        WorkspacePathError::QuotaExceeded {
            path,
            limit,
            largest,
            ..
        } => {
            assert_eq!(path, "big.bin");
            assert_eq!(*limit, (1024 * KIB) as u64);
            assert_eq!(largest[0], ("logs/".to_owned(), (300 * KIB) as u64));
        }
        other => panic!("{other:?}"),
    }
    assert!(err.is_caller_error());
    let hint = err.hint().unwrap();
    assert!(hint.contains("`logs/` (300 KiB)"), "{hint}");
    assert_eq!(
        err.to_string(),
        "writing `big.bin` would take your workspace over its quota of 1.0 MiB (1004 KiB in use)"
    );
    // Dropped without commit: the partial file goes, and its bytes with it.
    drop(file);
    assert_eq!(on_disk(&f), (300 * KIB) as u64);
    ws.write_atomic("small.txt", &vec![1; 700 * KIB], Overwrite::Refuse)
        .unwrap();
}

#[test]
fn every_writer_counts_and_replacing_gives_back_the_old_size() {
    let f = Fixture::new();
    let ws = quota_ws(&f, (1024 * KIB) as u64);
    ws.write_atomic("a.bin", &vec![0; 600 * KIB], Overwrite::Refuse)
        .unwrap();
    // A copy is a writer like any other.
    let a = ws.resolve("a.bin").unwrap();
    let err = ws.copy(&a, "b.bin", Overwrite::Refuse).unwrap_err();
    assert!(
        matches!(err, WorkspacePathError::QuotaExceeded { .. }),
        "{err:?}"
    );
    assert!(ws.resolve("b.bin").is_err(), "a refused copy left a file");
    // Replacing a file frees its bytes when the new one is in place.
    ws.write_atomic("a.bin", &vec![0; 900 * KIB], Overwrite::Replace)
        .unwrap();
    // A second workspace value of the same directory shares the count.
    let other = quota_ws(&f, (1024 * KIB) as u64);
    let err = other
        .write_atomic("c.bin", &vec![0; 200 * KIB], Overwrite::Refuse)
        .unwrap_err();
    assert!(
        matches!(err, WorkspacePathError::QuotaExceeded { .. }),
        "{err:?}"
    );
}

#[test]
fn files_deleted_behind_its_back_are_noticed_before_a_refusal() {
    let f = Fixture::new();
    let ws = quota_ws(&f, (1024 * KIB) as u64);
    ws.write_atomic("a.bin", &vec![0; 900 * KIB], Overwrite::Refuse)
        .unwrap();
    std::fs::remove_file(f.root.join("a.bin")).unwrap();
    ws.write_atomic("b.bin", &vec![0; 900 * KIB], Overwrite::Refuse)
        .unwrap();
}

#[test]
fn without_a_quota_nothing_is_counted() {
    let f = Fixture::new();
    let ws = Workspace::open(&f.root).unwrap();
    assert_eq!(ws.quota_bytes(), None);
    ws.write_atomic("a.bin", &vec![0; 2048 * KIB], Overwrite::Refuse)
        .unwrap();
}
