//! Mean, sample standard deviation and quartiles, computed as pandas does.
//!
//! - `std` is the sample standard deviation (ddof = 1); with a single value it is 0
//!   rather than pandas' NaN, because the answer must be finite JSON.
//! - Quartiles interpolate linearly between the closest ranks (pandas' and numpy's
//!   default `linear` method). They come from the counts of the distinct values when
//!   there are few (sorting those), else from radix selection over the column.
//! - The values are read from the column again for each pass, never copied out: a
//!   10M-row column would otherwise cost 80 MB of fresh memory (and its page faults).
//! - Every output is finite: callers leave NaN and ±inf out, and sums that overflow
//!   are recomputed on scaled values.

use dataref_protocol::NumericStats;

/// A value as a `u64` whose unsigned order is `f64::total_cmp`'s: selections compare
/// plain integers, and radix selection reads the key's bits.
pub(super) fn sort_key(x: f64) -> u64 {
    let bits = x.to_bits();
    // Negative: flip every bit (larger magnitude, smaller key). Otherwise: set the sign.
    bits ^ (((bits as i64 >> 63) as u64) | (1 << 63))
}

/// The value of a [`sort_key`].
pub(super) fn from_sort_key(key: u64) -> f64 {
    // Sign bit set: was non-negative, clear it. Clear: was negative, flip every bit.
    f64::from_bits(key ^ ((key >> 63).wrapping_sub(1) | (1 << 63)))
}

/// A column's values (all finite), as [`sort_key`]s, read once per pass and never copied
/// whole: a 10M-row column would otherwise cost 80 MB of fresh memory.
pub(super) trait KeySource {
    /// Calls `f` with the key of every value, in the same order each time.
    fn each_key(&self, f: impl FnMut(u64));
}

impl KeySource for [u64] {
    fn each_key(&self, mut f: impl FnMut(u64)) {
        self.iter().for_each(|&k| f(k));
    }
}

/// What the first pass over a column gathers for [`summarize_column`]: the count, the blocked
/// sum, and the bits every key has (`all`) and some key has (`any`).
#[derive(Debug, Clone)]
pub(super) struct FirstPass {
    n: usize,
    sum: Blocked,
    all: u64,
    any: u64,
}

impl FirstPass {
    pub(super) fn new() -> Self {
        Self {
            n: 0,
            sum: Blocked::new(),
            all: u64::MAX,
            any: 0,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.n
    }

    pub(super) fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Adds the next value (finite).
    #[inline]
    pub(super) fn push(&mut self, x: f64) {
        let k = sort_key(x);
        self.n += 1;
        self.sum.add(x);
        self.all &= k;
        self.any |= k;
    }
}

/// Summarises `values` (all finite), reordering them. `None` when there are none.
#[cfg(test)]
pub(super) fn summarize(values: &mut [f64]) -> Option<NumericStats> {
    let mut first = FirstPass::new();
    values.iter().for_each(|&x| first.push(x));
    let keys: Vec<u64> = values.iter().map(|&x| sort_key(x)).collect();
    summarize_column(&first, keys.as_slice(), None)
}

/// Summarises the values of `source`, whose first pass was `first`. `None` when there are
/// none. One more pass for mean and std (two when the sum overflowed). The quartiles come
/// from `counted` when given (each distinct value's [`sort_key`] and count, for columns
/// of few values), else from two or so more passes.
pub(super) fn summarize_column<S: KeySource + ?Sized>(
    first: &FirstPass,
    source: &S,
    counted: Option<Vec<(u64, u64)>>,
) -> Option<NumericStats> {
    if first.n == 0 {
        return None;
    }
    let (mean, std) = mean_std(first, source);
    let [p25, p50, p75] = match counted {
        Some(counted) => quartiles_counted(counted, first.n),
        None => quartiles_of(source, first.n, first.all, first.any),
    };
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

/// A blocked sum fed one value at a time: the same additions in the same order as
/// summing each block of [`BLOCK`] values and then the block sums (from -0.0, as
/// `Iterator::sum` does).
#[derive(Debug, Clone)]
struct Blocked {
    total: f64,
    block: f64,
    in_block: usize,
}

impl Blocked {
    fn new() -> Self {
        Self {
            total: -0.0,
            block: -0.0,
            in_block: 0,
        }
    }

    #[inline]
    fn add(&mut self, x: f64) {
        self.block += x;
        self.in_block += 1;
        if self.in_block == BLOCK {
            self.total += self.block;
            self.block = -0.0;
            self.in_block = 0;
        }
    }

    fn finish(&self) -> f64 {
        if self.in_block > 0 {
            self.total + self.block
        } else {
            self.total
        }
    }
}

/// Corrected two-pass algorithm: the second pass both measures the spread and removes
/// the rounding error of the first-pass mean.
fn mean_std<S: KeySource + ?Sized>(first: &FirstPass, source: &S) -> (f64, f64) {
    let n = first.n as f64;
    let sum = first.sum.finish();
    let rough = if sum.is_finite() {
        sum / n
    } else {
        let mut scaled = Blocked::new();
        source.each_key(|k| scaled.add(from_sort_key(k) / n));
        scaled.finish()
    };
    let (mut dev, mut sq) = (Blocked::new(), Blocked::new());
    source.each_key(|k| {
        let d = from_sort_key(k) - rough;
        dev.add(d);
        sq.add(d * d);
    });
    let (dev, sq) = (dev.finish(), sq.finish());
    if !sq.is_finite() {
        return (rough, scaled_std(source, first.n, rough));
    }
    let mean = rough + dev / n;
    if first.n < 2 {
        return (mean, 0.0);
    }
    let var = (sq - dev * dev / n) / (n - 1.0);
    (mean, var.max(0.0).sqrt())
}

/// For values near `f64::MAX`, where squares overflow.
fn scaled_std<S: KeySource + ?Sized>(source: &S, n: usize, mean: f64) -> f64 {
    if n < 2 {
        return 0.0;
    }
    let mut scale = 0.0_f64;
    source.each_key(|k| scale = scale.max(from_sort_key(k).abs()));
    let m = mean / scale;
    let mut sq = -0.0_f64;
    source.each_key(|k| sq += (from_sort_key(k) / scale - m).powi(2));
    scale * (sq / (n as f64 - 1.0)).sqrt()
}

/// p25, p50, p75 with linear interpolation at position (n-1)·q, of `values`.
#[cfg(test)]
fn quartiles(values: &mut [f64]) -> [f64; 3] {
    let keys: Vec<u64> = values.iter().map(|&x| sort_key(x)).collect();
    let (all, any) = keys
        .iter()
        .fold((u64::MAX, 0), |(all, any), &k| (all & k, any | k));
    quartiles_of(keys.as_slice(), keys.len(), all, any)
}

/// p25, p50, p75 with linear interpolation at position (n-1)·q, of the `n` values of
/// `source`, which share the bits `all` and together have the bits `any`.
fn quartiles_of<S: KeySource + ?Sized>(source: &S, n: usize, all: u64, any: u64) -> [f64; 3] {
    quartiles_by(n, |ranks, found| {
        let whole = Part {
            prefix: None,
            len: n,
            all,
            any,
        };
        select_streamed(source, &whole, ranks, found);
    })
}

/// [`quartiles_of`] the values of which `counted` holds each distinct one's key and count
/// (`n` in all).
fn quartiles_counted(mut counted: Vec<(u64, u64)>, n: usize) -> [f64; 3] {
    counted.sort_unstable_by_key(|&(k, _)| k);
    quartiles_by(n, |ranks, found| {
        // Walk up the values in order; rank r is the value whose counts reach past r.
        let (mut below, mut next) = (0_u64, counted.iter());
        let mut current = None;
        for (&r, slot) in ranks.iter().zip(found.iter_mut()) {
            while below <= r as u64 {
                let Some(&(k, c)) = next.next() else { break };
                below += c;
                current = Some(k);
            }
            *slot = current.unwrap_or_default();
        }
    })
}

/// The quartiles of `n` values given `select`, which puts the keys of the values of the
/// ranks it is given (sorted, distinct) into the slots it is given.
///
/// Each quartile needs the value at rank ⌊(n-1)·q⌋ and, unless it falls on a rank, the
/// next one: at most six order statistics.
fn quartiles_by(n: usize, select: impl FnOnce(&[usize], &mut [u64])) -> [f64; 3] {
    if n == 0 {
        return [0.0; 3];
    }
    let rank = |q: f64| {
        let h = (n - 1) as f64 * q;
        let lo = h.floor() as usize;
        (lo, h - lo as f64)
    };
    let quartiles = [rank(0.25), rank(0.5), rank(0.75)];
    let mut ranks: Vec<usize> = Vec::with_capacity(6);
    for &(lo, t) in &quartiles {
        ranks.push(lo);
        if t != 0.0 && lo + 1 < n {
            ranks.push(lo + 1);
        }
    }
    ranks.sort_unstable();
    ranks.dedup();
    let mut found = vec![0_u64; ranks.len()];
    select(&ranks, &mut found);
    let at = |r: usize| {
        ranks
            .iter()
            .position(|&x| x == r)
            .and_then(|i| found.get(i))
            .map_or(0.0, |&k| from_sort_key(k))
    };
    quartiles.map(|(lo, t)| {
        let a = at(lo);
        if t == 0.0 || lo + 1 >= n {
            a
        } else {
            lerp(a, at(lo + 1), t)
        }
    })
}

/// Below this many keys a selection is as fast as counting digits first.
const RADIX_MIN: usize = 1 << 14;
/// Bits per radix digit: a histogram of 2^16 counters stays in the L2 cache.
const DIGIT_BITS: u32 = 16;
const BUCKETS: usize = 1 << DIGIT_BITS;

/// The keys of a source whose bits from `prefix.0` up equal `prefix.1` (all of them
/// without a prefix): `len` keys, sharing the bits `all`, together having the bits `any`.
struct Part {
    prefix: Option<(u32, u64)>,
    len: usize,
    all: u64,
    any: u64,
}

impl Part {
    #[inline]
    fn holds(&self, key: u64) -> bool {
        self.prefix.is_none_or(|(shift, top)| key >> shift == top)
    }
}

/// A wanted bucket of a [`Part`], while its keys are read.
enum Bucket {
    /// Few enough to keep: kept, then selected in memory.
    Keep(Vec<u64>),
    /// Too many: only the bits they share and have are noted, and the bucket becomes a
    /// part of its own (unless all its keys are one value).
    Note { all: u64, any: u64 },
}

/// Puts into `out[i]` the key of rank `ranks[i]` (sorted, distinct, each below
/// `part.len`) among the keys of `part`, by radix selection over the source.
///
/// A histogram of the top 16 bits in which the part's keys differ tells which buckets
/// hold the wanted ranks; a second pass keeps the keys of those buckets (typically a few
/// percent), which are then selected in memory. A bucket too large to keep is a part of
/// its own, 16 bits further down, unless its keys are all one value: low-cardinality
/// columns end there. The source is read a few times in order; nothing of its size is
/// allocated.
fn select_streamed<S: KeySource + ?Sized>(
    source: &S,
    part: &Part,
    ranks: &[usize],
    out: &mut [u64],
) {
    if ranks.is_empty() {
        return;
    }
    if part.all == part.any {
        out.fill(part.all);
        return;
    }
    if part.prefix.is_none() && part.len < RADIX_MIN {
        let mut keys = Vec::with_capacity(part.len);
        source.each_key(|k| keys.push(k));
        order_statistics(&mut keys, ranks, out);
        return;
    }
    // Bits above `varying` are the same in every key; the digit holds the top 16 below.
    let varying = 64 - (part.all ^ part.any).leading_zeros();
    let shift = varying.saturating_sub(DIGIT_BITS);
    let digit = |k: u64| ((k >> shift) as usize) & (BUCKETS - 1);
    let mut counts = vec![0_u32; BUCKETS];
    source.each_key(|k| {
        if part.holds(k)
            && let Some(c) = counts.get_mut(digit(k))
        {
            *c = c.saturating_add(1);
        }
    });
    let groups = locate(&counts, ranks);
    // Keeping up to an eighth of the part costs less than reading it all again.
    let keep_at_most = (part.len / 8).max(RADIX_MIN);
    let mut buckets: Vec<Bucket> = groups
        .iter()
        .map(|g| {
            if g.size <= keep_at_most {
                Bucket::Keep(Vec::with_capacity(g.size))
            } else {
                Bucket::Note {
                    all: u64::MAX,
                    any: 0,
                }
            }
        })
        .collect();
    // Bucket → 1 + its index in `groups`, 0 for the buckets not wanted.
    let mut wanted = vec![0_u8; BUCKETS];
    for (i, g) in groups.iter().enumerate() {
        if let Some(w) = wanted.get_mut(g.bucket) {
            *w = u8::try_from(i + 1).unwrap_or(u8::MAX);
        }
    }
    source.each_key(|k| {
        if !part.holds(k) {
            return;
        }
        let w = wanted.get(digit(k)).copied().unwrap_or(0);
        if w == 0 {
            return;
        }
        match buckets.get_mut(usize::from(w) - 1) {
            Some(Bucket::Keep(keys)) => keys.push(k),
            Some(Bucket::Note { all, any }) => {
                *all &= k;
                *any |= k;
            }
            None => {}
        }
    });
    for (g, bucket) in groups.iter().zip(buckets) {
        let local: Vec<usize> = ranks[g.ranks.clone()]
            .iter()
            .map(|r| r - g.before)
            .collect();
        let Some(out) = out.get_mut(g.ranks.clone()) else {
            continue;
        };
        match bucket {
            Bucket::Keep(mut keys) => order_statistics(&mut keys, &local, out),
            Bucket::Note { all, any } => {
                // Every key of the bucket agrees from `shift` up.
                let sub = Part {
                    prefix: Some((shift, all >> shift)),
                    len: g.size,
                    all,
                    any,
                };
                select_streamed(source, &sub, &local, out);
            }
        }
    }
}

/// A bucket holding wanted ranks: which (positions into the ranks), how many keys lie in
/// the buckets below it, and its own size.
struct Group {
    bucket: usize,
    before: usize,
    size: usize,
    ranks: std::ops::Range<usize>,
}

/// The buckets of `counts` (a histogram) that hold `ranks` (sorted).
fn locate(counts: &[u32], ranks: &[usize]) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::with_capacity(ranks.len());
    let (mut bucket, mut before) = (0_usize, 0_usize);
    for (i, &r) in ranks.iter().enumerate() {
        while let Some(&c) = counts.get(bucket)
            && before + c as usize <= r
        {
            before += c as usize;
            bucket += 1;
        }
        match groups.last_mut() {
            Some(g) if g.bucket == bucket => g.ranks.end = i + 1,
            _ => groups.push(Group {
                bucket,
                before,
                size: counts.get(bucket).map_or(0, |&c| c as usize),
                ranks: i..i + 1,
            }),
        }
    }
    groups
}

/// Puts into `out[i]` the key of rank `ranks[i]` (sorted, distinct, each below
/// `keys.len()`), reordering `keys`: radix selection in place for many keys, repeated
/// selection for few.
fn order_statistics(keys: &mut [u64], ranks: &[usize], out: &mut [u64]) {
    if ranks.is_empty() {
        return;
    }
    if keys.len() < RADIX_MIN {
        select_ranks(keys, ranks, out);
        return;
    }
    let (all, any) = keys
        .iter()
        .fold((u64::MAX, 0_u64), |(all, any), &k| (all & k, any | k));
    if all == any {
        out.fill(all);
        return;
    }
    let varying = 64 - (all ^ any).leading_zeros();
    let shift = varying.saturating_sub(DIGIT_BITS);
    let digit = |k: u64| ((k >> shift) as usize) & (BUCKETS - 1);
    let mut counts = vec![0_u32; BUCKETS];
    for &k in keys.iter() {
        if let Some(c) = counts.get_mut(digit(k)) {
            *c = c.saturating_add(1);
        }
    }
    let groups = locate(&counts, ranks);
    let mut wanted = vec![false; BUCKETS];
    for g in &groups {
        if let Some(w) = wanted.get_mut(g.bucket) {
            *w = true;
        }
    }
    // Keep the keys of the wanted buckets, in place (a key is read before its slot can be
    // written over: the write index never passes the read index).
    let mut kept = 0;
    for i in 0..keys.len() {
        let k = keys[i];
        keys[kept] = k;
        kept += usize::from(wanted.get(digit(k)).copied().unwrap_or(false));
    }
    // Then each wanted bucket on its own, split off the kept keys.
    let mut rest = &mut keys[..kept];
    for (i, g) in groups.iter().enumerate() {
        let mine = if i + 1 == groups.len() {
            std::mem::take(&mut rest)
        } else {
            let split = partition(rest, |k| digit(k) == g.bucket);
            let (mine, others) = std::mem::take(&mut rest).split_at_mut(split);
            rest = others;
            mine
        };
        let local: Vec<usize> = ranks[g.ranks.clone()]
            .iter()
            .map(|r| r - g.before)
            .collect();
        if let Some(out) = out.get_mut(g.ranks.clone()) {
            order_statistics(mine, &local, out);
        }
    }
}

/// Moves the keys for which `is_in` holds to the front; returns how many there are.
fn partition(keys: &mut [u64], is_in: impl Fn(u64) -> bool) -> usize {
    let mut front = 0;
    for i in 0..keys.len() {
        let k = keys[i];
        // Always swap, move on only for a key that belongs in front: no branch to guess.
        keys.swap(front, i);
        front += usize::from(is_in(k));
    }
    front
}

/// [`order_statistics`] by repeated selection: the middle rank first, then the ranks on
/// either side of it within their side.
fn select_ranks(keys: &mut [u64], ranks: &[usize], out: &mut [u64]) {
    let mid = ranks.len() / 2;
    let (Some(&r), Some(slot)) = (ranks.get(mid), out.get_mut(mid)) else {
        return;
    };
    if r >= keys.len() {
        return;
    }
    let (left, &mut at, right) = keys.select_nth_unstable(r);
    *slot = at;
    let (out_left, out_right) = out.split_at_mut(mid);
    select_ranks(left, &ranks[..mid], out_left);
    let above: Vec<usize> = ranks[mid + 1..].iter().map(|x| x - r - 1).collect();
    select_ranks(right, &above, out_right.get_mut(1..).unwrap_or_default());
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
mod selection_tests {
    use super::*;

    /// Large inputs of every shape radix selection meets: spread, few values, one value,
    /// all keys in one top bucket, negatives, one heavy value among many, a cluster of many
    /// values in one bucket.
    fn shapes(n: usize) -> Vec<(&'static str, Vec<f64>)> {
        let mut x: u64 = 88_172_645_463_325_252;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut shape = |f: &dyn Fn(u64) -> f64| (0..n).map(|_| f(next())).collect::<Vec<_>>();
        vec![
            ("spread", shape(&|v| (v >> 11) as f64 / 1e6 - 4e6)),
            ("few", shape(&|v| (v % 7) as f64 * 0.05)),
            ("one", shape(&|_| 42.5)),
            ("narrow", shape(&|v| 1e9 + (v % 1_000_000) as f64)),
            ("negative", shape(&|v| -((v % 100_000) as f64) / 3.0)),
            (
                "heavy",
                shape(&|v| {
                    if v % 3 == 0 {
                        7.0
                    } else {
                        (v % 1_000_000) as f64
                    }
                }),
            ),
            ("two", shape(&|v| if v % 2 == 0 { -1e300 } else { 1e300 })),
            // A third of the values, all different, in one top bucket: selection goes on
            // 16 bits lower inside it.
            (
                "clustered",
                shape(&|v| {
                    if v % 3 == 0 {
                        1000.0 + (v % 50_000) as f64 * 1e-6
                    } else {
                        (v >> 11) as f64 / 1e6
                    }
                }),
            ),
        ]
    }

    fn by_sort(values: &[f64]) -> [f64; 3] {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        [0.25, 0.5, 0.75].map(|q| {
            let h = (n - 1) as f64 * q;
            let lo = h.floor() as usize;
            let t = h - lo as f64;
            if t == 0.0 {
                sorted[lo]
            } else {
                lerp(sorted[lo], sorted[lo + 1], t)
            }
        })
    }

    #[test]
    fn sort_keys_order_like_total_cmp() {
        let v = [-f64::MAX, -1.5, -1e-300, 0.0, 1e-300, 2.0, f64::MAX];
        for w in v.windows(2) {
            assert!(sort_key(w[0]) < sort_key(w[1]), "{w:?}");
        }
        for x in v {
            assert_eq!(from_sort_key(sort_key(x)).to_bits(), x.to_bits());
        }
    }

    #[test]
    fn radix_selection_matches_a_full_sort() {
        for n in [RADIX_MIN - 1, RADIX_MIN, 50_001, 300_000] {
            for (name, values) in shapes(n) {
                let want = by_sort(&values);
                // Streamed from the values, as a column is.
                assert_eq!(quartiles(&mut values.clone()), want, "{name} n={n}");
                // In memory, on kept keys.
                let mut keys: Vec<u64> = values.iter().map(|&x| sort_key(x)).collect();
                let ranks = [0, n / 4, n / 2, n / 2 + 1, n - 1];
                let mut found = [0; 5];
                order_statistics(&mut keys, &ranks, &mut found);
                let mut sorted = values.clone();
                sorted.sort_by(f64::total_cmp);
                for (&r, &k) in ranks.iter().zip(&found) {
                    assert_eq!(from_sort_key(k), sorted[r], "{name} n={n} rank {r}");
                }
                // From counts of distinct values.
                let mut counts = std::collections::HashMap::new();
                for &x in &values {
                    *counts.entry(sort_key(x)).or_insert(0_u64) += 1;
                }
                assert_eq!(quartiles_counted(counts.into_iter().collect(), n), want);
            }
        }
    }

    /// The sums fed one value at a time are the blocked sums of the values, bit for bit:
    /// mean and std do not change with how the values are read.
    #[test]
    fn streamed_sums_equal_blocked_sums() {
        for (name, values) in shapes(100_003) {
            let old = |f: &dyn Fn(f64) -> f64| -> f64 {
                values
                    .chunks(BLOCK)
                    .map(|b| b.iter().map(|&x| f(x)).sum::<f64>())
                    .sum()
            };
            let mut first = FirstPass::new();
            values.iter().for_each(|&x| first.push(x));
            assert_eq!(
                first.sum.finish().to_bits(),
                old(&|x| x).to_bits(),
                "{name}"
            );
            let keys: Vec<u64> = values.iter().map(|&x| sort_key(x)).collect();
            let n = values.len() as f64;
            let rough = old(&|x| x) / n;
            let (dev, sq) = (old(&|x| x - rough), old(&|x| (x - rough) * (x - rough)));
            let (mean, std) = mean_std(&first, keys.as_slice());
            if sq.is_finite() {
                let var = (sq - dev * dev / n) / (n - 1.0);
                assert_eq!(mean.to_bits(), (rough + dev / n).to_bits(), "{name}");
                assert_eq!(std.to_bits(), var.max(0.0).sqrt().to_bits(), "{name}");
            }
        }
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
