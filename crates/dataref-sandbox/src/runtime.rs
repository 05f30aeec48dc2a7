//! The managed Python runtime and the exchange with the code that runs in it.
//!
//! - [`Runtime::ensure`] provisions `<home>/python/`: a venv made with the host's
//!   `python3`, with [`PINNED`] packages installed from PyPI (wheels only). It is built in
//!   `<home>/python.tmp-<pid>` under a lock and renamed into place once pip succeeded, with a
//!   `dataref-runtime.json` manifest written last, so a later start is a file read and a
//!   half-built runtime is never used.
//! - [`Runtime::check`] tells `dataref doctor` whether the runtime is there and usable.
//! - [`exchange`]: the job directory the runner script reads and writes, and the safe
//!   collection of what it produced.
//!
//! ```no_run
//! # fn demo(home: &std::path::Path) -> Result<(), dataref_sandbox::runtime::RuntimeError> {
//! use dataref_sandbox::runtime::Runtime;
//! let runtime = Runtime::ensure(home, &|step| eprintln!("{step}"))?;
//! println!("python {} at {}", runtime.versions.python, runtime.python.display());
//! # Ok(()) }
//! ```

pub mod exchange;

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dataref_protocol::Timestamp;
use serde::{Deserialize, Serialize};

/// What a package is needed for; only [`PinRole::Core`] packages are required of an
/// interpreter the operator manages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinRole {
    /// Loading inputs, computing, storing outputs.
    Core,
    /// Pictures and documents (charts, XLSX, DOCX, PPTX written by the model's code).
    Documents,
}

/// A package installed into the managed runtime at an exact version.
#[derive(Debug, Clone, Copy)]
pub struct Pin {
    /// The distribution name on PyPI, lower case.
    pub name: &'static str,
    pub version: &'static str,
    pub role: PinRole,
}

/// The packages of the managed runtime, installed as wheels only (checked: all have
/// CPython 3.11 manylinux x86_64 wheels), so installing never compiles anything. Changing a version here makes
/// existing runtimes outdated: the next [`Runtime::ensure`] rebuilds them.
pub const PINNED: &[Pin] = &[
    Pin {
        name: "pandas",
        version: "3.1.1",
        role: PinRole::Core,
    },
    Pin {
        name: "pyarrow",
        version: "26.0.1",
        role: PinRole::Core,
    },
    Pin {
        name: "numpy",
        version: "2.4.6",
        role: PinRole::Core,
    },
    Pin {
        name: "matplotlib",
        version: "3.11.2",
        role: PinRole::Documents,
    },
    Pin {
        name: "openpyxl",
        version: "3.1.5",
        role: PinRole::Documents,
    },
    Pin {
        name: "python-docx",
        version: "1.2.0",
        role: PinRole::Documents,
    },
    Pin {
        name: "python-pptx",
        version: "1.0.2",
        role: PinRole::Documents,
    },
];

/// pandas 3 and numpy 2.4 need 3.11.
const MIN_PYTHON: (u32, u32) = (3, 11);
const MANIFEST: &str = "dataref-runtime.json";
const MANIFEST_FORMAT: u32 = 1;
const RUNTIME_DIR: &str = "python";
const TEMP_PREFIX: &str = "python.tmp-";
const OLD_PREFIX: &str = "python.old-";
const LOCK_FILE: &str = "python.lock";
const PIP_PROGRESS_EVERY: Duration = Duration::from_secs(1);
const STDERR_TAIL_LINES: usize = 30;

/// Which Python runs the model's code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuntimeSpec {
    /// dataref builds and owns a venv under `<home>/python`, made with `base` (or the first
    /// `python3` on `PATH`).
    Managed { base: Option<PathBuf> },
    /// An interpreter the operator manages; dataref only checks that the core packages
    /// import and never installs anything into it.
    Interpreter(PathBuf),
}

/// A usable Python runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runtime {
    /// The interpreter to run (`<prefix>/bin/python` for the managed runtime).
    pub python: PathBuf,
    /// `sys.prefix`: the venv.
    pub prefix: PathBuf,
    /// `sys.base_prefix`: the host installation the venv points at. The jail must bind it
    /// read-only at the same path, or the venv's interpreter does not start.
    pub base_prefix: PathBuf,
    pub versions: RuntimeVersions,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeVersions {
    /// e.g. `3.11.7`.
    pub python: String,
    /// Every installed distribution (normalised lower-case name → version), pins and their
    /// dependencies.
    pub packages: BTreeMap<String, String>,
}

/// The state of the managed runtime, for `dataref doctor`.
#[derive(Debug)]
#[non_exhaustive]
pub enum RuntimeStatus {
    Ready(Runtime),
    NotInstalled {
        dir: PathBuf,
    },
    /// Installed with other versions than this dataref pins.
    Outdated {
        dir: PathBuf,
        installed: BTreeMap<String, String>,
    },
    /// There, but unusable (no manifest: an interrupted install; the host Python it was made
    /// from is gone; the packages do not import).
    Broken {
        dir: PathBuf,
        reason: String,
    },
}

impl RuntimeStatus {
    /// What the person should do, or `None` when nothing is needed.
    pub fn fix(&self) -> Option<String> {
        match self {
            Self::Ready(_) => None,
            Self::NotInstalled { .. } => Some(
                "it is installed on the first `run_python` (about 100 MB from PyPI); \
                 start `dataref serve` once with network access to install it now"
                    .to_owned(),
            ),
            Self::Outdated { .. } => Some(
                "the next start of `dataref serve` rebuilds it with the pinned versions".to_owned(),
            ),
            Self::Broken { dir, .. } => Some(format!(
                "remove `{}`; the next start of `dataref serve` builds it again",
                dir.display()
            )),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    #[error("no `python3` found on PATH\nhint: install Python {}.{} or newer, or set the interpreter path in the `[python]` config", MIN_PYTHON.0, MIN_PYTHON.1)]
    NoPython,
    #[error("`{}` is Python {found}, but the runtime needs {}.{} or newer\nhint: install a newer Python, or set the interpreter path in the `[python]` config", python.display(), MIN_PYTHON.0, MIN_PYTHON.1)]
    PythonTooOld { python: PathBuf, found: String },
    #[error("`{}` could not be run: {reason}", python.display())]
    ProbeFailed { python: PathBuf, reason: String },
    #[error("creating the venv with `{}` failed ({status}):\n{stderr}\nhint: on Debian and Ubuntu, install the `python3-venv` package", python.display())]
    VenvFailed {
        python: PathBuf,
        status: String,
        stderr: String,
    },
    #[error(
        "pip could not install the Python packages ({status}):\n{stderr}\nhint: check network access to PyPI (or the index set by `PIP_INDEX_URL`)"
    )]
    PipFailed { status: String, stderr: String },
    #[error("pip installed {package} {found}, but {wanted} is pinned")]
    VersionMismatch {
        package: String,
        wanted: String,
        found: String,
    },
    #[error("`{}` lacks the packages {missing:?}\nhint: `{} -m pip install {}`", python.display(), python.display(), core_requirements())]
    MissingPackages {
        python: PathBuf,
        missing: Vec<String>,
    },
    #[error("{action} `{}`: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io_error(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> RuntimeError {
    let path = path.to_path_buf();
    move |source| RuntimeError::Io {
        action,
        path,
        source,
    }
}

fn core_requirements() -> String {
    PINNED
        .iter()
        .filter(|p| p.role == PinRole::Core)
        .map(|p| format!("{}=={}", p.name, p.version))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Written last into a finished runtime; its presence is what makes a runtime usable.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Manifest {
    format: u32,
    python_version: String,
    base_prefix: PathBuf,
    /// The pins this runtime was built for; compared with [`PINNED`] on every start.
    pinned: BTreeMap<String, String>,
    installed: BTreeMap<String, String>,
    created_unix_secs: u64,
}

fn pinned_map() -> BTreeMap<String, String> {
    PINNED
        .iter()
        .map(|p| (p.name.to_owned(), p.version.to_owned()))
        .collect()
}

fn venv_python(prefix: &Path) -> PathBuf {
    prefix.join("bin").join("python")
}

impl Runtime {
    /// The managed runtime under `home`, provisioned on first use.
    pub fn ensure(home: &Path, progress: &dyn Fn(&str)) -> Result<Runtime, RuntimeError> {
        Self::ensure_with(home, &RuntimeSpec::Managed { base: None }, progress)
    }

    pub fn ensure_with(
        home: &Path,
        spec: &RuntimeSpec,
        progress: &dyn Fn(&str),
    ) -> Result<Runtime, RuntimeError> {
        match spec {
            RuntimeSpec::Managed { base } => ensure_managed(home, base.as_deref(), progress),
            RuntimeSpec::Interpreter(python) => use_interpreter(python),
        }
    }

    /// The runtime `spec` names when it is there already, without installing anything
    /// (`None`: the managed runtime is not installed, or not for the current pins). The
    /// managed one is checked by its files only (the instant path of [`Runtime::ensure`]):
    /// a warm sandbox imports pandas anyway, and says so when it cannot.
    pub fn installed(home: &Path, spec: &RuntimeSpec) -> Result<Option<Runtime>, RuntimeError> {
        match spec {
            RuntimeSpec::Managed { .. } => ready_runtime(&home.join(RUNTIME_DIR)),
            RuntimeSpec::Interpreter(python) => use_interpreter(python).map(Some),
        }
    }

    /// The state of the managed runtime under `home`, without changing anything. Unlike
    /// [`Runtime::ensure`] it runs the interpreter, to catch a runtime whose files are there
    /// but which no longer starts.
    pub fn check(home: &Path) -> RuntimeStatus {
        let dir = home.join(RUNTIME_DIR);
        if !dir.exists() {
            return RuntimeStatus::NotInstalled { dir };
        }
        let manifest = match read_manifest(&dir) {
            Ok(Some(m)) => m,
            Ok(None) => {
                return RuntimeStatus::Broken {
                    dir,
                    reason: format!("no `{MANIFEST}`: the install did not finish"),
                };
            }
            Err(e) => {
                return RuntimeStatus::Broken {
                    dir,
                    reason: e.to_string(),
                };
            }
        };
        if manifest.pinned != pinned_map() {
            return RuntimeStatus::Outdated {
                dir,
                installed: manifest.pinned,
            };
        }
        let python = venv_python(&dir);
        match probe(&python, ProbeDepth::ImportCore) {
            Ok(found) => RuntimeStatus::Ready(Runtime {
                python,
                prefix: dir,
                base_prefix: found.base_prefix,
                versions: RuntimeVersions {
                    python: found.python,
                    packages: found.packages,
                },
            }),
            Err(e) => RuntimeStatus::Broken {
                dir,
                reason: e.to_string(),
            },
        }
    }
}

fn read_manifest(dir: &Path) -> Result<Option<Manifest>, RuntimeError> {
    let path = dir.join(MANIFEST);
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error("reading", &path)(e)),
    };
    match serde_json::from_str::<Manifest>(&text) {
        Ok(m) if m.format == MANIFEST_FORMAT => Ok(Some(m)),
        // An unreadable or foreign manifest means "not a runtime we can trust": rebuild.
        Ok(_) | Err(_) => Ok(None),
    }
}

/// The instant path: a manifest for the current pins and an interpreter that resolves
/// (the host Python it links to still exists).
fn ready_runtime(dir: &Path) -> Result<Option<Runtime>, RuntimeError> {
    let Some(manifest) = read_manifest(dir)? else {
        return Ok(None);
    };
    let python = venv_python(dir);
    if manifest.pinned != pinned_map()
        || !python.is_file()
        || !manifest.base_prefix.is_dir()
        || !crate::jail::jail_can_read(&manifest.base_prefix)
    {
        // A runtime made from a Python the jail uid cannot reach (pyenv under `/root`)
        // cannot run in the sandbox: rebuild it from a reachable one.
        return Ok(None);
    }
    Ok(Some(Runtime {
        python,
        prefix: dir.to_path_buf(),
        base_prefix: manifest.base_prefix,
        versions: RuntimeVersions {
            python: manifest.python_version,
            packages: manifest.installed,
        },
    }))
}

fn ensure_managed(
    home: &Path,
    base: Option<&Path>,
    progress: &dyn Fn(&str),
) -> Result<Runtime, RuntimeError> {
    let dir = home.join(RUNTIME_DIR);
    if let Some(runtime) = ready_runtime(&dir)? {
        return Ok(runtime);
    }
    fs::create_dir_all(home).map_err(io_error("creating", home))?;
    let _lock = lock(home, progress)?;
    // Another process may have finished the install while this one waited for the lock.
    if let Some(runtime) = ready_runtime(&dir)? {
        return Ok(runtime);
    }
    remove_leftovers(home)?;

    let base = match base {
        Some(p) => p.to_path_buf(),
        None => default_base().ok_or(RuntimeError::NoPython)?,
    };
    let host = probe(&base, ProbeDepth::Version)?;
    if parse_version(&host.python) < MIN_PYTHON {
        return Err(RuntimeError::PythonTooOld {
            python: base,
            found: host.python,
        });
    }

    let temp = home.join(format!("{TEMP_PREFIX}{}", std::process::id()));
    let built = build(&base, &temp, progress);
    let manifest = match built {
        Ok(m) => m,
        Err(e) => {
            let _ = fs::remove_dir_all(&temp);
            return Err(e);
        }
    };
    if dir.exists() {
        // Outdated or half-built: nobody builds concurrently (we hold the lock), so moving
        // it aside and deleting it is safe.
        let old = home.join(format!("{OLD_PREFIX}{}", std::process::id()));
        fs::rename(&dir, &old).map_err(io_error("moving aside", &dir))?;
        let _ = fs::remove_dir_all(&old);
    }
    fs::rename(&temp, &dir).map_err(io_error("moving into place", &temp))?;
    progress("the Python runtime is ready");
    Ok(Runtime {
        python: venv_python(&dir),
        prefix: dir,
        base_prefix: manifest.base_prefix,
        versions: RuntimeVersions {
            python: manifest.python_version,
            packages: manifest.installed,
        },
    })
}

/// The interpreter a managed runtime is made from when none is configured: the first
/// `python3` on `PATH`, unless dataref runs as root and that one lives where the jail uid
/// cannot follow (pyenv under `/root`); then the system's `/usr/bin/python3` or
/// `/usr/local/bin/python3`.
fn default_base() -> Option<PathBuf> {
    let on_path = find_on_path("python3");
    let usable = |p: &Path| {
        fs::canonicalize(p)
            .ok()
            .is_some_and(|real| crate::jail::jail_can_read(&real))
    };
    if let Some(p) = &on_path
        && usable(p)
    {
        return on_path;
    }
    ["/usr/bin/python3", "/usr/local/bin/python3"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file() && usable(p))
        .or(on_path)
}

/// Held for the whole build so concurrent starters download and build once; the lock goes
/// with the file descriptor, so a crashed builder never leaves it taken.
fn lock(home: &Path, progress: &dyn Fn(&str)) -> Result<File, RuntimeError> {
    use rustix::fs::{FlockOperation, flock};
    let path = home.join(LOCK_FILE);
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io_error("opening", &path))?;
    if flock(&file, FlockOperation::NonBlockingLockExclusive).is_err() {
        progress("waiting for another dataref process that is installing the Python runtime");
        flock(&file, FlockOperation::LockExclusive)
            .map_err(|e| io_error("locking", &path)(e.into()))?;
    }
    Ok(file)
}

/// Temp and moved-aside directories of builders that died. Only called under the lock, so
/// none of them belongs to a live build.
fn remove_leftovers(home: &Path) -> Result<(), RuntimeError> {
    for entry in fs::read_dir(home).map_err(io_error("listing", home))? {
        let entry = entry.map_err(io_error("listing", home))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(TEMP_PREFIX) || name.starts_with(OLD_PREFIX) {
            let path = entry.path();
            fs::remove_dir_all(&path).map_err(io_error("removing the leftover", &path))?;
        }
    }
    Ok(())
}

fn build(base: &Path, temp: &Path, progress: &dyn Fn(&str)) -> Result<Manifest, RuntimeError> {
    progress(&format!("creating the venv with `{}`", base.display()));
    let out = Command::new(base)
        .args(["-m", "venv"])
        .arg(temp)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| RuntimeError::ProbeFailed {
            python: base.to_path_buf(),
            reason: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(RuntimeError::VenvFailed {
            python: base.to_path_buf(),
            status: out.status.to_string(),
            stderr: tail(&String::from_utf8_lossy(&out.stderr), STDERR_TAIL_LINES),
        });
    }

    let names = PINNED.iter().map(|p| p.name).collect::<Vec<_>>().join(", ");
    progress(&format!("installing {names} (this takes a minute)"));
    let python = venv_python(temp);
    pip_install(&python, progress)?;

    progress("checking the installed versions");
    let found = probe(&python, ProbeDepth::ImportCore)?;
    for pin in PINNED {
        let got = found.packages.get(pin.name).cloned().unwrap_or_default();
        if got != pin.version {
            return Err(RuntimeError::VersionMismatch {
                package: pin.name.to_owned(),
                wanted: pin.version.to_owned(),
                found: if got.is_empty() {
                    "nothing".to_owned()
                } else {
                    got
                },
            });
        }
    }
    let manifest = Manifest {
        format: MANIFEST_FORMAT,
        python_version: found.python,
        base_prefix: found.base_prefix,
        pinned: pinned_map(),
        installed: found.packages,
        created_unix_secs: u64::try_from(Timestamp::now().unix_seconds()).unwrap_or(0),
    };
    let path = temp.join(MANIFEST);
    let text = serde_json::to_vec_pretty(&manifest).map_err(|e| RuntimeError::Io {
        action: "encoding",
        path: path.clone(),
        source: e.into(),
    })?;
    let mut file = File::create(&path).map_err(io_error("creating", &path))?;
    file.write_all(&text).map_err(io_error("writing", &path))?;
    file.sync_all().map_err(io_error("syncing", &path))?;
    Ok(manifest)
}

fn pip_install(python: &Path, progress: &dyn Fn(&str)) -> Result<(), RuntimeError> {
    let mut child = Command::new(python)
        .args([
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--no-input",
            // Wheels only: no compiler needed, and nothing from an sdist's setup.py runs.
            "--only-binary=:all:",
            "--progress-bar",
            "off",
        ])
        .args(PINNED.iter().map(|p| format!("{}=={}", p.name, p.version)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| RuntimeError::ProbeFailed {
            python: python.to_path_buf(),
            reason: e.to_string(),
        })?;
    // stderr is drained on its own thread so a chatty pip never blocks on a full pipe.
    let stderr_reader = child.stderr.take().map(|mut stderr| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        })
    });
    if let Some(stdout) = child.stdout.take() {
        let mut last = Instant::now()
            .checked_sub(PIP_PROGRESS_EVERY)
            .unwrap_or_else(Instant::now);
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let line = line.trim();
            let milestone =
                line.starts_with("Installing collected") || line.starts_with("Successfully");
            if !line.is_empty() && (milestone || last.elapsed() >= PIP_PROGRESS_EVERY) {
                progress(&format!("pip: {line}"));
                last = Instant::now();
            }
        }
    }
    let status = child.wait().map_err(|e| RuntimeError::ProbeFailed {
        python: python.to_path_buf(),
        reason: e.to_string(),
    })?;
    let stderr = stderr_reader
        .and_then(|h| h.join().ok())
        .unwrap_or_default();
    if !status.success() {
        return Err(RuntimeError::PipFailed {
            status: status.to_string(),
            stderr: tail(&stderr, STDERR_TAIL_LINES),
        });
    }
    Ok(())
}

fn use_interpreter(python: &Path) -> Result<Runtime, RuntimeError> {
    let found = probe(python, ProbeDepth::Version)?;
    if parse_version(&found.python) < MIN_PYTHON {
        return Err(RuntimeError::PythonTooOld {
            python: python.to_path_buf(),
            found: found.python,
        });
    }
    let missing: Vec<String> = PINNED
        .iter()
        .filter(|p| p.role == PinRole::Core && !found.packages.contains_key(p.name))
        .map(|p| p.name.to_owned())
        .collect();
    if !missing.is_empty() {
        return Err(RuntimeError::MissingPackages {
            python: python.to_path_buf(),
            missing,
        });
    }
    // Import, not just metadata: a broken install should fail here, not in the first job.
    let found = probe(python, ProbeDepth::ImportCore)?;
    Ok(Runtime {
        python: python.to_path_buf(),
        prefix: found.prefix,
        base_prefix: found.base_prefix,
        versions: RuntimeVersions {
            python: found.python,
            packages: found.packages,
        },
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ProbeDepth {
    Version,
    ImportCore,
}

#[derive(Debug, Deserialize)]
struct Probe {
    python: String,
    prefix: PathBuf,
    base_prefix: PathBuf,
    packages: BTreeMap<String, String>,
}

const PROBE_SCRIPT: &str = r#"
import json, sys, importlib.metadata as md
if sys.argv[1] == "import":
    import pandas, pyarrow, numpy, pyarrow.ipc
packages = {}
for d in md.distributions():
    name = (d.metadata["Name"] or "").lower().replace("_", "-")
    if name:
        packages[name] = d.version
print(json.dumps({
    "python": "%d.%d.%d" % sys.version_info[:3],
    "prefix": sys.prefix,
    "base_prefix": sys.base_prefix,
    "packages": packages,
}))
"#;

fn probe(python: &Path, depth: ProbeDepth) -> Result<Probe, RuntimeError> {
    let failed = |reason: String| RuntimeError::ProbeFailed {
        python: python.to_path_buf(),
        reason,
    };
    let mode = match depth {
        ProbeDepth::Version => "version",
        ProbeDepth::ImportCore => "import",
    };
    let out = Command::new(python)
        .args(["-I", "-c", PROBE_SCRIPT, mode])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| failed(e.to_string()))?;
    if !out.status.success() {
        return Err(failed(format!(
            "{}: {}",
            out.status,
            tail(&String::from_utf8_lossy(&out.stderr), 10)
        )));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| failed(format!("unexpected output: {e}")))
}

fn parse_version(text: &str) -> (u32, u32) {
    let mut parts = text.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| {
            fs::metadata(candidate)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_by_minor() {
        assert!(parse_version("3.10.12") < MIN_PYTHON);
        assert!(parse_version("3.11.0") >= MIN_PYTHON);
        assert!(parse_version("3.13.1") >= MIN_PYTHON);
    }

    #[test]
    fn tail_keeps_last_lines() {
        assert_eq!(tail("a\nb\nc", 2), "b\nc");
        assert_eq!(tail("a", 5), "a");
    }
}
