//! Dates and timestamps written as text, the way SQLite stores them.
//!
//! These parsers run once per cell of every date and timestamp column, so they work on
//! bytes and allocate nothing. They accept only proleptic Gregorian dates with a four-digit
//! year and check the calendar (no 2025-02-30).

use dataref_protocol::days_from_civil;

const MICROS_PER_SECOND: i64 = 1_000_000;
const MICROS_PER_DAY: i64 = 86_400 * MICROS_PER_SECOND;

/// A timestamp read from text, with how much of it was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ParsedTimestamp {
    /// Microseconds since 1970-01-01 00:00:00.
    pub micros: i64,
    /// False for a bare date (`2025-03-01`) and for `HH:MM` without seconds.
    pub has_seconds: bool,
    /// Digits after the decimal point of the seconds (0 when there is none).
    pub frac_digits: u8,
}

fn digits(b: &[u8]) -> Option<u32> {
    let mut n = 0u32;
    for &c in b {
        if !c.is_ascii_digit() {
            return None;
        }
        n = n * 10 + u32::from(c - b'0');
    }
    Some(n)
}

fn is_leap(y: u32) -> bool {
    (y.is_multiple_of(4) && !y.is_multiple_of(100)) || y.is_multiple_of(400)
}

fn days_in_month(y: u32, m: u32) -> u32 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// `YYYY-MM-DD` as days since 1970-01-01, or `None` if it is not exactly that or not a day
/// of the calendar.
pub(crate) fn parse_date(b: &[u8]) -> Option<i32> {
    if b.len() != 10 {
        return None;
    }
    parse_date_prefix(b).and_then(|d| i32::try_from(d).ok())
}

fn parse_date_prefix(b: &[u8]) -> Option<i64> {
    if b.len() < 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let y = digits(&b[0..4])?;
    let m = digits(&b[5..7])?;
    let d = digits(&b[8..10])?;
    if !(1..=12).contains(&m) || d == 0 || d > days_in_month(y, m) {
        return None;
    }
    Some(days_from_civil(i64::from(y), m, d))
}

/// `YYYY-MM-DD`, optionally followed by ` ` or `T` and `HH:MM[:SS[.f…]]` (one to six
/// fraction digits) and an optional `Z`.
pub(crate) fn parse_timestamp(b: &[u8]) -> Option<ParsedTimestamp> {
    let days = parse_date_prefix(b)?;
    let mut ts = ParsedTimestamp {
        micros: days * MICROS_PER_DAY,
        has_seconds: false,
        frac_digits: 0,
    };
    let mut rest = &b[10..];
    if rest.is_empty() {
        return Some(ts);
    }
    if !matches!(rest[0], b'T' | b't' | b' ') {
        return None;
    }
    rest = &rest[1..];
    if rest.len() < 5 || rest[2] != b':' {
        return None;
    }
    let h = digits(&rest[0..2])?;
    let mi = digits(&rest[3..5])?;
    rest = &rest[5..];
    let mut s = 0;
    let mut frac = 0u32;
    if let [b':', tail @ ..] = rest {
        if tail.len() < 2 {
            return None;
        }
        s = digits(&tail[0..2])?;
        ts.has_seconds = true;
        rest = &tail[2..];
        if let [b'.', tail @ ..] = rest {
            let n = tail.iter().take_while(|c| c.is_ascii_digit()).count();
            if n == 0 || n > 6 {
                return None;
            }
            frac = digits(&tail[..n])? * 10u32.pow(6 - n as u32);
            ts.frac_digits = n as u8;
            rest = &tail[n..];
        }
    }
    match rest {
        [] => {}
        [b'Z' | b'z'] => {}
        _ => return None,
    }
    if h > 23 || mi > 59 || s > 59 {
        return None;
    }
    ts.micros += (i64::from(h) * 3600 + i64::from(mi) * 60 + i64::from(s)) * MICROS_PER_SECOND
        + i64::from(frac);
    Some(ts)
}

/// `YYYY-MM-DD HH:MM:SS[.ffffff]`: the form SQLite's own `datetime()` writes (plus a
/// fixed-width fraction), so text comparisons in SQL line up.
pub(crate) fn format_timestamp(micros: i64, with_fraction: bool) -> String {
    let secs = micros.div_euclid(MICROS_PER_SECOND);
    let frac = micros.rem_euclid(MICROS_PER_SECOND);
    let (y, m, d) = dataref_protocol::civil_from_days(secs.div_euclid(86_400));
    let sod = secs.rem_euclid(86_400);
    let (h, mi, s) = (sod / 3600, sod % 3600 / 60, sod % 60);
    if with_fraction {
        format!("{y:04}-{m:02}-{d:02} {h:02}:{mi:02}:{s:02}.{frac:06}")
    } else {
        format!("{y:04}-{m:02}-{d:02} {h:02}:{mi:02}:{s:02}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_follow_the_calendar() {
        assert_eq!(parse_date(b"1970-01-01"), Some(0));
        assert_eq!(parse_date(b"2025-01-01"), Some(20_089));
        assert_eq!(parse_date(b"2024-02-29"), Some(19_782));
        for bad in [
            "2025-02-29",
            "2025-13-01",
            "2025-00-10",
            "2025-04-31",
            "2025-1-01",
            "2025-01-01 ",
            "20250101",
            "2025/01/01",
            "",
            "+025-01-01",
        ] {
            assert_eq!(parse_date(bad.as_bytes()), None, "{bad}");
        }
    }

    #[test]
    fn timestamps_accept_the_common_spellings() {
        let base = 20_089 * MICROS_PER_DAY;
        let at = |s: &str| parse_timestamp(s.as_bytes()).map(|t| t.micros - base);
        assert_eq!(at("2025-01-01"), Some(0));
        assert_eq!(at("2025-01-01 10:20"), Some(37_200 * MICROS_PER_SECOND));
        assert_eq!(at("2025-01-01 10:20:30"), Some(37_230 * MICROS_PER_SECOND));
        assert_eq!(at("2025-01-01T10:20:30Z"), Some(37_230 * MICROS_PER_SECOND));
        assert_eq!(
            at("2025-01-01T10:20:30.5"),
            Some(37_230 * MICROS_PER_SECOND + 500_000)
        );
        assert_eq!(
            at("2025-01-01 10:20:30.000001Z"),
            Some(37_230 * MICROS_PER_SECOND + 1)
        );
        for bad in [
            "2025-01-01 24:00:00",
            "2025-01-01 10:60",
            "2025-01-01 10:20:30.",
            "2025-01-01 10:20:30.1234567",
            "2025-01-01 10:20:30+02:00",
            "2025-01-01X10:20",
            "2025-01-01 10",
        ] {
            assert_eq!(parse_timestamp(bad.as_bytes()), None, "{bad}");
        }
    }

    #[test]
    fn formats_like_sqlite() {
        let t = 20_089 * MICROS_PER_DAY + 37_230 * MICROS_PER_SECOND;
        assert_eq!(format_timestamp(t, false), "2025-01-01 10:20:30");
        assert_eq!(format_timestamp(t + 5, true), "2025-01-01 10:20:30.000005");
        assert_eq!(format_timestamp(-1, true), "1969-12-31 23:59:59.999999");
    }
}
