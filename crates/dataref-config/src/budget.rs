//! `[budgets]`: caps on what agents spend on models, per agent profile, per principal and
//! per named group of principals, in tokens and in money, per UTC day and per UTC month.
//! Each cap is one [`Budget`], named by its key (`budgets.agents.analyst.tokens_per_day`):
//! the name a stopped run's message and `dataref usage` show.

use std::collections::BTreeMap;

use dataref_protocol::Principal;
use schemars::JsonSchema;
use serde::Deserialize;

use crate::agent::AgentConfig;
use crate::error::{ConfigError, invalid};

/// `[budgets]`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBudgets {
    /// Caps on one agent profile's model requests, whoever sends them, by the profile's
    /// name (an `[agents.NAME]` of this file, or `default`).
    #[serde(default)]
    pub agents: BTreeMap<String, RawBudget>,
    /// Caps on one principal's model requests, whichever agent makes them, by the
    /// principal's name (letters, digits and `._@-`).
    #[serde(default)]
    pub principals: BTreeMap<String, RawBudget>,
    /// Caps shared by a named group of principals (NAME a lower-case identifier): the
    /// requests of all its members count against one cap.
    #[serde(default)]
    pub groups: BTreeMap<String, RawGroupBudget>,
}

/// `[budgets.agents.NAME]`, `[budgets.principals.NAME]`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBudget {
    /// Prompt plus completion tokens per UTC day (from 00:00 UTC). A run that would start
    /// a model request at or over it stops, saying so. No cap when absent.
    pub tokens_per_day: Option<u64>,
    /// Prompt plus completion tokens per UTC calendar month. No cap when absent.
    pub tokens_per_month: Option<u64>,
    /// Cost per UTC day, from the agents' `price_input` and `price_output` (in their
    /// currency, e.g. `20` for 20 dollars). Every agent it counts must declare prices.
    /// No cap when absent.
    pub money_per_day: Option<f64>,
    /// Cost per UTC calendar month, like `money_per_day`. No cap when absent.
    pub money_per_month: Option<f64>,
}

/// `[budgets.groups.NAME]`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawGroupBudget {
    /// The principals of the group (at least one).
    #[serde(default)]
    pub principals: Vec<String>,
    /// Prompt plus completion tokens per UTC day, all members together. No cap when absent.
    pub tokens_per_day: Option<u64>,
    /// Prompt plus completion tokens per UTC calendar month, all members together. No cap
    /// when absent.
    pub tokens_per_month: Option<u64>,
    /// Cost per UTC day, all members together (from the agents' prices). No cap when
    /// absent.
    pub money_per_day: Option<f64>,
    /// Cost per UTC calendar month, all members together. No cap when absent.
    pub money_per_month: Option<f64>,
}

/// Every cap of `[budgets]`, resolved; empty when the file has none.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BudgetConfig {
    /// In the order agents, principals, groups; by name; day before month, tokens before
    /// money.
    pub budgets: Vec<Budget>,
}

impl BudgetConfig {
    /// The budgets a request of `agent` on behalf of `principal` counts against: the
    /// agent's, the principal's, and those of every group the principal is in.
    pub fn applying_to<'a>(
        &'a self,
        agent: &'a str,
        principal: &'a str,
    ) -> impl Iterator<Item = &'a Budget> + 'a {
        self.budgets.iter().filter(move |b| match &b.scope {
            BudgetScope::Agent(a) => a == agent,
            BudgetScope::Principal(p) => p == principal,
            BudgetScope::Group { principals, .. } => principals.iter().any(|p| p == principal),
        })
    }
}

/// One cap: whose requests, over which window, of what.
#[derive(Debug, Clone, PartialEq)]
pub struct Budget {
    /// Its key in the file, e.g. `budgets.groups.finance.money_per_month`.
    pub name: String,
    pub scope: BudgetScope,
    pub window: BudgetWindow,
    pub cap: BudgetCap,
}

/// Whose requests a budget counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BudgetScope {
    /// Every request of this agent profile.
    Agent(String),
    /// Every request made for this principal.
    Principal(String),
    /// Every request made for any of these principals.
    Group {
        name: String,
        principals: Vec<String>,
    },
}

/// The calendar window a budget's use is summed over, in UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetWindow {
    Day,
    Month,
}

impl BudgetWindow {
    /// `day`, `month`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Day => "day",
            Self::Month => "month",
        }
    }
}

/// What a budget caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetCap {
    /// Prompt plus completion tokens.
    Tokens(u64),
    /// Cost in millionths of the prices' currency (`money_per_day = 2.5` is 2,500,000).
    Micros(u64),
}

impl BudgetCap {
    /// The cap as a number of its unit (tokens or micro-units).
    pub fn limit(self) -> u64 {
        match self {
            Self::Tokens(n) | Self::Micros(n) => n,
        }
    }
}

/// `price` per million tokens times `tokens`, in micro-units: what the ledger keeps.
pub fn cost_micros(prices: Option<&crate::Prices>, prompt: u64, completion: u64) -> u64 {
    let Some(p) = prices else {
        return 0;
    };
    let micros = p.cost(prompt, completion) * 1e6;
    if micros.is_finite() && micros > 0.0 {
        // Saturating: a float beyond u64 is u64::MAX.
        micros.round() as u64
    } else {
        0
    }
}

pub(crate) fn resolve_budgets(
    raw: RawBudgets,
    agents: &BTreeMap<String, AgentConfig>,
) -> Result<BudgetConfig, ConfigError> {
    let mut budgets = Vec::new();
    let unpriced: Vec<&str> = agents
        .values()
        .filter(|a| a.prices.is_none())
        .map(|a| a.name.as_str())
        .collect();
    for (name, b) in &raw.agents {
        let what = format!("budgets.agents.{name}");
        let Some(agent) = agents.get(name) else {
            return Err(invalid(
                &what,
                format!("`{name}` is no agent profile of this config"),
                format!(
                    "name one of the profiles: {}",
                    agents
                        .keys()
                        .map(|k| format!("`{k}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        };
        let money = b.money_per_day.is_some() || b.money_per_month.is_some();
        if money && agent.prices.is_none() {
            return Err(invalid(
                &what,
                format!("a money cap needs the agent's prices, and agent `{name}` declares none"),
                format!(
                    "add `price_input` and `price_output` (per million tokens) to [agents.{name}], \
                     or cap tokens instead (`tokens_per_day`, `tokens_per_month`)"
                ),
            ));
        }
        caps(
            &mut budgets,
            &what,
            BudgetScope::Agent(name.clone()),
            b.tokens_per_day,
            b.tokens_per_month,
            b.money_per_day,
            b.money_per_month,
        )?;
    }
    let check_money = |what: &str, money: bool| -> Result<(), ConfigError> {
        match unpriced.first() {
            Some(a) if money => Err(invalid(
                what,
                format!(
                    "a money cap counts every agent's cost, and agent `{a}` declares no prices"
                ),
                format!(
                    "add `price_input` and `price_output` (per million tokens) to [agents.{a}] \
                     (and to every agent without them: {}), or cap tokens instead",
                    unpriced
                        .iter()
                        .map(|a| format!("`{a}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )),
            _ => Ok(()),
        }
    };
    for (name, b) in &raw.principals {
        let what = format!("budgets.principals.{name}");
        Principal::new(name)
            .map_err(|e| invalid(&what, e.to_string(), "use letters, digits and `._@-`"))?;
        check_money(
            &what,
            b.money_per_day.is_some() || b.money_per_month.is_some(),
        )?;
        caps(
            &mut budgets,
            &what,
            BudgetScope::Principal(name.clone()),
            b.tokens_per_day,
            b.tokens_per_month,
            b.money_per_day,
            b.money_per_month,
        )?;
    }
    for (name, g) in &raw.groups {
        let what = format!("budgets.groups.{name}");
        if !crate::error::is_identifier(name) {
            return Err(invalid(
                &what,
                format!("`{name}` is not a group name"),
                "use a lower-case identifier, e.g. `[budgets.groups.finance]`",
            ));
        }
        if g.principals.is_empty() {
            return Err(invalid(
                format!("{what}.principals"),
                "a group needs at least one principal",
                "e.g. `principals = [\"alice\", \"bob\"]`",
            ));
        }
        let mut principals = Vec::with_capacity(g.principals.len());
        for p in &g.principals {
            Principal::new(p).map_err(|e| {
                invalid(
                    format!("{what}.principals"),
                    e.to_string(),
                    "use letters, digits and `._@-`",
                )
            })?;
            if !principals.contains(p) {
                principals.push(p.clone());
            }
        }
        check_money(
            &what,
            g.money_per_day.is_some() || g.money_per_month.is_some(),
        )?;
        caps(
            &mut budgets,
            &what,
            BudgetScope::Group {
                name: name.clone(),
                principals,
            },
            g.tokens_per_day,
            g.tokens_per_month,
            g.money_per_day,
            g.money_per_month,
        )?;
    }
    Ok(BudgetConfig { budgets })
}

/// The caps of one table, each a [`Budget`]; a table with none is an error.
fn caps(
    out: &mut Vec<Budget>,
    what: &str,
    scope: BudgetScope,
    tokens_per_day: Option<u64>,
    tokens_per_month: Option<u64>,
    money_per_day: Option<f64>,
    money_per_month: Option<f64>,
) -> Result<(), ConfigError> {
    let before = out.len();
    for (key, window, n) in [
        ("tokens_per_day", BudgetWindow::Day, tokens_per_day),
        ("tokens_per_month", BudgetWindow::Month, tokens_per_month),
    ] {
        let Some(n) = n else { continue };
        if n == 0 {
            return Err(invalid(
                format!("{what}.{key}"),
                "must be above zero",
                "leave the key out for no cap",
            ));
        }
        out.push(Budget {
            name: format!("{what}.{key}"),
            scope: scope.clone(),
            window,
            cap: BudgetCap::Tokens(n),
        });
    }
    for (key, window, m) in [
        ("money_per_day", BudgetWindow::Day, money_per_day),
        ("money_per_month", BudgetWindow::Month, money_per_month),
    ] {
        let Some(m) = m else { continue };
        let micros = m * 1e6;
        if !(m.is_finite() && m > 0.0 && micros < 9.0e18) {
            return Err(invalid(
                format!("{what}.{key}"),
                format!("{m} is not an amount above zero"),
                "give the amount in the currency of the agents' prices, e.g. `money_per_day = 20`",
            ));
        }
        out.push(Budget {
            name: format!("{what}.{key}"),
            scope: scope.clone(),
            window,
            cap: BudgetCap::Micros(micros.round() as u64),
        });
    }
    if out.len() == before {
        return Err(invalid(
            what,
            "the table sets no cap",
            "set `tokens_per_day`, `tokens_per_month`, `money_per_day` or `money_per_month`",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::from_toml_str(text, "/etc/dataref".as_ref(), "/var/lib/dataref".into())
    }

    #[test]
    fn budgets_resolve_per_agent_principal_and_group() {
        let c = parse(
            "[agents.analyst]\nprice_input = 1\nprice_output = 2\n\
             [agents.quick]\nprice_input = 0.1\nprice_output = 0.2\n\
             [budgets.agents.analyst]\ntokens_per_day = 1000\nmoney_per_month = 2.5\n\
             [budgets.principals.alice]\ntokens_per_month = 50\n\
             [budgets.groups.finance]\nprincipals = [\"alice\", \"bob\", \"alice\"]\nmoney_per_day = 1\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let names: Vec<&str> = c.budgets.budgets.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "budgets.agents.analyst.tokens_per_day",
                "budgets.agents.analyst.money_per_month",
                "budgets.principals.alice.tokens_per_month",
                "budgets.groups.finance.money_per_day",
            ]
        );
        assert_eq!(c.budgets.budgets[1].cap, BudgetCap::Micros(2_500_000));
        assert_eq!(
            c.budgets.budgets[3].scope,
            BudgetScope::Group {
                name: "finance".into(),
                principals: vec!["alice".into(), "bob".into()]
            }
        );
        let for_bob: Vec<&str> = c
            .budgets
            .applying_to("quick", "bob")
            .map(|b| b.name.as_str())
            .collect();
        assert_eq!(for_bob, ["budgets.groups.finance.money_per_day"]);
        assert_eq!(c.budgets.applying_to("analyst", "alice").count(), 4);
    }

    #[test]
    fn bad_budgets_are_errors_with_hints() {
        for (text, needle) in [
            (
                "[budgets.agents.nobody]\ntokens_per_day = 1",
                "no agent profile",
            ),
            (
                "[agents.a]\n[budgets.agents.a]\nmoney_per_day = 1",
                "declares none",
            ),
            (
                "[agents.a]\n[budgets.principals.alice]\nmoney_per_month = 1",
                "declares no prices",
            ),
            ("[agents.a]\n[budgets.agents.a]\n", "sets no cap"),
            (
                "[agents.a]\n[budgets.agents.a]\ntokens_per_day = 0",
                "above zero",
            ),
            (
                "[agents.a]\nprice_input = 1\nprice_output = 1\n[budgets.agents.a]\nmoney_per_day = -1",
                "not an amount",
            ),
            (
                "[budgets.groups.finance]\ntokens_per_day = 1",
                "at least one principal",
            ),
            (
                "[budgets.groups.Finance]\nprincipals = [\"a\"]\ntokens_per_day = 1",
                "not a group name",
            ),
            (
                "[budgets.principals.\"a b\"]\ntokens_per_day = 1",
                "budgets.principals",
            ),
            (
                "[budgets.agents.default]\ntokens_a_day = 1",
                "unknown field",
            ),
        ] {
            let e = parse(text).map(|_| ()).unwrap_err();
            let shown = e.to_string();
            assert!(shown.contains(needle), "{text}: {shown}");
        }
    }

    #[test]
    fn costs_are_kept_in_micro_units() {
        let p = crate::Prices {
            input_per_million: 0.15,
            output_per_million: 0.6,
        };
        assert_eq!(cost_micros(Some(&p), 1_000_000, 500_000), 450_000);
        assert_eq!(cost_micros(None, 1_000_000, 500_000), 0);
    }
}
