//! dataref-http end to end: a real `HttpServer` on a loopback port serving a per-request
//! `DatarefServer` with a real `LocalStore` in a temp dir and the real SQLite sample
//! source, reached with rmcp's Streamable HTTP client and raw reqwest requests.
#![expect(
    clippy::disallowed_methods,
    reason = "fixtures build files and hostile trees directly, outside the code under test"
)]

mod support;

mod approvals;
mod http;
mod jsonrpc;
mod notifications_http;
mod replicated;
