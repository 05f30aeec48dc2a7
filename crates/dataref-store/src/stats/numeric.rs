//! Mean, sample standard deviation and quartiles, computed as pandas does.
//!
//! - `std` is the sample standard deviation (ddof = 1); with a single value it is 0
//!   rather than pandas' NaN, because the answer must be finite JSON.
//! - Quartiles interpolate linearly between the closest ranks (pandas' and numpy's
//!   default `linear` method). They come from `select_nth_unstable`, not a full sort.
//! - Every output is finite: callers leave NaN and ±inf out, and sums that overflow
//!   are recomputed on scaled values.

use std::cmp::Ordering;

use dataref_protocol::NumericStats;

/// Summarises `values` (all finite), reordering them. `None` when there are none.
pub(super) fn summarize(values: &mut [f64]) -> Option<NumericStats> {
    if values.is_empty() {
        return None;
    }
    let (mean, std) = mean_std(values);
    let [p25, p50, p75] = quartiles(values);
    Some(NumericStats {
        mean: finite(mean),
        std: finite(std),
        p25: finite(p25),
        p50: finite(p50),
        p75: finite(p75),
    })
}

/// Every field through [`readable`]: what the model reads.
pub(super) fn for_the_model(s: NumericStats) -> NumericStats {
    NumericStats {
        mean: readable(s.mean),
        std: readable(s.std),
        p25: readable(s.p25),
        p50: readable(s.p50),
        p75: readable(s.p75),
    }
}

/// Rounds to 6 significant digits, but never drops digits left of the decimal point or the
/// first two after it: the model reads these, and 17 digits of float noise cost tokens and
/// invite false precision in the answer.
pub(super) fn readable(v: f64) -> f64 {
    if v == 0.0 || !v.is_finite() {
        return v;
    }
    let int_digits = v.abs().log10().floor() as i32 + 1;
    let decimals = (6 - int_digits).clamp(2, 15);
    let scale = 10f64.powi(decimals);
    let r = (v * scale).round() / scale;
    if r.is_finite() { r } else { v }
}

/// Values are summed in blocks of this many, then the block sums are added: rounding
/// error grows with the block length plus the number of blocks instead of with the
/// number of values (numpy sums pairwise for the same reason).
const BLOCK: usize = 256;

fn blocked_sum(values: &[f64], f: impl Fn(f64) -> f64) -> f64 {
    values
        .chunks(BLOCK)
        .map(|block| block.iter().map(|&x| f(x)).sum::<f64>())
        .sum()
}

/// Corrected two-pass algorithm: the second pass both measures the spread and removes
/// the rounding error of the first-pass mean.
fn mean_std(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    let sum = blocked_sum(values, |x| x);
    let rough = if sum.is_finite() {
        sum / n
    } else {
        blocked_sum(values, |x| x / n)
    };
    let dev = blocked_sum(values, |x| x - rough);
    let sq = blocked_sum(values, |x| (x - rough) * (x - rough));
    if !sq.is_finite() {
        return (rough, scaled_std(values, rough));
    }
    let mean = rough + dev / n;
    if values.len() < 2 {
        return (mean, 0.0);
    }
    let var = (sq - dev * dev / n) / (n - 1.0);
    (mean, var.max(0.0).sqrt())
}

/// For values near `f64::MAX`, where squares overflow.
fn scaled_std(values: &[f64], mean: f64) -> f64 {
    if values.len() < 2 {
        return 0.0;
    }
    let scale = values.iter().fold(0.0_f64, |m, x| m.max(x.abs()));
    let m = mean / scale;
    let sq: f64 = values.iter().map(|x| (x / scale - m).powi(2)).sum();
    scale * (sq / (values.len() as f64 - 1.0)).sqrt()
}

fn by_value(a: &f64, b: &f64) -> Ordering {
    a.total_cmp(b)
}

/// p25, p50, p75 with linear interpolation at position (n-1)·q.
///
/// Three selections place the order statistics at the lower ranks: the median over all
/// values, then p75 right of it and p25 left of it (each half the size). The value one
/// rank up is then the minimum of the short stretch up to the next placed rank.
fn quartiles(values: &mut [f64]) -> [f64; 3] {
    let n = values.len();
    if n == 0 {
        return [0.0; 3];
    }
    let rank = |q: f64| {
        let h = (n - 1) as f64 * q;
        let lo = h.floor() as usize;
        (lo, h - lo as f64)
    };
    let [(lo25, t25), (lo50, t50), (lo75, t75)] = [rank(0.25), rank(0.5), rank(0.75)];
    values.select_nth_unstable_by(lo50, by_value);
    if lo75 > lo50 {
        values[lo50 + 1..].select_nth_unstable_by(lo75 - lo50 - 1, by_value);
    }
    if lo25 < lo50 {
        values[..lo50].select_nth_unstable_by(lo25, by_value);
    }
    // Invariant now: values[lo] is the lo-th smallest for each placed rank, and every
    // value between two placed ranks lies between their values.
    let value_at = |lo: usize, t: f64, next_placed: Option<usize>| {
        let a = values[lo];
        if t == 0.0 || lo + 1 >= n {
            return a;
        }
        let end = next_placed.filter(|&p| p > lo).map_or(n, |p| p + 1);
        let b = values[lo + 1..end]
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min);
        lerp(a, b, t)
    };
    [
        value_at(lo25, t25, Some(lo50)),
        value_at(lo50, t50, Some(lo75)),
        value_at(lo75, t75, None),
    ]
}

/// numpy's `_lerp`: exact at both ends and monotonic.
fn lerp(a: f64, b: f64, t: f64) -> f64 {
    let diff = b - a;
    if !diff.is_finite() {
        return a * (1.0 - t) + b * t;
    }
    if t >= 0.5 {
        b - diff * (1.0 - t)
    } else {
        a + diff * t
    }
}

/// Only reached when a result overflows: the closest finite value.
fn finite(x: f64) -> f64 {
    if x.is_nan() {
        0.0
    } else {
        x.clamp(f64::MIN, f64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn matches_pandas_describe() {
        // pd.Series([1, 2, 3, 4, 10]).describe()
        let s = summarize(&mut [10.0, 3.0, 1.0, 4.0, 2.0]).unwrap();
        assert!(close(s.mean, 4.0));
        assert!(close(s.std, 3.535_533_905_932_737_6), "{}", s.std);
        assert_eq!((s.p25, s.p50, s.p75), (2.0, 3.0, 4.0));

        // pd.Series([1, 2, 3, 4]).describe(): interpolated quartiles
        let s = summarize(&mut [4.0, 1.0, 3.0, 2.0]).unwrap();
        assert!(close(s.mean, 2.5));
        assert!(close(s.std, 1.290_994_448_735_805_6));
        assert_eq!((s.p25, s.p50, s.p75), (1.75, 2.5, 3.25));

        // pd.Series([0.5, -3.25, 7, 7, 2.125, 100, -1]).describe()
        let s = summarize(&mut [0.5, -3.25, 7.0, 7.0, 2.125, 100.0, -1.0]).unwrap();
        assert!(close(s.mean, 16.053_571_428_571_43));
        assert!(close(s.std, 37.216_277_880_595_67), "{}", s.std);
        assert_eq!((s.p25, s.p50, s.p75), (-0.25, 2.125, 7.0));
    }

    #[test]
    fn single_value_and_empty() {
        let s = summarize(&mut [42.0]).unwrap();
        assert_eq!(
            (s.mean, s.std, s.p25, s.p50, s.p75),
            (42.0, 0.0, 42.0, 42.0, 42.0)
        );
        assert_eq!(summarize(&mut []), None);
    }

    #[test]
    fn quartiles_match_a_full_sort() {
        let mut x: u64 = 1;
        for n in 1..200 {
            let mut v: Vec<f64> = (0..n)
                .map(|_| {
                    x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                    ((x >> 40) % 50) as f64
                })
                .collect();
            let mut sorted = v.clone();
            sorted.sort_by(f64::total_cmp);
            let expect = |q: f64| {
                let h = (n - 1) as f64 * q;
                let lo = h.floor() as usize;
                let hi = (lo + 1).min(n - 1);
                lerp(sorted[lo], sorted[hi], h - lo as f64)
            };
            let got = quartiles(&mut v);
            assert_eq!(got, [expect(0.25), expect(0.5), expect(0.75)], "n={n}");
        }
    }

    #[test]
    fn huge_values_stay_finite() {
        let s = summarize(&mut [f64::MAX, -f64::MAX, f64::MAX, 1.0]).unwrap();
        for x in [s.mean, s.std, s.p25, s.p50, s.p75] {
            assert!(x.is_finite(), "{s:?}");
        }
        let s = summarize(&mut [f64::MAX, f64::MAX]).unwrap();
        assert_eq!(s.mean, f64::MAX);
        assert_eq!(s.std, 0.0);
    }
}

#[cfg(test)]
mod readable_tests {
    use super::readable;

    #[test]
    fn keeps_what_matters() {
        assert_eq!(readable(13.732856253889237), 13.7329);
        assert_eq!(readable(0.07475559126824696), 0.0747556);
        assert_eq!(readable(1_499_991.5), 1_499_991.5);
        assert_eq!(readable(-2.0), -2.0);
        assert_eq!(readable(1e300), 1e300);
    }
}
