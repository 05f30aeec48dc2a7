//! The launchers themselves, against the real binaries: SeaweedFS refuses anonymous and
//! wrongly signed requests, serves the key it was started with, and keeps its data across a
//! restart on the same endpoint; HAProxy balances round robin, sticks on `Mcp-Session-Id`
//! when asked, follows health checks and applies its stream timeout.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers fail the test on setup errors, like the tests that call them"
)]

mod haproxy;
mod s3;
mod support;
