//! `TestS3` against the real SeaweedFS.

use dataref_test_support::TestS3;
use dataref_test_support::raw_http;

use crate::support::{Keys, s3_request};

#[test]
fn only_the_key_it_was_started_with_gets_in() {
    let s3 = TestS3::start().unwrap();
    assert!(s3.endpoint().starts_with("http://127.0.0.1:"));
    assert_eq!(s3.region(), "us-east-1");
    let bucket = format!("/{}", s3.bucket());
    let object = format!("{bucket}/probe/one");

    // Anonymous: refused, reading and writing.
    let list =
        raw_http::request(s3.addr(), "GET", &format!("{bucket}?list-type=2"), &[], b"").unwrap();
    assert_eq!(list.status, 403, "{}", list.text());
    let put = raw_http::request(s3.addr(), "PUT", &object, &[], b"anonymous").unwrap();
    assert_eq!(put.status, 403, "{}", put.text());

    // Signed with the right access key and a wrong secret: refused.
    let wrong = Keys {
        access: s3.access_key(),
        secret: "not-the-secret",
    };
    let r = s3_request(&s3, &wrong, "PUT", &object, "", &[], b"forged").unwrap();
    assert_eq!(r.status, 403, "{}", r.text());

    // The key it was started with: write, read back, list.
    let keys = Keys::of(&s3);
    let r = s3_request(&s3, &keys, "PUT", &object, "", &[], b"first").unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let r = s3_request(&s3, &keys, "GET", &object, "", &[], b"").unwrap();
    assert_eq!((r.status, r.text().as_str()), (200, "first"));
    let r = s3_request(
        &s3,
        &keys,
        "GET",
        &bucket,
        "list-type=2&prefix=probe%2F",
        &[],
        b"",
    )
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("<Key>probe/one</Key>"), "{}", r.text());

    // The create-only put the shared store relies on: refused over an existing key.
    let r = s3_request(
        &s3,
        &keys,
        "PUT",
        &object,
        "",
        &[("If-None-Match", "*")],
        b"second",
    )
    .unwrap();
    assert_eq!(r.status, 412, "{}", r.text());
    let r = s3_request(&s3, &keys, "GET", &object, "", &[], b"").unwrap();
    assert_eq!(r.text(), "first");

    // The key is for its bucket only.
    let r = s3_request(&s3, &keys, "PUT", "/another-bucket/x", "", &[], b"x").unwrap();
    assert!(r.status >= 400, "{} {}", r.status, r.text());
}

#[test]
fn a_restart_keeps_the_endpoint_and_the_data() {
    let mut s3 = TestS3::start().unwrap();
    let endpoint = s3.endpoint();
    let object = format!("/{}/kept/across-restart", s3.bucket());
    let r = s3_request(&s3, &Keys::of(&s3), "PUT", &object, "", &[], b"still here").unwrap();
    assert_eq!(r.status, 200, "{}", r.text());

    s3.stop().unwrap();
    assert!(!s3.is_running());
    let down = raw_http::request(s3.addr(), "GET", "/healthz", &[], b"");
    assert!(down.is_err(), "a stopped store answered: {down:?}");

    s3.restart().unwrap();
    assert!(s3.is_running());
    assert_eq!(s3.endpoint(), endpoint);
    let r = s3_request(&s3, &Keys::of(&s3), "GET", &object, "", &[], b"").unwrap();
    assert_eq!((r.status, r.text().as_str()), (200, "still here"));
}

#[test]
fn stores_started_at_once_are_separate() {
    let starts: Vec<_> = (0..2).map(|_| std::thread::spawn(TestS3::start)).collect();
    let stores: Vec<TestS3> = starts
        .into_iter()
        .map(|t| t.join().unwrap().unwrap())
        .collect();
    let (a, b) = (&stores[0], &stores[1]);
    assert_ne!(a.endpoint(), b.endpoint());
    assert_ne!(a.access_key(), b.access_key());
    let object = format!("/{}/only-in-a", a.bucket());
    let r = s3_request(a, &Keys::of(a), "PUT", &object, "", &[], b"a").unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    // b neither knows a's key nor holds a's object.
    let r = s3_request(b, &Keys::of(a), "GET", &object, "", &[], b"").unwrap();
    assert_eq!(r.status, 403, "{}", r.text());
    let r = s3_request(b, &Keys::of(b), "GET", &object, "", &[], b"").unwrap();
    assert_eq!(r.status, 404, "{}", r.text());
}
