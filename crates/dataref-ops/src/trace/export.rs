//! The exporter: a bounded queue of finished spans, and a thread that batches them into
//! `ExportTraceServiceRequest`s and posts them. The queue never blocks a span's close:
//! when it is full the span is dropped and counted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};

use super::proto::{AnyValue, SpanRecord, export_request};
use super::{Settings, TraceError, TraceStats};

/// Spans waiting to be sent; more are dropped.
const QUEUE: usize = 4096;
/// A batch is sent when it has this many spans…
const BATCH: usize = 512;
/// …or this long after the last send.
const INTERVAL: Duration = Duration::from_secs(1);
/// One export may take this long.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// At most one warning about failed exports this often.
const WARN_EVERY: Duration = Duration::from_secs(60);

pub(crate) enum Message {
    Span(Box<SpanRecord>),
    Flush(SyncSender<()>),
}

/// What the layer needs of a running exporter.
pub(crate) struct Exporter {
    queue: SyncSender<Message>,
    pub include_text: bool,
    pub sample: f64,
}

static EXPORTER: OnceLock<Exporter> = OnceLock::new();
static EXPORTED: AtomicU64 = AtomicU64::new(0);
static DROPPED: AtomicU64 = AtomicU64::new(0);
static FAILED: AtomicU64 = AtomicU64::new(0);
/// Serialises [`start`]: the client and thread are made once.
static STARTING: Mutex<()> = Mutex::new(());

pub(crate) fn exporter() -> Option<&'static Exporter> {
    EXPORTER.get()
}

impl Exporter {
    /// Queues a finished span; drops and counts it when the queue is full or the thread
    /// is gone.
    pub(crate) fn submit(&self, span: SpanRecord) {
        match self.queue.try_send(Message::Span(Box::new(span))) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                DROPPED.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

pub(crate) fn stats() -> TraceStats {
    TraceStats {
        exported: EXPORTED.load(Ordering::Relaxed),
        dropped: DROPPED.load(Ordering::Relaxed),
        failed: FAILED.load(Ordering::Relaxed),
    }
}

pub(crate) fn start(settings: Settings) -> Result<(), TraceError> {
    let _once = STARTING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if EXPORTER.get().is_some() {
        return Err(TraceError::Started);
    }
    let base = settings.endpoint.trim_end_matches('/');
    if !(base.starts_with("http://") || base.starts_with("https://")) {
        return Err(TraceError::Endpoint {
            endpoint: settings.endpoint.clone(),
        });
    }
    let url = format!("{base}/v1/traces");
    let mut headers = HeaderMap::new();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/x-protobuf"),
    );
    for (name, value) in &settings.headers {
        let header_name =
            HeaderName::from_bytes(name.as_bytes()).map_err(|e| TraceError::Header {
                name: name.clone(),
                reason: e.to_string(),
            })?;
        let mut header_value = HeaderValue::from_str(value).map_err(|e| TraceError::Header {
            name: name.clone(),
            reason: e.to_string(),
        })?;
        header_value.set_sensitive(true);
        headers.insert(header_name, header_value);
    }
    // reqwest (built without a provider of its own) panics without the process's.
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        return Err(TraceError::Client(
            "no TLS provider is installed in this process".into(),
        ));
    }
    let client = reqwest::Client::builder()
        .timeout(EXPORT_TIMEOUT)
        .connect_timeout(EXPORT_TIMEOUT)
        .default_headers(headers)
        .build()
        .map_err(|e| TraceError::Client(e.to_string()))?;
    let resource = vec![
        (
            "service.name".to_owned(),
            AnyValue::Str(settings.service_name.clone()),
        ),
        (
            "service.version".to_owned(),
            AnyValue::Str(env!("CARGO_PKG_VERSION").to_owned()),
        ),
        (
            "telemetry.sdk.name".to_owned(),
            AnyValue::Str("dataref".to_owned()),
        ),
        (
            "telemetry.sdk.language".to_owned(),
            AnyValue::Str("rust".to_owned()),
        ),
    ];
    let (queue, rx) = sync_channel(QUEUE);
    let sender = Sender {
        client,
        url,
        resource,
        last_warning: None,
    };
    std::thread::Builder::new()
        .name("dataref-otlp".into())
        .spawn(move || sender.run(rx))
        .map_err(TraceError::Thread)?;
    // Set last: until here no span is queued for a thread that is not running.
    let _ = EXPORTER.set(Exporter {
        queue,
        include_text: settings.include_text,
        sample: settings.sample.clamp(0.0, 1.0),
    });
    // The layer's filter said `never` to every callsite while it was off.
    tracing::callsite::rebuild_interest_cache();
    Ok(())
}

pub(crate) fn flush(timeout: Duration) {
    let Some(exporter) = EXPORTER.get() else {
        return;
    };
    let deadline = Instant::now() + timeout;
    let (done, wait) = sync_channel(1);
    let mut message = Message::Flush(done);
    // The queue may be full: retry until the deadline rather than block.
    loop {
        match exporter.queue.try_send(message) {
            Ok(()) => break,
            Err(TrySendError::Disconnected(_)) => return,
            Err(TrySendError::Full(m)) => {
                if Instant::now() >= deadline {
                    return;
                }
                message = m;
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
    let _ = wait.recv_timeout(deadline.saturating_duration_since(Instant::now()));
}

/// The exporter thread's state.
struct Sender {
    client: reqwest::Client,
    url: String,
    resource: Vec<(String, AnyValue)>,
    last_warning: Option<Instant>,
}

impl Sender {
    fn run(mut self, rx: Receiver<Message>) {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "traces: the exporter's runtime could not start; no spans are exported");
                // Keep draining so the queue counts what is lost instead of filling.
                for m in rx {
                    if let Message::Span(_) = m {
                        FAILED.fetch_add(1, Ordering::Relaxed);
                    }
                }
                return;
            }
        };
        let mut batch: Vec<SpanRecord> = Vec::with_capacity(BATCH);
        let mut next = Instant::now() + INTERVAL;
        loop {
            let wait = next.saturating_duration_since(Instant::now());
            match rx.recv_timeout(wait) {
                Ok(Message::Span(span)) => {
                    batch.push(*span);
                    if batch.len() >= BATCH {
                        self.send(&runtime, &mut batch);
                        next = Instant::now() + INTERVAL;
                    }
                }
                Ok(Message::Flush(done)) => {
                    self.send(&runtime, &mut batch);
                    let _ = done.try_send(());
                }
                Err(RecvTimeoutError::Timeout) => {
                    self.send(&runtime, &mut batch);
                    next = Instant::now() + INTERVAL;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    self.send(&runtime, &mut batch);
                    return;
                }
            }
        }
    }

    fn send(&mut self, runtime: &tokio::runtime::Runtime, batch: &mut Vec<SpanRecord>) {
        if batch.is_empty() {
            return;
        }
        let count = batch.len() as u64;
        let body = export_request(
            &self.resource,
            ("dataref", env!("CARGO_PKG_VERSION")),
            batch,
        );
        batch.clear();
        // Built inside the runtime: the request's timeout needs its timer.
        let request = async { self.client.post(&self.url).body(body).send().await };
        let failure = match runtime.block_on(request) {
            Ok(response) if response.status().is_success() => None,
            Ok(response) => Some(format!("the collector answered {}", response.status())),
            Err(e) => Some(e.to_string()),
        };
        match failure {
            None => {
                EXPORTED.fetch_add(count, Ordering::Relaxed);
            }
            Some(why) => {
                FAILED.fetch_add(count, Ordering::Relaxed);
                let due = self
                    .last_warning
                    .is_none_or(|at| at.elapsed() >= WARN_EVERY);
                if due {
                    self.last_warning = Some(Instant::now());
                    tracing::warn!(
                        url = %self.url,
                        "traces: {count} spans not exported: {why} (further failures within a minute are only counted)"
                    );
                }
            }
        }
    }
}
