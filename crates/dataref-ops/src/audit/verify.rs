//! [`verify`]: every file in order, every hash recomputed, `seq` and `prev` followed across
//! files; the first thing wrong named by file and line.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::line::{self, GENESIS};
use rustix::fs::{FlockOperation, flock};

use super::writer::{AuditError, LOCK, file_name, list, parse_head, read_head};

/// What [`verify`] found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verified {
    pub files: usize,
    /// Lines read up to the problem (all of them when none).
    pub lines: u64,
    /// The first and last `seq` read whole.
    pub first_seq: Option<u64>,
    pub last_seq: Option<u64>,
    /// The first line is the first ever (seq 1 after the genesis `prev`); `false` when
    /// older files were archived away (or there are no lines).
    pub from_genesis: bool,
    /// The writer's head (`audit.lock`: the last seq it wrote) was found and compared with
    /// the last line; `false` when there is no lock file (a copy of the trail elsewhere).
    pub head_checked: bool,
    /// The first thing wrong; `None`: the chain is whole.
    pub problem: Option<Problem>,
}

/// Where the chain breaks, and how.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// The file's name (for a missing file, the name it would have).
    pub file: String,
    /// 1-based; 0 for a missing file.
    pub line: u64,
    pub kind: ProblemKind,
    pub detail: String,
}

/// What is wrong at a [`Problem`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProblemKind {
    /// The line's bytes do not give its hash: it was changed after it was written.
    Edited,
    /// Lines before this one are gone (`seq` jumps, or `prev` is not the line before's).
    Removed,
    /// This line is out of order (the `seq` expected here comes later, or came before).
    Reordered,
    /// The file's last line has no newline: a write cut short (a crash), or a cut file.
    Torn,
    /// A file numbered between two others is gone.
    MissingFile,
    /// The files end before the writer's head: lines were cut off the end, or the newest
    /// file deleted (or, once the writer went on, a `trail_truncated` line names them).
    Truncated,
    /// Not a line of the trail at all.
    Malformed,
    /// The file could not be read.
    Unreadable,
}

impl ProblemKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Edited => "edited",
            Self::Removed => "removed",
            Self::Reordered => "reordered",
            Self::Torn => "torn",
            Self::MissingFile => "missing_file",
            Self::Truncated => "truncated",
            Self::Malformed => "malformed",
            Self::Unreadable => "unreadable",
        }
    }
}

/// The name of `path`'s file, for messages.
fn name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// What the trail was when [`verify`] started: its files with their sizes and the
/// writer's head, read together under a shared lock (no half-written line, no head ahead
/// of its line).
struct Snapshot {
    files: Vec<(u32, PathBuf)>,
    sizes: Vec<u64>,
    head: Option<Option<(u64, String)>>,
}

#[expect(
    clippy::disallowed_methods,
    reason = "the audit trail owns its directory, outside every workspace and the store"
)]
fn snapshot(dir: &Path) -> std::io::Result<Snapshot> {
    let lock = match std::fs::File::open(dir.join(LOCK)) {
        Ok(f) => Some(f),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    if let Some(l) = &lock {
        flock(l, FlockOperation::LockShared)?;
    }
    let taken = (|| {
        let files = list(dir)?;
        let mut sizes = Vec::with_capacity(files.len());
        for (_, path) in &files {
            sizes.push(std::fs::metadata(path).map_or(0, |m| m.len()));
        }
        let head = match &lock {
            Some(l) => Some(parse_head(&read_head(l)?)),
            None => None,
        };
        Ok(Snapshot { files, sizes, head })
    })();
    if let Some(l) = &lock {
        let _ = flock(l, FlockOperation::Unlock);
    }
    taken
}

/// Walks the trail in `dir`, as it was when the walk started (lines appended meanwhile are
/// left for the next walk), and compares its last line with the writer's head. `Err` only
/// when the directory cannot be listed; a file that cannot be read is a
/// [`ProblemKind::Unreadable`] problem.
pub fn verify(dir: &Path) -> Result<Verified, AuditError> {
    let Snapshot { files, sizes, head } = snapshot(dir).map_err(|source| AuditError::Dir {
        dir: dir.to_owned(),
        source,
    })?;
    let mut v = Verified {
        files: files.len(),
        lines: 0,
        first_seq: None,
        last_seq: None,
        from_genesis: false,
        head_checked: head.is_some(),
        problem: None,
    };
    let mut prev: Option<String> = None;
    for (i, (n, path)) in files.iter().enumerate() {
        if let Some((before, _)) = i.checked_sub(1).and_then(|j| files.get(j))
            && *n != before.saturating_add(1)
        {
            v.problem = Some(Problem {
                file: file_name(before.saturating_add(1)),
                line: 0,
                kind: ProblemKind::MissingFile,
                detail: format!(
                    "`{}` is missing between `{}` and `{}`",
                    file_name(before.saturating_add(1)),
                    file_name(*before),
                    name(path)
                ),
            });
            return Ok(v);
        }
        let problem = |line: u64, kind: ProblemKind, detail: String| Problem {
            file: name(path),
            line,
            kind,
            detail,
        };
        let size = sizes.get(i).copied().unwrap_or_default();
        let mut reader = match open(path) {
            Ok(f) => BufReader::new(f.take(size)),
            Err(e) => {
                v.problem = Some(problem(0, ProblemKind::Unreadable, e.to_string()));
                return Ok(v);
            }
        };
        let mut buf = Vec::new();
        let mut line_no = 0u64;
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    v.problem = Some(problem(line_no + 1, ProblemKind::Unreadable, e.to_string()));
                    return Ok(v);
                }
            }
            line_no += 1;
            let Some(text) = buf.strip_suffix(b"\n") else {
                v.problem = Some(problem(
                    line_no,
                    ProblemKind::Torn,
                    format!(
                        "the last line ({} bytes) has no newline: a write was cut short",
                        buf.len()
                    ),
                ));
                return Ok(v);
            };
            let p = match line::parse(text) {
                Ok(p) => p,
                Err(why) => {
                    v.problem = Some(problem(line_no, ProblemKind::Malformed, why));
                    return Ok(v);
                }
            };
            if p.computed != p.hash {
                v.problem = Some(problem(
                    line_no,
                    ProblemKind::Edited,
                    format!(
                        "line seq {} was changed after it was written: its bytes do not give its hash",
                        p.seq
                    ),
                ));
                return Ok(v);
            }
            if let Some((from, to)) = p.missing {
                v.problem = Some(problem(
                    line_no,
                    ProblemKind::Truncated,
                    format!(
                        "the writer found seq {from} to {to} missing when it went on (cut off \
                         the end of the trail, or its newest file deleted); this line \
                         (seq {}) says so",
                        p.seq
                    ),
                ));
                return Ok(v);
            }
            if let Some(expected) = v.last_seq.map(|s| s.saturating_add(1))
                && p.seq != expected
            {
                let (kind, detail) = out_of_order(&files, i, line_no, expected, p.seq);
                v.problem = Some(problem(line_no, kind, detail));
                return Ok(v);
            }
            match &prev {
                Some(before) if *before != p.prev => {
                    v.problem = Some(problem(
                        line_no,
                        ProblemKind::Removed,
                        format!(
                            "line seq {} does not chain to the line before: that line was \
                             replaced, or lines between were removed",
                            p.seq
                        ),
                    ));
                    return Ok(v);
                }
                Some(_) => {}
                None => v.from_genesis = p.seq == 1 && p.prev == GENESIS,
            }
            v.lines += 1;
            v.first_seq.get_or_insert(p.seq);
            v.last_seq = Some(p.seq);
            prev = Some(p.hash);
        }
    }
    if let Some(Some((head_seq, head_hash))) = head {
        let last = v.last_seq.unwrap_or_default();
        let file = files.last().map_or_else(|| file_name(1), |(_, p)| name(p));
        if head_seq > last {
            let gone = head_seq - last;
            v.problem = Some(Problem {
                file,
                line: 0,
                kind: ProblemKind::Truncated,
                detail: format!(
                    "the files end at seq {last} but the writer wrote up to seq {head_seq}: \
                     {gone} line{} cut off the end, or the newest file deleted",
                    if gone == 1 { " was" } else { "s were" }
                ),
            });
        } else if head_seq == last && prev.as_deref().is_some_and(|p| p != head_hash) {
            v.problem = Some(Problem {
                file,
                line: v.lines,
                kind: ProblemKind::Truncated,
                detail: format!(
                    "the last line (seq {last}) is not the one the writer wrote: the end \
                     of the trail was replaced"
                ),
            });
        }
    }
    Ok(v)
}

#[expect(
    clippy::disallowed_methods,
    reason = "the audit trail owns its directory, outside every workspace and the store"
)]
fn open(path: &PathBuf) -> std::io::Result<std::fs::File> {
    std::fs::File::open(path)
}

/// A line whose `seq` is `found` where `expected` was due: reordered when `expected` turns
/// up later on, else removed.
fn out_of_order(
    files: &[(u32, PathBuf)],
    from_file: usize,
    from_line: u64,
    expected: u64,
    found: u64,
) -> (ProblemKind, String) {
    if found < expected {
        return (
            ProblemKind::Reordered,
            format!(
                "seq {found} comes after seq {}: lines were moved",
                expected - 1
            ),
        );
    }
    if let Some((file, line)) = find_seq(files, from_file, from_line, expected) {
        return (
            ProblemKind::Reordered,
            format!(
                "seq {found} is where seq {expected} was due, which is at {file} line {line}: lines were moved"
            ),
        );
    }
    let gone = found - expected;
    (
        ProblemKind::Removed,
        format!(
            "seq jumps from {} to {found}: {gone} line{} removed",
            expected - 1,
            if gone == 1 { " was" } else { "s were" }
        ),
    )
}

/// Where a line with `seq` is, after `from_line` of `files[from_file]`.
fn find_seq(
    files: &[(u32, PathBuf)],
    from_file: usize,
    from_line: u64,
    seq: u64,
) -> Option<(String, u64)> {
    for (i, (_, path)) in files.iter().enumerate().skip(from_file) {
        let reader = BufReader::new(open(path).ok()?);
        for (n, l) in reader.split(b'\n').enumerate() {
            let n = n as u64 + 1;
            if i == from_file && n <= from_line {
                continue;
            }
            let Ok(l) = l else { break };
            if line::parse(&l).is_ok_and(|p| p.seq == seq) {
                return Some((name(path), n));
            }
        }
    }
    None
}

/// What [`verify_copy`] found of a copy of the trail kept elsewhere (the shared index's
/// `dataref_audit` rows of one trail).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CopyVerified {
    /// Lines in the copy.
    pub lines: u64,
    pub first_seq: Option<u64>,
    pub last_seq: Option<u64>,
    /// Seqs missing from the copy between its first and last (lines that could not be
    /// copied: dropped on the way and counted, the files keep them).
    pub gaps: u64,
    /// Lines found in both the copy and the files, byte for byte the same.
    pub matched: u64,
    /// The first thing wrong: a line of the copy that is not what it claims, or that the
    /// files do not hold as written. `file` is `copy`, `line` the seq.
    pub problem: Option<Problem>,
}

/// Checks a copy of the trail in `dir` (each line with the seq it is kept under, sorted
/// by seq): each line gives its hash and chains to the copy's line before, and each is in
/// the files as it was written. A line of the copy after the files' last, or one the files
/// lack between their first and last, is a problem: the files lost it.
pub fn verify_copy(dir: &Path, copy: &[(u64, String)]) -> Result<CopyVerified, AuditError> {
    let mut c = CopyVerified {
        lines: copy.len() as u64,
        first_seq: copy.first().map(|r| r.0),
        last_seq: copy.last().map(|r| r.0),
        gaps: 0,
        matched: 0,
        problem: None,
    };
    let problem = |seq: u64, kind: ProblemKind, detail: String| Problem {
        file: "copy".into(),
        line: seq,
        kind,
        detail,
    };
    // The copy on its own.
    let mut parsed = Vec::with_capacity(copy.len());
    let mut before: Option<(u64, String)> = None;
    for (seq, text) in copy {
        let p = match line::parse(text.as_bytes()) {
            Ok(p) if p.seq == *seq => p,
            Ok(p) => {
                c.problem = Some(problem(
                    *seq,
                    ProblemKind::Malformed,
                    format!("the line kept under seq {seq} says seq {}", p.seq),
                ));
                return Ok(c);
            }
            Err(why) => {
                c.problem = Some(problem(*seq, ProblemKind::Malformed, why));
                return Ok(c);
            }
        };
        if p.computed != p.hash {
            c.problem = Some(problem(
                *seq,
                ProblemKind::Edited,
                format!("the copy's line seq {seq} does not give its hash: it was changed"),
            ));
            return Ok(c);
        }
        match &before {
            Some((s, h)) if s + 1 == *seq && *h != p.prev => {
                c.problem = Some(problem(
                    *seq,
                    ProblemKind::Removed,
                    format!("the copy's line seq {seq} does not chain to seq {s}"),
                ));
                return Ok(c);
            }
            Some((s, _)) => c.gaps += seq.saturating_sub(s + 1),
            None => {}
        }
        before = Some((*seq, p.hash.clone()));
        parsed.push((*seq, p.hash));
    }
    // Against the files, both in seq order.
    let Snapshot { files, sizes, .. } = snapshot(dir).map_err(|source| AuditError::Dir {
        dir: dir.to_owned(),
        source,
    })?;
    let mut next = 0usize;
    let mut files_first: Option<u64> = None;
    let mut files_last: Option<u64> = None;
    for (i, (_, path)) in files.iter().enumerate() {
        let size = sizes.get(i).copied().unwrap_or_default();
        let Ok(f) = open(path) else { continue };
        for l in BufReader::new(f.take(size)).split(b'\n') {
            let Ok(p) = l.map_err(drop).and_then(|l| line::parse(&l).map_err(drop)) else {
                continue;
            };
            files_first.get_or_insert(p.seq);
            files_last = Some(p.seq);
            while let Some((seq, hash)) = parsed.get(next) {
                if *seq > p.seq {
                    break;
                }
                next += 1;
                if *seq == p.seq {
                    // The hash the file's bytes give: an edit with or without a new hash.
                    if *hash != p.computed {
                        c.problem = Some(problem(
                            *seq,
                            ProblemKind::Edited,
                            format!(
                                "seq {seq} differs between the copy and {}: one of them was \
                                 rewritten",
                                name(path)
                            ),
                        ));
                        return Ok(c);
                    }
                    c.matched += 1;
                } else if files_first.is_some_and(|f| *seq >= f) {
                    c.problem = Some(problem(
                        *seq,
                        ProblemKind::Removed,
                        format!(
                            "the copy holds seq {seq}, the files do not: it was removed from them"
                        ),
                    ));
                    return Ok(c);
                }
            }
        }
    }
    if let Some((seq, _)) = parsed.get(next) {
        let last = files_last.unwrap_or_default();
        c.problem = Some(problem(
            *seq,
            ProblemKind::Truncated,
            format!(
                "the copy goes on to seq {}, the files end at seq {last}: lines were cut off \
                 the end of the files",
                c.last_seq.unwrap_or_default()
            ),
        ));
    }
    Ok(c)
}
