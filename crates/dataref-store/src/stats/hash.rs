//! Fast 64-bit hashing for distinct counts and frequency maps.
//!
//! std's SipHash resists hash flooding, which we do not need here: the keys are the
//! caller's own query result, and a flood could only slow the caller's own request. What
//! we do need is speed on short strings and well-mixed low *and* high bits, because the
//! HyperLogLog sketch takes its register index from the low bits and its rank from the
//! rest. The byte hash folds 16-byte blocks with a 64×64→128-bit multiply (after
//! wyhash); integers go through the splitmix64 finaliser.
//!
//! Keys are hashed once: map keys carry their hash ([`Hashed`], [`Prefixed`]) and the map
//! takes it as it is ([`PassThrough`]). Exact string counts, which are never sketched, use
//! a cheaper hash of their first 32 bytes ([`Prefixed`]); a sketch's keys are hashed with
//! [`hash_bytes`], which HyperLogLog reads too.

use std::hash::{BuildHasherDefault, Hash, Hasher};

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

/// A cheaper hash than [`hash_bytes`] for the exact counting maps ([`Prefixed`]), where it
/// is never stored in a sketch: every byte still counts, but the 16-byte blocks are each
/// folded on their own and only then combined, so a string costs independent multiplies
/// instead of a chain of them.
pub(super) fn quick_hash(bytes: &[u8]) -> u64 {
    let len = bytes.len();
    match len {
        0..=3 => {
            let byte = |i: usize| u64::from(bytes.get(i).copied().unwrap_or_default());
            let x = (byte(0) << 16) | (byte(len / 2) << 8) | byte(len.saturating_sub(1));
            fold(x ^ K1, (len as u64) ^ K2)
        }
        4..=16 => {
            let step = (len / 8) * 4;
            let a = (read4(bytes, 0) << 32) | read4(bytes, step);
            let b = (read4(bytes, len - 4) << 32) | read4(bytes, len - 4 - step);
            fold(a ^ K1, b ^ K2 ^ (len as u64))
        }
        _ => {
            let mut h = (len as u64) ^ K0;
            let mut at = 0;
            while len - at > 16 {
                // The rotation keeps equal blocks at different places from cancelling.
                h = h.rotate_left(23) ^ fold(read8(bytes, at) ^ K1, read8(bytes, at + 8) ^ K2);
                at += 16;
            }
            h ^ fold(read8(bytes, len - 16) ^ K2, read8(bytes, len - 8) ^ K1)
        }
    }
}

/// A string for an exact counting map: its first [`HEAD`] bytes as words (zero past its
/// end) and a hash of it that is never stored in a sketch. Up to 32 bytes (codes, names,
/// categories, product lines), hashing is two independent multiplies and equality five
/// word compares: no loop, no branch on the length, no call to `memcmp`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Prefixed<'a> {
    pub hash: u64,
    head: [u64; 4],
    pub value: &'a str,
}

/// Bytes of a [`Prefixed`] head.
const HEAD: usize = 32;

/// The low `n` bytes of a word (all of it from 8 on).
#[inline]
fn low_bytes(n: usize) -> u64 {
    ((1_u128 << (8 * n.min(8))) - 1) as u64
}

impl<'a> Prefixed<'a> {
    /// From `value` alone (copying its head).
    pub(super) fn new(value: &'a str) -> Self {
        let bytes = value.as_bytes();
        let mut head = [0_u8; HEAD];
        let n = bytes.len().min(HEAD);
        if let (Some(to), Some(from)) = (head.get_mut(..n), bytes.get(..n)) {
            to.copy_from_slice(from);
        }
        Self::with_head(
            value,
            [
                read8(&head, 0),
                read8(&head, 8),
                read8(&head, 16),
                read8(&head, 24),
            ],
        )
    }

    /// `value`, which starts at `start` in `buffer` (an Arrow string array's data): the
    /// head is read from the buffer as words, masked to the value's length.
    #[inline]
    pub(super) fn in_buffer(value: &'a str, buffer: &[u8], start: usize) -> Self {
        if start + HEAD > buffer.len() {
            return Self::new(value);
        }
        let len = value.len();
        let word = |k: usize| read8(buffer, start + 8 * k) & low_bytes(len.saturating_sub(8 * k));
        Self::with_head(value, [word(0), word(1), word(2), word(3)])
    }

    #[inline]
    fn with_head(value: &'a str, head: [u64; 4]) -> Self {
        let len = value.len();
        let hash = if len <= HEAD {
            fold(head[0] ^ K1, head[1] ^ K2 ^ (len as u64))
                ^ fold(head[2] ^ K2, head[3] ^ K0).rotate_left(29)
        } else {
            quick_hash(value.as_bytes())
        };
        Self { hash, head, value }
    }

    /// Whether `self` and `other` are the same string.
    #[inline]
    pub(super) fn same(&self, other: &Self) -> bool {
        let len = self.value.len();
        // `&`, not `&&`: five compares are cheaper than four guessed branches.
        (self.head[0] == other.head[0])
            & (self.head[1] == other.head[1])
            & (self.head[2] == other.head[2])
            & (self.head[3] == other.head[3])
            & (len == other.value.len())
            && (len <= HEAD || self.value == other.value)
    }
}

impl PartialEq for Prefixed<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.same(other)
    }
}

impl Eq for Prefixed<'_> {}

impl Hash for Prefixed<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
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

/// A borrowed value with its [`Hash64`] computed once: the map hashes it, the sketch takes
/// the same hash, and equality looks at the hash before comparing bytes.
#[derive(Debug)]
pub(super) struct Hashed<'a, T: ?Sized> {
    pub hash: u64,
    pub value: &'a T,
}

// By hand: a derive would ask `T: Copy`, which `str` is not; the reference is.
impl<T: ?Sized> Clone for Hashed<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T: ?Sized> Copy for Hashed<'_, T> {}

impl<'a> Hashed<'a, str> {
    /// With its [`Hash64`], as a sketch needs it.
    pub(super) fn new(value: &'a str) -> Self {
        Self {
            hash: value.hash64(),
            value,
        }
    }
}

impl PartialEq for Hashed<'_, str> {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && same_bytes(self.value.as_bytes(), other.value.as_bytes())
    }
}

impl Eq for Hashed<'_, str> {}

/// `a == b`, with strings up to 16 bytes compared as two words each (no call to `memcmp`,
/// which dominates comparing short strings).
#[inline]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let len = a.len();
    if len != b.len() {
        return false;
    }
    match len {
        0..=3 => a == b,
        4..=8 => read4(a, 0) == read4(b, 0) && read4(a, len - 4) == read4(b, len - 4),
        9..=16 => read8(a, 0) == read8(b, 0) && read8(a, len - 8) == read8(b, len - 8),
        _ => a == b,
    }
}

impl<T: ?Sized> Hash for Hashed<'_, T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl<T: ?Sized> Hash64 for Hashed<'_, T> {
    fn hash64(&self) -> u64 {
        self.hash
    }
}

/// `HashMap`/`HashSet` hasher state for keys that carry their hash ([`Hashed`]).
pub(super) type PassBuild = BuildHasherDefault<PassThrough>;

/// Takes a key's precomputed, well-mixed hash as it is (anything else through
/// [`hash_bytes`] and [`mix64`], as [`FastHasher`] does).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0 = hash_bytes(bytes, self.0);
    }

    /// A single write (a [`Hashed`] key) gives `i` xor a constant, which folds away.
    fn write_u64(&mut self, i: u64) {
        self.0 = mix64(self.0) ^ i;
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
    fn prefixed_strings_are_equal_exactly_when_their_bytes_are() {
        for len in 0..48_usize {
            let base: String = (0..len)
                .map(|i| char::from(b'a' + (i % 26) as u8))
                .collect();
            // In a buffer with bytes after it (read past the end, then masked), and alone.
            let buffer = format!("{base}zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz");
            let in_buffer = Prefixed::in_buffer(&base, buffer.as_bytes(), 0);
            let alone = Prefixed::new(&base);
            assert!(in_buffer.same(&alone), "len {len}");
            assert_eq!(in_buffer.hash, alone.hash, "len {len}");
            for at in 0..len {
                let mut other = base.clone().into_bytes();
                other[at] = b'A';
                let other = String::from_utf8(other).unwrap();
                let p = Prefixed::new(&other);
                assert!(!p.same(&alone), "len {len} byte {at}");
                assert_ne!(p.hash, alone.hash, "len {len} byte {at}");
            }
            let longer = format!("{base}a");
            assert!(!Prefixed::new(&longer).same(&alone));
            assert_ne!(Prefixed::new(&longer).hash, alone.hash, "len {len}");
        }
        // Near the end of the buffer the head is copied instead.
        let tail = Prefixed::in_buffer("end", b"the end", 4);
        assert!(tail.same(&Prefixed::new("end")));
    }

    #[test]
    fn prefixed_hash_spreads_for_the_map() {
        // hashbrown takes the bucket from the low bits and a tag from the top 7.
        let n = 1_u32 << 16;
        let (mut low, mut top) = (vec![0u32; 16], vec![0u32; 16]);
        for i in 0..n {
            let s = format!("id-{i}");
            let h = Prefixed::new(&s).hash;
            low[(h & 15) as usize] += 1;
            top[(h >> 60) as usize] += 1;
        }
        for c in low.into_iter().chain(top) {
            assert!((c as f64 - 4096.0).abs() < 4096.0 * 0.1, "{c}");
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
