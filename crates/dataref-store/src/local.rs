//! The local backend. Implementation: see the contract in lib.rs.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arrow_schema::SchemaRef;
use dataref_protocol::{DataRef, Principal};

use crate::{ArtifactMeta, ArtifactStore, Clock, Lineage, StoreError, Table, TableWriter};

/// Bounds of the store (from `[store]` in config).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreLimits {
    pub ttl: Duration,
    pub max_artifact_bytes: u64,
    pub owner_quota_bytes: u64,
}

impl Default for StoreLimits {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(24 * 3600),
            max_artifact_bytes: 1 << 30,
            owner_quota_bytes: 10 << 30,
        }
    }
}

/// What a sweep removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepReport {
    pub removed: u64,
    pub bytes_freed: u64,
}

/// Arrow IPC files under `<home>/artifacts`, indexed in `<home>/index.sqlite`.
#[derive(Debug)]
pub struct LocalStore {
    _private: (),
}

impl LocalStore {
    /// Opens (creating if needed) the store under `home` and reconciles it with the disk:
    /// temp files and files without an index row are removed, and index rows whose file
    /// is missing are dropped.
    pub fn open(
        home: &Path,
        limits: StoreLimits,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, StoreError> {
        let _ = (home, limits, clock);
        unimplemented!("store helper")
    }
}

impl ArtifactStore for LocalStore {
    fn create_table(
        &self,
        owner: &Principal,
        schema: SchemaRef,
        lineage: Lineage,
    ) -> Result<Box<dyn TableWriter>, StoreError> {
        let _ = (owner, schema, lineage);
        unimplemented!("store helper")
    }
    fn open_table(&self, owner: &Principal, data_ref: &DataRef) -> Result<Table, StoreError> {
        let _ = (owner, data_ref);
        unimplemented!("store helper")
    }
    fn meta(&self, owner: &Principal, data_ref: &DataRef) -> Result<ArtifactMeta, StoreError> {
        let _ = (owner, data_ref);
        unimplemented!("store helper")
    }
    fn list(
        &self,
        owner: &Principal,
        limit: usize,
    ) -> Result<(Vec<ArtifactMeta>, u64), StoreError> {
        let _ = (owner, limit);
        unimplemented!("store helper")
    }
    fn usage(&self, owner: &Principal) -> Result<u64, StoreError> {
        let _ = owner;
        unimplemented!("store helper")
    }
    fn sweep(&self) -> Result<SweepReport, StoreError> {
        unimplemented!("store helper")
    }
}
