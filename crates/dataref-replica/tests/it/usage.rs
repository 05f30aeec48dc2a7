//! The usage ledger shared by two replicas on one index: each replica's model requests
//! count against one budget, so a run through either replica stops once their sum is at
//! the cap, and `dataref usage`'s report sums them all.

use std::sync::Arc;

use dataref_agent::budget::GroupBy;
use dataref_agent::{AgentEvent, AgentHost, EventSink, NoOneToAsk, SendRequest, Sent, Stopped};
use dataref_config::{Budget, BudgetCap, BudgetConfig, BudgetScope, BudgetWindow, Config};
use dataref_protocol::Principal;
use dataref_replica::Shared;
use dataref_store::{StoreLimits, SystemClock};
use dataref_test_support::model_server::{Reply, ScriptedModel};
use dataref_tool::{SharedContext, ToolRegistry};
use tokio_util::sync::CancellationToken;

use crate::Services;

const NAME: &str = "budgets.agents.default.tokens_per_day";

/// A replica's agent host: the profile `default` on `model`, no tools, `[budgets]` with one
/// daily token cap of 100,000 on it.
struct Replica {
    _home: tempfile::TempDir,
    host: AgentHost,
    shared: SharedContext,
}

fn replica(services: &Services, model: &ScriptedModel) -> Replica {
    let home = tempfile::tempdir().unwrap();
    let shared: Shared = services.replica(home.path(), &services.config());
    let mut config = Config::builtin_sample_with_env(home.path().to_owned(), 10, &|_| None);
    let profile = config.agents.get_mut("default").unwrap();
    profile.model.url = Some(model.url());
    profile.model.model = Some("gpt-4o".into());
    profile.model.max_retries = 0;
    profile.tools = Vec::new();
    config.budgets = BudgetConfig {
        budgets: vec![Budget {
            name: NAME.into(),
            scope: BudgetScope::Agent("default".into()),
            window: BudgetWindow::Day,
            cap: BudgetCap::Tokens(100_000),
        }],
    };
    let registry = ToolRegistry::builder().build().unwrap();
    let host = AgentHost::with_sessions(&config, &registry, shared.session_store()).unwrap();
    let context = SharedContext {
        home: home.path().to_owned(),
        store: crate::store(&shared, StoreLimits::default(), Arc::new(SystemClock)),
        limits: config.limits.clone(),
        clock: Arc::new(SystemClock),
        mirrors: None,
    };
    Replica {
        _home: home,
        host,
        shared: context,
    }
}

struct Budgets(std::sync::Mutex<Vec<(u64, bool)>>);

impl EventSink for Budgets {
    fn event(&self, event: AgentEvent) {
        if let AgentEvent::Budget { used, stopped, .. } = event {
            self.0.lock().unwrap().push((used, stopped));
        }
    }
}

async fn ask(r: &Replica, who: &str) -> (Sent, Vec<(u64, bool)>) {
    let p = Principal::new(who).unwrap();
    let ws = Arc::new(r.shared.principal_workspace(&p).unwrap());
    let events = Budgets(std::sync::Mutex::new(Vec::new()));
    let sent = r
        .host
        .send(SendRequest {
            ctx: r.shared.context(p, ws),
            agent: None,
            session: None,
            message: "how much?".into(),
            events: &events,
            approver: &NoOneToAsk,
            cancel: CancellationToken::new(),
        })
        .await
        .unwrap();
    let seen = events.0.lock().unwrap().clone();
    (sent, seen)
}

#[tokio::test(flavor = "multi_thread")]
async fn two_replicas_count_their_requests_against_one_budget() {
    let s = Services::start();
    let model = ScriptedModel::start(vec![
        Reply::text("Through a.").usage(60_000, 10_000),
        Reply::text("Through b.").usage(30_000, 5_000),
        Reply::text("never asked for"),
    ])
    .unwrap();
    let (a, b) = (replica(&s, &model), replica(&s, &model));

    let (first, _) = ask(&a, "ana").await;
    assert_eq!(first.run.stopped, None);
    // Replica b sees a's 70,000 tokens: its request fits under the cap, so it asks; the
    // request takes the budget past 80% (to 105,000), which its run is warned about.
    let (second, seen) = ask(&b, "bob").await;
    assert_eq!(second.run.stopped, None);
    assert_eq!(seen, [(105_000, false)]);
    // Back on a: 105,000 of 100,000, counted from both replicas' rows.
    let (third, seen) = ask(&a, "ana").await;
    let Some(Stopped::Budget(over)) = &third.run.stopped else {
        panic!("{:?}", third.run.stopped);
    };
    assert_eq!((over.budget.as_str(), over.used), (NAME, 105_000));
    assert_eq!(seen, [(105_000, true)]);
    assert!(third.run.answer.contains(NAME), "{}", third.run.answer);
    assert_eq!(model.requests().len(), 2);

    // An estimated row (a request cancelled on a replica) is kept as such.
    let ledger = a.host.sessions.ledger().unwrap();
    tokio::task::spawn_blocking(move || {
        ledger.record(&dataref_agent::budget::UsageRow {
            at: dataref_protocol::Timestamp::now(),
            principal: "ana".into(),
            agent: "default".into(),
            model: "gpt-4o".into(),
            prompt_tokens: 1_000,
            completion_tokens: 0,
            cost_micros: 0,
            session: String::new(),
            estimated: true,
        })
    })
    .await
    .unwrap()
    .unwrap();
    // Either replica's ledger reports every request.
    let ledger = b.host.sessions.ledger().unwrap();
    let report = tokio::task::spawn_blocking(move || ledger.report(GroupBy::Principal, None, None))
        .await
        .unwrap()
        .unwrap();
    let rows: Vec<(String, u64, u64, u64, u64)> = report
        .into_iter()
        .map(|g| {
            (
                g.key,
                g.requests,
                g.prompt_tokens,
                g.completion_tokens,
                g.estimated,
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("ana".to_owned(), 2, 61_000, 10_000, 1),
            ("bob".to_owned(), 1, 30_000, 5_000, 0)
        ]
    );
}

/// The check's one statement on the shared index over a month of a busy deployment's
/// requests: measured, with the plan it runs (the two indexes, nothing scanned whole).
#[test]
fn the_shared_budget_check_is_one_indexed_statement_and_cheap() {
    use dataref_agent::budget::{UsageQuery, UsageScope, used_statement, window_start};
    use std::time::{Duration, Instant};

    let s = Services::start();
    let home = tempfile::tempdir().unwrap();
    let shared = s.replica(home.path(), &s.config());
    let ledger = shared.usage_ledger();
    let now = dataref_protocol::Timestamp::now();
    const ROWS: i64 = 200_000;
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let queries = vec![
        UsageQuery {
            scope: UsageScope::Agent("a3".into()),
            since: window_start(BudgetWindow::Day, now),
        },
        UsageQuery {
            scope: UsageScope::Agent("a3".into()),
            since: window_start(BudgetWindow::Month, now),
        },
        UsageQuery {
            scope: UsageScope::Principals(vec!["p7".into()]),
            since: window_start(BudgetWindow::Month, now),
        },
        UsageQuery {
            scope: UsageScope::Principals((0..10).map(|i| format!("p{i}")).collect()),
            since: window_start(BudgetWindow::Day, now),
        },
    ];
    let plan = runtime.block_on(async {
        let c = s.pg.client().await.unwrap();
        // 200,000 requests over 30 days, 50 principals, 10 agents.
        c.execute(
            "INSERT INTO dataref_usage SELECT $1::bigint - (i * 13) % (30 * 86400), \
             'p' || (i % 50), 'a' || (i % 10), 'm', 1000, 100, 1500, 's' || (i % 1000) \
             FROM generate_series(0, $2::bigint - 1) AS i",
            &[&now.unix_seconds(), &ROWS],
        )
        .await
        .unwrap();
        c.batch_execute("VACUUM ANALYZE dataref_usage")
            .await
            .unwrap();
        // The plan of the statement as the ledger sends it, with its values in.
        let (sql, binds) = used_statement("dataref_usage", '$', &queries);
        let mut inline = sql;
        for (i, b) in binds.iter().enumerate().rev() {
            let v = match b {
                dataref_agent::budget::SqlValue::Text(t) => format!("'{t}'"),
                dataref_agent::budget::SqlValue::Int(n) => n.to_string(),
            };
            inline = inline.replace(&format!("${}", i + 1), &v);
        }
        c.query(&format!("EXPLAIN {inline}"), &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect::<Vec<_>>()
            .join("\n")
    });
    assert!(plan.contains("dataref_usage_agent"), "{plan}");
    assert!(plan.contains("dataref_usage_principal"), "{plan}");
    assert!(!plan.contains("Seq Scan"), "{plan}");
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
        "shared budget check over {ROWS} ledger rows: median {median:?}, max {:?}\n{plan}",
        times[times.len() - 1]
    );
    assert!(median < Duration::from_millis(250), "{median:?}");
}
