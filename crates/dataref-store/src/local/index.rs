//! The SQLite index of stored tables: one row per artifact file.
//!
//! Every method takes the connection lock for its own statements only; callers never hold
//! it across file I/O.

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use dataref_protocol::{DataRef, Principal, Timestamp};
use rusqlite::{Connection, OptionalExtension, Row, TransactionBehavior, params};

use crate::backend::{ArtifactIndex, IndexRow, to_u64};
use crate::{ArtifactMeta, Checksum, StoreError};

/// Bumped when the table layout changes; an index written by a newer dataref is refused.
///
/// 2: `checksum` (added to a version-1 index in place; its rows adopt one on first read).
/// 3: `receipt` (added in place; older rows have none).
/// 4: `quick_check` (added in place; older rows check their checksum instead).
const SCHEMA_VERSION: i64 = 4;

const SCHEMA_SQL: &str = "
CREATE TABLE IF NOT EXISTS artifacts (
    ref          TEXT    PRIMARY KEY NOT NULL,
    owner        TEXT    NOT NULL,
    rows         INTEGER NOT NULL,
    bytes        INTEGER NOT NULL,
    schema       TEXT    NOT NULL,
    null_counts  TEXT    NOT NULL,
    created_at   INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL,
    lineage_tool TEXT    NOT NULL,
    lineage_args TEXT    NOT NULL,
    checksum     TEXT,
    receipt      TEXT,
    quick_check  TEXT
);
CREATE INDEX IF NOT EXISTS artifacts_owner_created ON artifacts (owner, created_at DESC);
CREATE INDEX IF NOT EXISTS artifacts_expires ON artifacts (expires_at);
";

const COLUMNS: &str = "ref, owner, rows, bytes, schema, null_counts, created_at, expires_at, \
                       lineage_tool, lineage_args, checksum, receipt, quick_check";

/// Another connection (another process on the same home) may hold the write lock for a
/// moment; waiting beats failing a producer.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// The local backend's index: `<home>/index.sqlite`, shared by the stores of every process
/// on this home.
#[derive(Debug)]
pub struct SqliteIndex {
    conn: Mutex<Connection>,
}

impl SqliteIndex {
    pub(super) fn open(path: &Path) -> Result<Self, StoreError> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        let mode: String =
            conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            tracing::warn!(%mode, "the artifact index is not in WAL mode");
        }
        // The index row is written after the file is fsynced; FULL makes the commit as
        // durable as the file, so a power cut cannot keep a file and lose its row.
        conn.pragma_update(None, "synchronous", "FULL")?;
        let version: i64 = conn.pragma_query_value(None, "user_version", |row| row.get(0))?;
        if version > SCHEMA_VERSION {
            return Err(StoreError::Index(format!(
                "`{}` was written by a newer dataref (index version {version}, this build knows {SCHEMA_VERSION})",
                path.display()
            )));
        }
        conn.execute_batch(SCHEMA_SQL)?;
        // An older index (no checksums, receipts or quick checks yet): each column is
        // added, empty.
        for column in ["checksum", "receipt", "quick_check"] {
            let has: bool = conn.query_row(
                "SELECT COUNT(*) > 0 FROM pragma_table_info('artifacts') WHERE name = ?1",
                [column],
                |row| row.get(0),
            )?;
            if !has {
                conn.execute_batch(&format!("ALTER TABLE artifacts ADD COLUMN {column} TEXT"))?;
            }
        }
        conn.pragma_update(None, "user_version", SCHEMA_VERSION)?;
        Ok(Self {
            conn: Mutex::new(conn),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        // A panic elsewhere while holding the lock cannot leave a half-done transaction
        // behind (rusqlite rolls back on drop), so the connection is still usable.
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every ref in the index, live or not.
    pub(super) fn all_refs(&self) -> Result<HashSet<String>, StoreError> {
        let conn = self.lock();
        let mut stmt = conn.prepare("SELECT ref FROM artifacts")?;
        let refs = stmt
            .query_map([], |row| row.get::<_, String>(0))?
            .collect::<Result<_, _>>()?;
        Ok(refs)
    }

    pub(super) fn remove(&self, data_ref: &str) -> Result<(), StoreError> {
        self.lock()
            .execute("DELETE FROM artifacts WHERE ref = ?1", params![data_ref])?;
        Ok(())
    }
}

fn usage_of(conn: &Connection, owner: &Principal, now: Timestamp) -> Result<i64, StoreError> {
    Ok(conn.query_row(
        "SELECT COALESCE(SUM(bytes), 0) FROM artifacts WHERE owner = ?1 AND expires_at > ?2",
        params![owner.as_str(), now.0],
        |row| row.get(0),
    )?)
}

/// A row as SQLite returns it; decoded after the lock is released.
fn read_row(row: &Row<'_>) -> rusqlite::Result<IndexRow> {
    Ok(IndexRow {
        data_ref: row.get(0)?,
        owner: row.get(1)?,
        rows: row.get(2)?,
        bytes: row.get(3)?,
        schema: row.get(4)?,
        null_counts: row.get(5)?,
        created_at: row.get(6)?,
        expires_at: row.get(7)?,
        lineage_tool: row.get(8)?,
        lineage_args: row.get(9)?,
        checksum: row.get(10)?,
        receipt: row.get(11)?,
        quick_check: row.get(12)?,
    })
}

impl ArtifactIndex for SqliteIndex {
    fn get(
        &self,
        owner: &Principal,
        data_ref: &DataRef,
        now: Timestamp,
    ) -> Result<Option<ArtifactMeta>, StoreError> {
        let raw = self
            .lock()
            .query_row(
                &format!(
                    "SELECT {COLUMNS} FROM artifacts WHERE ref = ?1 AND owner = ?2 AND expires_at > ?3"
                ),
                params![data_ref.as_str(), owner.as_str(), now.0],
                read_row,
            )
            .optional()?;
        raw.map(IndexRow::into_meta).transpose()
    }

    fn list(
        &self,
        owner: &Principal,
        now: Timestamp,
        limit: usize,
    ) -> Result<(Vec<ArtifactMeta>, u64), StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let (raws, total) = {
            let conn = self.lock();
            // rowid breaks ties between artifacts created in the same second: later
            // inserts have larger rowids.
            let mut stmt = conn.prepare(&format!(
                "SELECT {COLUMNS} FROM artifacts WHERE owner = ?1 AND expires_at > ?2 \
                 ORDER BY created_at DESC, rowid DESC LIMIT ?3"
            ))?;
            let raws = stmt
                .query_map(params![owner.as_str(), now.0, limit], read_row)?
                .collect::<Result<Vec<_>, _>>()?;
            let total: i64 = conn.query_row(
                "SELECT COUNT(*) FROM artifacts WHERE owner = ?1 AND expires_at > ?2",
                params![owner.as_str(), now.0],
                |row| row.get(0),
            )?;
            (raws, total)
        };
        let metas = raws
            .into_iter()
            .map(IndexRow::into_meta)
            .collect::<Result<_, _>>()?;
        Ok((metas, to_u64(total, "count")?))
    }

    fn usage(&self, owner: &Principal, now: Timestamp) -> Result<u64, StoreError> {
        let used = usage_of(&self.lock(), owner, now)?;
        to_u64(used, "bytes")
    }

    fn insert_within_quota(
        &self,
        meta: &ArtifactMeta,
        quota: u64,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let row = IndexRow::from_meta(meta)?;
        let mut conn = self.lock();
        // IMMEDIATE takes the write lock up front, which also serialises writers in other
        // processes sharing this home.
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let used = to_u64(usage_of(&tx, &meta.owner, now)?, "bytes")?;
        if used.saturating_add(meta.bytes) > quota {
            return Err(StoreError::QuotaExceeded { quota, used });
        }
        tx.execute(
            &format!(
                "INSERT INTO artifacts ({COLUMNS}) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)"
            ),
            params![
                row.data_ref,
                row.owner,
                row.rows,
                row.bytes,
                row.schema,
                row.null_counts,
                row.created_at,
                row.expires_at,
                row.lineage_tool,
                row.lineage_args,
                row.checksum,
                row.receipt,
                row.quick_check,
            ],
        )?;
        tx.commit()?;
        Ok(())
    }

    fn take_expired(&self, now: Timestamp) -> Result<Vec<(String, u64)>, StoreError> {
        let conn = self.lock();
        let mut stmt =
            conn.prepare("DELETE FROM artifacts WHERE expires_at <= ?1 RETURNING ref, bytes")?;
        let rows = stmt
            .query_map(params![now.0], |row| {
                Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        rows.into_iter()
            .map(|(r, bytes)| Ok((r, to_u64(bytes, "bytes")?)))
            .collect()
    }

    fn adopt_checksum(&self, data_ref: &DataRef, checksum: &Checksum) -> Result<(), StoreError> {
        self.lock().execute(
            "UPDATE artifacts SET checksum = ?2 WHERE ref = ?1 AND checksum IS NULL",
            params![data_ref.as_str(), checksum.to_string()],
        )?;
        Ok(())
    }

    fn totals(&self, now: Timestamp) -> Result<(u64, u64), StoreError> {
        let (tables, bytes): (i64, i64) = self.lock().query_row(
            "SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM artifacts WHERE expires_at > ?1",
            params![now.0],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )?;
        Ok((to_u64(tables, "tables")?, to_u64(bytes, "bytes")?))
    }

    fn every(&self, now: Timestamp) -> Result<Vec<ArtifactMeta>, StoreError> {
        let raws = {
            let conn = self.lock();
            let mut stmt = conn.prepare(&format!(
                "SELECT {COLUMNS} FROM artifacts WHERE expires_at > ?1 ORDER BY rowid"
            ))?;
            stmt.query_map(params![now.0], read_row)?
                .collect::<Result<Vec<_>, _>>()?
        };
        raws.into_iter().map(IndexRow::into_meta).collect()
    }

    fn drop_row(&self, data_ref: &DataRef) -> Result<bool, StoreError> {
        let n = self.lock().execute(
            "DELETE FROM artifacts WHERE ref = ?1",
            params![data_ref.as_str()],
        )?;
        Ok(n > 0)
    }
}
