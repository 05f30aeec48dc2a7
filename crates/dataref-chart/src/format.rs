//! Axis ticks and labels: numbers with thousands separators, dates as people write them.

use dataref_protocol::{civil_from_days, days_from_civil};

/// `1,234,567.5` with `decimals` digits after the point (trailing zeros kept, so a column
/// of labels lines up).
pub(crate) fn number(v: f64, decimals: usize) -> String {
    if !v.is_finite() {
        return v.to_string();
    }
    let s = format!("{:.*}", decimals, v.abs());
    let (int, frac) = match s.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (s.as_str(), None),
    };
    let mut out = String::with_capacity(s.len() + int.len() / 3 + 1);
    // `-0` after rounding is `0`.
    if v < 0.0 && s.bytes().any(|b| b.is_ascii_digit() && b != b'0') {
        out.push('-');
    }
    for (i, c) in int.chars().enumerate() {
        if i > 0 && (int.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if let Some(f) = frac {
        out.push('.');
        out.push_str(f);
    }
    out
}

/// A value as a label without a known step: integers plain, others with up to 2 decimals
/// (more for values below 1).
pub(crate) fn number_auto(v: f64) -> String {
    if v.fract() == 0.0 {
        return number(v, 0);
    }
    let decimals = if v.abs() < 1.0 { 4 } else { 2 };
    let s = number(v, decimals);
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// Digits after the point that tell ticks `step` apart.
pub(crate) fn decimals_for(step: f64) -> usize {
    if step <= 0.0 || !step.is_finite() || step >= 1.0 {
        return 0;
    }
    let d = -step.log10().floor();
    // A step of 0.25 needs 2 digits, not 1.
    let d = d as usize;
    if (step * 10f64.powi(d as i32)).fract().abs() > 1e-9 {
        d + 1
    } else {
        d
    }
}

/// Round ticks (1, 2, 2.5 or 5 × 10ⁿ apart) covering `lo..=hi`, about `target` of them;
/// and the step.
pub(crate) fn nice_ticks(lo: f64, hi: f64, target: usize) -> (Vec<f64>, f64) {
    let span = hi - lo;
    if span <= 0.0 || !span.is_finite() {
        return (vec![lo], 1.0);
    }
    let raw = span / target.max(2) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let first = (lo / step).ceil() as i64;
    let last = (hi / step).floor() as i64;
    let ticks = (first..=last).map(|i| i as f64 * step).collect();
    (ticks, step)
}

/// Days since the epoch (with a fraction for the time of day) as a label, precise enough
/// for ticks `step_days` apart.
pub(crate) fn date(days: f64, step_days: f64) -> String {
    let whole = days.floor();
    let (y, m, d) = civil_from_days(whole as i64);
    if step_days >= 365.0 {
        format!("{y:04}")
    } else if step_days >= 28.0 {
        format!("{y:04}-{m:02}")
    } else if step_days >= 1.0 {
        format!("{y:04}-{m:02}-{d:02}")
    } else {
        let secs = ((days - whole) * 86_400.0).round() as i64;
        let (h, min) = (secs / 3600, secs % 3600 / 60);
        format!("{m:02}-{d:02} {h:02}:{min:02}")
    }
}

/// A full date (and time when it has one), for category labels.
pub(crate) fn date_full(days: f64) -> String {
    let whole = days.floor();
    if days == whole {
        date(days, 1.0)
    } else {
        let secs = ((days - whole) * 86_400.0).round() as i64;
        let (h, m, s) = (secs / 3600, secs % 3600 / 60, secs % 60);
        format!("{} {h:02}:{m:02}:{s:02}", date(whole, 1.0))
    }
}

/// Ticks for a date axis over `lo..=hi` days: whole hours, days, weeks, months or years,
/// about `target` of them; and the step in days (for [`date`]).
pub(crate) fn date_ticks(lo: f64, hi: f64, target: usize) -> (Vec<f64>, f64) {
    let span = hi - lo;
    let target = target.max(2) as f64;
    if !span.is_finite() || span <= 0.0 {
        return (vec![lo], 1.0);
    }
    if span / target < 1.0 {
        // Hours.
        let hours = [1.0, 2.0, 3.0, 6.0, 12.0, 24.0];
        let step = hours
            .iter()
            .map(|h| h / 24.0)
            .find(|s| span / s <= target)
            .unwrap_or(1.0);
        let first = (lo / step).ceil() as i64;
        let last = (hi / step).floor() as i64;
        return ((first..=last).map(|i| i as f64 * step).collect(), step);
    }
    if span / target < 28.0 {
        // Days and weeks (weeks start on Monday; day 4 of the epoch was one).
        for step in [1.0, 2.0, 7.0, 14.0] {
            if span / step <= target {
                let offset = if step >= 7.0 { 4.0 } else { 0.0 };
                let first = ((lo - offset) / step).ceil() as i64;
                let last = ((hi - offset) / step).floor() as i64;
                let ticks = (first..=last).map(|i| i as f64 * step + offset).collect();
                return (ticks, step);
            }
        }
    }
    // Months: 1, 2, 3, 6 or years.
    let (y0, m0, _) = civil_from_days(lo.floor() as i64);
    let months_span = span / 30.44;
    let step_months = [1, 2, 3, 6, 12, 24, 60, 120, 240, 600]
        .into_iter()
        .find(|s| months_span / f64::from(*s) <= target)
        .unwrap_or(1200);
    // Start at a month that is a multiple of the step (January for years).
    let mut index = y0 * 12 + i64::from(m0) - 1;
    let step = i64::from(step_months);
    index = index.div_euclid(step) * step;
    let mut ticks = Vec::new();
    loop {
        let (y, m) = (index.div_euclid(12), index.rem_euclid(12) as u32 + 1);
        let day = days_from_civil(y, m, 1) as f64;
        if day > hi {
            break;
        }
        if day >= lo {
            ticks.push(day);
        }
        index += step;
    }
    let step_days = if step_months >= 12 { 365.0 } else { 30.0 };
    (ticks, step_days)
}

/// `text` cut to `max` characters with `…`.
pub(crate) fn short(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_owned()
    } else {
        let mut s: String = text.chars().take(max.saturating_sub(1)).collect();
        s.push('…');
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_have_thousands_separators() {
        assert_eq!(number(1_234_567.0, 0), "1,234,567");
        assert_eq!(number(-1_234.5, 2), "-1,234.50");
        assert_eq!(number(999.0, 0), "999");
        assert_eq!(number(-0.001, 1), "0.0");
        assert_eq!(number_auto(2500.25), "2,500.25");
        assert_eq!(number_auto(12.0), "12");
        assert_eq!(decimals_for(0.25), 2);
        assert_eq!(decimals_for(0.5), 1);
        assert_eq!(decimals_for(200.0), 0);
    }

    #[test]
    fn ticks_are_round() {
        let (t, step) = nice_ticks(0.0, 1000.0, 5);
        assert_eq!(step, 200.0);
        assert_eq!(t, vec![0.0, 200.0, 400.0, 600.0, 800.0, 1000.0]);
    }

    #[test]
    fn date_ticks_fall_on_months() {
        let lo = days_from_civil(2024, 1, 10) as f64;
        let hi = days_from_civil(2024, 12, 20) as f64;
        let (t, step) = date_ticks(lo, hi, 8);
        let labels: Vec<String> = t.iter().map(|d| date(*d, step)).collect();
        assert_eq!(
            labels,
            ["2024-03", "2024-05", "2024-07", "2024-09", "2024-11"]
        );
        let (t, step) = date_ticks(lo, lo + 6.0, 8);
        assert_eq!(date(t[0], step), "2024-01-10");
        assert_eq!(t.len(), 7);
    }
}
