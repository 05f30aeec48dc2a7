//! Workspace files shared by every replica: rows in `dataref_files` (principal, path →
//! version, hash, size, time), contents in the bucket under `files/<version>`, and each
//! replica's local workspace directory kept equal to them by `dataref-workspace`.
//!
//! A publish uploads the content under a new random version (create-only), then writes the
//! row in one transaction that also decides `Refuse` and charges the principal's quota
//! (one principal's publishes serialised across replicas by an advisory lock). The object
//! a replaced or removed row named is left in place for readers still fetching it; the
//! orphan sweep removes it once it is old.

use std::fs::File;
use std::io::Write;
use std::sync::Arc;

use bytes::Bytes;
use dataref_protocol::{Principal, Timestamp};
use dataref_workspace::{Mirror, MirrorError, Overwrite, Remote};
use futures_util::StreamExt;
use object_store::ObjectStoreExt;

use crate::Backend;
use crate::error::SharedError;
use crate::objects::{Put, map_for_upload};

pub(crate) const FILES: &str = "files";

/// Seeds the per-principal advisory lock of workspace quota checks.
const QUOTA_LOCK_SEED: i64 = 0x0f11_e50a;

/// One principal's workspace in the shared index and bucket.
#[derive(Debug, Clone)]
pub struct SharedFiles {
    backend: Arc<Backend>,
    principal: Principal,
    /// The principal's workspace quota, across replicas.
    quota: u64,
}

impl SharedFiles {
    pub(crate) fn new(backend: Arc<Backend>, principal: Principal, quota: u64) -> Self {
        Self {
            backend,
            principal,
            quota,
        }
    }
}

fn unavailable(e: SharedError) -> MirrorError {
    if e.is_unavailable() {
        MirrorError::Unavailable {
            detail: e.to_string(),
        }
    } else {
        MirrorError::Io(std::io::Error::other(e.to_string()))
    }
}

/// Whether `name` can be a version [`new_version`] made: 32 lowercase hex digits.
pub(crate) fn is_version(name: &str) -> bool {
    name.len() == 32 && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A new version: 128 random bits, hex.
fn new_version() -> Result<String, MirrorError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| MirrorError::Io(std::io::Error::other(format!("getrandom: {e}"))))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// `under` and everything beneath it, as a range of the `C`-collated path column:
/// `path = under OR under/ <= path < under0` (`0` follows `/` in ASCII).
fn range(under: &str) -> (String, String, String) {
    (under.to_owned(), format!("{under}/"), format!("{under}0"))
}

fn read_remote(row: &tokio_postgres::Row) -> Result<Remote, SharedError> {
    let bad = |e: tokio_postgres::Error| SharedError::Index(e.to_string());
    let sha: Vec<u8> = row.try_get("sha256").map_err(bad)?;
    let sha256: [u8; 32] = sha
        .try_into()
        .map_err(|_| SharedError::Index("a file row's sha256 is not 32 bytes".into()))?;
    let bytes: i64 = row.try_get("bytes").map_err(bad)?;
    Ok(Remote {
        path: row.try_get("path").map_err(bad)?,
        version: row.try_get("version").map_err(bad)?,
        sha256,
        bytes: u64::try_from(bytes)
            .map_err(|_| SharedError::Index("a file row's size is negative".into()))?,
        modified: Timestamp(row.try_get("modified").map_err(bad)?),
    })
}

/// What a publish's transaction decided.
enum Decided {
    Stored(Remote),
    Exists,
    OverQuota { used: u64 },
}

impl Mirror for SharedFiles {
    fn publish(
        &self,
        path: &str,
        file: &mut File,
        bytes: u64,
        sha256: [u8; 32],
        overwrite: Overwrite,
    ) -> Result<Remote, MirrorError> {
        let version = new_version()?;
        let key = self.backend.objects.key(&format!("{FILES}/{version}"));
        let content: Bytes =
            map_for_upload(file, std::path::Path::new(path)).map_err(unavailable)?;
        if content.len() as u64 != bytes {
            return Err(MirrorError::Io(std::io::Error::other(format!(
                "`{path}` is {} bytes, not the {bytes} hashed",
                content.len()
            ))));
        }
        let objects = self.backend.objects.clone();
        let upload_key = key.clone();
        let bound = self.backend.io.transfer_budget(bytes);
        let put = self
            .backend
            .io
            .block_for("uploading a workspace file", bound, async move {
                objects.put_new(&upload_key, content).await
            })
            .map_err(unavailable)?;
        if put == Put::AlreadyThere {
            return Err(MirrorError::Io(std::io::Error::other(
                "a new version's object already exists in the bucket",
            )));
        }
        let pg = self.backend.pg.clone();
        let principal = self.principal.as_str().to_owned();
        let (path_owned, version_owned) = (path.to_owned(), version.clone());
        let quota = i64::try_from(self.quota).unwrap_or(i64::MAX);
        let size = i64::try_from(bytes).unwrap_or(i64::MAX);
        let modified = Timestamp::now();
        let refuse = overwrite == Overwrite::Refuse;
        let decided = self.backend.io.block("indexing a workspace file", async move {
            let mut c = pg.get().await?;
            let tx = c.transaction().await?;
            tx.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended($1, $2))",
                &[&principal, &QUOTA_LOCK_SEED],
            )
            .await?;
            let old: Option<i64> = tx
                .query_opt(
                    "SELECT bytes FROM dataref_files WHERE principal = $1 AND path = $2",
                    &[&principal, &path_owned],
                )
                .await?
                .map(|r| r.get(0));
            if refuse && old.is_some() {
                return Ok(Decided::Exists);
            }
            let used: i64 = tx
                .query_one(
                    "SELECT COALESCE(SUM(bytes), 0)::BIGINT FROM dataref_files WHERE principal = $1",
                    &[&principal],
                )
                .await?
                .get(0);
            let after = used - old.unwrap_or(0) + size;
            if after > quota {
                return Ok(Decided::OverQuota {
                    used: u64::try_from(used).unwrap_or(0),
                });
            }
            tx.execute(
                "INSERT INTO dataref_files (principal, path, version, sha256, bytes, modified) \
                 VALUES ($1, $2, $3, $4, $5, $6) \
                 ON CONFLICT (principal, path) DO UPDATE SET version = EXCLUDED.version, \
                 sha256 = EXCLUDED.sha256, bytes = EXCLUDED.bytes, modified = EXCLUDED.modified",
                &[
                    &principal,
                    &path_owned,
                    &version_owned,
                    &sha256.as_slice(),
                    &size,
                    &modified.0,
                ],
            )
            .await?;
            tx.commit().await?;
            Ok(Decided::Stored(Remote {
                path: path_owned,
                version: version_owned,
                sha256,
                bytes,
                modified,
            }))
        });
        let refused = match decided {
            Ok(Decided::Stored(remote)) => return Ok(remote),
            Ok(Decided::Exists) => MirrorError::AlreadyExists {
                path: path.to_owned(),
            },
            Ok(Decided::OverQuota { used }) => MirrorError::Quota {
                quota: self.quota,
                used,
            },
            // Unreachable: the row may have been written all the same (its answer lost on
            // the way) and name the new object, so it stays; the orphan sweep removes it
            // if no row does.
            Err(e) => return Err(unavailable(e)),
        };
        // Refused: nothing names the new object. Removed now (or by the orphan sweep).
        let objects = self.backend.objects.clone();
        if let Err(e) = self
            .backend
            .io
            .block("removing an unused upload", async move {
                objects.delete(&key).await
            })
        {
            tracing::debug!("cannot remove an unused upload yet: {e}");
        }
        Err(refused)
    }

    fn list(&self, under: &str) -> Result<Vec<Remote>, MirrorError> {
        let pg = self.backend.pg.clone();
        let principal = self.principal.as_str().to_owned();
        let whole = under.is_empty();
        let (exact, from, to) = range(under);
        self.backend
            .io
            .block("listing workspace files", async move {
                let c = pg.get().await?;
                let rows = if whole {
                    c.query(
                        "SELECT path, version, sha256, bytes, modified FROM dataref_files \
                         WHERE principal = $1",
                        &[&principal],
                    )
                    .await?
                } else {
                    c.query(
                        "SELECT path, version, sha256, bytes, modified FROM dataref_files \
                         WHERE principal = $1 AND (path = $2 OR (path >= $3 AND path < $4))",
                        &[&principal, &exact, &from, &to],
                    )
                    .await?
                };
                rows.iter().map(read_remote).collect()
            })
            .map_err(unavailable)
    }

    fn fetch(&self, remote: &Remote, sink: &mut dyn Write) -> Result<(), MirrorError> {
        let key = self
            .backend
            .objects
            .key(&format!("{FILES}/{}", remote.version));
        let store = self.backend.objects.store();
        // The body streams on the backend's runtime; chunks reach this thread through a
        // small channel, so a large file is never held whole in memory.
        let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Bytes, SharedError>>(4);
        let path = remote.path.clone();
        let started = self
            .backend
            .io
            .block("fetching a workspace file", async move {
                match store.get(&key).await {
                    Ok(got) => Ok(Some(got)),
                    Err(object_store::Error::NotFound { .. }) => Ok(None),
                    Err(e) => Err(SharedError::from(e)),
                }
            });
        let got = match started.map_err(unavailable)? {
            Some(got) => got,
            None => return Err(MirrorError::NotFound { path }),
        };
        let pause = self.backend.io.timeout();
        self.backend.io.spawn(async move {
            let mut stream = got.into_stream();
            loop {
                // Each part within the timeout of the one before: a stalled body ends as
                // unavailable, however large the file.
                let chunk = match tokio::time::timeout(pause, stream.next()).await {
                    Err(_) => Err(SharedError::TimedOut {
                        what: "a pause in a workspace file's body",
                        after: pause,
                    }),
                    Ok(None) => return,
                    Ok(Some(chunk)) => chunk.map_err(SharedError::from),
                };
                let failed = chunk.is_err();
                // The reader is a plain thread (it writes the local copy): waiting for it
                // here must not hold up the backend's other tasks on this worker.
                let sent = tokio::task::block_in_place(|| tx.send(chunk));
                if sent.is_err() || failed {
                    return;
                }
            }
        });
        for chunk in rx {
            let chunk = chunk.map_err(unavailable)?;
            sink.write_all(&chunk)?;
        }
        Ok(())
    }

    fn remove(&self, remote: &Remote) -> Result<bool, MirrorError> {
        let pg = self.backend.pg.clone();
        let principal = self.principal.as_str().to_owned();
        let (path, version) = (remote.path.clone(), remote.version.clone());
        self.backend
            .io
            .block("removing a workspace file", async move {
                let c = pg.get().await?;
                let n = c
                    .execute(
                        "DELETE FROM dataref_files WHERE principal = $1 AND path = $2 \
                         AND version = $3",
                        &[&principal, &path, &version],
                    )
                    .await?;
                Ok(n > 0)
            })
            .map_err(unavailable)
    }
}
