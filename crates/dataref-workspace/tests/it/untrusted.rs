//! `UntrustedDir`: a tree someone else wrote, read one plain name at a time without ever
//! following a link (what the sandbox collects `out/` with).

use std::io::Read;
use std::time::{Duration, Instant};

use dataref_workspace::{EntryBudget, FileKind, Refusal, UntrustedDir};
use rustix::fs::{FileType, Mode};

use super::{Fixture, SECRET};

fn hostile() -> Fixture {
    let f = Fixture::new();
    f.file("ok.txt", "fine")
        .file("sub/inner.txt", "inner")
        .file("h1.txt", "linked")
        .file("big.txt", "0123456789")
        .link("secret", f.outside("outside.txt"))
        .link("relative-secret", "../outside.txt")
        .link("up", "..")
        .link("inside", "ok.txt");
    std::fs::hard_link(f.root.join("h1.txt"), f.root.join("h2.txt")).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        f.root.join("fifo"),
        FileType::Fifo,
        Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    f
}

fn read(dir: &UntrustedDir, name: &str) -> String {
    let (mut file, bytes) = dir.open_file(name, 1 << 20).unwrap();
    let mut text = String::new();
    file.read_to_string(&mut text).unwrap();
    assert_eq!(bytes, text.len() as u64);
    text
}

#[test]
fn plain_files_and_directories_are_opened() {
    let f = hostile();
    let dir = UntrustedDir::open(&f.root).unwrap();
    assert_eq!(read(&dir, "ok.txt"), "fine");
    let sub = dir.open_dir("sub").unwrap();
    assert_eq!(read(&sub, "inner.txt"), "inner");
    assert_eq!(dir.kind("sub").unwrap(), FileKind::Directory);
    assert_eq!(dir.kind("ok.txt").unwrap(), FileKind::Regular);
    assert_eq!(dir.kind("secret").unwrap(), FileKind::Symlink);
    assert_eq!(dir.kind("fifo").unwrap(), FileKind::Fifo);
    // A second fd of the same directory reads the same.
    let again = UntrustedDir::reopen(&dir).unwrap();
    assert_eq!(read(&again, "ok.txt"), "fine");
}

#[test]
fn links_out_and_in_are_refused_never_followed() {
    let f = hostile();
    let dir = UntrustedDir::open(&f.root).unwrap();
    for link in ["secret", "relative-secret", "inside", "up"] {
        let err = dir.open_file(link, 1 << 20).unwrap_err();
        assert!(matches!(err, Refusal::Symlink), "{link}: {err:?}");
        let err = dir.open_dir(link).unwrap_err();
        assert!(
            matches!(err, Refusal::Symlink | Refusal::NotADirectory),
            "{link}: {err:?}"
        );
    }
    // The root itself given as a link is refused too.
    let err = UntrustedDir::open(&f.root.join("up")).unwrap_err();
    let refused = [rustix::io::Errno::LOOP, rustix::io::Errno::NOTDIR].map(|e| e.raw_os_error());
    assert!(
        err.raw_os_error()
            .is_some_and(|code| refused.contains(&code)),
        "{err}"
    );
}

#[test]
fn dot_dot_and_paths_are_not_names() {
    let f = hostile();
    let dir = UntrustedDir::open(&f.root).unwrap();
    for bad in [
        "..",
        ".",
        "",
        "../outside.txt",
        "sub/inner.txt",
        "/etc/passwd",
        "a\0b",
    ] {
        let err = dir.open_file(bad, 1 << 20).unwrap_err();
        assert!(matches!(err, Refusal::BadName), "{bad:?}: {err:?}");
        let err = dir.open_dir(bad).unwrap_err();
        assert!(matches!(err, Refusal::BadName), "{bad:?}: {err:?}");
        let err = dir.kind(bad).unwrap_err();
        assert!(matches!(err, Refusal::BadName), "{bad:?}: {err:?}");
    }
}

#[test]
fn hard_links_fifos_directories_and_big_files_are_refused() {
    let f = hostile();
    let dir = UntrustedDir::open(&f.root).unwrap();
    for name in ["h1.txt", "h2.txt"] {
        let err = dir.open_file(name, 1 << 20).unwrap_err();
        assert!(
            matches!(err, Refusal::HardLinked { links: 2 }),
            "{name}: {err:?}"
        );
    }
    // A FIFO with no writer would block a plain open; this returns at once.
    let started = Instant::now();
    let err = dir.open_file("fifo", 1 << 20).unwrap_err();
    assert!(
        matches!(err, Refusal::NotRegular(FileKind::Fifo)),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(err.to_string(), "not a regular file (a FIFO)");
    let err = dir.open_file("sub", 1 << 20).unwrap_err();
    assert!(
        matches!(err, Refusal::NotRegular(FileKind::Directory)),
        "{err:?}"
    );
    let err = dir.open_dir("ok.txt").unwrap_err();
    assert!(matches!(err, Refusal::NotADirectory), "{err:?}");
    let err = dir.open_file("big.txt", 9).unwrap_err();
    assert!(
        matches!(err, Refusal::TooLarge { bytes: 10, cap: 9 }),
        "{err:?}"
    );
    assert_eq!(dir.open_file("big.txt", 10).unwrap().1, 10);
    let err = dir.open_file("missing", 1 << 20).unwrap_err();
    assert!(
        matches!(&err, Refusal::Io(e) if e.kind() == std::io::ErrorKind::NotFound),
        "{err:?}"
    );
    // Nothing of the outside was read by any of it.
    assert_ne!(read(&dir, "ok.txt"), SECRET);
}

#[test]
fn listings_are_sorted_bytes_within_one_shared_budget() {
    let f = Fixture::new();
    for name in ["c", "a", "b"] {
        f.file(&format!("one/{name}"), "");
    }
    f.file("two/x", "").file("two/y", "");
    let odd: &std::ffi::OsStr = std::os::unix::ffi::OsStrExt::from_bytes(b"one/\xff");
    std::fs::write(f.root.join(odd), "").unwrap();
    let root = UntrustedDir::open(&f.root).unwrap();
    let (one, two) = (root.open_dir("one").unwrap(), root.open_dir("two").unwrap());

    let mut budget = EntryBudget::new(100);
    let listed = one.names(&mut budget).unwrap();
    assert!(!listed.cut);
    assert_eq!(
        listed.names,
        [
            b"a".to_vec(),
            b"b".to_vec(),
            b"c".to_vec(),
            b"\xff".to_vec()
        ]
    );

    let mut budget = EntryBudget::new(5);
    assert_eq!(one.names(&mut budget).unwrap().names.len(), 4);
    let listed = two.names(&mut budget).unwrap();
    assert!(listed.cut, "the budget is shared by the walk");
    assert_eq!(listed.names.len(), 1);
    let listed = one.names(&mut budget).unwrap();
    assert!(listed.cut && listed.names.is_empty());
}
