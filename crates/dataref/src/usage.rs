//! `dataref usage`: the usage ledger summed by agent, principal or model over a span of
//! UTC days, and each budget of `[budgets]` against its cap now. Local (the data dir's
//! sessions database) or, with `[shared]`, every replica's requests.

use std::io::Write;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use dataref_agent::SessionStore;
use dataref_agent::budget::{self, GroupBy, UsageGroup, UsageLedger};
use dataref_protocol::{Timestamp, days_from_civil};
use dataref_store::{Clock, SystemClock};
use serde_json::json;

use crate::{Common, settings};

/// What `dataref usage` was asked for.
pub struct Options<'a> {
    /// `agent`, `principal` or `model`.
    pub by: &'a str,
    /// `YYYY-MM-DD`, the first UTC day counted.
    pub since: Option<&'a str>,
    /// `YYYY-MM-DD`, the last UTC day counted.
    pub until: Option<&'a str>,
    pub json: bool,
}

/// `YYYY-MM-DD` as 00:00 UTC of that day.
fn day(s: &str, flag: &str) -> Result<Timestamp> {
    let parse = || -> Option<Timestamp> {
        let b = s.as_bytes();
        if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
            return None;
        }
        let y: i64 = s.get(0..4)?.parse().ok()?;
        let m: u32 = s.get(5..7)?.parse().ok()?;
        let d: u32 = s.get(8..10)?.parse().ok()?;
        if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
            return None;
        }
        let t = Timestamp(days_from_civil(y, m, d) * 86_400);
        // 2026-02-31 is not a day: it would come back as another.
        t.to_string().starts_with(s).then_some(t)
    };
    parse().with_context(|| {
        format!("`{s}` is not a date\nhint: give `{flag}` a UTC day as YYYY-MM-DD, e.g. 2026-12-01")
    })
}

fn by_of(s: &str) -> Result<GroupBy> {
    Ok(match s {
        "agent" => GroupBy::Agent,
        "principal" => GroupBy::Principal,
        "model" => GroupBy::Model,
        other => {
            bail!("`{other}` is not a grouping\nhint: use `--by agent`, `principal` or `model`")
        }
    })
}

/// Micro-units as an amount with four decimals.
fn cost(micros: u64) -> String {
    format!("{:.4}", micros as f64 / 1e6)
}

pub fn run(common: &Common, opts: Options<'_>) -> Result<ExitCode> {
    let by = by_of(opts.by)?;
    let since = opts.since.map(|s| day(s, "--since")).transpose()?;
    // Through the end of the day named.
    let until = opts
        .until
        .map(|s| day(s, "--until").map(|t| Timestamp(t.unix_seconds() + 86_400)))
        .transpose()?;
    if let (Some(s), Some(u)) = (since, until)
        && u <= s
    {
        bail!(
            "`--until` is before `--since`\nhint: give the first day to `--since` and the last to `--until`"
        );
    }
    let config = settings::config(common)?;
    // With `[shared]`, every replica's requests, not this data dir's.
    let ledger: std::sync::Arc<dyn UsageLedger> = match dataref_app::look_at_shared(&config)? {
        Some(shared) if !shared.pending_migrations().is_empty() => bail!(
            "the shared index has no usage ledger yet: no server of this version has set it up\n\
             hint: start `dataref serve --http` with this config once (it brings the index up to date)"
        ),
        Some(shared) => shared.usage_ledger(),
        // Read-only: reporting creates and migrates nothing.
        None => {
            match SessionStore::read_ledger(&config.home).map_err(|e| anyhow::anyhow!("{e}"))? {
                Some(l) => l,
                None => {
                    let mut out = std::io::stdout().lock();
                    if opts.json {
                        let v = json!({
                            "by": by.column(),
                            "since": since,
                            "until": until,
                            "groups": [],
                            "total": {"key": "total", "requests": 0, "prompt_tokens": 0,
                                      "completion_tokens": 0, "cost_micros": 0, "estimated": 0},
                            "budgets": [],
                            "note": "no usage recorded yet",
                        });
                        writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
                    } else {
                        writeln!(
                            out,
                            "no usage recorded yet (no agent has made a model request with this data dir: {})",
                            config.home.display()
                        )?;
                    }
                    return Ok(ExitCode::SUCCESS);
                }
            }
        }
    };
    let groups = ledger
        .report(by, since, until)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let now = SystemClock.now();
    let all: Vec<&dataref_config::Budget> = config.budgets.budgets.iter().collect();
    let uses = budget::uses(ledger.as_ref(), &all, now).map_err(|e| anyhow::anyhow!("{e}"))?;
    let total = groups.iter().fold(
        UsageGroup {
            key: "total".into(),
            requests: 0,
            prompt_tokens: 0,
            completion_tokens: 0,
            cost_micros: 0,
            estimated: 0,
        },
        |mut t, g| {
            t.requests += g.requests;
            t.prompt_tokens += g.prompt_tokens;
            t.completion_tokens += g.completion_tokens;
            t.cost_micros += g.cost_micros;
            t.estimated += g.estimated;
            t
        },
    );
    let mut out = std::io::stdout().lock();
    if opts.json {
        let group = |g: &UsageGroup| {
            json!({
                "key": g.key,
                "requests": g.requests,
                "prompt_tokens": g.prompt_tokens,
                "completion_tokens": g.completion_tokens,
                "cost_micros": g.cost_micros,
                "estimated": g.estimated,
            })
        };
        let v = json!({
            "by": by.column(),
            "since": since,
            "until": until,
            "groups": groups.iter().map(group).collect::<Vec<_>>(),
            "total": group(&total),
            "budgets": uses.iter().map(|u| json!({
                "budget": u.budget,
                "window": u.window.as_str(),
                "unit": u.unit(),
                "used": u.used,
                "cap": u.cap.limit(),
                "percent": u.percent(),
                "resets": u.resets,
            })).collect::<Vec<_>>(),
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    let head = by.column();
    let width = groups
        .iter()
        .map(|g| g.key.chars().count())
        .chain([head.len(), 5])
        .max()
        .unwrap_or(5);
    writeln!(
        out,
        "{head:<width$}  {:>8}  {:>14}  {:>17}  {:>12}  {:>9}",
        "requests", "prompt tokens", "completion tokens", "cost", "estimated"
    )?;
    for g in groups.iter().chain([&total]) {
        writeln!(
            out,
            "{:<width$}  {:>8}  {:>14}  {:>17}  {:>12}  {:>9}",
            g.key,
            budget::thousands(g.requests),
            budget::thousands(g.prompt_tokens),
            budget::thousands(g.completion_tokens),
            cost(g.cost_micros),
            budget::thousands(g.estimated),
        )?;
    }
    if !uses.is_empty() {
        let amounts: Vec<String> = uses
            .iter()
            .map(|u| match u.cap {
                dataref_config::BudgetCap::Tokens(cap) => format!(
                    "{} / {} tokens",
                    budget::thousands(u.used),
                    budget::thousands(cap)
                ),
                dataref_config::BudgetCap::Micros(cap) => {
                    format!("{} / {}", budget::money(u.used), budget::money(cap))
                }
            })
            .collect();
        let width = uses
            .iter()
            .map(|u| u.budget.len())
            .chain([6])
            .max()
            .unwrap_or(6);
        let used_width = amounts
            .iter()
            .map(String::len)
            .chain([10])
            .max()
            .unwrap_or(10);
        writeln!(out)?;
        writeln!(
            out,
            "{:<width$}  {:<6}  {:>used_width$}  {:>4}  resets",
            "budget", "window", "used / cap", "%"
        )?;
        for (u, amounts) in uses.iter().zip(&amounts) {
            writeln!(
                out,
                "{:<width$}  {:<6}  {amounts:>used_width$}  {:>4}  {}",
                u.budget,
                u.window.as_str(),
                u.percent(),
                u.resets
            )?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::day;

    #[test]
    fn days_are_checked() {
        assert_eq!(
            day("2026-12-01", "--since").map(|t| t.to_string()).ok(),
            Some("2026-12-01T00:00:00Z".into())
        );
        for bad in ["2026-02-31", "2026-13-01", "yesterday", "2026-1-1"] {
            assert!(day(bad, "--since").is_err(), "{bad}");
        }
    }
}
