//! The `tracing_subscriber` layer: spans in, [`SpanRecord`]s out to the exporter.

use std::cell::Cell;
use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::filter::{Filtered, LevelFilter};
use tracing_subscriber::layer::{Context, Filter, Layer};
use tracing_subscriber::registry::LookupSpan;

use super::TEXT_FIELDS;
use super::export::{Exporter, exporter};
use super::proto::{AnyValue, SpanKind, SpanRecord, StatusCode};

/// The layer to add to the subscriber at start, with its own filter: the `INFO` (and
/// above) spans of dataref's crates, and `ERROR` events (they mark their span failed),
/// whatever `DATAREF_LOG` lets the log show. It does nothing until [`super::start`].
pub fn layer<S>() -> Filtered<OtlpLayer, TraceFilter, S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    OtlpLayer.with_filter(TraceFilter)
}

/// Turns spans into OTLP spans; see [`layer`].
#[derive(Debug, Clone, Copy, Default)]
pub struct OtlpLayer;

/// Which spans and events [`OtlpLayer`] sees; see [`layer`].
#[derive(Debug, Clone, Copy, Default)]
pub struct TraceFilter;

fn wanted(meta: &Metadata<'_>) -> bool {
    if meta.is_span() {
        *meta.level() <= Level::INFO && meta.target().starts_with("dataref")
    } else {
        *meta.level() == Level::ERROR
    }
}

impl<S> Filter<S> for TraceFilter {
    fn enabled(&self, meta: &Metadata<'_>, _cx: &Context<'_, S>) -> bool {
        exporter().is_some() && wanted(meta)
    }

    // Cached per callsite: while traces are off every callsite is `never` and the level
    // hint `OFF`, so this layer costs a span nothing. `start` rebuilds the cache.
    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        if exporter().is_some() && wanted(meta) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(if exporter().is_some() {
            LevelFilter::INFO
        } else {
            LevelFilter::OFF
        })
    }
}

/// A span while it is open, kept in its extensions.
struct Live {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    parent_span_id: Option<[u8; 8]>,
    sampled: bool,
    name: String,
    kind: SpanKind,
    start_unix_nanos: u64,
    attributes: Vec<(String, AnyValue)>,
    status: StatusCode,
    status_message: String,
}

impl<S> Layer<S> for OtlpLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(exporter) = exporter() else {
            return;
        };
        let Some(span) = ctx.span(id) else {
            return;
        };
        // The parent this layer sees (the filter's spans only), else a new trace.
        let inherited = span.parent().and_then(|p| {
            p.extensions()
                .get::<Live>()
                .map(|l| (l.trace_id, l.span_id, l.sampled))
        });
        let (trace_id, parent_span_id, sampled) = match inherited {
            Some((trace, parent, sampled)) => (trace, Some(parent), sampled),
            None => (trace_id(), None, sampled(exporter.sample)),
        };
        let mut live = Live {
            trace_id,
            span_id: span_id(),
            parent_span_id,
            sampled,
            name: attrs.metadata().name().to_owned(),
            kind: SpanKind::Internal,
            start_unix_nanos: now_unix_nanos(),
            attributes: Vec::new(),
            status: StatusCode::Unset,
            status_message: String::new(),
        };
        if sampled {
            attrs.record(&mut Fields {
                live: &mut live,
                exporter,
            });
        }
        span.extensions_mut().insert(live);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(exporter) = exporter() else {
            return;
        };
        let Some(span) = ctx.span(id) else {
            return;
        };
        let mut extensions = span.extensions_mut();
        if let Some(live) = extensions.get_mut::<Live>()
            && live.sampled
        {
            values.record(&mut Fields { live, exporter });
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let Some(exporter) = exporter() else {
            return;
        };
        if *event.metadata().level() != Level::ERROR {
            return;
        }
        let Some(span) = ctx.event_span(event) else {
            return;
        };
        let mut extensions = span.extensions_mut();
        if let Some(live) = extensions.get_mut::<Live>() {
            live.status = StatusCode::Error;
            if exporter.include_text && live.status_message.is_empty() {
                let mut message = Message(String::new());
                event.record(&mut message);
                live.status_message = message.0;
            }
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(exporter) = exporter() else {
            return;
        };
        let Some(span) = ctx.span(&id) else {
            return;
        };
        let Some(live) = span.extensions_mut().remove::<Live>() else {
            return;
        };
        if !live.sampled {
            return;
        }
        exporter.submit(SpanRecord {
            trace_id: live.trace_id,
            span_id: live.span_id,
            parent_span_id: live.parent_span_id,
            name: live.name,
            kind: live.kind,
            start_unix_nanos: live.start_unix_nanos,
            end_unix_nanos: now_unix_nanos().max(live.start_unix_nanos),
            attributes: live.attributes,
            status: live.status,
            status_message: live.status_message,
        });
    }
}

/// Records a span's fields into its [`Live`].
struct Fields<'a> {
    live: &'a mut Live,
    exporter: &'a Exporter,
}

impl Fields<'_> {
    fn put(&mut self, field: &Field, value: AnyValue) {
        let name = field.name();
        match (name, &value) {
            ("otel.name", AnyValue::Str(s)) => self.live.name.clone_from(s),
            ("otel.kind", AnyValue::Str(s)) => {
                self.live.kind = match s.to_ascii_lowercase().as_str() {
                    "server" => SpanKind::Server,
                    "client" => SpanKind::Client,
                    _ => SpanKind::Internal,
                };
            }
            ("otel.status_code", AnyValue::Str(s)) => {
                self.live.status = match s.to_ascii_uppercase().as_str() {
                    "ERROR" => StatusCode::Error,
                    "OK" => StatusCode::Ok,
                    _ => self.live.status,
                };
            }
            ("otel.status_description", AnyValue::Str(s)) => {
                if self.exporter.include_text {
                    self.live.status_message.clone_from(s);
                }
            }
            ("error", _) => {
                self.live.status = StatusCode::Error;
                if self.exporter.include_text
                    && let AnyValue::Str(s) = &value
                {
                    self.live.status_message.clone_from(s);
                }
            }
            _ => {
                if !self.exporter.include_text && TEXT_FIELDS.contains(&name) {
                    return;
                }
                // A field recorded again replaces its value.
                match self.live.attributes.iter_mut().find(|(k, _)| k == name) {
                    Some((_, v)) => *v = value,
                    None => self.live.attributes.push((name.to_owned(), value)),
                }
            }
        }
    }
}

impl Visit for Fields<'_> {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, AnyValue::Double(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, AnyValue::Int(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        let v =
            i64::try_from(value).map_or_else(|_| AnyValue::Str(value.to_string()), AnyValue::Int);
        self.put(field, v);
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, AnyValue::Bool(value));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, AnyValue::Str(value.to_owned()));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.live.status = StatusCode::Error;
        if self.exporter.include_text {
            self.live.status_message = value.to_string();
        }
        let _ = field;
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field, AnyValue::Str(format!("{value:?}")));
    }
}

/// An event's `message`.
struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

fn now_unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

thread_local! {
    /// SplitMix64 state, seeded once per thread from the OS.
    static RNG: Cell<u64> = Cell::new(seed());
}

fn seed() -> u64 {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_ok() {
        return u64::from_le_bytes(b);
    }
    // No OS randomness: the time and this thread's stack address still differ per thread.
    let local = 0u8;
    now_unix_nanos() ^ (std::ptr::from_ref(&local) as u64).rotate_left(32)
}

fn next_u64() -> u64 {
    RNG.with(|state| {
        let s = state.get().wrapping_add(0x9e37_79b9_7f4a_7c15);
        state.set(s);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    })
}

/// 16 random bytes, never all zero (an invalid id).
fn trace_id() -> [u8; 16] {
    loop {
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&next_u64().to_le_bytes());
        id[8..].copy_from_slice(&next_u64().to_le_bytes());
        if id != [0; 16] {
            return id;
        }
    }
}

/// 8 random bytes, never all zero.
fn span_id() -> [u8; 8] {
    loop {
        let id = next_u64().to_le_bytes();
        if id != [0; 8] {
            return id;
        }
    }
}

/// Keep a new trace with probability `share`.
fn sampled(share: f64) -> bool {
    if share >= 1.0 {
        return true;
    }
    if share <= 0.0 {
        return false;
    }
    // 53 random bits as a float in [0, 1).
    ((next_u64() >> 11) as f64) / ((1u64 << 53) as f64) < share
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_random_and_never_zero() {
        let a = trace_id();
        let b = trace_id();
        assert_ne!(a, b);
        assert_ne!(span_id(), span_id());
        assert!(sampled(1.0));
        assert!(!sampled(0.0));
        let kept = (0..10_000).filter(|_| sampled(0.25)).count();
        assert!((2_000..3_000).contains(&kept), "{kept}");
    }
}
