//! Artifacts through two replicas sharing one bucket and one index.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::{Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use dataref_protocol::{DataRef, Principal, Timestamp};
use dataref_replica::SharedError;
use dataref_store::{ArtifactStore, Lineage, ManualClock, StoreError, StoreLimits, SystemClock};

use crate::{Services, store};

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
    ]))
}

fn batch(from: i64, rows: i64) -> RecordBatch {
    let ids: Vec<i64> = (from..from + rows).collect();
    let names: Vec<Option<String>> = ids
        .iter()
        .map(|i| (i % 7 != 0).then(|| format!("name-{i}")))
        .collect();
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from(ids)),
            Arc::new(StringArray::from(names)),
        ],
    )
    .unwrap()
}

/// A table of `owner`'s being written.
fn writer(store: &dyn ArtifactStore, owner: &Principal) -> Box<dyn dataref_store::TableWriter> {
    store
        .create_table(owner, schema(), Lineage::new("test", serde_json::json!({})))
        .unwrap()
}

fn write(store: &dyn ArtifactStore, owner: &Principal, rows: i64) -> DataRef {
    write_from(store, owner, 0, rows)
}

/// A table of `rows` rows whose ids start at `from`.
fn write_from(store: &dyn ArtifactStore, owner: &Principal, from: i64, rows: i64) -> DataRef {
    let mut w = writer(store, owner);
    let mut at = 0;
    while at < rows {
        let n = (rows - at).min(50_000);
        w.write(&batch(from + at, n)).unwrap();
        at += n;
    }
    w.finish().unwrap().data_ref
}

fn principal(name: &str) -> Principal {
    Principal::new(name).unwrap()
}

fn limits() -> StoreLimits {
    StoreLimits::default()
}

/// A replica's store over a home of its own (returned with it, to keep it).
fn replica_store(
    s: &Services,
    config: &dataref_config::SharedConfig,
) -> (tempfile::TempDir, Arc<dyn ArtifactStore>) {
    let home = tempfile::tempdir().unwrap();
    let store = store(
        &s.replica(home.path(), config),
        limits(),
        Arc::new(SystemClock),
    );
    (home, store)
}

#[test]
fn a_table_written_through_one_replica_is_read_through_the_other() {
    let s = Services::start();
    let (home_a, home_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let config = s.config();
    let a = store(
        &s.replica(home_a.path(), &config),
        limits(),
        Arc::new(SystemClock),
    );
    let b = store(
        &s.replica(home_b.path(), &config),
        limits(),
        Arc::new(SystemClock),
    );
    let alice = principal("alice");
    let r = write(a.as_ref(), &alice, 25_000);

    let on_b = b.open_table(&alice, &r).unwrap();
    assert_eq!(on_b.meta.rows, 25_000);
    assert_eq!(on_b.meta.null_counts, vec![0, 3572]);
    let total: usize = on_b.batches.iter().map(RecordBatch::num_rows).sum();
    assert_eq!(total, 25_000);
    let on_a = a.open_table(&alice, &r).unwrap();
    assert_eq!(
        on_a.batches, on_b.batches,
        "the same bytes on both replicas"
    );
    // B fetched the file into its own cache; the sandbox's descriptor works there too.
    assert!(on_b.path.starts_with(home_b.path()), "{:?}", on_b.path);
    let file = b.open_file(&alice, &r).unwrap();
    assert_eq!(file.metadata().unwrap().len(), on_b.meta.bytes);
    // Listed on either replica, newest first.
    let r2 = write(b.as_ref(), &alice, 10);
    let (listed, total) = a.list(&alice, 10).unwrap();
    assert_eq!(total, 2);
    assert_eq!(
        listed
            .iter()
            .map(|m| m.data_ref.clone())
            .collect::<Vec<_>>(),
        vec![r2, r.clone()]
    );
    assert_eq!(a.usage(&alice).unwrap(), b.usage(&alice).unwrap());
    // A receipt written through one replica reads back whole through the other; a table
    // without one reads as having none.
    let mut receipt = dataref_protocol::Receipt::started(Timestamp(1_800_000_000));
    receipt.sql = Some("SELECT 1".into());
    let mut w = a
        .create_table(
            &alice,
            schema(),
            Lineage::new("query", serde_json::json!({})).with_receipt(receipt.clone()),
        )
        .unwrap();
    w.write(&batch(0, 3)).unwrap();
    let with = w.finish().unwrap().data_ref;
    assert_eq!(
        b.meta(&alice, &with).unwrap().lineage.receipt,
        Some(receipt)
    );
    assert_eq!(b.meta(&alice, &r).unwrap().lineage.receipt, None);
}

#[test]
fn another_principal_gets_the_unknown_answer_on_every_replica() {
    let s = Services::start();
    let (home_a, home_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let config = s.config();
    let a = store(
        &s.replica(home_a.path(), &config),
        limits(),
        Arc::new(SystemClock),
    );
    let b = store(
        &s.replica(home_b.path(), &config),
        limits(),
        Arc::new(SystemClock),
    );
    let r = write(a.as_ref(), &principal("alice"), 100);
    let unknown = DataRef::from_random_bytes([7; 16]);
    let mallory = principal("mallory");
    for store in [&a, &b] {
        let theirs = store.map_table(&mallory, &r).unwrap_err().to_string();
        let missing = store.map_table(&mallory, &unknown).unwrap_err().to_string();
        assert_eq!(
            theirs.replace(r.as_str(), "REF"),
            missing.replace(unknown.as_str(), "REF")
        );
        assert!(matches!(
            store.open_file(&mallory, &r),
            Err(StoreError::NotFound { .. })
        ));
        assert_eq!(store.list(&mallory, 10).unwrap().1, 0);
    }
}

#[test]
fn the_quota_holds_across_replicas_writing_at_once() {
    let s = Services::start();
    let config = s.config();
    let homes: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    // Each table is about 40 kB: the quota fits two of them, not four.
    let limits = StoreLimits {
        owner_quota_bytes: 100_000,
        ..StoreLimits::default()
    };
    let stores: Vec<_> = homes
        .iter()
        .map(|h| {
            store(
                &s.replica(h.path(), &config),
                limits.clone(),
                Arc::new(SystemClock),
            )
        })
        .collect();
    let one = write(stores[0].as_ref(), &principal("bob"), 2_000);
    let size = stores[0].meta(&principal("bob"), &one).unwrap().bytes;
    assert!(size > 30_000 && size < 50_000, "{size}");
    let outcomes: Vec<Result<(), StoreError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|i| {
                let store = stores[i % 2].clone();
                scope.spawn(move || {
                    let mut w = store.create_table(
                        &principal("bob"),
                        schema(),
                        Lineage::new("test", serde_json::json!({})),
                    )?;
                    w.write(&batch(0, 2_000))?;
                    w.finish().map(drop)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let stored = outcomes.iter().filter(|o| o.is_ok()).count();
    assert_eq!(stored, 1, "{outcomes:?}");
    for o in outcomes.iter().filter_map(|o| o.as_ref().err()) {
        assert!(matches!(o, StoreError::QuotaExceeded { .. }), "{o:?}");
    }
    assert!(stores[1].usage(&principal("bob")).unwrap() <= 100_000);
    assert_eq!(stores[1].list(&principal("bob"), 10).unwrap().1, 2);
}

#[test]
fn two_sweepers_racing_remove_each_expired_artifact_once() {
    let s = Services::start();
    let config = s.config();
    let (home_a, home_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let clock = Arc::new(ManualClock::new(Timestamp(1_000_000)));
    let limits = StoreLimits {
        ttl: Duration::from_secs(60),
        ..StoreLimits::default()
    };
    let shared_a = s.replica(home_a.path(), &config);
    let a = store(&shared_a, limits.clone(), clock.clone());
    let b = store(&s.replica(home_b.path(), &config), limits, clock.clone());
    let alice = principal("alice");
    let refs: HashSet<String> = (0..24)
        .map(|i| write(if i % 2 == 0 { a.as_ref() } else { b.as_ref() }, &alice, 50))
        .map(|r| r.as_str().to_owned())
        .collect();
    // Every replica has read every table, so both caches hold all of them.
    for r in &refs {
        let r = DataRef::parse(r).unwrap();
        a.open_file(&alice, &r).unwrap();
        b.open_file(&alice, &r).unwrap();
    }
    clock.advance(61);
    let (ra, rb) = std::thread::scope(|scope| {
        let ha = scope.spawn(|| a.sweep().unwrap());
        let hb = scope.spawn(|| b.sweep().unwrap());
        (ha.join().unwrap(), hb.join().unwrap())
    });
    assert_eq!(ra.removed + rb.removed, 24, "{ra:?} {rb:?}");
    // Nothing is left for either, in the index or in the bucket.
    assert_eq!(a.list(&alice, 100).unwrap().1, 0);
    assert_eq!(shared_a.sweep_orphans(Duration::ZERO).unwrap(), 0);
    for r in &refs {
        let r = DataRef::parse(r).unwrap();
        assert!(matches!(
            b.open_file(&alice, &r),
            Err(StoreError::NotFound { .. })
        ));
    }
}

#[test]
fn an_object_no_row_names_is_swept_as_an_orphan() {
    let s = Services::start();
    let config = s.config();
    let home = tempfile::tempdir().unwrap();
    let shared = s.replica(home.path(), &config);
    let a = store(&shared, limits(), Arc::new(SystemClock));
    let alice = principal("alice");
    // Large enough for piece hashes beside each object: they go with their object.
    let kept = write(a.as_ref(), &alice, 300_000);
    let lost = write(a.as_ref(), &alice, 300_000);
    let bucket = Bucket::new(&s);
    assert!(bucket.get_at(&bucket.hashes_key(&lost)).is_some());
    // A replica killed between the upload and the row leaves exactly this: an object whose
    // ref no row names.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(s.pg.execute(&format!(
        "DELETE FROM dataref_artifacts WHERE ref = '{}'",
        lost.as_str()
    )))
    .unwrap();
    // Young objects are left alone: their row may be on its way.
    assert_eq!(shared.sweep_orphans(Duration::from_secs(3600)).unwrap(), 0);
    assert_eq!(shared.sweep_orphans(Duration::ZERO).unwrap(), 2);
    assert_eq!(shared.sweep_orphans(Duration::ZERO).unwrap(), 0);
    assert!(bucket.get_at(&bucket.hashes_key(&lost)).is_none());
    assert!(bucket.get_at(&bucket.hashes_key(&kept)).is_some());
    assert!(a.open_table(&alice, &kept).is_ok());
    assert!(matches!(
        a.open_table(&alice, &lost),
        Err(StoreError::NotFound { .. })
    ));
}

#[test]
#[expect(
    clippy::disallowed_methods,
    reason = "looks at the replica's cache directory itself"
)]
fn the_cache_is_bounded_and_a_mapped_file_outlives_its_eviction() {
    let s = Services::start();
    let mut config = s.config();
    config.cache_bytes = 300_000;
    let (_home_a, a) = replica_store(&s, &config);
    let home_b = tempfile::tempdir().unwrap();
    let shared_b = s.replica(home_b.path(), &config);
    let b = store(&shared_b, limits(), Arc::new(SystemClock));
    let alice = principal("alice");
    // About 200 kB each: B's cache holds one at a time.
    let refs: Vec<DataRef> = (0..4).map(|_| write(a.as_ref(), &alice, 10_000)).collect();
    let first = b.map_table(&alice, &refs[0]).unwrap();
    let first_batches = first.batches(None).unwrap();
    for r in &refs[1..] {
        let t = b.open_table(&alice, r).unwrap();
        assert_eq!(t.meta.rows, 10_000);
        assert!(
            shared_b.cache_bytes() <= 300_000,
            "{}",
            shared_b.cache_bytes()
        );
    }
    assert!(
        !first.path.exists(),
        "the first file was evicted from the cache"
    );
    // Its mapping still reads, and a new read fetches it again.
    assert_eq!(first.batches(None).unwrap(), first_batches);
    let again = b.open_table(&alice, &refs[0]).unwrap();
    assert_eq!(again.batches, first_batches);
}

#[test]
fn a_stopped_object_store_is_a_clear_error_and_everything_works_again_after() {
    let mut s = Services::start();
    let config = s.config();
    let (home_a, home_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = store(
        &s.replica(home_a.path(), &config),
        limits(),
        Arc::new(SystemClock),
    );
    let b = store(
        &s.replica(home_b.path(), &config),
        limits(),
        Arc::new(SystemClock),
    );
    let alice = principal("alice");
    let before = write(a.as_ref(), &alice, 1_000);
    s.s3.stop().unwrap();

    // A read that needs the bucket (B has not cached it) and a write both fail soon, with
    // the same words for the model, and store nothing.
    let started = Instant::now();
    let read = b.open_table(&alice, &before).unwrap_err();
    assert!(read.is_transient(), "{read:?}");
    assert_eq!(
        read.to_string(),
        "the shared artifact store is unavailable right now"
    );
    assert!(read.hint().unwrap().contains("try the same call again"));
    let mut w = writer(a.as_ref(), &alice);
    w.write(&batch(0, 100)).unwrap();
    let write_err = w.finish().unwrap_err();
    assert!(write_err.is_transient(), "{write_err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(40),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        a.list(&alice, 10).unwrap().1,
        1,
        "the failed write left no row"
    );
    // A already had it: reading from its cache needs only the index.
    assert_eq!(a.open_table(&alice, &before).unwrap().meta.rows, 1_000);

    s.s3.restart().unwrap();
    let t = b.open_table(&alice, &before).unwrap();
    assert_eq!(t.meta.rows, 1_000);
    // The restarted server may take a moment before it takes writes again: until then a
    // write is the same clear error, never a partial artifact.
    let t0 = Instant::now();
    let after = loop {
        let mut w = b
            .create_table(
                &alice,
                schema(),
                Lineage::new("test", serde_json::json!({})),
            )
            .unwrap();
        w.write(&batch(0, 10)).unwrap();
        match w.finish() {
            Ok(m) => break m.data_ref,
            Err(e) => {
                assert!(e.is_transient(), "{e:?}");
                assert!(t0.elapsed() < Duration::from_secs(60), "no recovery: {e:?}");
                eprintln!("{:?} after the restart: {e:?}", t0.elapsed());
            }
        }
    };
    assert_eq!(a.list(&alice, 10).unwrap().1, 2);
    assert_eq!(a.open_table(&alice, &after).unwrap().meta.rows, 10);
}

#[test]
fn a_missing_credential_or_an_unreachable_index_is_said_at_connect() {
    let s = Services::start();
    let home = tempfile::tempdir().unwrap();
    let no_keys = |_: &str| None;
    let e = dataref_replica::Shared::connect(&s.config(), home.path(), &no_keys).unwrap_err();
    assert!(matches!(e, SharedError::Config { .. }), "{e:?}");
    assert!(e.to_string().contains("AWS_ACCESS_KEY_ID"), "{e}");
    let mut config = s.config();
    config.index = "postgresql://nobody@127.0.0.1:1/none".into();
    let e = dataref_replica::Shared::connect(&config, home.path(), &s.env()).unwrap_err();
    assert!(e.is_unavailable(), "{e:?}");
    assert!(e.to_string().contains("PostgreSQL"), "{e}");
}

/// The bucket as someone outside dataref sees it: the test's own S3 client.
struct Bucket {
    store: object_store::aws::AmazonS3,
    rt: tokio::runtime::Runtime,
    prefix: String,
}

impl Bucket {
    fn new(s: &Services) -> Self {
        let store = object_store::aws::AmazonS3Builder::new()
            .with_bucket_name(s.s3.bucket())
            .with_region(s.s3.region())
            .with_endpoint(s.s3.endpoint())
            .with_allow_http(true)
            .with_access_key_id(s.s3.access_key())
            .with_secret_access_key(s.s3.secret_key())
            .build()
            .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        Self {
            store,
            rt,
            prefix: s.prefix.clone(),
        }
    }

    fn key(&self, r: &DataRef) -> object_store::path::Path {
        object_store::path::Path::from(format!("{}/artifacts/{}.arrow", self.prefix, r.as_str()))
    }

    /// The key of the piece hashes kept beside `r`'s object.
    fn hashes_key(&self, r: &DataRef) -> object_store::path::Path {
        object_store::path::Path::from(format!("{}.b3", self.key(r)))
    }

    fn get_at(&self, key: &object_store::path::Path) -> Option<Vec<u8>> {
        use object_store::ObjectStoreExt;
        self.rt.block_on(async {
            match self.store.get(key).await {
                Ok(got) => Some(got.bytes().await.unwrap().to_vec()),
                Err(object_store::Error::NotFound { .. }) => None,
                Err(e) => panic!("{e}"),
            }
        })
    }

    fn put_at(&self, key: &object_store::path::Path, bytes: Vec<u8>) {
        use object_store::ObjectStoreExt;
        self.rt.block_on(self.store.put(key, bytes.into())).unwrap();
    }

    fn get(&self, r: &DataRef) -> Vec<u8> {
        use object_store::ObjectStoreExt;
        self.rt.block_on(async {
            let got = self.store.get(&self.key(r)).await.unwrap();
            got.bytes().await.unwrap().to_vec()
        })
    }

    fn put(&self, r: &DataRef, bytes: Vec<u8>) {
        use object_store::ObjectStoreExt;
        self.rt
            .block_on(self.store.put(&self.key(r), bytes.into()))
            .unwrap();
    }

    fn delete(&self, r: &DataRef) {
        use object_store::ObjectStoreExt;
        self.rt.block_on(self.store.delete(&self.key(r))).unwrap();
    }
}

/// The outside test's damage, done to an artifact's object: one bit, every 1009th byte of
/// the middle, the last byte, another valid table of the same shape, a truncation, a
/// deletion. A replica with a cold cache refuses each as damaged (naming the table, listed
/// all the while) and caches nothing; once the object is restored, every replica reads the
/// right values. The table is ~20 MB, so a download is several ranged parts fetched at
/// once: damage in any part, and a part that never comes, are caught.
#[test]
fn damaged_objects_are_refused_on_every_replica_and_restored_ones_read() {
    const ROWS: i64 = 900_000;
    let s = Services::start();
    let config = s.config();
    let (_writer_home, a) = replica_store(&s, &config);
    // After a replica: it installs the process's TLS provider.
    let bucket = Bucket::new(&s);
    let alice = principal("alice");
    let r = write(a.as_ref(), &alice, ROWS);
    // Another valid table: the same shape and rows, other values.
    let other = write_from(a.as_ref(), &alice, 1, ROWS);
    let good = bucket.get(&r);
    let other_bytes = bucket.get(&other);
    assert_ne!(good, other_bytes);
    assert!(
        good.len() > 2 * (8 << 20),
        "{} bytes: several parts",
        good.len()
    );

    type Damage = fn(&mut Vec<u8>, &[u8]);
    let cases: [(&str, Option<Damage>); 6] = [
        (
            "one bit",
            Some(|b, _| {
                let mid = b.len() / 2;
                b[mid] ^= 0x20;
            }),
        ),
        (
            "many bytes",
            Some(|b, _| {
                for i in (b.len() / 4..b.len() * 3 / 4).step_by(1009) {
                    b[i] = !b[i];
                }
            }),
        ),
        (
            "another table",
            Some(|b, o| {
                b.clear();
                b.extend_from_slice(o);
            }),
        ),
        (
            "the last byte",
            Some(|b, _| {
                if let Some(last) = b.last_mut() {
                    *last = !*last;
                }
            }),
        ),
        ("truncated", Some(|b, _| b.truncate(b.len() / 2))),
        ("deleted", None),
    ];
    for (what, damage) in cases {
        match damage {
            Some(damage) => {
                let mut bad = good.clone();
                damage(&mut bad, &other_bytes);
                bucket.put(&r, bad.clone());
                assert_eq!(bucket.get(&r), bad, "{what}: the bucket holds the damage");
            }
            None => bucket.delete(&r),
        }
        let (cold, b) = replica_store(&s, &config);
        for _ in 0..2 {
            let e = match b.open_table(&alice, &r) {
                Err(e) => e,
                Ok(t) => panic!("{what}: served {:?}", t.meta.checksum),
            };
            assert!(e.is_damage(), "{what}: {e:?}");
            assert!(e.to_string().contains(r.as_str()), "{what}: {e}");
            let e = b.open_file(&alice, &r).unwrap_err();
            assert!(e.is_damage(), "{what}: {e:?}");
        }
        let cached = crate::files_in_tree(cold.path());
        assert!(
            !cached.iter().any(|n| n.contains(r.as_str())),
            "{what}: nothing of it cached: {cached:?}"
        );
        let (listed, _) = b.list(&alice, 10).unwrap();
        assert!(
            listed.iter().any(|m| m.data_ref == r),
            "{what}: still listed"
        );

        bucket.put(&r, good.clone());
        // The replica that refused it, and the writer, read the right values.
        for replica in [&b, &a] {
            let t = replica.open_table(&alice, &r).unwrap();
            assert_eq!(t.meta.rows, ROWS as u64, "{what}");
            let ids = t.batches[0]
                .column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap();
            assert_eq!(ids.value(1), 1, "{what}");
            let last = t.batches.last().unwrap().column(0);
            let last = last.as_any().downcast_ref::<Int64Array>().unwrap();
            assert_eq!(last.value(last.len() - 1), ROWS - 1, "{what}");
        }
    }
}

/// A replica's own cached copy damaged on its disk: the next process to map it finds the
/// mismatch, drops the copy and fetches the object again, once, and serves the right bytes.
#[test]
fn a_damaged_cached_copy_is_fetched_again() {
    let s = Services::start();
    let config = s.config();
    let home = tempfile::tempdir().unwrap();
    let alice = principal("alice");
    let r = {
        let a = store(
            &s.replica(home.path(), &config),
            limits(),
            Arc::new(SystemClock),
        );
        write(a.as_ref(), &alice, 5_000)
    };
    let copy = crate::files_in_tree(home.path())
        .into_iter()
        .find(|p| p.contains(r.as_str()) && !p.contains("/.tmp/"))
        .expect("the writer keeps a copy");
    #[expect(clippy::disallowed_methods, reason = "damaging the cache on purpose")]
    {
        let mut bytes = std::fs::read(&copy).unwrap();
        bytes[300] ^= 1;
        std::fs::write(&copy, bytes).unwrap();
    }
    let a = store(
        &s.replica(home.path(), &config),
        limits(),
        Arc::new(SystemClock),
    );
    let t = a.open_table(&alice, &r).unwrap();
    assert_eq!(t.meta.rows, 5_000);
    assert_eq!(
        t.meta.checksum,
        Some(dataref_store::Checksum::of(&Bucket::new(&s).get(&r)))
    );
}

/// Parts count in the cache's bound as whole files do: a replica reading tables larger
/// together than its cache stays within it, and a table whose parts were evicted is
/// fetched again, right.
#[test]
fn parts_count_in_the_cache_bound() {
    let s = Services::start();
    let mut config = s.config();
    config.cache_bytes = 12 << 20;
    let (_home_a, a) = replica_store(&s, &config);
    let home_b = tempfile::tempdir().unwrap();
    let shared_b = s.replica(home_b.path(), &config);
    let b = store(&shared_b, limits(), Arc::new(SystemClock));
    let alice = principal("alice");
    // About 6 MB each: B's cache holds two.
    let refs: Vec<DataRef> = (0..3).map(|_| write(a.as_ref(), &alice, 300_000)).collect();
    let expected: Vec<i64> = (0..300_000).collect();
    for r in refs.iter().chain(&refs[..1]) {
        let t = b.map_columns(&alice, r).unwrap();
        assert_eq!(ids_of(&t.batches(Some(&[0])).unwrap()), expected);
        assert_eq!(
            t.batches(None).unwrap().len(),
            t.batches(Some(&[1])).unwrap().len()
        );
        assert!(
            shared_b.cache_bytes() <= 12 << 20,
            "{}",
            shared_b.cache_bytes()
        );
        assert!(
            shared_b.cache_bytes() >= 5 << 20,
            "{}",
            shared_b.cache_bytes()
        );
    }
}

/// Bytes of `file` on disk (a sparse file's holes take none).
#[expect(
    clippy::disallowed_methods,
    reason = "a replica's cache, looked at from outside"
)]
fn allocated(file: &str) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(file).unwrap().blocks() * 512
}

/// The ids of `batches` (one column of ids).
fn ids_of(batches: &[RecordBatch]) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| {
            b.column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .values()
                .to_vec()
        })
        .collect()
}

/// A query's columns of a table another replica wrote: a replica that does not have it
/// fetches only the pieces those columns lie in (the rest of its file is a hole), each
/// checked against the piece hashes kept beside the object, which are checked against the
/// index's checksum. Damage where the columns lie is refused as damage, once fetched
/// again; damage elsewhere is never read; an object cut short or gone is damage too. Without the piece hashes, or with wrong or short
/// ones, the table is read whole and checked whole.
#[test]
fn a_few_columns_of_a_table_kept_elsewhere_are_fetched_in_parts() {
    const ROWS: i64 = 900_000;
    let s = Services::start();
    let config = s.config();
    let (_writer_home, a) = replica_store(&s, &config);
    let bucket = Bucket::new(&s);
    let alice = principal("alice");
    let r = write(a.as_ref(), &alice, ROWS);
    let good = bucket.get(&r);
    let hashes = bucket
        .get_at(&bucket.hashes_key(&r))
        .expect("piece hashes beside the object");
    assert_eq!(hashes.len(), good.len().div_ceil(64 << 10) * 32);
    let expected: Vec<i64> = (0..ROWS).collect();

    let cold = || replica_store(&s, &config);
    let part_of = |home: &std::path::Path| {
        crate::files_in_tree(home)
            .into_iter()
            .find(|p| p.contains(r.as_str()) && p.ends_with(".part"))
    };

    // The ids alone: about 40% of the file (8 of ~20 bytes a row), never all of it.
    let (home, b) = cold();
    let t = b.map_columns(&alice, &r).unwrap();
    assert_eq!(ids_of(&t.batches(Some(&[0])).unwrap()), expected);
    let part = part_of(home.path()).expect("a file of parts");
    let fetched = allocated(&part);
    assert!(
        fetched < good.len() as u64 / 2,
        "{fetched} of {} bytes fetched for one column of two",
        good.len()
    );
    // The names, later: the same file, filled in; the right values.
    let names = t.batches(Some(&[1])).unwrap();
    let name = names[0]
        .column(0)
        .as_any()
        .downcast_ref::<StringArray>()
        .unwrap();
    assert_eq!(name.value(1), "name-1");
    assert!(arrow_array::Array::is_null(name, 7));
    assert!(allocated(&part) >= good.len() as u64 - (64 << 10));
    drop((t, b, home));

    // Where the bytes lie: id 123,456 in the ids, "name-123457" in the names.
    let id_at = good
        .windows(16)
        .position(|w| w[..8] == 123_456i64.to_le_bytes() && w[8..] == 123_457i64.to_le_bytes())
        .unwrap();
    let name_at = good.windows(11).position(|w| w == b"name-123457").unwrap();
    for (what, at, read, refused) in [("a name", name_at, 0usize, 1usize), ("an id", id_at, 1, 0)] {
        let mut bad = good.clone();
        bad[at] ^= 0x04;
        bucket.put(&r, bad);
        let (_home, b) = cold();
        let t = b.map_columns(&alice, &r).unwrap();
        // The column that does not hold the damage reads right: none of the damage is read.
        let other = t.batches(Some(&[read])).unwrap();
        assert_eq!(
            other.iter().map(RecordBatch::num_rows).sum::<usize>(),
            ROWS as usize
        );
        let e = t.batches(Some(&[refused])).unwrap_err();
        assert!(e.is_damage(), "{what}: {e:?}");
        assert!(e.to_string().contains(r.as_str()), "{what}: {e}");
        // Still refused, and the whole read says so too.
        assert!(
            t.batches(Some(&[refused])).unwrap_err().is_damage(),
            "{what}"
        );
        assert!(b.open_table(&alice, &r).unwrap_err().is_damage(), "{what}");
        bucket.put(&r, good.clone());
    }

    // The object cut short, then gone: damage, named, whatever the query reads.
    for (what, cut) in [("truncated", Some(good.len() / 2)), ("deleted", None)] {
        match cut {
            Some(n) => bucket.put(&r, good[..n].to_vec()),
            None => bucket.delete(&r),
        }
        let (_home, b) = cold();
        let t = b.map_columns(&alice, &r).unwrap();
        let e = t.batches(Some(&[0])).unwrap_err();
        assert!(e.is_damage(), "{what}: {e:?}");
        assert!(e.to_string().contains(r.as_str()), "{what}: {e}");
        bucket.put(&r, good.clone());
    }

    // Piece hashes wrong, short, then missing: read whole, and right.
    let mut wrong = hashes.clone();
    wrong[40] ^= 1;
    let short = hashes[..hashes.len() / 2].to_vec();
    for (what, outboard) in [
        ("wrong", Some(wrong)),
        ("short", Some(short)),
        ("missing", None),
    ] {
        match outboard {
            Some(h) => bucket.put_at(&bucket.hashes_key(&r), h),
            None => {
                use object_store::ObjectStoreExt;
                bucket
                    .rt
                    .block_on(bucket.store.delete(&bucket.hashes_key(&r)))
                    .unwrap();
            }
        }
        let (home, b) = cold();
        let t = b.map_columns(&alice, &r).unwrap();
        assert_eq!(ids_of(&t.batches(Some(&[0])).unwrap()), expected, "{what}");
        assert!(part_of(home.path()).is_none(), "{what}: read whole");
        let whole = crate::files_in_tree(home.path())
            .into_iter()
            .find(|p| p.ends_with(&format!("{}.arrow", r.as_str())))
            .expect("the whole table cached");
        assert!(allocated(&whole) >= good.len() as u64, "{what}: all of it");
    }
}
