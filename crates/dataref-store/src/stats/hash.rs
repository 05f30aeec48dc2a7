//! Fast 64-bit hashing for distinct counts and frequency maps.
//!
//! std's SipHash resists hash flooding, which we do not need here: the keys are the
//! caller's own query result, and a flood could only slow the caller's own request. What
//! we do need is speed on short strings and well-mixed low *and* high bits, because the
//! HyperLogLog sketch takes its register index from the low bits and its rank from the
//! rest. The byte hash folds 16-byte blocks with a 64×64→128-bit multiply (after
//! wyhash); integers go through the splitmix64 finaliser.

use std::hash::{BuildHasherDefault, Hasher};

const K0: u64 = 0xa076_1d64_78bd_642f;
const K1: u64 = 0xe703_7ed1_a0b4_28db;
const K2: u64 = 0x8ebc_6af0_9c88_c6e3;
const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// `HashMap`/`HashSet` hasher state built from [`FastHasher`].
pub(super) type FastBuild = BuildHasherDefault<FastHasher>;

/// The splitmix64 finaliser (after a golden-ratio offset so 0 does not map to 0).
pub(super) fn mix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(GOLDEN);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Multiplies to 128 bits and folds the halves: every input bit reaches the middle bits.
fn fold(a: u64, b: u64) -> u64 {
    let r = u128::from(a) * u128::from(b);
    (r as u64) ^ ((r >> 64) as u64)
}

fn read8(bytes: &[u8], at: usize) -> u64 {
    bytes
        .get(at..at + 8)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map_or(0, u64::from_le_bytes)
}

fn read4(bytes: &[u8], at: usize) -> u64 {
    bytes
        .get(at..at + 4)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map_or(0, |b| u64::from(u32::from_le_bytes(b)))
}

/// Hashes `bytes`; `seed` chains calls (a `Hasher` may be fed several pieces).
///
/// Short inputs (the common case: codes, names, categories) are read as a few fixed-size
/// words that may overlap, with no loop and no variable-length copy; the length goes in
/// last so that overlapping reads of different lengths cannot collide.
pub(super) fn hash_bytes(bytes: &[u8], seed: u64) -> u64 {
    let len = bytes.len();
    let mut h = seed ^ K0;
    let (a, b) = match len {
        0 => (0, 0),
        1..=3 => {
            let byte = |i: usize| u64::from(bytes.get(i).copied().unwrap_or_default());
            ((byte(0) << 16) | (byte(len / 2) << 8) | byte(len - 1), 0)
        }
        4..=16 => {
            // 4..=7 bytes: [0,4) and [len-4,len); 8..=16: [0,8) and [len-8,len).
            let step = (len / 8) * 4;
            (
                (read4(bytes, 0) << 32) | read4(bytes, step),
                (read4(bytes, len - 4) << 32) | read4(bytes, len - 4 - step),
            )
        }
        _ => {
            let mut at = 0;
            while len - at > 16 {
                h = fold(read8(bytes, at) ^ K1, read8(bytes, at + 8) ^ h);
                at += 16;
            }
            (read8(bytes, len - 16), read8(bytes, len - 8))
        }
    };
    fold(fold(a ^ K1, b ^ h) ^ K2, (len as u64) ^ K1)
}

/// A well-mixed 64-bit hash of a key, the same in every phase of a count (exact set,
/// sketch), so keys moved from one to the other keep their hash.
pub(super) trait Hash64 {
    fn hash64(&self) -> u64;
}

impl Hash64 for u64 {
    fn hash64(&self) -> u64 {
        mix64(*self)
    }
}

impl Hash64 for u128 {
    fn hash64(&self) -> u64 {
        mix64((*self as u64) ^ mix64((*self >> 64) as u64))
    }
}

impl Hash64 for &str {
    fn hash64(&self) -> u64 {
        hash_bytes(self.as_bytes(), 0)
    }
}

impl Hash64 for &[u8] {
    fn hash64(&self) -> u64 {
        hash_bytes(self, 0)
    }
}

/// `std::hash::Hasher` over [`hash_bytes`] and [`mix64`].
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct FastHasher(u64);

impl Hasher for FastHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0 = hash_bytes(bytes, self.0);
    }

    fn write_u8(&mut self, i: u8) {
        self.write_u64(u64::from(i));
    }

    fn write_u32(&mut self, i: u32) {
        self.write_u64(u64::from(i));
    }

    fn write_u64(&mut self, i: u64) {
        self.0 = mix64(self.0 ^ i);
    }

    fn write_u128(&mut self, i: u128) {
        self.write_u64(i as u64);
        self.write_u64((i >> 64) as u64);
    }

    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_hash_depends_on_every_byte_and_the_length() {
        let base = hash_bytes(b"the quick brown fox jumps", 0);
        assert_ne!(base, hash_bytes(b"the quick brown fox jumpt", 0));
        assert_ne!(base, hash_bytes(b"uhe quick brown fox jumps", 0));
        assert_ne!(hash_bytes(b"a", 0), hash_bytes(b"a\0", 0));
        assert_ne!(hash_bytes(b"", 0), hash_bytes(b"\0", 0));
        assert_ne!(hash_bytes(b"abc", 0), hash_bytes(b"abc", 1));
        // Every byte of every length reaches the hash (the short paths read overlapping words).
        for len in 0..48 {
            let base: Vec<u8> = (0..len as u8).map(|i| i.wrapping_mul(37)).collect();
            let h = hash_bytes(&base, 0);
            for at in 0..len {
                let mut flipped = base.clone();
                flipped[at] ^= 1;
                assert_ne!(h, hash_bytes(&flipped, 0), "len {len} byte {at}");
            }
        }
    }

    #[test]
    fn low_and_high_bits_are_balanced() {
        // Sequential integers and near-identical strings must still spread over both ends
        // of the word: HyperLogLog reads its register index from the low bits.
        let n = 1_u32 << 16;
        let mut low = vec![0u32; 16];
        let mut top_bit = 0u32;
        for i in 0..n as u64 {
            let h = format!("id-{i}").as_str().hash64();
            low[(h & 15) as usize] += 1;
            top_bit += (i.hash64() >> 63) as u32;
        }
        for c in low {
            assert!((c as f64 - 4096.0).abs() < 4096.0 * 0.1, "{c}");
        }
        assert!((f64::from(top_bit) - 32768.0).abs() < 32768.0 * 0.05);
    }
}
