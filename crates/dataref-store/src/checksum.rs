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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PieceHash(ChainingValue);

impl PieceHash {
    /// Its 32 bytes, as kept beside a table's object (see [`Pieces::outboard`]).
    pub fn to_bytes(self) -> [u8; 32] {
        self.0
    }

    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }
}

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

impl Pieces {
    /// Every piece's hash of `bytes`, in pieces of `piece` bytes (as [`Pieces::plan`] rounds
    /// it), hashed on every core: kept beside a table's bytes, they let a reader check any
    /// piece it fetched alone, once [`Pieces::finish`] of them gave the table's checksum.
    pub fn outboard(bytes: &[u8], piece: u64) -> (Self, Vec<PieceHash>) {
        let pieces = Self::plan(bytes.len() as u64, piece);
        let hashes = hash_slices(bytes, pieces.spans(), threads());
        (pieces, hashes)
    }
}

/// Each piece's hash, the pieces shared out among `threads` threads, each hashing with
/// what `start` makes it (a buffer of its own, say); the first error stops them all.
fn hash_pieces<E: Send, H>(
    spans: &[(u64, u64)],
    threads: usize,
    start: impl Fn() -> H + Sync,
) -> Result<Vec<PieceHash>, E>
where
    H: FnMut(u64, u64) -> Result<PieceHash, E>,
{
    let next = AtomicUsize::new(0);
    let hashes = Mutex::new(vec![PieceHash([0u8; 32]); spans.len()]);
    let failed = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let mut hash = start();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&(offset, len)) = spans.get(i) else {
                        return;
                    };
                    match hash(offset, len) {
                        Ok(h) => hashes.lock().unwrap_or_else(PoisonError::into_inner)[i] = h,
                        Err(e) => {
                            // Past the end: every thread stops at its next piece.
                            next.store(spans.len(), Ordering::Relaxed);
                            failed
                                .lock()
                                .unwrap_or_else(PoisonError::into_inner)
                                .get_or_insert(e);
                            return;
                        }
                    }
                }
            });
        }
    });
    match failed.into_inner().unwrap_or_else(PoisonError::into_inner) {
        Some(e) => Err(e),
        None => Ok(hashes.into_inner().unwrap_or_else(PoisonError::into_inner)),
    }
}

/// The pieces of `bytes` hashed on `threads` threads.
fn hash_slices(bytes: &[u8], spans: &[(u64, u64)], threads: usize) -> Vec<PieceHash> {
    let Ok(hashes) = hash_pieces::<std::convert::Infallible, _>(spans, threads, || {
        |offset, len| {
            let (start, end) = (offset as usize, (offset + len) as usize);
            Ok(Pieces::hash(offset, &bytes[start..end]))
        }
    });
    hashes
}

/// A table's content hash.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Checksum([u8; 32]);

const PREFIX: &str = "blake3:";

impl Checksum {
    /// The hash of `bytes` (plain BLAKE3, what `b3sum` prints), on every core for a large
    /// file: BLAKE3 is a tree, so pieces of it hash apart and their chaining values merge.
    pub fn of(bytes: &[u8]) -> Self {
        let threads = threads();
        let len = bytes.len() as u64;
        if threads < 2 || len <= 2 * PIECE {
            return Self(*blake3::hash(bytes).as_bytes());
        }
        let pieces = Pieces::plan(len, PIECE);
        let hashes = hash_slices(bytes, pieces.spans(), threads);
        pieces
            .finish(&hashes)
            .unwrap_or_else(|| Self(*blake3::hash(bytes).as_bytes()))
    }

    /// The length and hash of what `file` holds, read by offset (its cursor stays where
    /// it is), the pieces of a large file on every core. A file that shrinks while it is
    /// read is an error; one that grows is hashed as long as it was.
    pub fn of_file(file: &File) -> io::Result<(u64, Self)> {
        let len = file.metadata()?.len();
        let threads = threads();
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
        let hashes = hash_pieces(pieces.spans(), threads, || {
            let mut buf = Vec::new();
            move |offset, len| {
                buf.resize(usize::try_from(len).unwrap_or(0), 0);
                file.read_exact_at(&mut buf, offset)?;
                Ok::<_, io::Error>(Pieces::hash(offset, &buf))
            }
        })?;
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

/// The piece of a [`QuickCheck`]: each is hashed apart, so a check uses every core.
const QUICK_PIECE: usize = 4 << 20;

const QUICK_PREFIX: &str = "xxh3-4m:";

/// A table's quick check: XXH3-128 over the XXH3-128 (little-endian) of each 4 MiB piece
/// of the file (one empty piece for an empty file). Computed beside the [`Checksum`] as
/// the file is written and kept in the index with it.
///
/// It is what a process checks the first time it maps a file, where the cost is paid by
/// the call that reads the table: at memory speed on two cores where BLAKE3 takes about
/// three times as long. Like btrfs's xxhash and ZFS's fletcher4, it finds damage (a
/// flipped bit, a torn or truncated write, another table's bytes) with a chance of
/// missing it of about 2⁻¹²⁸; it does not stand against someone forging bytes, who could
/// rewrite the index as easily. `dataref store verify` and downloads check the BLAKE3.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct QuickCheck(u128);

impl QuickCheck {
    /// The check of `bytes`, its pieces hashed on every core.
    pub fn of(bytes: &[u8]) -> Self {
        let pieces: Vec<&[u8]> = if bytes.is_empty() {
            vec![bytes]
        } else {
            bytes.chunks(QUICK_PIECE).collect()
        };
        let threads = threads().min(pieces.len());
        let mut digests = vec![[0u8; 16]; pieces.len()];
        if threads < 2 {
            for (d, piece) in digests.iter_mut().zip(&pieces) {
                *d = twox_hash::XxHash3_128::oneshot(piece).to_le_bytes();
            }
        } else {
            // Contiguous runs of pieces, one per thread: each streams through its own part.
            let per = pieces.len().div_ceil(threads);
            std::thread::scope(|s| {
                for (ds, ps) in digests.chunks_mut(per).zip(pieces.chunks(per)) {
                    s.spawn(move || {
                        for (d, piece) in ds.iter_mut().zip(ps) {
                            *d = twox_hash::XxHash3_128::oneshot(piece).to_le_bytes();
                        }
                    });
                }
            });
        }
        Self(twox_hash::XxHash3_128::oneshot(digests.as_flattened()))
    }

    /// Parses the index's text form.
    pub fn parse(s: &str) -> Option<Self> {
        let hex = s.strip_prefix(QUICK_PREFIX)?;
        if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u128::from_str_radix(hex, 16).ok().map(Self)
    }

    /// `Ok` when this check (of bytes found) is `expected` (the one written); else what a
    /// damage message says.
    pub fn matches(&self, expected: &QuickCheck) -> Result<(), String> {
        if self == expected {
            Ok(())
        } else {
            Err(format!(
                "its bytes check to {:08x} where {:08x} was written",
                self.0 >> 96,
                expected.0 >> 96
            ))
        }
    }
}

impl fmt::Display for QuickCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{QUICK_PREFIX}{:032x}", self.0)
    }
}

impl fmt::Debug for QuickCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A [`QuickCheck`] being computed from the bytes as they are written.
#[derive(Default)]
struct QuickHashing {
    piece: twox_hash::XxHash3_128,
    /// Bytes in `piece` so far.
    filled: usize,
    digests: Vec<u8>,
}

impl QuickHashing {
    fn update(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let n = bytes.len().min(QUICK_PIECE - self.filled);
            self.piece.write(&bytes[..n]);
            self.filled += n;
            bytes = &bytes[n..];
            if self.filled == QUICK_PIECE {
                let piece = std::mem::take(&mut self.piece);
                self.digests
                    .extend_from_slice(&piece.finish_128().to_le_bytes());
                self.filled = 0;
            }
        }
    }

    fn finish(&self) -> QuickCheck {
        let mut digests = self.digests.clone();
        if self.filled > 0 || digests.is_empty() {
            digests.extend_from_slice(&self.piece.finish_128().to_le_bytes());
        }
        QuickCheck(twox_hash::XxHash3_128::oneshot(&digests))
    }
}

/// The threads one hash may use.
fn threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, std::num::NonZeroUsize::get)
        .min(MAX_THREADS)
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

/// A written file's [`Checksum`] and [`QuickCheck`], both computed from the bytes as they
/// go out.
#[derive(Default)]
pub struct Sums {
    hash: Hashing,
    quick: QuickHashing,
}

impl Sums {
    pub fn update(&mut self, bytes: &[u8]) {
        self.hash.update(bytes);
        self.quick.update(bytes);
    }

    pub fn finish(&self) -> (Checksum, QuickCheck) {
        (self.hash.finish(), self.quick.finish())
    }
}

impl fmt::Debug for Sums {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sums").finish_non_exhaustive()
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

    /// A piece that fails is the answer: a file that shrinks while it is hashed is an
    /// error, not a hash of zeros.
    #[test]
    fn a_failing_piece_is_the_answer() {
        let spans: Vec<(u64, u64)> = (0..64).map(|i| (i * 1024, 1024)).collect();
        let got = hash_pieces(&spans, 3, || {
            |offset, _| {
                if offset == 5 * 1024 {
                    Err(format!("piece at {offset}"))
                } else {
                    Ok(PieceHash([1; 32]))
                }
            }
        });
        assert_eq!(got.unwrap_err(), "piece at 5120");
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
                let hashes = hash_slices(bytes, pieces.spans(), 3);
                assert_eq!(pieces.finish(&hashes).map(|c| c.0), Some(want), "3 threads");
            }
        }
    }

    /// The quick check of any length: the same on every core as piece by piece, the same
    /// however the bytes arrive while written, and changed by any one flipped bit.
    #[test]
    fn the_quick_check_is_the_same_however_computed() {
        let data: Vec<u8> = (0..(2 * QUICK_PIECE + 4321))
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        for len in [
            0,
            1,
            QUICK_PIECE - 1,
            QUICK_PIECE,
            QUICK_PIECE + 1,
            2 * QUICK_PIECE,
            2 * QUICK_PIECE + 4321,
        ] {
            let bytes = &data[..len];
            let digests: Vec<u8> = if bytes.is_empty() {
                twox_hash::XxHash3_128::oneshot(&[]).to_le_bytes().to_vec()
            } else {
                bytes
                    .chunks(QUICK_PIECE)
                    .flat_map(|p| twox_hash::XxHash3_128::oneshot(p).to_le_bytes())
                    .collect()
            };
            let want = QuickCheck(twox_hash::XxHash3_128::oneshot(&digests));
            assert_eq!(QuickCheck::of(bytes), want, "{len} bytes");
            for write in [1usize, 7, 65_536, 3 << 20] {
                let mut sums = Sums::default();
                for part in bytes.chunks(write) {
                    sums.update(part);
                }
                let (hash, quick) = sums.finish();
                assert_eq!(quick, want, "{len} bytes written {write} at a time");
                assert_eq!(hash.0, *blake3::hash(bytes).as_bytes(), "{len} bytes");
            }
            if len > 0 {
                for at in [0, len / 2, len - 1] {
                    let mut bad = bytes.to_vec();
                    bad[at] ^= 0x01;
                    assert!(QuickCheck::of(&bad).matches(&want).is_err(), "{len}: {at}");
                }
                assert_ne!(QuickCheck::of(&bytes[..len - 1]), want, "{len}: shorter");
            }
        }
        let c = QuickCheck::of(b"some table");
        let text = c.to_string();
        assert!(
            text.starts_with("xxh3-4m:") && text.len() == 8 + 32,
            "{text}"
        );
        assert_eq!(QuickCheck::parse(&text), Some(c));
        for bad in [
            "",
            "xxh3-4m:",
            &text[8..],
            &text[..text.len() - 1],
            &format!("{}g", &text[..text.len() - 1]),
            &format!("xxh3-4m:+{}", &text[9..]),
        ] {
            assert_eq!(QuickCheck::parse(bad), None, "{bad}");
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
