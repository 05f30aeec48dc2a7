use std::time::Duration;

use crate::error::{ConfigError, invalid};
use crate::raw::{RawDuration, RawSize};

/// `"30s"`, `"10m"`, `"24h"`, `"7d"`, `"250ms"`, or a bare number of seconds.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    let secs = |k: u64| n.checked_mul(k).map(Duration::from_secs);
    match unit.trim() {
        "" | "s" => secs(1),
        "ms" => Some(Duration::from_millis(n)),
        "m" | "min" => secs(60),
        "h" => secs(3600),
        "d" => secs(86_400),
        _ => None,
    }
}

/// `"500MB"`, `"1GiB"`, `"64k"`, or a bare number of bytes.
pub fn parse_bytes(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    let k: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "kib" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mib" => 1 << 20,
        "g" | "gb" => 1_000_000_000,
        "gib" => 1 << 30,
        "t" | "tb" => 1_000_000_000_000,
        "tib" => 1 << 40,
        _ => return None,
    };
    n.checked_mul(k)
}

pub(crate) fn duration(
    what: &str,
    raw: &Option<RawDuration>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    match raw {
        None => Ok(default),
        Some(RawDuration::Seconds(n)) => Ok(Duration::from_secs(*n)),
        Some(RawDuration::Text(t)) => parse_duration(t).ok_or_else(|| {
            invalid(
                what,
                format!("`{t}` is not a duration"),
                "write e.g. `30s`, `10m`, `24h` or `7d`",
            )
        }),
    }
}

pub(crate) fn size(what: &str, raw: &Option<RawSize>, default: u64) -> Result<u64, ConfigError> {
    match raw {
        None => Ok(default),
        Some(RawSize::Bytes(n)) => Ok(*n),
        Some(RawSize::Text(t)) => parse_bytes(t).ok_or_else(|| {
            invalid(
                what,
                format!("`{t}` is not a size"),
                "write e.g. `500MB`, `1GiB` or a number of bytes",
            )
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Some(Duration::from_secs(30)));
        assert_eq!(parse_duration("24h"), Some(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("90"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("1 fortnight"), None);
        assert_eq!(parse_duration("h"), None);
    }

    #[test]
    fn bytes() {
        assert_eq!(parse_bytes("1GiB"), Some(1 << 30));
        assert_eq!(parse_bytes("500MB"), Some(500_000_000));
        assert_eq!(parse_bytes("64k"), Some(64_000));
        assert_eq!(parse_bytes("12"), Some(12));
        assert_eq!(parse_bytes("12 parsecs"), None);
    }
}
