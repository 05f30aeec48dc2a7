//! One line of the trail: written in a fixed field order, hashed, and read back.

use std::fmt::Write as _;

use serde::Serialize;
use serde_json::Value;

use super::Event;

/// `prev` of the first line ever written.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// What ends every line after its body: `,"hash":"` + 64 hex digits + `"}`.
const HASH_KEY: &str = ",\"hash\":\"";
const HASH_HEX: usize = 64;

/// `2026-12-07T11:05:37.123Z` for milliseconds since the Unix epoch (UTC).
pub fn rfc3339_millis(unix_ms: i64) -> String {
    // The protocol's second-precision form, its `Z` after the milliseconds.
    let whole = dataref_protocol::Timestamp(unix_ms.div_euclid(1000)).to_string();
    let seconds = whole.strip_suffix('Z').unwrap_or(&whole);
    format!("{seconds}.{:03}Z", unix_ms.rem_euclid(1000))
}

/// Milliseconds since the Unix epoch, now (0 when the clock is before it).
pub(crate) fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn json(v: &impl Serialize) -> String {
    // A string or a `Value` always serialises; `null` is never reached in practice.
    serde_json::to_string(v).unwrap_or_else(|_| "null".to_owned())
}

/// The event's fields after `event`, as `,"k":v,…` (empty when none): serialised once,
/// outside the log's lock.
pub(crate) fn fields_fragment(event: &Event) -> String {
    let mut out = String::new();
    for (k, v) in &event.fields {
        out.push(',');
        out.push_str(&json(k));
        out.push(':');
        out.push_str(&json(v));
    }
    out
}

/// The whole line (newline included) and its hash.
pub(crate) fn build(
    seq: u64,
    at: &str,
    event: &Event,
    fields: &str,
    prev: &str,
) -> (String, String) {
    let mut body = String::with_capacity(160 + fields.len());
    let _ = write!(body, "{{\"seq\":{seq},\"at\":{}", json(&at));
    let _ = write!(body, ",\"principal\":{}", json(&event.principal));
    let _ = write!(body, ",\"event\":{}", json(&event.kind));
    body.push_str(fields);
    let _ = write!(body, ",\"prev\":{}}}", json(&prev));
    let hash = hash(prev, body.as_bytes());
    // The body's closing brace gives way to the hash field.
    body.pop();
    let _ = writeln!(body, "{HASH_KEY}{hash}\"}}");
    (body, hash)
}

/// BLAKE3 of `prev`'s text and the line's bytes without its hash, in hex.
pub(crate) fn hash(prev: &str, body: &[u8]) -> String {
    let mut h = blake3::Hasher::new();
    h.update(prev.as_bytes());
    h.update(body);
    h.finalize().to_hex().to_string()
}

/// A line read back: what the chain needs of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Parsed {
    pub seq: u64,
    pub prev: String,
    /// The hash the line claims.
    pub hash: String,
    /// The hash its bytes give.
    pub computed: String,
    /// A `trail_truncated` line's missing seqs (first and last).
    pub missing: Option<(u64, u64)>,
}

/// Reads one line (without its newline). `Err` says why it is not a line of the trail.
pub(crate) fn parse(line: &[u8]) -> Result<Parsed, String> {
    let tail = HASH_KEY.len() + HASH_HEX + 2;
    let Some(cut) = line.len().checked_sub(tail) else {
        return Err("too short to be a line of the trail".into());
    };
    let (head, end) = line.split_at(cut);
    let claimed = end
        .strip_prefix(HASH_KEY.as_bytes())
        .and_then(|e| e.strip_suffix(b"\"}"))
        .filter(|h| h.iter().all(|b| b.is_ascii_hexdigit()))
        .ok_or("it does not end with its `hash` field")?;
    let mut body = Vec::with_capacity(head.len() + 1);
    body.extend_from_slice(head);
    body.push(b'}');
    let v: Value = serde_json::from_slice(&body).map_err(|e| format!("not JSON: {e}"))?;
    let seq = v
        .get("seq")
        .and_then(Value::as_u64)
        .ok_or("it has no `seq`")?;
    let prev = v
        .get("prev")
        .and_then(Value::as_str)
        .ok_or("it has no `prev`")?
        .to_owned();
    let computed = hash(&prev, &body);
    let missing = (v.get("event").and_then(Value::as_str) == Some("trail_truncated")).then(|| {
        let n = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or_default();
        (n("missing_from"), n("missing_to"))
    });
    Ok(Parsed {
        seq,
        prev,
        missing,
        hash: String::from_utf8_lossy(claimed).into_owned(),
        computed,
    })
}
