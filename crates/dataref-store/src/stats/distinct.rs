//! Distinct counting: exact up to [`EXACT_LIMIT`] values, then a HyperLogLog estimate.

use std::collections::HashSet;
use std::hash::Hash;

use super::hash::{FastBuild, Hash64};
use super::hll::Hll;

/// Up to this many distinct values a count (and a top list) is exact. Above it, memory
/// would grow with the data, so we switch to sketches with fixed memory.
pub(super) const EXACT_LIMIT: usize = 65_536;

/// Distinct non-null values of one column.
#[derive(Debug)]
pub(super) enum Distinct<K> {
    Exact(HashSet<K, FastBuild>),
    Estimate(Box<Hll>),
}

impl<K: Eq + Hash + Hash64> Distinct<K> {
    pub(super) fn new() -> Self {
        Self::Exact(HashSet::default())
    }

    pub(super) fn insert(&mut self, key: K) {
        match self {
            Self::Exact(set) => {
                if set.insert(key) && set.len() > EXACT_LIMIT {
                    let mut hll = Hll::new();
                    for k in set.iter() {
                        hll.insert(k.hash64());
                    }
                    *self = Self::Estimate(Box::new(hll));
                }
            }
            Self::Estimate(hll) => hll.insert(key.hash64()),
        }
    }

    /// The count and whether it is an estimate.
    pub(super) fn finish(&self) -> (u64, bool) {
        match self {
            Self::Exact(set) => (set.len() as u64, false),
            Self::Estimate(hll) => (hll.estimate(), true),
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
}
