//! `serve --http`'s limits and download-link key through two replicas sharing one index:
//! a principal gets the limits once, not once per replica; a replica that dies gives its
//! slots back; every replica signs links with the same key.
#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers fail the test on setup errors"
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use dataref_config::HttpConfig;
use dataref_http::{Limiter, Permit, Refused, Replicated, SigningKey, SlotKind};
use dataref_protocol::Principal;
use dataref_replica::Shared;

use crate::Services;

fn principal(name: &str) -> Principal {
    Principal::new(name).unwrap()
}

fn http(rate_per_minute: u32, max_concurrent: usize, max_downloads: usize) -> HttpConfig {
    HttpConfig {
        rate_per_minute,
        max_concurrent,
        max_downloads,
        ..HttpConfig::default()
    }
}

async fn limiter(shared: &Shared, http: &HttpConfig) -> Arc<dyn Limiter> {
    shared
        .http(http)
        .await
        .unwrap()
        .limiter
        .expect("a shared limiter")
}

/// Polls `take` until it gives a permit (a slot given back on the server lands just after
/// the holder lets go; a dead replica's, once the server has seen its connection close).
async fn eventually(what: &str, mut take: impl AsyncFnMut() -> Result<Permit, Refused>) -> Permit {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match take().await {
            Ok(permit) => return permit,
            Err(refused) if Instant::now() > deadline => panic!("{what}: still {refused:?}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_rate_is_counted_once_across_replicas() {
    let s = Services::start();
    let (home_a, home_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let config = s.config();
    let (a, b) = (
        s.replica(home_a.path(), &config),
        s.replica(home_b.path(), &config),
    );
    // A bucket of 10, refilled at one per 6 s: the test is over before one comes back.
    let http = http(10, 8, 8);
    let (la, lb) = (limiter(&a, &http).await, limiter(&b, &http).await);
    let (eu, us) = (principal("eu_analyst"), principal("us_analyst"));
    for i in 0..10 {
        let on = if i % 2 == 0 { &la } else { &lb };
        on.admit(&eu)
            .await
            .unwrap_or_else(|r| panic!("request {i}: {r:?}"));
    }
    for on in [&la, &lb] {
        match on.admit(&eu).await {
            Err(Refused::Rate {
                retry_after,
                per_minute,
            }) => {
                // One server's answer: the wait for the next token, `rate_per_minute`.
                assert!((1..=6).contains(&retry_after), "{retry_after}");
                assert_eq!(per_minute, 10.0);
            }
            other => panic!("the 11th request in the burst was {other:?}"),
        }
    }
    // Another principal has a bucket of its own, on both replicas.
    for on in [&la, &lb] {
        on.admit(&us).await.unwrap();
    }

    // Auth off: no rate limit at all (nothing is counted), as on one server.
    let off = HttpConfig {
        auth: false,
        ..http.clone()
    };
    let unlimited = limiter(&a, &off).await;
    for _ in 0..50 {
        unlimited.admit(&eu).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn slots_are_counted_across_replicas_and_freed_when_a_replica_dies() {
    let s = Services::start();
    let (home_a, home_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let config = s.config();
    let a = s.replica(home_a.path(), &config);
    let b = s.replica(home_b.path(), &config);
    let http = http(1_000_000, 2, 1);
    let (la, lb) = (limiter(&a, &http).await, limiter(&b, &http).await);
    let (eu, us) = (principal("eu_analyst"), principal("us_analyst"));

    // A slot given back is free again at once on the same replica, however often.
    for i in 0..20 {
        let p = la.slot(&eu, SlotKind::ToolCall).await;
        assert!(p.is_ok(), "round {i}: {:?}", p.err());
    }

    // `max_concurrent = 2` taken on A: none left on A (the same connection holds them)
    // nor on B.
    let first = la.slot(&eu, SlotKind::ToolCall).await.unwrap();
    let second = la.slot(&eu, SlotKind::ToolCall).await.unwrap();
    for on in [&la, &lb] {
        assert_eq!(
            on.slot(&eu, SlotKind::ToolCall).await.err(),
            Some(Refused::Concurrency { max: 2 })
        );
    }
    // Downloads have slots of their own, and another principal its own.
    let download = lb.slot(&eu, SlotKind::Download).await.unwrap();
    assert_eq!(
        la.slot(&eu, SlotKind::Download).await.err(),
        Some(Refused::Downloads { max: 1 })
    );
    let theirs = lb.slot(&us, SlotKind::ToolCall).await.unwrap();
    drop((download, theirs));

    // One given back on A is B's to take.
    drop(first);
    let on_b = eventually("the slot A gave back", async || {
        lb.slot(&eu, SlotKind::ToolCall).await
    })
    .await;
    assert_eq!(
        la.slot(&eu, SlotKind::ToolCall).await.err(),
        Some(Refused::Concurrency { max: 2 })
    );

    // A dies holding `second`: its connection to the index goes with it, and the slot
    // with the connection, though nobody gave it back.
    drop(la);
    drop(a);
    let _also_on_b = eventually("the slot of the replica that died", async || {
        lb.slot(&eu, SlotKind::ToolCall).await
    })
    .await;
    assert_eq!(
        lb.slot(&eu, SlotKind::ToolCall).await.err(),
        Some(Refused::Concurrency { max: 2 })
    );
    // The dead replica's permit, dropped late, gives back nothing of B's.
    drop(second);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        lb.slot(&eu, SlotKind::ToolCall).await.err(),
        Some(Refused::Concurrency { max: 2 })
    );
    drop(on_b);
}

#[tokio::test(flavor = "multi_thread")]
async fn every_replica_signs_with_one_key_and_a_configured_key_wins() {
    let s = Services::start();
    let (home_a, home_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let config = s.config();
    let a = s.replica(home_a.path(), &config);
    let mut b = s.replica(home_b.path(), &config);
    let no_key = HttpConfig::default();
    let key_of = async |shared: &Shared| -> SigningKey {
        let replicated = shared.http(&no_key).await.unwrap();
        dataref_http::download_key(&no_key, &replicated)
            .unwrap()
            .expect("the shared key")
    };
    let on_a = key_of(&a).await;
    assert_eq!(on_a.fingerprint(), key_of(&b).await.fingerprint());
    // B restarts: the key is the index's, not the process's.
    drop(b);
    b = s.replica(home_b.path(), &config);
    assert_eq!(on_a.fingerprint(), key_of(&b).await.fingerprint());
    // Never shown: the key's bytes appear in no `Debug`.
    let c = s.pg.client().await.unwrap();
    let row = c
        .query_one(
            "SELECT encode(key, 'hex'), encode(key, 'base64') FROM dataref_keys",
            &[],
        )
        .await
        .unwrap();
    let (hex, base64): (String, String) = (row.get(0), row.get(1));
    let shown = format!("{:?}", a.http(&no_key).await.unwrap());
    assert!(shown.contains(&on_a.fingerprint()), "{shown}");
    assert!(
        !shown.contains(&hex[..16]) && !shown.contains(&base64[..16]),
        "{shown}"
    );

    // `[http] signing_key` set: that key signs, on every replica, and the index's is not
    // even read.
    let configured = "a-configured-signing-key-of-more-than-32-bytes";
    let with_key = HttpConfig {
        signing_key: Some(configured.into()),
        ..HttpConfig::default()
    };
    let want = SigningKey::new(configured.as_bytes().to_vec()).unwrap();
    for shared in [&a, &b] {
        let replicated = shared.http(&with_key).await.unwrap();
        assert!(replicated.signing_key.is_none());
        assert!(replicated.limiter.is_some());
        // Even given the shared key, the configured one wins.
        let given = Replicated {
            signing_key: Some(on_a.clone()),
            ..replicated
        };
        let used = dataref_http::download_key(&with_key, &given)
            .unwrap()
            .unwrap();
        assert_eq!(used.fingerprint(), want.fingerprint());
        assert_ne!(used.fingerprint(), on_a.fingerprint());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn with_the_index_out_of_reach_requests_are_refused_with_503() {
    let s = Services::start();
    let home = tempfile::tempdir().unwrap();
    let a = s.replica(home.path(), &s.config());
    let l = limiter(&a, &http(600, 8, 8)).await;
    let ready = a
        .http(&http(600, 8, 8))
        .await
        .unwrap()
        .readiness
        .expect("a replica's /ready checks the shared store");
    ready.check().await.expect("ready while both answer");
    let eu = principal("eu_analyst");
    l.admit(&eu).await.unwrap();
    let held = l.slot(&eu, SlotKind::ToolCall).await.unwrap();
    let Services { s3, pg, .. } = s;
    drop(pg);
    // `/ready` names the index, and answers within its bound.
    let asked = Instant::now();
    let why = ready.check().await.expect_err("the index is gone");
    assert!(
        why.contains("index") && !why.contains("object store"),
        "{why}"
    );
    assert!(
        asked.elapsed() < dataref_replica::READY_BOUND + Duration::from_secs(1),
        "{:?}",
        asked.elapsed()
    );
    let started = Instant::now();
    assert_eq!(
        l.admit(&eu).await.err(),
        Some(Refused::Unavailable { retry_after: 5 })
    );
    assert_eq!(
        l.slot(&eu, SlotKind::Download).await.err(),
        Some(Refused::Unavailable { retry_after: 5 })
    );
    assert!(
        started.elapsed() < dataref_replica::LIMIT_TIMEOUT * 2 + Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    drop(held);
    drop(s3);
}

#[tokio::test(flavor = "multi_thread")]
async fn buckets_that_have_refilled_are_swept() {
    let s = Services::start();
    let home = tempfile::tempdir().unwrap();
    let a = s.replica(home.path(), &s.config());
    // A bucket of 60 refilled at 10 per second: swept once it has gone untouched for
    // `burst / per_second` = 6 s, the time an empty bucket takes to fill.
    let l = limiter(&a, &http(600, 8, 8)).await;
    l.admit(&principal("eu_analyst")).await.unwrap();
    let c = s.pg.client().await.unwrap();
    let rows = async || -> i64 {
        c.query_one("SELECT count(*) FROM dataref_rate", &[])
            .await
            .unwrap()
            .get(0)
    };
    assert_eq!(rows().await, 1);
    l.forget_idle();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(rows().await, 1, "not refilled yet: kept");
    tokio::time::sleep(Duration::from_secs(6)).await;
    l.forget_idle();
    let deadline = Instant::now() + Duration::from_secs(5);
    while rows().await != 0 {
        assert!(
            Instant::now() < deadline,
            "the refilled bucket was not swept"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What the shared limits add to a request, on this machine's index (a Unix socket): run
/// with `--nocapture` to see the numbers.
#[tokio::test(flavor = "multi_thread")]
async fn what_the_shared_limits_cost_per_request() {
    let s = Services::start();
    let home = tempfile::tempdir().unwrap();
    let a = s.replica(home.path(), &s.config());
    let l = limiter(&a, &http(u32::MAX - 1, 8, 8)).await;
    let eu = principal("eu_analyst");
    let n = 2000;
    let mut admit = Vec::with_capacity(n);
    let mut slot = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        l.admit(&eu).await.unwrap();
        admit.push(t.elapsed());
        let t = Instant::now();
        let p = l.slot(&eu, SlotKind::ToolCall).await.unwrap();
        slot.push(t.elapsed());
        drop(p);
    }
    for (what, mut times) in [("admit", admit), ("slot", slot)] {
        times.sort();
        let (p50, p99) = (times[n / 2], times[n * 99 / 100]);
        eprintln!("shared limits: {what} p50 {p50:?} p99 {p99:?} over {n} requests");
        assert!(p50 < Duration::from_millis(20), "{what} p50 {p50:?}");
    }
}

/// Each server process holding advisory locks, with how many (its `application_name`).
async fn lock_holders(s: &Services) -> Vec<(i32, i64, String)> {
    let c = s.pg.client().await.unwrap();
    c.query(
        "SELECT l.pid, count(*), coalesce(min(a.application_name), '') FROM pg_locks l \
         LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
         WHERE l.locktype = 'advisory' AND l.granted GROUP BY l.pid ORDER BY l.pid",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

/// Waits until the advisory locks are held as `want` says (pid → count), ignoring which
/// pids hold them except that none is `gone`.
async fn wait_for_holders(s: &Services, what: &str, gone: i32, counts: &[i64]) -> Vec<i32> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let holders = lock_holders(s).await;
        let mut got: Vec<i64> = holders.iter().map(|h| h.1).collect();
        got.sort_unstable();
        if got == counts && holders.iter().all(|h| h.0 != gone) {
            return holders.iter().map(|h| h.0).collect();
        }
        assert!(
            Instant::now() < deadline,
            "{what}: the locks are held by {holders:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A server process stopped (`SIGSTOP`): its connection hangs, as one to a host that
/// stopped answering would. Continued when dropped, even when the test fails.
struct Stopped(i32);

impl Stopped {
    fn new(pid: i32) -> Self {
        assert!(signal("STOP", pid), "stopping server process {pid}");
        Self(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        signal("CONT", self.0);
    }
}

fn signal(name: &str, pid: i32) -> bool {
    std::process::Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .is_ok_and(|s| s.success())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lock_connection_killed_under_its_holders_takes_their_locks_again() {
    let s = Services::start();
    let (home_a, home_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let config = s.config();
    let (a, b) = (
        s.replica(home_a.path(), &config),
        s.replica(home_b.path(), &config),
    );
    let http = http(1_000_000, 1, 1);
    let (la, lb) = (limiter(&a, &http).await, limiter(&b, &http).await);
    let (sa, sb) = (a.session_store(), b.session_store());
    let (eu, ana) = (principal("eu_analyst"), principal("ana"));

    let slot = la.slot(&eu, SlotKind::ToolCall).await.unwrap();
    let session = sa.lock(&ana, "s1").await.unwrap().expect("free");
    let holders = lock_holders(&s).await;
    assert_eq!(holders.len(), 1, "{holders:?}");
    let (old, count, name) = holders[0].clone();
    assert_eq!((count, name.as_str()), (2, "dataref-locks"));

    // The index ends A's lock connection (a restart, a failover, an operator): the server
    // lets both locks go. A notices, connects again and takes both back.
    let c = s.pg.client().await.unwrap();
    c.execute("SELECT pg_terminate_backend($1)", &[&old])
        .await
        .unwrap();
    let new = wait_for_holders(&s, "A taking its locks again", old, &[2]).await;
    assert_ne!(new, [old]);

    // Held still: B can take neither, and nor can A itself.
    for (on, name) in [(&lb, "B"), (&la, "A")] {
        assert_eq!(
            on.slot(&eu, SlotKind::ToolCall).await.err(),
            Some(Refused::Concurrency { max: 1 }),
            "the slot on {name}"
        );
    }
    assert!(sb.lock(&ana, "s1").await.unwrap().is_none());
    assert!(sa.lock(&ana, "s1").await.unwrap().is_none());

    // Given back on the new connection: B takes both.
    session.release().await;
    drop(slot);
    let on_b = eventually("the slot A gave back", async || {
        lb.slot(&eu, SlotKind::ToolCall).await
    })
    .await;
    let theirs = sb.lock(&ana, "s1").await.unwrap().expect("released");
    theirs.release().await;
    drop(on_b);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lock_taken_elsewhere_while_the_connection_was_down_stays_lost() {
    let s = Services::start();
    let (home_a, home_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let config = s.config();
    let (a, b) = (
        s.replica(home_a.path(), &config),
        s.replica(home_b.path(), &config),
    );
    let http = http(1_000_000, 1, 1);
    let (la, lb) = (limiter(&a, &http).await, limiter(&b, &http).await);
    let eu = principal("eu_analyst");
    let slot = la.slot(&eu, SlotKind::ToolCall).await.unwrap();
    let c = s.pg.client().await.unwrap();
    let row = c
        .query_one(
            "SELECT pid, (classid::int8 << 32) | objid::int8 FROM pg_locks \
             WHERE locktype = 'advisory'",
            &[],
        )
        .await
        .unwrap();
    let (old, key): (i32, i64) = (row.get(0), row.get(1));

    // A's connection ends, and another holder (this test's connection, faster than A can
    // connect again) takes the slot first.
    c.execute("SELECT pg_terminate_backend($1)", &[&old])
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !c
        .query_one("SELECT pg_try_advisory_lock($1)", &[&key])
        .await
        .unwrap()
        .get::<_, bool>(0)
    {
        assert!(Instant::now() < deadline, "the slot never came free");
    }
    let thief: i32 = c
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    // A connects again (it pings while it holds something) and cannot have it back.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let back: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE application_name = 'dataref-locks' AND pid <> $1",
                &[&old],
            )
            .await
            .unwrap()
            .get(0);
        if back > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "A never connected again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let holders = lock_holders(&s).await;
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(holders[0].0, thief);
    // Its holder on A still counts there; B sees the other holder's.
    assert_eq!(
        la.slot(&eu, SlotKind::ToolCall).await.err(),
        Some(Refused::Concurrency { max: 1 })
    );
    assert_eq!(
        lb.slot(&eu, SlotKind::ToolCall).await.err(),
        Some(Refused::Concurrency { max: 1 })
    );
    // The other holder lets go: free for anyone, B here (A does not grab a lost lock back
    // while its holder runs on).
    c.execute("SELECT pg_advisory_unlock($1)", &[&key])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let on_b = lb.slot(&eu, SlotKind::ToolCall).await.unwrap();
    // A's holder lets go: nothing of B's is given back.
    drop(slot);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        la.slot(&eu, SlotKind::ToolCall).await.err(),
        Some(Refused::Concurrency { max: 1 })
    );
    let holders = lock_holders(&s).await;
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_ne!(holders[0].0, thief);
    drop(on_b);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lock_connection_that_hangs_answers_unavailable_and_keeps_its_locks() {
    use dataref_agent::SessionError;
    let s = Services::start();
    let (home_a, home_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let config = s.config();
    let (a, b) = (
        s.replica(home_a.path(), &config),
        s.replica(home_b.path(), &config),
    );
    let http = http(1_000_000, 2, 2);
    let (la, lb) = (limiter(&a, &http).await, limiter(&b, &http).await);
    let (sa, sb) = (a.session_store(), b.session_store());
    let (eu, ana) = (principal("eu_analyst"), principal("ana"));
    let slot = la.slot(&eu, SlotKind::ToolCall).await.unwrap();
    let session = sa.lock(&ana, "s1").await.unwrap().expect("free");
    let holders = lock_holders(&s).await;
    assert_eq!(holders.len(), 1, "{holders:?}");
    let old = holders[0].0;

    // A's lock connection stops answering (its server process is stopped: a partition, a
    // host that froze). A's callers are told "unavailable", within the limits' bound,
    // again and again — never "too many concurrent" nor "busy".
    let stopped = Stopped::new(old);
    for round in 0..3 {
        let started = Instant::now();
        assert_eq!(
            la.slot(&eu, SlotKind::ToolCall).await.err(),
            Some(Refused::Unavailable { retry_after: 5 }),
            "round {round}"
        );
        assert!(
            started.elapsed() < dataref_replica::LIMIT_TIMEOUT + Duration::from_secs(1),
            "round {round}: {:?}",
            started.elapsed()
        );
    }
    let started = Instant::now();
    match sa.lock(&ana, "s2").await {
        Err(SessionError::Unavailable { .. }) => {}
        other => panic!("a session claimed on a hung lock connection: {other:?}"),
    }
    assert!(
        started.elapsed() < config.timeout,
        "{:?}",
        started.elapsed()
    );
    // Its holders still exclude everyone, B included: the stopped process holds the locks.
    assert!(sb.lock(&ana, "s1").await.unwrap().is_none());
    let on_b = lb.slot(&eu, SlotKind::ToolCall).await.unwrap();
    assert_eq!(
        lb.slot(&eu, SlotKind::ToolCall).await.err(),
        Some(Refused::Concurrency { max: 2 })
    );
    // A run ending meanwhile lets its session go without hanging on the connection.
    let started = Instant::now();
    session.release().await;
    assert!(
        started.elapsed() < Duration::from_secs(7),
        "{:?}",
        started.elapsed()
    );

    // The process resumes (and ends: A asked for that). A's next connection takes the slot
    // it still holds again; the session it let go is free.
    drop(stopped);
    wait_for_holders(&s, "A's slot taken again, B's kept", old, &[1, 1]).await;
    assert_eq!(
        la.slot(&eu, SlotKind::ToolCall).await.err(),
        Some(Refused::Concurrency { max: 2 })
    );
    let theirs = sb.lock(&ana, "s1").await.unwrap().expect("let go by A");
    theirs.release().await;
    drop(on_b);
    let _again = eventually("the slot B gave back", async || {
        la.slot(&eu, SlotKind::ToolCall).await
    })
    .await;
    drop(slot);
}
