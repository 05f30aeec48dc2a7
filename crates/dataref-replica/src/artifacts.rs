//! Artifacts shared by every replica: rows in `dataref_artifacts` ([`PgIndex`]), bytes in
//! the bucket under `artifacts/<ref>.arrow` with this replica's cache in front
//! ([`ObjectBytes`]).
//!
//! Order of a write: the finished file is uploaded create-only, then its row is inserted
//! (within the owner's quota, one owner's writers serialised across replicas by an advisory
//! lock), and only then is the ref handed out. A replica killed between the upload and the
//! row leaves an object no row names: nobody can read it, and the orphan sweep removes it.
//! Removal goes the other way: the row first (each expired row is deleted by exactly one
//! sweeper, however many race), then the object.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use dataref_protocol::{DataRef, Principal, Timestamp};
use dataref_store::{
    ArtifactBytes, ArtifactIndex, ArtifactMeta, Checksum, IndexRow, Opened, Parts, StoreError,
    to_u64,
};
use tokio_postgres::Row;

use crate::Backend;
use crate::error::SharedError;
use crate::objects::{Got, Put, map_for_upload};
use crate::parts::{self, PartFile};

const COLUMNS: &str = "ref, owner, rows, bytes, schema, null_counts, created_at, expires_at, \
                       lineage_tool, lineage_args, checksum, receipt, quick_check";

/// Seeds the per-owner advisory lock of quota checks (PostgreSQL's `hashtextextended`).
const QUOTA_LOCK_SEED: i64 = 0x71_756f_7461;

/// The artifact index in the shared PostgreSQL.
#[derive(Debug, Clone)]
pub struct PgIndex {
    backend: Arc<Backend>,
}

impl PgIndex {
    pub(crate) fn new(backend: Arc<Backend>) -> Self {
        Self { backend }
    }
}

fn read_row(row: &Row) -> Result<IndexRow, SharedError> {
    let get = |i: usize| -> Result<String, SharedError> {
        row.try_get::<_, String>(i)
            .map_err(|e| SharedError::Index(e.to_string()))
    };
    let num = |i: usize| -> Result<i64, SharedError> {
        row.try_get::<_, i64>(i)
            .map_err(|e| SharedError::Index(e.to_string()))
    };
    Ok(IndexRow {
        data_ref: get(0)?,
        owner: get(1)?,
        rows: num(2)?,
        bytes: num(3)?,
        schema: get(4)?,
        null_counts: get(5)?,
        created_at: num(6)?,
        expires_at: num(7)?,
        lineage_tool: get(8)?,
        lineage_args: get(9)?,
        checksum: row
            .try_get::<_, Option<String>>(10)
            .map_err(|e| SharedError::Index(e.to_string()))?,
        receipt: row
            .try_get::<_, Option<String>>(11)
            .map_err(|e| SharedError::Index(e.to_string()))?,
        quick_check: row
            .try_get::<_, Option<String>>(12)
            .map_err(|e| SharedError::Index(e.to_string()))?,
    })
}

impl ArtifactIndex for PgIndex {
    fn get(
        &self,
        owner: &Principal,
        data_ref: &DataRef,
        now: Timestamp,
    ) -> Result<Option<ArtifactMeta>, StoreError> {
        let pg = self.backend.pg.clone();
        let (owner, data_ref) = (owner.as_str().to_owned(), data_ref.as_str().to_owned());
        let row = self
            .backend
            .io
            .block("reading the artifact index", async move {
                let c = pg.get().await?;
                let row = c
                    .query_opt(
                        &format!(
                            "SELECT {COLUMNS} FROM dataref_artifacts \
                         WHERE ref = $1 AND owner = $2 AND expires_at > $3"
                        ),
                        &[&data_ref, &owner, &now.0],
                    )
                    .await?;
                row.as_ref().map(read_row).transpose()
            })?;
        row.map(IndexRow::into_meta).transpose()
    }

    fn list(
        &self,
        owner: &Principal,
        now: Timestamp,
        limit: usize,
    ) -> Result<(Vec<ArtifactMeta>, u64), StoreError> {
        let pg = self.backend.pg.clone();
        let owner = owner.as_str().to_owned();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let (rows, total) = self.backend.io.block("listing artifacts", async move {
            let c = pg.get().await?;
            let rows = c
                .query(
                    &format!(
                        "SELECT {COLUMNS} FROM dataref_artifacts \
                         WHERE owner = $1 AND expires_at > $2 \
                         ORDER BY created_at DESC, seq DESC LIMIT $3"
                    ),
                    &[&owner, &now.0, &limit],
                )
                .await?;
            let total: i64 = c
                .query_one(
                    "SELECT COUNT(*) FROM dataref_artifacts WHERE owner = $1 AND expires_at > $2",
                    &[&owner, &now.0],
                )
                .await?
                .get(0);
            let rows = rows.iter().map(read_row).collect::<Result<Vec<_>, _>>()?;
            Ok((rows, total))
        })?;
        let metas = rows
            .into_iter()
            .map(IndexRow::into_meta)
            .collect::<Result<_, _>>()?;
        Ok((metas, to_u64(total, "count")?))
    }

    fn usage(&self, owner: &Principal, now: Timestamp) -> Result<u64, StoreError> {
        let pg = self.backend.pg.clone();
        let owner = owner.as_str().to_owned();
        let used: i64 = self.backend.io.block("reading a quota", async move {
            let c = pg.get().await?;
            Ok(c.query_one(USAGE, &[&owner, &now.0]).await?.get(0))
        })?;
        to_u64(used, "bytes")
    }

    fn totals(&self, now: Timestamp) -> Result<(u64, u64), StoreError> {
        let pg = self.backend.pg.clone();
        let (tables, bytes): (i64, i64) =
            self.backend
                .io
                .block("counting the stored tables", async move {
                    let c = pg.get().await?;
                    let row = c.query_one(TOTALS, &[&now.0]).await?;
                    Ok((row.get(0), row.get(1)))
                })?;
        Ok((to_u64(tables, "tables")?, to_u64(bytes, "bytes")?))
    }

    fn insert_within_quota(
        &self,
        meta: &ArtifactMeta,
        quota: u64,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let row = IndexRow::from_meta(meta)?;
        let pg = self.backend.pg.clone();
        let quota_i = i64::try_from(quota).unwrap_or(i64::MAX);
        let used = self.backend.io.block("indexing an artifact", async move {
            let mut c = pg.get().await?;
            let tx = c.transaction().await?;
            // One owner's writers take turns here, on every replica: the sum and the insert
            // below cannot interleave with another's.
            tx.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended($1, $2))",
                &[&row.owner, &QUOTA_LOCK_SEED],
            )
            .await?;
            let used: i64 = tx.query_one(USAGE, &[&row.owner, &now.0]).await?.get(0);
            if used.saturating_add(row.bytes) > quota_i {
                return Ok(Some(used));
            }
            tx.execute(
                &format!(
                    "INSERT INTO dataref_artifacts ({COLUMNS}) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)"
                ),
                &[
                    &row.data_ref,
                    &row.owner,
                    &row.rows,
                    &row.bytes,
                    &row.schema,
                    &row.null_counts,
                    &row.created_at,
                    &row.expires_at,
                    &row.lineage_tool,
                    &row.lineage_args,
                    &row.checksum,
                    &row.receipt,
                    &row.quick_check,
                ],
            )
            .await?;
            tx.commit().await?;
            Ok(None)
        })?;
        match used {
            Some(used) => Err(StoreError::QuotaExceeded {
                quota,
                used: to_u64(used, "bytes")?,
            }),
            None => Ok(()),
        }
    }

    fn take_expired(&self, now: Timestamp) -> Result<Vec<(String, u64)>, StoreError> {
        let pg = self.backend.pg.clone();
        let rows: Vec<(String, i64)> = self.backend.io.block_for(
            "sweeping artifacts",
            std::time::Duration::from_secs(3600),
            async move {
                // In batches, so a backlog is neither one long statement nor one that times
                // out whole. A row another sweeper holds is skipped: that one deletes it and
                // gets it back, so each expired row comes back to exactly one sweeper.
                let mut out = Vec::new();
                loop {
                    let rows = pg
                        .get()
                        .await?
                        .query(
                            "DELETE FROM dataref_artifacts WHERE ref IN ( \
                               SELECT ref FROM dataref_artifacts WHERE expires_at <= $1 \
                               LIMIT 1000 FOR UPDATE SKIP LOCKED) \
                             RETURNING ref, bytes",
                            &[&now.0],
                        )
                        .await?;
                    let n = rows.len();
                    out.extend(rows.iter().map(|r| (r.get(0), r.get(1))));
                    if n < 1000 {
                        return Ok(out);
                    }
                }
            },
        )?;
        rows.into_iter()
            .map(|(r, bytes)| Ok((r, to_u64(bytes, "bytes")?)))
            .collect()
    }

    fn adopt_checksum(&self, data_ref: &DataRef, checksum: &Checksum) -> Result<(), StoreError> {
        let pg = self.backend.pg.clone();
        let (data_ref, checksum) = (data_ref.as_str().to_owned(), checksum.to_string());
        self.backend.io.block("recording a checksum", async move {
            pg.get()
                .await?
                .execute(
                    "UPDATE dataref_artifacts SET checksum = $2 \
                     WHERE ref = $1 AND checksum IS NULL",
                    &[&data_ref, &checksum],
                )
                .await?;
            Ok(())
        })?;
        Ok(())
    }

    fn every(&self, now: Timestamp) -> Result<Vec<ArtifactMeta>, StoreError> {
        let pg = self.backend.pg.clone();
        let rows = self.backend.io.block_for(
            "listing every artifact",
            std::time::Duration::from_secs(3600),
            async move {
                let rows = pg
                    .get()
                    .await?
                    .query(
                        &format!(
                            "SELECT {COLUMNS} FROM dataref_artifacts WHERE expires_at > $1 \
                             ORDER BY seq"
                        ),
                        &[&now.0],
                    )
                    .await?;
                rows.iter().map(read_row).collect::<Result<Vec<_>, _>>()
            },
        )?;
        rows.into_iter().map(IndexRow::into_meta).collect()
    }

    fn drop_row(&self, data_ref: &DataRef) -> Result<bool, StoreError> {
        let pg = self.backend.pg.clone();
        let data_ref = data_ref.as_str().to_owned();
        let n = self
            .backend
            .io
            .block("removing an artifact's row", async move {
                Ok(pg
                    .get()
                    .await?
                    .execute("DELETE FROM dataref_artifacts WHERE ref = $1", &[&data_ref])
                    .await?)
            })?;
        Ok(n > 0)
    }
}

const USAGE: &str = "SELECT COALESCE(SUM(bytes), 0)::BIGINT FROM dataref_artifacts \
                     WHERE owner = $1 AND expires_at > $2";
const TOTALS: &str = "SELECT COUNT(*)::BIGINT, COALESCE(SUM(bytes), 0)::BIGINT \
                      FROM dataref_artifacts WHERE expires_at > $1";

/// Artifact bytes in the bucket, read through this replica's cache.
#[derive(Debug, Clone)]
pub struct ObjectBytes {
    backend: Arc<Backend>,
}

impl ObjectBytes {
    pub(crate) fn new(backend: Arc<Backend>) -> Self {
        Self { backend }
    }

    /// Puts the piece hashes of the table just published beside its object, so readers
    /// can fetch parts of it (see [`crate::parts`]). A failure costs only that: readers
    /// without them read the table whole.
    fn publish_outboard(&self, data_ref: &DataRef, name: &str, bytes: &bytes::Bytes) {
        let outboard = parts::outboard(bytes);
        let key = self
            .backend
            .objects
            .key(&format!("{ARTIFACTS}/{}", parts::outboard_name(name)));
        let objects = self.backend.objects.clone();
        if let Err(e) = self
            .backend
            .io
            .block("uploading an artifact's piece hashes", async move {
                objects.put_new(&key, outboard).await
            })
        {
            tracing::warn!(%data_ref, "cannot store an artifact's piece hashes; it will be read whole: {e}");
        }
    }
}

/// The cache's name and the object's key (under the prefix) of `data_ref`.
pub(crate) fn artifact_name(data_ref: &str) -> String {
    format!("{data_ref}.arrow")
}

pub(crate) const ARTIFACTS: &str = "artifacts";

/// The longest a download may take in all, however steadily it goes.
const DOWNLOAD_CEILING: std::time::Duration = std::time::Duration::from_secs(3600);

impl ArtifactBytes for ObjectBytes {
    fn publish(&self, data_ref: &DataRef, staged: &Path) -> Result<(), StoreError> {
        let name = artifact_name(data_ref.as_str());
        let key = self.backend.objects.key(&format!("{ARTIFACTS}/{name}"));
        #[expect(
            clippy::disallowed_methods,
            reason = "the staged artifact file is the store's own, outside every workspace"
        )]
        let file = File::open(staged).map_err(|e| SharedError::local("cannot open", staged, e))?;
        let bytes = map_for_upload(&file, staged)?;
        drop(file);
        let objects = self.backend.objects.clone();
        let bound = self.backend.io.transfer_budget(bytes.len() as u64);
        let mapped = bytes.clone();
        let put = self
            .backend
            .io
            .block_for("uploading an artifact", bound, async move {
                objects.put_new(&key, bytes).await
            })?;
        if put == Put::AlreadyThere {
            // 128 random bits make this a bug or an attack, never chance: keep what is
            // there, store nothing.
            return Err(StoreError::Index(format!(
                "an object for `{data_ref}` already exists in the bucket; nothing was stored"
            )));
        }
        if mapped.len() as u64 >= parts::PARTS_MIN {
            self.publish_outboard(data_ref, &name, &mapped);
        }
        drop(mapped);
        self.backend.cache.admit(&name, staged)?;
        Ok(())
    }

    fn open_parts(&self, meta: &ArtifactMeta) -> Result<Option<Arc<dyn Parts>>, StoreError> {
        let name = artifact_name(meta.data_ref.as_str());
        if meta.bytes < parts::PARTS_MIN || self.backend.cache.holds(&name) {
            return Ok(None);
        }
        let parts = &self.backend.parts;
        if let Some(part) = parts.current(&self.backend, &name) {
            return Ok(Some(part));
        }
        let key = self.backend.objects.key(&format!("{ARTIFACTS}/{name}"));
        Ok(PartFile::open(&self.backend, meta, &name, key)?
            .map(|part| parts.keep(&self.backend, &name, part) as Arc<dyn Parts>))
    }

    fn open(&self, meta: &ArtifactMeta) -> Result<Option<Opened>, StoreError> {
        let data_ref = &meta.data_ref;
        let name = artifact_name(data_ref.as_str());
        let cached = self.backend.cache.open_file(&name)?;
        dataref_ops::metrics::cache_lookup("artifacts", cached.is_some());
        if let Some(file) = cached {
            // Checked by the store the first time this process maps it.
            return Ok(Some(Opened {
                file,
                verified: false,
            }));
        }
        let tmp = self.backend.cache.tmp_path(&name);
        let key = self.backend.objects.key(&format!("{ARTIFACTS}/{name}"));
        let objects = self.backend.objects.clone();
        let dest = tmp.clone();
        let (len, pause) = (meta.bytes, self.backend.io.timeout());
        // However large the table, the download goes on while its parts keep coming (each
        // within the timeout); a ceiling of an hour in all.
        let got =
            self.backend
                .io
                .block_for("downloading an artifact", DOWNLOAD_CEILING, async move {
                    objects.get_into(&key, &dest, len, pause).await
                });
        let damaged = |detail: String| StoreError::Damaged {
            data_ref: data_ref.as_str().to_owned(),
            detail: format!("in the object store, {detail}"),
        };
        let found = match got {
            Ok(Got::Bytes(found)) => found,
            Ok(Got::Missing) => {
                crate::cache::remove(&tmp);
                return Ok(None);
            }
            Ok(Got::Short { found }) => {
                crate::cache::remove(&tmp);
                return Err(damaged(format!(
                    "its object holds {found} bytes where {len} were written"
                )));
            }
            Err(e) => {
                crate::cache::remove(&tmp);
                return Err(e.into());
            }
        };
        // Hashed as it arrived: what does not match never enters the cache, so a repaired
        // object is fetched afresh by the next read.
        if let Some(Err(detail)) = meta.checksum.as_ref().map(|e| found.matches(e)) {
            crate::cache::remove(&tmp);
            return Err(damaged(detail));
        }
        // Two readers fetching the same object both rename: the same bytes either way.
        let file = self.backend.cache.admit(&name, &tmp)?;
        // Whole now: the parts fetched for queries are not needed.
        self.backend.parts.forget(&self.backend, &name);
        Ok(Some(Opened {
            file,
            verified: meta.checksum.is_some(),
        }))
    }

    fn forget_copy(&self, data_ref: &DataRef) -> bool {
        self.backend.cache.forget(&artifact_name(data_ref.as_str()));
        true
    }

    fn local_path(&self, data_ref: &DataRef) -> PathBuf {
        self.backend.cache.path(&artifact_name(data_ref.as_str()))
    }

    fn remove(&self, data_ref: &DataRef) {
        let name = artifact_name(data_ref.as_str());
        self.backend.cache.forget(&name);
        self.backend.parts.forget(&self.backend, &name);
        let key = self.backend.objects.key(&format!("{ARTIFACTS}/{name}"));
        let outboard = self
            .backend
            .objects
            .key(&format!("{ARTIFACTS}/{}", parts::outboard_name(&name)));
        let objects = self.backend.objects.clone();
        if let Err(e) = self.backend.io.block("removing an artifact", async move {
            objects.delete(&outboard).await?;
            objects.delete(&key).await
        }) {
            // Its row is gone: the orphan sweep removes the object later.
            tracing::warn!(data_ref = %data_ref, "cannot remove an artifact's object: {e}");
        }
    }
}
