//! A minimal blocking HTTP/1.1 client over a plain `TcpStream`, for readiness probes and
//! for tests that need one request without a client library: one request per connection
//! (`Connection: close`), the response read to the end, chunked bodies decoded.
//!
//! ```no_run
//! # fn demo(addr: std::net::SocketAddr) -> std::io::Result<()> {
//! use dataref_test_support::raw_http;
//! let r = raw_http::request(addr, "GET", "/healthz", &[], b"")?;
//! assert_eq!(r.status, 200);
//! # Ok(()) }
//! ```

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// How long a probe waits to connect and for each read or write.
const TIMEOUT: Duration = Duration::from_secs(10);

/// A response: status, headers in order (names as sent), the whole body.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// The first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends `method path` with `headers` and `body` to `addr` and reads the whole response.
/// `Host`, `Connection: close` and `Content-Length` are added.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> io::Result<Response> {
    let mut stream = TcpStream::connect_timeout(&addr, TIMEOUT)?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.set_write_timeout(Some(TIMEOUT))?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    parse(&raw, method == "HEAD")
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("bad HTTP response: {what}"),
    )
}

fn parse(raw: &[u8], head_only: bool) -> io::Result<Response> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| invalid("no end of headers"))?;
    let head = std::str::from_utf8(&raw[..end]).map_err(|_| invalid("headers not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| invalid("no status line"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let rest = &raw[end + 4..];
    let chunked = headers.iter().any(|(n, v)| {
        n.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
    });
    let body = if head_only {
        Vec::new()
    } else if chunked {
        dechunk(rest)?
    } else {
        rest.to_vec()
    };
    Ok(Response {
        status,
        headers,
        body,
    })
}

fn dechunk(mut rest: &[u8]) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| invalid("chunk size line"))?;
        let size_text =
            std::str::from_utf8(&rest[..line_end]).map_err(|_| invalid("chunk size"))?;
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16).map_err(|_| invalid("chunk size"))?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Ok(body);
        }
        let chunk = rest.get(..size).ok_or_else(|| invalid("short chunk"))?;
        body.extend_from_slice(chunk);
        rest = rest.get(size + 2..).ok_or_else(|| invalid("chunk end"))?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_chunked_bodies() {
        let r = parse(b"HTTP/1.1 403 Forbidden\r\nX-A: 1\r\n\r\nno", false).unwrap();
        assert_eq!(
            (r.status, r.header("x-a"), r.text().as_str()),
            (403, Some("1"), "no")
        );
        let r = parse(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n",
            false,
        )
        .unwrap();
        assert_eq!(r.text(), "abcde");
        assert!(parse(b"HTTP/1.1 200 OK\r\n", false).is_err());
    }
}
