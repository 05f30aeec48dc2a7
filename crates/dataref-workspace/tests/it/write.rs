//! Atomic writes and copies.

use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;

use dataref_workspace::{EntryKind, OpenMethod, Overwrite, TEMP_PREFIX, WorkspacePathError as E};

use crate::{Fixture, SECRET, read_str};

fn temp_files(fx: &Fixture, dir: &str) -> Vec<String> {
    fs::read_dir(fx.root.join(dir))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with(TEMP_PREFIX))
        .collect()
}

#[test]
fn content_appears_whole_on_commit() {
    let fx = Fixture::new();
    fx.file("out.csv", "old");
    let ws = fx.ws(OpenMethod::Auto);
    let mut file = ws.create_atomic("out.csv", Overwrite::Replace).unwrap();
    assert_eq!(file.path().as_str(), "out.csv");
    file.write_all(b"new, ").unwrap();
    // Until the commit, readers see the old file whole.
    assert_eq!(read_str(&ws, "out.csv").unwrap(), "old");
    file.write_all(b"all of it").unwrap();
    assert_eq!(temp_files(&fx, "").len(), 1);
    let path = file.commit().unwrap();
    assert_eq!(path.as_str(), "out.csv");
    assert_eq!(read_str(&ws, "out.csv").unwrap(), "new, all of it");
    assert!(temp_files(&fx, "").is_empty());
    assert_eq!(
        fs::metadata(fx.root.join("out.csv")).unwrap().mode() & 0o777,
        0o600
    );
}

#[test]
fn dropping_without_commit_removes_the_temporary_file() {
    let fx = Fixture::new();
    let ws = fx.ws(OpenMethod::Auto);
    {
        let mut file = ws.create_atomic("d/never.txt", Overwrite::Refuse).unwrap();
        file.write_all(b"half").unwrap();
        assert_eq!(temp_files(&fx, "d").len(), 1);
    }
    assert!(temp_files(&fx, "d").is_empty());
    assert!(!fx.root.join("d/never.txt").exists());
}

#[test]
fn parent_directories_are_created() {
    let fx = Fixture::new();
    fx.dir("x");
    let ws = fx.ws(OpenMethod::Auto);
    let path = ws
        .write_atomic("./x/y//z/out.txt", b"deep", Overwrite::Refuse)
        .unwrap();
    assert_eq!(path.as_str(), "x/y/z/out.txt");
    assert_eq!(read_str(&ws, "x/y/z/out.txt").unwrap(), "deep");
    assert_eq!(
        fs::metadata(fx.root.join("x/y")).unwrap().mode() & 0o777,
        0o700
    );
}

#[test]
fn symlinked_parent_component_is_refused() {
    let fx = Fixture::new();
    fx.dir("real")
        .link("inside_link", "real")
        .link("outside_link", "..");
    let ws = fx.ws(OpenMethod::Auto);
    for (requested, link) in [
        ("inside_link/f.txt", "inside_link"),
        ("outside_link/planted.txt", "outside_link"),
        ("outside_link/new_dir/planted.txt", "outside_link"),
    ] {
        let err = ws
            .write_atomic(requested, b"x", Overwrite::Replace)
            .unwrap_err();
        assert!(
            matches!(&err, E::LinkInWritePath { link: l, .. } if l == link),
            "{requested}: {err:?}"
        );
        assert!(err.hint().is_some());
    }
    assert!(!fx.outside("planted.txt").exists());
    assert!(!fx.outside("new_dir").exists());
    assert!(fs::read_dir(fx.root.join("real")).unwrap().next().is_none());
}

#[test]
fn file_used_as_a_parent_is_refused() {
    let fx = Fixture::new();
    fx.file("f", "x");
    let ws = fx.ws(OpenMethod::Auto);
    let err = ws
        .write_atomic("f/g", b"x", Overwrite::Replace)
        .unwrap_err();
    assert!(matches!(err, E::NotADirectory { .. }), "{err:?}");
}

#[test]
fn overwrite_is_refused_unless_asked() {
    let fx = Fixture::new();
    fx.file("keep.txt", "original");
    let ws = fx.ws(OpenMethod::Auto);
    let err = ws
        .write_atomic("keep.txt", b"new", Overwrite::Refuse)
        .unwrap_err();
    assert!(matches!(err, E::AlreadyExists { .. }), "{err:?}");
    assert_eq!(read_str(&ws, "keep.txt").unwrap(), "original");

    // Another writer got there between `create_atomic` and `commit`: the rename refuses.
    let mut late = ws.create_atomic("race.txt", Overwrite::Refuse).unwrap();
    late.write_all(b"late").unwrap();
    ws.write_atomic("race.txt", b"first", Overwrite::Refuse)
        .unwrap();
    assert!(matches!(late.commit(), Err(E::AlreadyExists { .. })));
    assert_eq!(read_str(&ws, "race.txt").unwrap(), "first");
    assert!(temp_files(&fx, "").is_empty());

    ws.write_atomic("keep.txt", b"new", Overwrite::Replace)
        .unwrap();
    assert_eq!(read_str(&ws, "keep.txt").unwrap(), "new");
}

#[test]
fn writes_never_replace_directories_or_the_root() {
    let fx = Fixture::new();
    fx.dir("d");
    let ws = fx.ws(OpenMethod::Auto);
    for requested in ["d", "", "."] {
        let err = ws
            .write_atomic(requested, b"x", Overwrite::Replace)
            .unwrap_err();
        assert!(
            matches!(
                err,
                E::NotAFile {
                    found: EntryKind::Directory,
                    ..
                }
            ),
            "{requested:?}: {err:?}"
        );
    }
    assert!(matches!(
        ws.write_atomic("/tmp/x", b"x", Overwrite::Replace),
        Err(E::Absolute { .. })
    ));
    assert!(matches!(
        ws.write_atomic("d/../x", b"x", Overwrite::Replace),
        Err(E::ParentComponent { .. })
    ));
}

#[test]
fn replacing_a_final_link_replaces_the_link_not_its_target() {
    let fx = Fixture::new();
    fx.link("out", "../outside.txt");
    let ws = fx.ws(OpenMethod::Auto);
    let err = ws.write_atomic("out", b"x", Overwrite::Refuse).unwrap_err();
    assert!(matches!(err, E::AlreadyExists { .. }), "{err:?}");
    ws.write_atomic("out", b"mine", Overwrite::Replace).unwrap();
    assert_eq!(
        fs::read_to_string(fx.outside("outside.txt")).unwrap(),
        SECRET
    );
    assert!(fs::symlink_metadata(fx.root.join("out")).unwrap().is_file());
    assert_eq!(read_str(&ws, "out").unwrap(), "mine");
}

#[test]
fn copy_is_atomic_and_careful() {
    let fx = Fixture::new();
    fx.file("src.csv", "a,b\n1,2\n")
        .file("taken.csv", "taken")
        .dir("dir");
    fs::hard_link(fx.outside("outside.txt"), fx.root.join("hl")).unwrap();
    let ws = fx.ws(OpenMethod::Auto);
    let src = ws.resolve("src.csv").unwrap();

    let dst = ws.copy(&src, "copies/dst.csv", Overwrite::Refuse).unwrap();
    assert_eq!(dst.as_str(), "copies/dst.csv");
    assert_eq!(read_str(&ws, "copies/dst.csv").unwrap(), "a,b\n1,2\n");

    assert!(matches!(
        ws.copy(&src, "taken.csv", Overwrite::Refuse),
        Err(E::AlreadyExists { .. })
    ));
    assert_eq!(read_str(&ws, "taken.csv").unwrap(), "taken");
    ws.copy(&src, "taken.csv", Overwrite::Replace).unwrap();
    assert_eq!(read_str(&ws, "taken.csv").unwrap(), "a,b\n1,2\n");

    let hl = ws.resolve("hl").unwrap();
    assert!(matches!(
        ws.copy(&hl, "stolen", Overwrite::Refuse),
        Err(E::HardLinked { .. })
    ));
    let dir = ws.resolve("dir").unwrap();
    assert!(matches!(
        ws.copy(&dir, "d2", Overwrite::Refuse),
        Err(E::NotAFile { .. })
    ));
    assert!(!fx.root.join("stolen").exists() && !fx.root.join("d2").exists());
    assert!(temp_files(&fx, "").is_empty());
}
