//! The events the layers record, each made from what the caller gave and what the call
//! answered with, never from rows: arguments are kept (long strings cut, file bodies
//! replaced by their length and hash), of a result only its dataRefs, row count and path.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use super::{Event, record};

/// A string argument longer than this is kept up to here (on a character boundary), with
/// its length and BLAKE3.
pub const MAX_STRING_BYTES: usize = 4096;

/// Arguments whose value is a body (a file's, an upstream's upload, rows written): replaced
/// by its length and BLAKE3 (of the string, else of its canonical JSON) whatever its size.
const BODY_KEYS: [&str; 8] = [
    "rows", "values", "records", "content", "contents", "body", "data", "base64",
];

/// Arguments whose name looks like a secret's (case-insensitive; also as the end of a
/// longer name, `db_password`, and `credential…`): their value is never kept.
const SECRET_KEYS: [&str; 7] = [
    "password",
    "passwd",
    "secret",
    "token",
    "api_key",
    "apikey",
    "authorization",
];

/// What is kept of a secret's value.
pub const REDACTED: &str = "[redacted]";

/// The scrubbed arguments of one line, as JSON, at most this long; past it only their
/// length and BLAKE3 are kept.
pub const MAX_ARGS_BYTES: usize = 16 << 10;

/// A refused request's path is kept up to this many bytes (on a character boundary).
pub const MAX_PATH_BYTES: usize = 256;

/// Refused authentications from one address make at most one line in this long.
pub const AUTH_WINDOW: Duration = Duration::from_secs(60);

/// Addresses remembered for collapsing refusals; past this the stale ones are let go.
const AUTH_ADDRESSES: usize = 4096;

/// How deep a result is searched for dataRefs.
const MAX_DEPTH: usize = 8;

/// A tool call's arguments as they arrived.
#[derive(Debug, Clone, Copy)]
pub enum Arguments<'a> {
    /// An MCP call's JSON object.
    Json(&'a Value),
    /// A model's tool call: JSON text (kept as a string when it is not JSON).
    Text(&'a str),
}

/// One finished tool call.
#[derive(Debug, Clone, Copy)]
pub struct ToolCallRecord<'a> {
    pub principal: &'a str,
    pub call_id: &'a str,
    /// The tool as called.
    pub tool: &'a str,
    /// The tool that ran: `call_tool`'s target, else `tool`.
    pub target: &'a str,
    pub arguments: Arguments<'a>,
    /// The arguments that ran, when `call_tool` expanded `arguments` (its `args_file` read,
    /// the overrides merged): kept as `args`, with the file's name as `args_file`.
    pub expanded: Option<&'a Value>,
    /// `ok`, `tool_failed`, … (`OutcomeKind::as_str`).
    pub outcome: &'a str,
    /// The structured result, when there is one: only its `dataRef`s, `rows` and `path`
    /// are read.
    pub result: Option<&'a Value>,
}

/// Records a tool call: `tool_call` with `tool`, `target` (when `call_tool` ran another),
/// `call_id`, `query` (a named query's name, for `fetch_NAME`), `args` (what ran),
/// `args_file` (`call_tool`'s argument file), `outcome`, `rows`,
/// `read` and `created` (dataRefs) and `path` (the file written, e.g. an export).
pub fn tool_call(r: ToolCallRecord<'_>) {
    if !super::installed() {
        return;
    }
    record(tool_call_event(r));
}

pub(crate) fn tool_call_event(r: ToolCallRecord<'_>) -> Event {
    let parsed;
    let args = match r.arguments {
        Arguments::Json(v) => v,
        Arguments::Text(t) => {
            parsed = serde_json::from_str::<Value>(t).unwrap_or_else(|_| Value::String(t.into()));
            &parsed
        }
    };
    let args_file = r
        .expanded
        .and_then(|_| args.get("args_file"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let args = r.expanded.unwrap_or(args);
    let mut read = Vec::new();
    refs_in_strings(args, &mut read, 0);
    let mut created = Vec::new();
    if let Some(result) = r.result {
        refs_under_key(result, &mut created, 0);
    }
    created.retain(|c| !read.contains(c));
    created.dedup();
    let result = r.result.and_then(Value::as_object);
    Event::new("tool_call", r.principal)
        .with("tool", r.tool)
        .with_opt("target", (r.target != r.tool).then_some(r.target))
        .with("call_id", r.call_id)
        .with_opt("query", r.target.strip_prefix("fetch_"))
        .with("args", scrub(args))
        .with_opt("args_file", args_file)
        .with("outcome", r.outcome)
        .with_opt(
            "rows",
            result.and_then(|o| o.get("rows")).and_then(Value::as_u64),
        )
        .with("read", read)
        .with("created", created)
        .with_opt(
            "path",
            result
                .and_then(|o| o.get("path"))
                .and_then(Value::as_str)
                .map(str::to_owned),
        )
}

/// Records that `tool` (call `call_id`, with `arguments`) waits for a person's approval.
pub fn approval_asked(principal: &str, call_id: &str, tool: &str, arguments: &Value) {
    if !super::installed() {
        return;
    }
    record(
        Event::new("approval_asked", principal)
            .with("call_id", call_id)
            .with("tool", tool)
            .with("args", scrub(arguments)),
    );
}

/// Records the answer to an approval: `Ok` approved, `Err` denied (with the reason given,
/// when one was).
pub fn approval_answered(
    principal: &str,
    call_id: &str,
    tool: &str,
    answer: Result<(), Option<&str>>,
) {
    let (decision, reason) = match answer {
        Ok(()) => ("approved", None),
        Err(reason) => ("denied", reason),
    };
    record(
        Event::new("approval_answered", principal)
            .with("call_id", call_id)
            .with("tool", tool)
            .with("decision", decision)
            .with_opt("reason", reason),
    );
}

/// Records a refused authentication: why (never the token), from where, for what (the path
/// cut to 256 bytes). Refusals from one address (an IPv6 one by its /64) make at most one
/// line per minute: its `count` is the refusals it stands for, itself and those not written
/// since that address's last line.
pub fn auth_failed(reason: &str, remote: Option<&str>, method: &str, path: &str) {
    if !super::installed() {
        return;
    }
    let now = Instant::now();
    let (count, stale) = {
        let mut c = AUTH.lock().unwrap_or_else(PoisonError::into_inner);
        let c = c.get_or_insert_with(AuthCollapse::default);
        (c.admit(address_key(remote), now), c.prune(now))
    };
    // Refusals of addresses let go are not lost: each gets its line with its count.
    for (key, n) in stale {
        record(
            Event::new("auth_failed", "")
                .with(
                    "reason",
                    "refusals not yet written when their address was let go",
                )
                .with("remote", key)
                .with("count", n),
        );
    }
    let Some(count) = count else {
        return;
    };
    record(auth_failed_event(reason, remote, method, path, count));
}

pub(crate) fn auth_failed_event(
    reason: &str,
    remote: Option<&str>,
    method: &str,
    path: &str,
    count: u64,
) -> Event {
    Event::new("auth_failed", "")
        .with("reason", reason)
        .with_opt("remote", remote)
        .with("method", method)
        .with("path", cut_str(path, MAX_PATH_BYTES))
        .with("count", count)
}

static AUTH: Mutex<Option<AuthCollapse>> = Mutex::new(None);

/// The key refusals are collapsed by: the address without its port, an IPv6 one by its /64
/// (one host has a whole /64); the text as given when it is no address.
fn address_key(remote: Option<&str>) -> String {
    let Some(r) = remote else {
        return String::new();
    };
    let ip = r
        .parse::<SocketAddr>()
        .map(|s| s.ip())
        .or_else(|_| r.parse::<IpAddr>());
    match ip {
        Ok(IpAddr::V4(v4)) => v4.to_string(),
        Ok(IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => {
                let s = v6.segments();
                format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
            }
        },
        Err(_) => cut_str(r, MAX_PATH_BYTES).to_owned(),
    }
}

/// Per address: when its last line was written, and the refusals since not written.
#[derive(Debug, Default)]
pub(crate) struct AuthCollapse {
    seen: HashMap<String, (Instant, u64)>,
}

impl AuthCollapse {
    /// One refusal from `key` at `now`: `Some(count)` when it makes a line (the first from
    /// that address in [`AUTH_WINDOW`]), `None` when it is counted into the next.
    pub(crate) fn admit(&mut self, key: String, now: Instant) -> Option<u64> {
        match self.seen.get_mut(&key) {
            Some((last, suppressed)) if now.saturating_duration_since(*last) < AUTH_WINDOW => {
                *suppressed += 1;
                None
            }
            Some((last, suppressed)) => {
                let count = *suppressed + 1;
                *last = now;
                *suppressed = 0;
                Some(count)
            }
            None => {
                self.seen.insert(key, (now, 0));
                Some(1)
            }
        }
    }

    /// Past [`AUTH_ADDRESSES`], lets go of the addresses whose window is over: those with
    /// refusals not yet written, with their count.
    pub(crate) fn prune(&mut self, now: Instant) -> Vec<(String, u64)> {
        if self.seen.len() <= AUTH_ADDRESSES {
            return Vec::new();
        }
        let mut stale = Vec::new();
        self.seen.retain(|k, (last, suppressed)| {
            let keep = now.saturating_duration_since(*last) < AUTH_WINDOW;
            if !keep && *suppressed > 0 {
                stale.push((k.clone(), *suppressed));
            }
            keep
        });
        stale
    }
}

/// Records a workspace file served over HTTP (`GET /files/…`): whose, which (relative to
/// their workspace), its size, and how the caller was let in: `signed_link` when the
/// request's `query` carries a signature, else `bearer`.
pub fn download(principal: &str, path: &str, query: Option<&str>, bytes: u64) {
    let signed = query.is_some_and(|q| q.split('&').any(|p| p.starts_with("sig=")));
    record(
        Event::new("download", principal)
            .with("path", path)
            .with("via", if signed { "signed_link" } else { "bearer" })
            .with("bytes", bytes),
    );
}

/// The arguments as kept: secrets redacted, bodies replaced by length and hash, long
/// strings cut; and when what is left is still over [`MAX_ARGS_BYTES`] of JSON, only its
/// length and hash.
pub(crate) fn scrub(v: &Value) -> Value {
    let kept = scrub_value(v, 0);
    let text = canonical(&kept).to_string();
    if text.len() <= MAX_ARGS_BYTES {
        return kept;
    }
    let mut o = digest_map(&text);
    o.insert("over".into(), Value::from(MAX_ARGS_BYTES));
    Value::Object(o)
}

fn scrub_value(v: &Value, depth: usize) -> Value {
    match v {
        Value::String(s) => cut(s),
        // Deeper than anything a tool's schema asks for: only its length and hash.
        Value::Array(_) | Value::Object(_) if depth > MAX_DEPTH => body(v),
        Value::Array(a) => Value::Array(a.iter().map(|x| scrub_value(x, depth + 1)).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| {
                    let lower = k.to_ascii_lowercase();
                    let kept = if is_secret(&lower) {
                        Value::String(REDACTED.into())
                    } else if BODY_KEYS.contains(&lower.as_str()) && !v.is_null() {
                        body(v)
                    } else {
                        scrub_value(v, depth + 1)
                    };
                    (k.clone(), kept)
                })
                .collect(),
        ),
        Value::Null | Value::Bool(_) | Value::Number(_) => v.clone(),
    }
}

/// A key (lowercased) that names a secret.
fn is_secret(key: &str) -> bool {
    key.starts_with("credential")
        || SECRET_KEYS.iter().any(|s| {
            key == *s
                || key
                    .strip_suffix(s)
                    .is_some_and(|head| head.ends_with('_') || head.ends_with('-'))
        })
}

/// A body: a string's length and hash, or its canonical JSON's.
fn body(v: &Value) -> Value {
    match v {
        Value::String(s) => digest(s, None),
        _ => Value::Object(digest_map(&canonical(v).to_string())),
    }
}

/// `v` with every object's keys sorted: the same arguments give the same text and hash
/// whatever order they came in.
fn canonical(v: &Value) -> Value {
    match v {
        Value::Array(a) => Value::Array(a.iter().map(canonical).collect()),
        Value::Object(o) => {
            let mut keys: Vec<&String> = o.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .filter_map(|k| o.get(k).map(|x| (k.clone(), canonical(x))))
                    .collect(),
            )
        }
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => v.clone(),
    }
}

/// `s` up to `max` bytes, on a character boundary.
fn cut_str(s: &str, max: usize) -> &str {
    let mut end = max.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.get(..end).unwrap_or_default()
}

fn cut(s: &str) -> Value {
    if s.len() <= MAX_STRING_BYTES {
        return Value::String(s.to_owned());
    }
    digest(s, Some(cut_str(s, MAX_STRING_BYTES)))
}

/// `{"bytes": N, "blake3": "…"}`, with the kept head as `"head"` when there is one.
fn digest(s: &str, head: Option<&str>) -> Value {
    let mut o = Map::new();
    if let Some(h) = head {
        o.insert("head".into(), Value::String(h.to_owned()));
    }
    o.extend(digest_map(s));
    Value::Object(o)
}

/// `{"bytes": N, "blake3": "…"}` of `s`.
fn digest_map(s: &str) -> Map<String, Value> {
    let mut o = Map::new();
    o.insert("bytes".into(), Value::from(s.len()));
    o.insert(
        "blake3".into(),
        Value::String(blake3::hash(s.as_bytes()).to_hex().to_string()),
    );
    o
}

/// Every dataRef named inside a string of `v` (a `data_…` word of its own, also inside
/// SQL text).
fn refs_in_strings(v: &Value, out: &mut Vec<String>, depth: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    match v {
        Value::String(s) => {
            for word in s.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-')) {
                if dataref_protocol::DataRef::parse(word).is_ok() && !out.iter().any(|r| r == word)
                {
                    out.push(word.to_owned());
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| refs_in_strings(x, out, depth + 1)),
        Value::Object(o) => o.values().for_each(|x| refs_in_strings(x, out, depth + 1)),
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// Every `dataRef` value in a result (never anything else of it).
fn refs_under_key(v: &Value, out: &mut Vec<String>, depth: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    match v {
        Value::Array(a) => a.iter().for_each(|x| refs_under_key(x, out, depth + 1)),
        Value::Object(o) => {
            for (k, x) in o {
                match x {
                    Value::String(s)
                        if k == "dataRef"
                            && dataref_protocol::DataRef::parse(s).is_ok()
                            && !out.contains(s) =>
                    {
                        out.push(s.clone());
                    }
                    _ => refs_under_key(x, out, depth + 1),
                }
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => {}
    }
}
