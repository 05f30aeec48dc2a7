//! Agent sessions and approvals through two replicas sharing one index: a session made
//! through one is continued through the other, another principal's session and approval
//! are not found exactly as unknown ones are, a session answering a message is busy on
//! every replica until the run ends or its replica dies, and a wait for an approval leaves
//! nothing behind.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dataref_agent::approvals::PendingCall;
use dataref_agent::{
    AgentHost, Decision, Message, RequestStats, RunOutcome, SendError, SessionError, Usage,
};
use dataref_config::Config;
use dataref_protocol::{Principal, Timestamp};
use dataref_replica::Shared;
use dataref_tool::ToolRegistry;

use crate::Services;

fn principal(name: &str) -> Principal {
    Principal::new(name).unwrap()
}

/// A run that said `asked` and got `answer`, with one request's usage.
fn run(asked: &str, answer: &str, tokens: u64) -> RunOutcome {
    let usage = Usage {
        prompt_tokens: tokens,
        completion_tokens: 1,
    };
    RunOutcome {
        messages: vec![Message::user(asked), Message::assistant(answer)],
        answer: answer.into(),
        stopped: None,
        requests: vec![RequestStats {
            turn: 1,
            usage,
            context_tokens: tokens,
            dropped: 0,
        }],
        usage,
        tool_calls: 0,
        saved: 0,
        // An answer holding a number (a digit) is one no tool produced here.
        grounding: Some(dataref_agent::ground::Grounding {
            unmatched: answer
                .split_whitespace()
                .filter(|w| w.chars().any(|c| c.is_ascii_digit()))
                .map(str::to_owned)
                .collect(),
            asked_again: false,
        }),
    }
}

fn contents(history: &[Message]) -> Vec<&str> {
    history.iter().map(|m| m.content.as_str()).collect()
}

fn replicas(s: &Services) -> (tempfile::TempDir, tempfile::TempDir, Shared, Shared) {
    let (home_a, home_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let config = s.config();
    let a = s.replica(home_a.path(), &config);
    let b = s.replica(home_b.path(), &config);
    (home_a, home_b, a, b)
}

/// Rows of `table` left in the index.
async fn rows(s: &Services, table: &str) -> i64 {
    let c = s.pg.client().await.unwrap();
    c.query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await
        .unwrap()
        .get(0)
}

#[test]
fn a_session_made_through_one_replica_is_listed_read_and_continued_through_the_other() {
    let s = Services::start();
    let (_ha, _hb, a, b) = replicas(&s);
    let (on_a, on_b) = (a.session_store(), b.session_store());
    let ana = principal("ana");

    on_a.append_run(
        &ana,
        "s1",
        "default",
        Timestamp(1_000),
        &run("first?", "one", 10),
    )
    .unwrap();
    let listed = on_b.list(&ana).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (
            listed[0].id.as_str(),
            listed[0].agent.as_str(),
            listed[0].title.as_str()
        ),
        ("s1", "default", "first?")
    );
    assert_eq!((listed[0].runs, listed[0].messages), (1, 2));
    assert_eq!(
        contents(&on_b.history(&ana, "s1", None).unwrap()),
        ["first?", "one"]
    );
    assert!(on_b.exists(&ana, "s1").unwrap());

    // Continued through B: its run follows A's, on both replicas.
    on_b.append_run(
        &ana,
        "s1",
        "default",
        Timestamp(2_000),
        &run("second?", "two", 20),
    )
    .unwrap();
    on_a.append_run(
        &ana,
        "s1",
        "default",
        Timestamp(3_000),
        &run("third?", "3 3", 30),
    )
    .unwrap();
    let expected = ["first?", "one", "second?", "two", "third?", "3 3"];
    assert_eq!(contents(&on_a.history(&ana, "s1", None).unwrap()), expected);
    assert_eq!(contents(&on_b.history(&ana, "s1", None).unwrap()), expected);
    let info = on_a.info(&ana, "s1").unwrap();
    assert_eq!((info.runs, info.messages), (3, 6));
    assert_eq!(
        info.ungrounded, 1,
        "the third answer's numbers matched nothing"
    );
    assert_eq!(info.created, Timestamp(1_000));
    assert_eq!(info.updated, Timestamp(3_000));
    assert_eq!(info.title, "first?", "the first run's title stays");
    assert_eq!(
        info.usage,
        Usage {
            prompt_tokens: 60,
            completion_tokens: 3
        }
    );
    // The agent is checked as the SQLite store checks it.
    assert!(matches!(
        on_b.history(&ana, "s1", Some("other")),
        Err(SessionError::OtherAgent { .. })
    ));
    assert_eq!(on_b.info(&ana, "s1").unwrap(), info);
}

#[test]
fn another_principals_session_is_not_found_exactly_as_an_unknown_one_and_is_not_deleted() {
    let s = Services::start();
    let (_ha, _hb, a, b) = replicas(&s);
    let (on_a, on_b) = (a.session_store(), b.session_store());
    let (ana, bob) = (principal("ana"), principal("bob"));
    // What `bob` is told of `s1` before anybody has one.
    let unknown = (
        on_b.history(&bob, "s1", None).unwrap_err().to_string(),
        on_b.info(&bob, "s1").unwrap_err().to_string(),
        on_b.delete(&bob, "s1").unwrap_err().to_string(),
    );
    assert_eq!(unknown.0, "no session `s1`");

    on_a.append_run(
        &ana,
        "s1",
        "default",
        Timestamp(1_000),
        &run("mine", "yes", 1),
    )
    .unwrap();
    let history = on_b.history(&bob, "s1", None).unwrap_err();
    assert!(matches!(&history, SessionError::NotFound(id) if id == "s1"));
    let foreign = (
        history.to_string(),
        on_b.info(&bob, "s1").unwrap_err().to_string(),
        on_b.delete(&bob, "s1").unwrap_err().to_string(),
    );
    assert_eq!(
        foreign, unknown,
        "another principal's session reads as an unknown one"
    );
    assert!(on_b.list(&bob).unwrap().is_empty());
    assert!(!on_b.exists(&bob, "s1").unwrap());
    // Bob's delete deleted nothing.
    assert_eq!(
        contents(&on_a.history(&ana, "s1", None).unwrap()),
        ["mine", "yes"]
    );

    // The same id is a session of bob's own, apart from ana's.
    on_b.append_run(
        &bob,
        "s1",
        "default",
        Timestamp(2_000),
        &run("his", "ok", 1),
    )
    .unwrap();
    assert_eq!(
        contents(&on_a.history(&bob, "s1", None).unwrap()),
        ["his", "ok"]
    );
    assert_eq!(
        contents(&on_b.history(&ana, "s1", None).unwrap()),
        ["mine", "yes"]
    );
    on_a.delete(&bob, "s1").unwrap();
    assert_eq!(
        contents(&on_b.history(&ana, "s1", None).unwrap()),
        ["mine", "yes"]
    );
}

#[test]
fn runs_appended_through_both_replicas_at_once_take_turns() {
    let s = Services::start();
    let (_ha, _hb, a, b) = replicas(&s);
    let ana = principal("ana");
    let stores = [Arc::new(a.session_store()), Arc::new(b.session_store())];
    let threads: Vec<_> = stores
        .iter()
        .enumerate()
        .map(|(replica, store)| {
            let (store, ana) = (store.clone(), ana.clone());
            std::thread::spawn(move || {
                for i in 0..15 {
                    let tag = format!("{replica}-{i}");
                    store
                        .append_run(&ana, "s1", "default", Timestamp(1_000), &run(&tag, &tag, 1))
                        .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let history = stores[0].history(&ana, "s1", None).unwrap();
    assert_eq!(history.len(), 60);
    // Each run's two messages are next to each other, and each replica's runs in order.
    let runs: Vec<&str> = history
        .chunks(2)
        .map(|pair| {
            assert_eq!(pair[0].content, pair[1].content, "a run was split");
            pair[0].content.as_str()
        })
        .collect();
    for replica in 0..2 {
        let mine: Vec<&str> = runs
            .iter()
            .copied()
            .filter(|r| r.starts_with(&format!("{replica}-")))
            .collect();
        let expected: Vec<String> = (0..15).map(|i| format!("{replica}-{i}")).collect();
        assert_eq!(mine, expected);
    }
    assert_eq!(stores[1].info(&ana, "s1").unwrap().runs, 30);
}

/// An agent host (no profiles: only its sessions matter here) over `shared`'s sessions.
fn host(shared: &Shared) -> (tempfile::TempDir, AgentHost) {
    let home = tempfile::tempdir().unwrap();
    let mut config = Config::builtin_sample_with_env(home.path().to_owned(), 10, &|_| None);
    config.agents.clear();
    let registry = ToolRegistry::builder().build().unwrap();
    let host = AgentHost::with_sessions(&config, &registry, shared.session_store()).unwrap();
    (home, host)
}

fn is_busy<T: std::fmt::Debug>(claimed: Result<T, SendError>) -> bool {
    match claimed {
        Err(SendError::Busy(_)) => true,
        Ok(_) => false,
        Err(e) => panic!("not a busy session: {e}"),
    }
}

/// Claims `id` on `host` until it is free (a lock let go in the background, or with a
/// dead replica's connection, is free a moment later).
async fn claim_eventually(
    host: &AgentHost,
    who: &Principal,
    id: &str,
) -> dataref_agent::SessionClaim {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match host.claim(who, id).await {
            Ok(claim) => return claim,
            Err(SendError::Busy(_)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("`{id}` stayed busy: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_claimed_on_one_replica_is_busy_on_the_other_until_released() {
    let s = Services::start();
    let (_ha, _hb, a, b) = replicas(&s);
    let ((_a, on_a), (_b, on_b)) = (host(&a), host(&b));
    let (ana, bob) = (principal("ana"), principal("bob"));

    let claim = on_a.claim(&ana, "s1").await.unwrap();
    assert!(
        is_busy(on_b.claim(&ana, "s1").await),
        "busy on the other replica"
    );
    assert!(is_busy(on_a.claim(&ana, "s1").await), "and on its own");
    // Another session, or another principal's of the same id, is free.
    let other = on_b.claim(&ana, "s2").await.unwrap();
    let bobs = on_b.claim(&bob, "s1").await.unwrap();

    // Released as a run ends: the very next message, through any replica, is taken.
    claim.release().await;
    let next = on_b.claim(&ana, "s1").await.unwrap();
    assert!(is_busy(on_a.claim(&ana, "s1").await));
    // Dropped (a run's task that died): let go in the background.
    drop(next);
    let again = claim_eventually(&on_a, &ana, "s1").await;
    again.release().await;
    other.release().await;
    bobs.release().await;
    assert!(on_b.claim(&ana, "s2").await.is_ok());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replica_that_dies_lets_its_sessions_go() {
    let s = Services::start();
    let (_ha, _hb, a, b) = replicas(&s);
    let ((_a, on_a), (_b, on_b)) = (host(&a), host(&b));
    let ana = principal("ana");

    let held = on_a.claim(&ana, "s1").await.unwrap();
    assert!(is_busy(on_b.claim(&ana, "s1").await));
    // A dies with the claim held: its connections close without a word to the index (the
    // claim itself outlives them here, as a crashed process never gets to release it).
    drop(on_a);
    drop(a);
    let taken = claim_eventually(&on_b, &ana, "s1").await;
    assert!(is_busy(on_b.claim(&ana, "s1").await));
    taken.release().await;
    drop(held);
}

#[test]
fn two_replicas_sweeping_at_once_remove_each_old_session_once() {
    let s = Services::start();
    let (_ha, _hb, a, b) = replicas(&s);
    let (on_a, on_b) = (Arc::new(a.session_store()), Arc::new(b.session_store()));
    let ana = principal("ana");
    // More than one batch of old sessions, some with messages; two recent ones.
    const OLD: usize = 1_300;
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(s.pg.execute(&format!(
        "INSERT INTO dataref_sessions (principal, id, agent, title, created, updated) \
         SELECT 'ana', 'old-' || g, 'default', 't', 1000, 1000 + g % 7 \
         FROM generate_series(1, {}) g",
        OLD - 3
    )))
    .unwrap();
    for i in 0..3 {
        on_a.append_run(
            &ana,
            &format!("old-msgs-{i}"),
            "default",
            Timestamp(1_000),
            &run("q", "a", 1),
        )
        .unwrap();
    }
    for i in 0..2 {
        on_b.append_run(
            &ana,
            &format!("new-{i}"),
            "default",
            Timestamp(90_000),
            &run("q", "a", 1),
        )
        .unwrap();
    }
    let before = Timestamp(50_000);
    let sweepers: Vec<_> = [on_a.clone(), on_b.clone()]
        .into_iter()
        .map(|store| std::thread::spawn(move || store.sweep(before).unwrap()))
        .collect();
    let removed: usize = sweepers.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(removed, OLD, "each old session removed once");
    let left: Vec<String> = on_a.list(&ana).unwrap().into_iter().map(|s| s.id).collect();
    assert_eq!(left, ["new-0", "new-1"]);
    // Their messages and requests went with them.
    rt.block_on(async {
        assert_eq!(rows(&s, "dataref_session_messages").await, 4);
        assert_eq!(rows(&s, "dataref_session_requests").await, 2);
    });
    assert_eq!(on_b.sweep(before).unwrap(), 0);
}

fn call(who: &str, session: &str, call_id: &str) -> PendingCall {
    PendingCall {
        principal: principal(who),
        session: session.into(),
        call_id: call_id.into(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_approval_pending_on_one_replica_is_answered_through_the_other() {
    let s = Services::start();
    let (_ha, _hb, a, b) = replicas(&s);
    let (on_a, on_b) = (a.approvals(), b.approvals());
    let pending = call("ana", "s1", "call_1");

    let mut wait = on_a.ask(&pending, Duration::from_secs(60)).await.unwrap();
    let waiter = tokio::spawn(async move {
        let decided = wait.decided().await;
        wait.end().await;
        decided
    });
    // Unknown calls, and the same call of another principal or session, are not pending.
    for other in [
        call("ana", "s1", "call_2"),
        call("ana", "s2", "call_1"),
        call("bob", "s1", "call_1"),
    ] {
        assert!(
            !on_b.answer(&other, Decision::Approve).await.unwrap(),
            "{other:?}"
        );
    }
    assert!(
        on_b.answer(&pending, Decision::Deny(Some("not that table".into())))
            .await
            .unwrap()
    );
    let decided = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiting replica saw the answer")
        .unwrap();
    assert_eq!(decided, Some(Decision::Deny(Some("not that table".into()))));
    assert!(
        !on_b.answer(&pending, Decision::Approve).await.unwrap(),
        "answered once"
    );
    assert_eq!(
        rows(&s, "dataref_approvals").await,
        0,
        "nothing left after the wait"
    );

    // Approved through A itself too.
    let mut wait = on_a.ask(&pending, Duration::from_secs(60)).await.unwrap();
    assert!(on_a.answer(&pending, Decision::Approve).await.unwrap());
    assert_eq!(wait.decided().await, Some(Decision::Approve));
    wait.end().await;
    assert_eq!(rows(&s, "dataref_approvals").await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wait_that_ends_unanswered_leaves_nothing_answerable() {
    let s = Services::start();
    let (_ha, _hb, a, b) = replicas(&s);
    let (on_a, on_b) = (a.approvals(), b.approvals());
    let pending = call("ana", "s1", "call_1");

    // Timed out, as the run's approver times out.
    let mut wait = on_a
        .ask(&pending, Duration::from_millis(300))
        .await
        .unwrap();
    assert_eq!(rows(&s, "dataref_approvals").await, 1);
    let waited = tokio::time::timeout(Duration::from_millis(300), wait.decided()).await;
    assert!(waited.is_err(), "nobody answered");
    wait.end().await;
    assert_eq!(rows(&s, "dataref_approvals").await, 0);
    assert!(!on_b.answer(&pending, Decision::Approve).await.unwrap());

    // Dropped mid-wait (the run was cancelled): withdrawn in the background.
    let wait = on_a.ask(&pending, Duration::from_secs(60)).await.unwrap();
    drop(wait);
    let deadline = Instant::now() + Duration::from_secs(10);
    while rows(&s, "dataref_approvals").await != 0 {
        assert!(Instant::now() < deadline, "the dropped wait's row stayed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!on_b.answer(&pending, Decision::Approve).await.unwrap());

    // A replica that died mid-wait leaves a row nobody can answer once it expired, and
    // the next call asked removes it.
    let c = s.pg.client().await.unwrap();
    c.execute(
        "INSERT INTO dataref_approvals (principal, session, call_id, expires_at) \
         VALUES ('ana', 's9', 'call_9', now() - interval '1 second')",
        &[],
    )
    .await
    .unwrap();
    assert!(
        !on_b
            .answer(&call("ana", "s9", "call_9"), Decision::Approve)
            .await
            .unwrap()
    );
    let wait = on_a.ask(&pending, Duration::from_secs(60)).await.unwrap();
    wait.end().await;
    assert_eq!(rows(&s, "dataref_approvals").await, 0);
}
