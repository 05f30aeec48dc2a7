//! The resolution table: each requested path and what it must give, by both open methods.

use std::fs;
use std::os::unix::fs::MetadataExt;

use dataref_protocol::Principal;
use dataref_workspace::{
    EntryKind, Escape, InvalidBytes, OpenMethod, Workspace, WorkspacePathError as E,
};
use rustix::fs::{FileType, Mode};

use crate::{Fixture, METHODS, SECRET, read, read_str};

#[test]
fn plain_file_is_read() {
    let fx = Fixture::new();
    fx.file("notes.txt", "hello");
    for method in METHODS {
        let ws = fx.ws(method);
        let path = ws.resolve("notes.txt").unwrap();
        assert_eq!(path.as_str(), "notes.txt");
        assert_eq!(read(&ws, &path).unwrap(), "hello");
    }
}

#[test]
fn absolute_path_is_refused() {
    let fx = Fixture::new();
    let ws = fx.ws(OpenMethod::Auto);
    let err = ws.resolve("/etc/passwd").unwrap_err();
    assert!(
        matches!(&err, E::Absolute { path } if path == "/etc/passwd"),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "`/etc/passwd` is an absolute path; workspace paths are relative to the workspace root"
    );
    assert!(err.hint().unwrap().contains("relative"));
}

#[test]
fn parent_components_are_refused() {
    let fx = Fixture::new();
    let ws = fx.ws(OpenMethod::Auto);
    assert!(matches!(
        ws.resolve("../../secret"),
        Err(E::ParentComponent { .. })
    ));
    assert!(matches!(ws.resolve(".."), Err(E::ParentComponent { .. })));
}

#[test]
fn parent_component_is_refused_even_when_it_comes_back_inside() {
    let fx = Fixture::new();
    fx.file("a/x", "a").file("b", "b");
    let ws = fx.ws(OpenMethod::Auto);
    let err = ws.resolve("a/../b").unwrap_err();
    assert!(matches!(err, E::ParentComponent { .. }), "{err:?}");
    assert!(err.hint().unwrap().contains("without `..`"));
}

#[test]
fn dot_segments_normalise() {
    let fx = Fixture::new();
    fx.file("x", "x").file("a/b", "ab");
    for method in METHODS {
        let ws = fx.ws(method);
        let path = ws.resolve("./x").unwrap();
        assert_eq!(path.as_str(), "x");
        assert_eq!(read(&ws, &path).unwrap(), "x");
        let path = ws.resolve("a/./b").unwrap();
        assert_eq!(path.as_str(), "a/b");
        assert_eq!(read(&ws, &path).unwrap(), "ab");
    }
}

#[test]
fn symlink_that_stays_inside_is_followed() {
    let fx = Fixture::new();
    fx.file("data/real.csv", "inside")
        .link("alias.csv", "data/real.csv")
        .link("data_link", "data")
        .link("data/up", "..")
        .link("data/sibling", "../alias.csv");
    for method in METHODS {
        let ws = fx.ws(method);
        for requested in [
            "alias.csv",
            "data_link/real.csv",
            "data/up/data/real.csv",
            "data/sibling",
        ] {
            let path = ws.resolve(requested).unwrap();
            // What the model asked for, not where the link led.
            assert_eq!(path.as_str(), requested);
            assert_eq!(
                read(&ws, &path).unwrap(),
                "inside",
                "{requested} by {method:?}"
            );
        }
    }
}

#[test]
fn symlink_that_leads_outside_is_refused() {
    let fx = Fixture::new();
    fx.dir("d").link("d/out", "../../outside.txt");
    for method in METHODS {
        let ws = fx.ws(method);
        let err = ws.resolve("d/out").unwrap_err();
        assert!(
            matches!(
                &err,
                E::Escapes { link: Some(link), how: Escape::AboveRoot, .. } if link == "d/out"
            ),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "`d/out` leads outside the workspace through the symbolic link `d/out`"
        );
    }
}

#[test]
fn absolute_symlinks_are_refused_even_pointing_inside() {
    let fx = Fixture::new();
    fx.file("notes.txt", "inside")
        .link("abs_out", fx.outside("outside.txt"))
        .link("abs_in", fx.root.join("notes.txt"));
    for method in METHODS {
        let ws = fx.ws(method);
        for requested in ["abs_out", "abs_in"] {
            let err = ws.resolve(requested).unwrap_err();
            assert!(
                matches!(
                    err,
                    E::Escapes {
                        how: Escape::AbsoluteTarget,
                        ..
                    }
                ),
                "{err:?}"
            );
            let message = err.to_string();
            assert!(message.contains("points to an absolute path"), "{message}");
            // The link's target is a host path: it must not reach the model.
            assert!(
                !message.contains(fx.tmp.path().to_str().unwrap()),
                "{message}"
            );
        }
    }
}

#[test]
fn sibling_with_the_same_prefix_is_outside() {
    let fx = Fixture::new();
    fx.link("sneaky", "../work-secret/x");
    let root = fx.root.to_str().unwrap().to_owned();

    // A string-prefix check would let this through: the real path of the link starts with
    // the root's path, because `work-secret` starts with `work`.
    let real = fs::canonicalize(fx.root.join("sneaky")).unwrap();
    assert!(real.to_str().unwrap().starts_with(&root));
    assert_eq!(fs::read_to_string(&real).unwrap(), SECRET);
    // Comparing components says what is true.
    assert!(!real.starts_with(&fx.root));

    for method in METHODS {
        let ws = fx.ws(method);
        let err = ws.resolve("sneaky").unwrap_err();
        assert!(
            matches!(
                err,
                E::Escapes {
                    how: Escape::AboveRoot,
                    ..
                }
            ),
            "{err:?}"
        );
        let err = ws.resolve("../work-secret/x").unwrap_err();
        assert!(matches!(err, E::ParentComponent { .. }), "{err:?}");
    }
}

#[test]
fn nul_and_invalid_utf8_are_refused() {
    let fx = Fixture::new();
    let ws = fx.ws(OpenMethod::Auto);
    let err = ws.resolve("a\0b").unwrap_err();
    assert!(
        matches!(&err, E::InvalidBytes { problem: InvalidBytes::Nul, path } if path == "a\\u{0}b"),
        "{err:?}"
    );
    let err = ws.resolve_bytes(b"caf\xe9.txt").unwrap_err();
    assert!(
        matches!(
            err,
            E::InvalidBytes {
                problem: InvalidBytes::NotUtf8,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(ws.resolve_bytes(b"").unwrap().is_root());
}

#[test]
fn overlong_names_and_paths_are_refused() {
    let fx = Fixture::new();
    let ws = fx.ws(OpenMethod::Auto);
    let name = "n".repeat(256);
    assert!(matches!(
        ws.resolve(&name),
        Err(E::NameTooLong { bytes: 256, .. })
    ));
    let path = "d/".repeat(2049);
    let err = ws.resolve(&path).unwrap_err();
    assert!(matches!(err, E::PathTooLong { bytes: 4098 }), "{err:?}");
    // The message does not repeat the 4 KiB path.
    assert!(err.to_string().len() < 100);
    // 255 bytes is fine (it just does not exist).
    assert!(matches!(
        ws.resolve(&"n".repeat(255)),
        Err(E::NotFound { .. })
    ));
}

#[test]
fn symlink_loops_are_refused() {
    let fx = Fixture::new();
    fx.link("loop_a", "loop_b")
        .link("loop_b", "loop_a")
        .link("self", "self")
        .dir("d")
        .link("d/deep", "../d/deep/x");
    for method in METHODS {
        let ws = fx.ws(method);
        for requested in ["loop_a", "self", "d/deep"] {
            let err = ws.resolve(requested).unwrap_err();
            assert!(matches!(err, E::SymlinkLoop { .. }), "{requested}: {err:?}");
        }
    }
}

#[test]
fn symlink_loop_made_after_resolving_is_refused_at_open() {
    let fx = Fixture::new();
    fx.file("f", "x");
    for method in METHODS {
        let ws = fx.ws(method);
        let path = ws.resolve("f").unwrap();
        fs::rename(fx.root.join("f"), fx.root.join("f.bak")).unwrap();
        fx.link("f", "f");
        let err = ws.open_read(&path).unwrap_err();
        assert!(matches!(err, E::SymlinkLoop { .. }), "{method:?}: {err:?}");
        fs::remove_file(fx.root.join("f")).unwrap();
        fs::rename(fx.root.join("f.bak"), fx.root.join("f")).unwrap();
    }
}

#[test]
fn hard_link_to_an_outside_file_is_refused() {
    let fx = Fixture::new();
    fs::hard_link(fx.outside("outside.txt"), fx.root.join("hl")).unwrap();
    for method in METHODS {
        let ws = fx.ws(method);
        // It is inside by name, so it resolves; reading it is what is refused.
        let path = ws.resolve("hl").unwrap();
        let err = ws.open_read(&path).unwrap_err();
        assert!(matches!(err, E::HardLinked { links: 2, .. }), "{err:?}");
        assert!(err.to_string().contains("more than one name"));
        assert!(err.hint().unwrap().contains("copy"));
    }
}

#[test]
fn directory_where_a_file_is_wanted() {
    let fx = Fixture::new();
    fx.dir("sub").file("notes.txt", "x");
    for method in METHODS {
        let ws = fx.ws(method);
        let err = ws.open_read(&ws.resolve("sub").unwrap()).unwrap_err();
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
        assert_eq!(err.to_string(), "`sub` is a directory, not a regular file");
        // The empty path is the root: fine for listing, not for reading.
        let root = ws.resolve("").unwrap();
        assert_eq!(root.as_str(), ".");
        assert!(matches!(
            ws.open_read(&root),
            Err(E::NotAFile {
                found: EntryKind::Directory,
                ..
            })
        ));
        // And a file where a directory is wanted.
        let err = ws
            .list_dir(&ws.resolve("notes.txt").unwrap(), 10)
            .unwrap_err();
        assert!(matches!(err, E::NotADirectory { .. }), "{err:?}");
    }
}

#[test]
fn missing_paths_and_files_used_as_directories() {
    let fx = Fixture::new();
    fx.file("notes.txt", "x").link("dangling", "nowhere");
    let ws = fx.ws(OpenMethod::Auto);
    assert!(matches!(ws.resolve("missing"), Err(E::NotFound { .. })));
    assert!(matches!(ws.resolve("dangling"), Err(E::NotFound { .. })));
    assert!(matches!(
        ws.resolve("notes.txt/x"),
        Err(E::NotADirectory { .. })
    ));
}

#[test]
fn fifo_is_not_a_file_and_does_not_hang() {
    let fx = Fixture::new();
    let dir = fs::File::open(&fx.root).unwrap();
    rustix::fs::mknodat(&dir, "pipe", FileType::Fifo, Mode::RUSR | Mode::WUSR, 0).unwrap();
    for method in METHODS {
        let ws = fx.ws(method);
        let err = ws.open_read(&ws.resolve("pipe").unwrap()).unwrap_err();
        assert!(
            matches!(
                err,
                E::NotAFile {
                    found: EntryKind::Other,
                    ..
                }
            ),
            "{err:?}"
        );
    }
}

#[test]
fn file_swapped_for_an_outside_link_after_resolving_is_refused() {
    let fx = Fixture::new();
    fx.file("report.csv", "inside");
    for method in METHODS {
        let ws = fx.ws(method);
        let path = ws.resolve("report.csv").unwrap();
        fs::rename(fx.root.join("report.csv"), fx.root.join("keep")).unwrap();
        fx.link("report.csv", "../outside.txt");
        let err = read(&ws, &path).unwrap_err();
        assert!(matches!(err, E::Escapes { .. }), "{method:?}: {err:?}");
        fs::remove_file(fx.root.join("report.csv")).unwrap();
        fs::rename(fx.root.join("keep"), fx.root.join("report.csv")).unwrap();
    }
}

#[test]
fn no_error_message_shows_a_host_path() {
    let fx = Fixture::new();
    fx.file("notes.txt", "x")
        .link("out", "../outside.txt")
        .link("abs", fx.outside("outside.txt"))
        .link("loop", "loop");
    fs::hard_link(fx.outside("outside.txt"), fx.root.join("hl")).unwrap();
    let host = fx.tmp.path().to_str().unwrap().to_owned();
    for method in METHODS {
        let ws = fx.ws(method);
        let mut errors = Vec::new();
        for requested in [
            "/etc/passwd",
            "../x",
            "out",
            "abs",
            "loop",
            "missing",
            "notes.txt/x",
        ] {
            errors.push(ws.resolve(requested).unwrap_err());
        }
        errors.push(read_str(&ws, "hl").unwrap_err());
        errors.push(read_str(&ws, "").unwrap_err());
        for err in errors {
            let text = format!("{err} {}", err.hint().unwrap_or_default());
            assert!(!text.contains(&host), "{text}");
            assert!(err.is_caller_error(), "{err:?}");
            assert!(err.hint().is_some(), "{err:?}");
        }
    }
}

#[test]
fn renaming_the_root_path_changes_nothing() {
    let fx = Fixture::new();
    fx.file("notes.txt", "hello");
    let ws = fx.ws(OpenMethod::Auto);
    fs::rename(&fx.root, fx.outside("moved")).unwrap();
    // A different directory now has the old name; the workspace still means the moved one.
    fs::create_dir(&fx.root).unwrap();
    fs::write(fx.root.join("notes.txt"), "impostor").unwrap();
    assert_eq!(read_str(&ws, "notes.txt").unwrap(), "hello");
    assert_eq!(ws.host_path_for_logging(), fx.root);
}

#[test]
fn principal_workspaces_are_private_directories() {
    let home = tempfile::tempdir().unwrap();
    let alice = Principal::new("alice").unwrap();
    let ws = Workspace::for_principal(home.path(), &alice).unwrap();
    let dir = home.path().join("workspaces/alice");
    assert_eq!(ws.host_path_for_logging(), dir);
    assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
    ws.write_atomic("a.txt", b"a", dataref_workspace::Overwrite::Refuse)
        .unwrap();
    assert!(dir.join("a.txt").is_file());

    // Opening again finds the same directory and tightens a widened mode.
    fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let again = Workspace::for_principal(home.path(), &alice).unwrap();
    assert_eq!(read_str(&again, "a.txt").unwrap(), "a");
    assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);

    // A link in place of a principal's directory is not followed.
    let elsewhere = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), home.path().join("workspaces/mallory")).unwrap();
    let mallory = Principal::new("mallory").unwrap();
    let err = Workspace::for_principal(home.path(), &mallory).unwrap_err();
    assert!(err.to_string().contains("mallory"), "{err}");
    assert!(err.hint().is_some());
}

#[test]
fn open_requires_an_existing_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let err = Workspace::open(&tmp.path().join("missing")).unwrap_err();
    assert!(matches!(
        err,
        dataref_workspace::WorkspaceError::Open { .. }
    ));
    fs::write(tmp.path().join("file"), "x").unwrap();
    assert!(Workspace::open(&tmp.path().join("file")).is_err());
}

#[test]
fn metadata_follows_inside_links() {
    let fx = Fixture::new();
    fx.file("d/f.txt", "12345").link("l", "d/f.txt");
    for method in METHODS {
        let ws = fx.ws(method);
        let meta = ws.metadata(&ws.resolve("l").unwrap()).unwrap();
        assert_eq!(meta.kind, EntryKind::File);
        assert_eq!(meta.size, 5);
        assert!(meta.modified.unix_seconds() > 1_600_000_000);
        let meta = ws.metadata(&ws.resolve("d").unwrap()).unwrap();
        assert_eq!(meta.kind, EntryKind::Directory);
    }
}

#[test]
fn auto_method_reads_like_the_others() {
    let fx = Fixture::new();
    fx.file("notes.txt", "hello");
    let ws = fx.ws(OpenMethod::Auto);
    assert_eq!(read_str(&ws, "notes.txt").unwrap(), "hello");
}

#[test]
fn nesting_deeper_than_the_bound_is_refused() {
    let fx = Fixture::new();
    let deep = vec!["d"; dataref_workspace::MAX_DEPTH + 1].join("/");
    fx.dir(&deep);
    let ws = fx.ws(OpenMethod::Auto);
    let at_limit = vec!["d"; dataref_workspace::MAX_DEPTH].join("/");
    assert!(ws.resolve(&at_limit).is_ok());
    let err = ws.resolve(&deep).unwrap_err();
    assert!(matches!(err, E::TooDeep { .. }), "{err:?}");
}

#[test]
fn a_missing_data_dir_is_made_passable_and_only_workspaces_private() {
    // The data dir also holds the sandbox's job directories, which its uid must reach: a
    // workspace opened first (a server's first session) must not make the data dir private.
    let base = tempfile::tempdir().unwrap();
    let home = base.path().join("data/dataref");
    let alice = Principal::new("alice").unwrap();
    Workspace::for_principal(&home, &alice).unwrap();
    for dir in [base.path().join("data"), home.clone()] {
        let mode = fs::metadata(&dir).unwrap().mode() & 0o777;
        assert_eq!(mode & 0o011, 0o011, "{} has mode {mode:o}", dir.display());
    }
    assert_eq!(
        fs::metadata(&home).unwrap().mode() & 0o044,
        0,
        "others may not list it"
    );
    assert_eq!(
        fs::metadata(home.join("workspaces")).unwrap().mode() & 0o777,
        0o700
    );
}
