//! Listings: one directory and a tree with a glob, their bounds, and links never entered.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;

use dataref_workspace::{EntryKind, Glob, TreeOptions};

use crate::{Fixture, METHODS};

fn paths(listing: &dataref_workspace::Listing) -> Vec<&str> {
    listing.entries.iter().map(|e| e.path.as_str()).collect()
}

#[test]
fn list_dir_is_sorted_with_kinds_and_sizes() {
    let fx = Fixture::new();
    fx.file("b.csv", "12345")
        .file("a.txt", "1")
        .dir("sub")
        .file("sub/inner", "x")
        .link("link", "../outside.txt");
    for method in METHODS {
        let ws = fx.ws(method);
        let listing = ws.list_dir(&ws.root_path(), 100).unwrap();
        assert_eq!(paths(&listing), ["a.txt", "b.csv", "link", "sub"]);
        let kinds: Vec<_> = listing.entries.iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            [
                EntryKind::File,
                EntryKind::File,
                EntryKind::Symlink,
                EntryKind::Directory
            ]
        );
        assert_eq!(listing.entries[1].size, 5);
        assert!(!listing.truncated);

        let sub = ws.list_dir(&ws.resolve("sub").unwrap(), 100).unwrap();
        assert_eq!(paths(&sub), ["sub/inner"]);
    }
}

#[test]
fn list_dir_says_when_it_is_cut() {
    let fx = Fixture::new();
    for i in 0..10 {
        fx.file(&format!("f{i}"), "x");
    }
    let ws = fx.ws(dataref_workspace::OpenMethod::Auto);
    let listing = ws.list_dir(&ws.root_path(), 3).unwrap();
    assert_eq!(paths(&listing), ["f0", "f1", "f2"]);
    assert!(listing.truncated);
    let listing = ws.list_dir(&ws.root_path(), 10).unwrap();
    assert_eq!(listing.entries.len(), 10);
    assert!(!listing.truncated);
}

#[test]
fn names_that_are_not_utf8_are_counted_not_listed() {
    let fx = Fixture::new();
    fx.file("ok", "x");
    fs::write(fx.root.join(OsStr::from_bytes(b"caf\xe9")), "x").unwrap();
    let ws = fx.ws(dataref_workspace::OpenMethod::Auto);
    let listing = ws.list_dir(&ws.root_path(), 10).unwrap();
    assert_eq!(paths(&listing), ["ok"]);
    assert_eq!(listing.skipped_non_utf8, 1);
}

#[test]
fn list_through_an_inside_link_lists_the_target() {
    let fx = Fixture::new();
    fx.file("data/x.csv", "x").link("alias", "data");
    let ws = fx.ws(dataref_workspace::OpenMethod::Auto);
    let listing = ws.list_dir(&ws.resolve("alias").unwrap(), 10).unwrap();
    assert_eq!(paths(&listing), ["alias/x.csv"]);
}

fn tree_fixture() -> Fixture {
    let fx = Fixture::new();
    fx.file("top.csv", "x")
        .file("notes.txt", "x")
        .file("a/one.csv", "x")
        .file("a/b/two.csv", "x")
        .file("a/b/c/three.csv", "x")
        .file("a/b/c/d/four.csv", "x");
    fs::create_dir(fx.outside("outdir")).unwrap();
    fs::write(fx.outside("outdir/secret.csv"), "s").unwrap();
    fx.link("a/out", "../../outdir").link("a/in", "b");
    fx
}

#[test]
fn tree_with_glob_never_enters_linked_directories() {
    let fx = tree_fixture();
    for method in METHODS {
        let ws = fx.ws(method);
        let options = TreeOptions {
            glob: Some(Glob::new("**/*.csv").unwrap()),
            ..TreeOptions::default()
        };
        let listing = ws.list_tree(&ws.root_path(), &options).unwrap();
        assert_eq!(
            paths(&listing),
            [
                "a/b/c/d/four.csv",
                "a/b/c/three.csv",
                "a/b/two.csv",
                "a/one.csv",
                "top.csv"
            ]
        );
        assert!(!listing.truncated && !listing.depth_limited);

        // Without a glob, links are listed as links (and not entered).
        let all = ws
            .list_tree(&ws.root_path(), &TreeOptions::default())
            .unwrap();
        let links: Vec<_> = all
            .entries
            .iter()
            .filter(|e| e.kind == EntryKind::Symlink)
            .map(|e| e.path.as_str())
            .collect();
        assert_eq!(links, ["a/in", "a/out"]);
        assert!(
            all.entries
                .iter()
                .all(|e| !e.path.as_str().contains("secret"))
        );
    }
}

#[test]
fn tree_is_relative_to_the_listed_directory_for_the_glob() {
    let fx = tree_fixture();
    let ws = fx.ws(dataref_workspace::OpenMethod::Auto);
    let options = TreeOptions {
        glob: Some(Glob::new("*.csv").unwrap()),
        ..TreeOptions::default()
    };
    let listing = ws.list_tree(&ws.resolve("a/b").unwrap(), &options).unwrap();
    // The glob sees `two.csv`, the entry shows the path from the root.
    assert_eq!(paths(&listing), ["a/b/two.csv"]);
}

#[test]
fn tree_bounds_are_reported() {
    let fx = tree_fixture();
    let ws = fx.ws(dataref_workspace::OpenMethod::Auto);
    let csv = Some(Glob::new("**/*.csv").unwrap());

    let shallow = TreeOptions {
        glob: csv.clone(),
        max_depth: 2,
        ..TreeOptions::default()
    };
    let listing = ws.list_tree(&ws.root_path(), &shallow).unwrap();
    assert_eq!(paths(&listing), ["a/one.csv", "top.csv"]);
    assert!(listing.depth_limited);
    assert!(!listing.truncated);

    let few = TreeOptions {
        glob: csv.clone(),
        max_entries: 2,
        ..TreeOptions::default()
    };
    let listing = ws.list_tree(&ws.root_path(), &few).unwrap();
    assert_eq!(listing.entries.len(), 2);
    assert!(listing.truncated);

    let little_scanning = TreeOptions {
        glob: Some(Glob::new("nothing-matches").unwrap()),
        max_scanned: 3,
        ..TreeOptions::default()
    };
    let listing = ws.list_tree(&ws.root_path(), &little_scanning).unwrap();
    assert!(listing.entries.is_empty());
    assert!(listing.truncated);
}
