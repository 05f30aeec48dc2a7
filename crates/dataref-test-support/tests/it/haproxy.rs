//! `TestHaproxy` against the real HAProxy, in front of tiny backends that name themselves.

use std::net::SocketAddr;
use std::time::Duration;

use dataref_test_support::raw_http::{self, Response};
use dataref_test_support::{HaproxyOptions, HealthCheck, Stickiness, TestHaproxy};

use crate::support::{Backend, dead_addr};

fn get(lb: &TestHaproxy, path: &str, session: Option<&str>) -> Response {
    let headers: Vec<(&str, &str)> = session.map(|s| ("Mcp-Session-Id", s)).into_iter().collect();
    raw_http::request(lb.addr(), "GET", path, &headers, b"").unwrap()
}

fn backend_of(r: &Response) -> String {
    assert_eq!(r.status, 200, "{}", r.text());
    r.text()
}

fn count(names: &[String], name: &str) -> usize {
    names.iter().filter(|n| *n == name).count()
}

#[test]
fn round_robin_reaches_every_backend_in_turn_even_with_a_session_header() {
    let (a, b) = (Backend::start("alpha"), Backend::start("beta"));
    let lb = TestHaproxy::start(&[a.addr, b.addr], HaproxyOptions::default()).unwrap();
    let session = get(&lb, "/mcp", None)
        .header("Mcp-Session-Id")
        .map(str::to_owned)
        .unwrap();
    // Without stickiness the header changes nothing: the control for the sticky test.
    let names: Vec<String> = (0..6)
        .map(|_| backend_of(&get(&lb, "/mcp", Some(&session))))
        .collect();
    assert_eq!(
        (count(&names, a.name), count(&names, b.name)),
        (3, 3),
        "{names:?}"
    );
    assert!(names.windows(2).all(|w| w[0] != w[1]), "{names:?}");
}

#[test]
fn sticky_sessions_keep_reaching_the_backend_that_set_the_header() {
    let (a, b) = (Backend::start("alpha"), Backend::start("beta"));
    let lb = TestHaproxy::start(
        &[a.addr, b.addr],
        HaproxyOptions {
            stickiness: Stickiness::mcp_session(),
            ..HaproxyOptions::default()
        },
    )
    .unwrap();
    // New sessions are still spread: two starts land on both backends.
    let starts: Vec<Response> = (0..2).map(|_| get(&lb, "/mcp", None)).collect();
    let mut owners: Vec<String> = starts.iter().map(backend_of).collect();
    owners.sort();
    assert_eq!(owners, [a.name, b.name]);
    for start in &starts {
        let owner = backend_of(start);
        let session = start.header("Mcp-Session-Id").unwrap();
        assert!(session.starts_with(&owner), "{session} from {owner}");
        for _ in 0..5 {
            assert_eq!(backend_of(&get(&lb, "/mcp", Some(session))), owner);
        }
    }
    // A session id no response set is balanced like any request.
    let unknown: Vec<String> = (0..4)
        .map(|_| backend_of(&get(&lb, "/mcp", Some("never-issued"))))
        .collect();
    assert_eq!(count(&unknown, a.name), 2, "{unknown:?}");
}

#[test]
fn a_dead_backend_is_taken_out_and_requests_reach_the_live_one() {
    let live = Backend::start("alive");
    let dead = dead_addr();
    let lb = TestHaproxy::start(&[live.addr, dead], HaproxyOptions::default()).unwrap();
    lb.wait_backends_up(&[true, false], Duration::from_secs(10))
        .unwrap();
    for _ in 0..4 {
        assert_eq!(backend_of(&get(&lb, "/", None)), live.name);
    }
}

#[test]
fn http_health_checks_follow_the_status_of_the_path() {
    let (a, b) = (Backend::start("alpha"), Backend::start("beta"));
    let backends: [SocketAddr; 2] = [a.addr, b.addr];
    let with_check = |path: &str| HaproxyOptions {
        health_check: HealthCheck::Http {
            path: path.to_owned(),
        },
        ..HaproxyOptions::default()
    };
    let healthy = TestHaproxy::start(&backends, with_check("/up")).unwrap();
    let failing = TestHaproxy::start(&backends, with_check("/down")).unwrap();
    failing
        .wait_backends_up(&[false, false], Duration::from_secs(10))
        .unwrap();
    healthy
        .wait_backends_up(&[true, true], Duration::from_secs(10))
        .unwrap();
    assert_eq!(get(&failing, "/", None).status, 503);
}

#[test]
fn the_stream_timeout_bounds_a_silent_response() {
    let a = Backend::start("slow");
    let short = TestHaproxy::start(
        &[a.addr],
        HaproxyOptions {
            stream_timeout: Duration::from_millis(500),
            ..HaproxyOptions::default()
        },
    )
    .unwrap();
    let long = TestHaproxy::start(&[a.addr], HaproxyOptions::default()).unwrap();
    assert_eq!(get(&short, "/slow", None).status, 504);
    assert_eq!(get(&long, "/slow", None).status, 200);
    assert!(long.config().contains("timeout server 3600000ms"));
}
