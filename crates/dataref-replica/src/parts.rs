//! Tables fetched in parts: a query that reads a few columns of a table this replica does
//! not have fetches only the pieces those columns' bytes lie in.
//!
//! Beside each table's object the writer keeps `<ref>.arrow.b3`: the BLAKE3 chaining value
//! of every 64 KiB piece of it. A reader fetches that first and checks that the values
//! merge into the table's checksum in the index, so each of them is as good as the
//! checksum; then every piece it fetches (ranged GETs of runs of pieces) is hashed and
//! compared with its value before a byte of it is written. A table without the list (one
//! written before it, or whose list was lost or is wrong) is read whole, as before.
//!
//! The pieces go into a sparse file of the table's length in the cache,
//! `<ref>.arrow.<n>.part`, counted in the cache's bound as they arrive and evicted like
//! any other file. Which pieces are there is known to this process only; a new process
//! removes what an old one left.

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use bytes::Bytes;
use dataref_store::{ArtifactMeta, Parts, PieceHash, Pieces, StoreError};
use object_store::path::Path;

use crate::Backend;
use crate::cache::PART_SUFFIX;
use crate::error::SharedError;
use crate::objects::{Shortfall, create_sized};

/// The piece each chaining value covers: what a read of a column fetches beyond its bytes
/// at most, at each end of each run.
pub(crate) const PIECE: u64 = 64 << 10;
/// Tables smaller than this are read whole: a few requests would save next to nothing.
pub(crate) const PARTS_MIN: u64 = 4 << 20;
/// The most pieces one ranged GET asks for (8 MiB).
const RUN_PIECES: usize = 128;
/// Ranged GETs in flight at once for one fetch.
const RUNS_IN_FLIGHT: usize = 4;

/// The key (under `artifacts/`) of the chaining values of the object `name`.
pub(crate) fn outboard_name(name: &str) -> String {
    format!("{name}.b3")
}

/// The chaining values of `bytes` (a table's whole file), as kept beside its object.
pub(crate) fn outboard(bytes: &[u8]) -> Bytes {
    let (_, hashes) = Pieces::outboard(bytes, PIECE);
    hashes.iter().flat_map(|h| h.to_bytes()).collect()
}

/// This replica's tables being fetched in parts, by the name of their object.
#[derive(Debug, Default)]
pub(crate) struct PartFiles(Mutex<HashMap<String, Arc<PartFile>>>);

impl PartFiles {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<PartFile>>> {
        // Every change is one insert or removal.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The file of `name` being filled, if there is one still in the cache; those the
    /// cache evicted are let go here (their readers keep them until they are done).
    pub(crate) fn current(&self, backend: &Backend, name: &str) -> Option<Arc<PartFile>> {
        let mut map = self.lock();
        map.retain(|_, p| backend.cache.holds(&p.name));
        map.get(name).cloned()
    }

    /// Keeps `part` as the file of `name`, unless another reader made one meanwhile (then
    /// `part`'s file goes, and that one is used).
    pub(crate) fn keep(&self, backend: &Backend, name: &str, part: PartFile) -> Arc<PartFile> {
        let mut map = self.lock();
        if let Some(other) = map.get(name) {
            backend.cache.forget(&part.name);
            return other.clone();
        }
        let part = Arc::new(part);
        map.insert(name.to_owned(), part.clone());
        part
    }

    /// Lets go of the file of `name` (the whole table is here now, or gone).
    pub(crate) fn forget(&self, backend: &Backend, name: &str) {
        if let Some(part) = self.lock().remove(name) {
            backend.cache.forget(&part.name);
        }
    }
}

/// One table's file, filled piece by piece.
#[derive(Debug)]
pub(crate) struct PartFile {
    data_ref: String,
    /// The object's key.
    key: Path,
    /// The file's name in the cache.
    name: String,
    file: File,
    len: u64,
    hashes: Vec<PieceHash>,
    /// Which pieces are in the file; held through a whole fetch, so a piece is written
    /// once, before anyone is told it is there.
    present: Mutex<Vec<bool>>,
    backend: Weak<Backend>,
}

impl PartFile {
    /// A new, empty file for the table `meta` describes, whose object is `key`, if the
    /// chaining values kept beside it merge into its checksum; `None` when they cannot be
    /// had or do not (the table is then read whole).
    pub(crate) fn open(
        backend: &Arc<Backend>,
        meta: &ArtifactMeta,
        name: &str,
        key: Path,
    ) -> Result<Option<Self>, StoreError> {
        let Some(expected) = meta.checksum else {
            return Ok(None);
        };
        let pieces = Pieces::plan(meta.bytes, PIECE);
        let count = pieces.spans().len();
        let outboard_key = backend.objects.key(&format!(
            "{}/{}",
            crate::artifacts::ARTIFACTS,
            outboard_name(name)
        ));
        let objects = backend.objects.clone();
        let want = count as u64 * 32;
        let pause = backend.io.timeout();
        let got = backend
            .io
            .block("fetching an artifact's piece hashes", async move {
                objects.get_range(&outboard_key, 0..want, pause).await
            });
        // Missing, short or out of reach: the whole table is read (and checked) instead,
        // which says what is wrong if anything is.
        let got = match got {
            Ok(Some(got)) => got,
            Ok(None) => return Ok(None),
            Err(e) => {
                tracing::warn!(data_ref = %meta.data_ref, "cannot fetch an artifact's piece hashes; it is read whole: {e}");
                return Ok(None);
            }
        };
        let hashes: Vec<PieceHash> = got
            .chunks_exact(32)
            .filter_map(|c| c.try_into().ok().map(PieceHash::from_bytes))
            .collect();
        if pieces.finish(&hashes) != Some(expected) {
            tracing::warn!(data_ref = %meta.data_ref, "an artifact's piece hashes do not match its checksum; it is read whole");
            return Ok(None);
        }
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let part_name = format!(
            "{name}.{}-{}{PART_SUFFIX}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let file = create_sized(&backend.cache.path(&part_name), meta.bytes)?;
        backend.cache.grow(&part_name, 0, true);
        Ok(Some(Self {
            data_ref: meta.data_ref.as_str().to_owned(),
            key,
            name: part_name,
            file,
            len: meta.bytes,
            hashes,
            present: Mutex::new(vec![false; count]),
            backend: Arc::downgrade(backend),
        }))
    }

    fn span(&self, piece: usize) -> Range<u64> {
        let start = piece as u64 * PIECE;
        start..(start + PIECE).min(self.len)
    }

    fn damaged(&self, detail: String) -> StoreError {
        StoreError::Damaged {
            data_ref: self.data_ref.clone(),
            detail: format!("in the object store, {detail}"),
        }
    }
}

impl Parts for PartFile {
    fn file(&self) -> &File {
        &self.file
    }

    fn fetch(&self, ranges: &[Range<u64>]) -> Result<(), StoreError> {
        let mut present = self.present.lock().unwrap_or_else(PoisonError::into_inner);
        let mut wanted: Vec<usize> = Vec::new();
        for r in ranges {
            let end = r.end.min(self.len);
            if r.start >= end {
                continue;
            }
            let first = usize::try_from(r.start / PIECE).unwrap_or(usize::MAX);
            let last = usize::try_from((end - 1) / PIECE).unwrap_or(usize::MAX);
            wanted.extend((first..=last).filter(|&i| !present.get(i).copied().unwrap_or(true)));
        }
        wanted.sort_unstable();
        wanted.dedup();
        if wanted.is_empty() {
            return Ok(());
        }
        let Some(backend) = self.backend.upgrade() else {
            return Err(SharedError::Runtime("the shared store is closed".into()).into());
        };
        let mut again = false;
        loop {
            let runs = runs_of(&wanted);
            let bytes: u64 = wanted
                .iter()
                .map(|&i| self.span(i).end - self.span(i).start)
                .sum();
            let objects = backend.objects.clone();
            let key = self.key.clone();
            let spans: Vec<Range<u64>> = runs
                .iter()
                .map(|r| self.span(r.start).start..self.span(r.end - 1).end)
                .collect();
            let (pause, len) = (backend.io.timeout(), self.len);
            let fetched = backend.io.block_for(
                "fetching parts of an artifact",
                backend.io.transfer_budget(bytes),
                async move { fetch_runs(objects, key, spans, len, pause).await },
            )?;
            let fetched = match fetched {
                Ok(fetched) => fetched,
                Err(Shortfall::Missing) => {
                    return Err(self.damaged("its object is missing".into()));
                }
                Err(Shortfall::Short { found }) => {
                    return Err(self.damaged(format!(
                        "its object holds {found} bytes where {len} were written"
                    )));
                }
            };
            let mut bad = Vec::new();
            let mut added = 0;
            for (run, got) in runs.iter().zip(fetched) {
                let span = self.span(run.start).start..self.span(run.end - 1).end;
                for i in run.clone() {
                    let s = self.span(i);
                    let at = usize::try_from(s.start - span.start).unwrap_or(usize::MAX);
                    let n = usize::try_from(s.end - s.start).unwrap_or(usize::MAX);
                    let Some(piece) = got.get(at..at.saturating_add(n)) else {
                        bad.push(i);
                        continue;
                    };
                    if Pieces::hash(s.start, piece) != self.hashes[i] {
                        bad.push(i);
                        continue;
                    }
                    self.file.write_all_at(piece, s.start).map_err(|e| {
                        SharedError::Runtime(format!("writing a fetched part: {e}"))
                    })?;
                    present[i] = true;
                    added += n as u64;
                }
            }
            backend.cache.grow(&self.name, added, false);
            let Some(&first_bad) = bad.first() else {
                return Ok(());
            };
            let s = self.span(first_bad);
            if again {
                tracing::error!(data_ref = %self.data_ref, piece = ?s, "a part of a stored table is damaged; none of it is served");
                return Err(self.damaged(format!(
                    "its bytes {}..{} do not hash to what was written",
                    s.start, s.end
                )));
            }
            tracing::warn!(data_ref = %self.data_ref, piece = ?s, "a fetched part of a table did not match; fetching it again");
            again = true;
            wanted = bad;
        }
    }

    fn holds(&self, range: Range<u64>) -> bool {
        if range.start >= range.end {
            return true;
        }
        if range.end > self.len {
            return false;
        }
        let present = self.present.lock().unwrap_or_else(PoisonError::into_inner);
        let first = usize::try_from(range.start / PIECE).unwrap_or(usize::MAX);
        let last = usize::try_from((range.end - 1) / PIECE).unwrap_or(usize::MAX);
        (first..=last).all(|i| present.get(i).copied().unwrap_or(false))
    }
}

/// Sorted piece indices as runs of consecutive ones, each at most [`RUN_PIECES`] long.
fn runs_of(pieces: &[usize]) -> Vec<Range<usize>> {
    let mut runs: Vec<Range<usize>> = Vec::new();
    for &i in pieces {
        match runs.last_mut() {
            Some(r) if r.end == i && r.end - r.start < RUN_PIECES => r.end += 1,
            _ => runs.push(i..i + 1),
        }
    }
    runs
}

/// Each span of the object `key` (of a table of `len` bytes), [`RUNS_IN_FLIGHT`] ranged
/// GETs at a time. A span that fails or comes short is judged by what the object holds:
/// missing or short ([`Shortfall`]) is damage, anything else the store's error.
async fn fetch_runs(
    objects: Arc<crate::objects::Objects>,
    key: Path,
    spans: Vec<Range<u64>>,
    len: u64,
    pause: std::time::Duration,
) -> Result<Result<Vec<Bytes>, Shortfall>, SharedError> {
    let mut out = vec![Bytes::new(); spans.len()];
    let mut running = tokio::task::JoinSet::new();
    let mut next = 0;
    loop {
        while running.len() < RUNS_IN_FLIGHT
            && let Some(span) = spans.get(next)
        {
            let (objects, key, span, i) = (objects.clone(), key.clone(), span.clone(), next);
            running.spawn(async move { (i, objects.get_range(&key, span, pause).await) });
            next += 1;
        }
        let Some(done) = running.join_next().await else {
            break;
        };
        let (i, got) = done.map_err(|e| SharedError::Runtime(format!("fetching a part: {e}")))?;
        let whole = |b: &Bytes| b.len() as u64 == spans[i].end - spans[i].start;
        match got {
            Ok(Some(bytes)) if whole(&bytes) => out[i] = bytes,
            Ok(None) => return Ok(Err(Shortfall::Missing)),
            other => {
                return Ok(Err(objects
                    .shortfall(&key, len, pause, other.err())
                    .await?));
            }
        }
    }
    Ok(Ok(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_consecutive_and_bounded() {
        assert_eq!(runs_of(&[1, 2, 3, 7, 9, 10]), vec![1..4, 7..8, 9..11]);
        let long: Vec<usize> = (0..RUN_PIECES + 2).collect();
        assert_eq!(
            runs_of(&long),
            vec![0..RUN_PIECES, RUN_PIECES..RUN_PIECES + 2]
        );
        assert!(runs_of(&[]).is_empty());
    }
}
