//! The managed runtime, provisioned for real from PyPI once per target dir, and the runner
//! run directly with it (no jail: isolation has its own tests).

#![expect(
    clippy::disallowed_methods,
    reason = "the tests build hostile job directories by hand, beside any workspace"
)]

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

use arrow_array::{ArrayRef, Date32Array, Float64Array, RecordBatch, StringArray};
use arrow_ipc::writer::FileWriter;
use arrow_schema::{DataType, Field, Schema};
use dataref_sandbox::runtime::exchange::{
    ExchangeCaps, JobResult, Placement, SkipReason, collect, prepare_job,
};
use dataref_sandbox::runtime::{PINNED, Runtime, RuntimeSpec, RuntimeStatus};
use serde_json::{Value, json};

/// Shared by every test and every run, so PyPI is hit once per target dir.
fn home() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dataref-runtime-home")
}

fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| Runtime::ensure(&home(), &|_| {}).unwrap())
}

fn write_arrow(path: &Path, batch: &RecordBatch) {
    let file = File::create(path).unwrap();
    let mut writer = FileWriter::try_new(file, &batch.schema()).unwrap();
    writer.write(batch).unwrap();
    writer.finish().unwrap();
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(y: i32, m: u32, d: u32) -> i32 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i32::try_from(m).unwrap();
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i32::try_from(d).unwrap() - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

struct Sale {
    line: String,
    month: u32,
    day: u32,
    revenue: f64,
}

/// Eight product lines, three sales a month each through 2024, revenue from a fixed LCG.
fn sales() -> Vec<Sale> {
    let mut state: u64 = 42;
    let mut rows = Vec::new();
    for line in 0..8u8 {
        for month in 1..=12u32 {
            for k in 0..3u32 {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                let cents = (state >> 33) % 10_000_000;
                rows.push(Sale {
                    line: format!("Line {}", char::from(b'A' + line)),
                    month,
                    day: 1 + k * 9,
                    revenue: cents as f64 / 100.0,
                });
            }
        }
    }
    rows
}

fn sales_batch(rows: &[Sale]) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("date", DataType::Date32, false),
        Field::new("line", DataType::Utf8, false),
        Field::new("revenue", DataType::Float64, false),
    ]));
    let date: ArrayRef = Arc::new(Date32Array::from_iter_values(
        rows.iter().map(|r| days_from_civil(2024, r.month, r.day)),
    ));
    let line: ArrayRef = Arc::new(StringArray::from_iter_values(
        rows.iter().map(|r| r.line.as_str()),
    ));
    let revenue: ArrayRef = Arc::new(Float64Array::from_iter_values(
        rows.iter().map(|r| r.revenue),
    ));
    RecordBatch::try_new(schema, vec![date, line, revenue]).unwrap()
}

struct Ran {
    job: JobResult,
    stdout: String,
    _dir: tempfile::TempDir,
}

fn run(inputs: &[(&str, &Path)], code: &str, caps: &ExchangeCaps) -> Ran {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let job_dir = dir.path().join("job");
    let prepared = prepare_job(&job_dir, inputs, code, &[], caps, Placement::LinkOrCopy).unwrap();
    let out = Command::new(&rt.python)
        .args(prepared.layout.runner_args())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "runner exited with {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let job = collect(&job_dir, caps).unwrap();
    Ran {
        job,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        _dir: dir,
    }
}

fn run_plain(code: &str) -> Ran {
    run(&[], code, &ExchangeCaps::default())
}

#[test]
fn provisioning_is_idempotent_and_records_the_pins() {
    let first = runtime().clone();
    let messages = Mutex::new(Vec::new());
    let again = Runtime::ensure(&home(), &|m| messages.lock().unwrap().push(m.to_owned())).unwrap();
    assert_eq!(first, again);
    assert!(
        messages.lock().unwrap().is_empty(),
        "a ready runtime must start without work: {messages:?}"
    );

    let manifest: Value =
        serde_json::from_slice(&fs::read(home().join("python/dataref-runtime.json")).unwrap())
            .unwrap();
    for pin in PINNED {
        assert_eq!(manifest["pinned"][pin.name], pin.version, "{}", pin.name);
        assert_eq!(
            again.versions.packages.get(pin.name).map(String::as_str),
            Some(pin.version)
        );
    }
    assert!(again.python.starts_with(home().join("python")));
    assert!(again.base_prefix.is_dir());
    assert!(!again.versions.python.is_empty());
    // No build leftovers beside the runtime.
    let leftovers: Vec<_> = fs::read_dir(home())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("python.tmp-") || n.starts_with("python.old-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    match Runtime::check(&home()) {
        RuntimeStatus::Ready(checked) => assert_eq!(checked.base_prefix, again.base_prefix),
        other => panic!("expected a ready runtime, got {other:?}"),
    }
}

#[test]
fn check_reports_missing_and_half_built_runtimes() {
    let dir = tempfile::tempdir().unwrap();
    let status = Runtime::check(dir.path());
    assert!(
        matches!(status, RuntimeStatus::NotInstalled { .. }),
        "{status:?}"
    );
    assert!(status.fix().is_some());
    fs::create_dir_all(dir.path().join("python/bin")).unwrap();
    let status = Runtime::check(dir.path());
    assert!(matches!(status, RuntimeStatus::Broken { .. }), "{status:?}");
}

#[test]
fn quarter_over_quarter_pivot_gives_the_numbers_rust_computes() {
    let rows = sales();
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("sales.arrow");
    write_arrow(&input, &sales_batch(&rows));

    let code = r#"q = sales.assign(q=sales.date.dt.to_period("Q"))
pivot = q.pivot_table(index="line", columns="q", values="revenue", aggfunc="sum")
delta = (pivot.iloc[:, -1] - pivot.iloc[:, -2]).sort_values()
outputs["qoq"] = delta.rename("delta").reset_index()
result = delta.head(5).round(2).to_dict()
print("rows", len(sales))
"#;
    let ran = run(&[("sales", &input)], code, &ExchangeCaps::default());
    assert!(ran.job.ok, "{:?}", ran.job.error);
    assert_eq!(ran.stdout.trim(), format!("rows {}", rows.len()));

    let mut q3: BTreeMap<&str, f64> = BTreeMap::new();
    let mut q4: BTreeMap<&str, f64> = BTreeMap::new();
    for r in &rows {
        match r.month {
            7..=9 => *q3.entry(&r.line).or_default() += r.revenue,
            10..=12 => *q4.entry(&r.line).or_default() += r.revenue,
            _ => {}
        }
    }
    let mut delta: Vec<(&str, f64)> = q4.iter().map(|(line, v)| (*line, v - q3[line])).collect();
    delta.sort_by(|a, b| a.1.total_cmp(&b.1));
    let expected: Vec<(&str, f64)> = delta.iter().take(5).copied().collect();

    let got = ran.job.result.as_object().unwrap();
    let got: Vec<(&str, f64)> = got
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_f64().unwrap()))
        .collect();
    assert_eq!(got.len(), 5);
    for ((gl, gv), (el, ev)) in got.iter().zip(&expected) {
        assert_eq!(gl, el);
        assert!((gv - ev).abs() < 0.006, "{gl}: {gv} vs {ev}");
    }

    assert_eq!(ran.job.outputs.len(), 1, "{:?}", ran.job.skipped);
    let qoq = &ran.job.outputs[0];
    assert_eq!(qoq.name, "qoq");
    assert_eq!(qoq.rows, 8);
    let names: Vec<&str> = qoq
        .schema
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .collect();
    assert_eq!(names, ["line", "delta"]);
    assert_eq!(qoq.schema.field(1).data_type(), &DataType::Float64);
    assert!(ran.job.skipped.is_empty(), "{:?}", ran.job.skipped);
}

#[test]
fn a_date32_column_arrives_as_datetime64() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("t.arrow");
    write_arrow(&input, &sales_batch(&sales()[..3]));
    let ran = run(
        &[("t", &input)],
        "result = {'dtype': str(t.date.dtype), 'first': t.date.iloc[0], 'year': t.date.dt.year.iloc[0]}",
        &ExchangeCaps::default(),
    );
    assert!(ran.job.ok, "{:?}", ran.job.error);
    let dtype = ran.job.result["dtype"].as_str().unwrap();
    assert!(dtype.starts_with("datetime64"), "{dtype}");
    assert_eq!(ran.job.result["first"], "2024-01-01T00:00:00");
    assert_eq!(ran.job.result["year"], 2024);
}

#[test]
fn numpy_and_pandas_scalars_become_json() {
    let ran = run_plain(
        "result = {'i': np.int64(3), 'f': np.float64(1.5), 'nan': np.float64('nan'), \
         'b': np.bool_(True), 'ts': pd.Timestamp('2024-01-02'), 'nat': pd.NaT, \
         'arr': np.arange(3), 'p': pd.Period('2024Q1'), 'pyn': float('nan'), 'na': pd.NA, \
         'series': pd.Series([1, 2], index=['a', 'b'])}",
    );
    assert!(ran.job.ok, "{:?}", ran.job.error);
    assert_eq!(
        ran.job.result,
        json!({"i": 3, "f": 1.5, "nan": null, "b": true, "ts": "2024-01-02T00:00:00", "nat": null,
               "arr": [0, 1, 2], "p": "2024Q1", "pyn": null, "na": null, "series": {"a": 1, "b": 2}})
    );
}

#[test]
fn an_exception_reports_type_message_and_code_lines() {
    let ran = run_plain("x = 1\n\ndef f(d):\n    return d / 0\n\ny = f(x)\n");
    assert!(!ran.job.ok);
    let error = ran.job.error.unwrap();
    assert_eq!(error.kind, "ZeroDivisionError");
    assert_eq!(error.message, "division by zero");
    let lines: Vec<(u32, &str)> = error
        .traceback
        .iter()
        .map(|f| (f.line, f.code.as_str()))
        .collect();
    assert_eq!(lines, [(6, "y = f(x)"), (4, "return d / 0")]);
    assert!(ran.job.outputs.is_empty());

    let ran = run_plain("a = 1\nb = (\n");
    let error = ran.job.error.unwrap();
    assert_eq!(error.kind, "SyntaxError");
    assert_eq!(error.traceback.last().unwrap().line, 2);

    // A KeyError from inside pandas still points at the model's line only.
    let ran = run_plain("df = pd.DataFrame({'a': [1]})\ndf['nope']\n");
    let error = ran.job.error.unwrap();
    assert_eq!(error.kind, "KeyError");
    assert_eq!(error.traceback.len(), 1);
    assert_eq!(error.traceback[0].line, 2);
}

#[test]
fn a_result_over_the_cap_is_an_error_that_points_to_outputs() {
    let caps = ExchangeCaps {
        result_bytes: 100,
        ..ExchangeCaps::default()
    };
    let ran = run(
        &[],
        "outputs['ok'] = pd.DataFrame({'a': [1]})\nresult = list(range(1000))",
        &caps,
    );
    assert!(!ran.job.ok);
    assert_eq!(ran.job.result, Value::Null);
    let error = ran.job.error.unwrap();
    assert_eq!(error.kind, "ResultTooLarge");
    assert!(error.message.contains("outputs"), "{}", error.message);
    // A failed run stores nothing.
    assert!(ran.job.outputs.is_empty());
}

#[test]
fn collect_enforces_the_result_cap_even_if_the_runner_is_bypassed() {
    let dir = tempfile::tempdir().unwrap();
    let caps = ExchangeCaps {
        result_bytes: 50,
        ..ExchangeCaps::default()
    };
    let job = prepare_job(dir.path(), &[], "", &[], &caps, Placement::LinkOrCopy).unwrap();
    let big = json!({"ok": true, "result": "x".repeat(500), "error": null, "outputs": [], "duration_ms": 1});
    fs::write(job.layout.result(), big.to_string()).unwrap();
    let got = collect(dir.path(), &caps).unwrap();
    assert!(!got.ok);
    assert_eq!(got.error.unwrap().kind, "ResultTooLarge");
    assert_eq!(got.result, Value::Null);

    fs::remove_file(job.layout.result()).unwrap();
    assert!(matches!(
        collect(dir.path(), &caps),
        Err(dataref_sandbox::runtime::exchange::ExchangeError::NoResult)
    ));
}

#[test]
fn outputs_must_be_dataframes_and_series_and_indexes_are_kept() {
    let ran = run_plain("outputs['nums'] = [1, 2, 3]");
    assert!(!ran.job.ok);
    let error = ran.job.error.unwrap();
    assert_eq!(error.kind, "OutputNotDataFrame");
    assert!(
        error.message.contains("'nums'") && error.message.contains("list"),
        "{}",
        error.message
    );

    let ran = run_plain(
        "df = pd.DataFrame({'k': ['a', 'b', 'a'], 'v': [1, 2, 3]})\n\
         outputs['s'] = df.v\n\
         outputs['g'] = df.groupby('k').v.sum()\n",
    );
    assert!(ran.job.ok, "{:?}", ran.job.error);
    let names: Vec<(&str, Vec<&str>)> = ran
        .job
        .outputs
        .iter()
        .map(|o| {
            (
                o.name.as_str(),
                o.schema
                    .fields()
                    .iter()
                    .map(|f| f.name().as_str())
                    .collect(),
            )
        })
        .collect();
    assert_eq!(names, [("s", vec!["v"]), ("g", vec!["k", "v"])]);

    let ran = run_plain("outputs['../x'] = pd.DataFrame({'a': [1]})");
    assert_eq!(ran.job.error.unwrap().kind, "OutputNameInvalid");
}

#[test]
fn prepare_job_validates_names_and_plans_read_only_binds() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("a.arrow");
    write_arrow(&input, &sales_batch(&sales()[..2]));
    let caps = ExchangeCaps::default();
    for bad in ["list", "outputs", "1x", "a-b", "class"] {
        let job = dir.path().join(format!("bad-{bad}"));
        assert!(
            prepare_job(
                &job,
                &[(bad, &input)],
                "",
                &[],
                &caps,
                Placement::BindReadOnly
            )
            .is_err(),
            "{bad}"
        );
    }
    let job = dir.path().join("job");
    let prepared = prepare_job(
        &job,
        &[("sales", &input)],
        "result = 1",
        &[("docs/notes.txt", &input)],
        &caps,
        Placement::BindReadOnly,
    )
    .unwrap();
    assert_eq!(prepared.binds.len(), 2);
    assert_eq!(prepared.binds[0].source, input);
    assert_eq!(prepared.binds[0].target, job.join("in/inputs/sales.arrow"));
    assert_eq!(
        prepared.binds[1].target,
        job.join("in/files/docs/notes.txt")
    );
    // Placeholders exist for the bind mounts, and hold no data.
    assert_eq!(fs::metadata(&prepared.binds[0].target).unwrap().len(), 0);
    assert!(job.join("out/outputs").is_dir() && job.join("out/files").is_dir());
    assert!(
        prepare_job(
            &dir.path().join("j2"),
            &[],
            "",
            &[("../x", &input)],
            &caps,
            Placement::LinkOrCopy
        )
        .is_err()
    );
}

/// Builds an `out/` by hand with every kind of entry a hostile job could leave.
#[test]
fn collect_accepts_only_plain_regular_files() {
    use rustix::fs::{FileType, Mode, mknodat};
    use std::os::unix::fs::symlink;

    let dir = tempfile::tempdir().unwrap();
    let caps = ExchangeCaps::default();
    let job = prepare_job(dir.path(), &[], "", &[], &caps, Placement::LinkOrCopy).unwrap();
    let outputs = job.layout.outputs();
    let files = job.layout.out_files();
    write_arrow(&outputs.join("good.arrow"), &sales_batch(&sales()[..4]));
    symlink("/etc/passwd", outputs.join("evil.arrow")).unwrap();
    fs::write(outputs.join("broken.arrow"), b"ARROW1 but not really").unwrap();
    write_arrow(&outputs.join("extra.arrow"), &sales_batch(&sales()[..1]));
    fs::write(
        job.layout.result(),
        json!({"ok": true, "result": {"n": 1}, "outputs": ["good", "evil", "broken"], "duration_ms": 5}).to_string(),
    )
    .unwrap();

    fs::write(files.join("chart.png"), b"png").unwrap();
    symlink("/etc/passwd", files.join("passwd")).unwrap();
    fs::write(files.join("h1.txt"), b"x").unwrap();
    fs::hard_link(files.join("h1.txt"), files.join("h2.txt")).unwrap();
    let files_fd = rustix::fs::open(&files, rustix::fs::OFlags::DIRECTORY, Mode::empty()).unwrap();
    mknodat(
        &files_fd,
        "pipe",
        FileType::Fifo,
        Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    fs::write(files.join(".hidden"), b"x").unwrap();
    fs::write(files.join("bad name.txt"), b"x").unwrap();
    fs::create_dir_all(files.join("d1/d2/d3/d4/d5")).unwrap();
    fs::write(files.join("d1/d2/d3/d4/ok.txt"), b"deep but allowed").unwrap();
    fs::write(files.join("d1/d2/d3/d4/d5/x.txt"), b"too deep").unwrap();
    symlink("/etc", files.join("d1/etc")).unwrap();

    let got = collect(dir.path(), &caps).unwrap();
    assert!(got.ok);
    assert_eq!(got.result, json!({"n": 1}));
    let outs: Vec<&str> = got.outputs.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(outs, ["good"]);
    assert_eq!(got.outputs[0].rows, 4);
    let accepted: Vec<&str> = got.files.iter().map(|f| f.rel.as_str()).collect();
    assert_eq!(accepted, ["chart.png", "d1/d2/d3/d4/ok.txt"]);

    let skipped: BTreeMap<&str, &SkipReason> = got
        .skipped
        .iter()
        .map(|s| (s.path.as_str(), &s.reason))
        .collect();
    let reason = |p: &str| {
        *skipped
            .get(p)
            .unwrap_or_else(|| panic!("{p} not skipped: {skipped:?}"))
    };
    assert_eq!(reason("outputs/evil.arrow"), &SkipReason::Symlink);
    assert!(matches!(
        reason("outputs/broken.arrow"),
        SkipReason::InvalidArrow(_)
    ));
    assert_eq!(reason("outputs/extra.arrow"), &SkipReason::NotDeclared);
    assert_eq!(reason("files/passwd"), &SkipReason::Symlink);
    assert_eq!(reason("files/h1.txt"), &SkipReason::HardLink);
    assert_eq!(reason("files/h2.txt"), &SkipReason::HardLink);
    assert_eq!(reason("files/pipe"), &SkipReason::NotRegular("a FIFO"));
    assert_eq!(reason("files/.hidden"), &SkipReason::BadName);
    assert_eq!(reason("files/bad name.txt"), &SkipReason::BadName);
    assert_eq!(reason("files/d1/d2/d3/d4/d5"), &SkipReason::TooDeep(4));
    assert_eq!(reason("files/d1/etc"), &SkipReason::Symlink);
    // The accepted output is handed over open and rewound.
    assert_eq!(
        got.outputs[0].bytes,
        fs::metadata(outputs.join("good.arrow")).unwrap().len()
    );
}

#[test]
fn collect_enforces_count_and_size_caps() {
    let dir = tempfile::tempdir().unwrap();
    let caps = ExchangeCaps {
        max_files: 3,
        file_bytes: 10,
        files_total_bytes: 15,
        max_entries: 100,
        ..ExchangeCaps::default()
    };
    let job = prepare_job(dir.path(), &[], "", &[], &caps, Placement::LinkOrCopy).unwrap();
    let files = job.layout.out_files();
    fs::write(
        job.layout.result(),
        r#"{"ok": true, "result": null, "outputs": []}"#,
    )
    .unwrap();
    fs::write(files.join("a.txt"), b"12345").unwrap();
    fs::write(files.join("b.txt"), b"12345678901").unwrap(); // over the per-file cap
    fs::write(files.join("c.txt"), b"12345").unwrap();
    fs::write(files.join("d.txt"), b"1234567").unwrap(); // over the total
    fs::write(files.join("e.txt"), b"1").unwrap();
    fs::write(files.join("f.txt"), b"1").unwrap(); // fourth file
    let got = collect(dir.path(), &caps).unwrap();
    let accepted: Vec<&str> = got.files.iter().map(|f| f.rel.as_str()).collect();
    assert_eq!(accepted, ["a.txt", "c.txt", "e.txt"]);
    let skipped: Vec<(&str, &SkipReason)> = got
        .skipped
        .iter()
        .map(|s| (s.path.as_str(), &s.reason))
        .collect();
    assert_eq!(
        skipped,
        [
            ("files/b.txt", &SkipReason::TooLarge { bytes: 11, cap: 10 }),
            ("files/d.txt", &SkipReason::TotalTooLarge(15)),
            ("files/f.txt", &SkipReason::TooMany(3)),
        ]
    );

    // Entries beyond `max_entries` are not even looked at.
    let caps = ExchangeCaps {
        max_entries: 4,
        ..caps
    };
    let got = collect(dir.path(), &caps).unwrap();
    assert!(
        got.skipped
            .iter()
            .any(|s| s.reason == SkipReason::TooMany(4)),
        "{:?}",
        got.skipped
    );
}

/// A second full install (from pip's cache after the first): two starters race on a home
/// holding a half-built runtime and a dead builder's temp dir.
#[test]
fn concurrent_starters_replace_a_half_built_runtime_once() {
    // The shared runtime first, so pip's cache is warm and the two installs never overlap.
    let shared = runtime();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let home = dir.path().to_path_buf();
    fs::create_dir_all(home.join("python/bin")).unwrap();
    fs::write(home.join("python/bin/python"), b"#!/bin/false\n").unwrap();
    fs::create_dir_all(home.join("python.tmp-999999999/bin")).unwrap();

    let messages: Vec<Vec<String>> = std::thread::scope(|s| {
        let starters: Vec<_> = (0..2)
            .map(|_| {
                let home = &home;
                s.spawn(move || {
                    let seen = Mutex::new(Vec::new());
                    let rt = Runtime::ensure(home, &|m| seen.lock().unwrap().push(m.to_owned()))
                        .unwrap();
                    assert_eq!(rt.versions.packages, shared.versions.packages);
                    assert!(rt.python.starts_with(home.join("python")));
                    seen.into_inner().unwrap()
                })
            })
            .collect();
        starters.into_iter().map(|t| t.join().unwrap()).collect()
    });
    // Exactly one of them built; it said what it was doing.
    let builders: Vec<&Vec<String>> = messages
        .iter()
        .filter(|m| m.iter().any(|l| l.starts_with("creating the venv")))
        .collect();
    assert_eq!(builders.len(), 1, "{messages:?}");
    assert!(
        builders[0]
            .iter()
            .any(|l| l.starts_with("installing pandas, pyarrow")),
        "{messages:?}"
    );

    let names: Vec<String> = fs::read_dir(&home)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().all(|n| n == "python" || n == "python.lock"),
        "{names:?}"
    );
    assert!(matches!(Runtime::check(&home), RuntimeStatus::Ready(_)));
}

#[test]
fn an_operator_managed_interpreter_is_checked_not_provisioned() {
    let shared = runtime();
    let home = tempfile::tempdir().unwrap();
    let spec = RuntimeSpec::Interpreter(shared.python.clone());
    let rt = Runtime::ensure_with(home.path(), &spec, &|_| {}).unwrap();
    assert_eq!(rt.python, shared.python);
    assert_eq!(rt.base_prefix, shared.base_prefix);
    assert_eq!(rt.versions.packages, shared.versions.packages);
    // Nothing was installed under the home.
    assert_eq!(fs::read_dir(home.path()).unwrap().count(), 0);

    let missing = RuntimeSpec::Interpreter(home.path().join("no-such-python"));
    assert!(Runtime::ensure_with(home.path(), &missing, &|_| {}).is_err());
}
