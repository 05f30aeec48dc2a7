//! [`AuditLog`]: appends lines under a lock, rotates files, resumes the chain.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rustix::fs::{FlockOperation, flock};

use super::Event;
use super::line::{self, GENESIS};

/// `[audit] rotate`'s default: a file is closed before it would grow past 64 MiB.
pub const DEFAULT_ROTATE_BYTES: u64 = 64 << 20;

const PREFIX: &str = "audit-";
const SUFFIX: &str = ".jsonl";
pub(crate) const LOCK: &str = "audit.lock";
/// The trail's own id (32 hex digits, made once): names its chain in a copy kept
/// elsewhere, e.g. each replica's rows in the shared index.
const ID: &str = "audit.id";

/// `audit-000042.jsonl`: the name of the trail's file number `n` (sortable by name up to a
/// million files, and by number beyond).
pub fn file_name(n: u32) -> String {
    format!("{PREFIX}{n:06}{SUFFIX}")
}

/// The number of a trail file's name, `None` for any other name.
pub(crate) fn file_number(name: &str) -> Option<u32> {
    let digits = name.strip_prefix(PREFIX)?.strip_suffix(SUFFIX)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The trail's files in `dir`, by number.
#[expect(
    clippy::disallowed_methods,
    reason = "the audit trail owns its directory, outside every workspace and the store"
)]
pub(crate) fn list(dir: &Path) -> std::io::Result<Vec<(u32, PathBuf)>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if let Some(n) = entry.file_name().to_str().and_then(file_number) {
            files.push((n, entry.path()));
        }
    }
    files.sort_by_key(|(n, _)| *n);
    Ok(files)
}

/// Why the trail cannot be opened or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuditError {
    #[error("the audit directory `{dir}` cannot be used: {source}")]
    Dir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing the audit trail in `{dir}` failed: {source}")]
    Write {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl AuditError {
    pub fn hint(&self) -> &'static str {
        match self {
            Self::Dir { .. } => {
                "make the directory writable by this user, set `[audit] dir` to one that is, \
                 or turn the trail off with `[audit] enabled = false`"
            }
            Self::Write { .. } => "check the disk has room and the directory is writable",
        }
    }
}

/// The audit trail of one directory, appended to by this process. Appends are serialised
/// here and across processes (a lock on `audit.lock`), so the chain stays one line after
/// another however many threads and processes write.
pub struct AuditLog {
    dir: PathBuf,
    id: String,
    inner: Mutex<Writer>,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// The chain as this process last saw it on disk. Invariant (while the lock is held):
/// `seq`/`prev` are the last line's, `current` is the newest file when it can be appended
/// to, and its `len` is its size when this process last wrote or read it; a size that
/// differs means another process wrote, and the state is read again.
struct Writer {
    dir: PathBuf,
    /// `audit.lock`, held (flock) for each append, across processes; opened again when the
    /// file at its path is another (or gone), so every process locks the same one.
    lock: Arc<File>,
    rotate: u64,
    current: Option<Current>,
    /// The number the next new file gets.
    next_number: u32,
    seq: u64,
    prev: String,
    /// Set until the state has been read from disk (and after a failed write).
    stale: bool,
    /// Seqs the head in the lock file counts but the files no longer hold (cut off their
    /// end, or the newest file deleted): written as a `trail_truncated` line before the
    /// next event, never issued again.
    gap: Option<(u64, u64)>,
    /// The chain's end as this process last wrote or read it: a head of its own, for when
    /// the lock file's is gone with the lines (the directory removed and made again).
    known: (u64, String),
}

struct Current {
    file: File,
    len: u64,
}

impl AuditLog {
    /// Opens (creating it, mode 0700; its parents as usual) the trail in `dir`; a file is closed before it would
    /// grow past `rotate` bytes. The chain is picked up from the newest file's last line;
    /// after a torn last line (a crash in the middle of a write) the next line starts a
    /// new file.
    #[expect(
        clippy::disallowed_methods,
        reason = "the audit trail owns its directory, outside every workspace and the store"
    )]
    pub fn open(dir: &Path, rotate: u64) -> Result<Self, AuditError> {
        let err = |source| AuditError::Dir {
            dir: dir.to_owned(),
            source,
        };
        // Parents as any directory is made (the data dir must stay reachable by the
        // sandbox's user); the trail's own directory for this user only.
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(err)?;
        }
        match std::fs::DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(err(e)),
        }
        let lock = Arc::new(open_lock(dir).map_err(err)?);
        let mut writer = Writer {
            dir: dir.to_owned(),
            lock: lock.clone(),
            rotate: rotate.max(1),
            current: None,
            next_number: 1,
            seq: 0,
            prev: GENESIS.to_owned(),
            stale: true,
            gap: None,
            known: (0, GENESIS.to_owned()),
        };
        // The id is made under the lock too: a second process never reads a half-made one.
        let id = {
            let _held = Held::take(&lock).map_err(err)?;
            writer.resync(&lock).map_err(err)?;
            trail_id(dir).map_err(err)?
        };
        Ok(Self {
            dir: dir.to_owned(),
            id,
            inner: Mutex::new(writer),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// This trail's id: 32 hex digits made when its directory was first used, the same for
    /// every process writing it.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Appends one line for `event` (under the process's and the directory's lock); the
    /// line as written on success.
    pub fn append(&self, event: &Event) -> Result<Written, AuditError> {
        self.append_noting(event, |_| {})
    }

    /// [`append`](Self::append), handing `noted` each line the log writes of its own
    /// first (a `trail_truncated` line), so a copy kept elsewhere gets it too.
    pub fn append_noting(
        &self,
        event: &Event,
        noted: impl FnOnce(Written),
    ) -> Result<Written, AuditError> {
        let fields = line::fields_fragment(event);
        let err = |source| AuditError::Write {
            dir: self.dir.clone(),
            source,
        };
        let mut w = self.lock();
        let lock = w.current_lock().map_err(err)?;
        let _held = Held::take(&lock).map_err(err)?;
        let written = w.append(&lock, event, &fields, noted);
        if written.is_err() {
            // Whatever failed, the next append reads the state from the files first.
            w.stale = true;
        }
        written.map_err(err)
    }

    fn lock(&self) -> MutexGuard<'_, Writer> {
        // The writer's state is re-read from disk after any failure (`stale`): a panic
        // half way leaves nothing that cannot be recovered.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A line as written: what a copy kept elsewhere (the shared index) needs of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    pub seq: u64,
    pub at: String,
    pub principal: String,
    pub event: &'static str,
    /// The line's exact text, without its newline: its hash can be checked from it alone.
    pub line: String,
    pub prev: String,
    pub hash: String,
}

/// The cross-process lock, released when dropped.
struct Held<'a>(&'a File);

impl<'a> Held<'a> {
    fn take(file: &'a File) -> std::io::Result<Self> {
        flock(file, FlockOperation::LockExclusive)?;
        Ok(Self(file))
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        // Closing the file would release it too; an unlock that fails leaves it to that.
        let _ = flock(self.0, FlockOperation::Unlock);
    }
}

/// Opens (creating it) the directory's lock file.
#[expect(
    clippy::disallowed_methods,
    reason = "the audit trail owns its directory, outside every workspace and the store"
)]
fn open_lock(dir: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .mode(0o600)
        .open(dir.join(LOCK))
}

impl Writer {
    /// The lock file to take: the one open, or, when the file at its path is another one
    /// or gone (the directory removed and made again), that path's, opened afresh.
    #[expect(
        clippy::disallowed_methods,
        reason = "the audit trail owns its directory, outside every workspace and the store"
    )]
    fn current_lock(&mut self) -> std::io::Result<Arc<File>> {
        let same = match std::fs::symlink_metadata(self.dir.join(LOCK)) {
            Ok(on_disk) => {
                let open = self.lock.metadata()?;
                on_disk.dev() == open.dev() && on_disk.ino() == open.ino()
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(e),
        };
        if !same {
            self.lock = Arc::new(open_lock(&self.dir)?);
            self.stale = true;
        }
        Ok(self.lock.clone())
    }

    /// Appends under the directory's lock, held by the caller.
    fn append(
        &mut self,
        lock: &File,
        event: &Event,
        fields: &str,
        noted: impl FnOnce(Written),
    ) -> std::io::Result<Written> {
        // Another process wrote since this one last did when the head in the lock file is
        // not this one's (a rotation leaves the old file's size alone), the file grew, or
        // a file numbered next exists (a process that started it crashed before its head).
        let moved = match &self.current {
            Some(c) => {
                read_head(lock)? != self.head()
                    || c.file.metadata()?.len() != c.len
                    || self.next_file_exists()
            }
            None => true,
        };
        if self.stale || moved {
            self.resync(lock)?;
        }
        if let Some((from, to)) = self.gap {
            let missing = Event::new("trail_truncated", "")
                .with("missing_from", from)
                .with("missing_to", to)
                .with("files_end_at", from.saturating_sub(1));
            let missing_fields = line::fields_fragment(&missing);
            let written = self.write_line(lock, &missing, &missing_fields)?;
            self.gap = None;
            noted(written);
        }
        self.write_line(lock, event, fields)
    }

    /// Whether the file numbered next exists already.
    #[expect(
        clippy::disallowed_methods,
        reason = "the audit trail owns its directory, outside every workspace and the store"
    )]
    fn next_file_exists(&self) -> bool {
        std::fs::symlink_metadata(self.dir.join(file_name(self.next_number))).is_ok()
    }

    /// Writes one line after the chain's last (the state read, the lock held).
    fn write_line(&mut self, lock: &File, event: &Event, fields: &str) -> std::io::Result<Written> {
        let seq = self.seq + 1;
        let at = line::rfc3339_millis(line::now_millis());
        let (text, hash) = line::build(seq, &at, event, fields, &self.prev);
        let len = text.len() as u64;
        let full = self
            .current
            .as_ref()
            .is_some_and(|c| c.len > 0 && c.len.saturating_add(len) > self.rotate);
        if full || self.current.is_none() {
            self.current = Some(self.new_file()?);
        }
        let Some(current) = self.current.as_mut() else {
            return Err(std::io::Error::other("no audit file is open"));
        };
        // One write of the whole line with O_APPEND: no other writer's bytes can land
        // inside it.
        current.file.write_all(text.as_bytes())?;
        current.len += len;
        self.seq = seq;
        let prev = std::mem::replace(&mut self.prev, hash.clone());
        self.known = (seq, hash.clone());
        // The line is written: a head that fails to update only makes the next writer read
        // the state from the files.
        let _ = lock.write_at(&self.head(), 0);
        let mut line = text;
        line.pop();
        Ok(Written {
            seq,
            at,
            principal: event.principal.clone(),
            event: event.kind,
            line,
            prev,
            hash,
        })
    }

    /// What the lock file holds after this process's last append: the chain's last seq
    /// and hash, fixed width.
    fn head(&self) -> [u8; HEAD_LEN] {
        let mut h = [b' '; HEAD_LEN];
        let text = format!("{:020} {}", self.seq, self.prev);
        for (d, s) in h.iter_mut().zip(text.bytes()) {
            *d = s;
        }
        h
    }

    #[expect(
        clippy::disallowed_methods,
        reason = "the audit trail owns its directory, outside every workspace and the store"
    )]
    fn new_file(&mut self) -> std::io::Result<Current> {
        let file = std::fs::OpenOptions::new()
            .append(true)
            .create_new(true)
            .mode(0o600)
            .open(self.dir.join(file_name(self.next_number)))?;
        self.next_number = self.next_number.saturating_add(1);
        Ok(Current { file, len: 0 })
    }

    /// Reads the chain's state from the files (under the lock).
    #[expect(
        clippy::disallowed_methods,
        reason = "the audit trail owns its directory, outside every workspace and the store"
    )]
    fn resync(&mut self, lock: &File) -> std::io::Result<()> {
        let known = self.known.clone();
        let files = list(&self.dir)?;
        self.current = None;
        self.seq = 0;
        self.prev = GENESIS.to_owned();
        self.next_number = files.last().map_or(1, |(n, _)| n.saturating_add(1));
        for (i, (_, path)) in files.iter().enumerate().rev() {
            let mut file = std::fs::OpenOptions::new()
                .read(true)
                .append(true)
                .open(path)?;
            let tail = last_line(&mut file)?;
            let newest = i + 1 == files.len();
            if newest && tail.clean {
                let len = file.metadata()?.len();
                self.current = Some(Current { file, len });
            }
            if let Some((seq, hash)) = tail.last {
                self.seq = seq;
                self.prev = hash;
                break;
            }
        }
        // The head is ahead of the files: lines were cut off the end, or the newest file
        // deleted. Their seqs are never issued again: the chain goes on from the head, in
        // a new file, after a line naming what is missing.
        self.gap = None;
        let head = match parse_head(&read_head(lock)?) {
            Some(h) if h.0 >= known.0 => Some(h),
            _ if known.0 > 0 => Some(known),
            other => other,
        };
        if let Some((seq, hash)) = head
            && seq > self.seq
        {
            tracing::error!(
                files_end_at = self.seq,
                head = seq,
                "the audit trail's files end before its head: lines were removed"
            );
            self.gap = Some((self.seq + 1, seq));
            self.seq = seq;
            self.prev = hash;
            self.current = None;
        }
        self.known = (self.seq, self.prev.clone());
        self.stale = false;
        Ok(())
    }
}

/// The id in `dir/audit.id`, made (from the system's random source) when there is none.
#[expect(
    clippy::disallowed_methods,
    reason = "the audit trail owns its directory, outside every workspace and the store"
)]
fn trail_id(dir: &Path) -> std::io::Result<String> {
    let path = dir.join(ID);
    let valid = |s: &str| s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit());
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| std::io::Error::other(e.to_string()))?;
    let made: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
    {
        Ok(mut f) => {
            f.write_all(made.as_bytes())?;
            f.sync_all()?;
            Ok(made)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let text = std::fs::read_to_string(&path)?;
            let id = text.trim();
            if valid(id) {
                Ok(id.to_owned())
            } else {
                Err(std::io::Error::other(format!(
                    "`{}` does not hold a trail id (32 hex digits)",
                    path.display()
                )))
            }
        }
        Err(e) => Err(e),
    }
}

/// The id of the trail in `dir` (its `audit.id`), without making one: `None` when there is
/// none (nothing was ever written there).
#[expect(
    clippy::disallowed_methods,
    reason = "the audit trail owns its directory, outside every workspace and the store"
)]
pub fn trail_id_in(dir: &Path) -> std::io::Result<Option<String>> {
    match std::fs::read_to_string(dir.join(ID)) {
        Ok(text) => Ok(Some(text.trim().to_owned())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The lock file's head: a 20-digit seq, a space, a 64-digit hash.
pub(crate) const HEAD_LEN: usize = 85;

/// The seq and hash a head holds; `None` for an empty or unreadable one (a lock file no
/// line was ever written under).
pub(crate) fn parse_head(h: &[u8; HEAD_LEN]) -> Option<(u64, String)> {
    let (digits, rest) = h.split_at(20);
    let hash = rest.strip_prefix(b" ")?;
    if !digits.iter().all(u8::is_ascii_digit) || !hash.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    let seq = std::str::from_utf8(digits).ok()?.parse().ok()?;
    let hash = std::str::from_utf8(hash).ok()?.to_owned();
    Some((seq, hash))
}

pub(crate) fn read_head(lock: &File) -> std::io::Result<[u8; HEAD_LEN]> {
    let mut h = [0u8; HEAD_LEN];
    let mut got = 0;
    while got < HEAD_LEN {
        match lock.read_at(&mut h[got..], got as u64)? {
            0 => break,
            n => got += n,
        }
    }
    Ok(h)
}

/// What the end of a file says.
struct Tail {
    /// The last line that reads as a line of the trail: its seq and hash.
    last: Option<(u64, String)>,
    /// Empty, or ending in a newline after a line of the trail: safe to append to.
    clean: bool,
}

/// Reads `file` backwards from its end, a chunk at a time, for its last line.
fn last_line(file: &mut File) -> std::io::Result<Tail> {
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(Tail {
            last: None,
            clean: true,
        });
    }
    let mut chunk: u64 = 64 << 10;
    loop {
        let start = len.saturating_sub(chunk);
        file.seek(SeekFrom::Start(start))?;
        let mut buf = Vec::new();
        Read::by_ref(file).take(len - start).read_to_end(&mut buf)?;
        let ends_clean = buf.last() == Some(&b'\n');
        // The last complete line ends at the last newline.
        let Some(end) = buf.iter().rposition(|&b| b == b'\n') else {
            if start == 0 {
                return Ok(Tail {
                    last: None,
                    clean: false,
                });
            }
            chunk = chunk.saturating_mul(4);
            continue;
        };
        let begin = match buf[..end].iter().rposition(|&b| b == b'\n') {
            Some(p) => p + 1,
            None if start == 0 => 0,
            None => {
                chunk = chunk.saturating_mul(4);
                continue;
            }
        };
        if let Ok(p) = line::parse(&buf[begin..end]) {
            return Ok(Tail {
                last: Some((p.seq, p.hash)),
                clean: ends_clean,
            });
        }
        // A damaged last line: the chain goes on from the last line that reads, in a new
        // file (verify reports the damage).
        file.seek(SeekFrom::Start(0))?;
        let mut all = Vec::new();
        file.read_to_end(&mut all)?;
        let last = all
            .split(|&b| b == b'\n')
            .rev()
            .find_map(|l| line::parse(l).ok())
            .map(|p| (p.seq, p.hash));
        return Ok(Tail { last, clean: false });
    }
}
