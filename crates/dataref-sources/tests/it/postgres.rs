//! The PostgreSQL producer against a real server (initdb + pg_ctl in a temp dir): roles,
//! row-level security, grants, every type of the mapping, limits, cancellation, the pool.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Decimal128Type, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type,
    IntervalMonthDayNanoType, Time64MicrosecondType, TimestampMicrosecondType,
};
use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType, IntervalUnit, TimeUnit};
use dataref_config::{SourceConfig, SourceKind};
use dataref_protocol::Principal;
use dataref_sources::postgres::{self, PgPool, RoleStatus};
use dataref_sources::{
    ConnectProblem, FetchRequest, Fetched, ParamValue, RoleProblem, SourceError, Sources, SqlPolicy,
};
use dataref_store::{ArtifactStore, Lineage, LocalStore, StoreLimits, SystemClock};
use dataref_test_support::TestPostgres;
use tempfile::TempDir;

const SETUP: &str = r#"
CREATE ROLE dataref_login LOGIN NOINHERIT;
CREATE ROLE eu_analyst NOLOGIN;
CREATE ROLE us_analyst NOLOGIN;
CREATE ROLE auditor NOLOGIN;
CREATE ROLE outsider NOLOGIN;
GRANT eu_analyst, us_analyst, auditor TO dataref_login;

CREATE TABLE sales (id int, region text, amount numeric(12,2), day date, at timestamptz);
INSERT INTO sales VALUES
  (1, 'EU', 10.50, '2025-01-05', '2025-01-05 10:00:00+00'),
  (2, 'US', 20.00, '2025-01-06', '2025-01-06 10:00:00+00'),
  (3, 'EU', 30.25, '2025-02-01', '2025-02-01 10:00:00+00'),
  (4, 'US', 40.75, '2024-12-31', '2024-12-31 10:00:00+00'),
  (5, 'EU', 50.00, '2024-11-30', '2024-11-30 10:00:00+00');
ALTER TABLE sales ENABLE ROW LEVEL SECURITY;
CREATE POLICY eu_rows ON sales FOR SELECT TO eu_analyst USING (region = 'EU');
CREATE POLICY us_rows ON sales FOR SELECT TO us_analyst USING (region = 'US');
GRANT SELECT ON sales TO eu_analyst, us_analyst;

CREATE TABLE salaries (name text, salary int);
INSERT INTO salaries VALUES ('ann', 100);
GRANT SELECT ON salaries TO eu_analyst;

CREATE TYPE mood AS ENUM ('sad', 'happy');
CREATE TABLE everything (
  i2 int2, i4 int4, i8 int8, f4 float4, f8 float8, n numeric(12,2), nu numeric,
  t text, vc varchar(10), bp char(3), nm name, b bool, d date, ts timestamp,
  tstz timestamptz, tm time, iv interval, u uuid, j json, jb jsonb, by bytea,
  arr int4[], tarr text[], narr numeric(6,1)[], m mood, ip inet
);
INSERT INTO everything VALUES (
  -2, 40000, 9000000000, 1.5, 2.25, 12345.67, 1.2345678901234567890123456789012345678901,
  'héllo', 'vc', 'ab', 'nm', true, '2025-03-01', '2025-03-01 12:34:56.789',
  '2025-03-01 12:00:00+02', '13:14:15.5', '1 year 2 mons 3 days 04:05:06.5',
  'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11', '{"a": 1}', '{"b": [1, 2]}', '\xdeadbeef',
  '{1,NULL,3}', '{"x","y"}', '{1.5,NULL}', 'happy', '10.0.0.1/32'
);
INSERT INTO everything DEFAULT VALUES;
GRANT SELECT ON everything TO eu_analyst;
"#;

struct Pg {
    server: TestPostgres,
    _dir: TempDir,
    store: Arc<LocalStore>,
    source: SourceConfig,
    pool: PgPool,
}

impl Pg {
    async fn start(pool_size: usize) -> Self {
        let server = TestPostgres::start().unwrap();
        server.execute(SETUP).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(
            LocalStore::open(
                &dir.path().join("home"),
                StoreLimits::default(),
                Arc::new(SystemClock),
            )
            .unwrap(),
        );
        let url = server.conninfo("dataref_login");
        let source = SourceConfig {
            name: "warehouse".into(),
            // These tests call the producer on the shared login directly, model SQL too:
            // the opt-out path. `pg_roles.rs` tests the caller's own login.
            kind: SourceKind::Postgres {
                url: url.clone(),
                pool_size,
                allow_sql_shared_roles: true,
            },
            sample_rows: 5,
            max_value_chars: 80,
            max_rows: 1_000_000,
            timeout: Duration::from_secs(30),
            allow_sql: true,
        };
        let pool = PgPool::new("warehouse", &url, pool_size);
        Self {
            server,
            _dir: dir,
            store,
            source,
            pool,
        }
    }

    async fn run(
        &self,
        who: &str,
        sql: &str,
        params: Vec<(String, ParamValue)>,
        policy: SqlPolicy,
    ) -> Result<Fetched, SourceError> {
        self.run_with(who, sql, params, policy, &|_| {}, &|| false)
            .await
    }

    async fn run_with(
        &self,
        who: &str,
        sql: &str,
        params: Vec<(String, ParamValue)>,
        policy: SqlPolicy,
        progress: &(dyn Fn(u64) + Sync),
        is_cancelled: &(dyn Fn() -> bool + Sync),
    ) -> Result<Fetched, SourceError> {
        let owner = Principal::new(who).unwrap();
        let declared = BTreeMap::new();
        let req = FetchRequest {
            source: &self.source,
            sql,
            params,
            declared: &declared,
            policy,
        };
        postgres::fetch(
            &self.pool,
            &req,
            who,
            self.store.as_ref(),
            &owner,
            // A receipt naming the source, for the source to add its version to.
            Lineage::new("test", serde_json::json!({ "sql": sql })).with_receipt(
                dataref_protocol::Receipt {
                    source: Some(dataref_protocol::SourceRead {
                        name: "warehouse".into(),
                        kind: "postgres".into(),
                        version: None,
                    }),
                    ..dataref_protocol::Receipt::default()
                },
            ),
            progress,
            is_cancelled,
        )
        .await
    }

    fn query(&self, who: &str, sql: &str) -> impl Future<Output = Result<Fetched, SourceError>> {
        self.run(who, sql, Vec::new(), SqlPolicy::Generic)
    }

    fn batch(&self, who: &str, f: &Fetched) -> RecordBatch {
        let owner = Principal::new(who).unwrap();
        let table = self.store.open_table(&owner, &f.meta.data_ref).unwrap();
        arrow_select_concat(&table.batches)
    }

    fn artifacts(&self, who: &str) -> u64 {
        self.store
            .list(&Principal::new(who).unwrap(), 100)
            .unwrap()
            .1
    }
}

/// The tests read small results: one batch, or the first when there are several.
fn arrow_select_concat(batches: &[RecordBatch]) -> RecordBatch {
    assert_eq!(batches.len(), 1, "expected one batch");
    batches[0].clone()
}

fn strings(b: &RecordBatch, col: &str) -> Vec<Option<String>> {
    let a = b.column_by_name(col).unwrap().as_string::<i32>();
    (0..a.len())
        .map(|i| a.is_valid(i).then(|| a.value(i).to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_level_security_gives_each_principal_its_own_rows() {
    let pg = Pg::start(2).await;
    let sql =
        "SELECT id, region, amount FROM sales WHERE day >= :since AND at < :before ORDER BY id";
    let params = vec![
        ("since".to_owned(), ParamValue::Text("2025-01-01".into())),
        (
            "before".to_owned(),
            ParamValue::Text("2025-12-31 00:00:00".into()),
        ),
    ];
    let eu = pg
        .run("eu_analyst", sql, params.clone(), SqlPolicy::Configured)
        .await
        .unwrap();
    let us = pg
        .run("us_analyst", sql, params, SqlPolicy::Configured)
        .await
        .unwrap();
    let eu = pg.batch("eu_analyst", &eu);
    let us = pg.batch("us_analyst", &us);
    let ids =
        |b: &RecordBatch| -> Vec<i32> { b.column(0).as_primitive::<Int32Type>().values().to_vec() };
    assert_eq!(ids(&eu), [1, 3]);
    assert_eq!(ids(&us), [2]);
    assert_eq!(
        strings(&eu, "region"),
        [Some("EU".into()), Some("EU".into())]
    );
    assert_eq!(
        eu.schema().field(2).data_type(),
        &DataType::Decimal128(12, 2)
    );
    assert_eq!(
        eu.column(2)
            .as_primitive::<Decimal128Type>()
            .values()
            .to_vec(),
        [1050, 3025]
    );
}

/// A receipt's version of a PostgreSQL source: the WAL position and the snapshot, as the
/// caller's role; a function the role may not call is left out and the read goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_receipt_names_the_wal_position_and_snapshot_the_role_may_see() {
    let pg = Pg::start(1).await;
    let version = |f: &Fetched| {
        f.meta
            .lineage
            .receipt
            .as_ref()
            .and_then(|r| r.source.as_ref())
            .and_then(|s| s.version.clone())
    };
    let sql = "SELECT id FROM sales ORDER BY id";
    let got = pg.query("eu_analyst", sql).await.unwrap();
    let rows = got.meta.rows;
    let v = version(&got).expect("a version");
    assert!(v.starts_with("lsn ") && v.contains(", snapshot "), "{v}");
    pg.server
        .execute(
            "REVOKE EXECUTE ON FUNCTION pg_catalog.pg_current_wal_lsn() FROM PUBLIC;
             REVOKE EXECUTE ON FUNCTION pg_catalog.pg_current_snapshot() FROM PUBLIC;",
        )
        .await
        .unwrap();
    let got = pg.query("eu_analyst", sql).await.unwrap();
    assert_eq!(version(&got), None);
    assert_eq!(got.meta.rows, rows);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_without_a_grant_is_a_clear_error() {
    let pg = Pg::start(1).await;
    let e = pg
        .query("us_analyst", "SELECT * FROM salaries")
        .await
        .unwrap_err();
    assert!(matches!(e, SourceError::PermissionDenied { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("principal `us_analyst`"), "{msg}");
    assert!(msg.contains("role `us_analyst`"), "{msg}");
    assert!(
        msg.contains("permission denied for table salaries"),
        "{msg}"
    );
    assert!(e.hint().unwrap().contains("grant"), "{:?}", e.hint());
    assert!(e.is_caller_error());
    // The same query as eu_analyst works on the same pool afterwards.
    let ok = pg
        .query("eu_analyst", "SELECT * FROM salaries")
        .await
        .unwrap();
    assert_eq!(ok.meta.rows, 1);
    assert_eq!(pg.artifacts("us_analyst"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_and_ungranted_roles_are_named() {
    let pg = Pg::start(1).await;
    let e = pg.query("ghost", "SELECT 1").await.unwrap_err();
    assert!(
        matches!(
            &e,
            SourceError::Role {
                problem: RoleProblem::Missing,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("role `ghost`"), "{e}");
    assert!(e.hint().unwrap().contains("CREATE ROLE"), "{:?}", e.hint());
    let e = pg.query("outsider", "SELECT 1").await.unwrap_err();
    assert!(
        matches!(
            &e,
            SourceError::Role {
                problem: RoleProblem::NotGranted,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.hint().unwrap().contains("GRANT"), "{:?}", e.hint());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_type_of_the_mapping_round_trips_with_nulls() {
    let pg = Pg::start(1).await;
    let f = pg
        .query(
            "eu_analyst",
            "SELECT * FROM everything ORDER BY i2 NULLS LAST",
        )
        .await
        .unwrap();
    assert_eq!(f.meta.rows, 2);
    let b = pg.batch("eu_analyst", &f);
    let ty = |c: &str| b.schema().field_with_name(c).unwrap().data_type().clone();
    let list = |inner: DataType| {
        DataType::List(Arc::new(arrow_schema::Field::new_list_field(inner, true)))
    };
    let expected = [
        ("i2", DataType::Int16),
        ("i4", DataType::Int32),
        ("i8", DataType::Int64),
        ("f4", DataType::Float32),
        ("f8", DataType::Float64),
        ("n", DataType::Decimal128(12, 2)),
        ("nu", DataType::Utf8),
        ("t", DataType::Utf8),
        ("vc", DataType::Utf8),
        ("bp", DataType::Utf8),
        ("nm", DataType::Utf8),
        ("b", DataType::Boolean),
        ("d", DataType::Date32),
        ("ts", DataType::Timestamp(TimeUnit::Microsecond, None)),
        (
            "tstz",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        ),
        ("tm", DataType::Time64(TimeUnit::Microsecond)),
        ("iv", DataType::Interval(IntervalUnit::MonthDayNano)),
        ("u", DataType::Utf8),
        ("j", DataType::Utf8),
        ("jb", DataType::Utf8),
        ("by", DataType::Binary),
        ("arr", list(DataType::Int32)),
        ("tarr", list(DataType::Utf8)),
        ("narr", list(DataType::Decimal128(6, 1))),
        ("m", DataType::Utf8),
        ("ip", DataType::Utf8),
    ];
    for (c, t) in &expected {
        assert_eq!(&ty(c), t, "column {c}");
        // The second row is all NULLs.
        assert!(b.column_by_name(c).unwrap().is_null(1), "column {c}");
        assert!(b.column_by_name(c).unwrap().is_valid(0), "column {c}");
    }
    let col = |c: &str| b.column_by_name(c).unwrap().clone();
    assert_eq!(col("i2").as_primitive::<Int16Type>().value(0), -2);
    assert_eq!(col("i4").as_primitive::<Int32Type>().value(0), 40000);
    assert_eq!(
        col("i8").as_primitive::<Int64Type>().value(0),
        9_000_000_000
    );
    assert_eq!(col("f4").as_primitive::<Float32Type>().value(0), 1.5);
    assert_eq!(col("f8").as_primitive::<Float64Type>().value(0), 2.25);
    assert_eq!(
        col("n").as_primitive::<Decimal128Type>().value(0),
        1_234_567
    );
    let text = |c: &str| strings(&b, c)[0].clone().unwrap();
    assert_eq!(text("nu"), "1.2345678901234567890123456789012345678901");
    assert_eq!(text("t"), "héllo");
    assert_eq!(text("vc"), "vc");
    assert_eq!(text("bp"), "ab ");
    assert_eq!(text("nm"), "nm");
    assert!(col("b").as_boolean().value(0));
    // 2025-03-01 is day 20148 of the Unix epoch.
    assert_eq!(col("d").as_primitive::<Date32Type>().value(0), 20148);
    let ts = 20148 * 86_400_000_000i64;
    assert_eq!(
        col("ts")
            .as_primitive::<TimestampMicrosecondType>()
            .value(0),
        ts + (12 * 3600 + 34 * 60 + 56) * 1_000_000 + 789_000
    );
    assert_eq!(
        col("tstz")
            .as_primitive::<TimestampMicrosecondType>()
            .value(0),
        ts + 10 * 3_600_000_000
    );
    assert_eq!(
        col("tm").as_primitive::<Time64MicrosecondType>().value(0),
        (13 * 3600 + 14 * 60 + 15) * 1_000_000 + 500_000
    );
    let iv = col("iv")
        .as_primitive::<IntervalMonthDayNanoType>()
        .value(0);
    assert_eq!((iv.months, iv.days), (14, 3));
    assert_eq!(
        iv.nanoseconds,
        ((4 * 3600 + 5 * 60 + 6) * 1_000_000 + 500_000) * 1000
    );
    assert_eq!(text("u"), "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11");
    assert_eq!(text("j"), "{\"a\": 1}");
    assert_eq!(text("jb"), "{\"b\": [1, 2]}");
    assert_eq!(
        col("by").as_binary::<i32>().value(0),
        [0xde, 0xad, 0xbe, 0xef]
    );
    let arr = col("arr");
    let arr = arr.as_list::<i32>().value(0);
    let arr = arr.as_primitive::<Int32Type>();
    assert_eq!(arr.len(), 3);
    assert_eq!((arr.value(0), arr.is_null(1), arr.value(2)), (1, true, 3));
    let tarr = col("tarr");
    let tarr = tarr.as_list::<i32>().value(0);
    assert_eq!(tarr.as_string::<i32>().value(1), "y");
    let narr = col("narr");
    let narr = narr.as_list::<i32>().value(0);
    assert_eq!(narr.as_primitive::<Decimal128Type>().value(0), 15);
    assert!(narr.is_null(1));
    assert_eq!(text("m"), "happy");
    assert_eq!(text("ip"), "10.0.0.1/32");
    // What the model is told: the unconstrained numeric and the inet column.
    assert!(f.notes.iter().any(|n| n.contains("`nu`")), "{:?}", f.notes);
    assert!(
        f.notes
            .iter()
            .any(|n| n.contains("`ip`") && n.contains("inet")),
        "{:?}",
        f.notes
    );
    assert_eq!(f.notes.len(), 2, "{:?}", f.notes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn infinite_dates_and_special_numerics_become_nulls_with_a_note() {
    let pg = Pg::start(1).await;
    let f = pg
        .query(
            "eu_analyst",
            "SELECT 'infinity'::date AS d, '-infinity'::timestamptz AS t, \
             'NaN'::numeric(5,2) AS n, 'NaN'::numeric AS nt, '{{1,2},{3,4}}'::int[] IS NULL AS flat",
        )
        .await
        .unwrap();
    let b = pg.batch("eu_analyst", &f);
    assert!(b.column(0).is_null(0) && b.column(1).is_null(0) && b.column(2).is_null(0));
    assert_eq!(strings(&b, "nt"), [Some("NaN".into())]);
    for c in ["`d`", "`t`", "`n`"] {
        assert!(
            f.notes.iter().any(|n| n.contains(c) && n.contains("NULL")),
            "{c}: {:?}",
            f.notes
        );
    }
    let e = pg
        .query("eu_analyst", "SELECT '{{1,2},{3,4}}'::int[] AS grid")
        .await
        .unwrap_err();
    assert!(matches!(e, SourceError::Unsupported { .. }), "{e:?}");
    assert!(e.to_string().contains("2-dimensional"), "{e}");
    assert_eq!(pg.artifacts("eu_analyst"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_rows_is_refused_never_cut_and_timeouts_stop_the_statement() {
    let mut pg = Pg::start(1).await;
    pg.source.max_rows = 3;
    let ok = pg
        .query("auditor", "SELECT g FROM generate_series(1, 3) g")
        .await
        .unwrap();
    assert_eq!(ok.meta.rows, 3);
    let e = pg
        .query("auditor", "SELECT g FROM generate_series(1, 4) g")
        .await
        .unwrap_err();
    assert!(
        matches!(e, SourceError::TooManyRows { max_rows: 3 }),
        "{e:?}"
    );

    pg.source.max_rows = 1_000;
    pg.source.timeout = Duration::from_millis(300);
    let started = Instant::now();
    let e = pg
        .query("auditor", "SELECT pg_sleep(5) IS NULL AS slept")
        .await
        .unwrap_err();
    assert!(matches!(e, SourceError::Timeout { .. }), "{e:?}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(pg.artifacts("auditor"), 1);
    // The pool's one connection is still usable.
    pg.source.timeout = Duration::from_secs(30);
    pg.query("auditor", "SELECT 1 AS one").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_sends_a_cancel_request_and_removes_the_partial_artifact() {
    // Cancelled while the statement is still running (nothing fetched yet).
    let pg0 = Pg::start(1).await;
    let flag = AtomicBool::new(false);
    let started = Instant::now();
    let e = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            flag.store(true, Ordering::SeqCst);
        });
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(pg0.run_with(
                "auditor",
                "SELECT pg_sleep(20) IS NULL AS slept",
                Vec::new(),
                SqlPolicy::Generic,
                &|_| {},
                &|| flag.load(Ordering::SeqCst),
            ))
        })
    })
    .unwrap_err();
    assert!(matches!(e, SourceError::Cancelled), "{e:?}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    // A cancelled call's connection is closed, never returned.
    assert_eq!(pg0.pool.idle_count(), 0);
    assert_eq!(pg0.artifacts("auditor"), 0);
    drop(pg0);

    let pg = Pg::start(1).await;
    let cancelled = AtomicBool::new(false);
    let batches = AtomicU64::new(0);
    // The first 65,536-row batch is written at once; then every row sleeps.
    let sql = "SELECT g, (CASE WHEN g > 70000 THEN pg_sleep(10) END) IS NULL AS slow \
               FROM generate_series(1, 200000) g";
    let started = Instant::now();
    let e = pg
        .run_with(
            "auditor",
            sql,
            Vec::new(),
            SqlPolicy::Generic,
            &|_| {
                batches.fetch_add(1, Ordering::SeqCst);
                cancelled.store(true, Ordering::SeqCst);
            },
            &|| cancelled.load(Ordering::SeqCst),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, SourceError::Cancelled), "{e:?}");
    assert!(batches.load(Ordering::SeqCst) >= 1);
    // Well within the 10 s sleep of the next row: the server was asked to cancel.
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(pg.pool.idle_count(), 0);
    assert_eq!(pg.artifacts("auditor"), 0);
    // The server is not still running it (the cancel request is acted on asynchronously:
    // give the backend a moment, far below the statement's own 10 s).
    let c = pg.server.client().await.unwrap();
    let mut running: i64 = 1;
    for _ in 0..40 {
        running = c
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(10)%' \
                 AND state = 'active' AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if running == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(running, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_connections_carry_nothing_to_the_next_caller() {
    let mut pg = Pg::start(1).await;
    let probe = "SELECT pg_backend_pid() AS pid, current_user::text AS who, \
                 current_setting('statement_timeout') AS st, \
                 current_setting('transaction_read_only') AS ro";
    let mut pids = Vec::new();
    for (who, secs) in [("eu_analyst", 7), ("us_analyst", 9)] {
        pg.source.timeout = Duration::from_secs(secs);
        let f = pg.query(who, probe).await.unwrap();
        let b = pg.batch(who, &f);
        pids.push(b.column(0).as_primitive::<Int32Type>().value(0));
        assert_eq!(strings(&b, "who"), [Some(who.to_owned())]);
        assert_eq!(strings(&b, "st"), [Some(format!("{secs}s"))]);
        assert_eq!(strings(&b, "ro"), [Some("on".to_owned())]);
    }
    // A failing statement and a refused one close the connection: the next call gets a
    // new one.
    let e = pg
        .query("eu_analyst", "SELECT 1/0 AS boom")
        .await
        .unwrap_err();
    assert!(matches!(e, SourceError::Postgres { .. }), "{e:?}");
    assert!(e.to_string().contains("division by zero"), "{e}");
    let e = pg
        .query("eu_analyst", "SELECT * FROM no_such_table")
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no_such_table"), "{e}");

    pg.source.timeout = Duration::from_secs(11);
    let f = pg.query("auditor", probe).await.unwrap();
    let b = pg.batch("auditor", &f);
    pids.push(b.column(0).as_primitive::<Int32Type>().value(0));
    assert_eq!(strings(&b, "who"), [Some("auditor".to_owned())]);
    assert_eq!(strings(&b, "st"), [Some("11s".to_owned())]);
    // One connection served both clean calls; the errors closed it.
    assert_eq!(pids[0], pids[1], "{pids:?}");
    assert_ne!(pids[2], pids[1], "{pids:?}");
    assert_eq!(pg.pool.idle_count(), 1);

    // Outside a call, the pooled session has no role and no timeout of a caller: look
    // at it from the server side.
    let c = pg.server.client().await.unwrap();
    let row = c
        .query_one(
            "SELECT usename::text, state FROM pg_stat_activity WHERE pid = $1",
            &[&pids[2]],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "dataref_login");
    assert_eq!(row.get::<_, String>(1), "idle");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_sql_cannot_leave_the_callers_role_or_write() {
    let pg = Pg::start(1).await;
    for sql in [
        "SELECT set_config('role', 'us_analyst', true)",
        "SELECT pg_catalog.\"set_config\"('role', 'none', true), * FROM sales",
    ] {
        let e = pg.query("eu_analyst", sql).await.unwrap_err();
        assert!(matches!(e, SourceError::NotAllowed { .. }), "{sql}: {e:?}");
        assert!(e.to_string().contains("set_config"), "{e}");
    }
    for sql in [
        "SET ROLE us_analyst",
        "RESET ROLE",
        "SET LOCAL statement_timeout = 0",
    ] {
        let e = pg.query("eu_analyst", sql).await.unwrap_err();
        assert!(matches!(e, SourceError::NotAllowed { .. }), "{sql}: {e:?}");
    }
    // Model SQL is sent as written: `:n` in an array slice is not a placeholder.
    let f = pg
        .query(
            "eu_analyst",
            "SELECT x[2:n] AS s FROM (SELECT ARRAY[1, 2, 3] AS x, 3 AS n) q",
        )
        .await
        .unwrap();
    assert_eq!(f.meta.rows, 1);
    let e = pg
        .query("eu_analyst", "SELECT 1; SELECT 2")
        .await
        .unwrap_err();
    assert!(matches!(e, SourceError::Postgres { .. }), "{e:?}");
    let e = pg
        .query(
            "eu_analyst",
            "INSERT INTO salaries VALUES ('x', 1) RETURNING name",
        )
        .await
        .unwrap_err();
    assert!(matches!(e, SourceError::NotAllowed { .. }), "{e:?}");
    // Configured SQL may call set_config, but the role check after the statement
    // refuses a result read as another role.
    let e = pg
        .run(
            "eu_analyst",
            "SELECT set_config('role', 'us_analyst', true) AS r",
            Vec::new(),
            SqlPolicy::Configured,
        )
        .await
        .unwrap_err();
    assert!(matches!(e, SourceError::NotAllowed { .. }), "{e:?}");
    assert!(e.to_string().contains("changing the role"), "{e}");
    // Only the array-slice query stored anything.
    assert_eq!(pg.artifacts("eu_analyst"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_parameters_are_typed_by_the_server_and_checked() {
    let pg = Pg::start(1).await;
    let sql = "SELECT count(*) AS n FROM sales WHERE day >= :since AND amount > :min \
               AND (:region::text IS NULL OR region = :region) AND ':since' <> '' -- :nope";
    let run = |since: &str, min: ParamValue, region: ParamValue| {
        pg.run(
            "us_analyst",
            sql,
            vec![
                ("since".into(), ParamValue::Text(since.into())),
                ("min".into(), min),
                ("region".into(), region),
                ("unused".into(), ParamValue::Integer(1)),
            ],
            SqlPolicy::Configured,
        )
    };
    let count = |f: &Fetched| {
        pg.batch("us_analyst", f)
            .column(0)
            .as_primitive::<Int64Type>()
            .value(0)
    };
    let f = run("2024-01-01", ParamValue::Real(10.5), ParamValue::Null)
        .await
        .unwrap();
    assert_eq!(count(&f), 2);
    let f = run(
        "2025-01-01",
        ParamValue::Integer(1),
        ParamValue::Text("US".into()),
    )
    .await
    .unwrap();
    assert_eq!(count(&f), 1);
    let e = pg
        .run(
            "us_analyst",
            "SELECT :missing::int AS m",
            Vec::new(),
            SqlPolicy::Configured,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&e, SourceError::BadParam { name, .. } if name == "missing"),
        "{e:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn urls_expand_variables_and_connection_failures_say_what_to_check() {
    let pg = Pg::start(1).await;
    let env: HashMap<&str, String> = HashMap::from([
        ("TEST_PG_USER", "dataref_login".to_owned()),
        ("TEST_PG_HOST", pg.server.socket_dir().display().to_string()),
    ]);
    let env = Arc::new(env);
    let lookup = {
        let env = env.clone();
        Arc::new(move |name: &str| env.get(name).cloned())
    };
    let url = "host=${TEST_PG_HOST} port=5432 user=${TEST_PG_USER} dbname=postgres";
    let pool = PgPool::with_env("warehouse", url, 1, lookup.clone());
    let declared = BTreeMap::new();
    let owner = Principal::new("auditor").unwrap();
    let request = || FetchRequest {
        source: &pg.source,
        sql: "SELECT current_user::text AS u, session_user::text AS s",
        params: Vec::new(),
        declared: &declared,
        policy: SqlPolicy::Generic,
    };
    let req = request();
    let f = postgres::fetch(
        &pool,
        &req,
        "auditor",
        pg.store.as_ref(),
        &owner,
        Lineage::new("test", serde_json::json!({})),
        &|_| {},
        &|| false,
    )
    .await
    .unwrap();
    let b = pg.batch("auditor", &f);
    assert_eq!(strings(&b, "s"), [Some("dataref_login".to_owned())]);

    let failing = |url: &str| PgPool::with_env("warehouse", url, 1, lookup.clone());
    let connect = |pool: PgPool| {
        let req = request();
        let store = pg.store.clone();
        let owner = owner.clone();
        async move {
            postgres::fetch(
                &pool,
                &req,
                "auditor",
                store.as_ref(),
                &owner,
                Lineage::new("test", serde_json::json!({})),
                &|_| {},
                &|| false,
            )
            .await
            .unwrap_err()
        }
    };
    let e = connect(failing("host=${NOPE} user=x")).await;
    assert!(
        matches!(&e, SourceError::Connect { problem: ConnectProblem::Env(v), .. } if v == "NOPE"),
        "{e:?}"
    );
    assert!(e.hint().unwrap().contains("set `NOPE`"), "{:?}", e.hint());
    let nowhere = tempfile::tempdir().unwrap();
    let e = connect(failing(&format!(
        "host={} port=5432 user=x dbname=postgres",
        nowhere.path().display()
    )))
    .await;
    assert!(
        matches!(
            &e,
            SourceError::Connect {
                problem: ConnectProblem::Unreachable,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.hint().unwrap().contains("`url`"), "{:?}", e.hint());
    assert!(!e.is_caller_error());
    let e = connect(failing(
        "host=${TEST_PG_HOST} port=5432 user=nobody dbname=postgres",
    ))
    .await;
    assert!(
        matches!(
            &e,
            SourceError::Connect {
                problem: ConnectProblem::Auth,
                ..
            }
        ),
        "{e:?}"
    );
    let e = connect(failing("host=${TEST_PG_HOST} port=notaport")).await;
    assert!(
        matches!(
            &e,
            SourceError::Connect {
                problem: ConnectProblem::BadUrl,
                ..
            }
        ),
        "{e:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_lists_the_roles_the_login_role_can_use() {
    let pg = Pg::start(1).await;
    let p = postgres::probe(
        &pg.pool,
        &["eu_analyst".into(), "outsider".into(), "ghost".into()],
    )
    .await
    .unwrap();
    assert_eq!(p.login_role, "dataref_login");
    assert!(!p.login_inherits);
    assert!(!p.login_is_superuser);
    assert!(
        p.server_version.starts_with(char::is_numeric),
        "{}",
        p.server_version
    );
    assert_eq!(
        p.roles,
        [
            ("eu_analyst".into(), RoleStatus::Usable),
            ("outsider".into(), RoleStatus::NotGranted),
            ("ghost".into(), RoleStatus::Missing),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sources_run_postgres_calls_from_blocking_threads() {
    let pg = Pg::start(1).await;
    let sources = Arc::new(Sources::default().with_pool(PgPool::new(
        "warehouse",
        &pg.server.conninfo("dataref_login"),
        1,
    )));
    let source = pg.source.clone();
    let store = pg.store.clone();
    let f = tokio::task::spawn_blocking(move || {
        let declared = BTreeMap::new();
        let req = FetchRequest {
            source: &source,
            sql: "SELECT id FROM sales ORDER BY id",
            params: Vec::new(),
            declared: &declared,
            policy: SqlPolicy::Generic,
        };
        let owner = Principal::new("eu_analyst").unwrap();
        sources.fetch(
            &req,
            store.as_ref(),
            &owner,
            Lineage::new("test", serde_json::json!({})),
            &|_| {},
            &|| false,
        )
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(f.meta.rows, 3);
}
