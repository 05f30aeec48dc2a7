//! Where things are served: the fixed paths every other module names.

/// The MCP endpoint's path.
pub const MCP_PATH: &str = "/mcp";
/// Where a load balancer asks whether this replica can serve now.
pub const READY_PATH: &str = "/ready";
/// RFC 9728 protected-resource metadata (also at `…/mcp`).
pub(crate) const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";
