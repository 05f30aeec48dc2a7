//! The warm pool end to end: the real runtime in the real jail, inputs passed by descriptor.

#![expect(
    clippy::disallowed_methods,
    reason = "the tests write input files beside the sandbox, with raw std::fs"
)]

use std::fs::File;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use arrow_array::{ArrayRef, Float64Array, RecordBatch, StringArray};
use arrow_ipc::writer::FileWriter;
use arrow_schema::{DataType, Field, Schema};
use dataref_sandbox::jail::{JobStatus, Limits};
use dataref_sandbox::pool::{PythonJob, PythonRun, PythonSandbox, SandboxSettings};
use dataref_sandbox::runtime::RuntimeSpec;
use dataref_sandbox::runtime::exchange::ExchangeCaps;
use serde_json::json;

/// The same home as the runtime tests, so the runtime is provisioned once.
fn home() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dataref-runtime-home")
}

fn settings(pool_size: usize) -> SandboxSettings {
    SandboxSettings {
        home: home(),
        runtime: RuntimeSpec::Managed { base: None },
        pool_size,
        limits: Limits::default(),
        caps: ExchangeCaps::default(),
        cgroups: Default::default(),
    }
}

fn warm_pool() -> &'static PythonSandbox {
    static POOL: OnceLock<PythonSandbox> = OnceLock::new();
    POOL.get_or_init(|| {
        let pool = PythonSandbox::new(settings(2));
        pool.runtime(&|_| {}).unwrap();
        pool.prewarm();
        pool
    })
}

fn wait_warm(pool: &PythonSandbox, n: usize) {
    let until = Instant::now() + Duration::from_secs(60);
    while pool.warm_count() < n {
        assert!(Instant::now() < until, "the pool never filled");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn table_file(dir: &tempfile::TempDir) -> File {
    let schema = Arc::new(Schema::new(vec![
        Field::new("line", DataType::Utf8, false),
        Field::new("revenue", DataType::Float64, false),
    ]));
    let line: ArrayRef = Arc::new(StringArray::from(vec!["a", "b", "a"]));
    let revenue: ArrayRef = Arc::new(Float64Array::from(vec![1.5, 2.0, 3.0]));
    let batch = RecordBatch::try_new(Arc::clone(&schema), vec![line, revenue]).unwrap();
    let path = dir.path().join("t.arrow");
    let mut w = FileWriter::try_new(File::create(&path).unwrap(), &schema).unwrap();
    w.write(&batch).unwrap();
    w.finish().unwrap();
    File::open(&path).unwrap()
}

fn job(code: &str) -> PythonJob {
    PythonJob {
        code: code.to_owned(),
        inputs: Vec::new(),
        files: Vec::new(),
        timeout: Duration::from_secs(30),
    }
}

fn run(pool: &PythonSandbox, job: PythonJob) -> PythonRun {
    pool.run(job, &|_| {}, &|| false).unwrap()
}

#[test]
fn a_warm_job_reads_an_input_by_descriptor_and_stores_an_output() {
    let pool = warm_pool();
    wait_warm(pool, 1);
    // A private directory: the sandbox could not open the file by path.
    let dir = tempfile::tempdir().unwrap();
    let mut j = job("g = sales.groupby('line')['revenue'].sum()\n\
         result = {'a': g['a'], 'rows': len(sales)}\n\
         outputs['totals'] = g\n\
         print('hello')");
    j.inputs.push(("sales".to_owned(), table_file(&dir)));
    let ran = run(pool, j);
    assert!(ran.warm);
    assert_eq!(ran.status, JobStatus::Exited(0), "{:?}", ran.stderr);
    let result = ran.result.unwrap().unwrap();
    assert!(result.ok, "{:?}", result.error);
    assert_eq!(result.result, json!({"a": 4.5, "rows": 3}));
    assert_eq!(result.outputs.len(), 1);
    assert_eq!(result.outputs[0].rows, 2);
    assert_eq!(String::from_utf8_lossy(&ran.stdout.bytes), "hello\n");
}
