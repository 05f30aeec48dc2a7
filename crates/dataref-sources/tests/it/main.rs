//! Integration tests of the producers: real SQLite files in temp dirs, the real local store.
#![expect(
    clippy::disallowed_methods,
    reason = "fixtures build files and hostile trees directly, outside the code under test"
)]
// `allow-unwrap-in-tests` covers `#[test]` functions, not the helpers they share.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers fail by panicking, like the tests that call them"
)]

mod fetch;
mod guard;
mod mysql;
mod params;
mod pg_roles;
mod postgres;
mod sample;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use dataref_config::{ColumnType, SourceConfig, SourceKind};
use dataref_protocol::Principal;
use dataref_sources::{FetchRequest, ParamValue, SourceError, SqlPolicy, fetch};
use dataref_store::{
    ArtifactMeta, ArtifactStore, Lineage, LocalStore, StoreLimits, SystemClock, Table,
};
use tempfile::TempDir;

/// A temp dir with a store under `home/` and a database file `db.sqlite`.
pub struct Env {
    pub dir: TempDir,
    pub store: LocalStore,
    pub owner: Principal,
    pub source: SourceConfig,
}

impl Env {
    /// A database made by running `setup` (a batch of SQL).
    pub fn new(setup: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("db.sqlite");
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.execute_batch(setup).unwrap();
        drop(conn);
        Self::with_database(dir, db)
    }

    pub fn with_database(dir: TempDir, db: PathBuf) -> Self {
        let store = LocalStore::open(
            &dir.path().join("home"),
            StoreLimits::default(),
            Arc::new(SystemClock),
        )
        .unwrap();
        let source = SourceConfig {
            name: "test".into(),
            kind: SourceKind::Sqlite { path: db },
            sample_rows: 5,
            max_value_chars: 80,
            max_rows: 10_000_000,
            timeout: Duration::from_secs(30),
            allow_sql: true,
        };
        Self {
            dir,
            store,
            owner: Principal::new("tester").unwrap(),
            source,
        }
    }

    pub fn db(&self) -> &Path {
        match &self.source.kind {
            SourceKind::Sqlite { path } => path,
            _ => unreachable!(),
        }
    }

    /// Runs `sql` as the `query` tool would.
    pub fn query(&self, sql: &str) -> Result<ArtifactMeta, SourceError> {
        self.run(sql, Vec::new(), &BTreeMap::new(), SqlPolicy::Generic)
    }

    pub fn run(
        &self,
        sql: &str,
        params: Vec<(String, ParamValue)>,
        declared: &BTreeMap<String, ColumnType>,
        policy: SqlPolicy,
    ) -> Result<ArtifactMeta, SourceError> {
        let req = FetchRequest {
            source: &self.source,
            sql,
            params,
            declared,
            policy,
        };
        fetch(
            &req,
            &self.store,
            &self.owner,
            Lineage::new("test", serde_json::json!({ "sql": sql })),
            &|_| {},
            &|| false,
        )
    }

    pub fn table(&self, meta: &ArtifactMeta) -> Table {
        self.store.open_table(&self.owner, &meta.data_ref).unwrap()
    }

    /// How many artifacts the owner holds: an aborted fetch must leave none.
    pub fn artifacts(&self) -> u64 {
        self.store.list(&self.owner, 100).unwrap().1
    }
}
