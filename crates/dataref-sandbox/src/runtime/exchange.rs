//! The job directory: what goes in to the runner script and what comes out of it.
//!
//! ```text
//! <job>/in/runner.py              the runner (embedded in this crate)
//! <job>/in/request.json           {"inputs": [names], "result_cap": N, "max_outputs": N}
//! <job>/in/code.py                the model's code
//! <job>/in/inputs/<name>.arrow    Arrow IPC file, read-only (bound, linked or copied)
//! <job>/in/files/<rel>            workspace files the code may read, read-only
//! <job>/out/outputs/<name>.arrow  DataFrames stored from `outputs[name]`
//! <job>/out/files/<rel>           files the code wrote for the workspace
//! <job>/out/result.json           {ok, result, error, outputs, duration_ms}
//! ```
//!
//! Everything under `out/` was written by code the model controls, the runner included
//! (the model's code runs in the runner's process and can rewrite `result.json`). So
//! [`collect`] trusts nothing there: it re-checks every cap and accepts only regular,
//! singly-linked files with plain names. It opens nothing itself: `out/` is walked through
//! `dataref_workspace::UntrustedDir` (one name at a time from a directory fd, `O_NOFOLLOW`,
//! type and links read from the opened fd), the one audited place that opens files beneath
//! a root.

use std::fs::{self, File};
use std::io::Read;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use arrow_schema::SchemaRef;
use dataref_workspace::{EntryBudget, FileKind, Refusal, UntrustedDir};
use serde::{Deserialize, Serialize};

/// The runner script, written into every job as `in/runner.py`.
pub const RUNNER_PY: &str = include_str!("runner.py");

/// Globals the runner defines; an input by one of these names would hide it.
pub const RESERVED_GLOBALS: &[&str] = &["outputs", "result", "pd", "np"];

/// Python keywords (hard and soft); a keyword cannot be a variable name.
const PYTHON_KEYWORDS: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield", "_", "case", "match", "type",
];

/// The builtins of CPython 3.11–3.13 that are lower-case (the upper-case ones are exception
/// classes, which models do not name their tables after, but the runner rejects those too).
const PYTHON_BUILTINS: &[&str] = &[
    "abs",
    "aiter",
    "all",
    "anext",
    "any",
    "ascii",
    "bin",
    "bool",
    "breakpoint",
    "bytearray",
    "bytes",
    "callable",
    "chr",
    "classmethod",
    "compile",
    "complex",
    "copyright",
    "credits",
    "delattr",
    "dict",
    "dir",
    "divmod",
    "enumerate",
    "eval",
    "exec",
    "exit",
    "filter",
    "float",
    "format",
    "frozenset",
    "getattr",
    "globals",
    "hasattr",
    "hash",
    "help",
    "hex",
    "id",
    "input",
    "int",
    "isinstance",
    "issubclass",
    "iter",
    "len",
    "license",
    "list",
    "locals",
    "map",
    "max",
    "memoryview",
    "min",
    "next",
    "object",
    "oct",
    "open",
    "ord",
    "pow",
    "print",
    "property",
    "quit",
    "range",
    "repr",
    "reversed",
    "round",
    "set",
    "setattr",
    "slice",
    "sorted",
    "staticmethod",
    "str",
    "sum",
    "super",
    "tuple",
    "type",
    "vars",
    "zip",
];

const INPUT_NAME_MAX: usize = 64;
const OUTPUT_NAME_MAX: usize = 64;
const FILE_NAME_MAX: usize = 128;
const ERROR_MESSAGE_MAX: usize = 2000;
const TRACEBACK_FRAMES_MAX: usize = 20;
const TRACEBACK_CODE_MAX: usize = 200;

/// Limits of one exchange. The runner is told `result_bytes` and `max_outputs`; [`collect`]
/// enforces all of them again, since the runner shares a process with the model's code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExchangeCaps {
    /// `result` as compact JSON.
    pub result_bytes: usize,
    /// `result.json` as a file (result, error message and traceback).
    pub result_file_bytes: u64,
    pub max_outputs: usize,
    /// One output Arrow file.
    pub output_bytes: u64,
    pub max_files: usize,
    /// One file under `out/files`.
    pub file_bytes: u64,
    /// All files under `out/files` together.
    pub files_total_bytes: u64,
    /// Directory levels below `out/files`.
    pub max_depth: usize,
    /// Directory entries looked at under `out/`, so a million empty files cost little.
    pub max_entries: usize,
}

impl Default for ExchangeCaps {
    fn default() -> Self {
        Self {
            result_bytes: 4 * 1024,
            result_file_bytes: 256 * 1024,
            max_outputs: 16,
            output_bytes: 1024 * 1024 * 1024,
            max_files: 64,
            file_bytes: 100 * 1024 * 1024,
            files_total_bytes: 500 * 1024 * 1024,
            max_depth: 4,
            max_entries: 4096,
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExchangeError {
    #[error(
        "input name `{name}` is not allowed: {reason}\nhint: use a short Python identifier such as `sales` or `orders_2024`"
    )]
    InputName { name: String, reason: &'static str },
    #[error("file path `{rel}` is not allowed: {reason}")]
    FilePath { rel: String, reason: &'static str },
    #[error("input `{}` is not a regular file", path.display())]
    InputNotFile { path: PathBuf },
    /// The job ended without a result: it was killed (timeout, memory) or the runner broke.
    #[error("the job left no `result.json` (it was killed or crashed)")]
    NoResult,
    #[error("`result.json` is unusable: {reason}")]
    BadResult { reason: String },
    #[error("{action} `{}`: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io_error(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> ExchangeError {
    let path = path.to_path_buf();
    move |source| ExchangeError::Io {
        action,
        path,
        source,
    }
}

/// A name a table arrives under in the model's code: a Python identifier that hides
/// nothing the code relies on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InputName(String);

impl InputName {
    pub fn parse(name: &str) -> Result<Self, ExchangeError> {
        let fail = |reason| {
            Err(ExchangeError::InputName {
                name: name.to_owned(),
                reason,
            })
        };
        let mut chars = name.chars();
        let Some(first) = chars.next() else {
            return fail("it is empty");
        };
        if name.len() > INPUT_NAME_MAX {
            return fail("it is longer than 64 characters");
        }
        // ASCII only: a non-ASCII identifier is legal Python but not a portable file name.
        if !(first.is_ascii_alphabetic() || first == '_')
            || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return fail(
                "it must be a Python identifier (letters, digits, `_`; not starting with a digit)",
            );
        }
        if name.starts_with("__") {
            return fail("names starting with `__` are Python's own");
        }
        if PYTHON_KEYWORDS.contains(&name) {
            return fail("it is a Python keyword");
        }
        if PYTHON_BUILTINS.contains(&name) {
            return fail("it would hide a Python builtin");
        }
        if RESERVED_GLOBALS.contains(&name) {
            return fail("it would hide one of `outputs`, `result`, `pd`, `np`");
        }
        Ok(Self(name.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Paths inside a job directory. The jail may mount the directory anywhere; these are the
/// host paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobLayout {
    root: PathBuf,
}

impl JobLayout {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }
    pub fn root(&self) -> &Path {
        &self.root
    }
    pub fn runner(&self) -> PathBuf {
        self.root.join("in/runner.py")
    }
    pub fn request(&self) -> PathBuf {
        self.root.join("in/request.json")
    }
    pub fn code(&self) -> PathBuf {
        self.root.join("in/code.py")
    }
    pub fn input(&self, name: &InputName) -> PathBuf {
        self.root
            .join("in/inputs")
            .join(format!("{}.arrow", name.as_str()))
    }
    pub fn in_files(&self) -> PathBuf {
        self.root.join("in/files")
    }
    /// The only directory the job may write to.
    pub fn out(&self) -> PathBuf {
        self.root.join("out")
    }
    pub fn outputs(&self) -> PathBuf {
        self.root.join("out/outputs")
    }
    pub fn out_files(&self) -> PathBuf {
        self.root.join("out/files")
    }
    pub fn result(&self) -> PathBuf {
        self.root.join("out/result.json")
    }

    /// The arguments that run the runner on this job: `python -I -B <runner> <root>`. `-I`
    /// keeps `PYTHON*` variables, the user site and the current directory out of `sys.path`.
    pub fn runner_args(&self) -> Vec<std::ffi::OsString> {
        vec![
            "-I".into(),
            "-B".into(),
            self.runner().into(),
            self.root.clone().into(),
        ]
    }
}

/// How input tables and files get into `in/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// An empty placeholder is created; the jail bind-mounts each [`ReadOnlyBind`] over it.
    /// No byte of a large artifact is copied.
    BindReadOnly,
    /// Hard link where the file system allows it, else a copy; for running without a jail.
    LinkOrCopy,
}

/// A host file the jail must mount read-only at `target` (a host path under the job root).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadOnlyBind {
    pub source: PathBuf,
    pub target: PathBuf,
}

#[derive(Debug)]
pub struct PreparedJob {
    pub layout: JobLayout,
    /// Empty unless [`Placement::BindReadOnly`].
    pub binds: Vec<ReadOnlyBind>,
}

#[derive(Debug, Serialize)]
struct Request<'a> {
    inputs: Vec<&'a str>,
    result_cap: usize,
    max_outputs: usize,
}

/// Fills the job directory `dir` (created if missing, expected empty) for one run.
/// `inputs` are `(name, arrow file)`, `files` are `(relative path, host file)`.
pub fn prepare_job(
    dir: &Path,
    inputs: &[(&str, &Path)],
    code: &str,
    files: &[(&str, &Path)],
    caps: &ExchangeCaps,
    placement: Placement,
) -> Result<PreparedJob, ExchangeError> {
    let layout = create_job_dir(dir)?;
    let names: Vec<&str> = inputs.iter().map(|(n, _)| *n).collect();
    let names = write_request(&layout, &names, code, caps)?;
    let mut file_targets = Vec::with_capacity(files.len());
    for (rel, _) in files {
        file_targets.push(layout.in_files().join(check_rel_path(rel, caps.max_depth)?));
    }

    let mut binds = Vec::new();
    let placed = names
        .iter()
        .map(|n| layout.input(n))
        .zip(inputs.iter().map(|(_, p)| *p))
        .chain(file_targets.into_iter().zip(files.iter().map(|(_, p)| *p)));
    for (target, source) in placed {
        if !fs::metadata(source).is_ok_and(|m| m.is_file()) {
            return Err(ExchangeError::InputNotFile {
                path: source.to_path_buf(),
            });
        }
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent).map_err(io_error("creating", parent))?;
        }
        match placement {
            Placement::BindReadOnly => {
                write_file(&target, b"")?;
                binds.push(ReadOnlyBind {
                    source: source.to_path_buf(),
                    target,
                });
            }
            Placement::LinkOrCopy => {
                if fs::hard_link(source, &target).is_err() {
                    fs::copy(source, &target).map_err(io_error("copying", source))?;
                }
            }
        }
    }
    Ok(PreparedJob { layout, binds })
}

/// Creates the job directory with the runner and the empty `in/` and `out/` trees: all a
/// warm sandbox needs before its job is known.
pub fn create_job_dir(dir: &Path) -> Result<JobLayout, ExchangeError> {
    let layout = JobLayout::new(dir);
    for d in [
        layout.root().join("in/inputs"),
        layout.in_files(),
        layout.outputs(),
        layout.out_files(),
    ] {
        fs::create_dir_all(&d).map_err(io_error("creating", &d))?;
    }
    write_file(&layout.runner(), RUNNER_PY.as_bytes())?;
    Ok(layout)
}

/// Writes `request.json` and `code.py` into a job directory made by [`create_job_dir`];
/// the runner opens the inputs in the order of `input_names`.
pub fn write_request(
    layout: &JobLayout,
    input_names: &[&str],
    code: &str,
    caps: &ExchangeCaps,
) -> Result<Vec<InputName>, ExchangeError> {
    let mut names = Vec::with_capacity(input_names.len());
    for name in input_names {
        let name = InputName::parse(name)?;
        if names.contains(&name) {
            return Err(ExchangeError::InputName {
                name: name.0,
                reason: "it is given twice",
            });
        }
        names.push(name);
    }
    write_file(&layout.code(), code.as_bytes())?;
    let request = Request {
        inputs: names.iter().map(InputName::as_str).collect(),
        result_cap: caps.result_bytes,
        max_outputs: caps.max_outputs,
    };
    let request = serde_json::to_vec(&request).map_err(|e| ExchangeError::Io {
        action: "encoding",
        path: layout.request(),
        source: e.into(),
    })?;
    write_file(&layout.request(), &request)?;
    Ok(names)
}

/// Copies a workspace file the code may read to `in/files/<rel>` (at most `max_bytes`).
pub fn copy_in_file(
    layout: &JobLayout,
    rel: &str,
    source: &mut dyn Read,
    max_bytes: u64,
    caps: &ExchangeCaps,
) -> Result<u64, ExchangeError> {
    let target = layout.in_files().join(check_rel_path(rel, caps.max_depth)?);
    if let Some(parent) = target.parent() {
        fs::create_dir_all(parent).map_err(io_error("creating", parent))?;
    }
    let mut file = File::create(&target).map_err(io_error("creating", &target))?;
    let copied = std::io::copy(&mut source.take(max_bytes.saturating_add(1)), &mut file)
        .map_err(io_error("copying into", &target))?;
    if copied > max_bytes {
        return Err(ExchangeError::FilePath {
            rel: rel.to_owned(),
            reason: "it is larger than the cap for files passed to the code",
        });
    }
    Ok(copied)
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), ExchangeError> {
    fs::write(path, bytes).map_err(io_error("writing", path))
}

fn check_rel_path(rel: &str, max_depth: usize) -> Result<PathBuf, ExchangeError> {
    let fail = |reason| {
        Err(ExchangeError::FilePath {
            rel: rel.to_owned(),
            reason,
        })
    };
    let parts: Vec<&str> = rel.split('/').collect();
    if parts.len() > max_depth + 1 {
        return fail("it is nested too deep");
    }
    if !parts.iter().all(|p| valid_input_name(p)) {
        return fail(
            "each part must be 1 to 128 of `A-Z a-z 0-9 . _ -`, and not `.`, `..` or more than one leading dot",
        );
    }
    Ok(parts.iter().collect())
}

/// A part of a path passed in: what `collect` accepts, or that after one leading dot, so
/// workspace directories such as `.spill` can be read (`.` and `..` never are names).
fn valid_input_name(name: &str) -> bool {
    match name.strip_prefix('.') {
        Some(rest) => valid_file_name(rest) && rest.len() < FILE_NAME_MAX,
        None => valid_file_name(name),
    }
}

/// The names `collect` accepts: no separators, no leading dot (so no `..`, no hidden
/// files), nothing a shell or a file manager would treat specially.
fn valid_file_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= FILE_NAME_MAX
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// What the runner reported, re-checked against the caps.
#[derive(Debug)]
pub struct JobResult {
    pub ok: bool,
    /// `null` unless `ok`.
    pub result: serde_json::Value,
    pub error: Option<PythonError>,
    pub duration_ms: u64,
    /// Validated Arrow files, in the order the runner listed them.
    pub outputs: Vec<CollectedOutput>,
    /// Collected whether or not the run succeeded: a chart saved before an exception is
    /// still the person's.
    pub files: Vec<CollectedFile>,
    pub skipped: Vec<Skipped>,
}

/// An exception of the model's code, or a broken exchange rule (`kind` such as
/// `ResultTooLarge`, `OutputNotDataFrame`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PythonError {
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
    /// The model's own frames, outermost first; lines are lines of its code.
    #[serde(default)]
    pub traceback: Vec<TracebackFrame>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TracebackFrame {
    pub line: u32,
    pub code: String,
}

/// An output table. `file` is the opened, validated file; read from it (after the job
/// ended nothing can swap it) rather than reopening `path`.
#[derive(Debug)]
pub struct CollectedOutput {
    pub name: String,
    pub path: PathBuf,
    pub file: File,
    pub bytes: u64,
    pub schema: SchemaRef,
    pub rows: u64,
}

#[derive(Debug)]
pub struct CollectedFile {
    /// `/`-separated, relative to `out/files`.
    pub rel: String,
    pub path: PathBuf,
    pub file: File,
    pub bytes: u64,
}

/// Something under `out/` that was not accepted, and why; reported, never silently lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// Relative to `out/`.
    pub path: String,
    pub reason: SkipReason,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SkipReason {
    #[error("a symbolic link")]
    Symlink,
    #[error("a hard link to another file")]
    HardLink,
    #[error("not a regular file ({0})")]
    NotRegular(&'static str),
    #[error("the name is not allowed (use `A-Z a-z 0-9 . _ -`, no leading dot)")]
    BadName,
    #[error("nested deeper than {0} directories")]
    TooDeep(usize),
    #[error("more than {0} files")]
    TooMany(usize),
    #[error("{bytes} bytes, over the {cap}-byte cap")]
    TooLarge { bytes: u64, cap: u64 },
    #[error("the files together exceed the {0}-byte cap")]
    TotalTooLarge(u64),
    #[error("not listed as an output by the run")]
    NotDeclared,
    #[error("not a readable Arrow IPC file: {0}")]
    InvalidArrow(String),
    #[error("could not be read: {0}")]
    Unreadable(String),
}

#[derive(Debug, Deserialize)]
struct RawResult {
    ok: bool,
    #[serde(default)]
    result: serde_json::Value,
    #[serde(default)]
    error: Option<PythonError>,
    #[serde(default)]
    outputs: Vec<String>,
    #[serde(default)]
    duration_ms: u64,
}

/// Reads what a finished job left in `dir/out`. Call it only after every process of the
/// job has exited.
pub fn collect(dir: &Path, caps: &ExchangeCaps) -> Result<JobResult, ExchangeError> {
    let layout = JobLayout::new(dir);
    let out_path = layout.out();
    let out = UntrustedDir::open(&out_path).map_err(io_error("opening", &out_path))?;
    collect_at(&out, dir, caps)
}

/// [`collect`] from the job's `out/` opened as `out` (the jail's tmpfs, which lives only as
/// long as a descriptor of it); `dir` names the job in paths reported back.
pub fn collect_at(
    out: &impl AsFd,
    dir: &Path,
    caps: &ExchangeCaps,
) -> Result<JobResult, ExchangeError> {
    let layout = JobLayout::new(dir);
    let out = UntrustedDir::reopen(out).map_err(io_error("opening", &layout.out()))?;

    let raw = read_result(&out, caps)?;
    let mut job = JobResult {
        ok: raw.ok,
        result: serde_json::Value::Null,
        error: raw.error.map(cap_error),
        duration_ms: raw.duration_ms,
        outputs: Vec::new(),
        files: Vec::new(),
        skipped: Vec::new(),
    };
    if job.ok {
        let size = serde_json::to_vec(&raw.result).map_or(usize::MAX, |v| v.len());
        if size > caps.result_bytes {
            job.ok = false;
            job.error = Some(PythonError {
                kind: "ResultTooLarge".to_owned(),
                message: format!(
                    "`result` is {size} bytes as JSON, over the {}-byte cap; put tables in \
                     `outputs[name]` and keep `result` to a small summary",
                    caps.result_bytes
                ),
                traceback: Vec::new(),
            });
        } else {
            job.result = raw.result;
        }
    } else if job.error.is_none() {
        job.error = Some(PythonError {
            kind: "RunnerError".to_owned(),
            message: "the run failed without saying why".to_owned(),
            traceback: Vec::new(),
        });
    }

    let mut walk = Walk::new(caps);
    let declared: Vec<&str> = if job.ok {
        raw.outputs.iter().map(String::as_str).collect()
    } else {
        Vec::new()
    };
    collect_outputs(&out, &layout, &declared, caps, &mut walk, &mut job);
    match out.open_dir("files") {
        Ok(files) => collect_files(
            &files,
            &layout.out_files(),
            "",
            0,
            caps,
            &mut walk,
            &mut job,
        ),
        Err(e) => job.skipped.push(Skipped {
            path: "files".to_owned(),
            reason: skip_reason(e),
        }),
    }
    Ok(job)
}

fn cap_error(mut error: PythonError) -> PythonError {
    error.kind = truncate(&error.kind, 100);
    error.message = truncate(&error.message, ERROR_MESSAGE_MAX);
    let excess = error.traceback.len().saturating_sub(TRACEBACK_FRAMES_MAX);
    error.traceback.drain(..excess);
    for frame in &mut error.traceback {
        frame.code = truncate(&frame.code, TRACEBACK_CODE_MAX);
    }
    error
}

fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} more bytes cut)", &text[..end], text.len() - end)
}

fn read_result(out: &UntrustedDir, caps: &ExchangeCaps) -> Result<RawResult, ExchangeError> {
    let file = match out.open_file("result.json", caps.result_file_bytes) {
        Ok((file, _)) => file,
        Err(Refusal::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ExchangeError::NoResult);
        }
        Err(Refusal::Io(e)) => {
            return Err(ExchangeError::BadResult {
                reason: e.to_string(),
            });
        }
        Err(refusal) => {
            return Err(ExchangeError::BadResult {
                reason: skip_reason(refusal).to_string(),
            });
        }
    };
    let mut text = Vec::new();
    file.take(caps.result_file_bytes)
        .read_to_end(&mut text)
        .map_err(|e| ExchangeError::BadResult {
            reason: e.to_string(),
        })?;
    serde_json::from_slice(&text).map_err(|e| ExchangeError::BadResult {
        reason: e.to_string(),
    })
}

struct Walk {
    entries: EntryBudget,
    max_entries: usize,
    files: usize,
    total_bytes: u64,
}

impl Walk {
    fn new(caps: &ExchangeCaps) -> Self {
        Self {
            entries: EntryBudget::new(caps.max_entries),
            max_entries: caps.max_entries,
            files: 0,
            total_bytes: 0,
        }
    }
}

fn collect_outputs(
    out: &UntrustedDir,
    layout: &JobLayout,
    declared: &[&str],
    caps: &ExchangeCaps,
    walk: &mut Walk,
    job: &mut JobResult,
) {
    let dir = match out.open_dir("outputs") {
        Ok(d) => d,
        Err(e) => {
            job.skipped.push(Skipped {
                path: "outputs".to_owned(),
                reason: skip_reason(e),
            });
            return;
        }
    };
    let mut found = Vec::new();
    for (name, rel) in list_entries(&dir, "outputs/", walk, job) {
        let (name, rel) = (name.as_str(), rel.as_str());
        let stem = name.strip_suffix(".arrow").filter(|s| valid_output_name(s));
        let Some(stem) = stem else {
            job.skipped.push(Skipped {
                path: rel.to_owned(),
                reason: SkipReason::BadName,
            });
            continue;
        };
        if !declared.contains(&stem) {
            job.skipped.push(Skipped {
                path: rel.to_owned(),
                reason: SkipReason::NotDeclared,
            });
            continue;
        }
        if found.len() >= caps.max_outputs {
            job.skipped.push(Skipped {
                path: rel.to_owned(),
                reason: SkipReason::TooMany(caps.max_outputs),
            });
            continue;
        }
        let (file, bytes) = match dir.open_file(name, caps.output_bytes) {
            Ok(f) => f,
            Err(e) => {
                job.skipped.push(Skipped {
                    path: rel.to_owned(),
                    reason: skip_reason(e),
                });
                continue;
            }
        };
        match validate_arrow(file) {
            Ok((schema, rows, file)) => found.push(CollectedOutput {
                name: stem.to_owned(),
                path: layout.outputs().join(name),
                file,
                bytes,
                schema,
                rows,
            }),
            Err(reason) => job.skipped.push(Skipped {
                path: rel.to_owned(),
                reason,
            }),
        }
    }
    // The runner's order is the model's `outputs` order; keep it.
    found.sort_by_key(|o| declared.iter().position(|d| *d == o.name));
    job.outputs = found;
}

fn valid_output_name(name: &str) -> bool {
    name.len() <= OUTPUT_NAME_MAX && valid_file_name(name)
}

/// Reads every batch, so a truncated or corrupt file is caught here and not when the store
/// or a consumer reads it. The file was written by the model's code: it goes through the
/// store's structural checks before the Arrow reader sees it, and a reader panic on what
/// the checks miss is a malformed file too.
fn validate_arrow(file: File) -> Result<(SchemaRef, u64, File), SkipReason> {
    dataref_store::UntrustedIpc::open(file)
        .and_then(dataref_store::UntrustedIpc::validate)
        .map_err(|e| SkipReason::InvalidArrow(e.to_string()))
}

fn collect_files(
    dir: &UntrustedDir,
    host_dir: &Path,
    prefix: &str,
    depth: usize,
    caps: &ExchangeCaps,
    walk: &mut Walk,
    job: &mut JobResult,
) {
    let rel_prefix = format!("files/{prefix}");
    for (name, rel) in list_entries(dir, &rel_prefix, walk, job) {
        let (name, rel) = (name.as_str(), rel.as_str());
        let kind = match dir.kind(name) {
            Ok(kind) => kind,
            Err(e) => {
                job.skipped.push(Skipped {
                    path: rel.to_owned(),
                    reason: skip_reason(e),
                });
                continue;
            }
        };
        if kind == FileKind::Directory {
            if depth + 1 > caps.max_depth {
                job.skipped.push(Skipped {
                    path: rel.to_owned(),
                    reason: SkipReason::TooDeep(caps.max_depth),
                });
                continue;
            }
            match dir.open_dir(name) {
                Ok(sub) => collect_files(
                    &sub,
                    &host_dir.join(name),
                    &format!("{prefix}{name}/"),
                    depth + 1,
                    caps,
                    walk,
                    job,
                ),
                Err(e) => job.skipped.push(Skipped {
                    path: rel.to_owned(),
                    reason: skip_reason(e),
                }),
            }
            continue;
        }
        if walk.files >= caps.max_files {
            job.skipped.push(Skipped {
                path: rel.to_owned(),
                reason: SkipReason::TooMany(caps.max_files),
            });
            continue;
        }
        let (file, bytes) = match dir.open_file(name, caps.file_bytes) {
            Ok(f) => f,
            Err(e) => {
                job.skipped.push(Skipped {
                    path: rel.to_owned(),
                    reason: skip_reason(e),
                });
                continue;
            }
        };
        if walk.total_bytes + bytes > caps.files_total_bytes {
            job.skipped.push(Skipped {
                path: rel.to_owned(),
                reason: SkipReason::TotalTooLarge(caps.files_total_bytes),
            });
            continue;
        }
        walk.files += 1;
        walk.total_bytes += bytes;
        job.files.push(CollectedFile {
            rel: format!("{prefix}{name}"),
            path: host_dir.join(name),
            file,
            bytes,
        });
    }
}

/// The entries of `dir` with allowed names as `(name, path relative to out/)`, in name
/// order so that which files fall over a cap does not depend on the file system's order.
/// Entries with other names are recorded as skipped.
fn list_entries(
    dir: &UntrustedDir,
    rel_prefix: &str,
    walk: &mut Walk,
    job: &mut JobResult,
) -> Vec<(String, String)> {
    let listed = match dir.names(&mut walk.entries) {
        Ok(listed) => listed,
        Err(e) => {
            job.skipped.push(Skipped {
                path: rel_prefix.trim_end_matches('/').to_owned(),
                reason: SkipReason::Unreadable(e.to_string()),
            });
            return Vec::new();
        }
    };
    let mut accepted = Vec::with_capacity(listed.names.len());
    for raw in listed.names {
        let shown = String::from_utf8_lossy(&raw).into_owned();
        let rel = format!("{rel_prefix}{shown}");
        match std::str::from_utf8(&raw) {
            Ok(name) if valid_file_name(name) => accepted.push((name.to_owned(), rel)),
            Ok(_) | Err(_) => job.skipped.push(Skipped {
                path: rel,
                reason: SkipReason::BadName,
            }),
        }
    }
    if listed.cut {
        job.skipped.push(Skipped {
            path: format!("{rel_prefix}…"),
            reason: SkipReason::TooMany(walk.max_entries),
        });
    }
    accepted
}

/// What `dataref-workspace` refused, in the words of a skipped entry.
fn skip_reason(refusal: Refusal) -> SkipReason {
    match refusal {
        Refusal::Symlink => SkipReason::Symlink,
        Refusal::HardLinked { .. } => SkipReason::HardLink,
        // A link where a directory is expected: `O_DIRECTORY | O_NOFOLLOW` says `ENOTDIR`.
        Refusal::NotADirectory => SkipReason::NotRegular("not a directory"),
        Refusal::NotRegular(kind) => SkipReason::NotRegular(kind.description()),
        Refusal::TooLarge { bytes, cap } => SkipReason::TooLarge { bytes, cap },
        Refusal::BadName => SkipReason::BadName,
        other => SkipReason::Unreadable(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_names() {
        for ok in ["sales", "orders_2024", "_x", "Sales"] {
            assert!(InputName::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "", "1x", "a-b", "a b", "list", "print", "outputs", "result", "pd", "np", "class",
            "__x", "évé", "match",
        ] {
            assert!(InputName::parse(bad).is_err(), "{bad}");
        }
        assert!(InputName::parse(&"a".repeat(65)).is_err());
    }

    #[test]
    fn file_names() {
        assert!(valid_file_name("chart.png"));
        assert!(valid_file_name("a-b_c.1"));
        for bad in ["", ".hidden", "..", "a/b", "a b", "ü.png", "a\nb"] {
            assert!(!valid_file_name(bad), "{bad:?}");
        }
        assert!(check_rel_path("a/b/c.csv", 4).is_ok());
        assert!(check_rel_path("../x", 4).is_err());
        assert!(check_rel_path(".spill/20261129T225927Z-t-0.json", 4).is_ok());
        assert!(check_rel_path("./x", 4).is_err());
        assert!(check_rel_path("..x/y", 4).is_err());
        assert!(check_rel_path(".", 4).is_err());
        assert!(check_rel_path("a//b", 4).is_err());
        assert!(check_rel_path("a/b/c/d/e/f", 4).is_err());
    }

    #[test]
    fn truncate_respects_char_boundaries() {
        let cut = truncate("ééé", 3);
        assert!(cut.starts_with('é'));
        assert!(cut.contains("cut"));
    }
}
