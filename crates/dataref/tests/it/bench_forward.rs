//! `dataref bench ARGS…` runs the `dataref-bench` executable beside `dataref` with the same
//! arguments and exits with its code; without one there, it says how to build it.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::BIN;

/// A directory holding only a link to the real `dataref` (its `current_exe` is the link,
/// so `dataref-bench` is looked for in that directory).
fn lone_dataref(dir: &Path) -> PathBuf {
    let exe = dir.join("dataref");
    if std::fs::hard_link(BIN, &exe).is_err() {
        std::fs::copy(BIN, &exe).expect("copy the dataref binary");
    }
    exe
}

fn temp_dir() -> tempfile::TempDir {
    // Beside the binary's target dir, so a hard link works (one file system).
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir")
}

#[test]
fn bench_without_the_bench_executable_says_how_to_build_it() {
    let dir = temp_dir();
    let exe = lone_dataref(dir.path());
    let out = Command::new(&exe)
        .args(["bench", "context", "--rows", "10"])
        .output()
        .expect("run dataref bench");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("dataref-bench"), "{stderr}");
    assert!(
        stderr.contains("cargo build --release -p dataref -p dataref-bench"),
        "{stderr}"
    );
    assert!(stderr.contains("scripts/bench"), "{stderr}");
}

#[test]
fn bench_runs_the_bench_executable_beside_it_with_the_same_arguments_and_exit_code() {
    use std::os::unix::fs::PermissionsExt;
    let dir = temp_dir();
    let exe = lone_dataref(dir.path());
    let fake = dir.path().join("dataref-bench");
    std::fs::write(&fake, "#!/bin/sh\necho \"args: $*\"\nexit 7\n").expect("write fake");
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let out = Command::new(&exe)
        .args(["bench", "--help", "first-run", "--rows", "10"])
        .output()
        .expect("run dataref bench");
    assert_eq!(out.status.code(), Some(7));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.trim(), "args: --help first-run --rows 10");
}
