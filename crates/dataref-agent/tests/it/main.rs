//! The agent runtime on real parts: the gateway against a scripted OpenAI-compatible server
//! over real sockets, the context manager with the real tokenizer, the loop over the real
//! built-in tools, sessions in real SQLite.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers fail by panicking, like the tests that call them"
)]
#![expect(
    clippy::expect_used,
    reason = "test helpers fail the test on setup errors"
)]
mod budget;
mod gateway;
mod ground;
mod prompt;
mod run;
mod window;
