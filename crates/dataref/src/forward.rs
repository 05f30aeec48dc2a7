//! `dataref bench ARGS…`: the benchmarks are a binary of their own (`dataref-bench`, never
//! part of this one); this runs the one next to our own executable with the same
//! arguments, in our place (its exit code is ours).

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};

/// The benchmark executable's name, looked for beside ours.
pub const BENCH_EXE: &str = "dataref-bench";

/// Replaces this process by `dataref-bench ARGS…`; returns only when that cannot start.
pub fn bench(args: &[OsString]) -> Result<ExitCode> {
    let exe = bench_exe()?;
    if !exe.is_file() {
        anyhow::bail!(
            "`dataref bench` runs `{BENCH_EXE}`, which is not next to this executable (looked for `{}`)\n\
             hint: build it with `cargo build --release -p dataref -p dataref-bench` (it lands \
             beside `target/release/dataref`), or run `scripts/bench`, which builds both with \
             the `dist` profile",
            exe.display()
        );
    }
    let e = std::process::Command::new(&exe).args(args).exec();
    Err(e).with_context(|| format!("running `{}`", exe.display()))
}

/// `dataref-bench` in the directory of the running executable.
fn bench_exe() -> Result<PathBuf> {
    let me = std::env::current_exe().context("finding the dataref executable")?;
    let dir = me
        .parent()
        .context("the dataref executable has no directory")?;
    Ok(dir.join(BENCH_EXE))
}
