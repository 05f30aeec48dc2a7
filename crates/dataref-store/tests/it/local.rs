use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type};
use arrow_array::{Array, ArrayRef, Int32Array, RecordBatch};
use dataref_protocol::{DataRef, Timestamp};
use dataref_store::{
    ArtifactStore, LocalStore, SampleOptions, StoreError, StoreLimits, SweepReport, SystemClock,
    describe, describe_data,
};

use crate::{Fixture, T0, batch, expected_nulls, files_in, lineage, owner, schema, write_table};

fn limits(max_artifact_bytes: u64, owner_quota_bytes: u64) -> StoreLimits {
    StoreLimits {
        ttl: Duration::from_secs(60),
        max_artifact_bytes,
        owner_quota_bytes,
    }
}

fn unknown_ref() -> DataRef {
    DataRef::from_random_bytes([0x5a; 16])
}

#[test]
fn multi_batch_table_with_nulls_round_trips() {
    let f = Fixture::new(limits(1 << 30, 1 << 30));
    let alice = owner("alice");
    // An empty batch in the middle must not disturb anything.
    let written = vec![
        batch(0, 100),
        batch(100, 0),
        batch(100, 37),
        batch(137, 263),
    ];
    let meta = write_table(&f.store, &alice, &written);

    assert_eq!(meta.rows, 400);
    assert_eq!(meta.null_counts, expected_nulls(400));
    assert_eq!(meta.schema, schema());
    assert_eq!(meta.owner, alice);
    assert_eq!(meta.lineage, lineage());
    assert_eq!(meta.created_at, Timestamp(T0));
    assert_eq!(meta.expires_at, Timestamp(T0 + 60));

    let table = f.store.open_table(&alice, &meta.data_ref).unwrap();
    assert_eq!(table.batches, written);
    assert_eq!(
        table.path,
        f.artifacts().join(format!("{}.arrow", meta.data_ref))
    );
    assert_eq!(std::fs::metadata(&table.path).unwrap().len(), meta.bytes);

    // The index row says the same as the writer did.
    let again = f.store.meta(&alice, &meta.data_ref).unwrap();
    assert_eq!(again.data_ref, meta.data_ref);
    assert_eq!(again.rows, meta.rows);
    assert_eq!(again.bytes, meta.bytes);
    assert_eq!(again.schema, meta.schema);
    assert_eq!(again.null_counts, meta.null_counts);
    assert_eq!(again.created_at, meta.created_at);
    assert_eq!(again.expires_at, meta.expires_at);
    assert_eq!(again.lineage, meta.lineage);
    assert_eq!(table.meta.null_counts, meta.null_counts);
}

#[test]
fn refs_are_well_formed_and_distinct() {
    let f = Fixture::new(limits(1 << 30, 1 << 30));
    let alice = owner("alice");
    let refs: Vec<DataRef> = (0..20)
        .map(|i| write_table(&f.store, &alice, &[batch(i, 1)]).data_ref)
        .collect();
    for r in &refs {
        let s = r.as_str();
        assert!(s.starts_with("data_"), "{s}");
        assert_eq!(s.len(), "data_".len() + 22, "{s}");
        assert_eq!(DataRef::parse(s).as_ref(), Ok(r));
    }
    let mut unique = refs.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), refs.len());
    // 20 draws of 128 bits never start the same 16 bits twice unless the source is broken;
    // a counter or clock-based ref would.
    let mut prefixes: Vec<&str> = refs.iter().map(|r| &r.as_str()[5..8]).collect();
    prefixes.sort();
    prefixes.dedup();
    assert!(prefixes.len() > 15, "refs look sequential: {refs:?}");
}

#[test]
fn another_owner_gets_exactly_the_unknown_answer() {
    let f = Fixture::new(limits(1 << 30, 1 << 30));
    let other_home = Fixture::new(limits(1 << 30, 1 << 30));
    let (alice, bob) = (owner("alice"), owner("bob"));
    let meta = write_table(&f.store, &alice, &[batch(0, 10)]);
    let r = &meta.data_ref;

    // The same ref where it never existed: the answer for an unknown ref.
    let unknown = other_home.store.open_table(&alice, r).unwrap_err();
    assert!(
        matches!(unknown, StoreError::NotFound { .. }),
        "{unknown:?}"
    );

    let by_bob = f.store.open_table(&bob, r).unwrap_err();
    assert_eq!(by_bob.to_string(), unknown.to_string());
    assert_eq!(by_bob.hint(), unknown.hint());
    assert!(matches!(by_bob, StoreError::NotFound { .. }), "{by_bob:?}");
    let meta_by_bob = f.store.meta(&bob, r).unwrap_err();
    assert_eq!(meta_by_bob.to_string(), unknown.to_string());

    let other = f.store.open_table(&bob, &unknown_ref()).unwrap_err();
    assert!(matches!(other, StoreError::NotFound { .. }), "{other:?}");

    assert_eq!(f.store.list(&bob, 10).unwrap().1, 0);
    assert_eq!(f.store.usage(&bob).unwrap(), 0);
    // Alice still sees it: the refusal was about bob, not a broken artifact.
    assert_eq!(f.store.open_table(&alice, r).unwrap().meta.rows, 10);

    // Expired reads the same too.
    f.clock.advance(60);
    let expired = f.store.open_table(&alice, r).unwrap_err();
    assert_eq!(expired.to_string(), unknown.to_string());
}

#[test]
fn artifacts_expire_after_ttl_and_sweep_removes_them() {
    let f = Fixture::new(limits(1 << 30, 1 << 30));
    let alice = owner("alice");
    let meta = write_table(&f.store, &alice, &[batch(0, 50)]);
    let file = f.artifacts().join(format!("{}.arrow", meta.data_ref));

    f.clock.advance(59);
    assert!(f.store.open_table(&alice, &meta.data_ref).is_ok());
    assert_eq!(f.store.sweep().unwrap(), SweepReport::default());
    assert!(file.exists());

    f.clock.advance(1);
    let err = f.store.open_table(&alice, &meta.data_ref).unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err:?}");
    assert!(matches!(
        f.store.meta(&alice, &meta.data_ref),
        Err(StoreError::NotFound { .. })
    ));
    assert_eq!(f.store.list(&alice, 10).unwrap().1, 0);
    assert_eq!(f.store.usage(&alice).unwrap(), 0);
    // Expired but not yet swept: still on disk.
    assert!(file.exists());
    assert_eq!(f.index_rows(meta.data_ref.as_str()), 1);

    let report = f.store.sweep().unwrap();
    assert_eq!(
        report,
        SweepReport {
            removed: 1,
            bytes_freed: meta.bytes
        }
    );
    assert!(!file.exists());
    assert_eq!(f.index_rows(meta.data_ref.as_str()), 0);
    assert_eq!(f.store.sweep().unwrap(), SweepReport::default());
}

#[test]
fn list_is_newest_first_bounded_and_counts_all() {
    let f = Fixture::new(limits(1 << 30, 1 << 30));
    let (alice, bob) = (owner("alice"), owner("bob"));
    let mut refs = Vec::new();
    for i in 0..5 {
        refs.push(
            write_table(&f.store, &alice, &[batch(i, 1)])
                .data_ref
                .to_string(),
        );
        // Two artifacts share a second: insertion order decides.
        if i != 2 {
            f.clock.advance(1);
        }
    }
    write_table(&f.store, &bob, &[batch(0, 1)]);

    let (metas, total) = f.store.list(&alice, 3).unwrap();
    assert_eq!(total, 5);
    let got: Vec<String> = metas.iter().map(|m| m.data_ref.to_string()).collect();
    assert_eq!(got, vec![refs[4].clone(), refs[3].clone(), refs[2].clone()]);
    assert!(metas.iter().all(|m| m.owner == alice));

    let (all, _) = f.store.list(&alice, 100).unwrap();
    let got: Vec<String> = all.iter().map(|m| m.data_ref.to_string()).collect();
    let mut newest_first = refs.clone();
    newest_first.reverse();
    assert_eq!(got, newest_first);
    assert_eq!(f.store.list(&alice, 0).unwrap().0.len(), 0);

    // The oldest expires first; the count follows.
    f.clock.advance(60 - 4);
    let (live, total) = f.store.list(&alice, 100).unwrap();
    assert_eq!(total, 4);
    assert!(live.iter().all(|m| m.data_ref.to_string() != refs[0]));
}

#[test]
fn crossing_the_byte_cap_aborts_and_leaves_nothing() {
    let cap = 100_000;
    let f = Fixture::new(limits(cap, 1 << 30));
    let alice = owner("alice");
    let mut w = f.store.create_table(&alice, schema(), lineage()).unwrap();
    let mut err = None;
    for i in 0..100 {
        if let Err(e) = w.write(&batch(i * 1000, 1000)) {
            err = Some(e);
            break;
        }
    }
    let err = err.expect("a 100k-row table fits under a 100 kB cap");
    assert!(
        matches!(err, StoreError::TooLarge { limit } if limit == cap),
        "{err:?}"
    );
    assert!(err.is_caller_error());
    assert!(w.rows() > 0 && w.rows() < 10_000, "{}", w.rows());
    // The partial file is gone at once, not only when the writer is dropped.
    assert_eq!(f.tmp_files(), Vec::<String>::new());
    // The writer keeps refusing.
    assert!(matches!(
        w.write(&batch(0, 1)),
        Err(StoreError::TooLarge { .. })
    ));
    assert!(matches!(w.finish(), Err(StoreError::TooLarge { .. })));
    assert_eq!(f.tmp_files(), Vec::<String>::new());
    assert_eq!(f.artifact_files(), Vec::<String>::new());
    assert_eq!(f.store.list(&alice, 10).unwrap().1, 0);

    // A table under the cap still works in the same store.
    let small = write_table(&f.store, &alice, &[batch(0, 1000)]);
    assert!(small.bytes <= cap);
}

#[test]
fn cap_smaller_than_the_header_fails_at_create() {
    let f = Fixture::new(limits(16, 1 << 30));
    let result = f.store.create_table(&owner("alice"), schema(), lineage());
    assert!(
        matches!(result, Err(StoreError::TooLarge { limit: 16 })),
        "{:?}",
        result.err()
    );
    assert_eq!(f.tmp_files(), Vec::<String>::new());
}

#[test]
fn owner_quota_bounds_what_one_owner_holds() {
    let quota = 100_000;
    let f = Fixture::new(limits(1 << 30, quota));
    let (alice, bob) = (owner("alice"), owner("bob"));
    let first = write_table(&f.store, &alice, &[batch(0, 1000)]);
    assert_eq!(f.store.usage(&alice).unwrap(), first.bytes);

    let mut w = f.store.create_table(&alice, schema(), lineage()).unwrap();
    let err = (0..10)
        .find_map(|i| w.write(&batch(i * 1000, 1000)).err())
        .expect("quota never reached");
    match err {
        StoreError::QuotaExceeded { quota: q, used } => {
            assert_eq!(q, quota);
            assert_eq!(used, first.bytes);
        }
        other => panic!("expected QuotaExceeded, got {other:?}"),
    }
    drop(w);
    assert_eq!(f.artifact_files().len(), 1);
    assert_eq!(f.tmp_files(), Vec::<String>::new());

    // Quotas are per owner.
    write_table(&f.store, &bob, &[batch(0, 2000)]);

    // Expired artifacts stop counting, swept or not.
    f.clock.advance(60);
    assert_eq!(f.store.usage(&alice).unwrap(), 0);
    write_table(&f.store, &alice, &[batch(0, 2000)]);
}

#[test]
fn quota_is_rechecked_when_concurrent_writes_finish() {
    let quota = 100_000;
    let f = Fixture::new(limits(1 << 30, quota));
    let alice = owner("alice");
    // Both start with the whole quota free; together they do not fit.
    let mut a = f.store.create_table(&alice, schema(), lineage()).unwrap();
    let mut b = f.store.create_table(&alice, schema(), lineage()).unwrap();
    for w in [&mut a, &mut b] {
        w.write(&batch(0, 1000)).unwrap();
        w.write(&batch(1000, 1000)).unwrap();
    }
    let first = a.finish().unwrap();
    assert!(
        first.bytes * 2 > quota,
        "test tables too small: {}",
        first.bytes
    );
    let err = b.finish().unwrap_err();
    match err {
        StoreError::QuotaExceeded { quota: q, used } => {
            assert_eq!((q, used), (quota, first.bytes));
        }
        other => panic!("expected QuotaExceeded, got {other:?}"),
    }
    assert_eq!(
        f.artifact_files(),
        vec![format!("{}.arrow", first.data_ref)]
    );
    assert_eq!(f.tmp_files(), Vec::<String>::new());
    assert_eq!(f.store.list(&alice, 10).unwrap().1, 1);
}

#[test]
fn dropping_a_writer_without_finish_removes_the_partial_file() {
    let f = Fixture::new(limits(1 << 30, 1 << 30));
    let alice = owner("alice");
    let mut w = f.store.create_table(&alice, schema(), lineage()).unwrap();
    w.write(&batch(0, 500)).unwrap();
    assert_eq!(w.rows(), 500);
    assert_eq!(
        f.tmp_files().len(),
        1,
        "the write should be in progress in .tmp"
    );
    drop(w);
    assert_eq!(f.tmp_files(), Vec::<String>::new());
    assert_eq!(f.artifact_files(), Vec::<String>::new());
    assert_eq!(f.store.list(&alice, 10).unwrap().1, 0);
    assert_eq!(f.store.usage(&alice).unwrap(), 0);
}

#[test]
fn a_batch_with_another_schema_is_rejected_without_losing_the_table() {
    let f = Fixture::new(limits(1 << 30, 1 << 30));
    let alice = owner("alice");
    let mut w = f.store.create_table(&alice, schema(), lineage()).unwrap();
    w.write(&batch(0, 10)).unwrap();
    let other: ArrayRef = Arc::new(Int32Array::from(vec![1, 2, 3]));
    let wrong = RecordBatch::try_from_iter([("id", other)]).unwrap();
    assert!(matches!(w.write(&wrong), Err(StoreError::SchemaMismatch)));
    w.write(&batch(10, 10)).unwrap();
    let meta = w.finish().unwrap();
    assert_eq!(meta.rows, 20);
    let table = f.store.open_table(&alice, &meta.data_ref).unwrap();
    assert_eq!(table.batches, vec![batch(0, 10), batch(10, 10)]);
}

#[test]
fn artifacts_survive_a_restart_until_their_ttl() {
    let mut f = Fixture::new(limits(1 << 30, 1 << 30));
    let alice = owner("alice");
    let written = vec![batch(0, 300), batch(300, 300)];
    let meta = write_table(&f.store, &alice, &written);

    f.restart();
    let table = f.store.open_table(&alice, &meta.data_ref).unwrap();
    assert_eq!(table.batches, written);
    assert_eq!(table.meta.null_counts, expected_nulls(600));
    assert_eq!(table.meta.expires_at, meta.expires_at);
    assert_eq!(f.store.usage(&alice).unwrap(), meta.bytes);

    // A restart does not reset the clock on an artifact.
    f.clock.advance(60);
    f.restart();
    assert!(matches!(
        f.store.open_table(&alice, &meta.data_ref),
        Err(StoreError::NotFound { .. })
    ));
}

#[test]
fn open_reconciles_the_disk_with_the_index() {
    let mut f = Fixture::new(limits(1 << 30, 1 << 30));
    let alice = owner("alice");
    let kept = write_table(&f.store, &alice, &[batch(0, 100)]);
    let lost = write_table(&f.store, &alice, &[batch(0, 100)]);

    // What a kill -9 can leave: a half-written temp file...
    std::fs::write(f.tmp().join("data_half.arrow"), b"ARROW1\0\0partial").unwrap();
    // ...and a file renamed into place whose index row was never committed.
    let stray = f.artifacts().join(format!("{}.arrow", unknown_ref()));
    std::fs::copy(
        f.artifacts().join(format!("{}.arrow", kept.data_ref)),
        &stray,
    )
    .unwrap();
    // And what a person can do: delete an artifact file by hand.
    std::fs::remove_file(f.artifacts().join(format!("{}.arrow", lost.data_ref))).unwrap();
    // Not ours: left alone.
    std::fs::write(f.artifacts().join("NOTES.txt"), b"hello").unwrap();

    f.restart();

    assert_eq!(f.tmp_files(), Vec::<String>::new());
    assert!(!stray.exists());
    assert!(f.artifacts().join("NOTES.txt").exists());
    assert_eq!(f.artifact_files(), vec![format!("{}.arrow", kept.data_ref)]);
    assert_eq!(f.index_rows(lost.data_ref.as_str()), 0);
    assert_eq!(f.index_rows(kept.data_ref.as_str()), 1);
    assert!(matches!(
        f.store.open_table(&alice, &lost.data_ref),
        Err(StoreError::NotFound { .. })
    ));
    assert_eq!(
        f.store
            .open_table(&alice, &kept.data_ref)
            .unwrap()
            .meta
            .rows,
        100
    );
    assert_eq!(f.store.list(&alice, 10).unwrap().1, 1);
    assert_eq!(f.store.usage(&alice).unwrap(), kept.bytes);
}

#[test]
fn a_damaged_artifact_file_is_an_error_not_a_panic() {
    let f = Fixture::new(limits(1 << 30, 1 << 30));
    let alice = owner("alice");
    let meta = write_table(&f.store, &alice, &[batch(0, 100)]);
    let path = f.artifacts().join(format!("{}.arrow", meta.data_ref));
    std::fs::write(&path, b"not an arrow file at all").unwrap();
    let err = f.store.open_table(&alice, &meta.data_ref).unwrap_err();
    assert!(!err.is_caller_error(), "{err:?}");
}

#[test]
fn many_threads_write_read_and_list_at_once() {
    const WRITERS: usize = 8;
    const TABLES: usize = 10;
    let home = tempfile::tempdir().unwrap();
    let store: Arc<dyn ArtifactStore> = Arc::new(
        LocalStore::open(home.path(), StoreLimits::default(), Arc::new(SystemClock)).unwrap(),
    );
    let done = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(WRITERS + 2));

    let readers: Vec<_> = (0..2)
        .map(|r| {
            let (store, done, start) = (store.clone(), done.clone(), start.clone());
            thread::spawn(move || {
                start.wait();
                let mut opened = 0usize;
                while !done.load(Ordering::SeqCst) {
                    for w in (r..WRITERS).step_by(2) {
                        let who = owner(&format!("writer{w}"));
                        let (metas, total) = store.list(&who, 3).unwrap();
                        assert!(metas.len() as u64 <= total);
                        for m in metas {
                            let t = store.open_table(&who, &m.data_ref).unwrap();
                            let rows: usize = t.batches.iter().map(|b| b.num_rows()).sum();
                            assert_eq!(rows as u64, m.rows);
                            assert_eq!(t.batches[0], batch(0, t.batches[0].num_rows() as i64));
                            opened += 1;
                        }
                    }
                }
                opened
            })
        })
        .collect();

    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (store, start) = (store.clone(), start.clone());
            thread::spawn(move || {
                let who = owner(&format!("writer{w}"));
                start.wait();
                (0..TABLES)
                    .map(|t| {
                        let n = (w * 100 + t * 10 + 1) as i64;
                        let meta = write_table(store.as_ref(), &who, &[batch(0, n), batch(n, n)]);
                        assert_eq!(meta.rows, 2 * n as u64);
                        meta.data_ref
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();

    let mut all_refs = Vec::new();
    for h in writers {
        all_refs.extend(h.join().unwrap());
    }
    done.store(true, Ordering::SeqCst);
    let opened: usize = readers.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(opened > 0, "readers never saw a table");

    for w in 0..WRITERS {
        let who = owner(&format!("writer{w}"));
        let (metas, total) = store.list(&who, 100).unwrap();
        assert_eq!(total, TABLES as u64);
        assert_eq!(metas.len(), TABLES);
    }
    all_refs.sort();
    all_refs.dedup();
    assert_eq!(all_refs.len(), WRITERS * TABLES);
    let artifacts = home.path().join("artifacts");
    assert_eq!(files_in(&artifacts).len(), WRITERS * TABLES);
    assert_eq!(files_in(&artifacts.join(".tmp")), Vec::<String>::new());
}

#[test]
fn a_million_rows_in_64k_batches_read_back() {
    const ROWS: i64 = 1_000_000;
    const BATCH: i64 = 64 * 1024;
    let f = Fixture::new(limits(1 << 30, 1 << 30));
    let alice = owner("alice");
    let mut w = f.store.create_table(&alice, schema(), lineage()).unwrap();
    let mut start = 0;
    while start < ROWS {
        let n = BATCH.min(ROWS - start);
        w.write(&batch(start, n)).unwrap();
        start += n;
    }
    assert_eq!(w.rows(), ROWS as u64);
    let meta = w.finish().unwrap();
    assert_eq!(meta.rows, ROWS as u64);
    assert_eq!(meta.null_counts, expected_nulls(ROWS));

    let table = f.store.open_table(&alice, &meta.data_ref).unwrap();
    assert_eq!(
        table.batches.len(),
        (ROWS as u64).div_ceil(BATCH as u64) as usize
    );
    let rows: usize = table.batches.iter().map(|b| b.num_rows()).sum();
    assert_eq!(rows as i64, ROWS);
    let last = table.batches.last().unwrap();
    let ids = last.column(0).as_primitive::<Int64Type>();
    assert_eq!(ids.value(ids.len() - 1), ROWS - 1);
    let amounts = last.column(1).as_primitive::<Float64Type>();
    assert_eq!(amounts.value(1), (ROWS - ids.len() as i64 + 1) as f64 * 1.5);
    let nulls: usize = table.batches.iter().map(|b| b.column(2).null_count()).sum();
    assert_eq!(nulls as u64, meta.null_counts[2]);
}

#[test]
fn layout_on_disk_is_as_documented() {
    let f = Fixture::new(limits(1 << 30, 1 << 30));
    let meta = write_table(&f.store, &owner("alice"), &[batch(0, 10)]);
    assert!(f.tmp().is_dir());
    assert_eq!(f.artifact_files(), vec![format!("{}.arrow", meta.data_ref)]);

    let conn = rusqlite::Connection::open(f.home().join("index.sqlite")).unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    let plan: String = conn
        .query_row(
            "EXPLAIN QUERY PLAN SELECT ref FROM artifacts WHERE owner = 'alice' \
             ORDER BY created_at DESC",
            [],
            |r| r.get(3),
        )
        .unwrap();
    assert!(plan.contains("artifacts_owner_created"), "{plan}");
    let (owner, schema, nulls, tool): (String, String, String, String) = conn
        .query_row(
            "SELECT owner, schema, null_counts, lineage_tool FROM artifacts WHERE ref = ?1",
            [meta.data_ref.as_str()],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .unwrap();
    assert_eq!(owner, "alice");
    assert!(schema.contains("\"region\""), "{schema}");
    assert_eq!(nulls, "[0,4,2]");
    assert_eq!(tool, "fetch_sales");
}

#[test]
fn a_second_store_on_the_same_home_leaves_the_first_ones_writes_alone() {
    // Two servers on one data dir (a stdio server per MCP host window, or `serve` beside
    // `bench`): the second to open must not take the first's write in progress for a
    // crash's leftovers.
    let f = Fixture::new(limits(1 << 30, 1 << 30));
    let alice = owner("alice");
    let mut w = f.store.create_table(&alice, schema(), lineage()).unwrap();
    w.write(&batch(0, 500)).unwrap();
    let second = LocalStore::open(f.home(), f.limits.clone(), f.clock.clone()).unwrap();
    assert_eq!(f.tmp_files().len(), 1, "the write in progress was removed");
    let meta = w.finish().unwrap();
    assert_eq!(
        second.open_table(&alice, &meta.data_ref).unwrap().meta.rows,
        500
    );
    drop(second);

    // Once every store is closed, the next open reconciles as after a crash.
    let mut f = f;
    std::fs::write(f.tmp().join("data_half.arrow"), b"ARROW1\0\0partial").unwrap();
    f.restart();
    assert_eq!(f.tmp_files(), Vec::<String>::new());
}

#[test]
fn artifact_files_are_private_to_the_server() {
    use std::os::unix::fs::PermissionsExt;
    let f = Fixture::new(limits(1 << 30, 1 << 30));
    for dir in [f.artifacts(), f.tmp()] {
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{} has mode {mode:o}", dir.display());
    }
}

/// What a reader of a mapped table gets is what the decoded table gives: the statistics of
/// every column or of some, and a description from the head alone.
#[test]
fn a_mapped_table_is_described_as_the_decoded_one() {
    let f = Fixture::new(StoreLimits::default());
    let alice = owner("alice");
    let batches = [batch(0, 1000), batch(1000, 1000), batch(2000, 500)];
    let meta = write_table(&f.store, &alice, &batches);
    let mapped = f.store.map_table(&alice, &meta.data_ref).unwrap();
    let table = f.store.open_table(&alice, &meta.data_ref).unwrap();
    assert_eq!(
        describe_data(&mapped, None, 0, 10).unwrap(),
        describe_data(&table, None, 0, 10).unwrap()
    );
    let some = ["region".to_owned(), "id".to_owned()];
    assert_eq!(
        describe_data(&mapped, Some(&some), 1, 1).unwrap(),
        describe_data(&table, Some(&some), 1, 1).unwrap()
    );

    let opts = SampleOptions::default();
    let head = mapped.head(opts.rows).unwrap();
    assert_eq!(head.batches, batches[..1]);
    assert_eq!(head.meta.rows, 2500);
    assert_eq!(describe(&head, opts), describe(&table, opts));
    // No sample asked: no batch read, and the note still says the rows were withheld.
    let withheld = SampleOptions { rows: 0, ..opts };
    let none = mapped.head(0).unwrap();
    assert!(none.batches.is_empty());
    let d = describe(&none, withheld);
    assert_eq!(d, describe(&table, withheld));
    assert!(d.sample_note.is_some_and(|n| n.contains("withholds")));
}

/// A column damaged on disk (invalid UTF-8 in the last batch): nothing of the table is
/// served, not even the columns or the head that the damage did not touch, since nothing
/// vouches for them any more; an error naming the table, not a panic.
#[test]
fn a_damaged_column_fails_every_reader_of_its_table() {
    let f = Fixture::new(StoreLimits::default());
    let alice = owner("alice");
    let meta = write_table(&f.store, &alice, &[batch(0, 1000), batch(1000, 1000)]);
    let path = f.artifacts().join(format!("{}.arrow", meta.data_ref));
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes
        .windows(7)
        .rposition(|w| w == b"region-")
        .expect("the last batch's text");
    bytes[at] = 0xff;
    std::fs::write(&path, &bytes).unwrap();

    let err = f.store.map_table(&alice, &meta.data_ref).unwrap_err();
    assert!(err.is_damage() && !err.is_caller_error(), "{err:?}");
    assert!(
        f.store
            .open_table(&alice, &meta.data_ref)
            .unwrap_err()
            .is_damage()
    );
    assert!(
        f.store
            .open_file(&alice, &meta.data_ref)
            .unwrap_err()
            .is_damage()
    );
}

/// Whether this process still maps `path` (a swept file's disk space is freed only when
/// nothing maps it).
#[cfg(target_os = "linux")]
fn mapped_by_this_process(path: &std::path::Path) -> bool {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let name = path.file_name().unwrap().to_str().unwrap();
    maps.lines().any(|l| l.contains(name))
}

/// Whether two reads of `data_ref` got the same decoded `id` arrays (the kept mapping).
fn same_columns(a: &dataref_store::MappedTable, b: &dataref_store::MappedTable) -> bool {
    let (a, b) = (
        a.batches(Some(&[0])).unwrap(),
        b.batches(Some(&[0])).unwrap(),
    );
    Arc::ptr_eq(a[0].column(0), b[0].column(0))
}

#[test]
fn a_table_read_again_shares_the_columns_decoded_the_first_time() {
    let f = Fixture::new(StoreLimits::default());
    let alice = owner("alice");
    let meta = write_table(&f.store, &alice, &[batch(0, 1000), batch(1000, 1000)]);

    let first = f.store.map_table(&alice, &meta.data_ref).unwrap();
    let region = first.batches(Some(&[2])).unwrap();
    let again = f.store.map_table(&alice, &meta.data_ref).unwrap();
    // Asked in another order, with another column beside it: `region` is the same arrays.
    let both = again.batches(Some(&[0, 2])).unwrap();
    assert_eq!(both.len(), 2);
    for (one, two) in region.iter().zip(&both) {
        assert!(Arc::ptr_eq(one.column(0), two.column(1)));
        assert_eq!(two.schema().field(0).name(), "id");
        assert_eq!(two.num_rows(), 1000);
    }
    // Every column, as `open_table` reads them, from the same decoded arrays.
    let whole = f.store.open_table(&alice, &meta.data_ref).unwrap();
    assert!(Arc::ptr_eq(whole.batches[1].column(0), both[1].column(0)));
    assert_eq!(whole.batches[1].schema(), schema());
    // No columns (`count(*)`): the row counts only.
    let none = again.batches(Some(&[])).unwrap();
    assert_eq!(none.iter().map(RecordBatch::num_rows).sum::<usize>(), 2000);
    let err = again.batches(Some(&[0, 3])).unwrap_err();
    assert!(err.to_string().contains("column 3"), "{err}");
}

#[test]
fn threads_reading_one_table_at_once_share_one_mapping() {
    let f = Fixture::new(StoreLimits::default());
    let alice = owner("alice");
    let meta = write_table(&f.store, &alice, &[batch(0, 5000)]);
    let start = Barrier::new(8);
    let ids: Vec<ArrayRef> = thread::scope(|s| {
        let reads: Vec<_> = (0..8)
            .map(|_| {
                s.spawn(|| {
                    start.wait();
                    let t = f.store.map_table(&alice, &meta.data_ref).unwrap();
                    t.batches(None).unwrap()[0].column(0).clone()
                })
            })
            .collect();
        reads.into_iter().map(|r| r.join().unwrap()).collect()
    });
    let again = f.store.map_table(&alice, &meta.data_ref).unwrap();
    let kept = again.batches(Some(&[0])).unwrap()[0].column(0).clone();
    // Each thread may have decoded its own copy at once; the next reader gets one of them.
    assert!(ids.iter().any(|id| Arc::ptr_eq(id, &kept)));
    assert!(ids.iter().all(|id| id.as_ref() == kept.as_ref()));
}

#[test]
fn the_least_recently_read_mapping_is_the_one_let_go() {
    let f = Fixture::new(StoreLimits::default());
    let alice = owner("alice");
    let metas: Vec<_> = (0..34)
        .map(|i| write_table(&f.store, &alice, &[batch(i * 10, 10)]))
        .collect();
    let map = |i: usize| f.store.map_table(&alice, &metas[i].data_ref).unwrap();
    let (first, second) = (map(0), map(1));
    for i in 2..32 {
        map(i);
    }
    // 32 kept; reading the first again makes the second the oldest.
    assert!(same_columns(&first, &map(0)));
    map(32);
    assert!(
        same_columns(&first, &map(0)),
        "the recently read one was let go"
    );
    assert!(!same_columns(&second, &map(1)), "more than 32 kept");
}

#[test]
fn a_kept_mapping_answers_only_its_owner_and_only_until_expiry() {
    let f = Fixture::new(limits(1 << 30, 1 << 30));
    let (alice, bob) = (owner("alice"), owner("bob"));
    let meta = write_table(&f.store, &alice, &[batch(0, 10)]);
    // Alice's read keeps the mapping and its decoded columns.
    assert_eq!(
        f.store
            .open_table(&alice, &meta.data_ref)
            .unwrap()
            .meta
            .rows,
        10
    );
    let unknown = f.store.map_table(&bob, &unknown_ref()).unwrap_err();
    let same_as_unknown = |err: StoreError| {
        assert!(matches!(err, StoreError::NotFound { .. }), "{err:?}");
        assert_eq!(
            err.to_string().replace(meta.data_ref.as_str(), "REF"),
            unknown.to_string().replace(unknown_ref().as_str(), "REF")
        );
    };
    same_as_unknown(f.store.map_table(&bob, &meta.data_ref).unwrap_err());
    same_as_unknown(f.store.open_table(&bob, &meta.data_ref).unwrap_err());
    // Expired and not yet swept, the mapping still kept: unknown to alice too.
    f.clock.advance(60);
    same_as_unknown(f.store.map_table(&alice, &meta.data_ref).unwrap_err());
    same_as_unknown(f.store.open_table(&alice, &meta.data_ref).unwrap_err());
}

#[cfg(target_os = "linux")]
#[test]
fn a_swept_artifact_is_not_kept_mapped_whichever_store_swept_it() {
    let f = Fixture::new(limits(1 << 30, 1 << 30));
    let alice = owner("alice");
    let file_of =
        |meta: &dataref_store::ArtifactMeta| f.artifacts().join(format!("{}.arrow", meta.data_ref));
    let mine = write_table(&f.store, &alice, &[batch(0, 50)]);
    drop(f.store.open_table(&alice, &mine.data_ref).unwrap());
    assert!(
        mapped_by_this_process(&file_of(&mine)),
        "kept for the next read"
    );
    f.clock.advance(60);
    assert_eq!(f.store.sweep().unwrap().removed, 1);
    assert!(!file_of(&mine).exists());
    assert!(
        !mapped_by_this_process(&file_of(&mine)),
        "a swept file stays mapped"
    );

    // Another server on the same home sweeps; this one's own sweep finds nothing to
    // remove in the index but still lets go of the file.
    let other = LocalStore::open(f.home(), f.limits.clone(), f.clock.clone()).unwrap();
    let theirs = write_table(&f.store, &alice, &[batch(0, 50)]);
    drop(f.store.open_table(&alice, &theirs.data_ref).unwrap());
    f.clock.advance(60);
    assert_eq!(other.sweep().unwrap().removed, 1);
    assert!(mapped_by_this_process(&file_of(&theirs)));
    assert_eq!(f.store.sweep().unwrap().removed, 0);
    assert!(
        !mapped_by_this_process(&file_of(&theirs)),
        "another's sweep kept it mapped"
    );
}

/// The damage the shared store's outside test did, done to a local artifact file: each
/// read (a mapping, a descriptor for the sandbox) is refused as damaged, naming the table;
/// after the bytes are put back, the same table reads with its values.
#[test]
fn damaged_bytes_are_refused_and_restored_bytes_read_again() {
    type Damage = fn(&mut Vec<u8>, &[u8]);
    let cases: [(&str, Damage); 5] = [
        ("one bit", |b, _| {
            let mid = b.len() / 2;
            b[mid] ^= 0x10;
        }),
        ("many bytes", |b, _| {
            for i in (b.len() / 4..b.len() * 3 / 4).step_by(1009) {
                b[i] = !b[i];
            }
        }),
        ("truncated", |b, _| b.truncate(b.len() - 100)),
        ("another table", |b, other| {
            b.clear();
            b.extend_from_slice(other);
        }),
        ("deleted", |b, _| b.clear()),
    ];
    for (what, damage) in cases {
        let mut fx = Fixture::new(StoreLimits::default());
        let alice = owner("alice");
        let meta = write_table(&fx.store, &alice, &[batch(0, 5000)]);
        // Another valid table of the same schema and size.
        let other = write_table(&fx.store, &alice, &[batch(10_000, 5000)]);
        let path = fx
            .artifacts()
            .join(format!("{}.arrow", meta.data_ref.as_str()));
        let good = std::fs::read(&path).unwrap();
        let other_bytes = std::fs::read(
            fx.artifacts()
                .join(format!("{}.arrow", other.data_ref.as_str())),
        )
        .unwrap();
        let mut bad = good.clone();
        damage(&mut bad, &other_bytes);
        // As a disk error or a person would: in place, or removed.
        if what == "deleted" {
            std::fs::remove_file(&path).unwrap();
        } else {
            std::fs::write(&path, &bad).unwrap();
        }
        // A fresh process (nothing verified yet). (A restart drops the row of a file that is
        // gone, as after a crash: the deleted file is found by the running process.)
        if what != "deleted" {
            fx.restart();
        }
        for read in ["map", "open_file"] {
            let e = match read {
                "map" => fx.store.map_table(&alice, &meta.data_ref).map(|_| ()),
                _ => fx.store.open_file(&alice, &meta.data_ref).map(|_| ()),
            }
            .expect_err(what);
            assert!(e.is_damage(), "{what}, {read}: {e:?}");
            let text = e.to_string();
            assert!(
                text.contains(meta.data_ref.as_str()) && text.contains("damaged"),
                "{what}: {text}"
            );
            assert!(e.hint().is_some_and(|h| h.contains("fetch the data again")));
        }
        // Someone else asking for it learns nothing: the owner check comes first.
        let e = fx
            .store
            .open_file(&owner("mallory"), &meta.data_ref)
            .unwrap_err();
        assert!(matches!(e, StoreError::NotFound { .. }), "{what}: {e:?}");
        // Still listed, and still named damaged: list and read agree.
        let (listed, _) = fx.store.list(&alice, 10).unwrap();
        assert!(listed.iter().any(|m| m.data_ref == meta.data_ref), "{what}");
        // The other table is untouched.
        assert_eq!(
            fx.store
                .open_table(&alice, &other.data_ref)
                .unwrap()
                .meta
                .rows,
            5000
        );

        std::fs::write(&path, &good).unwrap();
        let table = fx.store.open_table(&alice, &meta.data_ref).unwrap();
        let ids = table.batches[0]
            .column(0)
            .as_any()
            .downcast_ref::<arrow_array::Int64Array>()
            .unwrap();
        assert_eq!((ids.value(0), ids.value(4999)), (0, 4999), "{what}");
    }
}

/// Verified once per process: a second read of an unchanged file does not hash it again,
/// but a file whose size, times or inode changed is hashed again before it is served:
/// written anew (another inode, the same size), or edited in place with its modification
/// time set back (as `touch -r` or a restore tool would), which the change time still
/// tells, since no call sets it back.
#[test]
fn a_file_changed_after_its_first_read_is_checked_again() {
    use std::os::unix::fs::FileExt;
    type Edit = fn(&std::path::Path);
    let edits: [(&str, Edit); 2] = [
        ("written anew", |path| {
            let mut bytes = std::fs::read(path).unwrap();
            let mid = bytes.len() / 2;
            bytes[mid] ^= 1;
            std::fs::remove_file(path).unwrap();
            std::fs::write(path, &bytes).unwrap();
        }),
        ("edited in place, time set back", |path| {
            let modified = std::fs::metadata(path).unwrap().modified().unwrap();
            // Past a tick of the kernel's clock, so the change time moves.
            thread::sleep(Duration::from_millis(50));
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .unwrap();
            let mid = file.metadata().unwrap().len() / 2;
            let mut byte = [0u8];
            file.read_exact_at(&mut byte, mid).unwrap();
            file.write_all_at(&[byte[0] ^ 1], mid).unwrap();
            file.set_modified(modified).unwrap();
            drop(file);
            assert_eq!(
                std::fs::metadata(path).unwrap().modified().unwrap(),
                modified
            );
        }),
    ];
    for (what, edit) in edits {
        let fx = Fixture::new(StoreLimits::default());
        let alice = owner("alice");
        let meta = write_table(&fx.store, &alice, &[batch(0, 2000)]);
        let path = fx
            .artifacts()
            .join(format!("{}.arrow", meta.data_ref.as_str()));
        fx.store.open_file(&alice, &meta.data_ref).unwrap();
        edit(&path);
        let e = fx.store.open_file(&alice, &meta.data_ref).unwrap_err();
        assert!(e.is_damage(), "{what}: {e:?}");
    }
}

/// `verify` hashes every table, names the damaged ones with their owners, and with `drop`
/// removes them (row and bytes); the intact ones stay readable.
#[test]
fn verify_reports_and_drops_what_is_beyond_repair() {
    let fx = Fixture::new(StoreLimits::default());
    let (alice, bob) = (owner("alice"), owner("bob"));
    let a = write_table(&fx.store, &alice, &[batch(0, 1000)]);
    let b = write_table(&fx.store, &bob, &[batch(0, 1000)]);
    let c = write_table(&fx.store, &bob, &[batch(0, 1000)]);
    let path = |m: &dataref_store::ArtifactMeta| {
        fx.artifacts()
            .join(format!("{}.arrow", m.data_ref.as_str()))
    };
    let mut bytes = std::fs::read(path(&b)).unwrap();
    bytes[100] ^= 0x80;
    std::fs::write(path(&b), &bytes).unwrap();
    std::fs::remove_file(path(&c)).unwrap();

    let mut seen = Vec::new();
    let report = fx
        .store
        .verify(false, &mut |d, t| seen.push((d, t)))
        .unwrap();
    assert_eq!(seen, vec![(1, 3), (2, 3), (3, 3)]);
    assert_eq!(report.intact, 1);
    assert_eq!(report.bytes, a.bytes);
    let mut damaged: Vec<_> = report
        .damaged
        .iter()
        .map(|d| (d.data_ref.clone(), d.owner.as_str().to_owned()))
        .collect();
    damaged.sort();
    let mut want = vec![
        (b.data_ref.clone(), "bob".to_owned()),
        (c.data_ref.clone(), "bob".to_owned()),
    ];
    want.sort();
    assert_eq!(damaged, want);
    assert_eq!(report.dropped, 0);
    assert_eq!(fx.index_rows(b.data_ref.as_str()), 1);

    let report = fx.store.verify(true, &mut |_, _| {}).unwrap();
    assert_eq!(
        (report.intact, report.damaged.len(), report.dropped),
        (1, 2, 2)
    );
    assert_eq!(fx.index_rows(b.data_ref.as_str()), 0);
    assert_eq!(fx.index_rows(c.data_ref.as_str()), 0);
    assert!(!path(&b).exists());
    // Dropped: now unknown, like any other ref.
    assert!(matches!(
        fx.store.open_file(&bob, &b.data_ref),
        Err(dataref_store::StoreError::NotFound { .. })
    ));
    assert_eq!(
        fx.store.open_table(&alice, &a.data_ref).unwrap().meta.rows,
        1000
    );
    let report = fx.store.verify(false, &mut |_, _| {}).unwrap();
    assert_eq!((report.intact, report.damaged.len()), (1, 0));
}

/// An index from before checksums: the column is added, the row's checksum adopted on its
/// first read, and from then on a change is caught.
#[test]
fn a_table_stored_before_checksums_adopts_one_on_first_read() {
    let mut fx = Fixture::new(StoreLimits::default());
    let alice = owner("alice");
    let meta = write_table(&fx.store, &alice, &[batch(0, 1000)]);
    drop(std::mem::replace(
        &mut fx.store,
        LocalStore::open(
            tempfile::tempdir().unwrap().path(),
            StoreLimits::default(),
            fx.clock.clone(),
        )
        .unwrap(),
    ));
    {
        // What a version-1 index looks like: no `checksum` column (nor the later ones).
        let conn = rusqlite::Connection::open(fx.home().join("index.sqlite")).unwrap();
        conn.execute_batch(
            "ALTER TABLE artifacts DROP COLUMN checksum; \
             ALTER TABLE artifacts DROP COLUMN quick_check; PRAGMA user_version = 1;",
        )
        .unwrap();
    }
    fx.restart();
    assert_eq!(
        fx.store.meta(&alice, &meta.data_ref).unwrap().checksum,
        None
    );
    fx.store.open_file(&alice, &meta.data_ref).unwrap();
    assert_eq!(
        fx.store.meta(&alice, &meta.data_ref).unwrap().checksum,
        meta.checksum
    );
    let path = fx
        .artifacts()
        .join(format!("{}.arrow", meta.data_ref.as_str()));
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[200] ^= 4;
    std::fs::write(&path, &bytes).unwrap();
    fx.restart();
    assert!(
        fx.store
            .open_file(&alice, &meta.data_ref)
            .unwrap_err()
            .is_damage()
    );
}

/// A table is written with its quick check, which its first read in a process checks; a
/// row from before quick checks (the column added empty on open) is checked against its
/// content hash instead, and damage is caught either way.
#[test]
fn a_first_read_checks_the_quick_check_or_else_the_checksum() {
    let mut fx = Fixture::new(StoreLimits::default());
    let alice = owner("alice");
    let meta = write_table(&fx.store, &alice, &[batch(0, 3000)]);
    let path = fx
        .artifacts()
        .join(format!("{}.arrow", meta.data_ref.as_str()));
    let good = std::fs::read(&path).unwrap();
    assert_eq!(meta.quick_check, Some(dataref_store::QuickCheck::of(&good)));
    assert_eq!(
        fx.store.meta(&alice, &meta.data_ref).unwrap().quick_check,
        meta.quick_check
    );
    let mut bad = good.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0x40;
    std::fs::write(&path, &bad).unwrap();
    fx.restart();
    let e = fx.store.open_file(&alice, &meta.data_ref).unwrap_err();
    assert!(
        e.is_damage() && e.to_string().contains("check to"),
        "the quick check caught it: {e}"
    );

    {
        // What a version-3 index looks like: a checksum, no quick check.
        let conn = rusqlite::Connection::open(fx.home().join("index.sqlite")).unwrap();
        conn.execute_batch(
            "ALTER TABLE artifacts DROP COLUMN quick_check; PRAGMA user_version = 3;",
        )
        .unwrap();
    }
    fx.restart();
    assert_eq!(
        fx.store.meta(&alice, &meta.data_ref).unwrap().quick_check,
        None
    );
    let e = fx.store.open_file(&alice, &meta.data_ref).unwrap_err();
    assert!(
        e.is_damage() && e.to_string().contains("hash to"),
        "the checksum caught it: {e}"
    );
    std::fs::write(&path, &good).unwrap();
    fx.restart();
    assert_eq!(
        fx.store
            .open_table(&alice, &meta.data_ref)
            .unwrap()
            .meta
            .rows,
        3000
    );
}

/// A receipt is kept with the row and read back whole; a row of an index from before
/// receipts (no `receipt` column: added empty on open) reads as having none.
#[test]
fn a_receipt_round_trips_and_an_older_index_reads_as_none() {
    let mut fx = Fixture::new(StoreLimits::default());
    let alice = owner("alice");
    let before = write_table(&fx.store, &alice, &[batch(0, 10)]);
    let mut receipt = dataref_protocol::Receipt::started(Timestamp(T0));
    receipt.sql = Some("SELECT * FROM sales WHERE region = :region".into());
    receipt
        .params
        .insert("region".into(), serde_json::json!("EU"));
    receipt.source = Some(dataref_protocol::SourceRead {
        name: "shop".into(),
        kind: "sqlite".into(),
        version: Some("12 bytes".into()),
    });
    let mut w = fx
        .store
        .create_table(&alice, schema(), lineage().with_receipt(receipt.clone()))
        .unwrap();
    w.write(&batch(0, 10)).unwrap();
    let with = w.finish().unwrap();
    fx.restart();
    assert_eq!(
        fx.store
            .meta(&alice, &with.data_ref)
            .unwrap()
            .lineage
            .receipt,
        Some(receipt)
    );
    assert_eq!(
        fx.store
            .meta(&alice, &before.data_ref)
            .unwrap()
            .lineage
            .receipt,
        None
    );
    drop(std::mem::replace(
        &mut fx.store,
        LocalStore::open(
            tempfile::tempdir().unwrap().path(),
            StoreLimits::default(),
            fx.clock.clone(),
        )
        .unwrap(),
    ));
    {
        // What a version-2 index looks like: no `receipt` column.
        let conn = rusqlite::Connection::open(fx.home().join("index.sqlite")).unwrap();
        conn.execute_batch("ALTER TABLE artifacts DROP COLUMN receipt; PRAGMA user_version = 2;")
            .unwrap();
    }
    fx.restart();
    assert_eq!(
        fx.store
            .meta(&alice, &with.data_ref)
            .unwrap()
            .lineage
            .receipt,
        None
    );
    assert_eq!(fx.store.list(&alice, 10).unwrap().1, 2);
}
