//! The content hash of a stored table: BLAKE3 of the whole Arrow IPC file, computed while
//! the file is written (no second pass), kept in the index beside the size, and checked
//! before the bytes are served (see [`LocalStore`](crate::LocalStore)).
//!
//! Written as `blake3:<64 hex digits>` in the index, so another algorithm can follow
//! without guessing which one a row used.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use blake3::hazmat::{self, ChainingValue, HasherExt};

/// The largest piece hashed on one thread (a power of two, so a piece is a whole subtree).
const PIECE: usize = 4 << 20;
/// Threads one hash may use at most.
const MAX_THREADS: usize = 8;

/// BLAKE3's tree over an input, cut down to pieces of at most [`PIECE`] bytes.
enum Tree {
    /// The index of a piece in the plan's list.
    Piece(usize),
    Parent(Box<Tree>, Box<Tree>),
}

/// The tree of `len` bytes at `offset`, its pieces (offset, length) pushed onto `pieces`:
/// a left subtree is the largest power-of-two number of chunks leaving something on the
/// right, as BLAKE3 builds it.
fn plan(len: usize, offset: usize, pieces: &mut Vec<(usize, usize)>) -> Tree {
    if len <= PIECE {
        pieces.push((offset, len));
        return Tree::Piece(pieces.len() - 1);
    }
    let left = usize::try_from(hazmat::left_subtree_len(len as u64)).unwrap_or(len / 2);
    Tree::Parent(
        Box::new(plan(left, offset, pieces)),
        Box::new(plan(len - left, offset + left, pieces)),
    )
}

/// Each piece's chaining value, the pieces shared out among `threads` threads.
fn hash_pieces(bytes: &[u8], pieces: &[(usize, usize)], threads: usize) -> Vec<ChainingValue> {
    let next = AtomicUsize::new(0);
    let cvs = Mutex::new(vec![[0u8; 32]; pieces.len()]);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&(offset, len)) = pieces.get(i) else {
                        return;
                    };
                    let cv = blake3::Hasher::new()
                        .set_input_offset(offset as u64)
                        .update(&bytes[offset..offset + len])
                        .finalize_non_root();
                    cvs.lock().unwrap_or_else(PoisonError::into_inner)[i] = cv;
                }
            });
        }
    });
    cvs.into_inner().unwrap_or_else(PoisonError::into_inner)
}

fn merge(tree: &Tree, cvs: &[ChainingValue]) -> ChainingValue {
    match tree {
        Tree::Piece(i) => cvs[*i],
        Tree::Parent(l, r) => {
            hazmat::merge_subtrees_non_root(&merge(l, cvs), &merge(r, cvs), hazmat::Mode::Hash)
        }
    }
}

/// A table's content hash.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Checksum([u8; 32]);

const PREFIX: &str = "blake3:";

impl Checksum {
    /// The hash of `bytes` (plain BLAKE3, what `b3sum` prints), on every core for a large
    /// file: BLAKE3 is a tree, so pieces of it hash apart and their chaining values merge.
    pub fn of(bytes: &[u8]) -> Self {
        let threads = std::thread::available_parallelism()
            .map_or(1, std::num::NonZeroUsize::get)
            .min(MAX_THREADS);
        if threads < 2 || bytes.len() <= 2 * PIECE {
            return Self(*blake3::hash(bytes).as_bytes());
        }
        let mut pieces = Vec::new();
        let Tree::Parent(left, right) = plan(bytes.len(), 0, &mut pieces) else {
            return Self(*blake3::hash(bytes).as_bytes());
        };
        let cvs = hash_pieces(bytes, &pieces, threads);
        let (l, r) = (merge(&left, &cvs), merge(&right, &cvs));
        Self(*hazmat::merge_subtrees_root(&l, &r, hazmat::Mode::Hash).as_bytes())
    }

    /// Parses the index's text form.
    pub fn parse(s: &str) -> Option<Self> {
        let hex = s.strip_prefix(PREFIX)?;
        if hex.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Self(out))
    }

    /// `Ok` when this hash (of bytes found) is `expected` (the one written); else what a
    /// damage message says.
    pub fn matches(&self, expected: &Checksum) -> Result<(), String> {
        if self == expected {
            Ok(())
        } else {
            Err(format!(
                "its bytes hash to {} where {} was written",
                self.short(),
                expected.short()
            ))
        }
    }

    /// The first 8 hex digits, for messages and the log.
    pub fn short(&self) -> String {
        self.0[..4].iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Display for Checksum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(PREFIX)?;
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Checksum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A hash being computed from the bytes as they are written or arrive.
#[derive(Debug, Clone, Default)]
pub struct Hashing(blake3::Hasher);

impl Hashing {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    pub fn finish(&self) -> Checksum {
        Checksum(*self.0.finalize().as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hashed in pieces on several threads, any length gives plain BLAKE3.
    #[test]
    fn the_parallel_hash_is_blake3() {
        let data: Vec<u8> = (0..(3 * PIECE + 12_345))
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        for len in [
            0,
            1,
            1024,
            1025,
            2 * PIECE,
            2 * PIECE + 1,
            3 * PIECE - 1,
            3 * PIECE + 12_345,
        ] {
            let want = *blake3::hash(&data[..len]).as_bytes();
            assert_eq!(Checksum::of(&data[..len]).0, want, "{len} bytes");
            let mut pieces = Vec::new();
            if len > PIECE {
                let tree = plan(len, 0, &mut pieces);
                let cvs = hash_pieces(&data[..len], &pieces, 3);
                if let Tree::Parent(l, r) = tree {
                    let root = hazmat::merge_subtrees_root(
                        &merge(&l, &cvs),
                        &merge(&r, &cvs),
                        hazmat::Mode::Hash,
                    );
                    assert_eq!(*root.as_bytes(), want, "{len} bytes, 3 threads");
                }
            }
        }
    }

    #[test]
    fn the_text_form_round_trips_and_refuses_anything_else() {
        let c = Checksum::of(b"some table");
        let text = c.to_string();
        assert!(
            text.starts_with("blake3:") && text.len() == 7 + 64,
            "{text}"
        );
        assert_eq!(Checksum::parse(&text), Some(c));
        for bad in [
            "",
            "blake3:",
            &text[7..],
            &text[..text.len() - 1],
            &format!("sha256:{}", &text[7..]),
            &format!("{}g", &text[..text.len() - 1]),
        ] {
            assert_eq!(Checksum::parse(bad), None, "{bad}");
        }
        let mut h = Hashing::new();
        h.update(b"some ");
        h.update(b"table");
        assert_eq!(h.finish(), c);
        assert_eq!(c.short(), text[7..15]);
    }
}
