//! A workspace shared through a `Mirror`: two "replicas" (two `Workspace`s on two
//! directories) over one in-memory mirror, a hostile index, planted links, a failing
//! store, and the map of which version each local copy holds.
//!
//! The mirror is the one thing made up here: the real one (PostgreSQL and object storage)
//! lives in another crate. This one keeps the contract written on the trait (Refuse decided
//! by the index, immutable versions, read after write) and can misbehave on request.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use dataref_protocol::Timestamp;
use dataref_workspace::{
    EntryKind, Mirror, MirrorError, OpenMethod, Overwrite, Remote, TEMP_PREFIX, TreeOptions,
    Workspace, WorkspacePathError as E,
};
use sha2::{Digest, Sha256};

use crate::{Fixture, SECRET, read_str};

type Hook = Box<dyn FnOnce() + Send>;

/// The shared side, in memory.
#[derive(Default)]
struct Memory {
    state: Mutex<State>,
    /// `fetch` calls, to tell a fetch from a local hit.
    fetches: AtomicUsize,
    /// Every call fails with `Unavailable`.
    down: AtomicBool,
    /// `fetch` writes half the content, then fails.
    fail_midway: AtomicBool,
    /// `list` calls, to tell a sync from none.
    lists: AtomicUsize,
    /// The next this many `fetch`es find the path replaced meanwhile (by its content with
    /// `+` appended, under a new version) and the version asked for swept: `NotFound`.
    replace_on_fetch: AtomicUsize,
    /// Paths whose `fetch` fails with `Unavailable` (one object the store cannot send).
    unfetchable: Mutex<HashSet<String>>,
    /// Bytes the shared workspace may hold.
    quota: Option<u64>,
    /// Run once by the next `list`, after its snapshot is taken (a commit racing a sync).
    during_list: Mutex<Option<Hook>>,
}

#[derive(Default)]
struct State {
    /// The index: path → row.
    files: BTreeMap<String, Remote>,
    /// Content by version; versions stay fetchable after they are replaced.
    contents: HashMap<String, Vec<u8>>,
    /// Rows `list` returns whatever it was asked (a hostile or broken index).
    stray: Vec<Remote>,
    next: u64,
}

impl std::fmt::Debug for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Memory")
    }
}

fn sha(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

impl Memory {
    fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn with_quota(quota: u64) -> Arc<Self> {
        Arc::new(Self {
            quota: Some(quota),
            ..Self::default()
        })
    }

    fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }

    fn lists(&self) -> usize {
        self.lists.load(Ordering::SeqCst)
    }

    /// The content of `path`'s current version is gone from the store; the row stays.
    fn lose_content(&self, path: &str) {
        let mut state = self.state.lock().unwrap();
        let version = state.files[path].version.clone();
        state.contents.remove(&version);
    }

    /// What `replace_on_fetch` does to `remote`'s path.
    fn replace_and_sweep(&self, remote: &Remote) {
        let mut state = self.state.lock().unwrap();
        if let Some(current) = state.files.get(&remote.path).cloned() {
            let mut content = state
                .contents
                .get(&current.version)
                .cloned()
                .unwrap_or_default();
            content.push(b'+');
            state.next += 1;
            let row = Remote {
                path: remote.path.clone(),
                version: format!("v{}", state.next),
                sha256: sha(&content),
                bytes: content.len() as u64,
                modified: Timestamp(1_600_000_000 + state.next as i64),
            };
            state.contents.remove(&current.version);
            state.contents.insert(row.version.clone(), content);
            state.files.insert(remote.path.clone(), row);
        }
        state.contents.remove(&remote.version);
    }

    fn unavailable(&self) -> Result<(), MirrorError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(MirrorError::Unavailable {
                detail: "connection refused (db.internal:5432)".into(),
            });
        }
        Ok(())
    }

    /// A row made by hand: `content` stored under a fresh version, listed as `path` with
    /// `sha256` and `bytes` as given (so they can lie).
    fn row(&self, path: &str, content: &[u8], sha256: [u8; 32], bytes: u64) -> Remote {
        let mut state = self.state.lock().unwrap();
        state.next += 1;
        let version = format!("v{}", state.next);
        state.contents.insert(version.clone(), content.to_vec());
        Remote {
            path: path.to_owned(),
            version,
            sha256,
            bytes,
            modified: Timestamp(1_600_000_000 + state.next as i64),
        }
    }

    /// Puts a row in the index directly, bypassing every check.
    fn inject(&self, path: &str, content: &[u8]) -> Remote {
        let row = self.row(path, content, sha(content), content.len() as u64);
        self.state
            .lock()
            .unwrap()
            .files
            .insert(path.to_owned(), row.clone());
        row
    }

    /// A row every `list` returns, whatever was asked.
    fn stray(&self, path: &str, content: &[u8]) {
        let row = self.row(path, content, sha(content), content.len() as u64);
        self.state.lock().unwrap().stray.push(row);
    }

    fn delete(&self, path: &str) {
        self.state.lock().unwrap().files.remove(path);
    }

    fn get(&self, path: &str) -> Option<Remote> {
        self.state.lock().unwrap().files.get(path).cloned()
    }

    fn set_modified(&self, path: &str, modified: Timestamp) {
        if let Some(row) = self.state.lock().unwrap().files.get_mut(path) {
            row.modified = modified;
        }
    }
}

impl Mirror for Memory {
    fn publish(
        &self,
        path: &str,
        file: &mut fs::File,
        bytes: u64,
        sha256: [u8; 32],
        overwrite: Overwrite,
    ) -> Result<Remote, MirrorError> {
        self.unavailable()?;
        let mut content = Vec::new();
        file.read_to_end(&mut content)?;
        assert_eq!(content.len() as u64, bytes, "publish got the wrong length");
        assert_eq!(sha(&content), sha256, "publish got the wrong hash");
        let mut state = self.state.lock().unwrap();
        let old = state.files.get(path).map(|r| r.bytes);
        if overwrite == Overwrite::Refuse && old.is_some() {
            return Err(MirrorError::AlreadyExists { path: path.into() });
        }
        if let Some(quota) = self.quota {
            let used: u64 = state.files.values().map(|r| r.bytes).sum();
            if used - old.unwrap_or(0) + bytes > quota {
                return Err(MirrorError::Quota { quota, used });
            }
        }
        state.next += 1;
        let row = Remote {
            path: path.into(),
            version: format!("v{}", state.next),
            sha256,
            bytes,
            modified: Timestamp(1_600_000_000 + state.next as i64),
        };
        state.contents.insert(row.version.clone(), content);
        state.files.insert(path.into(), row.clone());
        Ok(row)
    }

    fn list(&self, under: &str) -> Result<Vec<Remote>, MirrorError> {
        self.unavailable()?;
        self.lists.fetch_add(1, Ordering::SeqCst);
        let rows: Vec<Remote> = {
            let state = self.state.lock().unwrap();
            let prefix = format!("{under}/");
            state
                .files
                .values()
                .filter(|r| under.is_empty() || r.path == under || r.path.starts_with(&prefix))
                .chain(state.stray.iter())
                .cloned()
                .collect()
        };
        let hook = self.during_list.lock().unwrap().take();
        if let Some(hook) = hook {
            hook();
        }
        Ok(rows)
    }

    fn fetch(&self, remote: &Remote, sink: &mut dyn Write) -> Result<(), MirrorError> {
        self.unavailable()?;
        self.fetches.fetch_add(1, Ordering::SeqCst);
        if self.unfetchable.lock().unwrap().contains(&remote.path) {
            return Err(MirrorError::Unavailable {
                detail: "object storage timed out for this object".into(),
            });
        }
        let replaced =
            self.replace_on_fetch
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if replaced.is_ok() {
            self.replace_and_sweep(remote);
        }
        let content = self
            .state
            .lock()
            .unwrap()
            .contents
            .get(&remote.version)
            .cloned()
            .ok_or_else(|| MirrorError::NotFound {
                path: remote.path.clone(),
            })?;
        if self.fail_midway.load(Ordering::SeqCst) {
            sink.write_all(&content[..content.len() / 2])?;
            return Err(MirrorError::Unavailable {
                detail: "object storage reset the connection".into(),
            });
        }
        sink.write_all(&content)?;
        Ok(())
    }

    fn remove(&self, remote: &Remote) -> Result<bool, MirrorError> {
        self.unavailable()?;
        let mut state = self.state.lock().unwrap();
        if state
            .files
            .get(&remote.path)
            .is_some_and(|r| r.version == remote.version)
        {
            state.files.remove(&remote.path);
            return Ok(true);
        }
        Ok(false)
    }
}

/// One replica: its own directory, the shared mirror.
fn replica(fx: &Fixture, mirror: &Arc<Memory>) -> Workspace {
    Workspace::open(&fx.root)
        .unwrap()
        .with_open_method(OpenMethod::Auto)
        .with_mirror(mirror.clone())
}

/// Every temporary file beneath `dir`, not following links.
fn temp_files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        let kind = entry.file_type().unwrap();
        if name.starts_with(TEMP_PREFIX) {
            out.push(name);
        } else if kind.is_dir() {
            out.extend(temp_files(&entry.path()));
        }
    }
    out
}

/// Every path beneath `dir` (relative, sorted), not following links.
fn tree(dir: &Path) -> Vec<String> {
    fn visit(base: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let rel = entry
                .path()
                .strip_prefix(base)
                .unwrap()
                .display()
                .to_string();
            let kind = entry.file_type().unwrap();
            out.push(rel);
            if kind.is_dir() {
                visit(base, &entry.path(), out);
            }
        }
    }
    let mut out = Vec::new();
    visit(dir, dir, &mut out);
    out.sort();
    out
}

fn list_all(ws: &Workspace) -> Vec<(String, EntryKind)> {
    ws.list_tree(&ws.root_path(), &TreeOptions::default())
        .unwrap()
        .entries
        .into_iter()
        .map(|e| (e.path.as_str().to_owned(), e.kind))
        .collect()
}

// --- the attacker's tests first -------------------------------------------------------

#[test]
fn hostile_index_paths_are_skipped_and_nothing_is_written_outside() {
    let mirror = Memory::new();
    let fx = Fixture::new();
    let outside_abs = fx.outside("planted-by-index.txt");
    let long_name = "n".repeat(300);
    let hostile = [
        "../escape.txt".to_owned(),
        "../../escape.txt".to_owned(),
        "a/../../escape.txt".to_owned(),
        "deep/../x".to_owned(),
        outside_abs.display().to_string(),
        "/etc/dataref-must-not-exist".to_owned(),
        "x\0y".to_owned(),
        String::new(),
        ".".to_owned(),
        "./dot.txt".to_owned(),
        "double//slash.txt".to_owned(),
        "trailing/".to_owned(),
        ".dataref-tmp-evil".to_owned(),
        "d/.dataref-tmp-evil".to_owned(),
        long_name,
        "work-secret/x".to_owned(),
    ];
    for path in &hostile {
        mirror.inject(path, b"evil");
    }
    mirror.inject("ok.txt", b"fine");
    let ws = replica(&fx, &mirror);

    let listed = list_all(&ws);
    assert_eq!(
        listed,
        vec![
            ("ok.txt".to_owned(), EntryKind::File),
            ("work-secret".to_owned(), EntryKind::Directory),
            ("work-secret/x".to_owned(), EntryKind::File),
        ],
        "only the well-formed rows arrive, inside the root"
    );
    // `work-secret/x` is a fine name inside the workspace; the sibling of the same name
    // outside is untouched.
    assert_eq!(
        fs::read_to_string(fx.outside("work-secret/x")).unwrap(),
        SECRET
    );
    assert_eq!(
        fs::read_to_string(fx.outside("outside.txt")).unwrap(),
        SECRET
    );
    assert!(!fx.outside("escape.txt").exists());
    assert!(!fx.tmp.path().parent().unwrap().join("escape.txt").exists());
    assert!(!outside_abs.exists());
    assert!(!Path::new("/etc/dataref-must-not-exist").exists());
    assert_eq!(
        tree(&fx.root),
        vec!["ok.txt", "work-secret", "work-secret/x"]
    );
    assert!(temp_files(&fx.root).is_empty());
    assert_eq!(read_str(&ws, "ok.txt").unwrap(), "fine");
}

#[test]
fn rows_outside_the_synced_path_are_ignored() {
    let mirror = Memory::new();
    let fx = Fixture::new();
    mirror.inject("sub/in.txt", b"in");
    // Returned for every listing, including the listing of `sub`.
    mirror.stray("elsewhere/stray.txt", b"stray");
    mirror.stray("sub2/x.txt", b"prefix, not a parent");
    let ws = replica(&fx, &mirror);
    let sub = ws.resolve("sub").unwrap();
    let names: Vec<String> = ws
        .list_dir(&sub, 100)
        .unwrap()
        .entries
        .iter()
        .map(|e| e.path.as_str().to_owned())
        .collect();
    assert_eq!(names, ["sub/in.txt"]);
    assert_eq!(tree(&fx.root), vec!["sub", "sub/in.txt"]);
}

#[test]
fn a_link_planted_where_a_shared_file_goes_is_replaced_not_followed() {
    let mirror = Memory::new();
    let fx = Fixture::new();
    mirror.inject("report.csv", b"real report");
    mirror.inject("abs.csv", b"real abs");
    fx.link("report.csv", "../outside.txt");
    fx.link("abs.csv", fx.outside("outside.txt"));
    let ws = replica(&fx, &mirror);
    assert_eq!(read_str(&ws, "report.csv").unwrap(), "real report");
    assert_eq!(read_str(&ws, "abs.csv").unwrap(), "real abs");
    for name in ["report.csv", "abs.csv"] {
        let meta = fs::symlink_metadata(fx.root.join(name)).unwrap();
        assert!(meta.file_type().is_file(), "{name} is a regular file now");
    }
    assert_eq!(
        fs::read_to_string(fx.outside("outside.txt")).unwrap(),
        SECRET
    );
}

#[test]
fn a_link_in_a_parent_is_never_written_or_removed_through() {
    let mirror = Memory::new();
    let fx = Fixture::new();
    fs::write(fx.outside("work-secret/y"), SECRET).unwrap();
    fx.link("sub", "../work-secret")
        .dir("real")
        .link("inside", "real");
    // The index has files beneath both links' names.
    mirror.inject("sub/x", b"evil");
    mirror.inject("sub/new", b"evil");
    mirror.inject("inside/f", b"evil");
    mirror.inject("kept.txt", b"kept");
    let ws = replica(&fx, &mirror);

    // The whole tree is synced: each of those rows is skipped, the rest arrives.
    let listed = list_all(&ws);
    assert!(listed.contains(&("kept.txt".to_owned(), EntryKind::File)));
    assert!(listed.contains(&("sub".to_owned(), EntryKind::Symlink)));
    assert!(listed.contains(&("inside".to_owned(), EntryKind::Symlink)));
    assert_eq!(
        fs::read_to_string(fx.outside("work-secret/x")).unwrap(),
        SECRET
    );
    assert_eq!(
        fs::read_to_string(fx.outside("work-secret/y")).unwrap(),
        SECRET
    );
    assert!(!fx.outside("work-secret/new").exists());
    assert!(!fx.root.join("real/f").exists());

    // Syncing beneath the link directly: the removal walk does not enter it either.
    assert!(matches!(ws.resolve("sub/y"), Err(E::Escapes { .. })));
    assert_eq!(
        fs::read_to_string(fx.outside("work-secret/y")).unwrap(),
        SECRET
    );
    let inside = ws.resolve("inside").unwrap();
    assert!(ws.list_dir(&inside, 10).unwrap().entries.is_empty());
    assert!(temp_files(&fx.root).is_empty());
}

#[test]
fn a_directory_where_a_shared_file_goes() {
    let mirror = Memory::new();
    let fx = Fixture::new();
    // Stale: files the index no longer has beneath it. They go, and so does the then empty
    // directory, and the file takes its place.
    fx.file("stale/old.txt", "old").dir("stale/empty/deeper");
    mirror.inject("stale", b"now a file");
    // A directory holding a link (links are not the index's to remove): it stays, and the
    // row is skipped.
    fx.dir("busy").link("busy/l", "../../outside.txt");
    mirror.inject("busy", b"never placed");
    // A file where the index has a directory: removed (not in the index), then the file
    // beneath it arrives.
    fx.file("plain", "a file");
    mirror.inject("plain/child", b"child");
    let ws = replica(&fx, &mirror);

    let listed = list_all(&ws);
    assert!(listed.contains(&("stale".to_owned(), EntryKind::File)));
    assert!(listed.contains(&("busy".to_owned(), EntryKind::Directory)));
    assert!(listed.contains(&("busy/l".to_owned(), EntryKind::Symlink)));
    assert!(listed.contains(&("plain/child".to_owned(), EntryKind::File)));
    assert_eq!(read_str(&ws, "stale").unwrap(), "now a file");
    assert_eq!(read_str(&ws, "plain/child").unwrap(), "child");
    assert!(matches!(
        read_str(&ws, "busy"),
        Err(E::NotAFile {
            found: EntryKind::Directory,
            ..
        })
    ));
    assert_eq!(
        fs::read_to_string(fx.outside("outside.txt")).unwrap(),
        SECRET
    );
    assert!(temp_files(&fx.root).is_empty());
}

#[test]
fn content_that_does_not_match_the_index_is_never_put_in_place() {
    let fx = Fixture::new();
    for (content, sha256, bytes) in [
        // Wrong hash.
        (&b"tampered"[..], sha(b"original"), 8),
        // More bytes than the index says.
        (&b"longer than said"[..], sha(b"longer than said"), 4),
        // Fewer.
        (&b"short"[..], sha(b"short"), 50),
    ] {
        let mirror = Memory::new();
        let row = mirror.row("f.txt", content, sha256, bytes);
        mirror
            .state
            .lock()
            .unwrap()
            .files
            .insert("f.txt".into(), row);
        let ws = replica(&fx, &mirror);
        let err = ws.resolve("f.txt").unwrap_err();
        assert!(matches!(err, E::Io { .. }), "{err:?}");
        assert!(!err.is_caller_error());
        assert!(!fx.root.join("f.txt").exists());
        assert!(temp_files(&fx.root).is_empty());
    }
}

// --- two replicas -----------------------------------------------------------------------

#[test]
fn a_write_on_one_replica_is_read_on_the_other() {
    let mirror = Memory::new();
    let (fa, fb) = (Fixture::new(), Fixture::new());
    let (a, b) = (replica(&fa, &mirror), replica(&fb, &mirror));
    let written = a
        .write_atomic(
            "reports/q1.csv",
            b"region,total\nnorth,12\n",
            Overwrite::Refuse,
        )
        .unwrap();
    assert_eq!(written.as_str(), "reports/q1.csv");
    let row = mirror.get("reports/q1.csv").unwrap();
    assert_eq!(row.sha256, sha(b"region,total\nnorth,12\n"));

    let path = b.resolve("reports/q1.csv").unwrap();
    let mut text = String::new();
    b.open_read(&path)
        .unwrap()
        .read_to_string(&mut text)
        .unwrap();
    assert_eq!(text, "region,total\nnorth,12\n");
    assert_eq!(
        fs::read(fb.root.join("reports/q1.csv")).unwrap(),
        fs::read(fa.root.join("reports/q1.csv")).unwrap()
    );

    // Listings agree, down to the time (the publish's, on both replicas).
    let dir = b.resolve("reports").unwrap();
    let entries = b.list_dir(&dir, 10).unwrap().entries;
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].size, 22);
    assert_eq!(entries[0].modified, row.modified);
    let on_a = a.list_dir(&a.resolve("reports").unwrap(), 10).unwrap();
    assert_eq!(on_a.entries, entries);
    assert_eq!(b.metadata(&path).unwrap().modified, row.modified);
    assert_eq!(
        fs::metadata(fb.root.join("reports/q1.csv")).unwrap().mode() & 0o777,
        0o600
    );
    assert_eq!(
        list_all(&b),
        [
            ("reports".to_owned(), EntryKind::Directory),
            ("reports/q1.csv".to_owned(), EntryKind::File)
        ]
    );
}

#[test]
fn an_overwrite_on_one_replica_is_seen_on_the_other() {
    let mirror = Memory::new();
    let (fa, fb) = (Fixture::new(), Fixture::new());
    let (a, b) = (replica(&fa, &mirror), replica(&fb, &mirror));
    a.write_atomic("notes.txt", b"first", Overwrite::Refuse)
        .unwrap();
    assert_eq!(read_str(&b, "notes.txt").unwrap(), "first");
    b.write_atomic("notes.txt", b"second, longer", Overwrite::Replace)
        .unwrap();
    assert_eq!(read_str(&a, "notes.txt").unwrap(), "second, longer");
    // Same length, other content: still seen (versions, not sizes, decide).
    a.write_atomic("notes.txt", b"third, longer!", Overwrite::Replace)
        .unwrap();
    assert_eq!(read_str(&b, "notes.txt").unwrap(), "third, longer!");

    // A copy publishes too.
    let src = b.resolve("notes.txt").unwrap();
    b.copy(&src, "copies/notes.txt", Overwrite::Refuse).unwrap();
    assert_eq!(read_str(&a, "copies/notes.txt").unwrap(), "third, longer!");
}

#[test]
fn refuse_is_decided_by_the_shared_index() {
    let mirror = Memory::new();
    let (fa, fb) = (Fixture::new(), Fixture::new());
    let (a, b) = (replica(&fa, &mirror), replica(&fb, &mirror));
    a.write_atomic("exports/out.csv", b"from a", Overwrite::Refuse)
        .unwrap();
    // B has never seen the file: the early answer of `create_atomic` is the index's, and
    // it costs no download.
    let err = b
        .create_atomic("exports/out.csv", Overwrite::Refuse)
        .unwrap_err();
    assert!(matches!(err, E::AlreadyExists { .. }), "{err:?}");
    assert_eq!(mirror.fetches(), 0);
    // A directory in the index is not a free name either.
    let err = b.create_atomic("exports", Overwrite::Refuse).unwrap_err();
    assert!(
        matches!(
            err,
            E::NotAFile {
                found: EntryKind::Directory,
                ..
            }
        ),
        "{err:?}"
    );
    // A race: both start, A commits first, B's commit is refused by the index.
    let mut late = b
        .create_atomic("exports/race.csv", Overwrite::Refuse)
        .unwrap();
    late.write_all(b"from b").unwrap();
    a.write_atomic("exports/race.csv", b"from a", Overwrite::Refuse)
        .unwrap();
    let err = late.commit().unwrap_err();
    assert!(matches!(err, E::AlreadyExists { ref path } if path == "exports/race.csv"));
    assert!(!fb.root.join("exports/race.csv").exists());
    assert!(temp_files(&fb.root).is_empty());
    assert_eq!(read_str(&b, "exports/race.csv").unwrap(), "from a");

    // A stale local copy of a file the index no longer has does not block the name.
    fs::write(fb.root.join("exports/gone.csv"), "stale").unwrap();
    b.create_atomic("exports/gone.csv", Overwrite::Refuse)
        .unwrap();
}

#[test]
fn a_file_removed_from_the_shared_side_disappears_at_the_next_sync_of_its_parent() {
    let mirror = Memory::new();
    let (fa, fb) = (Fixture::new(), Fixture::new());
    let (a, b) = (replica(&fa, &mirror), replica(&fb, &mirror));
    a.write_atomic("d/one.txt", b"1", Overwrite::Refuse)
        .unwrap();
    a.write_atomic("d/two.txt", b"2", Overwrite::Refuse)
        .unwrap();
    a.write_atomic("other/three.txt", b"3", Overwrite::Refuse)
        .unwrap();
    assert_eq!(list_all(&b).len(), 5);
    // Written beside dataref, not in the index; and a write in flight.
    fs::write(fb.root.join("d/local-only.txt"), "x").unwrap();
    fs::write(fb.root.join(format!("d/{TEMP_PREFIX}inflight")), "x").unwrap();
    mirror.delete("d/one.txt");
    mirror.delete("other/three.txt");

    let d = b.resolve("d").unwrap();
    let names: Vec<String> = b
        .list_dir(&d, 10)
        .unwrap()
        .entries
        .iter()
        .map(|e| e.path.as_str().to_owned())
        .collect();
    assert_eq!(names, ["d/.dataref-tmp-inflight", "d/two.txt"]);
    assert!(!fb.root.join("d/one.txt").exists());
    assert!(!fb.root.join("d/local-only.txt").exists());
    // Only what was synced: `other/` is untouched until it is read or listed.
    assert!(fb.root.join("other/three.txt").exists());
    assert!(matches!(
        b.resolve("other/three.txt"),
        Err(E::NotFound { .. })
    ));
    assert!(!fb.root.join("other/three.txt").exists());
}

#[test]
fn a_failing_store_is_a_clear_error_and_nothing_changes_locally() {
    let mirror = Memory::new();
    let (fa, fb) = (Fixture::new(), Fixture::new());
    let (a, b) = (replica(&fa, &mirror), replica(&fb, &mirror));
    a.write_atomic("f.txt", b"v1", Overwrite::Refuse).unwrap();
    assert_eq!(read_str(&b, "f.txt").unwrap(), "v1");
    let before_a = tree(&fa.root);
    let before_b = tree(&fb.root);

    mirror.down.store(true, Ordering::SeqCst);
    let err = a
        .write_atomic("f.txt", b"v2", Overwrite::Replace)
        .unwrap_err();
    assert!(
        matches!(err, E::SharedUnavailable { ref path, op: "saved" } if path == "f.txt"),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "the shared workspace store is unavailable, so `f.txt` could not be saved; nothing \
         was changed"
    );
    assert!(err.is_transient());
    assert!(!err.is_caller_error());
    assert!(err.hint().unwrap().contains("try the same call again"));
    // The store's detail is for the logs only.
    assert!(!err.to_string().contains("5432"));
    assert_eq!(fs::read_to_string(fa.root.join("f.txt")).unwrap(), "v1");
    // New files too: nothing appears, no temporary file is left.
    assert!(
        a.write_atomic("new/g.txt", b"g", Overwrite::Replace)
            .is_err()
    );
    assert!(!fa.root.join("new/g.txt").exists());
    assert!(temp_files(&fa.root).is_empty());

    for result in [
        b.resolve("f.txt").map(drop),
        b.list_dir(&b.root_path(), 10).map(drop),
        b.list_tree(&b.root_path(), &TreeOptions::default())
            .map(drop),
        b.create_atomic("x.txt", Overwrite::Refuse).map(drop),
        b.remove_old_files(".spill", Timestamp(i64::MAX)).map(drop),
    ] {
        let err = result.unwrap_err();
        assert!(err.is_transient(), "{err:?}");
        assert!(
            err.to_string()
                .starts_with("the shared workspace store is unavailable")
        );
    }
    assert_eq!(
        tree(&fa.root).len(),
        before_a.len() + 1,
        "only the empty `new/`"
    );
    assert_eq!(tree(&fb.root), before_b);

    mirror.down.store(false, Ordering::SeqCst);
    a.write_atomic("f.txt", b"v2", Overwrite::Replace).unwrap();
    assert_eq!(read_str(&b, "f.txt").unwrap(), "v2");
}

#[test]
fn a_fetch_that_fails_midway_leaves_no_partial_file() {
    let mirror = Memory::new();
    let (fa, fb) = (Fixture::new(), Fixture::new());
    let (a, b) = (replica(&fa, &mirror), replica(&fb, &mirror));
    a.write_atomic("big.bin", &[7u8; 10_000], Overwrite::Refuse)
        .unwrap();
    a.write_atomic("old.txt", b"old", Overwrite::Refuse)
        .unwrap();
    assert_eq!(read_str(&b, "old.txt").unwrap(), "old");
    a.write_atomic("old.txt", b"new", Overwrite::Replace)
        .unwrap();

    mirror.fail_midway.store(true, Ordering::SeqCst);
    let err = b.resolve("big.bin").unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    assert!(!fb.root.join("big.bin").exists());
    let err = b.resolve("old.txt").unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    assert_eq!(fs::read_to_string(fb.root.join("old.txt")).unwrap(), "old");
    assert!(temp_files(&fb.root).is_empty());

    mirror.fail_midway.store(false, Ordering::SeqCst);
    assert_eq!(read_str(&b, "old.txt").unwrap(), "new");
}

#[test]
fn the_shared_quota_refuses_like_the_local_one() {
    let mirror = Memory::with_quota(10);
    let (fa, fb) = (Fixture::new(), Fixture::new());
    let (a, b) = (replica(&fa, &mirror), replica(&fb, &mirror));
    a.write_atomic("six.txt", b"123456", Overwrite::Refuse)
        .unwrap();
    // The other replica's local directory is empty; the shared quota still counts.
    let err = b
        .write_atomic("five.txt", b"12345", Overwrite::Refuse)
        .unwrap_err();
    match &err {
        E::QuotaExceeded {
            path, limit, used, ..
        } => {
            assert_eq!((path.as_str(), *limit, *used), ("five.txt", 10, 6));
        }
        other => panic!("expected QuotaExceeded, got {other:?}"),
    }
    assert!(err.is_caller_error());
    assert!(err.hint().unwrap().contains("free space first"));
    assert!(!fb.root.join("five.txt").exists());
    assert!(temp_files(&fb.root).is_empty());
    // Replacing counts the replaced file's bytes back.
    b.write_atomic("six.txt", b"1234567890", Overwrite::Replace)
        .unwrap();
}

#[test]
fn a_sync_from_a_listing_older_than_a_commit_does_not_undo_it() {
    let mirror = Memory::new();
    let fx = Fixture::new();
    let ws = Arc::new(replica(&fx, &mirror));
    ws.write_atomic("f.txt", b"v1", Overwrite::Refuse).unwrap();
    // While the sync below is between its listing and its fetches, this process commits
    // a new version of `f.txt` and a new file.
    let writer = Arc::clone(&ws);
    *mirror.during_list.lock().unwrap() = Some(Box::new(move || {
        writer
            .write_atomic("f.txt", b"v2", Overwrite::Replace)
            .unwrap();
        writer
            .write_atomic("new.txt", b"new", Overwrite::Refuse)
            .unwrap();
    }));
    // The listing says `f.txt` is v1 and has no `new.txt`.
    let listed = list_all(&ws);
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert_eq!(fs::read_to_string(fx.root.join("f.txt")).unwrap(), "v2");
    assert_eq!(fs::read_to_string(fx.root.join("new.txt")).unwrap(), "new");
    assert_eq!(read_str(&ws, "f.txt").unwrap(), "v2");
}

// --- versions that vanish, files that cannot be fetched ---------------------------------

#[test]
fn a_version_swept_between_the_listing_and_its_fetch_is_fetched_at_its_new_version() {
    let mirror = Memory::new();
    let (fa, fb) = (Fixture::new(), Fixture::new());
    let (a, b) = (replica(&fa, &mirror), replica(&fb, &mirror));
    a.write_atomic("f.txt", b"v1", Overwrite::Refuse).unwrap();
    assert_eq!(read_str(&b, "f.txt").unwrap(), "v1");
    a.write_atomic("f.txt", b"v2", Overwrite::Replace).unwrap();
    // B lists `f.txt` at v2; before B fetches it, v2 is replaced and swept.
    mirror.replace_on_fetch.store(1, Ordering::SeqCst);
    assert_eq!(
        read_str(&b, "f.txt").unwrap(),
        "v2+",
        "not v1, not NotFound"
    );
    assert_eq!(mirror.fetches(), 3, "v1, v2 (gone), v2+");
    assert_eq!(fs::read_to_string(fb.root.join("f.txt")).unwrap(), "v2+");

    // In a listing, for a file this replica never had, twice in a row.
    a.write_atomic("d/g.txt", b"g", Overwrite::Refuse).unwrap();
    mirror.replace_on_fetch.store(2, Ordering::SeqCst);
    let listed = list_all(&b);
    assert!(listed.contains(&("d/g.txt".to_owned(), EntryKind::File)));
    assert_eq!(fs::read_to_string(fb.root.join("d/g.txt")).unwrap(), "g++");
    assert_eq!(read_str(&b, "d/g.txt").unwrap(), "g++");
    assert!(temp_files(&fb.root).is_empty());
}

#[test]
fn a_version_that_cannot_be_had_is_never_served_from_an_older_copy() {
    let mirror = Memory::new();
    let (fa, fb) = (Fixture::new(), Fixture::new());
    let (a, b) = (replica(&fa, &mirror), replica(&fb, &mirror));
    a.write_atomic("f.txt", b"v1", Overwrite::Refuse).unwrap();
    a.write_atomic("kept.txt", b"kept", Overwrite::Refuse)
        .unwrap();
    assert_eq!(list_all(&b).len(), 2);
    assert_eq!(read_str(&b, "f.txt").unwrap(), "v1");
    a.write_atomic("f.txt", b"v2", Overwrite::Replace).unwrap();

    // Replaced and swept before every fetch: a few tries, then the stale copy goes and
    // the caller is told to try again (the file exists: not NotFound).
    mirror.replace_on_fetch.store(usize::MAX, Ordering::SeqCst);
    let fetched = mirror.fetches();
    let err = b.resolve("f.txt").unwrap_err();
    assert!(
        matches!(err, E::SharedChanging { ref path, op: "read" } if path == "f.txt"),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "`f.txt` could not be read: it kept changing in the shared workspace while it was \
         being fetched"
    );
    assert!(err.is_transient());
    assert!(!err.is_caller_error());
    assert!(err.hint().unwrap().contains("try the same call again"));
    assert_eq!(mirror.fetches(), fetched + 3, "bounded");
    assert!(!fb.root.join("f.txt").exists(), "the stale v1 is gone");
    assert!(temp_files(&fb.root).is_empty());

    // Once it holds still, it is read at its current version.
    mirror.replace_on_fetch.store(0, Ordering::SeqCst);
    assert_eq!(
        read_str(&b, "f.txt").unwrap(),
        "v2+++",
        "a `+` per replacement"
    );

    // The index names a version whose content the store lost (it will not come back by
    // listing again): one fetch, the stale copy goes, the same error; a listing of the
    // directory shows the rest.
    a.write_atomic("f.txt", b"v3", Overwrite::Replace).unwrap();
    mirror.lose_content("f.txt");
    let fetched = mirror.fetches();
    let err = b.resolve("f.txt").unwrap_err();
    assert!(matches!(err, E::SharedChanging { .. }), "{err:?}");
    assert_eq!(mirror.fetches(), fetched + 1);
    assert!(!fb.root.join("f.txt").exists());
    assert_eq!(
        list_all(&b),
        [("kept.txt".to_owned(), EntryKind::File)],
        "left out, not a failed listing"
    );
    assert!(!fb.root.join("f.txt").exists());

    // Removed from the index while it was being fetched: gone here too, and NotFound is
    // the truth now.
    a.write_atomic("r.txt", b"r1", Overwrite::Refuse).unwrap();
    assert_eq!(read_str(&b, "r.txt").unwrap(), "r1");
    a.write_atomic("r.txt", b"r2", Overwrite::Replace).unwrap();
    mirror.lose_content("r.txt");
    let row = mirror.get("r.txt").unwrap();
    *mirror.during_list.lock().unwrap() = Some(Box::new({
        let mirror = Arc::clone(&mirror);
        move || {
            assert!(mirror.remove(&row).unwrap());
        }
    }));
    let err = b.resolve("r.txt").unwrap_err();
    assert!(matches!(err, E::NotFound { .. }), "{err:?}");
    assert!(!fb.root.join("r.txt").exists());
}

#[test]
fn a_directory_with_a_file_that_cannot_be_fetched_still_lists_the_others() {
    let mirror = Memory::new();
    let (fa, fb) = (Fixture::new(), Fixture::new());
    let (a, b) = (replica(&fa, &mirror), replica(&fb, &mirror));
    a.write_atomic("d/one.txt", b"1", Overwrite::Refuse)
        .unwrap();
    a.write_atomic("d/two.txt", b"2", Overwrite::Refuse)
        .unwrap();
    a.write_atomic("d/sub/three.txt", b"3", Overwrite::Refuse)
        .unwrap();
    // Content that does not match its row, and a stale local copy of it.
    let bad = mirror.row("d/bad.csv", b"tampered", sha(b"original"), 8);
    mirror
        .state
        .lock()
        .unwrap()
        .files
        .insert("d/bad.csv".into(), bad);
    fb.file("d/bad.csv", "stale");

    let d = b.resolve("d").unwrap();
    let names = |listing: dataref_workspace::Listing| -> Vec<String> {
        listing
            .entries
            .iter()
            .map(|e| e.path.as_str().to_owned())
            .collect()
    };
    assert_eq!(
        names(b.list_dir(&d, 10).unwrap()),
        ["d/one.txt", "d/sub", "d/two.txt"]
    );
    assert_eq!(
        names(
            b.list_tree(&b.root_path(), &TreeOptions::default())
                .unwrap()
        ),
        ["d", "d/one.txt", "d/sub", "d/sub/three.txt", "d/two.txt"]
    );
    assert!(
        !fb.root.join("d/bad.csv").exists(),
        "the stale copy is gone"
    );
    // The file itself still says why.
    let err = b.resolve("d/bad.csv").unwrap_err();
    assert!(matches!(err, E::Io { .. }), "{err:?}");
    assert!(
        err.to_string().contains("does not match its index"),
        "{err}"
    );
    assert!(temp_files(&fb.root).is_empty());

    // One object the store cannot send: left out of the listing, its own read says the
    // store is unavailable.
    a.write_atomic("d/two.txt", b"2, again", Overwrite::Replace)
        .unwrap();
    mirror
        .unfetchable
        .lock()
        .unwrap()
        .insert("d/two.txt".into());
    let d = b.resolve("d").unwrap();
    assert_eq!(names(b.list_dir(&d, 10).unwrap()), ["d/one.txt", "d/sub"]);
    assert!(!fb.root.join("d/two.txt").exists(), "not the old `2`");
    let err = b.resolve("d/two.txt").unwrap_err();
    assert!(
        matches!(err, E::SharedUnavailable { ref path, op: "read" } if path == "d/two.txt"),
        "{err:?}"
    );
    mirror.unfetchable.lock().unwrap().clear();
    assert_eq!(read_str(&b, "d/two.txt").unwrap(), "2, again");

    // The store failing fetch after fetch is down, not one object: the listing fails as
    // it would have for the first (each try may cost a whole timeout).
    for i in 0..5 {
        a.write_atomic(&format!("e/{i}.txt"), b"e", Overwrite::Refuse)
            .unwrap();
    }
    mirror.fail_midway.store(true, Ordering::SeqCst);
    let fetched = mirror.fetches();
    let err = b
        .list_tree(&b.root_path(), &TreeOptions::default())
        .unwrap_err();
    assert!(
        matches!(err, E::SharedUnavailable { ref path, op: "listed" } if path == "."),
        "{err:?}"
    );
    // `d/bad.csv`, `e/0.txt` and `e/1.txt` left out; `e/2.txt` is one too many.
    assert_eq!(mirror.fetches(), fetched + 4);
    assert!(temp_files(&fb.root).is_empty());
    mirror.fail_midway.store(false, Ordering::SeqCst);
    assert_eq!(list_all(&b).len(), 11);
}

#[test]
fn a_listing_right_after_a_resolve_asks_the_index_once() {
    let mirror = Memory::new();
    let (fa, fb) = (Fixture::new(), Fixture::new());
    let (a, b) = (replica(&fa, &mirror), replica(&fb, &mirror));
    a.write_atomic("d/one.txt", b"1", Overwrite::Refuse)
        .unwrap();
    a.write_atomic("d/sub/two.txt", b"2", Overwrite::Refuse)
        .unwrap();

    let lists = mirror.lists();
    let root = b.resolve(".").unwrap();
    let tree = b.list_tree(&root, &TreeOptions::default()).unwrap();
    assert_eq!(mirror.lists(), lists + 1);
    assert_eq!(tree.entries.len(), 4);
    let d = b.resolve("d").unwrap();
    let listing = b.list_dir(&d, 10).unwrap();
    assert_eq!(mirror.lists(), lists + 2);
    assert_eq!(listing.entries.len(), 2);

    // The same listings as from a path nobody resolved (which syncs).
    assert_eq!(
        b.list_tree(&b.root_path(), &TreeOptions::default())
            .unwrap()
            .entries,
        tree.entries
    );
    assert_eq!(mirror.lists(), lists + 3);
    // A path another workspace resolved is synced by this one.
    assert_eq!(a.list_dir(&d, 10).unwrap().entries, listing.entries);
    assert_eq!(mirror.lists(), lists + 4);

    // A path kept past the moment is synced again, and sees what changed meanwhile.
    mirror.delete("d/one.txt");
    std::thread::sleep(std::time::Duration::from_millis(1_100));
    let names: Vec<String> = b
        .list_dir(&d, 10)
        .unwrap()
        .entries
        .iter()
        .map(|e| e.path.as_str().to_owned())
        .collect();
    assert_eq!(names, ["d/sub"]);
    assert_eq!(mirror.lists(), lists + 5);
}

// --- what each local copy is ----------------------------------------------------------

#[test]
fn an_unchanged_copy_is_not_fetched_again() {
    let mirror = Memory::new();
    let (fa, fb) = (Fixture::new(), Fixture::new());
    let (a, b) = (replica(&fa, &mirror), replica(&fb, &mirror));
    a.write_atomic("d/f.txt", b"content", Overwrite::Refuse)
        .unwrap();
    // The writer knows its own copy.
    assert_eq!(read_str(&a, "d/f.txt").unwrap(), "content");
    list_all(&a);
    assert_eq!(mirror.fetches(), 0);

    assert_eq!(read_str(&b, "d/f.txt").unwrap(), "content");
    assert_eq!(mirror.fetches(), 1);
    for _ in 0..3 {
        assert_eq!(read_str(&b, "d/f.txt").unwrap(), "content");
        list_all(&b);
        b.list_dir(&b.resolve("d").unwrap(), 10).unwrap();
    }
    assert_eq!(mirror.fetches(), 1);

    a.write_atomic("d/f.txt", b"changed", Overwrite::Replace)
        .unwrap();
    assert_eq!(read_str(&b, "d/f.txt").unwrap(), "changed");
    assert_eq!(mirror.fetches(), 2);

    // A change behind dataref's back (same size, same name, as an editor saves: a new
    // file renamed over) is noticed and undone.
    fs::write(fb.root.join("d/f.txt.new"), "CHANGED").unwrap();
    fs::rename(fb.root.join("d/f.txt.new"), fb.root.join("d/f.txt")).unwrap();
    assert_eq!(read_str(&b, "d/f.txt").unwrap(), "changed");
    assert_eq!(mirror.fetches(), 3);
}

#[test]
fn after_a_restart_copies_with_the_right_content_are_hashed_not_fetched() {
    let mirror = Memory::new();
    let fa = Fixture::new();
    let a = replica(&fa, &mirror);
    a.write_atomic("same.txt", b"same content", Overwrite::Refuse)
        .unwrap();
    a.write_atomic("d/same-size.txt", b"AAAA", Overwrite::Refuse)
        .unwrap();
    a.write_atomic("d/other-size.txt", b"short", Overwrite::Refuse)
        .unwrap();

    // A fresh replica whose directory already holds copies (the process-wide map cannot
    // know these inodes: as after a restart).
    let fc = Fixture::new();
    fc.file("same.txt", "same content")
        .file("d/same-size.txt", "BBBB")
        .file("d/other-size.txt", "longer than it was");
    let c = replica(&fc, &mirror);
    assert_eq!(read_str(&c, "same.txt").unwrap(), "same content");
    assert_eq!(mirror.fetches(), 0, "same content: hashed, not fetched");
    assert_eq!(read_str(&c, "d/same-size.txt").unwrap(), "AAAA");
    assert_eq!(read_str(&c, "d/other-size.txt").unwrap(), "short");
    assert_eq!(mirror.fetches(), 2);
    // Known from now on: nothing hashed or fetched again.
    list_all(&c);
    assert_eq!(mirror.fetches(), 2);
}

#[test]
fn old_files_are_swept_from_the_shared_index() {
    let mirror = Memory::new();
    let (fa, fb) = (Fixture::new(), Fixture::new());
    let (a, b) = (replica(&fa, &mirror), replica(&fb, &mirror));
    a.write_atomic(".spill/old.json", b"{}", Overwrite::Refuse)
        .unwrap();
    a.write_atomic(".spill/new.json", b"{}", Overwrite::Refuse)
        .unwrap();
    a.write_atomic(".spill/sub/old.json", b"{}", Overwrite::Refuse)
        .unwrap();
    mirror.set_modified(".spill/old.json", Timestamp(100));
    mirror.set_modified(".spill/sub/old.json", Timestamp(100));
    assert_eq!(list_all(&b).len(), 5);

    let swept = a.remove_old_files(".spill", Timestamp(1_000)).unwrap();
    assert_eq!((swept.removed, swept.bytes), (1, 2));
    assert!(mirror.get(".spill/old.json").is_none());
    assert!(mirror.get(".spill/sub/old.json").is_some());
    assert!(!fa.root.join(".spill/old.json").exists());
    // The other replica's copy goes at its next sync.
    assert!(matches!(
        b.resolve(".spill/old.json"),
        Err(E::NotFound { .. })
    ));
    assert!(!fb.root.join(".spill/old.json").exists());
    assert!(fb.root.join(".spill/new.json").exists());
}

#[test]
fn without_a_mirror_nothing_is_synced_and_with_one_the_index_is_the_truth() {
    // The same directory opened without a mirror: local files are the truth, as before.
    let mirror = Memory::new();
    let fx = Fixture::new();
    fx.file("local.txt", "local");
    let plain = Workspace::open(&fx.root).unwrap();
    assert_eq!(read_str(&plain, "local.txt").unwrap(), "local");
    plain
        .write_atomic("written.txt", b"w", Overwrite::Refuse)
        .unwrap();
    assert!(mirror.get("written.txt").is_none());
    // With the mirror (empty), both are gone: the index is the truth.
    let shared = replica(&fx, &mirror);
    assert!(list_all(&shared).is_empty());
    assert!(!fx.root.join("local.txt").exists());
}
