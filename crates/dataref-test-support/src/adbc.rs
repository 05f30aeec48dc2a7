//! Real ADBC drivers for the `adbc` source tests: the shared libraries inside the PyPI
//! wheels `adbc-driver-sqlite` and `adbc-driver-postgresql`, which `scripts/test` installs
//! into `.venv-test`.

use std::path::PathBuf;

use anyhow::{Result, bail};

/// The directory to look in first: a folder holding `libadbc_driver_<name>.so`.
pub const DRIVERS_ENV: &str = "DATAREF_ADBC_DRIVERS";

/// `libadbc_driver_<name>.so` (`sqlite`, `postgresql`): under `$DATAREF_ADBC_DRIVERS`,
/// else in the test venv's `site-packages/adbc_driver_<name>/`.
pub fn adbc_driver(name: &str) -> Result<PathBuf> {
    let file = format!("libadbc_driver_{name}.so");
    if let Some(dir) = std::env::var_os(DRIVERS_ENV) {
        let p = PathBuf::from(dir).join(&file);
        if p.is_file() {
            return Ok(p);
        }
    }
    let lib = crate::workspace_root().join(".venv-test/lib");
    if let Ok(entries) = std::fs::read_dir(&lib) {
        for e in entries.flatten() {
            let p = e
                .path()
                .join("site-packages")
                .join(format!("adbc_driver_{name}"))
                .join(&file);
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    bail!(
        "no ADBC driver `{file}` found (in ${DRIVERS_ENV} or {}/python3.*/site-packages)\n\
         hint: run `scripts/test` (it installs `adbc-driver-{name}` from PyPI into `.venv-test`)",
        lib.display()
    )
}
