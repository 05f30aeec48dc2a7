//! Budgets on real parts: the usage ledger in the real sessions database, the model played
//! by the scripted OpenAI-compatible server over a real socket. A run stops before a
//! request that would take a budget over its cap (what was used plus the request's prompt
//! and largest answer), naming the budget; the 80% warning comes once; a principal's and a
//! group's budgets stop runs of any agent profile; a request cancelled, out of time or
//! failed is kept in the ledger with an estimate.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dataref_agent::budget::{GroupBy, UsageLedger, UsageQuery, UsageRow, UsageScope};
use dataref_agent::{AgentEvent, AgentHost, NoOneToAsk, SendRequest, Sent, Stopped};
use dataref_config::{Budget, BudgetCap, BudgetConfig, BudgetScope, BudgetWindow, Config};
use dataref_protocol::{Principal, Timestamp};
use dataref_store::{ArtifactStore, LocalStore, StoreLimits, SystemClock};
use dataref_test_support::model_server::{Call, Reply, ScriptedModel};
use dataref_tool::SharedContext;
use tokio_util::sync::CancellationToken;

use crate::run::Events;

struct Fixture {
    _home: tempfile::TempDir,
    host: AgentHost,
    shared: SharedContext,
    model: ScriptedModel,
}

/// The largest answer the fixture's profiles ask for (`max_tokens`): part of each request's
/// estimate.
const MAX_ANSWER: u64 = 100;

/// Two profiles, `default` and `other`, on one scripted model, and `budgets`.
fn fixture(script: Vec<Reply>, budgets: Vec<Budget>) -> Fixture {
    fixture_with(script, budgets, |_| {})
}

fn fixture_with(
    script: Vec<Reply>,
    budgets: Vec<Budget>,
    edit: impl FnOnce(&mut dataref_config::AgentConfig),
) -> Fixture {
    let home = tempfile::tempdir().unwrap();
    let model = ScriptedModel::start(script).unwrap();
    let mut config = Config::builtin_sample_with_env(home.path().to_owned(), 100, &|_| None);
    let profile = config.agents.get_mut("default").unwrap();
    profile.model.url = Some(model.url());
    profile.model.model = Some("gpt-4o".into());
    profile.model.max_retries = 0;
    profile.model.max_tokens = Some(MAX_ANSWER as u32);
    edit(profile);
    let mut other = profile.clone();
    other.name = "other".into();
    other.model.model = Some("gpt-4o-mini".into());
    config.agents.insert("other".into(), other);
    config.budgets = BudgetConfig { budgets };
    let store: Arc<dyn ArtifactStore> = Arc::new(
        LocalStore::open(home.path(), StoreLimits::default(), Arc::new(SystemClock)).unwrap(),
    );
    let registry = dataref_builtins::builtin_registry_with(&config, None).unwrap();
    let host = AgentHost::build(&config, &registry).unwrap();
    let shared = SharedContext {
        home: config.home.clone(),
        store,
        limits: config.limits.clone(),
        clock: Arc::new(SystemClock),
        mirrors: None,
    };
    Fixture {
        _home: home,
        host,
        shared,
        model,
    }
}

impl Fixture {
    async fn send(&self, principal: &str, agent: &str, message: &str) -> (Sent, Vec<AgentEvent>) {
        self.send_until(principal, agent, message, CancellationToken::new())
            .await
    }

    async fn send_until(
        &self,
        principal: &str,
        agent: &str,
        message: &str,
        cancel: CancellationToken,
    ) -> (Sent, Vec<AgentEvent>) {
        let p = Principal::new(principal).unwrap();
        let ws = Arc::new(self.shared.principal_workspace(&p).unwrap());
        let events = Events::default();
        let sent = self
            .host
            .send(SendRequest {
                ctx: self.shared.context(p, ws),
                agent: Some(agent),
                session: None,
                message: message.to_owned(),
                events: &events,
                approver: &NoOneToAsk,
                cancel,
            })
            .await
            .unwrap();
        (sent, events.take())
    }

    fn ledger(&self) -> Arc<dyn UsageLedger> {
        self.host.sessions.ledger().expect("a usage ledger")
    }
}

fn budget(name: &str, scope: BudgetScope, tokens_per_day: u64) -> Budget {
    Budget {
        name: name.into(),
        scope,
        window: BudgetWindow::Day,
        cap: BudgetCap::Tokens(tokens_per_day),
    }
}

/// A call the loop answers without running anything (no such tool), so the run goes on.
fn a_call(id: &str) -> Reply {
    Reply::tool_calls(vec![Call::new(id, "no_such_tool", "{}")])
}

/// The budget events of a run: (budget, stopped).
fn budget_events(events: &[AgentEvent]) -> Vec<(String, bool, u64)> {
    events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::Budget {
                budget,
                stopped,
                percent,
                ..
            } => Some((budget.clone(), *stopped, *percent)),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_that_would_go_over_a_daily_token_budget_stops_before_the_request() {
    const NAME: &str = "budgets.agents.default.tokens_per_day";
    let f = fixture(
        vec![
            a_call("c1").usage(79_000, 1_000),
            a_call("c2").usage(19_000, 500),
            Reply::text("never asked for"),
        ],
        vec![budget(NAME, BudgetScope::Agent("default".into()), 100_000)],
    );
    let (sent, events) = f.send("alice", "default", "how did sales go?").await;
    // Two requests: 99,500 of 100,000 tokens are used, under the cap, but the third
    // request (its prompt plus up to MAX_ANSWER tokens of answer) would go over it.
    assert_eq!(f.model.requests().len(), 2);
    assert_eq!(f.model.remaining(), 1);
    let Some(Stopped::Budget(over)) = &sent.run.stopped else {
        panic!("{:?}", sent.run.stopped);
    };
    assert_eq!(over.budget, NAME);
    assert_eq!(over.used, 99_500);
    // The estimate is the third request's fitted prompt (longer than the second's) plus
    // its largest answer.
    let second_prompt = sent.run.requests[1].context_tokens;
    assert!(
        over.estimate > second_prompt + MAX_ANSWER,
        "{} vs {second_prompt}",
        over.estimate
    );
    let answer = &sent.run.answer;
    assert!(answer.contains(NAME), "{answer}");
    assert!(answer.contains("would take the budget"), "{answer}");
    assert!(
        answer.contains(&format!(
            "99,500 tokens used, up to {} more for the next request, cap 100,000 tokens this UTC day",
            dataref_agent::budget::thousands(over.estimate)
        )),
        "{answer}"
    );
    assert!(answer.contains("resets at"), "{answer}");
    // Warned once at 80% (80,000 of 100,000), then stopped at 99%.
    assert_eq!(
        budget_events(&events),
        [(NAME.to_owned(), false, 80), (NAME.to_owned(), true, 99)]
    );
    let stop = events
        .iter()
        .find_map(|e| match e {
            AgentEvent::Budget {
                stopped: true,
                estimate,
                ..
            } => Some(*estimate),
            _ => None,
        })
        .unwrap();
    assert_eq!(stop, over.estimate);
    let last = events.last().unwrap();
    assert!(
        matches!(last, AgentEvent::Final { stopped: Some(s), .. } if s == "budget"),
        "{last:?}"
    );
    // The next run of the agent stops before its first request.
    let (again, _) = f.send("bob", "default", "and now?").await;
    assert!(matches!(again.run.stopped, Some(Stopped::Budget(_))));
    assert_eq!(f.model.requests().len(), 2);
    // The ledger kept both requests with the model's name, as the provider counted them.
    let rows = f.ledger().report(GroupBy::Model, None, None).unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].key, "gpt-4o");
    assert_eq!(
        (
            rows[0].requests,
            rows[0].prompt_tokens,
            rows[0].completion_tokens,
            rows[0].estimated
        ),
        (2, 98_000, 1_500, 0)
    );
}

/// A request that fits exactly under the cap is sent: the check is "would go over", not
/// "would reach 80%".
#[tokio::test(flavor = "multi_thread")]
async fn a_request_that_fits_under_the_cap_is_sent() {
    const NAME: &str = "budgets.agents.default.tokens_per_day";
    let f = fixture(
        vec![Reply::text("Done.").usage(10, 10)],
        vec![budget(
            NAME,
            BudgetScope::Agent("default".into()),
            1_000_000,
        )],
    );
    let (sent, events) = f.send("alice", "default", "one").await;
    assert_eq!(sent.run.stopped, None, "{}", sent.run.answer);
    assert_eq!(budget_events(&events), []);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_warning_at_80_percent_comes_once_per_run() {
    const NAME: &str = "budgets.agents.default.tokens_per_day";
    let f = fixture(
        vec![
            a_call("c1").usage(850_000, 0),
            a_call("c2").usage(10, 0),
            a_call("c3").usage(10, 0),
            Reply::text("Done.").usage(10, 0),
        ],
        vec![budget(
            NAME,
            BudgetScope::Agent("default".into()),
            1_000_000,
        )],
    );
    let (sent, events) = f.send("alice", "default", "go").await;
    assert_eq!(sent.run.stopped, None, "{}", sent.run.answer);
    assert_eq!(f.model.requests().len(), 4);
    assert_eq!(budget_events(&events), [(NAME.to_owned(), false, 85)]);
    // The warning's event names the window and when it resets.
    let warning = events
        .iter()
        .find_map(|e| match e {
            AgentEvent::Budget { window, resets, .. } => Some((window.clone(), *resets)),
            _ => None,
        })
        .unwrap();
    assert_eq!(warning.0, "day");
    assert_eq!(warning.1.unix_seconds() % 86_400, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_request_that_crosses_80_percent_is_warned_about_in_its_own_run() {
    const NAME: &str = "budgets.principals.alice.tokens_per_day";
    let f = fixture(
        vec![Reply::text("Done.").usage(850_000, 50_000)],
        vec![budget(
            NAME,
            BudgetScope::Principal("alice".into()),
            1_000_000,
        )],
    );
    let (sent, events) = f.send("alice", "default", "one question").await;
    assert_eq!(sent.run.stopped, None);
    assert_eq!(budget_events(&events), [(NAME.to_owned(), false, 90)]);
    // The warning comes before the answer's final event.
    let warned = events
        .iter()
        .position(|e| matches!(e, AgentEvent::Budget { .. }))
        .unwrap();
    let last = events
        .iter()
        .position(|e| matches!(e, AgentEvent::Final { .. }))
        .unwrap();
    assert!(warned < last);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_principal_budget_stops_runs_of_every_agent_profile() {
    const NAME: &str = "budgets.principals.alice.tokens_per_day";
    let f = fixture(
        vec![
            Reply::text("First.").usage(120_000, 0),
            Reply::text("For bob.").usage(600, 0),
        ],
        vec![budget(
            NAME,
            BudgetScope::Principal("alice".into()),
            100_000,
        )],
    );
    let (first, _) = f.send("alice", "other", "one").await;
    assert_eq!(first.run.stopped, None);
    // Another profile, the same principal: stopped before any request.
    let (second, events) = f.send("alice", "default", "two").await;
    let Some(Stopped::Budget(over)) = &second.run.stopped else {
        panic!("{:?}", second.run.stopped);
    };
    assert_eq!(over.budget, NAME);
    assert_eq!(budget_events(&events), [(NAME.to_owned(), true, 120)]);
    assert_eq!(f.model.requests().len(), 1);
    // Another principal is not held by alice's budget.
    let (bob, _) = f.send("bob", "default", "three").await;
    assert_eq!(bob.run.stopped, None);
    assert_eq!(f.model.requests().len(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_group_budget_counts_every_member_on_every_profile() {
    const NAME: &str = "budgets.groups.finance.tokens_per_day";
    let f = fixture(
        vec![
            Reply::text("For carol.").usage(80_000, 20_000),
            Reply::text("For erin.").usage(10, 0),
        ],
        vec![budget(
            NAME,
            BudgetScope::Group {
                name: "finance".into(),
                principals: vec!["carol".into(), "dave".into()],
            },
            100_000,
        )],
    );
    let (carol, _) = f.send("carol", "default", "one").await;
    assert_eq!(carol.run.stopped, None);
    let (dave, _) = f.send("dave", "other", "two").await;
    let Some(Stopped::Budget(over)) = &dave.run.stopped else {
        panic!("{:?}", dave.run.stopped);
    };
    assert_eq!(over.budget, NAME);
    assert!(dave.run.answer.contains(NAME), "{}", dave.run.answer);
    assert_eq!(f.model.requests().len(), 1);
    let (erin, _) = f.send("erin", "other", "three").await;
    assert_eq!(erin.run.stopped, None);
}

/// The check's one statement over a month of a busy server's requests: measured, and
/// bounded well below a model request's own latency.
#[test]
fn the_budget_check_is_one_indexed_statement_and_cheap() {
    let home = tempfile::tempdir().unwrap();
    let store = dataref_agent::SessionStore::open(home.path()).unwrap();
    let ledger = store.ledger().unwrap();
    let now = Timestamp::now();
    let start = Instant::now();
    const ROWS: i64 = 200_000;
    // 200,000 requests over 30 days, 50 principals, 10 agents.
    for i in 0..ROWS {
        ledger
            .record(&UsageRow {
                at: Timestamp(now.unix_seconds() - (i * 13) % (30 * 86_400)),
                principal: format!("p{}", i % 50),
                agent: format!("a{}", i % 10),
                model: "m".into(),
                prompt_tokens: 1_000,
                completion_tokens: 100,
                cost_micros: 1_500,
                session: format!("s{}", i % 1_000),
                estimated: false,
            })
            .unwrap();
    }
    let filled = start.elapsed();
    let day = dataref_agent::budget::window_start(BudgetWindow::Day, now);
    let month = dataref_agent::budget::window_start(BudgetWindow::Month, now);
    let queries = vec![
        UsageQuery {
            scope: UsageScope::Agent("a3".into()),
            since: day,
        },
        UsageQuery {
            scope: UsageScope::Agent("a3".into()),
            since: month,
        },
        UsageQuery {
            scope: UsageScope::Principals(vec!["p7".into()]),
            since: month,
        },
        UsageQuery {
            scope: UsageScope::Principals((0..10).map(|i| format!("p{i}")).collect()),
            since: day,
        },
    ];
    let mut times = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        let used = ledger.used(&queries).unwrap();
        times.push(t.elapsed());
        assert!(used[1].tokens >= used[0].tokens);
    }
    times.sort();
    let median = times[times.len() / 2];
    eprintln!(
        "budget check over {ROWS} ledger rows (filled in {filled:?}): median {median:?}, max {:?}",
        times[times.len() - 1]
    );
    assert!(median < Duration::from_millis(250), "{median:?}");
}

/// What the ledger kept for `agent`: (requests, prompt tokens, completion tokens,
/// estimated requests).
fn kept(f: &Fixture, agent: &str) -> (u64, u64, u64, u64) {
    f.ledger()
        .report(GroupBy::Agent, None, None)
        .unwrap()
        .into_iter()
        .find(|g| g.key == agent)
        .map(|g| {
            (
                g.requests,
                g.prompt_tokens,
                g.completion_tokens,
                g.estimated,
            )
        })
        .unwrap_or_default()
}

fn a_token_budget() -> Vec<Budget> {
    vec![budget(
        "budgets.agents.default.tokens_per_day",
        BudgetScope::Agent("default".into()),
        10_000_000,
    )]
}

/// Cancelling a run while its model request is out keeps that request in the ledger with
/// an estimate (its prompt), marked estimated: cancelling just before the end does not
/// dodge the budgets.
#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_request_is_kept_with_an_estimate() {
    let f = fixture(
        vec![Reply::text("too late").delay(Duration::from_secs(30))],
        a_token_budget(),
    );
    let cancel = CancellationToken::new();
    let later = cancel.clone();
    // Cancelled once the request is out: a fixed delay lost the race on a loaded machine.
    let canceller = async {
        for _ in 0..1500 {
            if !f.model.received().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        later.cancel();
    };
    let ((sent, _), ()) = tokio::join!(
        f.send_until("alice", "default", "slow one", cancel),
        canceller
    );
    assert_eq!(sent.run.stopped, Some(Stopped::Cancelled));
    assert_eq!(f.model.received().len(), 1);
    let (requests, prompt, _, estimated) = kept(&f, "default");
    assert_eq!((requests, estimated), (1, 1));
    assert!(prompt > 0, "{prompt}");
}

/// A request the model fails (a 500, no retries) is kept with an estimate; a refusal
/// (401: nothing processed) is not kept.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_request_is_kept_with_an_estimate_and_a_refusal_is_not() {
    let f = fixture(
        vec![Reply::status(500), Reply::status(401)],
        a_token_budget(),
    );
    let (sent, _) = f.send("alice", "default", "one").await;
    assert!(matches!(sent.run.stopped, Some(Stopped::Model(_))));
    let (requests, prompt, _, estimated) = kept(&f, "default");
    assert_eq!((requests, estimated), (1, 1));
    assert!(prompt > 0, "{prompt}");
    let (sent, _) = f.send("alice", "default", "two").await;
    assert!(matches!(sent.run.stopped, Some(Stopped::Model(_))));
    assert_eq!(kept(&f, "default").0, 1);
}

/// A stream cut mid-answer counts the text that streamed, with the agent's counter.
#[tokio::test(flavor = "multi_thread")]
async fn a_cut_stream_counts_the_text_streamed_so_far() {
    let text = "Revenue rose in every region and every channel this quarter. ".repeat(20);
    let f = fixture(vec![Reply::text(text).cut_after(900)], a_token_budget());
    let (sent, _) = f.send("alice", "default", "one").await;
    assert!(
        matches!(sent.run.stopped, Some(Stopped::Model(_))),
        "{:?}",
        sent.run.stopped
    );
    let (requests, prompt, completion, estimated) = kept(&f, "default");
    assert_eq!((requests, estimated), (1, 1));
    assert!(prompt > 0 && completion > 0, "{prompt} {completion}");
}

/// A request still out when the run's wall time ends is kept with an estimate.
#[tokio::test(flavor = "multi_thread")]
async fn a_request_out_at_the_wall_time_is_kept_with_an_estimate() {
    let f = fixture_with(
        vec![Reply::text("too late").delay(Duration::from_secs(30))],
        a_token_budget(),
        |p| p.limits.wall_time = Duration::from_secs(1),
    );
    let (sent, _) = f.send("alice", "default", "slow one").await;
    assert!(
        matches!(sent.run.stopped, Some(Stopped::WallTime(_))),
        "{:?}",
        sent.run.stopped
    );
    let (requests, prompt, _, estimated) = kept(&f, "default");
    assert_eq!((requests, estimated), (1, 1));
    assert!(prompt > 0, "{prompt}");
    // In the metrics, the run's limit, not the model's failure.
    let timeout =
        r#"dataref_model_requests_total{agent="default",model="gpt-4o",outcome="timeout"}"#;
    assert!(metric(timeout) >= 1, "{}", dataref_ops::metrics::render());
}

/// A metric's value in the Prometheus text of this process (0 when absent).
fn metric(line_start: &str) -> u64 {
    dataref_ops::metrics::render()
        .lines()
        .find_map(|l| l.strip_prefix(line_start)?.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// A ledger that cannot be read fails open (the run goes on) and is counted; warnings and
/// stops are counted per budget.
#[tokio::test(flavor = "multi_thread")]
async fn ledger_errors_fail_open_and_budget_events_are_counted() {
    const NAME: &str = "budgets.principals.metered.tokens_per_day";
    let f = fixture(
        vec![
            Reply::text("First.").usage(99_000, 0),
            Reply::text("Unchecked.").usage(10, 0),
        ],
        vec![budget(
            NAME,
            BudgetScope::Principal("metered".into()),
            100_000,
        )],
    );
    let warned = format!("dataref_budget_events_total{{budget=\"{NAME}\",event=\"warned\"}}");
    let stopped = format!("dataref_budget_events_total{{budget=\"{NAME}\",event=\"stopped\"}}");
    let (first, _) = f.send("metered", "default", "one").await;
    assert_eq!(first.run.stopped, None);
    assert_eq!(metric(&warned), 1);
    // 99,000 of 100,000 used: the next request would go over.
    let (second, _) = f.send("metered", "default", "two").await;
    assert!(matches!(second.run.stopped, Some(Stopped::Budget(_))));
    assert_eq!(metric(&stopped), 1);

    // The ledger's table gone: the check cannot read it, the run goes on, and both the
    // failed read and the failed write are counted.
    let errors = "dataref_budget_ledger_errors_total ";
    let before = metric(errors);
    let db = rusqlite::Connection::open(f._home.path().join("agent/sessions.sqlite")).unwrap();
    db.execute_batch("DROP TABLE usage").unwrap();
    let (third, _) = f.send("metered", "default", "three").await;
    assert_eq!(third.run.stopped, None, "{}", third.run.answer);
    assert_eq!(f.model.requests().len(), 2);
    assert!(metric(errors) >= before + 2, "{}", metric(errors));
}

/// A money cap is checked with the next request's cost at the agent's prices: at 1 per
/// million tokens, a request costs a micro-unit per token, so a cap of 100 micro-units
/// cannot take a request of its prompt plus MAX_ANSWER tokens, though nothing is used yet.
#[tokio::test(flavor = "multi_thread")]
async fn a_money_cap_is_checked_with_the_next_requests_cost() {
    const NAME: &str = "budgets.agents.default.money_per_day";
    let f = fixture_with(
        vec![Reply::text("never asked for")],
        vec![Budget {
            name: NAME.into(),
            scope: BudgetScope::Agent("default".into()),
            window: BudgetWindow::Day,
            cap: BudgetCap::Micros(100),
        }],
        |p| {
            p.prices = Some(dataref_config::Prices {
                input_per_million: 1.0,
                output_per_million: 1.0,
            })
        },
    );
    let (sent, _) = f.send("alice", "default", "one").await;
    let Some(Stopped::Budget(over)) = &sent.run.stopped else {
        panic!("{:?}", sent.run.stopped);
    };
    assert_eq!((over.budget.as_str(), over.used), (NAME, 0));
    assert_eq!(over.unit(), "micros");
    assert!(over.estimate > MAX_ANSWER, "{}", over.estimate);
    assert!(
        sent.run.answer.contains("in the agents' price currency"),
        "{}",
        sent.run.answer
    );
    assert!(f.model.requests().is_empty());
}
