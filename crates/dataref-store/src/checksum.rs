//! The content hash of a stored table: BLAKE3 of the whole Arrow IPC file, computed while
//! the file is written (no second pass), kept in the index beside the size, and checked
//! before the bytes are served (see [`LocalStore`](crate::LocalStore)).
//!
//! Written as `blake3:<64 hex digits>` in the index, so another algorithm can follow
//! without guessing which one a row used.

use std::fmt;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use blake3::hazmat::{self, ChainingValue, HasherExt};

/// The largest piece hashed on one thread (a power of two, so a piece is a whole subtree).
const PIECE: u64 = 4 << 20;
/// Threads one hash may use at most.
const MAX_THREADS: usize = 8;

/// BLAKE3's tree over an input, cut down to pieces.
#[derive(Debug)]
enum Tree {
    /// The index of a piece in the plan's list.
    Piece(usize),
    Parent(Box<Tree>, Box<Tree>),
}

/// The tree of `len` bytes at `offset`, its pieces (offset, length) of at most `piece`
/// bytes pushed onto `spans`: a left subtree is the largest power-of-two number of chunks
/// leaving something on the right, as BLAKE3 builds it.
fn plan(len: u64, offset: u64, piece: u64, spans: &mut Vec<(u64, u64)>) -> Tree {
    if len <= piece {
        spans.push((offset, len));
        return Tree::Piece(spans.len() - 1);
    }
    let left = hazmat::left_subtree_len(len);
    Tree::Parent(
        Box::new(plan(left, offset, piece, spans)),
        Box::new(plan(len - left, offset + left, piece, spans)),
    )
}

fn merge(tree: &Tree, cvs: &[ChainingValue]) -> ChainingValue {
    match tree {
        Tree::Piece(i) => cvs[*i],
        Tree::Parent(l, r) => {
            hazmat::merge_subtrees_non_root(&merge(l, cvs), &merge(r, cvs), hazmat::Mode::Hash)
        }
    }
}

/// The hash of `len` bytes computed piece by piece, the pieces hashed apart in any order
/// and on any thread: a file hashed on every core, a download fetched in ranged parts.
/// Plain BLAKE3 in the end, what `b3sum` prints.
#[derive(Debug)]
pub struct Pieces {
    tree: Tree,
    spans: Vec<(u64, u64)>,
}

/// One piece's part of a [`Pieces`] hash.
#[derive(Clone, Copy, Debug)]
pub struct PieceHash(ChainingValue);

impl Pieces {
    /// `len` bytes in pieces of at most `piece` bytes (rounded up to a power of two, at
    /// least BLAKE3's 1 KiB chunk).
    pub fn plan(len: u64, piece: u64) -> Self {
        let piece = piece.max(1024).next_power_of_two();
        let mut spans = Vec::new();
        let tree = plan(len, 0, piece, &mut spans);
        Self { tree, spans }
    }

    /// Each piece's offset and length, in order.
    pub fn spans(&self) -> &[(u64, u64)] {
        &self.spans
    }

    /// The hash of the piece at `offset`, `bytes` being all of it. A plan of one piece has
    /// its hash in [`Pieces::finish`] instead: the root is hashed otherwise.
    pub fn hash(offset: u64, bytes: &[u8]) -> PieceHash {
        // Only a plan of one piece has an empty one, and its hash is not used.
        if bytes.is_empty() {
            return PieceHash([0; 32]);
        }
        PieceHash(
            blake3::Hasher::new()
                .set_input_offset(offset)
                .update(bytes)
                .finalize_non_root(),
        )
    }

    /// The checksum, from every piece's hash in the order of [`Pieces::spans`]; `None` for a
    /// plan of one piece (hash its bytes with [`Checksum::of`]) or a wrong number of hashes.
    pub fn finish(&self, hashes: &[PieceHash]) -> Option<Checksum> {
        if hashes.len() != self.spans.len() {
            return None;
        }
        let Tree::Parent(left, right) = &self.tree else {
            return None;
        };
        let cvs: Vec<ChainingValue> = hashes.iter().map(|h| h.0).collect();
        let (l, r) = (merge(left, &cvs), merge(right, &cvs));
        Some(Checksum(
            *hazmat::merge_subtrees_root(&l, &r, hazmat::Mode::Hash).as_bytes(),
        ))
    }
}

/// Each piece's hash, the pieces shared out among `threads` threads.
fn hash_pieces(bytes: &[u8], spans: &[(u64, u64)], threads: usize) -> Vec<PieceHash> {
    let next = AtomicUsize::new(0);
    let hashes = Mutex::new(vec![PieceHash([0u8; 32]); spans.len()]);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&(offset, len)) = spans.get(i) else {
                        return;
                    };
                    let (start, end) = (offset as usize, (offset + len) as usize);
                    let h = Pieces::hash(offset, &bytes[start..end]);
                    hashes.lock().unwrap_or_else(PoisonError::into_inner)[i] = h;
                }
            });
        }
    });
    hashes.into_inner().unwrap_or_else(PoisonError::into_inner)
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
        let len = bytes.len() as u64;
        if threads < 2 || len <= 2 * PIECE {
            return Self(*blake3::hash(bytes).as_bytes());
        }
        let pieces = Pieces::plan(len, PIECE);
        let hashes = hash_pieces(bytes, pieces.spans(), threads);
        pieces
            .finish(&hashes)
            .unwrap_or_else(|| Self(*blake3::hash(bytes).as_bytes()))
    }

    /// The length and hash of what `file` holds, read by offset (its cursor stays where
    /// it is), the pieces of a large file on every core. A file that shrinks while it is
    /// read is an error; one that grows is hashed as long as it was.
    pub fn of_file(file: &File) -> io::Result<(u64, Self)> {
        let len = file.metadata()?.len();
        let threads = std::thread::available_parallelism()
            .map_or(1, std::num::NonZeroUsize::get)
            .min(MAX_THREADS);
        if threads < 2 || len <= 2 * PIECE {
            let mut hashing = Hashing::new();
            let mut buf = vec![0u8; 1 << 16];
            let mut at = 0u64;
            while at < len {
                let n = file.read_at(&mut buf, at)?;
                if n == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                let n = n.min(usize::try_from(len - at).unwrap_or(n));
                hashing.update(&buf[..n]);
                at += n as u64;
            }
            return Ok((len, hashing.finish()));
        }
        let pieces = Pieces::plan(len, PIECE);
        let spans = pieces.spans();
        let next = AtomicUsize::new(0);
        let found: Mutex<Vec<Option<io::Result<PieceHash>>>> =
            Mutex::new(spans.iter().map(|_| None).collect());
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    let mut buf = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&(offset, len)) = spans.get(i) else {
                            return;
                        };
                        buf.resize(usize::try_from(len).unwrap_or(0), 0);
                        let h = file
                            .read_exact_at(&mut buf, offset)
                            .map(|()| Pieces::hash(offset, &buf));
                        found.lock().unwrap_or_else(PoisonError::into_inner)[i] = Some(h);
                    }
                });
            }
        });
        let mut hashes = Vec::with_capacity(spans.len());
        for h in found.into_inner().unwrap_or_else(PoisonError::into_inner) {
            hashes.push(h.ok_or_else(|| io::Error::other("a piece of the file was not hashed"))??);
        }
        let sum = pieces
            .finish(&hashes)
            .ok_or_else(|| io::Error::other("the file's pieces did not make a hash"))?;
        Ok((len, sum))
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

    /// A file hashed by offset, small or in pieces on every core: plain BLAKE3 and its
    /// length.
    #[test]
    fn a_file_hashes_as_its_bytes() {
        use std::io::Write;
        for len in [0usize, 1, 70_000, (2 * PIECE + 12_345) as usize] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            let mut f = tempfile::tempfile().expect("temp file");
            f.write_all(&bytes).expect("write");
            let (n, sum) = Checksum::of_file(&f).expect("hashed");
            assert_eq!(n, len as u64);
            assert_eq!(sum.0, *blake3::hash(&bytes).as_bytes(), "{len} bytes");
        }
    }

    /// Hashed in pieces on several threads, or piece by piece in any order, any length
    /// gives plain BLAKE3.
    #[test]
    fn the_hash_in_pieces_is_blake3() {
        let piece = PIECE as usize;
        let data: Vec<u8> = (0..(3 * piece + 12_345))
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        for len in [
            0,
            1,
            1024,
            1025,
            2 * piece,
            2 * piece + 1,
            3 * piece - 1,
            3 * piece + 12_345,
        ] {
            let bytes = &data[..len];
            let want = *blake3::hash(bytes).as_bytes();
            assert_eq!(Checksum::of(bytes).0, want, "{len} bytes");
            for size in [1024, 4096, 1 << 20, 3 << 20] {
                let pieces = Pieces::plan(len as u64, size);
                let spans = pieces.spans();
                assert_eq!(
                    spans.iter().map(|(_, n)| n).sum::<u64>(),
                    len as u64,
                    "{len} bytes in pieces of {size}: every byte once"
                );
                // Hashed last piece first, as a download's parts may finish.
                let mut hashes = vec![PieceHash([0; 32]); spans.len()];
                for (i, &(offset, n)) in spans.iter().enumerate().rev() {
                    let (start, end) = (offset as usize, (offset + n) as usize);
                    hashes[i] = Pieces::hash(offset, &bytes[start..end]);
                }
                match pieces.finish(&hashes) {
                    Some(c) => assert_eq!(c.0, want, "{len} bytes in pieces of {size}"),
                    None => assert_eq!(spans.len(), 1, "{len} bytes in pieces of {size}"),
                }
                assert_eq!(pieces.finish(&hashes[1..]), None, "a hash missing");
            }
            if len > 2 * piece {
                let pieces = Pieces::plan(len as u64, PIECE);
                let hashes = hash_pieces(bytes, pieces.spans(), 3);
                assert_eq!(pieces.finish(&hashes).map(|c| c.0), Some(want), "3 threads");
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
