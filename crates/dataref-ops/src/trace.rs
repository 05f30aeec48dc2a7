//! Spans exported as OpenTelemetry traces over OTLP/HTTP (protobuf), off unless configured.
//!
//! The code is instrumented with `tracing` spans (`info_span!` at the MCP request, the
//! agent run, each model call, tool call, sandbox job, SQL query and store read or write);
//! [`layer()`] is a `tracing_subscriber` layer that turns the spans of dataref's own crates
//! into OTLP spans: a trace id per root span, the parent from the span tree, start and end
//! times, the span's fields as attributes, status `ERROR` when the span recorded an error.
//! The layer is installed at start and does nothing until [`start`] (the config's
//! `[traces]` is known later than logging starts); [`flush`] before the process exits.
//!
//! Fields with special meaning (the names `tracing-opentelemetry` uses): `otel.name` (the
//! exported span name), `otel.kind` (`server`, `client`, `internal`), `otel.status_code`
//! (`ERROR`, `OK`), and `error` (any value: status `ERROR`). The fields in [`TEXT_FIELDS`]
//! carry text a person or model wrote (SQL, prompts): they are exported only with
//! [`Settings::include_text`]. An `ERROR` event inside a span also sets its status.
//!
//! No opentelemetry crates: the few messages are written by hand (`proto`), posted by
//! reqwest from a thread of their own. Spans go through a bounded queue: when it is full
//! they are dropped and counted ([`stats`]); nothing here blocks or fails a call.

mod export;
mod layer;
mod proto;

use std::time::Duration;

pub use layer::{OtlpLayer, TraceFilter, layer};

/// Span fields that hold text people or models wrote: exported only with
/// [`Settings::include_text`].
pub const TEXT_FIELDS: &[&str] = &[
    "db.query.text",
    "gen_ai.prompt",
    "gen_ai.completion",
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.system_instructions",
];

/// Where and how spans are exported (`[traces]`, resolved).
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// The collector's base URL (`http://127.0.0.1:4318`); spans go to `/v1/traces` under it.
    pub endpoint: String,
    /// The resource's `service.name`.
    pub service_name: String,
    /// Sent with every export (an API key), already expanded.
    pub headers: Vec<(String, String)>,
    /// Export [`TEXT_FIELDS`] and error messages.
    pub include_text: bool,
    /// The share of traces exported, 0.0–1.0, decided at each trace's root.
    pub sample: f64,
}

/// Why exporting could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    #[error(
        "traces: `{endpoint}` is not an http:// or https:// URL\nhint: e.g. `endpoint = \"http://127.0.0.1:4318\"`"
    )]
    Endpoint { endpoint: String },
    #[error(
        "traces: header `{name}` cannot be sent: {reason}\nhint: header names are letters, digits and `-`; values are visible ASCII"
    )]
    Header { name: String, reason: String },
    #[error(
        "traces: the HTTP client could not be built: {0}\nhint: this is a bug of dataref's; report it"
    )]
    Client(String),
    #[error(
        "traces: the exporter thread could not start: {0}\nhint: the system is out of threads or memory"
    )]
    Thread(std::io::Error),
    #[error("traces: exporting was started already")]
    Started,
}

/// Starts exporting: the spans [`layer()`] sees from now on are sent to `settings.endpoint`.
/// Once per process. A TLS provider must be installed first for an `https://` endpoint.
pub fn start(settings: Settings) -> Result<(), TraceError> {
    export::start(settings)
}

/// Sends what is queued and waits for it, at most `timeout`. Call before the process exits.
pub fn flush(timeout: Duration) {
    export::flush(timeout);
}

/// What the exporter did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TraceStats {
    /// Spans the collector accepted.
    pub exported: u64,
    /// Spans dropped because the queue was full.
    pub dropped: u64,
    /// Spans lost because an export failed (refused, unreachable, timed out).
    pub failed: u64,
}

/// Counts since start; all zero when traces are off.
pub fn stats() -> TraceStats {
    export::stats()
}

/// Exporting is on.
pub fn enabled() -> bool {
    export::exporter().is_some()
}

/// Exporting is on and told to include text: only then do the spans record the fields of
/// [`TEXT_FIELDS`] at all, so a prompt or a query's text never reaches the log either (its
/// layer formats the same fields when `DATAREF_LOG` asks for `info`).
pub fn include_text() -> bool {
    export::exporter().is_some_and(|e| e.include_text)
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpListener;

    use tracing_subscriber::layer::SubscriberExt;

    use super::proto::wire::{Field, decode, len, text};
    use super::*;

    /// One HTTP request: its head (request line and headers) and its body.
    fn read_request(stream: &std::net::TcpStream) -> (String, Vec<u8>) {
        let mut reader = BufReader::new(stream);
        let mut head = String::new();
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if line == "\r\n" || line.is_empty() {
                break;
            }
            head.push_str(&line);
        }
        let length: usize = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().unwrap())
            })
            .unwrap();
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        (head, body)
    }

    /// The spans of an `ExportTraceServiceRequest`, each as its fields.
    fn spans(body: &[u8]) -> Vec<Vec<(u32, Field)>> {
        let mut out = Vec::new();
        for (n, rs) in decode(body) {
            assert_eq!(n, 1);
            for (n, ss) in decode(len(&rs)) {
                if n != 2 {
                    continue;
                }
                for (n, span) in decode(len(&ss)) {
                    if n == 2 {
                        out.push(decode(len(&span)));
                    }
                }
            }
        }
        out
    }

    fn field(span: &[(u32, Field)], number: u32) -> Option<&Field> {
        span.iter().find(|(n, _)| *n == number).map(|(_, f)| f)
    }

    fn attribute_keys(span: &[(u32, Field)]) -> Vec<String> {
        span.iter()
            .filter(|(n, _)| *n == 9)
            .map(|(_, kv)| text(&decode(len(kv))[0].1).to_owned())
            .collect()
    }

    /// The whole path in one process: spans made under a subscriber with [`layer`], sent
    /// by [`start`]'s exporter to a collector (a socket here), read back. The only test
    /// that starts the process-wide exporter.
    #[test]
    fn spans_reach_the_collector_as_one_trace_without_their_text() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let mut stream = stream.unwrap();
                let request = read_request(&stream);
                stream
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\n\
                          content-length: 0\r\nconnection: close\r\n\r\n",
                    )
                    .unwrap();
                tx.send(request).unwrap();
            }
        });
        start(Settings {
            endpoint: format!("http://127.0.0.1:{port}/"),
            service_name: "unit".into(),
            headers: vec![("x-key".into(), "k1".into())],
            include_text: false,
            sample: 1.0,
        })
        .unwrap();
        assert!(matches!(
            start(Settings {
                endpoint: "http://127.0.0.1:1".into(),
                service_name: "again".into(),
                headers: Vec::new(),
                include_text: false,
                sample: 1.0,
            }),
            Err(TraceError::Started)
        ));
        let subscriber = tracing_subscriber::registry().with(layer());
        tracing::subscriber::with_default(subscriber, || {
            let run = tracing::info_span!(
                "agent_run",
                otel.kind = "server",
                gen_ai.prompt = "the secret question",
            );
            run.in_scope(|| {
                let query = tracing::info_span!(
                    "sql_query",
                    db.query.text = "SELECT secret FROM t",
                    rows = tracing::field::Empty,
                );
                query.record("rows", 7u64);
                query.in_scope(|| tracing::error!("it broke on secret data"));
                // Below INFO: not a span the exporter sees.
                tracing::debug_span!("noise").in_scope(|| {});
            });
        });
        flush(Duration::from_secs(5));
        let (head, body) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(head.starts_with("POST /v1/traces HTTP/1.1\r\n"), "{head}");
        let head = head.to_ascii_lowercase();
        assert!(
            head.contains("content-type: application/x-protobuf"),
            "{head}"
        );
        assert!(head.contains("x-key: k1"), "{head}");
        assert!(
            !body.windows(6).any(|w| w == b"secret"),
            "text was exported"
        );

        let spans = spans(&body);
        let name = |s: &Vec<(u32, Field)>| text(field(s, 5).unwrap()).to_owned();
        let mut names: Vec<String> = spans.iter().map(name).collect();
        names.sort();
        assert_eq!(names, ["agent_run", "sql_query"]);
        let run = spans.iter().find(|s| name(s) == "agent_run").unwrap();
        let query = spans.iter().find(|s| name(s) == "sql_query").unwrap();
        assert_eq!(field(run, 1), field(query, 1), "one trace");
        assert_eq!(len(field(run, 1).unwrap()).len(), 16);
        assert_eq!(len(field(run, 2).unwrap()).len(), 8);
        assert_eq!(field(run, 4), None, "the run is the root");
        assert_eq!(
            field(query, 4),
            field(run, 2),
            "the query's parent is the run"
        );
        assert_eq!(field(run, 6), Some(&Field::Varint(2)), "kind SERVER");
        assert_eq!(field(query, 6), Some(&Field::Varint(1)), "kind INTERNAL");
        assert_eq!(attribute_keys(run), Vec::<String>::new());
        assert_eq!(attribute_keys(query), ["rows"]);
        let status = decode(len(field(query, 15).unwrap()));
        assert_eq!(status, [(3, Field::Varint(2))], "ERROR, no message");
        assert_eq!(stats().exported, 2);
    }
}
