//! Budgets: the usage ledger (one row per model request: when, for whom, which agent and
//! model, its tokens and cost) and the caps of `[budgets]` checked against it before each
//! model request of a run.
//!
//! The ledger lives beside the sessions: a table of `agent/sessions.sqlite` on one server,
//! a table of the shared index with `[shared]`, so every replica counts the same requests.
//! [`UsageLedger::used`] sums every budget that applies to a request in one statement, over
//! indexes on `(agent, at)` and `(principal, at)` that also hold the sums' columns.
//!
//! A request is checked before it is sent, with what it may take at most: its fitted prompt
//! plus its largest answer (`max_tokens`, else `answer_tokens`). A run stops when that
//! would take a budget over its cap, not only once the cap is passed.
//!
//! A request the provider did not report usage for (cancelled, out of wall time, failed,
//! or an answer without `usage`) is kept with an estimate: its fitted prompt plus the text
//! streamed so far, counted with the agent's token counter, marked `estimated`.
//!
//! A ledger that cannot be read or written does not stop a run: the request goes on, the
//! failure is logged and counted (`dataref_budget_ledger_errors_total`): a ledger out of
//! reach must not take the agents down with it.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError};

use dataref_config::{Budget, BudgetCap, BudgetConfig, BudgetScope, BudgetWindow, Prices};
use dataref_protocol::{Timestamp, civil_from_days, days_from_civil};
use serde::Serialize;

use crate::event::{AgentEvent, EventSink};
use crate::message::Usage;
use crate::session::SessionError;

/// The share of a budget at which a run is warned, in percent.
pub const WARN_PERCENT: u64 = 80;

/// One model request, as the ledger keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UsageRow {
    pub at: Timestamp,
    pub principal: String,
    pub agent: String,
    pub model: String,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// In millionths of the agent's price currency; 0 when it declares no prices.
    pub cost_micros: u64,
    /// The session the run belongs to; empty for a run kept in no session.
    pub session: String,
    /// The tokens are dataref's estimate, not the provider's count (the request was
    /// cancelled, ran out of time or failed, or the provider sent no usage).
    pub estimated: bool,
}

/// Whose requests one sum counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UsageScope {
    Agent(String),
    Principals(Vec<String>),
}

/// One sum to take: the requests of `scope` since `since`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageQuery {
    pub scope: UsageScope,
    pub since: Timestamp,
}

/// What one [`UsageQuery`] found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Used {
    /// Prompt plus completion tokens.
    pub tokens: u64,
    pub cost_micros: u64,
}

/// What `dataref usage` groups by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupBy {
    Agent,
    Principal,
    Model,
}

impl GroupBy {
    /// The ledger's column.
    pub fn column(self) -> &'static str {
        match self {
            Self::Agent => "agent",
            Self::Principal => "principal",
            Self::Model => "model",
        }
    }
}

/// One line of `dataref usage`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UsageGroup {
    /// The agent, principal or model.
    pub key: String,
    pub requests: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cost_micros: u64,
    /// How many of `requests` have estimated tokens ([`UsageRow::estimated`]).
    pub estimated: u64,
}

/// Where the rows of model requests are kept. Every method may block (a file, a round trip
/// to a server): async callers run them on the blocking pool.
pub trait UsageLedger: Send + Sync + std::fmt::Debug {
    /// Keeps one row.
    fn record(&self, row: &UsageRow) -> Result<(), SessionError>;

    /// Each query's sum, in order, taken in one statement.
    fn used(&self, queries: &[UsageQuery]) -> Result<Vec<Used>, SessionError>;

    /// The requests from `since` (included) to `until` (excluded), summed by `by`, the
    /// largest token count first.
    fn report(
        &self,
        by: GroupBy,
        since: Option<Timestamp>,
        until: Option<Timestamp>,
    ) -> Result<Vec<UsageGroup>, SessionError>;
}

/// A value bound to a ledger statement (the backends' own types differ).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SqlValue {
    Text(String),
    Int(i64),
}

/// The one statement of [`UsageLedger::used`] over the table `table`, its placeholders
/// `{mark}1`, `{mark}2`, … (`?` for SQLite, `$` for PostgreSQL), and what to bind. Each
/// query is a pair of columns (tokens, cost); the `WHERE` is an `OR` of the queries' own
/// conditions, each served by an index on `(agent, at)` or `(principal, at)`.
pub fn used_statement(table: &str, mark: char, queries: &[UsageQuery]) -> (String, Vec<SqlValue>) {
    let mut binds: Vec<SqlValue> = Vec::new();
    let mut bind = |v: SqlValue| {
        binds.push(v);
        format!("{mark}{}", binds.len())
    };
    let mut conds = Vec::with_capacity(queries.len());
    for q in queries {
        let at = bind(SqlValue::Int(q.since.unix_seconds()));
        let cond = match &q.scope {
            UsageScope::Agent(a) => format!(
                "(agent = {} AND at >= {at})",
                bind(SqlValue::Text(a.clone()))
            ),
            UsageScope::Principals(ps) => {
                let list: Vec<String> =
                    ps.iter().map(|p| bind(SqlValue::Text(p.clone()))).collect();
                format!("(principal IN ({}) AND at >= {at})", list.join(", "))
            }
        };
        conds.push(cond);
    }
    let mut sql = String::from("SELECT ");
    for (i, c) in conds.iter().enumerate() {
        if i > 0 {
            sql.push_str(", ");
        }
        let _ = write!(
            sql,
            "CAST(COALESCE(SUM(CASE WHEN {c} THEN prompt_tokens + completion_tokens ELSE 0 END), 0) AS BIGINT), \
             CAST(COALESCE(SUM(CASE WHEN {c} THEN cost_micros ELSE 0 END), 0) AS BIGINT)"
        );
    }
    let _ = write!(sql, " FROM {table} WHERE {}", conds.join(" OR "));
    (sql, binds)
}

/// Where `window` began at `now` (00:00 UTC of the day, or of the month's first day).
pub fn window_start(window: BudgetWindow, now: Timestamp) -> Timestamp {
    let day = now.unix_seconds().div_euclid(86_400);
    match window {
        BudgetWindow::Day => Timestamp(day * 86_400),
        BudgetWindow::Month => {
            let (y, m, _) = civil_from_days(day);
            Timestamp(days_from_civil(y, m, 1) * 86_400)
        }
    }
}

/// When `window` starts again after `now` (the budget's reset).
pub fn window_end(window: BudgetWindow, now: Timestamp) -> Timestamp {
    let day = now.unix_seconds().div_euclid(86_400);
    match window {
        BudgetWindow::Day => Timestamp((day + 1) * 86_400),
        BudgetWindow::Month => {
            let (y, m, _) = civil_from_days(day);
            let (y, m) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
            Timestamp(days_from_civil(y, m, 1) * 86_400)
        }
    }
}

/// A budget's use at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetUse {
    /// The budget's key (`budgets.agents.analyst.tokens_per_day`).
    pub budget: String,
    pub window: BudgetWindow,
    /// Tokens, or micro-units of money, as the cap.
    pub used: u64,
    /// What the next request may take at most, in the cap's unit: its fitted prompt plus
    /// its largest answer (0 when no request is checked, e.g. in `dataref usage`).
    pub estimate: u64,
    pub cap: BudgetCap,
    /// When the window starts again.
    pub resets: Timestamp,
}

impl BudgetUse {
    /// `tokens` or `micros`: the unit of `used` and the cap.
    pub fn unit(&self) -> &'static str {
        match self.cap {
            BudgetCap::Tokens(_) => "tokens",
            BudgetCap::Micros(_) => "micros",
        }
    }

    /// Whole percent of the cap used (0 for a cap of 0, which config refuses).
    pub fn percent(&self) -> u64 {
        let cap = self.cap.limit();
        if cap == 0 {
            return 0;
        }
        u64::try_from(u128::from(self.used) * 100 / u128::from(cap)).unwrap_or(u64::MAX)
    }

    /// Whether the next request would take the budget over its cap: what was used plus
    /// the request's estimate is more than the cap (or the cap is reached already).
    pub fn would_go_over(&self) -> bool {
        let cap = self.cap.limit();
        self.used >= cap || self.used.saturating_add(self.estimate) > cap
    }

    /// `800 tokens used, about 1,200 more for the request, of 1,000 tokens`: why a request
    /// was not sent.
    pub fn over_by(&self) -> String {
        match self.cap {
            BudgetCap::Tokens(cap) => format!(
                "{} tokens used, up to {} more for the next request, cap {} tokens",
                thousands(self.used),
                thousands(self.estimate),
                thousands(cap)
            ),
            BudgetCap::Micros(cap) => format!(
                "{} used, up to {} more for the next request, cap {} (in the agents' price \
                 currency)",
                money(self.used),
                money(self.estimate),
                money(cap)
            ),
        }
    }

    /// `1,200 of 1,000 tokens`, `2.50 of 2.00 (the prices' currency)`.
    pub fn amounts(&self) -> String {
        match self.cap {
            BudgetCap::Tokens(cap) => {
                format!("{} of {} tokens", thousands(self.used), thousands(cap))
            }
            BudgetCap::Micros(cap) => format!(
                "{} of {} (in the agents' price currency)",
                money(self.used),
                money(cap)
            ),
        }
    }

    fn event(&self, stopped: bool) -> AgentEvent {
        AgentEvent::Budget {
            budget: self.budget.clone(),
            window: self.window.as_str().to_owned(),
            unit: self.unit().to_owned(),
            used: self.used,
            estimate: if stopped { self.estimate } else { 0 },
            cap: self.cap.limit(),
            percent: self.percent(),
            resets: self.resets,
            stopped,
        }
    }
}

/// `1234567` as `1,234,567`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Micro-units as an amount with two decimals (`2500000` as `2.50`).
pub fn money(micros: u64) -> String {
    let cents = (micros + 5_000) / 10_000;
    format!("{}.{:02}", thousands(cents / 100), cents % 100)
}

/// The budgets in `budgets` a request of `agent` for `principal` counts against, with
/// what each has used at `now`, from one ledger statement.
pub fn uses(
    ledger: &dyn UsageLedger,
    budgets: &[&Budget],
    now: Timestamp,
) -> Result<Vec<BudgetUse>, SessionError> {
    if budgets.is_empty() {
        return Ok(Vec::new());
    }
    let queries: Vec<UsageQuery> = budgets
        .iter()
        .map(|b| UsageQuery {
            scope: match &b.scope {
                BudgetScope::Agent(a) => UsageScope::Agent(a.clone()),
                BudgetScope::Principal(p) => UsageScope::Principals(vec![p.clone()]),
                BudgetScope::Group { principals, .. } => UsageScope::Principals(principals.clone()),
            },
            since: window_start(b.window, now),
        })
        .collect();
    let used = ledger.used(&queries)?;
    Ok(budgets
        .iter()
        .zip(used)
        .map(|(b, u)| BudgetUse {
            budget: b.name.clone(),
            window: b.window,
            used: match b.cap {
                BudgetCap::Tokens(_) => u.tokens,
                BudgetCap::Micros(_) => u.cost_micros,
            },
            estimate: 0,
            cap: b.cap,
            resets: window_end(b.window, now),
        })
        .collect())
}

/// What an agent's runs count against: the ledger and every budget of the config. Held by
/// the agent (its runs through any host are counted).
#[derive(Debug, Clone)]
pub struct Metering {
    pub ledger: Arc<dyn UsageLedger>,
    pub budgets: Arc<BudgetConfig>,
}

/// One run's metering: who it is for, what its budgets had used at the last check, and the
/// budgets it was warned about already.
pub(crate) struct RunMeter<'a> {
    pub metering: &'a Metering,
    pub agent: &'a str,
    pub model: &'a str,
    pub principal: &'a str,
    pub session: &'a str,
    pub prices: Option<&'a Prices>,
    pub state: Mutex<MeterState>,
}

/// What a [`RunMeter`] keeps between its checks.
#[derive(Default)]
pub(crate) struct MeterState {
    /// The budgets' use as the last check found it, plus this run's requests since.
    uses: Vec<BudgetUse>,
    /// (budget, window start) pairs a warning went out for in this run.
    warned: HashSet<(String, i64)>,
}

impl MeterState {
    /// Warns about each budget at or past [`WARN_PERCENT`] not warned about yet in this
    /// window.
    fn warn(&mut self, now: Timestamp, events: &dyn EventSink) {
        for u in &self.uses {
            if u.percent() < WARN_PERCENT {
                continue;
            }
            let key = (u.budget.clone(), window_start(u.window, now).unix_seconds());
            if self.warned.insert(key) {
                dataref_ops::metrics::budget_event(&u.budget, "warned");
                events.event(u.event(false));
            }
        }
    }
}

impl RunMeter<'_> {
    fn state(&self) -> std::sync::MutexGuard<'_, MeterState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Before a model request, with what it may take at most (`next`: its fitted prompt
    /// and its largest answer): the first budget it would take over its cap stops the run;
    /// each budget at or past [`WARN_PERCENT`] of its cap is warned about once per window
    /// per run.
    pub(crate) async fn check(
        &self,
        now: Timestamp,
        next: Usage,
        events: &dyn EventSink,
    ) -> Option<BudgetUse> {
        let budgets: Vec<Budget> = self
            .metering
            .budgets
            .applying_to(self.agent, self.principal)
            .cloned()
            .collect();
        if budgets.is_empty() {
            return None;
        }
        let ledger = self.metering.ledger.clone();
        let found = tokio::task::spawn_blocking(move || {
            let refs: Vec<&Budget> = budgets.iter().collect();
            uses(ledger.as_ref(), &refs, now)
        })
        .await;
        let mut uses = match found {
            Ok(Ok(u)) => u,
            Ok(Err(e)) => {
                dataref_ops::metrics::budget_ledger_error();
                tracing::warn!(error = %e, "the usage ledger could not be read; the request goes on unchecked");
                self.state().uses.clear();
                return None;
            }
            Err(e) => {
                dataref_ops::metrics::budget_ledger_error();
                tracing::warn!(error = %e, "the budget check ended abnormally; the request goes on unchecked");
                self.state().uses.clear();
                return None;
            }
        };
        let next_cost = dataref_config::budget::cost_micros(
            self.prices,
            next.prompt_tokens,
            next.completion_tokens,
        );
        for u in &mut uses {
            u.estimate = match u.cap {
                BudgetCap::Tokens(_) => next.total(),
                BudgetCap::Micros(_) => next_cost,
            };
        }
        if let Some(over) = uses.iter().find(|u| u.would_go_over()) {
            dataref_ops::metrics::budget_event(&over.budget, "stopped");
            events.event(over.event(true));
            return Some(over.clone());
        }
        let mut state = self.state();
        state.uses = uses;
        state.warn(now, events);
        None
    }

    /// After a model request: its row in the ledger (`estimated` when the provider did not
    /// count it), and the warning of a budget this request took past [`WARN_PERCENT`]
    /// (counted from the last check, with no query).
    pub(crate) async fn record(
        &self,
        now: Timestamp,
        usage: Usage,
        estimated: bool,
        events: &dyn EventSink,
    ) {
        let cost_micros = dataref_config::budget::cost_micros(
            self.prices,
            usage.prompt_tokens,
            usage.completion_tokens,
        );
        let row = UsageRow {
            at: now,
            principal: self.principal.to_owned(),
            agent: self.agent.to_owned(),
            model: self.model.to_owned(),
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
            cost_micros,
            session: self.session.to_owned(),
            estimated,
        };
        let ledger = self.metering.ledger.clone();
        match tokio::task::spawn_blocking(move || ledger.record(&row)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                dataref_ops::metrics::budget_ledger_error();
                tracing::warn!(error = %e, "a model request could not be kept in the usage ledger")
            }
            Err(e) => {
                dataref_ops::metrics::budget_ledger_error();
                tracing::warn!(error = %e, "keeping a model request in the usage ledger ended abnormally")
            }
        }
        let mut state = self.state();
        for u in &mut state.uses {
            u.used = u.used.saturating_add(match u.cap {
                BudgetCap::Tokens(_) => usage.total(),
                BudgetCap::Micros(_) => cost_micros,
            });
        }
        state.warn(now, events);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_utc_days_and_calendar_months() {
        let t = Timestamp::parse_rfc3339("2026-12-31T23:59:59Z").unwrap_or(Timestamp(0));
        assert_eq!(
            window_start(BudgetWindow::Day, t).to_string(),
            "2026-12-31T00:00:00Z"
        );
        assert_eq!(
            window_end(BudgetWindow::Day, t).to_string(),
            "2027-01-01T00:00:00Z"
        );
        assert_eq!(
            window_start(BudgetWindow::Month, t).to_string(),
            "2026-12-01T00:00:00Z"
        );
        assert_eq!(
            window_end(BudgetWindow::Month, t).to_string(),
            "2027-01-01T00:00:00Z"
        );
        let f = Timestamp::parse_rfc3339("2028-02-29T12:00:00Z").unwrap_or(Timestamp(0));
        assert_eq!(
            window_end(BudgetWindow::Month, f).to_string(),
            "2028-03-01T00:00:00Z"
        );
    }

    #[test]
    fn amounts_read_well() {
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(thousands(12), "12");
        assert_eq!(money(2_500_000), "2.50");
        assert_eq!(money(1_234_567_890), "1,234.57");
    }

    #[test]
    fn the_statement_binds_every_value() {
        let (sql, binds) = used_statement(
            "usage",
            '?',
            &[
                UsageQuery {
                    scope: UsageScope::Agent("a".into()),
                    since: Timestamp(10),
                },
                UsageQuery {
                    scope: UsageScope::Principals(vec!["p".into(), "q".into()]),
                    since: Timestamp(20),
                },
            ],
        );
        assert!(sql.contains("(agent = ?2 AND at >= ?1)"), "{sql}");
        assert!(
            sql.contains("(principal IN (?4, ?5) AND at >= ?3)"),
            "{sql}"
        );
        assert_eq!(binds.len(), 5);
    }
}
