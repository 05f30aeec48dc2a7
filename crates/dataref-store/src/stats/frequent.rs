//! Distinct count, most frequent values and min/max of a string column in one pass.
//!
//! While the column has at most [`EXACT_LIMIT`] distinct values a hash map of borrowed
//! `&str` → count answers everything exactly. Past that, memory is bounded: the distinct
//! count moves to HyperLogLog and the counts to a Misra–Gries summary that keeps at most
//! 2 × [`EXACT_LIMIT`] counters. Its counts are lower bounds, each at most
//! `rows / (EXACT_LIMIT + 1)` below the truth, so any value more frequent than that is
//! listed.

use std::collections::HashMap;

use super::distinct::EXACT_LIMIT;
use super::hash::{Hashed, PassBuild, Prefixed};
use super::hll::Hll;

/// Exact counts. Keys carry a cheap hash and their first 32 bytes ([`Prefixed`]): one
/// hash per value, and strings up to 32 bytes compare without `memcmp`.
type Exact<'a> = HashMap<Prefixed<'a>, u64, PassBuild>;

/// A sketch's counters. Keys carry the [`Hashed::new`] hash that HyperLogLog takes too:
/// still one hash per value.
type Counts<'a> = HashMap<Hashed<'a, str>, u64, PassBuild>;

#[derive(Debug)]
pub(super) enum StringFrequencies<'a> {
    Exact(Exact<'a>),
    Sketch(Box<Sketch<'a>>),
}

#[derive(Debug)]
pub(super) struct Sketch<'a> {
    hll: Hll,
    counters: Counts<'a>,
    min: &'a str,
    max: &'a str,
}

/// What a string column summarises to.
#[derive(Debug, PartialEq)]
pub(super) struct StringSummary<'a> {
    pub distinct: u64,
    pub distinct_is_estimate: bool,
    pub min: Option<&'a str>,
    pub max: Option<&'a str>,
    /// Most frequent first; ties in value order.
    pub top: Vec<(&'a str, u64)>,
    pub top_is_estimate: bool,
}

impl<'a> StringFrequencies<'a> {
    pub(super) fn new() -> Self {
        Self::Exact(Exact::default())
    }

    #[cfg(test)]
    pub(super) fn insert(&mut self, s: &'a str) {
        self.add(s, None);
    }

    /// Adds one occurrence of `s`: one hash, one lookup. `within` is the Arrow array data
    /// `s` lies in and where it starts there, if it does: its head is then read from
    /// there instead of copied.
    #[inline]
    pub(super) fn add(&mut self, s: &'a str, within: Option<(&[u8], usize)>) {
        match self {
            Self::Exact(counts) => {
                let key = match within {
                    Some((data, start)) => Prefixed::in_buffer(s, data, start),
                    None => Prefixed::new(s),
                };
                *counts.entry(key).or_insert(0) += 1;
                if counts.len() > EXACT_LIMIT {
                    self.start_sketch();
                }
            }
            Self::Sketch(sketch) => sketch.insert(Hashed::new(s)),
        }
    }

    /// Past [`EXACT_LIMIT`] distinct values: from exact counts to a sketch (once).
    #[cold]
    #[inline(never)]
    fn start_sketch(&mut self) {
        if let Self::Exact(counts) = self {
            let counts = std::mem::take(counts);
            *self = Self::Sketch(Box::new(Sketch::from_exact(counts)));
        }
    }

    pub(super) fn finish(&self, k: usize) -> StringSummary<'a> {
        match self {
            Self::Exact(counts) => StringSummary {
                distinct: counts.len() as u64,
                distinct_is_estimate: false,
                // Cheaper over the distinct keys than comparing every row.
                min: counts.keys().map(|k| k.value).min(),
                max: counts.keys().map(|k| k.value).max(),
                top: top_k(counts.iter().map(|(key, &c)| (key.value, c)), k),
                top_is_estimate: false,
            },
            Self::Sketch(sketch) => StringSummary {
                distinct: sketch.hll.estimate(),
                distinct_is_estimate: true,
                min: Some(sketch.min),
                max: Some(sketch.max),
                top: top_k(sketch.counters.iter().map(|(key, &c)| (key.value, c)), k),
                top_is_estimate: true,
            },
        }
    }
}

impl<'a> Sketch<'a> {
    /// The sketch of the exact counts so far, whose keys are hashed again with the
    /// [`Hash64`](super::hash::Hash64) the sketch reads.
    fn from_exact(exact: Exact<'a>) -> Self {
        let mut counters = Counts::with_capacity_and_hasher(2 * EXACT_LIMIT, PassBuild::default());
        counters.extend(exact.into_iter().map(|(k, c)| (Hashed::new(k.value), c)));
        let mut hll = Hll::new();
        for k in counters.keys() {
            hll.insert(k.hash);
        }
        let min = counters.keys().map(|k| k.value).min().unwrap_or_default();
        let max = counters.keys().map(|k| k.value).max().unwrap_or_default();
        Self {
            hll,
            counters,
            min,
            max,
        }
    }

    fn insert(&mut self, key: Hashed<'a, str>) {
        self.hll.insert(key.hash);
        let s = key.value;
        if s < self.min {
            self.min = s;
        }
        if s > self.max {
            self.max = s;
        }
        *self.counters.entry(key).or_insert(0) += 1;
        if self.counters.len() >= 2 * EXACT_LIMIT {
            self.reduce();
        }
    }

    /// Batched Misra–Gries decrement: subtract the (C+1)-th largest count `t` from every
    /// counter and drop those at zero, leaving at most C. The C+1 largest each lose `t`,
    /// so the `t`s of all reductions add up to at most rows / (C+1): that bounds how far
    /// below its true count any counter can be.
    fn reduce(&mut self) {
        let mut counts: Vec<u64> = self.counters.values().copied().collect();
        let Some(rank) = counts.len().checked_sub(EXACT_LIMIT + 1) else {
            return;
        };
        let (_, t, _) = counts.select_nth_unstable(rank);
        let t = *t;
        self.counters.retain(|_, c| {
            *c = c.saturating_sub(t);
            *c > 0
        });
    }
}

/// The `k` highest counts, highest first, ties broken by value so the answer is stable.
fn top_k<'a>(counts: impl Iterator<Item = (&'a str, u64)>, k: usize) -> Vec<(&'a str, u64)> {
    let mut top: Vec<(&'a str, u64)> = Vec::with_capacity(k + 1);
    let before = |a: &(&str, u64), b: &(&str, u64)| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0));
    for candidate in counts {
        if top.len() == k
            && top
                .last()
                .is_none_or(|last| before(&candidate, last).is_ge())
        {
            continue;
        }
        let at = top.partition_point(|t| before(t, &candidate).is_lt());
        top.insert(at, candidate);
        top.truncate(k);
    }
    top
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_counts_and_order() {
        let data = ["b", "a", "c", "a", "b", "a", "d", "e", "f", "f"];
        let mut f = StringFrequencies::new();
        for s in data {
            f.insert(s);
        }
        let s = f.finish(3);
        assert_eq!(s.distinct, 6);
        assert!(!s.distinct_is_estimate && !s.top_is_estimate);
        assert_eq!((s.min, s.max), (Some("a"), Some("f")));
        assert_eq!(s.top, vec![("a", 3), ("b", 2), ("f", 2)]);
    }

    #[test]
    fn heavy_hitters_survive_many_distinct_values() {
        let ids: Vec<String> = (0..400_000).map(|i| format!("id-{i:07}")).collect();
        let mut f = StringFrequencies::new();
        for (i, id) in ids.iter().enumerate() {
            f.insert(id);
            // Interleave so the frequent values arrive throughout, not just at the start.
            if i % 10 == 0 {
                f.insert("hot");
            }
            if i % 20 == 0 {
                f.insert("warm");
            }
        }
        let s = f.finish(2);
        assert!(s.distinct_is_estimate && s.top_is_estimate);
        let err = (s.distinct as f64 - 400_002.0).abs() / 400_002.0;
        assert!(err < 0.02, "{}", s.distinct);
        assert_eq!(s.top[0].0, "hot");
        assert_eq!(s.top[1].0, "warm");
        // Lower bounds within rows / (C+1) of the truth.
        let slack = 460_000 / (EXACT_LIMIT as u64 + 1);
        assert!(
            s.top[0].1 <= 40_000 && s.top[0].1 + slack >= 40_000,
            "{:?}",
            s.top
        );
        assert!(
            s.top[1].1 <= 20_000 && s.top[1].1 + slack >= 20_000,
            "{:?}",
            s.top
        );
        assert_eq!(s.min, Some("hot"));
        assert_eq!(s.max, Some("warm"));
    }
}
