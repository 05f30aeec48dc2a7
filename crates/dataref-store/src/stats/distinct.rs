//! Distinct counting: exact up to [`EXACT_LIMIT`] values, then a HyperLogLog estimate.

use std::collections::HashMap;
use std::hash::Hash;

use super::hash::{FastBuild, Hash64};
use super::hll::Hll;

/// Up to this many distinct values a count (and a top list) is exact. Above it, memory
/// would grow with the data, so we switch to sketches with fixed memory.
pub(super) const EXACT_LIMIT: usize = 65_536;

/// Distinct non-null values of one column, and how often each occurs while they are few
/// enough to count exactly.
#[derive(Debug)]
pub(super) struct Distinct<K> {
    count: Count<K>,
    /// The current run of equal keys (sorted or clustered data repeat them): added to the
    /// count once, when it ends, without hashing each repeat.
    run: Option<(K, u64)>,
}

#[derive(Debug)]
enum Count<K> {
    Exact(HashMap<K, u64, FastBuild>),
    Estimate(Box<Hll>),
}

impl<K: Eq + Hash + Hash64 + Copy> Distinct<K> {
    pub(super) fn new() -> Self {
        Self {
            count: Count::Exact(HashMap::default()),
            run: None,
        }
    }

    #[inline]
    pub(super) fn insert(&mut self, key: K) {
        match &mut self.run {
            Some((last, n)) if *last == key => *n += 1,
            _ => {
                if let Some((last, n)) = self.run.replace((key, 1)) {
                    self.add(last, n);
                }
            }
        }
    }

    fn add(&mut self, key: K, n: u64) {
        match &mut self.count {
            Count::Exact(counts) => {
                *counts.entry(key).or_insert(0) += n;
                if counts.len() > EXACT_LIMIT {
                    let mut hll = Hll::new();
                    for k in counts.keys() {
                        hll.insert(k.hash64());
                    }
                    self.count = Count::Estimate(Box::new(hll));
                }
            }
            Count::Estimate(hll) => hll.insert(key.hash64()),
        }
    }

    /// The count and whether it is an estimate (ending the current run: more inserts
    /// may follow).
    pub(super) fn finish(&mut self) -> (u64, bool) {
        if let Some((last, n)) = self.run.take() {
            self.add(last, n);
        }
        match &self.count {
            Count::Exact(counts) => (counts.len() as u64, false),
            Count::Estimate(hll) => (hll.estimate(), true),
        }
    }

    /// Each distinct key and how often it occurs (after [`Distinct::finish`]), unless there
    /// were too many to count.
    pub(super) fn counts(&self) -> Option<&HashMap<K, u64, FastBuild>> {
        match &self.count {
            Count::Exact(counts) => Some(counts),
            Count::Estimate(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_up_to_the_limit_then_estimated() {
        let mut d = Distinct::<u64>::new();
        for _ in 0..3 {
            for i in 0..EXACT_LIMIT as u64 {
                d.insert(i * 7);
            }
        }
        assert_eq!(d.finish(), (EXACT_LIMIT as u64, false));
        d.insert(u64::MAX);
        let (n, estimate) = d.finish();
        assert!(estimate);
        assert!((n as f64 - 65_537.0).abs() < 65_537.0 * 0.02, "{n}");
    }

    #[test]
    fn runs_are_counted_like_single_values() {
        let values = [3_u64, 3, 3, 1, 3, 2, 2, 1, 1, 1, 3];
        let mut d = Distinct::<u64>::new();
        values.iter().for_each(|&v| d.insert(v));
        assert_eq!(d.finish(), (3, false));
        let mut counts: Vec<(u64, u64)> =
            d.counts().unwrap().iter().map(|(&k, &c)| (k, c)).collect();
        counts.sort_unstable();
        assert_eq!(counts, [(1, 4), (2, 2), (3, 5)]);
        // Values after `finish` still count.
        d.insert(3);
        d.insert(4);
        assert_eq!(d.finish(), (4, false));
        assert_eq!(d.counts().unwrap()[&3], 6);
    }
}
