//! `dataref store verify`: every live table's bytes hashed against the checksum written
//! with them, in the local store or the shared one; what fails is named with its owner and
//! why, and with `--drop` removed (its row, then what is left of its bytes).

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::{Common, settings};

/// How often progress is said on stderr while a long check runs.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

pub fn verify(common: &Common, drop_damaged: bool) -> Result<ExitCode> {
    let config = settings::config(common)?;
    // A tool that looks leaves the shared index's schema as it is.
    let shared = dataref_app::look_at_shared(&config)?;
    if let Some(shared) = &shared
        && !shared.pending_migrations().is_empty()
    {
        anyhow::bail!(
            "the shared index is older than this dataref (no checksums or receipts yet): no server of this version has set it up\n\
             hint: start `dataref serve --http` with this config once (it brings the index up to date)"
        );
    }
    let store = dataref_app::open_store(&config, shared.as_ref())?;
    let started = Instant::now();
    let mut said = Instant::now();
    let mut err = std::io::stderr().lock();
    let report = store.verify(drop_damaged, &mut |done, total| {
        if said.elapsed() >= PROGRESS_EVERY {
            said = Instant::now();
            let _ = writeln!(err, "checked {done} of {total} tables…");
        }
    })?;
    drop(err);
    let mut out = std::io::stdout().lock();
    let where_ = if shared.is_some() {
        "the shared store"
    } else {
        "the local store"
    };
    writeln!(
        out,
        "{} tables intact in {where_} ({} bytes hashed in {:.1} s){}",
        report.intact,
        report.bytes,
        started.elapsed().as_secs_f64(),
        if report.adopted > 0 {
            format!("; {} stored before checksums now have one", report.adopted)
        } else {
            String::new()
        }
    )?;
    if report.damaged.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    writeln!(out, "{} damaged:", report.damaged.len())?;
    for d in &report.damaged {
        writeln!(out, "  {} (owner {}): {}", d.data_ref, d.owner, d.detail)?;
    }
    if drop_damaged {
        writeln!(
            out,
            "dropped {} of them (their owners fetch the data again from its source)",
            report.dropped
        )?;
        return Ok(ExitCode::SUCCESS);
    }
    writeln!(
        out,
        "hint: if a copy of the bytes exists (a backup of the data dir or the bucket), put it \
         back and run this again; otherwise `dataref store verify --drop` removes them"
    )?;
    Ok(ExitCode::FAILURE)
}
