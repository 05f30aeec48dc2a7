//! dataref-mcp end to end: an rmcp client talks to a `DatarefServer` over an in-process
//! pipe, with a real `LocalStore` in a temp dir and the real SQLite sample source; and
//! upstream MCP servers (a real MCP Python SDK server, `tests/python/upstream_server.py`,
//! over stdio and Streamable HTTP) mounted behind it.
#![expect(
    clippy::disallowed_methods,
    reason = "fixtures build files and hostile trees directly, outside the code under test"
)]

mod support;

mod capabilities;
mod charts;
mod errors;
mod files;
mod progress_cancel;
mod resources;
mod tools;
mod upstream;
mod view;
