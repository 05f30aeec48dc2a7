//! `[audit]`: the append-only, hash-chained record of every data access (who read which
//! data, with which tool, query and parameters; exports, downloads, approvals and refused
//! logins; never row values).

use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::Deserialize;

use crate::error::{ConfigError, invalid};
use crate::raw::RawSize;
use crate::units::size;

/// `[audit]`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAudit {
    /// Keep the audit trail: one JSON line per data access (tool calls with their
    /// arguments, downloads, approvals, refused logins), never row values, each line
    /// hash-chained to the one before (`dataref audit verify` checks the chain). Default
    /// true, for every command that serves tools (`serve`, `web`, `chat`, `ask`).
    pub enabled: Option<bool>,
    /// The trail's directory, relative to this file. Default `<data dir>/audit`.
    pub dir: Option<String>,
    /// A file is closed and the next one (`audit-000002.jsonl`, …) started before it would
    /// grow past this size; the chain goes on across files. Default `64MiB`, at least `4KiB`.
    pub rotate: Option<RawSize>,
}

/// The audit trail (`[audit]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditConfig {
    /// Keep it. Default true.
    pub enabled: bool,
    /// Its directory, absolute. Default `<data dir>/audit`.
    pub dir: PathBuf,
    /// A file's size before the next starts. Default 64 MiB.
    pub rotate: u64,
}

impl AuditConfig {
    pub const DEFAULT_ROTATE: u64 = 64 << 20;
    const MIN_ROTATE: u64 = 4 << 10;

    /// Every default, the trail under `home`.
    pub fn default_in(home: &Path) -> Self {
        Self {
            enabled: true,
            dir: home.join("audit"),
            rotate: Self::DEFAULT_ROTATE,
        }
    }
}

pub(crate) fn resolve_audit(
    raw: RawAudit,
    base: &Path,
    home: &Path,
) -> Result<AuditConfig, ConfigError> {
    let d = AuditConfig::default_in(home);
    let rotate = size("audit.rotate", &raw.rotate, d.rotate)?;
    if rotate < AuditConfig::MIN_ROTATE {
        return Err(invalid(
            "audit.rotate",
            format!("{rotate} bytes is too small for a file of the trail"),
            "write at least `4KiB`; the default is `64MiB`",
        ));
    }
    let dir = match raw.dir {
        Some(d) if d.trim().is_empty() => {
            return Err(invalid(
                "audit.dir",
                "is empty",
                "leave it out for `<data dir>/audit`, or name a directory",
            ));
        }
        Some(d) => base.join(d),
        None => d.dir,
    };
    Ok(AuditConfig {
        enabled: raw.enabled.unwrap_or(d.enabled),
        dir,
        rotate,
    })
}

#[cfg(test)]
mod tests {
    use crate::Config;

    fn parse(text: &str) -> Result<Config, crate::ConfigError> {
        Config::from_toml_str(text, "/etc/dataref".as_ref(), "/var/lib/dataref".into())
    }

    #[test]
    fn defaults_under_the_data_dir() {
        let c = parse("").unwrap();
        assert!(c.audit.enabled);
        assert_eq!(c.audit.dir, std::path::Path::new("/var/lib/dataref/audit"));
        assert_eq!(c.audit.rotate, 64 << 20);
    }

    #[test]
    fn keys_resolve() {
        let c = parse("[audit]\nenabled = false\ndir = \"trail\"\nrotate = \"1MiB\"").unwrap();
        assert!(!c.audit.enabled);
        assert_eq!(c.audit.dir, std::path::Path::new("/etc/dataref/trail"));
        assert_eq!(c.audit.rotate, 1 << 20);
        let c = parse("[audit]\ndir = \"/srv/audit\"\nrotate = 100000").unwrap();
        assert_eq!(c.audit.dir, std::path::Path::new("/srv/audit"));
        assert_eq!(c.audit.rotate, 100_000);
    }

    #[test]
    fn bad_keys_are_errors_with_hints() {
        let e = parse("[audit]\nrotate = \"12 parsecs\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("audit.rotate"), "{e}");
        let e = parse("[audit]\nrotate = 10").unwrap_err().to_string();
        assert!(e.contains("4KiB"), "{e}");
        let e = parse("[audit]\ndir = \"\"").unwrap_err().to_string();
        assert!(e.contains("audit.dir"), "{e}");
        assert!(parse("[audit]\nsize = 1").is_err());
    }
}
