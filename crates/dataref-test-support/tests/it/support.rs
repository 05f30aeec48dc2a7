//! A SigV4 signer for raw S3 requests (the tests' own client: `object_store` is tested by
//! the crates that use it) and tiny HTTP backends that name themselves.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dataref_test_support::TestS3;
use dataref_test_support::raw_http::{self, Response};
use ring::{digest, hmac};

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256_hex(data: &[u8]) -> String {
    hex(digest::digest(&digest::SHA256, data).as_ref())
}

fn hmac_sha256(key: &[u8], data: &str) -> Vec<u8> {
    hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), data.as_bytes())
        .as_ref()
        .to_vec()
}

/// `YYYYMMDDTHHMMSSZ` for now (civil-from-days, proleptic Gregorian).
fn amz_date() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Credentials to sign with.
pub struct Keys<'a> {
    pub access: &'a str,
    pub secret: &'a str,
}

impl<'a> Keys<'a> {
    pub fn of(s3: &'a TestS3) -> Self {
        Self {
            access: s3.access_key(),
            secret: s3.secret_key(),
        }
    }
}

/// A SigV4-signed path-style request to `s3`: `path` is `/bucket/key` (plain characters
/// only), `query` already canonical (`list-type=2&prefix=a%2F`).
pub fn s3_request(
    s3: &TestS3,
    keys: &Keys<'_>,
    method: &str,
    path: &str,
    query: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<Response> {
    let date_time = amz_date();
    let date = &date_time[..8];
    let payload = sha256_hex(body);
    let host = s3.addr().to_string();
    let mut signed: Vec<(String, String)> = vec![
        ("host".into(), host),
        ("x-amz-content-sha256".into(), payload.clone()),
        ("x-amz-date".into(), date_time.clone()),
    ];
    signed.extend(
        headers
            .iter()
            .map(|(n, v)| (n.to_ascii_lowercase(), v.trim().to_owned())),
    );
    signed.sort();
    let canonical_headers: String = signed.iter().map(|(n, v)| format!("{n}:{v}\n")).collect();
    let signed_names = signed
        .iter()
        .map(|(n, _)| n.as_str())
        .collect::<Vec<_>>()
        .join(";");
    let canonical =
        format!("{method}\n{path}\n{query}\n{canonical_headers}\n{signed_names}\n{payload}");
    let scope = format!("{date}/{}/s3/aws4_request", s3.region());
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{date_time}\n{scope}\n{}",
        sha256_hex(canonical.as_bytes())
    );
    let mut key = hmac_sha256(format!("AWS4{}", keys.secret).as_bytes(), date);
    for part in [s3.region(), "s3", "aws4_request"] {
        key = hmac_sha256(&key, part);
    }
    let signature = hex(&hmac_sha256(&key, &to_sign));
    let authorization = format!(
        "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed_names}, Signature={signature}",
        keys.access
    );
    let mut all: Vec<(&str, &str)> = headers.to_vec();
    all.push(("x-amz-content-sha256", &payload));
    all.push(("x-amz-date", &date_time));
    all.push(("Authorization", &authorization));
    let target = if query.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{query}")
    };
    raw_http::request(s3.addr(), method, &target, &all, body)
}

/// A tiny HTTP/1.1 server on a thread, one connection per request, answering:
/// - `/down`: 503;
/// - `/slow`: 200 after 1.5 s;
/// - anything else: 200 with its name as the body and in `X-Backend`; a request without
///   `Mcp-Session-Id` gets a new one, `<name>-<n>`, like an MCP server's `initialize`.
pub struct Backend {
    pub addr: SocketAddr,
    pub name: &'static str,
}

impl Backend {
    pub fn start(name: &'static str) -> Self {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let addr = listener.local_addr().unwrap();
        let sessions = Arc::new(AtomicUsize::new(0));
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let sessions = sessions.clone();
                std::thread::spawn(move || serve(conn, name, &sessions));
            }
        });
        Self { addr, name }
    }
}

fn serve(mut conn: TcpStream, name: &str, sessions: &AtomicUsize) {
    conn.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match conn.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            // A health check's bare connect, or a client gone.
            _ => return,
        }
    }
    let head = String::from_utf8_lossy(&head);
    let path = head.split(' ').nth(1).unwrap_or("/").to_owned();
    let has_session = head
        .lines()
        .any(|l| l.to_ascii_lowercase().starts_with("mcp-session-id:"));
    let (status, extra) = match path.as_str() {
        "/down" => ("503 Service Unavailable", String::new()),
        "/slow" => {
            std::thread::sleep(Duration::from_millis(1500));
            ("200 OK", String::new())
        }
        _ if has_session => ("200 OK", String::new()),
        _ => {
            let n = sessions.fetch_add(1, Ordering::SeqCst);
            ("200 OK", format!("Mcp-Session-Id: {name}-{n}\r\n"))
        }
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\nX-Backend: {name}\r\n{extra}\r\n{name}",
        name.len()
    );
    let _ = conn.write_all(response.as_bytes());
}

/// A loopback address nothing listens on (bound, then released).
pub fn dead_addr() -> SocketAddr {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
}
