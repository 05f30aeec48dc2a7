//! Every environment variable dataref reads, in one place.

/// Data directory (artifacts, index, workspaces, the managed Python runtime).
/// Default: `$XDG_DATA_HOME/dataref`, else `~/.local/share/dataref`.
pub const DATAREF_HOME: &str = "DATAREF_HOME";
/// Path of `dataref.toml`. Without it (and without `--config`), dataref serves the built-in
/// sample database.
pub const DATAREF_CONFIG: &str = "DATAREF_CONFIG";
/// The principal for stdio sessions. Default: `server.principal` in config, else `local`.
pub const DATAREF_PRINCIPAL: &str = "DATAREF_PRINCIPAL";
/// Log filter for stderr, in `tracing` `EnvFilter` syntax (e.g. `dataref=debug`).
pub const DATAREF_LOG: &str = "DATAREF_LOG";
/// Used to find the default data directory.
pub const XDG_DATA_HOME: &str = "XDG_DATA_HOME";
/// Used to find the default data directory.
pub const HOME: &str = "HOME";
