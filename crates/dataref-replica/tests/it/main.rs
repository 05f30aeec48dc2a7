//! The shared backend against real parts: SeaweedFS's S3 server (`weed mini`, from PyPI)
//! and a throwaway PostgreSQL, both started by each test.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers fail by panicking, like the tests that call them"
)]
#![expect(
    clippy::expect_used,
    reason = "test helpers fail the test on setup errors"
)]

mod artifacts;
mod audit;
mod files;
mod limits;
mod sessions;
mod usage;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use dataref_config::SharedConfig;
use dataref_replica::Shared;
use dataref_store::{ArtifactStore, Clock, LocalStore, StoreLimits};
use dataref_test_support::{TestPostgres, TestS3};

/// The object store and the index a test's replicas share.
pub(crate) struct Services {
    pub s3: TestS3,
    pub pg: TestPostgres,
    /// Unique per test, so a bucket could be shared.
    pub prefix: String,
}

impl Services {
    pub(crate) fn start() -> Self {
        let s3 = TestS3::start().expect("start SeaweedFS (scripts/test installs it)");
        let pg = TestPostgres::start().expect("start PostgreSQL");
        Self {
            s3,
            pg,
            prefix: "deploy-a".into(),
        }
    }

    pub(crate) fn config(&self) -> SharedConfig {
        SharedConfig {
            bucket: self.s3.bucket().to_owned(),
            prefix: self.prefix.clone(),
            endpoint: Some(self.s3.endpoint()),
            region: self.s3.region().to_owned(),
            index: self.pg.url("postgres"),
            index_ca: None,
            cache_bytes: SharedConfig::DEFAULT_CACHE_BYTES,
            index_pool: 4,
            timeout: Duration::from_secs(10),
        }
    }

    /// What the environment would hold: the object store's credentials.
    pub(crate) fn env(&self) -> impl Fn(&str) -> Option<String> + use<> {
        let (key, secret) = (
            self.s3.access_key().to_owned(),
            self.s3.secret_key().to_owned(),
        );
        move |name| match name {
            "AWS_ACCESS_KEY_ID" => Some(key.clone()),
            "AWS_SECRET_ACCESS_KEY" => Some(secret.clone()),
            _ => None,
        }
    }

    /// A replica: its own data dir (cache), the shared bucket and index.
    pub(crate) fn replica(&self, home: &Path, config: &SharedConfig) -> Shared {
        Shared::connect(config, home, &self.env()).expect("connect to the shared store")
    }
}

pub(crate) fn store(
    shared: &Shared,
    limits: StoreLimits,
    clock: Arc<dyn Clock>,
) -> Arc<dyn ArtifactStore> {
    let store: LocalStore = shared
        .artifact_store(limits, clock)
        .expect("open the store");
    Arc::new(store)
}

/// The index over TLS: a server that requires it, its certificate checked against the CA
/// `[shared] index_ca` names; without that CA the same certificate is refused.
#[test]
fn the_index_is_reached_over_tls_and_its_certificate_is_checked() {
    let s3 = TestS3::start().expect("start SeaweedFS");
    let pg = TestPostgres::start_tls().expect("start PostgreSQL with TLS");
    let services = Services {
        s3,
        pg,
        prefix: "tls".into(),
    };
    let home = tempfile::tempdir().expect("tempdir");
    let mut config = services.config();
    config.index = services.pg.tls_url("postgres").expect("a TLS URL");
    config.index_ca = services.pg.tls_ca();
    let shared = services.replica(home.path(), &config);
    let store = store(
        &shared,
        StoreLimits::default(),
        Arc::new(dataref_store::SystemClock),
    );
    assert_eq!(
        store
            .list(
                &dataref_protocol::Principal::new("alice").expect("principal"),
                1
            )
            .expect("a query over TLS")
            .1,
        0
    );
    drop(store);
    drop(shared);
    // The system's trust store does not know the test CA: refused, and said so.
    config.index_ca = None;
    let other = tempfile::tempdir().expect("tempdir");
    let e = Shared::connect(&config, other.path(), &services.env()).expect_err("refused");
    assert!(e.is_unavailable(), "{e:?}");
    assert!(e.to_string().to_lowercase().contains("certificate"), "{e}");
}

/// Every file under `dir`, as paths, however deep.
#[expect(clippy::disallowed_methods, reason = "the test's own temp dir")]
pub(crate) fn files_in_tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push(p.display().to_string());
            }
        }
    }
    out
}
