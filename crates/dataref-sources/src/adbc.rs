//! ADBC sources: one door to the warehouses (Snowflake, BigQuery, Databricks, Flight SQL,
//! PostgreSQL, SQLite, DuckDB, … — each ships an ADBC driver as a shared library).
//!
//! A call runs the driver in a worker process of its own (`dataref adbc-worker`, the same
//! binary): the request (driver, options with the caller's credentials, SQL, bound
//! parameters) goes in on stdin as JSON, never in arguments or the environment; the
//! result comes back on stdout as an Arrow IPC stream, written into the store batch by
//! batch under the source's `max_rows`. The worker loads the driver through the C ABI and
//! imports its result through Arrow's C stream interface (`adbc/driver.rs`), so there is one
//! arrow in the tree and a driver's crash, leak or hang in C ends only its own process.
//! Cancellation and the deadline kill the worker. Its environment is cleared but for
//! `PATH`, `HOME`, `TMPDIR` and `LANG`.
//!
//! Each principal reads under its own credentials: `[principals.NAME.adbc.SOURCE]` options
//! (a `username` and `password`, a `uri`, a token) are laid over the source's `options`.
//! The connection asks for ADBC's `adbc.connection.readonly` where the driver has it; the
//! credentials' grants in the database decide what is read.

mod driver;

use std::collections::BTreeMap;
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow_array::{
    ArrayRef, Float64Array, Int64Array, RecordBatch, RecordBatchReader, StringArray,
};
use dataref_config::env::{ExpandError, expand};
use dataref_protocol::Principal;
use dataref_store::{ArtifactStore, Lineage, TableWriter};
use serde_json::{Map, Value, json};

use crate::error::ConnectProblem;
use crate::{FetchRequest, Fetched, ParamValue, SourceError, SqlPolicy};

/// The line the worker writes to stderr before it exits with an error.
const ERROR_PREFIX: &str = "dataref-adbc-error: ";
/// How often a running call asks whether it was cancelled.
const POLL: Duration = Duration::from_millis(20);
/// How long a worker may take to exit after its result before it is killed.
const REAP_GRACE: Duration = Duration::from_secs(5);
/// Bytes of the worker's stderr kept for a message.
const STDERR_KEEP: usize = 16 * 1024;

/// How a named query's `:name` placeholders are written for the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placeholders {
    /// `?` (SQLite, Snowflake, Flight SQL, DuckDB, BigQuery's positional form).
    Question,
    /// `$1`, `$2`, … (PostgreSQL).
    Dollar,
}

/// An ADBC source: its driver and options (`${NAME}` expanded at each call).
#[derive(Debug, Clone)]
pub struct AdbcSource {
    pub name: String,
    pub driver: PathBuf,
    pub entrypoint: String,
    pub options: BTreeMap<String, String>,
    pub placeholders: Placeholders,
}

impl AdbcSource {
    /// The driver, options and placeholder style of an `adbc` source; None for another kind.
    pub fn of(source: &dataref_config::SourceConfig) -> Option<Self> {
        let dataref_config::SourceKind::Adbc {
            driver,
            entrypoint,
            options,
            dollar_placeholders,
            ..
        } = &source.kind
        else {
            return None;
        };
        Some(Self {
            name: source.name.clone(),
            driver: driver.clone(),
            entrypoint: entrypoint.clone(),
            options: options.clone(),
            placeholders: if *dollar_placeholders {
                Placeholders::Dollar
            } else {
                Placeholders::Question
            },
        })
    }
}

/// Whose credentials a call uses: the principal's own options laid over the source's.
#[derive(Clone, Default)]
pub struct AdbcLogin {
    pub principal: String,
    pub options: BTreeMap<String, String>,
}

impl std::fmt::Debug for AdbcLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the values: they hold passwords and tokens.
        f.debug_struct("AdbcLogin")
            .field("principal", &self.principal)
            .field("options", &self.options.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// Runs `req` through the driver of `source` in a worker process (`worker` is the
/// `dataref` binary) and streams the result into a new table artifact owned by `owner`.
///
/// Blocking: call it from a blocking thread.
#[expect(
    clippy::too_many_arguments,
    reason = "the producer contract, as for the other sources"
)]
pub fn fetch(
    worker: &Path,
    source: &AdbcSource,
    login: &AdbcLogin,
    req: &FetchRequest<'_>,
    store: &dyn ArtifactStore,
    owner: &Principal,
    lineage: Lineage,
    progress: &(dyn Fn(u64) + Sync),
    is_cancelled: &(dyn Fn() -> bool + Sync),
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Fetched, SourceError> {
    let deadline = Instant::now() + req.source.timeout;
    let (sql, params) = match req.policy {
        SqlPolicy::Configured => {
            let (sql, names) = match source.placeholders {
                Placeholders::Question => crate::mysql::positional(req.sql, false),
                Placeholders::Dollar => {
                    let n = crate::postgres::number_params(req.sql);
                    (n.sql, n.names)
                }
            };
            let values = req.bind(&names, param_json)?;
            (sql, values)
        }
        SqlPolicy::Generic => (req.sql.to_owned(), Vec::new()),
    };
    let request = request(source, login, Some(&sql), params, env)?;
    let secrets = secrets_of(&request);
    let run = Worker::start(worker, source, &request)?;
    run.read_into(req, store, owner, lineage, progress, is_cancelled, deadline)
        .map_err(|e| hide(e, &secrets))
}

/// The error with the request's option values hidden from its message.
fn hide(e: SourceError, secrets: &[String]) -> SourceError {
    match e {
        SourceError::Connect {
            source_name,
            message,
            problem,
        } => SourceError::Connect {
            source_name,
            message: redact(&message, secrets),
            problem,
        },
        SourceError::Adbc {
            status,
            message,
            sqlstate,
        } => SourceError::Adbc {
            status,
            message: redact(&message, secrets),
            sqlstate,
        },
        other => other,
    }
}

/// Loads the driver and connects as `login`, running nothing: `dataref doctor`.
pub fn probe(
    worker: &Path,
    source: &AdbcSource,
    login: &AdbcLogin,
    env: &dyn Fn(&str) -> Option<String>,
    timeout: Duration,
) -> Result<(), SourceError> {
    let request = request(source, login, None, Vec::new(), env)?;
    let secrets = secrets_of(&request);
    let run = Worker::start(worker, source, &request)?;
    run.finish(Instant::now() + timeout, &|| false)
        .map_err(|e| hide(e, &secrets))
}

fn param_json(v: &ParamValue) -> Value {
    match v {
        ParamValue::Null => Value::Null,
        ParamValue::Integer(i) => json!({ "int": i }),
        ParamValue::Real(r) => json!({ "real": r }),
        ParamValue::Text(s) => json!({ "text": s }),
    }
}

fn request(
    source: &AdbcSource,
    login: &AdbcLogin,
    sql: Option<&str>,
    params: Vec<Value>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Value, SourceError> {
    let mut options = Map::new();
    for (k, v) in source.options.iter().chain(&login.options) {
        let v = expand(v, env).map_err(|e| {
            let (message, problem) = match e {
                ExpandError::Unset(name) => (
                    format!("`${{{name}}}` in option `{k}` is not set"),
                    ConnectProblem::Env(name),
                ),
                ExpandError::Malformed(m) => (format!("option `{k}`: {m}"), ConnectProblem::BadUrl),
            };
            SourceError::Connect {
                source_name: source.name.clone(),
                message,
                problem,
            }
        })?;
        options.insert(k.clone(), Value::String(v));
    }
    Ok(json!({
        "driver": source.driver,
        "entrypoint": source.entrypoint,
        "database": options,
        "sql": sql,
        "params": params,
    }))
}

/// A running worker process.
struct Worker {
    child: Arc<Mutex<std::process::Child>>,
    stdout: std::process::ChildStdout,
    stderr: std::thread::JoinHandle<String>,
    source: String,
}

impl Worker {
    fn start(exe: &Path, source: &AdbcSource, request: &Value) -> Result<Self, SourceError> {
        let unavailable = |message: String| SourceError::Connect {
            source_name: source.name.clone(),
            message,
            problem: ConnectProblem::Other,
        };
        let mut cmd = Command::new(exe);
        cmd.arg("adbc-worker")
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for k in ["PATH", "HOME", "TMPDIR", "LANG"] {
            if let Some(v) = dataref_config::env::process(k) {
                cmd.env(k, v);
            }
        }
        let mut child = cmd.spawn().map_err(|e| {
            unavailable(format!(
                "cannot start the ADBC worker `{}`: {e}",
                exe.display()
            ))
        })?;
        let (Some(mut stdin), Some(stdout), Some(mut stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(unavailable("the ADBC worker has no pipes".into()));
        };
        let body = request.to_string();
        let written = stdin.write_all(body.as_bytes());
        drop(stdin);
        let stderr = std::thread::spawn(move || {
            let mut kept = Vec::new();
            let mut buf = [0u8; 8192];
            while let Ok(n) = stderr.read(&mut buf) {
                if n == 0 {
                    break;
                }
                kept.extend_from_slice(&buf[..n]);
                if kept.len() > STDERR_KEEP {
                    let cut = kept.len() - STDERR_KEEP;
                    kept.drain(..cut);
                }
            }
            String::from_utf8_lossy(&kept).into_owned()
        });
        let w = Self {
            child: Arc::new(Mutex::new(child)),
            stdout,
            stderr,
            source: source.name.clone(),
        };
        if let Err(e) = written {
            // The worker ended before reading: its stderr says why.
            let err = w.finish(Instant::now() + Duration::from_secs(10), &|| false);
            return Err(err.err().unwrap_or_else(|| {
                unavailable(format!("cannot send the request to the ADBC worker: {e}"))
            }));
        }
        Ok(w)
    }

    /// Reads the result stream into a new table; kills the worker on cancellation, at the
    /// deadline, or past `max_rows`.
    #[expect(clippy::too_many_arguments, reason = "one call's state, passed once")]
    fn read_into(
        self,
        req: &FetchRequest<'_>,
        store: &dyn ArtifactStore,
        owner: &Principal,
        lineage: Lineage,
        progress: &(dyn Fn(u64) + Sync),
        is_cancelled: &(dyn Fn() -> bool + Sync),
        deadline: Instant,
    ) -> Result<Fetched, SourceError> {
        let Self {
            child,
            stdout,
            stderr,
            source,
        } = self;
        let stop = AtomicU8::new(0);
        let done = AtomicBool::new(false);
        let _reaped = Reaper(&child);
        let result = std::thread::scope(|scope| {
            scope.spawn(|| watch(&child, &stop, &done, is_cancelled, deadline));
            let read = read_stream(stdout, req, store, owner, lineage, progress);
            if read.is_err() {
                kill(&child);
            }
            done.store(true, Ordering::Relaxed);
            read
        });
        // A stopped call stores nothing: the unfinished writer is dropped, not finished.
        let status = reap(&child);
        let said = stderr.join().unwrap_or_default();
        match stop.load(Ordering::Relaxed) {
            1 => return Err(SourceError::Cancelled),
            2 => {
                return Err(SourceError::Timeout {
                    after: req.source.timeout,
                });
            }
            _ => {}
        }
        if let Some(e) = worker_error(&said) {
            return Err(e);
        }
        match (result, status) {
            (Ok(writer), Some(s)) if s.success() => Ok(Fetched {
                meta: writer.finish()?,
                notes: Vec::new(),
            }),
            (Err(e @ (SourceError::TooManyRows { .. } | SourceError::Store(_))), _) => Err(e),
            (_, status) => Err(SourceError::Connect {
                source_name: source,
                message: format!(
                    "the ADBC worker ended ({}): {}",
                    status.map_or("killed".into(), |s| s.to_string()),
                    last_lines(&said)
                ),
                problem: ConnectProblem::Other,
            }),
        }
    }

    /// Waits for a worker that sends no rows (the probe).
    fn finish(
        self,
        deadline: Instant,
        is_cancelled: &(dyn Fn() -> bool + Sync),
    ) -> Result<(), SourceError> {
        let Self {
            child,
            mut stdout,
            stderr,
            source,
        } = self;
        let stop = AtomicU8::new(0);
        let done = AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| watch(&child, &stop, &done, is_cancelled, deadline));
            let _ = std::io::copy(&mut stdout, &mut std::io::sink());
            done.store(true, Ordering::Relaxed);
        });
        let status = reap(&child);
        let said = stderr.join().unwrap_or_default();
        if stop.load(Ordering::Relaxed) != 0 {
            return Err(SourceError::Connect {
                source_name: source,
                message: "the driver did not connect in time".into(),
                problem: ConnectProblem::Unreachable,
            });
        }
        if let Some(e) = worker_error(&said) {
            return Err(e);
        }
        match status {
            Some(s) if s.success() => Ok(()),
            status => Err(SourceError::Connect {
                source_name: source,
                message: format!(
                    "the ADBC worker ended ({}): {}",
                    status.map_or("killed".into(), |s| s.to_string()),
                    last_lines(&said)
                ),
                problem: ConnectProblem::Other,
            }),
        }
    }
}

/// Waits for the worker to exit after its result (a driver closing its session), at most
/// [`REAP_GRACE`], then kills it: no worker outlives its call.
fn reap(child: &Mutex<std::process::Child>) -> Option<std::process::ExitStatus> {
    let until = Instant::now() + REAP_GRACE;
    loop {
        let mut c = child.lock().ok()?;
        match c.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < until => {}
            _ => {
                let _ = c.kill();
                return c.wait().ok();
            }
        }
        drop(c);
        std::thread::sleep(POLL);
    }
}

fn kill(child: &Mutex<std::process::Child>) {
    if let Ok(mut c) = child.lock() {
        let _ = c.kill();
    }
}

/// Kills and reaps the worker when dropped: also when a panic unwinds past the call.
struct Reaper<'c>(&'c Mutex<std::process::Child>);

impl Drop for Reaper<'_> {
    fn drop(&mut self) {
        if let Ok(mut c) = self.0.lock()
            && matches!(c.try_wait(), Ok(None))
        {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Kills the worker on cancellation (`stop` = 1) or at the deadline (`stop` = 2).
fn watch(
    child: &Mutex<std::process::Child>,
    stop: &AtomicU8,
    done: &AtomicBool,
    is_cancelled: &(dyn Fn() -> bool + Sync),
    deadline: Instant,
) {
    while !done.load(Ordering::Relaxed) {
        let why = if is_cancelled() {
            1
        } else if Instant::now() >= deadline {
            2
        } else {
            std::thread::sleep(POLL);
            continue;
        };
        stop.store(why, Ordering::Relaxed);
        kill(child);
        return;
    }
}

fn read_stream(
    stdout: std::process::ChildStdout,
    req: &FetchRequest<'_>,
    store: &dyn ArtifactStore,
    owner: &Principal,
    lineage: Lineage,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Box<dyn TableWriter>, SourceError> {
    let broken = |e: arrow_schema::ArrowError| SourceError::Connect {
        source_name: req.source.name.clone(),
        message: format!("the ADBC worker's result stream: {e}"),
        problem: ConnectProblem::Other,
    };
    let reader =
        arrow_ipc::reader::StreamReader::try_new(BufReader::new(stdout), None).map_err(broken)?;
    let schema = reader.schema();
    let mut writer = store.create_table(owner, schema, lineage)?;
    let mut total: u64 = 0;
    for batch in reader {
        let batch = batch.map_err(broken)?;
        total += batch.num_rows() as u64;
        if total > req.source.max_rows {
            return Err(SourceError::TooManyRows {
                max_rows: req.source.max_rows,
            });
        }
        writer.write(&batch)?;
        progress(total);
    }
    Ok(writer)
}

/// The worker's own error line, as the error the caller gets.
fn worker_error(stderr: &str) -> Option<SourceError> {
    let line = stderr
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(ERROR_PREFIX))?;
    let v: Value = serde_json::from_str(line).ok()?;
    let text = |k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    Some(SourceError::Adbc {
        status: text("status"),
        message: text("message"),
        sqlstate: text("sqlstate"),
    })
}

fn last_lines(s: &str) -> String {
    let lines: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = &lines[lines.len().saturating_sub(3)..];
    if tail.is_empty() {
        "no message".into()
    } else {
        tail.join(" / ")
    }
}

/// The worker's main: reads one request on `input`, writes the result as an Arrow IPC
/// stream on `output`. On an error, writes a marked JSON line (`dataref-adbc-error: {…}`) to `errors`
/// and returns false.
pub fn worker(input: impl Read, output: impl Write, mut errors: impl Write) -> bool {
    match worker_run(input, output) {
        Ok(()) => true,
        Err(e) => {
            let line = json!({
                "status": e.status_name(),
                "message": e.message,
                "sqlstate": e.sqlstate,
            });
            let _ = writeln!(errors, "{ERROR_PREFIX}{line}");
            false
        }
    }
}

/// `text` with every option value of at least 4 characters replaced by `***`: drivers echo
/// an option's value in some errors ("Unknown database option password=…").
fn redact(text: &str, secrets: &[String]) -> String {
    let mut out = text.to_owned();
    let mut secrets: Vec<&String> = secrets.iter().filter(|s| s.chars().count() >= 4).collect();
    // Longest first, so a secret that contains another is replaced whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    for s in secrets {
        out = out.replace(s.as_str(), "***");
    }
    out
}

/// The option values of a request (what [`redact`] hides).
fn secrets_of(request: &Value) -> Vec<String> {
    request
        .get("database")
        .and_then(Value::as_object)
        .map(|o| {
            o.values()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn worker_run(input: impl Read, output: impl Write) -> Result<(), driver::DriverError> {
    let ours = |message: String| driver::DriverError {
        status: 1,
        message,
        sqlstate: String::new(),
    };
    let request: Value =
        serde_json::from_reader(input).map_err(|e| ours(format!("the worker's request: {e}")))?;
    let secrets = secrets_of(&request);
    worker_request(&request, output).map_err(|e| driver::DriverError {
        message: redact(&e.message, &secrets),
        ..e
    })
}

fn worker_request(request: &Value, output: impl Write) -> Result<(), driver::DriverError> {
    let ours = |message: String| driver::DriverError {
        status: 1,
        message,
        sqlstate: String::new(),
    };
    let text = |k: &str| request.get(k).and_then(Value::as_str).map(str::to_owned);
    let library = text("driver").ok_or_else(|| ours("no driver in the request".into()))?;
    let entrypoint = text("entrypoint").unwrap_or_else(|| "AdbcDriverInit".into());
    let options: BTreeMap<String, String> = request
        .get("database")
        .and_then(Value::as_object)
        .map(|o| {
            o.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default();
    let mut d = driver::Driver::open(Path::new(&library), &entrypoint, &options, &BTreeMap::new())?;
    // A read-only connection where the driver has the option; and a transaction, never
    // committed (the connection is rolled back when it closes), where it has that.
    d.try_option("adbc.connection.readonly", "true")?;
    d.try_option("adbc.connection.autocommit", "false")?;
    let Some(sql) = text("sql") else {
        return Ok(());
    };
    let params = request
        .get("params")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let batch = if params.is_empty() {
        None
    } else {
        Some(param_batch(&params).map_err(|e| ours(format!("the parameters: {e}")))?)
    };
    let reader = d.query(&sql, batch)?;
    let schema = reader.schema();
    let mut w = arrow_ipc::writer::StreamWriter::try_new(output, &schema)
        .map_err(|e| ours(format!("writing the result: {e}")))?;
    for batch in reader {
        let batch = batch.map_err(|e| ours(format!("the driver's result: {e}")))?;
        w.write(&batch)
            .map_err(|e| ours(format!("writing the result: {e}")))?;
    }
    w.finish()
        .map_err(|e| ours(format!("writing the result: {e}")))?;
    w.into_inner()
        .and_then(|mut out| out.flush().map_err(Into::into))
        .map_err(|e| ours(format!("writing the result: {e}")))?;
    Ok(())
}

/// One row of parameters, `p1…pn`, each typed by its value.
fn param_batch(params: &[Value]) -> Result<RecordBatch, arrow_schema::ArrowError> {
    let columns: Vec<(String, ArrayRef)> = params
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let array: ArrayRef = if let Some(n) = p.get("int").and_then(Value::as_i64) {
                Arc::new(Int64Array::from(vec![n]))
            } else if let Some(r) = p.get("real").and_then(Value::as_f64) {
                Arc::new(Float64Array::from(vec![r]))
            } else if let Some(s) = p.get("text").and_then(Value::as_str) {
                Arc::new(StringArray::from(vec![s]))
            } else {
                Arc::new(StringArray::from(vec![None::<&str>]))
            };
            (format!("p{}", i + 1), array)
        })
        .collect();
    RecordBatch::try_from_iter(columns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn option_values_are_hidden_from_messages() {
        let secrets = vec!["s3cret-pw".to_owned(), "ANNA".to_owned(), "on".to_owned()];
        assert_eq!(
            redact(
                "Unknown database option password=s3cret-pw for ANNA (on)",
                &secrets
            ),
            "Unknown database option password=*** for *** (on)"
        );
    }

    #[test]
    fn parameters_are_one_typed_row() {
        let b = param_batch(&[json!({"int": 3}), json!({"text": "x"}), Value::Null]).unwrap();
        assert_eq!(b.num_rows(), 1);
        assert_eq!(
            b.schema().field(0).data_type(),
            &arrow_schema::DataType::Int64
        );
        assert_eq!(
            b.schema().field(2).data_type(),
            &arrow_schema::DataType::Utf8
        );
    }

    #[test]
    fn the_workers_error_line_becomes_the_callers_error() {
        let e = worker_error(
            "driver noise\ndataref-adbc-error: {\"status\":\"UNAUTHENTICATED\",\"message\":\"bad password\",\"sqlstate\":\"28P01\"}\n",
        );
        assert!(
            matches!(&e, Some(SourceError::Adbc { status, sqlstate, .. }) if status == "UNAUTHENTICATED" && sqlstate == "28P01"),
            "{e:?}"
        );
    }

    #[test]
    fn a_bad_request_is_an_error_line() {
        let mut out = Vec::new();
        let mut err = Vec::new();
        assert!(!worker(
            &b"{\"driver\": \"/nonexistent.so\"}"[..],
            &mut out,
            &mut err
        ));
        let said = String::from_utf8(err).unwrap();
        assert!(said.starts_with(ERROR_PREFIX), "{said}");
        assert!(said.contains("cannot load the driver"), "{said}");
    }
}
