//! Integration tests of the sandbox against the real bubblewrap and the real runtime.

#![expect(clippy::unwrap_used, reason = "tests fail loudly on unexpected errors")]

mod cleanup;
mod escape;
mod jail;
mod pool;
mod runtime;
