//! Finding the external binary a launcher runs: the path in its environment variable, else
//! its name on `PATH`, else fixed fallbacks; missing, an error that says what installs it.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

/// What to look for and what to say when it is missing.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    /// For messages: "SeaweedFS `weed` binary".
    pub(crate) what: &'static str,
    pub(crate) var: &'static str,
    pub(crate) name: &'static str,
    pub(crate) fallbacks: Vec<PathBuf>,
    /// For the hint: what installs it.
    pub(crate) installs: &'static str,
}

/// Resolves `spec` given the value of its variable and of `PATH`.
pub(crate) fn find(spec: &Spec, var: Option<OsString>, path: Option<OsString>) -> Result<PathBuf> {
    let Spec {
        what,
        var: var_name,
        name,
        installs,
        ..
    } = spec;
    if let Some(value) = var {
        let named = PathBuf::from(value);
        if !is_executable(&named) {
            bail!(
                "`${var_name}` names `{}`, which is not an executable file\n\
                 hint: fix `{var_name}`, or unset it and run `scripts/test` ({installs})",
                named.display()
            );
        }
        return Ok(named);
    }
    let on_path = path.and_then(|p| {
        std::env::split_paths(&p)
            .map(|dir| dir.join(name))
            .find(|c| is_executable(c))
    });
    if let Some(found) = on_path {
        return Ok(found);
    }
    if let Some(found) = spec.fallbacks.iter().find(|c| is_executable(c)) {
        return Ok(found.clone());
    }
    let looked: Vec<String> = spec
        .fallbacks
        .iter()
        .map(|p| format!("`{}`", p.display()))
        .collect();
    bail!(
        "no {what}: `${var_name}` is unset, there is no `{name}` on PATH, nor {}\n\
         hint: run `scripts/test` ({installs}), or set {var_name}",
        looked.join(", ")
    )
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
