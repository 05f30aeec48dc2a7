//! The sandbox `run_python` runs in (work in progress: see issue 4).
//!
//! - [`jail`]: isolation on Linux — bubblewrap namespaces and file-system view, a seccomp
//!   deny-list, cgroup limits (v2, else v1, else rlimits with a warning), an unprivileged
//!   uid when dataref runs as root; fail closed.
//! - [`runtime`]: the managed Python runtime (a venv with pinned pandas, pyarrow, numpy, …
//!   provisioned into the data dir) and the exchange: inputs as memory-mapped Arrow IPC,
//!   `outputs` and `result` back, capped.
//!
//! Nothing here is exposed as a tool yet.

#![expect(
    clippy::disallowed_methods,
    reason = "the sandbox owns its job directories and the runtime under the data dir"
)]

pub mod jail;
pub mod pool;
pub mod runtime;
