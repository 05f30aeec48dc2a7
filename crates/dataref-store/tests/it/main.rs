//! Integration tests of dataref-store against real files in temporary directories.
#![expect(
    clippy::disallowed_methods,
    reason = "fixtures build files and hostile trees directly, outside the code under test"
)]
// `allow-unwrap-in-tests` covers `#[test]` functions, not the helpers they share.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers fail by panicking, like the tests that call them"
)]

mod local;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use dataref_protocol::{Principal, Timestamp};
use dataref_store::{ArtifactMeta, ArtifactStore, Lineage, LocalStore, ManualClock, StoreLimits};

/// 2025-12-01T00:00:00Z: a fixed start so expiry times are predictable.
pub const T0: i64 = 1_764_547_200;

pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub clock: Arc<ManualClock>,
    pub limits: StoreLimits,
    pub store: LocalStore,
}

impl Fixture {
    pub fn new(limits: StoreLimits) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(ManualClock::new(Timestamp(T0)));
        let store = LocalStore::open(dir.path(), limits.clone(), clock.clone()).unwrap();
        Self {
            dir,
            clock,
            limits,
            store,
        }
    }

    pub fn home(&self) -> &Path {
        self.dir.path()
    }

    pub fn artifacts(&self) -> PathBuf {
        self.home().join("artifacts")
    }

    pub fn tmp(&self) -> PathBuf {
        self.artifacts().join(".tmp")
    }

    /// Drops the store and opens a new one on the same home, as a restart would.
    pub fn restart(&mut self) {
        // The old store goes first: a store still open elsewhere keeps the next from
        // reconciling. A placeholder on another directory stands in meanwhile.
        let placeholder = tempfile::tempdir().unwrap();
        drop(std::mem::replace(
            &mut self.store,
            LocalStore::open(placeholder.path(), self.limits.clone(), self.clock.clone()).unwrap(),
        ));
        self.store =
            LocalStore::open(self.home(), self.limits.clone(), self.clock.clone()).unwrap();
    }

    /// Names of the `*.arrow` files in `artifacts/`.
    pub fn artifact_files(&self) -> Vec<String> {
        files_in(&self.artifacts())
            .into_iter()
            .filter(|n| n.ends_with(".arrow"))
            .collect()
    }

    pub fn tmp_files(&self) -> Vec<String> {
        files_in(&self.tmp())
    }

    /// Index rows for `data_ref`, read straight from SQLite.
    pub fn index_rows(&self, data_ref: &str) -> i64 {
        let conn = rusqlite::Connection::open(self.home().join("index.sqlite")).unwrap();
        conn.query_row(
            "SELECT COUNT(*) FROM artifacts WHERE ref = ?1",
            [data_ref],
            |r| r.get(0),
        )
        .unwrap()
    }
}

pub fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

pub fn owner(name: &str) -> Principal {
    Principal::new(name).unwrap()
}

pub fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("amount", DataType::Float64, true),
        Field::new("region", DataType::Utf8, true),
    ]))
}

/// Rows `start..start + n`: `amount` is NULL when `id % 3 == 0`, `region` when `id % 5 == 0`.
pub fn batch(start: i64, n: i64) -> RecordBatch {
    let ids = start..start + n;
    let id: ArrayRef = Arc::new(Int64Array::from_iter_values(ids.clone()));
    let amount: ArrayRef = Arc::new(Float64Array::from_iter(
        ids.clone().map(|i| (i % 3 != 0).then_some(i as f64 * 1.5)),
    ));
    let region: ArrayRef = Arc::new(StringArray::from_iter(
        ids.map(|i| (i % 5 != 0).then(|| format!("region-{}", i % 7))),
    ));
    RecordBatch::try_new(schema(), vec![id, amount, region]).unwrap()
}

/// Expected `[id, amount, region]` null counts for rows `0..n`.
pub fn expected_nulls(n: i64) -> Vec<u64> {
    let multiples = |k: i64| (0..n).filter(|i| i % k == 0).count() as u64;
    vec![0, multiples(3), multiples(5)]
}

pub fn lineage() -> Lineage {
    Lineage::new("fetch_sales", serde_json::json!({ "region": "EU" }))
}

pub fn write_table(
    store: &dyn ArtifactStore,
    who: &Principal,
    batches: &[RecordBatch],
) -> ArtifactMeta {
    let mut w = store.create_table(who, schema(), lineage()).unwrap();
    for b in batches {
        w.write(b).unwrap();
    }
    w.finish().unwrap()
}
