//! Workspace files through two replicas: each replica's local workspace directory kept equal
//! to the shared index and bucket.

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use dataref_protocol::{Principal, Timestamp};
use dataref_workspace::{Overwrite, Workspace, WorkspacePathError};

use crate::Services;

fn principal(name: &str) -> Principal {
    Principal::new(name).unwrap()
}

/// `who`'s workspace on the replica whose data dir is `home`, mirrored.
fn workspace(
    shared: &dataref_replica::Shared,
    home: &std::path::Path,
    who: &str,
    quota: u64,
) -> Workspace {
    Workspace::for_principal(home, &principal(who))
        .unwrap()
        .with_quota(quota)
        .unwrap()
        .with_mirror(Arc::new(shared.workspace_files(&principal(who), quota)))
}

fn read(ws: &Workspace, path: &str) -> String {
    let p = ws.resolve(path).unwrap();
    let mut text = String::new();
    ws.open_read(&p).unwrap().read_to_string(&mut text).unwrap();
    text
}

#[test]
fn a_file_written_on_one_replica_is_read_listed_and_replaced_on_the_other() {
    let s = Services::start();
    let config = s.config();
    let (home_a, home_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (sa, sb) = (
        s.replica(home_a.path(), &config),
        s.replica(home_b.path(), &config),
    );
    let a = workspace(&sa, home_a.path(), "alice", 1 << 20);
    let b = workspace(&sb, home_b.path(), "alice", 1 << 20);
    a.write_atomic(
        "exports/q3.csv",
        b"region,revenue\nEMEA,1\n",
        Overwrite::Refuse,
    )
    .unwrap();
    assert_eq!(read(&b, "exports/q3.csv"), "region,revenue\nEMEA,1\n");
    let listed = b.list_tree(&b.root_path(), &Default::default()).unwrap();
    assert!(
        listed
            .entries
            .iter()
            .any(|e| e.path.as_str() == "exports/q3.csv"),
        "{listed:?}"
    );
    // Refuse is decided by the shared index, whichever replica asks.
    let again = b
        .write_atomic("exports/q3.csv", b"other", Overwrite::Refuse)
        .unwrap_err();
    assert!(
        matches!(again, WorkspacePathError::AlreadyExists { .. }),
        "{again:?}"
    );
    b.write_atomic("exports/q3.csv", b"replaced on B", Overwrite::Replace)
        .unwrap();
    assert_eq!(read(&a, "exports/q3.csv"), "replaced on B");
    // Another principal sees none of it.
    let m = workspace(&sb, home_b.path(), "mallory", 1 << 20);
    assert!(matches!(
        m.resolve("exports/q3.csv"),
        Err(WorkspacePathError::NotFound { .. })
    ));
}

#[test]
fn the_workspace_quota_holds_across_replicas() {
    let s = Services::start();
    let config = s.config();
    let (home_a, home_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (sa, sb) = (
        s.replica(home_a.path(), &config),
        s.replica(home_b.path(), &config),
    );
    let a = workspace(&sa, home_a.path(), "bob", 10_000);
    let b = workspace(&sb, home_b.path(), "bob", 10_000);
    a.write_atomic("one.bin", &[1u8; 6_000], Overwrite::Refuse)
        .unwrap();
    // B's own directory holds nothing yet: only the shared count refuses this.
    let over = b
        .write_atomic("two.bin", &[2u8; 6_000], Overwrite::Refuse)
        .unwrap_err();
    assert!(
        matches!(over, WorkspacePathError::QuotaExceeded { .. }),
        "{over:?}"
    );
    // Replacing gives the old size back first.
    b.write_atomic("one.bin", &[3u8; 9_000], Overwrite::Replace)
        .unwrap();
}

#[test]
fn spill_files_are_swept_from_every_replica_and_old_versions_from_the_bucket() {
    let s = Services::start();
    let config = s.config();
    let (home_a, home_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (sa, sb) = (
        s.replica(home_a.path(), &config),
        s.replica(home_b.path(), &config),
    );
    let a = workspace(&sa, home_a.path(), "alice", 1 << 20);
    let b = workspace(&sb, home_b.path(), "alice", 1 << 20);
    a.write_atomic(".spill/describe-1.json", b"{}", Overwrite::Refuse)
        .unwrap();
    a.write_atomic("keep.txt", b"v1", Overwrite::Refuse)
        .unwrap();
    a.write_atomic("keep.txt", b"v2", Overwrite::Replace)
        .unwrap();
    assert_eq!(read(&b, ".spill/describe-1.json"), "{}");
    let later = Timestamp(Timestamp::now().0 + 10);
    // Both replicas sweep at once: the row goes once.
    let (ra, rb) = std::thread::scope(|scope| {
        let ha = scope.spawn(|| sa.sweep_files(".spill", later).unwrap());
        let hb = scope.spawn(|| sb.sweep_files(".spill", later).unwrap());
        (ha.join().unwrap(), hb.join().unwrap())
    });
    assert_eq!(ra + rb, 1);
    assert!(matches!(
        b.resolve(".spill/describe-1.json"),
        Err(WorkspacePathError::NotFound { .. })
    ));
    assert!(matches!(
        a.resolve(".spill/describe-1.json"),
        Err(WorkspacePathError::NotFound { .. })
    ));
    // v1 of keep.txt and the spill file's content are no row's any more.
    assert_eq!(sa.sweep_orphans(Duration::ZERO).unwrap(), 2);
    assert_eq!(read(&b, "keep.txt"), "v2");
}

#[test]
fn a_stopped_object_store_fails_a_write_cleanly_and_local_copies_still_read() {
    let mut s = Services::start();
    let config = s.config();
    let (home_a, home_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (sa, sb) = (
        s.replica(home_a.path(), &config),
        s.replica(home_b.path(), &config),
    );
    let a = workspace(&sa, home_a.path(), "alice", 1 << 20);
    let b = workspace(&sb, home_b.path(), "alice", 1 << 20);
    a.write_atomic("notes.md", b"kept", Overwrite::Refuse)
        .unwrap();
    assert_eq!(read(&b, "notes.md"), "kept");
    s.s3.stop().unwrap();
    let failed = a
        .write_atomic("new.md", b"lost?", Overwrite::Refuse)
        .unwrap_err();
    assert!(
        matches!(failed, WorkspacePathError::SharedUnavailable { .. }),
        "{failed:?}"
    );
    // B already has the file: the index alone says it is current.
    assert_eq!(read(&b, "notes.md"), "kept");
    s.s3.restart().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while a.write_atomic("new.md", b"now", Overwrite::Refuse).is_err() {
        assert!(std::time::Instant::now() < deadline, "no recovery");
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(read(&b, "new.md"), "now");
}
