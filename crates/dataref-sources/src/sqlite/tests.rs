//! The overlapped fetch: what SQLite holds arrives whole across many batches, and an error,
//! a panic or a cancellation on either side stops both and leaves no artifact.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use arrow_array::cast::AsArray;
use arrow_array::types::{Date32Type, Float64Type, Int64Type};
use arrow_array::{Array, RecordBatch};
use dataref_protocol::DataRef;
use dataref_store::{
    LocalStore, MappedTable, StoreError, StoreLimits, SweepReport, SystemClock, Table, TableWriter,
};
use tempfile::TempDir;

use super::*;

/// A database made by `setup`, a store beside it, and a source on the database.
struct Env {
    _dir: TempDir,
    store: LocalStore,
    owner: Principal,
    source: SourceConfig,
}

impl Env {
    fn new(setup: &str, limits: StoreLimits) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("db.sqlite");
        let conn = Connection::open(&db).unwrap();
        conn.execute_batch(setup).unwrap();
        drop(conn);
        let store =
            LocalStore::open(&dir.path().join("home"), limits, Arc::new(SystemClock)).unwrap();
        let source = SourceConfig {
            name: "test".into(),
            kind: SourceKind::Sqlite { path: db },
            sample_rows: 5,
            max_value_chars: 80,
            max_rows: u64::MAX,
            timeout: Duration::from_secs(60),
            allow_sql: true,
        };
        Self {
            _dir: dir,
            store,
            owner: Principal::new("tester").unwrap(),
            source,
        }
    }

    fn db(&self) -> &Path {
        match &self.source.kind {
            SourceKind::Sqlite { path } => path,
            _ => unreachable!(),
        }
    }

    fn fetch_into(
        &self,
        store: &dyn ArtifactStore,
        sql: &str,
        progress: &(dyn Fn(u64) + Sync),
        is_cancelled: &(dyn Fn() -> bool + Sync),
    ) -> Result<ArtifactMeta, SourceError> {
        let declared = BTreeMap::new();
        let req = FetchRequest {
            source: &self.source,
            sql,
            params: Vec::new(),
            declared: &declared,
            policy: SqlPolicy::Generic,
        };
        fetch(
            &req,
            store,
            &self.owner,
            Lineage::new("test", serde_json::json!({})),
            progress,
            is_cancelled,
        )
    }

    fn fetch(&self, sql: &str) -> Result<ArtifactMeta, SourceError> {
        self.fetch_into(&self.store, sql, &|_| {}, &|| false)
    }

    fn table(&self, meta: &ArtifactMeta) -> Table {
        self.store.open_table(&self.owner, &meta.data_ref).unwrap()
    }

    /// Artifacts the owner holds, and files left in the store's temp directory: an
    /// aborted fetch leaves neither.
    #[expect(
        clippy::disallowed_methods,
        reason = "the test looks into the store's directory"
    )]
    fn leftovers(&self) -> (u64, usize) {
        let tmp = self._dir.path().join("home/artifacts/.tmp");
        assert!(tmp.is_dir());
        let files = std::fs::read_dir(&tmp).map_or(0, |d| d.count());
        (self.store.list(&self.owner, 100).unwrap().1, files)
    }
}

/// `n` integers from 1, as a recursive CTE (endless when `n` is None).
fn counting(n: Option<u64>) -> String {
    let until = n.map_or(String::new(), |n| format!(" WHERE n < {n}"));
    format!("WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c{until})")
}

/// What a test store's writer does on its `k`-th write (from 1).
#[derive(Default)]
struct Plan {
    fail_at: Option<usize>,
    panic_at: Option<usize>,
    delay: Duration,
    threads: Mutex<Vec<ThreadId>>,
    writes: AtomicUsize,
}

/// The local store, with writers that follow a [`Plan`].
struct Faulty {
    inner: LocalStore,
    plan: Arc<Plan>,
}

struct FaultyWriter {
    inner: Box<dyn TableWriter>,
    plan: Arc<Plan>,
}

impl TableWriter for FaultyWriter {
    fn write(&mut self, batch: &RecordBatch) -> Result<(), StoreError> {
        let k = self.plan.writes.fetch_add(1, Ordering::SeqCst) + 1;
        self.plan
            .threads
            .lock()
            .unwrap()
            .push(std::thread::current().id());
        std::thread::sleep(self.plan.delay);
        if self.plan.panic_at == Some(k) {
            panic!("write {k} panics on purpose");
        }
        if self.plan.fail_at == Some(k) {
            return Err(StoreError::QuotaExceeded { quota: 1, used: 1 });
        }
        self.inner.write(batch)
    }

    fn rows(&self) -> u64 {
        self.inner.rows()
    }

    fn finish(self: Box<Self>) -> Result<ArtifactMeta, StoreError> {
        self.inner.finish()
    }
}

impl ArtifactStore for Faulty {
    fn create_table(
        &self,
        owner: &Principal,
        schema: SchemaRef,
        lineage: Lineage,
    ) -> Result<Box<dyn TableWriter>, StoreError> {
        Ok(Box::new(FaultyWriter {
            inner: self.inner.create_table(owner, schema, lineage)?,
            plan: self.plan.clone(),
        }))
    }
    fn map_table(&self, owner: &Principal, data_ref: &DataRef) -> Result<MappedTable, StoreError> {
        self.inner.map_table(owner, data_ref)
    }
    fn open_file(
        &self,
        owner: &Principal,
        data_ref: &DataRef,
    ) -> Result<std::fs::File, StoreError> {
        self.inner.open_file(owner, data_ref)
    }
    fn meta(&self, owner: &Principal, data_ref: &DataRef) -> Result<ArtifactMeta, StoreError> {
        self.inner.meta(owner, data_ref)
    }
    fn list(
        &self,
        owner: &Principal,
        limit: usize,
    ) -> Result<(Vec<ArtifactMeta>, u64), StoreError> {
        self.inner.list(owner, limit)
    }
    fn usage(&self, owner: &Principal) -> Result<u64, StoreError> {
        self.inner.usage(owner)
    }
    fn sweep(&self) -> Result<SweepReport, StoreError> {
        self.inner.sweep()
    }
}

/// `env`'s store behind a writer that follows `plan`. Both open the same home, so what
/// one writes the other lists.
fn faulty(env: &Env, plan: Plan) -> Faulty {
    Faulty {
        inner: LocalStore::open(
            &env._dir.path().join("home"),
            StoreLimits::default(),
            Arc::new(SystemClock),
        )
        .unwrap(),
        plan: Arc::new(plan),
    }
}

const ROWS: u64 = 3 * BATCH_ROWS as u64 + 123;

/// Every value of a table of `ROWS` rows, read back across its batches, equals what
/// SQLite returns for the same query.
#[test]
fn every_value_arrives_across_many_batches() {
    let setup = format!(
        "CREATE TABLE t (id INTEGER PRIMARY KEY, label TEXT, amount REAL, day DATE, ok BOOLEAN);
         INSERT INTO t {} SELECT n,
             CASE WHEN n % 7 = 0 THEN NULL ELSE 'línea ' || n || substr('🦀xyz', 1, n % 4) END,
             CASE WHEN n % 11 = 0 THEN NULL ELSE n * 0.25 END,
             date('2024-01-01', '+' || (n / 500) || ' days'),
             n % 2
           FROM c;",
        counting(Some(ROWS))
    );
    let env = Env::new(&setup, StoreLimits::default());
    let sql = "SELECT id, label, amount, day, ok FROM t ORDER BY id";
    let reports = Mutex::new(Vec::new());
    let meta = env
        .fetch_into(
            &env.store,
            sql,
            &|n| reports.lock().unwrap().push(n),
            &|| false,
        )
        .unwrap();
    assert_eq!(meta.rows, ROWS);
    let batches = ROWS.div_ceil(BATCH_ROWS as u64);
    let expected: Vec<u64> = (1..=batches)
        .map(|k| (k * BATCH_ROWS as u64).min(ROWS))
        .collect();
    assert_eq!(*reports.lock().unwrap(), expected);

    let table = env.table(&meta);
    assert_eq!(table.batches.len() as u64, batches);
    let conn = Connection::open(env.db()).unwrap();
    let mut stmt = conn.prepare(sql).unwrap();
    let mut want = stmt.query([]).unwrap();
    let mut seen = 0u64;
    for batch in &table.batches {
        let id = batch.column(0).as_primitive::<Int64Type>();
        let label = batch.column(1).as_string::<i32>();
        let amount = batch.column(2).as_primitive::<Float64Type>();
        let day = batch.column(3).as_primitive::<Date32Type>();
        let ok = batch.column(4).as_boolean();
        for i in 0..batch.num_rows() {
            let row = want.next().unwrap().unwrap();
            assert_eq!(id.value(i), row.get::<_, i64>(0).unwrap());
            let l: Option<String> = row.get(1).unwrap();
            assert_eq!(label.is_valid(i).then(|| label.value(i)), l.as_deref());
            let a: Option<f64> = row.get(2).unwrap();
            assert_eq!(amount.is_valid(i).then(|| amount.value(i)), a);
            let d: String = row.get(3).unwrap();
            assert_eq!(Some(day.value(i)), crate::civil::parse_date(d.as_bytes()));
            assert_eq!(ok.value(i), row.get::<_, i64>(4).unwrap() == 1);
            seen += 1;
        }
    }
    assert!(want.next().unwrap().is_none());
    assert_eq!(seen, ROWS);
}

#[test]
fn the_writer_runs_on_a_thread_of_its_own() {
    let env = Env::new("CREATE TABLE t (x);", StoreLimits::default());
    let store = faulty(&env, Plan::default());
    let sql = format!("{} SELECT n FROM c", counting(Some(ROWS)));
    let meta = env.fetch_into(&store, &sql, &|_| {}, &|| false).unwrap();
    assert_eq!(meta.rows, ROWS);
    let threads = store.plan.threads.lock().unwrap();
    assert_eq!(threads.len() as u64, ROWS.div_ceil(BATCH_ROWS as u64));
    assert!(threads.iter().all(|t| *t != std::thread::current().id()));
}

#[test]
fn wide_text_closes_batches_by_bytes() {
    // About 8 KiB a row (2,046 `é`): a batch reaches the byte bound long before its row count.
    let rows = 10_000u64;
    let env = Env::new("CREATE TABLE t (x);", StoreLimits::default());
    let sql = format!(
        "{} SELECT n, printf('%04d', n % 10000) || replace(hex(zeroblob(2046)), '0', 'é') AS s FROM c",
        counting(Some(rows))
    );
    let meta = env.fetch(&sql).unwrap();
    assert_eq!(meta.rows, rows);
    let table = env.table(&meta);
    assert!(table.batches.len() > 1, "{} batches", table.batches.len());
    let mut n = 0i64;
    for batch in &table.batches {
        let s = batch.column(1).as_string::<i32>();
        assert!(
            s.values().len() <= BATCH_BYTES + 8_200,
            "{}",
            s.values().len()
        );
        let ids = batch.column(0).as_primitive::<Int64Type>();
        for i in 0..batch.num_rows() {
            n += 1;
            assert_eq!(ids.value(i), n);
            assert!(s.value(i).starts_with(&format!("{:04}", n % 10_000)));
        }
    }
    assert_eq!(n as u64, rows);
}

#[test]
fn a_full_artifact_stops_the_sqlite_side_and_is_reported() {
    let limits = StoreLimits {
        max_artifact_bytes: 1 << 20,
        ..StoreLimits::default()
    };
    let env = Env::new("CREATE TABLE t (x);", limits);
    // Endless, and no row limit: only the writer's refusal can stop it.
    let sql = format!("{} SELECT n, 'row number ' || n FROM c", counting(None));
    let started = Instant::now();
    match env.fetch(&sql) {
        Err(SourceError::Store(StoreError::TooLarge { limit })) => assert_eq!(limit, 1 << 20),
        other => panic!("expected the byte cap, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(env.leftovers(), (0, 0));
}

#[test]
fn an_exceeded_quota_stops_the_sqlite_side_and_is_reported() {
    let limits = StoreLimits {
        owner_quota_bytes: 2 << 20,
        ..StoreLimits::default()
    };
    let env = Env::new("CREATE TABLE t (x);", limits);
    let sql = format!("{} SELECT n FROM c", counting(None));
    match env.fetch(&sql) {
        Err(SourceError::Store(StoreError::QuotaExceeded { quota, .. })) => {
            assert_eq!(quota, 2 << 20);
        }
        other => panic!("expected the quota, got {other:?}"),
    }
    assert_eq!(env.leftovers(), (0, 0));
}

/// The writer fails while SQLite is busy in a step that returns no row for ever: the
/// progress handler must interrupt it, or the fetch would run to the source timeout.
#[test]
fn a_writer_error_interrupts_a_statement_inside_sqlite() {
    let env = Env::new("CREATE TABLE t (x);", StoreLimits::default());
    let store = faulty(
        &env,
        Plan {
            fail_at: Some(1),
            ..Plan::default()
        },
    );
    let sql = format!(
        "{} SELECT n FROM c WHERE n <= {BATCH_ROWS} OR n < 0",
        counting(None)
    );
    let started = Instant::now();
    match env.fetch_into(&store, &sql, &|_| {}, &|| false) {
        Err(SourceError::Store(StoreError::QuotaExceeded { .. })) => {}
        other => panic!("expected the writer's error, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(env.leftovers(), (0, 0));
}

#[test]
fn a_panicking_writer_is_an_error() {
    let env = Env::new("CREATE TABLE t (x);", StoreLimits::default());
    let store = faulty(
        &env,
        Plan {
            panic_at: Some(2),
            ..Plan::default()
        },
    );
    let sql = format!("{} SELECT n FROM c", counting(None));
    match env.fetch_into(&store, &sql, &|_| {}, &|| false) {
        Err(e @ SourceError::Io { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains("writer thread panicked: write 2 panics on purpose"),
                "{text}"
            );
            assert!(!e.is_caller_error());
        }
        other => panic!("expected an error, got {other:?}"),
    }
    assert_eq!(env.leftovers(), (0, 0));
}

#[test]
fn a_panicking_cancellation_check_is_an_error() {
    let env = Env::new("CREATE TABLE t (x);", StoreLimits::default());
    let sql = format!("{} SELECT n FROM c", counting(None));
    let calls = AtomicUsize::new(0);
    let result = env.fetch_into(&env.store, &sql, &|_| {}, &|| {
        // The first call is before the fetch starts; later ones come from its threads.
        assert!(calls.fetch_add(1, Ordering::SeqCst) < 3, "asked too often");
        false
    });
    match result {
        Err(e @ SourceError::Io { .. }) => assert!(e.to_string().contains("panicked"), "{e}"),
        other => panic!("expected an error, got {other:?}"),
    }
    assert_eq!(env.leftovers(), (0, 0));
}

/// Cancelled while the queue is full and the SQLite side waits on it: both stop.
#[test]
fn cancellation_with_a_full_queue_stops_both_sides() {
    let env = Env::new("CREATE TABLE t (x);", StoreLimits::default());
    let store = faulty(
        &env,
        Plan {
            delay: Duration::from_millis(100),
            ..Plan::default()
        },
    );
    let sql = format!("{} SELECT n, 'label ' || n FROM c", counting(None));
    let started = Instant::now();
    let result = env.fetch_into(&store, &sql, &|_| {}, &|| {
        started.elapsed() > Duration::from_millis(500)
    });
    assert!(matches!(result, Err(SourceError::Cancelled)), "{result:?}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    // The queue bounded how far SQLite ran ahead of the slow writer.
    let writes = store.plan.writes.load(Ordering::SeqCst);
    assert!((1..=8).contains(&writes), "{writes} writes");
    assert_eq!(env.leftovers(), (0, 0));
}

#[test]
fn max_rows_is_refused_with_batches_in_flight() {
    let mut env = Env::new("CREATE TABLE t (x);", StoreLimits::default());
    let max = 2 * BATCH_ROWS as u64 + 5;
    env.source.max_rows = max;
    match env.fetch(&format!("{} SELECT n FROM c", counting(Some(max + 1)))) {
        Err(SourceError::TooManyRows { max_rows }) => assert_eq!(max_rows, max),
        other => panic!("expected too many rows, got {other:?}"),
    }
    assert_eq!(env.leftovers(), (0, 0));
    let meta = env
        .fetch(&format!("{} SELECT n FROM c", counting(Some(max))))
        .unwrap();
    assert_eq!(meta.rows, max);
    assert_eq!(env.leftovers(), (1, 0));
}

#[test]
fn text_that_is_not_utf8_is_reported_at_its_row() {
    let env = Env::new("CREATE TABLE t (x);", StoreLimits::default());
    let row = BATCH_ROWS as u64 + 4_465;
    // In the second batch, well before its end.
    let sql = format!(
        "{} SELECT n, CASE WHEN n = {row} THEN CAST(x'ff41' AS TEXT) ELSE 'ok' END AS s FROM c",
        counting(Some(3 * BATCH_ROWS as u64))
    );
    match env.fetch(&sql) {
        Err(SourceError::TypeChange {
            column,
            row: r,
            found,
            ..
        }) => {
            assert_eq!((column.as_str(), r), ("s", row));
            assert_eq!(found, "text that is not valid UTF-8 (2 bytes)");
        }
        other => panic!("expected a type change, got {other:?}"),
    }
    assert_eq!(env.leftovers(), (0, 0));
}

/// Text is checked per batch, other conversions per cell: the earlier row still wins.
#[test]
fn the_earliest_bad_cell_is_reported() {
    let env = Env::new(
        "CREATE TABLE t (i INTEGER, s TEXT);
         INSERT INTO t VALUES (1, 'a'), (2, CAST(x'c3' AS TEXT)), (3, 'c'), ('four', 'd');",
        StoreLimits::default(),
    );
    match env.fetch("SELECT i, s FROM t ORDER BY rowid") {
        Err(SourceError::TypeChange { column, row, .. }) => {
            assert_eq!((column.as_str(), row), ("s", 2));
        }
        other => panic!("expected a type change, got {other:?}"),
    }
    // Same row: left to right, as the cells are read.
    let env = Env::new(
        "CREATE TABLE t (s TEXT, i INTEGER);
         INSERT INTO t VALUES ('a', 1), (CAST(x'c3' AS TEXT), 'two');",
        StoreLimits::default(),
    );
    match env.fetch("SELECT s, i FROM t ORDER BY rowid") {
        Err(SourceError::TypeChange { column, row, .. }) => {
            assert_eq!((column.as_str(), row), ("s", 2));
        }
        other => panic!("expected a type change, got {other:?}"),
    }
}

/// The check is per cell, not over the batch's joined bytes: halves of one character in
/// two cells (`c3` then `a9`, "é" together) are two bad cells, not one good one.
#[test]
fn a_character_split_across_cells_is_not_utf8() {
    let env = Env::new(
        "CREATE TABLE t (s TEXT);
         INSERT INTO t VALUES (CAST(x'c3' AS TEXT)), (CAST(x'a9' AS TEXT));",
        StoreLimits::default(),
    );
    match env.fetch("SELECT s FROM t ORDER BY rowid") {
        Err(SourceError::TypeChange { column, row, .. }) => {
            assert_eq!((column.as_str(), row), ("s", 1));
        }
        other => panic!("expected a type change, got {other:?}"),
    }
    assert_eq!(env.leftovers(), (0, 0));
}

/// Many columns, fewer rows a batch: what is in flight between the threads stays bounded
/// by cells, not by a row count that would make a batch of 1,000 numbers a row 512 MiB.
#[test]
fn wide_rows_make_shorter_batches() {
    let columns = 400;
    let rows = 20_000u64;
    let env = Env::new("CREATE TABLE t (x);", StoreLimits::default());
    let list: Vec<String> = (0..columns).map(|i| format!("n + {i} AS c{i}")).collect();
    let sql = format!("{} SELECT {} FROM c", counting(Some(rows)), list.join(", "));
    let meta = env.fetch(&sql).unwrap();
    assert_eq!(meta.rows, rows);
    let table = env.table(&meta);
    let per_batch = (BATCH_CELLS / columns).max(MIN_BATCH_ROWS);
    assert_eq!(table.batches.len() as u64, rows.div_ceil(per_batch as u64));
    assert!(table.batches.iter().all(|b| b.num_rows() <= per_batch));
    let last = table.batches.last().unwrap();
    let c399 = last.column(columns - 1).as_primitive::<Int64Type>();
    assert_eq!(c399.value(last.num_rows() - 1), rows as i64 + 399);
}

#[test]
fn duplicate_names_get_suffixes() {
    assert_eq!(
        unique_names(["id", "id", "x", "id", "id_2"].into_iter()),
        ["id", "id_2", "x", "id_3", "id_2_2"]
    );
}

#[test]
fn declarations_match_case_insensitively() {
    let d = BTreeMap::from([("Day".to_owned(), ColumnType::Date)]);
    assert_eq!(declared(&d, "day"), Some(ColumnType::Date));
    assert_eq!(declared(&d, "Day"), Some(ColumnType::Date));
    assert_eq!(declared(&d, "night"), None);
}
