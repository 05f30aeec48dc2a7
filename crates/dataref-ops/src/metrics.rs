//! Counters, gauges and histograms every layer records into, served in Prometheus's text
//! exposition format (0.0.4) by [`render`].
//!
//! One registry per process: each metric is a `static` [`Family`] with its name, help,
//! type and label names; its series (one per set of label values) are made on first use
//! and kept for the process's life. Recording is an uncontended lock to find the series and
//! an atomic add: it never fails and never waits on I/O.
//!
//! Label values are bounded. Those that come from the code (an outcome, a reason, a route
//! template) are `&'static str`; those that come from the config or a registry (a tool's,
//! an agent's or a model's name) are passed by the caller, which sends [`OTHER`] for a
//! name it does not know (a tool a model invented). As a last line, a family holds at most
//! [`MAX_SERIES`] series: past that, new label sets are counted under `other`.
//!
//! Values that are cheap to read but costly to keep current (the store's size, the warm
//! pool) are read at scrape time: the layer that owns them registers a collector
//! ([`set_collector`]) that sets its gauges, and [`render`] runs every collector first.
//!
//! ```
//! dataref_ops::metrics::tool_call("run_sql", "ok", 0.12);
//! let text = dataref_ops::metrics::render();
//! assert!(text.contains("dataref_tool_calls_total{tool=\"run_sql\",outcome=\"ok\"}"));
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// The label value of a name that is not known (not in the registry or the config), and of
/// every label set past [`MAX_SERIES`].
pub const OTHER: &str = "other";

/// Series one family may hold; later label sets are counted under [`OTHER`].
pub const MAX_SERIES: usize = 2000;

/// Label values longer than this are cut (a bound on memory, not on meaning: known names
/// are far shorter).
const MAX_LABEL_CHARS: usize = 128;

/// The content type of [`render`]'s text.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Upper bounds (seconds) of requests and tool calls.
const REQUEST_SECONDS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];
/// Upper bounds (seconds) of model requests.
const MODEL_SECONDS: &[f64] = &[
    0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0, 300.0,
];

/// What a family counts, and how it is rendered.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    /// Only goes up (`_total`).
    Counter,
    /// Set to the current value.
    Gauge,
    /// Observations in cumulative buckets with these upper bounds (ascending; `+Inf` is
    /// added), their sum and count.
    Histogram(&'static [f64]),
}

impl Kind {
    fn type_name(self) -> &'static str {
        match self {
            Self::Counter => "counter",
            Self::Gauge => "gauge",
            Self::Histogram(_) => "histogram",
        }
    }
}

/// One metric: name, help, type, label names, and its series by label values.
#[derive(Debug)]
pub struct Family {
    name: &'static str,
    help: &'static str,
    kind: Kind,
    labels: &'static [&'static str],
    series: Mutex<BTreeMap<Vec<String>, Arc<Series>>>,
}

/// One series: a counter's count or a gauge's value (as `f64` bits), or a histogram's
/// buckets (per bucket, not yet cumulative), sum (`f64` bits) and count.
#[derive(Debug)]
struct Series {
    value: AtomicU64,
    buckets: Box<[AtomicU64]>,
    sum: AtomicU64,
    count: AtomicU64,
}

impl Series {
    fn new(kind: Kind) -> Self {
        let buckets = match kind {
            Kind::Histogram(bounds) => (0..bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            Kind::Counter | Kind::Gauge => Box::default(),
        };
        Self {
            value: AtomicU64::new(0),
            buckets,
            sum: AtomicU64::new(0f64.to_bits()),
            count: AtomicU64::new(0),
        }
    }
}

/// Adds `delta` to the `f64` held as bits in `cell`.
fn add_f64(cell: &AtomicU64, delta: f64) {
    let _ = cell.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
        Some((f64::from_bits(bits) + delta).to_bits())
    });
}

impl Family {
    /// A family with no series yet. `labels` are the label names, in the order values are
    /// passed to the recording methods.
    pub const fn new(
        name: &'static str,
        help: &'static str,
        kind: Kind,
        labels: &'static [&'static str],
    ) -> Self {
        Self {
            name,
            help,
            kind,
            labels,
            series: Mutex::new(BTreeMap::new()),
        }
    }

    /// The series of `values` (one per label name), made on first use.
    fn series(&self, values: &[&str]) -> Arc<Series> {
        let mut map = self.series.lock().unwrap_or_else(PoisonError::into_inner);
        let key: Vec<String> = self
            .labels
            .iter()
            .enumerate()
            .map(|(i, _)| bounded(values.get(i).copied().unwrap_or(OTHER)))
            .collect();
        if let Some(s) = map.get(&key) {
            return s.clone();
        }
        let key = if map.len() >= MAX_SERIES {
            vec![OTHER.to_owned(); self.labels.len()]
        } else {
            key
        };
        map.entry(key)
            .or_insert_with(|| Arc::new(Series::new(self.kind)))
            .clone()
    }

    /// Counter: adds `n`.
    pub fn inc_by(&self, values: &[&str], n: u64) {
        self.series(values).value.fetch_add(n, Ordering::Relaxed);
    }

    /// Counter: adds one.
    pub fn inc(&self, values: &[&str]) {
        self.inc_by(values, 1);
    }

    /// Counter: sets it to `n`, read from a count kept elsewhere that only goes up (the
    /// audit trail's and the trace exporter's own).
    pub fn set_count(&self, values: &[&str], n: u64) {
        self.series(values).value.store(n, Ordering::Relaxed);
    }

    /// Gauge: sets it to `v`.
    pub fn set(&self, values: &[&str], v: f64) {
        self.series(values)
            .value
            .store(v.to_bits(), Ordering::Relaxed);
    }

    /// Histogram: one observation of `v`.
    pub fn observe(&self, values: &[&str], v: f64) {
        let Kind::Histogram(bounds) = self.kind else {
            return;
        };
        let s = self.series(values);
        // NaN lands in no finite bucket, only in `+Inf` (the count).
        if let Some(i) = bounds.iter().position(|b| v <= *b)
            && let Some(bucket) = s.buckets.get(i)
        {
            bucket.fetch_add(1, Ordering::Relaxed);
        }
        add_f64(&s.sum, v);
        s.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Appends this family in the text format: `# HELP`, `# TYPE`, then each series.
    /// A family without series is left out (Prometheus needs no empty families).
    fn render(&self, out: &mut String) {
        let map = self.series.lock().unwrap_or_else(PoisonError::into_inner);
        if map.is_empty() {
            return;
        }
        let _ = writeln!(out, "# HELP {} {}", self.name, escape_help(self.help));
        let _ = writeln!(out, "# TYPE {} {}", self.name, self.kind.type_name());
        for (values, s) in map.iter() {
            let labels = label_text(self.labels, values, None);
            match self.kind {
                Kind::Counter => {
                    let _ = writeln!(
                        out,
                        "{}{labels} {}",
                        self.name,
                        s.value.load(Ordering::Relaxed)
                    );
                }
                Kind::Gauge => {
                    let v = f64::from_bits(s.value.load(Ordering::Relaxed));
                    let _ = writeln!(out, "{}{labels} {}", self.name, number(v));
                }
                Kind::Histogram(bounds) => {
                    // Read the count first: the buckets then never add up to more than it.
                    let count = s.count.load(Ordering::Relaxed);
                    let mut cumulative = 0u64;
                    for (bound, bucket) in bounds.iter().zip(s.buckets.iter()) {
                        cumulative = cumulative
                            .saturating_add(bucket.load(Ordering::Relaxed))
                            .min(count);
                        let le = label_text(self.labels, values, Some(&number(*bound)));
                        let _ = writeln!(out, "{}_bucket{le} {cumulative}", self.name);
                    }
                    let le = label_text(self.labels, values, Some("+Inf"));
                    let _ = writeln!(out, "{}_bucket{le} {count}", self.name);
                    let sum = f64::from_bits(s.sum.load(Ordering::Relaxed));
                    let _ = writeln!(out, "{}_sum{labels} {}", self.name, number(sum));
                    let _ = writeln!(out, "{}_count{labels} {count}", self.name);
                }
            }
        }
    }
}

/// `value` cut to [`MAX_LABEL_CHARS`] characters.
fn bounded(value: &str) -> String {
    match value.char_indices().nth(MAX_LABEL_CHARS) {
        Some((end, _)) => value.get(..end).unwrap_or(OTHER).to_owned(),
        None => value.to_owned(),
    }
}

/// `{a="x",b="y"}` (with `le` last when given), or nothing for no labels.
fn label_text(names: &[&str], values: &[String], le: Option<&str>) -> String {
    let mut pairs: Vec<String> = names
        .iter()
        .zip(values)
        .map(|(n, v)| format!("{n}=\"{}\"", escape_label(v)))
        .collect();
    if let Some(le) = le {
        pairs.push(format!("le=\"{le}\""));
    }
    if pairs.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", pairs.join(","))
    }
}

/// A label value as the format writes it: `\`, `"` and newline escaped.
pub fn escape_label(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// A help text as the format writes it: `\` and newline escaped.
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// A sample value or bound: `+Inf`, `-Inf`, `NaN`, else Rust's shortest exact form.
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        format!("{v}")
    }
}

// ---- The metrics. Names carry their unit; counters end in `_total`. ----

static MCP_REQUESTS: Family = Family::new(
    "dataref_mcp_requests_total",
    "MCP requests received, by transport (stdio, http) and JSON-RPC method (`invalid`: not a JSON-RPC request dataref could read).",
    Kind::Counter,
    &["transport", "method"],
);
static HTTP_REQUESTS: Family = Family::new(
    "dataref_http_requests_total",
    "HTTP requests answered by `serve --http`, by route template and status code.",
    Kind::Counter,
    &["route", "status"],
);
static HTTP_SECONDS: Family = Family::new(
    "dataref_http_request_duration_seconds",
    "Time from an HTTP request's arrival to its response's head, by route template.",
    Kind::Histogram(REQUEST_SECONDS),
    &["route"],
);
static TOOL_CALLS: Family = Family::new(
    "dataref_tool_calls_total",
    "Tool calls, by tool and outcome (ok, spilled, too_large, unknown_tool, invalid_arguments, tool_failed, server_fault, panicked, timed_out, cancelled).",
    Kind::Counter,
    &["tool", "outcome"],
);
static TOOL_SECONDS: Family = Family::new(
    "dataref_tool_call_duration_seconds",
    "Time a tool call took, spill and cap included, by tool.",
    Kind::Histogram(REQUEST_SECONDS),
    &["tool"],
);
static MODEL_REQUESTS: Family = Family::new(
    "dataref_model_requests_total",
    "Requests to a model, by agent profile, model and outcome (ok, error, timeout: still out when the run's wall time ended).",
    Kind::Counter,
    &["agent", "model", "outcome"],
);
static MODEL_SECONDS_FAMILY: Family = Family::new(
    "dataref_model_request_duration_seconds",
    "Time a model request took to its last streamed token, by agent profile and model.",
    Kind::Histogram(MODEL_SECONDS),
    &["agent", "model"],
);
static MODEL_TOKENS: Family = Family::new(
    "dataref_model_tokens_total",
    "Tokens the model endpoint reported, by agent profile, model and kind (prompt, completion).",
    Kind::Counter,
    &["agent", "model", "kind"],
);
static RATE_LIMITED: Family = Family::new(
    "dataref_rate_limited_total",
    "HTTP requests refused by a per-principal limit (rate, concurrency, downloads: 429; unavailable: 503, the shared counts out of reach).",
    Kind::Counter,
    &["reason"],
);
static AUTH_FAILURES: Family = Family::new(
    "dataref_auth_failures_total",
    "HTTP requests refused for want of a valid credential (missing, invalid token or JWT, bad signed link).",
    Kind::Counter,
    &["reason"],
);
static SQL_STOPPED: Family = Family::new(
    "dataref_sql_stopped_total",
    "SQL queries stopped by a limit: time, memory (run_sql and lakes), rows (a source query over its row cap).",
    Kind::Counter,
    &["limit"],
);
static SANDBOX_WARM: Family = Family::new(
    "dataref_sandbox_warm",
    "Warm `run_python` sandboxes ready now.",
    Kind::Gauge,
    &[],
);
static SANDBOX_BUSY: Family = Family::new(
    "dataref_sandbox_busy",
    "`run_python` jobs running now.",
    Kind::Gauge,
    &[],
);
static SANDBOX_COLD_STARTS: Family = Family::new(
    "dataref_sandbox_cold_starts_total",
    "`run_python` jobs that found no warm sandbox and started one of their own.",
    Kind::Counter,
    &[],
);
static SANDBOX_KILLS: Family = Family::new(
    "dataref_sandbox_kills_total",
    "`run_python` jobs stopped by dataref or the kernel, by reason (timeout, memory, output_flood, out_limit, cancelled).",
    Kind::Counter,
    &["reason"],
);
static STORE_BYTES: Family = Family::new(
    "dataref_store_bytes",
    "Bytes of live stored tables (artifacts), every owner's.",
    Kind::Gauge,
    &[],
);
static STORE_TABLES: Family = Family::new(
    "dataref_store_tables",
    "Live stored tables (artifacts), every owner's.",
    Kind::Gauge,
    &[],
);
static CACHE_LOOKUPS: Family = Family::new(
    "dataref_cache_lookups_total",
    "Lookups in a local cache, by cache (artifacts: the shared store's objects on this replica) and result (hit, miss).",
    Kind::Counter,
    &["cache", "result"],
);
static SHARED_ERRORS: Family = Family::new(
    "dataref_shared_store_errors_total",
    "Failed requests to the shared store of `[shared]` (the PostgreSQL index, the object store), by kind (unreachable, index, objects, timed_out, local, runtime).",
    Kind::Counter,
    &["kind"],
);
static BUDGET_EVENTS: Family = Family::new(
    "dataref_budget_events_total",
    "Budgets of `[budgets]` passing 80% (`warned`) or stopping a run (`stopped`), by budget (its key in the config).",
    Kind::Counter,
    &["budget", "event"],
);
static BUDGET_LEDGER_ERRORS: Family = Family::new(
    "dataref_budget_ledger_errors_total",
    "Reads or writes of the usage ledger that failed; budgets are not enforced while it cannot be read.",
    Kind::Counter,
    &[],
);
static AUDIT_DROPPED: Family = Family::new(
    "dataref_audit_dropped_total",
    "Audit events that could not be written (the writer's queue full, or the disk refusing).",
    Kind::Counter,
    &[],
);
static TRACE_SPANS: Family = Family::new(
    "dataref_trace_spans_total",
    "Spans handed to the OTLP exporter, by result (exported; dropped: the queue was full; failed: the collector refused or was unreachable).",
    Kind::Counter,
    &["result"],
);
static BUILD_INFO: Family = Family::new(
    "dataref_build_info",
    "Always 1; the version of the dataref serving.",
    Kind::Gauge,
    &["version"],
);

/// Every family, in the order [`render`] writes them.
static ALL: &[&Family] = &[
    &BUILD_INFO,
    &MCP_REQUESTS,
    &HTTP_REQUESTS,
    &HTTP_SECONDS,
    &TOOL_CALLS,
    &TOOL_SECONDS,
    &MODEL_REQUESTS,
    &MODEL_SECONDS_FAMILY,
    &MODEL_TOKENS,
    &RATE_LIMITED,
    &AUTH_FAILURES,
    &SQL_STOPPED,
    &SANDBOX_WARM,
    &SANDBOX_BUSY,
    &SANDBOX_COLD_STARTS,
    &SANDBOX_KILLS,
    &STORE_BYTES,
    &STORE_TABLES,
    &CACHE_LOOKUPS,
    &SHARED_ERRORS,
    &BUDGET_EVENTS,
    &BUDGET_LEDGER_ERRORS,
    &AUDIT_DROPPED,
    &TRACE_SPANS,
];

// ---- Recording, one function per thing that happens. ----

/// The transport an MCP request came over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Stdio,
    Http,
}

impl Transport {
    fn as_str(self) -> &'static str {
        match self {
            Self::Stdio => "stdio",
            Self::Http => "http",
        }
    }
}

/// One MCP request. `method` is the JSON-RPC method of a request dataref serves (the
/// caller sends [`OTHER`] for one it does not know, `invalid` for a message it refused).
pub fn mcp_request(transport: Transport, method: &str) {
    MCP_REQUESTS.inc(&[transport.as_str(), method]);
}

/// One HTTP request answered: its route template (never the raw path), its status and the
/// time to its response's head.
pub fn http_request(route: &str, status: u16, seconds: f64) {
    let mut code = [0u8; 3];
    let status = status_text(status, &mut code);
    HTTP_REQUESTS.inc(&[route, status]);
    HTTP_SECONDS.observe(&[route], seconds);
}

/// `status` as three digits, without allocating.
fn status_text(status: u16, buf: &mut [u8; 3]) -> &str {
    if !(100..=999).contains(&status) {
        return OTHER;
    }
    buf[0] = b'0' + (status / 100) as u8;
    buf[1] = b'0' + (status / 10 % 10) as u8;
    buf[2] = b'0' + (status % 10) as u8;
    std::str::from_utf8(buf).unwrap_or(OTHER)
}

/// One tool call: the tool's name ([`OTHER`] when the registry has no such tool), how it
/// ended, and how long it took.
pub fn tool_call(tool: &str, outcome: &'static str, seconds: f64) {
    TOOL_CALLS.inc(&[tool, outcome]);
    TOOL_SECONDS.observe(&[tool], seconds);
}

/// One request to a model: the agent profile and model (both from the config), the tokens
/// the endpoint reported, the time it took, whether it answered.
pub fn model_request(
    agent: &str,
    model: &str,
    prompt_tokens: u64,
    completion_tokens: u64,
    seconds: f64,
    ok: bool,
) {
    MODEL_REQUESTS.inc(&[agent, model, if ok { "ok" } else { "error" }]);
    MODEL_SECONDS_FAMILY.observe(&[agent, model], seconds);
    model_tokens(agent, model, prompt_tokens, completion_tokens);
}

/// A model request still out when its run's wall time ended: the run's limit, not the
/// model's failure (`outcome="timeout"`), its time counted as far as it went.
pub fn model_request_timed_out(agent: &str, model: &str, seconds: f64) {
    MODEL_REQUESTS.inc(&[agent, model, "timeout"]);
    MODEL_SECONDS_FAMILY.observe(&[agent, model], seconds);
}

fn model_tokens(agent: &str, model: &str, prompt_tokens: u64, completion_tokens: u64) {
    if prompt_tokens > 0 {
        MODEL_TOKENS.inc_by(&[agent, model, "prompt"], prompt_tokens);
    }
    if completion_tokens > 0 {
        MODEL_TOKENS.inc_by(&[agent, model, "completion"], completion_tokens);
    }
}

/// An HTTP request refused by a per-principal limit: `rate`, `concurrency`, `downloads`
/// or `unavailable`.
pub fn rate_limited(reason: &'static str) {
    RATE_LIMITED.inc(&[reason]);
}

/// An HTTP request refused for want of a valid credential: `missing`, `invalid` or
/// `signed_link`.
pub fn auth_failed(reason: &'static str) {
    AUTH_FAILURES.inc(&[reason]);
}

/// A SQL query stopped by a limit: `time`, `memory` or `rows`.
pub fn sql_stopped(limit: &'static str) {
    SQL_STOPPED.inc(&[limit]);
}

/// The warm pool as it is now (a collector calls this at scrape time): sandboxes ready,
/// jobs running.
pub fn sandbox_pool(warm: usize, busy: usize) {
    SANDBOX_WARM.set(&[], warm as f64);
    SANDBOX_BUSY.set(&[], busy as f64);
}

/// A `run_python` job found no warm sandbox and started one of its own.
pub fn sandbox_cold_start() {
    SANDBOX_COLD_STARTS.inc(&[]);
}

/// A `run_python` job stopped: `timeout`, `memory`, `output_flood`, `out_limit` or
/// `cancelled`.
pub fn sandbox_killed(reason: &'static str) {
    SANDBOX_KILLS.inc(&[reason]);
}

/// The store's size now (a collector calls this at scrape time).
pub fn store_size(tables: u64, bytes: u64) {
    STORE_TABLES.set(&[], tables as f64);
    STORE_BYTES.set(&[], bytes as f64);
}

/// A lookup in the local cache `cache`.
pub fn cache_lookup(cache: &'static str, hit: bool) {
    CACHE_LOOKUPS.inc(&[cache, if hit { "hit" } else { "miss" }]);
}

/// A failed request to the shared store, by kind.
pub fn shared_store_error(kind: &'static str) {
    SHARED_ERRORS.inc(&[kind]);
}

/// A budget passed 80% of its cap (`warned`) or stopped a run (`stopped`). `budget` is its
/// key in the config.
pub fn budget_event(budget: &str, event: &'static str) {
    BUDGET_EVENTS.inc(&[budget, event]);
}

/// The usage ledger could not be read or written (budgets fail open meanwhile).
pub fn budget_ledger_error() {
    BUDGET_LEDGER_ERRORS.inc(&[]);
}

/// Makes the series whose label values the code fixes, at 0, so that an alert on their
/// rate has a series from the first scrape on (a counter that appears only at its first
/// event hides that event from `rate()`). `sandbox`: this server runs `run_python`.
pub fn zero_known(sandbox: bool) {
    for reason in ["rate", "concurrency", "downloads", "unavailable"] {
        RATE_LIMITED.inc_by(&[reason], 0);
    }
    for reason in ["missing", "invalid", "signed_link"] {
        AUTH_FAILURES.inc_by(&[reason], 0);
    }
    for limit in ["time", "memory", "rows"] {
        SQL_STOPPED.inc_by(&[limit], 0);
    }
    BUDGET_LEDGER_ERRORS.inc_by(&[], 0);
    AUDIT_DROPPED.inc_by(&[], 0);
    if sandbox {
        SANDBOX_COLD_STARTS.inc_by(&[], 0);
        for reason in [
            "timeout",
            "memory",
            "output_flood",
            "out_limit",
            "cancelled",
        ] {
            SANDBOX_KILLS.inc_by(&[reason], 0);
        }
    }
}

// ---- Scrape-time collectors and the text. ----

type Collector = Box<dyn Fn() + Send + Sync>;

static COLLECTORS: Mutex<BTreeMap<&'static str, Collector>> = Mutex::new(BTreeMap::new());

/// Registers (or replaces) the collector `name`: run by every [`render`] before the text
/// is written, it sets the gauges of what it owns (e.g. [`store_size`]). It may block
/// briefly (a query on the index): call [`render`] off the async workers.
pub fn set_collector(name: &'static str, collect: impl Fn() + Send + Sync + 'static) {
    COLLECTORS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(name, Box::new(collect));
}

/// Every metric in the Prometheus text format 0.0.4 (serve it as [`CONTENT_TYPE`]), the
/// collectors run first.
pub fn render() -> String {
    {
        let collectors = COLLECTORS.lock().unwrap_or_else(PoisonError::into_inner);
        for collect in collectors.values() {
            collect();
        }
    }
    BUILD_INFO.set(&[env!("CARGO_PKG_VERSION")], 1.0);
    AUDIT_DROPPED.set_count(&[], crate::audit::dropped());
    if crate::trace::enabled() {
        let spans = crate::trace::stats();
        TRACE_SPANS.set_count(&["exported"], spans.exported);
        TRACE_SPANS.set_count(&["dropped"], spans.dropped);
        TRACE_SPANS.set_count(&["failed"], spans.failed);
    }
    let mut out = String::new();
    for family in ALL {
        family.render(&mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(f: &Family) -> String {
        let mut out = String::new();
        f.render(&mut out);
        out
    }

    #[test]
    fn label_values_are_escaped() {
        static F: Family = Family::new("t_total", "a \\ help\nline", Kind::Counter, &["v"]);
        F.inc(&["a\"b\\c\nd"]);
        assert_eq!(
            text(&F),
            "# HELP t_total a \\\\ help\\nline\n# TYPE t_total counter\nt_total{v=\"a\\\"b\\\\c\\nd\"} 1\n"
        );
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_end_in_inf() {
        static F: Family =
            Family::new("h_seconds", "h", Kind::Histogram(&[0.1, 1.0, 10.0]), &["r"]);
        for v in [0.05, 0.1, 0.5, 5.0, 50.0] {
            F.observe(&["x"], v);
        }
        let t = text(&F);
        let expected = "# HELP h_seconds h\n# TYPE h_seconds histogram\n\
            h_seconds_bucket{r=\"x\",le=\"0.1\"} 2\n\
            h_seconds_bucket{r=\"x\",le=\"1\"} 3\n\
            h_seconds_bucket{r=\"x\",le=\"10\"} 4\n\
            h_seconds_bucket{r=\"x\",le=\"+Inf\"} 5\n\
            h_seconds_sum{r=\"x\"} 55.65\n\
            h_seconds_count{r=\"x\"} 5\n";
        assert_eq!(t, expected);
    }

    #[test]
    fn gauges_counters_and_numbers() {
        static G: Family = Family::new("g", "g", Kind::Gauge, &[]);
        G.set(&[], 2.5);
        assert_eq!(text(&G), "# HELP g g\n# TYPE g gauge\ng 2.5\n");
        G.set(&[], f64::INFINITY);
        assert!(text(&G).ends_with("g +Inf\n"));
        G.set(&[], f64::NAN);
        assert!(text(&G).ends_with("g NaN\n"));
        static E: Family = Family::new("e_total", "e", Kind::Counter, &["a"]);
        assert_eq!(text(&E), "", "a family without series is left out");
    }

    #[test]
    fn label_sets_are_bounded() {
        static F: Family = Family::new("b_total", "b", Kind::Counter, &["v"]);
        for i in 0..MAX_SERIES + 10 {
            F.inc(&[&format!("v{i}")]);
        }
        let t = text(&F);
        assert_eq!(
            t.lines().count(),
            2 + MAX_SERIES + 1,
            "the rest under `other`"
        );
        assert!(
            t.contains("b_total{v=\"other\"} 10\n"),
            "{}",
            &t[t.len() - 200..]
        );
        let long = "x".repeat(1000);
        static L: Family = Family::new("l_total", "l", Kind::Counter, &["v"]);
        L.inc(&[&long]);
        assert!(text(&L).contains(&format!("\"{}\"", "x".repeat(MAX_LABEL_CHARS))));
    }

    #[test]
    fn status_codes_render_as_three_digits() {
        let mut b = [0u8; 3];
        assert_eq!(status_text(200, &mut b), "200");
        assert_eq!(status_text(429, &mut b), "429");
        assert_eq!(status_text(42, &mut b), OTHER);
    }

    #[test]
    fn render_runs_collectors_and_names_every_unit() {
        set_collector("test", || store_size(3, 4096));
        http_request("/mcp", 401, 0.001);
        let t = render();
        assert!(t.contains("dataref_store_tables 3\n"), "{t}");
        assert!(t.contains("dataref_store_bytes 4096\n"), "{t}");
        assert!(t.contains("dataref_http_requests_total{route=\"/mcp\",status=\"401\"} 1\n"));
        assert!(t.contains("# TYPE dataref_http_request_duration_seconds histogram\n"));
        assert!(t.contains("dataref_build_info{version="));
        for f in ALL {
            assert!(f.name.starts_with("dataref_"), "{}", f.name);
            if matches!(f.kind, Kind::Counter) {
                assert!(f.name.ends_with("_total"), "{}", f.name);
            }
        }
    }
}
