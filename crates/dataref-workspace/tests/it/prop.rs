//! Random paths over a tree with links in and out: whatever is accepted opens something
//! inside the root, and both open methods agree.

use std::collections::HashSet;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use dataref_workspace::{OpenMethod, WorkspacePathError as E};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use crate::Fixture;

/// ```text
/// work/a                      outside_dir/secret_file
/// work/b/a                    outside_dir/secret_dir/secret_file
/// work/b/b/a
/// work/b/up -> ..             (inside: the root)
/// work/b/esc -> ../..         (outside)
/// work/link_in -> b
/// work/link_out -> ../outside_dir
/// work/abs -> <absolute path of outside_dir>
/// work/loop -> loop
/// ```
fn tree() -> Fixture {
    let fx = Fixture::new();
    fx.file("a", "a")
        .file("b/a", "ba")
        .file("b/b/a", "bba")
        .link("b/up", "..")
        .link("b/esc", "../..")
        .link("link_in", "b")
        .link("link_out", "../outside_dir")
        .link("abs", fx.outside("outside_dir"))
        .link("loop", "loop");
    fs::create_dir_all(fx.outside("outside_dir/secret_dir")).unwrap();
    fs::write(fx.outside("outside_dir/secret_file"), "out").unwrap();
    fs::write(fx.outside("outside_dir/secret_dir/secret_file"), "out").unwrap();
    fx
}

/// (dev, inode) of the root and everything beneath it, links not followed.
fn inside_ids(root: &Path) -> HashSet<(u64, u64)> {
    fn visit(path: &Path, ids: &mut HashSet<(u64, u64)>) {
        let meta = fs::symlink_metadata(path).unwrap();
        if meta.file_type().is_symlink() {
            return;
        }
        ids.insert((meta.dev(), meta.ino()));
        if meta.is_dir() {
            for entry in fs::read_dir(path).unwrap() {
                visit(&entry.unwrap().path(), ids);
            }
        }
    }
    let mut ids = HashSet::new();
    visit(root, &mut ids);
    ids
}

fn paths() -> impl Strategy<Value = String> {
    // Names that lead somewhere inside come several times, so that a fair share of paths
    // open a file and the property is about more than refusals.
    let common = ["a", "b", "link_in", "up", "."];
    let rare = [
        "..",
        "link_out",
        "esc",
        "abs",
        "loop",
        "secret_file",
        "secret_dir",
        "outside_dir",
        "work-secret",
        // An empty part makes `//`, or a leading `/` (absolute).
        "",
    ];
    let parts: Vec<String> = common
        .iter()
        .cycle()
        .take(common.len() * 4)
        .chain(rare.iter())
        .map(|s| (*s).to_owned())
        .chain(std::iter::once("x".repeat(256)))
        .collect();
    let last = prop::sample::select(vec!["a", "a", "secret_file", ""]);
    (
        prop::collection::vec(prop::sample::select(parts), 0..6),
        last,
    )
        .prop_map(|(mut parts, last)| {
            parts.push(last.to_owned());
            parts.join("/")
        })
}

/// What one open method made of a path: the (dev, inode) read, or the error's name.
fn outcome(
    fx: &Fixture,
    method: OpenMethod,
    requested: &str,
    inside: &HashSet<(u64, u64)>,
) -> Result<Option<(u64, u64)>, String> {
    let ws = fx.ws(method);
    let path = ws.resolve(requested).map_err(|e| format!("{e:?}"))?;
    let normal = path.as_str();
    assert!(!normal.starts_with('/'), "{requested:?} gave {normal:?}");
    assert!(
        !normal.split('/').any(|c| c == ".."),
        "{requested:?} gave {normal:?}"
    );
    assert!(
        !requested.starts_with('/') && !requested.split('/').any(|c| c == ".."),
        "{requested:?} was accepted"
    );

    if let Ok(listing) = ws.list_dir(&path, 100) {
        for entry in &listing.entries {
            assert!(
                !entry.path.as_str().contains("secret"),
                "{requested:?} listed {:?} by {method:?}",
                entry.path
            );
        }
    }
    if let Ok(meta) = ws.metadata(&path) {
        assert_ne!(meta.kind, dataref_workspace::EntryKind::Symlink);
    }
    match ws.open_read(&path) {
        Ok(file) => {
            let meta = file.metadata().unwrap();
            let id = (meta.dev(), meta.ino());
            assert!(
                inside.contains(&id),
                "{requested:?} opened an outside file by {method:?}"
            );
            Ok(Some(id))
        }
        Err(E::NotAFile { .. }) => Ok(None),
        Err(e) => Err(format!("{e:?}")),
    }
}

#[test]
fn no_accepted_path_opens_anything_outside() {
    let fx = tree();
    let inside = inside_ids(&fx.root);
    let mut runner = TestRunner::new(Config {
        cases: 1_000,
        failure_persistence: None,
        ..Config::default()
    });
    let (files, dirs) = (std::cell::Cell::new(0usize), std::cell::Cell::new(0usize));
    runner
        .run(&paths(), |requested| {
            let by_openat2 = outcome(&fx, OpenMethod::Openat2, &requested, &inside);
            let by_walk = outcome(&fx, OpenMethod::NoFollowWalk, &requested, &inside);
            prop_assert_eq!(&by_openat2, &by_walk, "methods disagree on {:?}", requested);
            match by_openat2 {
                Ok(Some(_)) => files.set(files.get() + 1),
                Ok(None) => dirs.set(dirs.get() + 1),
                Err(_) => {}
            }
            Ok(())
        })
        .unwrap();
    // The property means little if nothing was ever opened.
    let (files, dirs) = (files.get(), dirs.get());
    assert!(
        files > 100 && dirs > 20,
        "only {files} files and {dirs} directories were opened"
    );
}
