//! `run_python(code | code_file, inputs, files?, timeout_s?)`: pandas on dataRefs in the
//! sandbox.
//!
//! The rows never pass through the model: inputs go to the sandbox as descriptors of the
//! stored Arrow files, DataFrames stored in `outputs` come back as new artifacts of the
//! caller's (validated and written through the store, so its caps apply), files written
//! under `out/files/` land in the caller's workspace. The model gets a small JSON `result`,
//! head and tail of stdout/stderr, and a description of each output.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dataref_config::{Config, PythonConfig};
use dataref_protocol::{DataRef, Description, ToolSpec};
use dataref_sandbox::jail::{CgroupPolicy, CpuLimit, JobLimits, JobStatus};
use dataref_sandbox::pool::{PythonJob, PythonRun, PythonSandbox, SandboxError, SandboxSettings};
use dataref_sandbox::runtime::RuntimeSpec;
use dataref_sandbox::runtime::exchange::{
    CollectedFile, CollectedOutput, ExchangeCaps, ExchangeError, InputName, PythonError, SkipReason,
};
use dataref_store::{ArtifactStore, Lineage, SampleOptions, UntrustedIpc, describe};
use dataref_tool::TypedTool;
use dataref_tool::{RunContext, ToolError, ToolOutput};
use dataref_workspace::{Overwrite, Workspace};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::replay::{Replay, one_line, py_ident, py_str, scan_refs, shape};
use crate::support::{blocking, output, spec_for};
use dataref_protocol::truncate_chars;
use std::fmt::Write as _;

/// stdout and stderr each come back cut to this many bytes (head and tail).
pub const STREAM_SHOWN_BYTES: usize = 2048;
/// What a job may print before it is stopped; the whole text is kept in the workspace.
const STREAM_CAP_BYTES: usize = 1 << 20;
/// Sample rows in the description of each output: none, the code that made it knows its
/// shape, and `result` is where it shows values (`columns` still names and types them).
const OUTPUT_SAMPLE_ROWS: usize = 0;
/// Workspace directory for the whole stdout/stderr of runs whose output was cut.
pub const RUNS_DIR: &str = ".runs";
/// The largest `code_file` a run takes.
const MAX_CODE_FILE_BYTES: u64 = 1 << 20;

/// Arguments of `run_python`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunPythonArgs {
    /// Python source (or `code_file`); `pd` and `np` are imported.
    #[serde(default)]
    #[schemars(length(min = 1, max = 200_000))]
    code: Option<String>,
    /// A workspace `.py` file to run instead of `code`: keep long scripts there.
    #[serde(default)]
    #[schemars(length(min = 1, max = 4096))]
    code_file: Option<String>,
    /// Name → dataRef, e.g. `{"sales": "data_…"}`.
    #[serde(default)]
    inputs: BTreeMap<String, DataRef>,
    /// Workspace files to read, at `in/files/<path>`.
    #[serde(default)]
    #[schemars(length(max = 64))]
    files: Vec<String>,
    /// Seconds before the job is stopped.
    #[serde(default)]
    #[schemars(range(min = 1, max = 3600))]
    timeout_s: Option<u64>,
}

/// One stream, cut to its head and tail when long.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StreamText {
    pub text: String,
    /// Bytes left out of `text` (present only when it was cut).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub omitted_bytes: Option<u64>,
    /// Workspace file with the whole stream (present only when `text` was cut).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub full_text: Option<String>,
}

/// An exception or a limit that ended the code.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct PythonErrorOut {
    /// Exception type (`KeyError`, …) or `Timeout`, `MemoryLimit`, `OutputLimit`, `Killed`.
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
    /// Lines of the submitted code, innermost last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub traceback: Vec<TracebackLine>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct TracebackLine {
    pub line: u32,
    pub code: String,
}

/// A file the code wrote under `out/files/`, now in the workspace.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct FileOut {
    pub path: String,
    pub bytes: u64,
    /// A file of that name was there and is replaced.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replaced: bool,
}

/// Something under `out/` that was not taken, and why.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct SkippedOut {
    pub path: String,
    pub reason: String,
}

/// What `run_python` returns.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RunPythonResult {
    /// Present, and false, only when the code failed (`error` says why); a run that
    /// worked has no `ok`.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub ok: bool,
    /// The value of `result` (null when the code failed).
    pub result: Value,
    /// What the code printed; absent when it printed nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout: Option<StreamText>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<StreamText>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<PythonErrorOut>,
    /// Output name → the stored table (a new dataRef): its rows and columns, no sample
    /// (`describe_data` for its statistics).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub outputs: BTreeMap<String, Description>,
    /// Outputs stored too but not described here, to keep the result short: name →
    /// dataRef (`describe_data` describes one).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub more_outputs: BTreeMap<String, DataRef>,
    /// The first files written (all of them are in the workspace).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<FileOut>,
    /// And this many more files, saved to the workspace but not listed (`list_files`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub more_files: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<SkippedOut>,
    /// And this many more things under `out/` not taken, not listed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub more_skipped: u64,
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

pub struct RunPythonTool {
    spec: ToolSpec,
    sandbox: Arc<PythonSandbox>,
    config: PythonConfig,
}

/// The sandbox settings `config` asks for.
pub fn sandbox_settings(config: &Config) -> SandboxSettings {
    let p = &config.python;
    let runtime = match &p.interpreter {
        Some(python) => RuntimeSpec::Interpreter(python.clone()),
        None => RuntimeSpec::Managed {
            base: p.base_interpreter.clone(),
        },
    };
    SandboxSettings {
        home: config.home.clone(),
        runtime,
        pool_size: p.pool_size,
        limits: JobLimits {
            memory_bytes: p.memory_bytes,
            pids: p.max_processes,
            cpu: CpuLimit::Cores(p.cpus),
            wall_clock: p.timeout,
            stdout_bytes: STREAM_CAP_BYTES,
            stderr_bytes: STREAM_CAP_BYTES,
            out_bytes: p.out_bytes,
            ..JobLimits::default()
        },
        max_concurrent: p.max_concurrent,
        caps: ExchangeCaps {
            result_bytes: p.result_bytes,
            ..ExchangeCaps::default()
        },
        cgroups: if p.require_cgroups {
            CgroupPolicy::Required
        } else {
            CgroupPolicy::RlimitFallback
        },
    }
}

impl RunPythonTool {
    pub fn new(sandbox: Arc<PythonSandbox>, config: PythonConfig) -> Self {
        let description = format!(
            "Compute on stored tables with Python 3 (pandas {pandas}, numpy, pyarrow, \
             matplotlib) in a sandbox without network; do the arithmetic here. `inputs` maps \
             names to dataRefs, each a DataFrame. Set `result` to small JSON (at most {cap} \
             bytes); `outputs[\"name\"] = df` stores a new dataRef; `out/files/` goes to the \
             workspace. Runs share nothing. Timeout {timeout} s.",
            pandas = dataref_sandbox::runtime::PINNED
                .iter()
                .find(|p| p.name == "pandas")
                .map_or("", |p| p.version),
            cap = config.result_bytes,
            timeout = config.timeout.as_secs(),
        );
        Self {
            spec: spec_for::<RunPythonArgs, RunPythonResult>(
                "run_python",
                &description,
                false,
                false,
            ),
            sandbox,
            config,
        }
    }
}

#[async_trait]
impl TypedTool for RunPythonTool {
    /// A synopsis made for the model: never spilled by default.
    fn result_is_synopsis(&self) -> bool {
        true
    }

    type Args = RunPythonArgs;

    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, mut a: RunPythonArgs, ctx: &RunContext) -> Result<ToolOutput, ToolError> {
        let source = match (a.code.take(), a.code_file.clone()) {
            (Some(code), None) => CodeSource::Inline(code),
            (None, Some(path)) => CodeSource::File(path),
            (None, None) => {
                return Err(ToolError::respond(
                    "`run_python` needs code to run: give `code` or `code_file`",
                    Some(
                        "pass the source as `code`, or the workspace path of a `.py` file as \
                         `code_file`"
                            .into(),
                    ),
                ));
            }
            (Some(_), Some(_)) => {
                return Err(ToolError::respond(
                    "give either `code` or `code_file`, not both",
                    Some(
                        "`code_file` runs the file as it is in the workspace: drop `code`, or \
                         drop `code_file` to run `code`"
                            .into(),
                    ),
                ));
            }
        };
        let timeout = match a.timeout_s {
            None => self.config.timeout,
            Some(s) => {
                let asked = Duration::from_secs(s);
                if asked > self.config.max_timeout {
                    return Err(ToolError::respond(
                        format!(
                            "timeout_s {s} is over the limit of {} s",
                            self.config.max_timeout.as_secs()
                        ),
                        Some("work on fewer rows at a time, or ask for less".into()),
                    ));
                }
                asked
            }
        };
        let sandbox = Arc::clone(&self.sandbox);
        let ctx = ctx.clone();
        blocking("run_python", move || {
            run_blocking(&sandbox, a, source, timeout, &ctx)
        })
        .await
    }
}

/// Where a run's code comes from: exactly one of `code` and `code_file`.
enum CodeSource {
    Inline(String),
    /// A workspace path, not yet resolved.
    File(String),
}

fn run_blocking(
    sandbox: &PythonSandbox,
    a: RunPythonArgs,
    source: CodeSource,
    timeout: Duration,
    ctx: &RunContext,
) -> Result<ToolOutput, ToolError> {
    // Names first: a bad one is the model's to fix, and must not cost a warm sandbox.
    for name in a.inputs.keys() {
        InputName::parse(name).map_err(input_name_error)?;
    }
    let code = match source {
        CodeSource::Inline(code) => code,
        CodeSource::File(requested) => read_code_file(&ctx.workspace, &requested)?,
    };
    // Inputs: the caller's own live tables only (the store checks the owner).
    let mut receipt = crate::receipt::started(ctx);
    let mut inputs = Vec::with_capacity(a.inputs.len());
    for (name, data_ref) in &a.inputs {
        // The owner check and an open: the rows are mapped in the sandbox, not here.
        let file = ctx.store.open_file(&ctx.principal, data_ref)?;
        let meta = ctx.store.meta(&ctx.principal, data_ref)?;
        receipt.parents.push(crate::receipt::parent(name, &meta));
        inputs.push((name.clone(), file));
    }
    let mut files = Vec::with_capacity(a.files.len());
    for requested in &a.files {
        let path = ctx.workspace.resolve(requested)?;
        let file = ctx.workspace.open_read(&path)?;
        files.push((path.as_str().to_owned(), file));
    }
    let job = PythonJob {
        code: code.clone(),
        inputs,
        files,
        timeout,
    };
    let progress = ctx.progress.clone();
    // MCP progress must grow with every notification: count the steps (installing the
    // runtime on first use is the only long one).
    let steps = AtomicU64::new(0);
    let report = move |step: &str| {
        let n = steps.fetch_add(1, Ordering::Relaxed) + 1;
        progress.report(n as f64, None, Some(step.to_owned()));
    };
    let cancel = ctx.cancel.clone();
    let run = match sandbox.run(job, &report, &|| cancel.is_cancelled()) {
        Ok(run) => run,
        Err(SandboxError::Cancelled) => {
            return Err(ToolError::respond("the run was cancelled", None));
        }
        Err(e) => return Err(sandbox_error(e)),
    };
    if run.status == JobStatus::Cancelled {
        return Err(ToolError::respond("the run was cancelled", None));
    }
    // The code as it ran: a `code_file` may change after this run.
    let mut recipe = json!({"code": code, "inputs": a.inputs, "files": a.files});
    if let Some(path) = &a.code_file {
        recipe["code_file"] = json!(path);
    }
    receipt.code = Some(code);
    // The runtime the run used (provisioned by now, so this only reads it).
    if let Ok(runtime) = sandbox.runtime(&|_| {}) {
        receipt
            .engines
            .insert("python".into(), runtime.versions.python.clone());
        for package in ["pandas", "pyarrow", "numpy"] {
            if let Some(v) = runtime.versions.packages.get(package) {
                receipt.engines.insert(package.into(), v.clone());
            }
        }
    }
    let lineage = Lineage::new("run_python", recipe).with_receipt(receipt);
    let out_cap = sandbox.settings().limits.out_bytes;
    let mut result = finish(run, ctx, lineage, timeout, out_cap)?;
    bound_lists(&mut result, ctx.limits.max_result_chars);
    output(result)
}

/// Files and skipped entries listed in a result, at most.
const LISTED: usize = 50;

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Keeps the result's lists short whatever the code did (10,000 files, 16 outputs of
/// 1,000 columns): at most [`LISTED`] files and skipped entries, each list within an
/// eighth of `max_chars`, the rest counted; outputs described while their descriptions
/// fit half of `max_chars` (the first always), the others listed by dataRef only.
fn bound_lists(out: &mut RunPythonResult, max_chars: usize) {
    let list_budget = max_chars / 8;
    out.more_files += keep_within(&mut out.files, list_budget, json_chars);
    out.more_skipped += keep_within(&mut out.skipped, list_budget, json_chars);
    let mut used = 0usize;
    let described = std::mem::take(&mut out.outputs);
    for (name, description) in described {
        let chars = json_chars(&description);
        if out.outputs.is_empty() || used.saturating_add(chars) <= max_chars / 2 {
            used += chars;
            out.outputs.insert(name, description);
        } else {
            out.more_outputs.insert(name, description.data_ref);
        }
    }
}

/// Keeps the first entries of `list` (at most [`LISTED`], their JSON within `budget`
/// characters); returns how many were dropped.
fn keep_within<T>(list: &mut Vec<T>, budget: usize, chars: impl Fn(&T) -> usize) -> u64 {
    let mut used = 0usize;
    let mut keep = 0;
    for item in list.iter().take(LISTED) {
        used = used.saturating_add(chars(item) + 1);
        if used > budget {
            break;
        }
        keep += 1;
    }
    let dropped = list.len() - keep;
    list.truncate(keep);
    dropped as u64
}

/// Characters of a value's JSON.
fn json_chars<T: Serialize>(value: &T) -> usize {
    serde_json::to_string(value).map_or(usize::MAX / 4, |s| s.chars().count())
}

/// The source of a `code_file`: a regular file beneath the workspace root, UTF-8, at most
/// [`MAX_CODE_FILE_BYTES`].
fn read_code_file(workspace: &Workspace, requested: &str) -> Result<String, ToolError> {
    let path = workspace.resolve(requested)?;
    let file = workspace.open_read(&path)?;
    let too_big = |size: u64| {
        ToolError::respond(
            format!(
                "`{path}` is {size} bytes; a `code_file` may be at most {MAX_CODE_FILE_BYTES} \
                 bytes (1 MiB)"
            ),
            Some(
                "keep data out of the script: put it in a file passed with `files` and read it \
                 from `in/files/<path>`"
                    .into(),
            ),
        )
    };
    let bytes = dataref_tool::read_capped(file, path.as_str(), MAX_CODE_FILE_BYTES, too_big)?;
    let code = String::from_utf8(bytes).map_err(|e| {
        ToolError::respond(
            format!(
                "`{path}` is not UTF-8 text (invalid byte at offset {})",
                e.utf8_error().valid_up_to()
            ),
            Some("save the script as UTF-8".into()),
        )
    })?;
    // An editor's byte order mark is not Python; dropping it keeps every line number.
    let code = match code.strip_prefix('\u{feff}') {
        Some(rest) => rest.to_owned(),
        None => code,
    };
    if code.trim().is_empty() {
        return Err(ToolError::respond(
            format!("`{path}` holds no code"),
            Some("write the script into it first, or pass `code`".into()),
        ));
    }
    Ok(code)
}

fn sandbox_error(e: SandboxError) -> ToolError {
    if e.is_caller_error() {
        return ToolError::respond(e.to_string(), e.hint());
    }
    tracing::error!(error = %e, "run_python could not run the job");
    // Fail closed, and say why: the operator has to act, the model can tell the person.
    let mut message = format!("run_python cannot run code here: {e}");
    message.truncate(1500);
    ToolError::respond(
        message,
        Some(
            e.hint().unwrap_or_else(|| {
                "tell the person; `dataref doctor` shows what is missing".into()
            }),
        ),
    )
}

/// One message and one hint (the exchange error's own text carries a hint line of its own).
fn input_name_error(e: ExchangeError) -> ToolError {
    match e {
        ExchangeError::InputName { name, reason } => ToolError::respond(
            format!("input name `{name}` is not allowed: {reason}"),
            SandboxError::Exchange(ExchangeError::InputName { name, reason }).hint(),
        ),
        other => sandbox_error(other.into()),
    }
}

fn finish(
    run: PythonRun,
    ctx: &RunContext,
    lineage: Lineage,
    timeout: Duration,
    out_cap: u64,
) -> Result<RunPythonResult, ToolError> {
    let run_id = run_id(ctx);
    let stdout = stream(
        &run.stdout.bytes,
        run.stdout.dropped,
        &ctx.workspace,
        &run_id,
        "stdout",
    );
    let stderr = stream(
        &run.stderr.bytes,
        run.stderr.dropped,
        &ctx.workspace,
        &run_id,
        "stderr",
    );
    // The model has no use for the wall clock; the log keeps it.
    let duration_ms = u64::try_from(run.duration.as_millis()).unwrap_or(u64::MAX);
    tracing::info!(duration_ms, status = ?run.status, "python run");
    let mut out = RunPythonResult {
        ok: false,
        result: Value::Null,
        stdout,
        stderr,
        error: None,
        outputs: BTreeMap::new(),
        more_outputs: BTreeMap::new(),
        files: Vec::new(),
        more_files: 0,
        skipped: Vec::new(),
        more_skipped: 0,
    };
    let limit = |kind: &str, message: String, hint: &str| PythonErrorOut {
        kind: kind.to_owned(),
        message,
        traceback: Vec::new(),
        hint: Some(hint.to_owned()),
    };
    let job = match (run.status, run.result) {
        (JobStatus::TimedOut, _) => {
            out.error = Some(limit(
                "Timeout",
                format!(
                    "the code ran longer than {} s and was stopped",
                    timeout.as_secs()
                ),
                "work on fewer rows (filter in SQL first), vectorise loops, or raise timeout_s",
            ));
            return Ok(out);
        }
        (JobStatus::MemoryLimit, _) => {
            out.error = Some(limit(
                "MemoryLimit",
                "the code used more memory than a run may and was stopped".into(),
                "select fewer columns or rows, or process the table in chunks",
            ));
            return Ok(out);
        }
        (JobStatus::OutputFlood, _) => {
            out.error = Some(limit(
                "OutputLimit",
                format!("the code printed more than {STREAM_CAP_BYTES} bytes and was stopped"),
                "print summaries, not tables; store tables in `outputs`",
            ));
            return Ok(out);
        }
        (JobStatus::OutLimit, _) => {
            out.error = Some(limit(
                "OutputLimit",
                format!(
                    "the run filled out/ up to its cap of {} MiB (outputs and files together; \
                     writes past it failed with \"No space left on device\"), so nothing it \
                     wrote was kept",
                    out_cap >> 20
                ),
                "write fewer or smaller files, or store tables in `outputs` with fewer rows \
                 or columns",
            ));
            return Ok(out);
        }
        (_, Some(Ok(job))) => job,
        (status, other) => {
            let detail = match other {
                Some(Err(e)) => format!(" ({e})"),
                _ => String::new(),
            };
            out.error = Some(limit(
                "Killed",
                format!("the Python process ended abnormally: {status:?}{detail}"),
                "check stderr; a C extension crash or os._exit() ends the run without a result",
            ));
            return Ok(out);
        }
    };
    out.skipped = job
        .skipped
        .iter()
        .map(|s| SkippedOut {
            path: s.path.clone(),
            reason: s.reason.to_string(),
        })
        .collect();
    if !job.ok {
        // Files written before an exception are still the person's (a chart, a partial
        // export); the runner collects them either way.
        for file in job.files {
            out.files.push(save_file(file, &ctx.workspace)?);
        }
        let e = job.error.unwrap_or_else(|| PythonError {
            kind: "RunnerError".into(),
            message: "the run failed without saying why".into(),
            traceback: Vec::new(),
        });
        out.error = Some(PythonErrorOut {
            hint: error_hint(&e.kind),
            kind: e.kind,
            message: e.message,
            traceback: e
                .traceback
                .into_iter()
                .map(|f| TracebackLine {
                    line: f.line,
                    code: f.code,
                })
                .collect(),
        });
        return Ok(out);
    }
    // A declared output the checks refused: the run did not deliver what it said it would.
    let malformed = job.skipped.iter().find_map(|s| match &s.reason {
        SkipReason::InvalidArrow(reason) => Some((s.path.clone(), reason.clone())),
        _ => None,
    });
    if let Some((path, reason)) = malformed {
        for file in job.files {
            out.files.push(save_file(file, &ctx.workspace)?);
        }
        let name = path
            .strip_prefix("outputs/")
            .and_then(|p| p.strip_suffix(".arrow"))
            .unwrap_or(&path);
        let (message, hint) = malformed_text(name, &reason);
        out.error = Some(PythonErrorOut {
            kind: "OutputMalformed".into(),
            message,
            traceback: Vec::new(),
            hint: Some(hint),
        });
        return Ok(out);
    }
    for collected in job.outputs {
        let name = collected.name.clone();
        // Which output of the code this table is: its name.
        let mut lineage = lineage.clone();
        if let Some(recipe) = lineage.args.as_object_mut() {
            recipe.insert("output".into(), serde_json::Value::String(name.clone()));
        }
        if let Some(receipt) = lineage.receipt.as_mut() {
            receipt.output = Some(name.clone());
        }
        let description = store_output(collected, ctx, lineage)?;
        out.outputs.insert(name, description);
    }
    for file in job.files {
        out.files.push(save_file(file, &ctx.workspace)?);
    }
    out.ok = true;
    out.result = job.result;
    Ok(out)
}

fn error_hint(kind: &str) -> Option<String> {
    let hint = match kind {
        "ResultTooLarge" => {
            "keep `result` to a summary; store tables with `outputs[\"name\"] = df`"
        }
        "ResultNotSerializable" => "convert values with float(), str() or .tolist()",
        "KeyError" => "check column names with `list(df.columns)` or `describe_data`",
        "ModuleNotFoundError" => {
            "only the standard library, pandas, numpy, pyarrow, matplotlib, openpyxl, \
             python-docx and python-pptx are installed; there is no network to install more"
        }
        _ => return None,
    };
    Some(hint.to_owned())
}

/// Re-reads an output Arrow file the sandbox wrote (untrusted) and writes it through the
/// store, so the byte cap, the owner's quota and the index apply as to any producer.
fn store_output(
    collected: CollectedOutput,
    ctx: &RunContext,
    lineage: Lineage,
) -> Result<Description, ToolError> {
    let name = collected.name.clone();
    let store: &dyn ArtifactStore = ctx.store.as_ref();
    let malformed = |e: dataref_store::MalformedIpc| malformed_output(&name, e.reason());
    // The structure is checked before the reader sees it, and every reader step runs
    // under `catch_unwind` (`UntrustedIpc`): a hostile file is the model's to fix.
    let table = UntrustedIpc::open(collected.file).map_err(malformed)?;
    let mut writer = store.create_table(&ctx.principal, table.schema(), lineage)?;
    for batch in table.batches().map_err(malformed)? {
        let batch = batch.map_err(malformed)?;
        writer.write(&batch)?;
    }
    let meta = writer.finish()?;
    let table = store
        .map_table(&ctx.principal, &meta.data_ref)?
        .head(OUTPUT_SAMPLE_ROWS)?;
    let mut description = describe(
        &table,
        SampleOptions {
            rows: OUTPUT_SAMPLE_ROWS,
            max_value_chars: 80,
        },
    );
    // The note on a sample of 0 rows is about sources that withhold rows; here no sample
    // is the design.
    if OUTPUT_SAMPLE_ROWS == 0 {
        description.sample_note = None;
    }
    Ok(description)
}

/// An output Arrow file that is not one: the model's code wrote it (or rewrote what the
/// runner wrote), so the model can fix it.
fn malformed_output(name: &str, reason: &str) -> ToolError {
    let (message, hint) = malformed_text(name, reason);
    ToolError::respond(message, Some(hint))
}

fn malformed_text(name: &str, reason: &str) -> (String, String) {
    (
        format!("your output `{name}` is malformed: {reason}"),
        format!(
            "assign a pandas DataFrame with `outputs[\"{name}\"] = df` and let the runner \
             write it; do not write files under `out/outputs/` yourself"
        ),
    )
}

fn save_file(file: CollectedFile, workspace: &Workspace) -> Result<FileOut, ToolError> {
    let replaced = workspace
        .resolve(&file.rel)
        .ok()
        .and_then(|p| workspace.metadata(&p).ok())
        .is_some();
    let mut target = workspace.create_atomic(&file.rel, Overwrite::Replace)?;
    let mut source = file.file;
    std::io::copy(&mut source, &mut target).map_err(|e| {
        match dataref_workspace::WorkspacePathError::write_failed(&file.rel, e) {
            quota @ dataref_workspace::WorkspacePathError::QuotaExceeded { .. } => {
                ToolError::from(quota)
            }
            other => ToolError::Fatal(format!("saving `{}`: {other}", file.rel)),
        }
    })?;
    let path = target.commit()?;
    Ok(FileOut {
        path: path.as_str().to_owned(),
        bytes: file.bytes,
        replaced,
    })
}

/// A name for this run's directory under [`RUNS_DIR`]: time, then a random suffix.
fn run_id(ctx: &RunContext) -> String {
    let stamp = ctx.clock.now().compact();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{stamp}-{}-{n}", std::process::id())
}

/// Head and tail of a stream; when cut, the whole text is written to the workspace (a
/// failure to write it is logged, never fails the run).
fn stream(
    bytes: &[u8],
    dropped: u64,
    workspace: &Workspace,
    run_id: &str,
    name: &str,
) -> Option<StreamText> {
    if bytes.is_empty() && dropped == 0 {
        return None;
    }
    let text = String::from_utf8_lossy(bytes);
    if text.len() <= STREAM_SHOWN_BYTES && dropped == 0 {
        return Some(StreamText {
            text: text.into_owned(),
            omitted_bytes: None,
            full_text: None,
        });
    }
    let half = STREAM_SHOWN_BYTES / 2;
    let head_end = floor_char_boundary(&text, half);
    let tail_start = ceil_char_boundary(&text, text.len().saturating_sub(half)).max(head_end);
    let omitted = (tail_start - head_end) as u64 + dropped;
    let path = format!("{RUNS_DIR}/{run_id}/{name}.txt");
    let full_text = match workspace.create_atomic(&path, Overwrite::Replace) {
        Ok(mut f) => match f.write_all(bytes).and_then(|()| f.flush()) {
            Ok(()) => f.commit().ok().map(|p| p.as_str().to_owned()),
            Err(e) => {
                tracing::warn!(error = %e, "could not keep the whole {name} of a run");
                None
            }
        },
        Err(e) => {
            tracing::warn!(error = %e, "could not keep the whole {name} of a run");
            None
        }
    };
    Some(StreamText {
        text: format!(
            "{}\n… [{omitted} bytes cut] …\n{}",
            &text[..head_end],
            &text[tail_start..]
        ),
        omitted_bytes: Some(omitted),
        full_text,
    })
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn ceil_char_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i += 1;
    }
    i
}

impl RunPythonArgs {
    /// The call as a cell of a session's replay: the code verbatim, its inputs bound to
    /// the variables that made those tables, its outputs kept as `step<N>_outputs`.
    pub(crate) fn replay(&self, n: usize, parsed: Option<&Value>, raw: &str, r: &mut Replay<'_>) {
        if let Some(v) = parsed
            && v.get("ok") == Some(&Value::Bool(false))
        {
            let kind = v
                .pointer("/error/type")
                .and_then(Value::as_str)
                .unwrap_or("error");
            let message = v
                .pointer("/error/message")
                .and_then(Value::as_str)
                .and_then(|m| m.lines().next())
                .unwrap_or("");
            return r.md(format!(
                "**Step {n}:** `run_python` failed, so it is not reproduced:\n\n> {}: {}",
                one_line(kind),
                one_line(message)
            ));
        }
        let code = self.code.as_deref();
        let code_file = self.code_file.as_deref();
        if code.is_none() && code_file.is_none() {
            return r.md(format!(
                "**Step {n}:** `run_python` without `code`; it is not reproduced."
            ));
        }
        r.md(format!(
            "### Step {n}: `run_python`\n\nThe agent's Python, as it ran in dataref's sandbox."
        ));
        let mut out = format!("# Step {n}: `run_python`, the agent's code verbatim.\n");
        {
            for (name, data_ref) in &self.inputs {
                let data_ref = data_ref.as_str();
                let ident = py_ident(name);
                match r.refs.get(data_ref) {
                    Some(expr) => {
                        let _ = writeln!(out, "{ident} = {expr}.copy()");
                    }
                    None => {
                        let _ = writeln!(
                            out,
                            "# `{}` ({}) came from outside this session: bind `{ident}` to \
                             that table before running this cell.",
                            one_line(name),
                            one_line(data_ref)
                        );
                    }
                }
            }
        }
        if !self.files.is_empty() {
            out.push_str(
                "# The code reads workspace files, which the sandbox put under `in/files/`; \
                 copy them\n# there (beside this notebook) first:\n",
            );
            for f in &self.files {
                let _ = writeln!(out, "#   in/files/{}", one_line(f));
            }
        }
        let body = code.unwrap_or("");
        if body.contains("out/files") || code_file.is_some() {
            out.push_str("os.makedirs(os.path.join(\"out\", \"files\"), exist_ok=True)\n");
        }
        out.push_str("outputs = {}\nresult = None\n\n");
        match (code, code_file) {
            (Some(code), _) => {
                out.push_str(code);
                if !code.ends_with('\n') {
                    out.push('\n');
                }
            }
            (None, Some(file)) => {
                let _ = writeln!(
                    out,
                    "# The code was the workspace file `{}` (not recorded here): run it if you \
                     have it.\nwith open({}, encoding=\"utf-8\") as _f:\n    exec(_f.read())",
                    one_line(file),
                    py_str(file)
                );
            }
            (None, None) => {}
        }
        let _ = writeln!(
            out,
            "\nstep{n}_outputs = {{name: _as_table(table) for name, table in outputs.items()}}"
        );
        let defines_result = code.is_none_or(|c| c.contains("result"));
        if defines_result {
            let _ = writeln!(out, "step{n}_result = result");
            let _ = writeln!(out, "print(\"step {n} result:\", step{n}_result)");
        }
        if let Some(r) = parsed.and_then(|v| v.get("result"))
            && !r.is_null()
        {
            let _ = writeln!(
                out,
                "# In the session the run returned result = {}",
                one_line(&truncate_chars(&r.to_string(), 2000))
            );
        }
        // The outputs it stored, by name → dataRef.
        let mut outputs: Vec<(String, String, Option<&Value>)> = Vec::new();
        if let Some(v) = parsed {
            if let Some(Value::Object(o)) = v.get("outputs") {
                for (name, d) in o {
                    if let Some(data_ref) = d.get("dataRef").and_then(Value::as_str) {
                        outputs.push((name.clone(), data_ref.to_owned(), Some(d)));
                    }
                }
            }
            if let Some(Value::Object(o)) = v.get("moreOutputs") {
                for (name, data_ref) in o {
                    if let Some(data_ref) = data_ref.as_str() {
                        outputs.push((name.clone(), data_ref.to_owned(), None));
                    }
                }
            }
        } else {
            outputs = scan_refs(raw)
                .into_iter()
                .filter_map(|(name, data_ref)| Some((name?, data_ref, None)))
                .collect();
        }
        for (name, data_ref, d) in &outputs {
            let _ = writeln!(
                out,
                "# It stored `{}` as {}{}.",
                one_line(name),
                one_line(data_ref),
                d.map(shape).unwrap_or_default()
            );
        }
        r.code(out);
        for (name, data_ref, _) in outputs {
            r.refs
                .insert(data_ref, format!("step{n}_outputs[{}]", py_str(&name)));
        }
    }
}
