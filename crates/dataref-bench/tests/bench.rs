//! The model-facing benchmarks run to their tables on the real binary: a change to what a
//! result carries (as when `ok` and `durationMs` left `run_python`'s) must not leave a bench
//! failing unnoticed. Numbers are not asserted here; they are the benches' to print.
#![expect(
    clippy::expect_used,
    reason = "test helpers fail the test on setup errors"
)]

use std::path::PathBuf;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_dataref-bench");

/// The data dir where the sandbox tests provision the Python runtime (shared).
fn runtime_home() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dataref-runtime-home")
}

fn bench(args: &[&str]) -> String {
    let out = Command::new(BIN)
        .args(args)
        .env("DATAREF_HOME", runtime_home())
        .env_remove("DATAREF_CONFIG")
        .output()
        .expect("run dataref bench");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "bench {args:?}: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn bench_context_and_first_run_print_their_tables() {
    let context = bench(&["context", "--rows", "4000"]);
    assert!(context.contains("| total of the five |"), "{context}");
    assert!(
        context.contains("| tools/list: the whole result |"),
        "{context}"
    );
    let first = bench(&[
        "first-run",
        "--rows",
        "4000",
        "--servers",
        "1",
        "--warm-runs",
        "1",
    ]);
    assert!(first.contains("| **median, pool on** |"), "{first}");
    assert!(
        first.contains("| **median, pool off (baseline)** |"),
        "{first}"
    );
}

#[test]
fn bench_agent_prints_its_tables() {
    let agent = bench(&["agent", "--rows", "4000", "--runs", "2"]);
    assert!(
        agent.contains("| `Agent::run`, final text, token counts cached | 1 |"),
        "{agent}"
    );
    assert!(
        agent.contains("| `window::fit`, token counts cached |"),
        "{agent}"
    );
    assert!(agent.contains("| 4000 | 4000 | 4 |"), "{agent}");
    assert!(agent.contains("the same total at every size"), "{agent}");
}

/// What a person reads before running a bench: `--help` of the binary and of each section,
/// a reviewed diff when it changes.
#[test]
fn help_of_every_section() {
    let mut doc = String::new();
    for command in [&[][..], &["context"], &["first-run"], &["agent"]] {
        let out = Command::new(BIN)
            .args(command)
            .arg("--help")
            .env_remove("DATAREF_CONFIG")
            .output()
            .expect("run dataref-bench --help");
        assert!(out.status.success(), "{command:?}");
        doc.push_str(&format!(
            "$ dataref-bench {}--help\n{}\n",
            command.iter().map(|c| format!("{c} ")).collect::<String>(),
            String::from_utf8_lossy(&out.stdout)
        ));
    }
    insta::assert_snapshot!("help", doc);
}
