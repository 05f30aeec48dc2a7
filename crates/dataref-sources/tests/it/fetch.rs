//! Fetching: type mapping, values read back, limits, timeouts, cancellation.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use arrow_array::cast::AsArray;
use arrow_array::types::{Date32Type, Float64Type, Int64Type, TimestampMicrosecondType};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, TimeUnit};
use dataref_config::ColumnType;
use dataref_sources::{FetchRequest, ParamValue, SourceError, SqlPolicy, fetch};
use dataref_store::Lineage;

use crate::Env;

const TYPED: &str = "
    CREATE TABLE t (i INTEGER, r REAL, s TEXT, b BLOB, flag BOOLEAN, d DATE, ts TIMESTAMP,
                    n NUMERIC, v VARCHAR(10));
    INSERT INTO t VALUES (1, 1.5, 'one', x'0102', 1, '2025-01-02', '2025-01-02 03:04:05', 7, 'a');
    INSERT INTO t VALUES (-2, 3, 'two', 'as text', 'false', '2024-02-29',
                          '2025-01-02T03:04:05.123456Z', 7.25, 12);
    INSERT INTO t VALUES (NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
";

fn column<'a>(batches: &'a [RecordBatch], name: &str) -> Vec<&'a ArrayRef> {
    batches
        .iter()
        .map(|b| b.column_by_name(name).unwrap())
        .collect()
}

fn one(table: &dataref_store::Table, name: &str) -> ArrayRef {
    let cols = column(&table.batches, name);
    assert_eq!(cols.len(), 1, "expected one batch");
    cols[0].clone()
}

#[test]
fn declared_sqlite_types_map_to_arrow() {
    let env = Env::new(TYPED);
    let meta = env.query("SELECT * FROM t ORDER BY rowid").unwrap();
    assert_eq!(meta.rows, 3);
    let types: Vec<(String, DataType)> = meta
        .schema
        .fields()
        .iter()
        .map(|f| (f.name().clone(), f.data_type().clone()))
        .collect();
    assert_eq!(
        types,
        [
            ("i".into(), DataType::Int64),
            ("r".into(), DataType::Float64),
            ("s".into(), DataType::Utf8),
            ("b".into(), DataType::Binary),
            ("flag".into(), DataType::Boolean),
            ("d".into(), DataType::Date32),
            (
                "ts".into(),
                DataType::Timestamp(TimeUnit::Microsecond, None)
            ),
            ("n".into(), DataType::Float64),
            ("v".into(), DataType::Utf8),
        ]
    );
    assert!(meta.schema.fields().iter().all(|f| f.is_nullable()));
    assert_eq!(meta.null_counts, vec![1; 9]);

    let t = env.table(&meta);
    let i = one(&t, "i");
    let i = i.as_primitive::<Int64Type>();
    assert_eq!((i.value(0), i.value(1), i.is_null(2)), (1, -2, true));
    let r = one(&t, "r");
    let r = r.as_primitive::<Float64Type>();
    assert_eq!((r.value(0), r.value(1), r.is_null(2)), (1.5, 3.0, true));
    let s = one(&t, "s");
    let s = s.as_string::<i32>();
    assert_eq!((s.value(0), s.value(1), s.is_null(2)), ("one", "two", true));
    let b = one(&t, "b");
    let b = b.as_binary::<i32>();
    assert_eq!((b.value(0), b.value(1)), (&[1u8, 2][..], &b"as text"[..]));
    assert!(b.is_null(2));
    let flag = one(&t, "flag");
    let flag = flag.as_boolean();
    assert_eq!(
        (flag.value(0), flag.value(1), flag.is_null(2)),
        (true, false, true)
    );
    let d = one(&t, "d");
    let d = d.as_primitive::<Date32Type>();
    assert_eq!(
        (d.value(0), d.value(1), d.is_null(2)),
        (20_090, 19_782, true)
    );
    let ts = one(&t, "ts");
    let ts = ts.as_primitive::<TimestampMicrosecondType>();
    let base = 20_090 * 86_400_000_000i64 + (3 * 3600 + 4 * 60 + 5) * 1_000_000;
    assert_eq!(ts.value(0), base);
    assert_eq!(ts.value(1), base + 123_456);
    assert!(ts.is_null(2));
    let n = one(&t, "n");
    let n = n.as_primitive::<Float64Type>();
    assert_eq!((n.value(0), n.value(1)), (7.0, 7.25));
    // SQLite stored 12 in a VARCHAR column as text already (affinity); either way it is text.
    let v = one(&t, "v");
    assert_eq!(v.as_string::<i32>().value(1), "12");
}

#[test]
fn query_level_declarations_win() {
    let env = Env::new(
        "CREATE TABLE e (day TEXT, ok TEXT, at INTEGER, amount TEXT);
         INSERT INTO e VALUES ('2025-03-01', 'true', 86400, '5');
         INSERT INTO e VALUES ('2025-03-02', '0', NULL, NULL);",
    );
    let declared = BTreeMap::from([
        ("day".to_owned(), ColumnType::Date),
        ("OK".to_owned(), ColumnType::Boolean),
        ("at".to_owned(), ColumnType::Timestamp),
    ]);
    let meta = env
        .run(
            "SELECT day, ok, at, amount FROM e ORDER BY day",
            Vec::new(),
            &declared,
            SqlPolicy::Configured,
        )
        .unwrap();
    let types: Vec<DataType> = meta
        .schema
        .fields()
        .iter()
        .map(|f| f.data_type().clone())
        .collect();
    assert_eq!(
        types,
        [
            DataType::Date32,
            DataType::Boolean,
            DataType::Timestamp(TimeUnit::Microsecond, None),
            DataType::Utf8,
        ]
    );
    let t = env.table(&meta);
    assert_eq!(one(&t, "day").as_primitive::<Date32Type>().value(1), 20_149);
    let ok = one(&t, "ok");
    assert_eq!(
        (ok.as_boolean().value(0), ok.as_boolean().value(1)),
        (true, false)
    );
    let at = one(&t, "at");
    let at = at.as_primitive::<TimestampMicrosecondType>();
    assert_eq!((at.value(0), at.is_null(1)), (86_400_000_000, true));
}

#[test]
fn expression_columns_are_inferred() {
    let env = Env::new("CREATE TABLE t (x);");
    let meta = env
        .query(
            "SELECT 1 AS i, 1.5 AS r, 'x' AS s, x'00ff' AS b, NULL AS nada, 2 AS mixed
             UNION ALL SELECT 2, 2.5, 3, x'', NULL, 2.5",
        )
        .unwrap();
    let types: Vec<DataType> = meta
        .schema
        .fields()
        .iter()
        .map(|f| f.data_type().clone())
        .collect();
    assert_eq!(
        types,
        [
            DataType::Int64,
            DataType::Float64,
            DataType::Utf8,
            DataType::Binary,
            DataType::Utf8,
            DataType::Float64,
        ]
    );
    let t = env.table(&meta);
    // A number in a text column becomes its text.
    assert_eq!(one(&t, "s").as_string::<i32>().value(1), "3");
    let mixed = one(&t, "mixed");
    let mixed = mixed.as_primitive::<Float64Type>();
    assert_eq!((mixed.value(0), mixed.value(1)), (2.0, 2.5));
    assert_eq!(meta.null_counts[4], 2);
}

#[test]
fn duplicate_column_names_are_made_unique() {
    let env = Env::new("CREATE TABLE a (id INTEGER); INSERT INTO a VALUES (1);");
    let meta = env.query("SELECT x.id, y.id FROM a x, a y").unwrap();
    let names: Vec<&str> = meta
        .schema
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .collect();
    assert_eq!(names, ["id", "id_2"]);
}

#[test]
fn a_value_that_does_not_fit_is_a_type_change() {
    let env = Env::new(
        "CREATE TABLE t (d DATE);
         INSERT INTO t VALUES ('2025-01-01'), ('2025-01-02'), ('2025-13-01');",
    );
    match env.query("SELECT d FROM t ORDER BY rowid") {
        Err(SourceError::TypeChange {
            column,
            row,
            expected,
            found,
        }) => {
            assert_eq!((column.as_str(), row), ("d", 3));
            assert!(expected.contains("YYYY-MM-DD"), "{expected}");
            assert_eq!(found, "the text `2025-13-01`");
        }
        other => panic!("expected a type change, got {other:?}"),
    }
    assert_eq!(env.artifacts(), 0);
}

#[test]
fn an_inferred_type_is_held_to_after_the_first_rows() {
    let env = Env::new("CREATE TABLE t (x);");
    // 2,000 integers, then a fraction: inference saw only integers.
    let sql = "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 2001)
               SELECT CASE WHEN n < 2001 THEN n ELSE n + 0.5 END AS v FROM c";
    match env.query(sql) {
        Err(e @ SourceError::TypeChange { .. }) => {
            let SourceError::TypeChange { row, .. } = &e else {
                unreachable!()
            };
            assert_eq!(*row, 2001);
            assert!(e.hint().unwrap().contains("columns.v"), "{:?}", e.hint());
        }
        other => panic!("expected a type change, got {other:?}"),
    }
    assert_eq!(env.artifacts(), 0);
}

#[test]
fn many_rows_stream_in_batches() {
    let env = Env::new("CREATE TABLE t (x);");
    let sql = "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 200000)
               SELECT n, 'row ' || n AS label, n * 0.5 AS half FROM c";
    let seen = std::sync::Mutex::new(Vec::new());
    let req = FetchRequest {
        source: &env.source,
        sql,
        params: Vec::new(),
        declared: &BTreeMap::new(),
        policy: SqlPolicy::Generic,
    };
    let meta = fetch(
        &req,
        &env.store,
        &env.owner,
        Lineage::new("t", serde_json::json!({})),
        &|n| seen.lock().unwrap().push(n),
        &|| false,
    )
    .unwrap();
    assert_eq!(meta.rows, 200_000);
    assert_eq!(*seen.lock().unwrap(), [65_536, 131_072, 196_608, 200_000]);
    let t = env.table(&meta);
    assert_eq!(t.batches.len(), 4);
    let last = t.batches.last().unwrap();
    let n = last.column(0).as_primitive::<Int64Type>();
    assert_eq!(n.value(n.len() - 1), 200_000);
    let label = last.column(1).as_string::<i32>();
    assert_eq!(label.value(label.len() - 1), "row 200000");
}

#[test]
fn an_empty_result_is_an_empty_table() {
    let env = Env::new("CREATE TABLE t (d DATE, x); INSERT INTO t VALUES ('2025-01-01', 1);");
    let meta = env.query("SELECT d, x FROM t WHERE 0").unwrap();
    assert_eq!(meta.rows, 0);
    assert_eq!(meta.schema.field(0).data_type(), &DataType::Date32);
    assert_eq!(meta.schema.field(1).data_type(), &DataType::Utf8);
    assert_eq!(
        env.table(&meta)
            .batches
            .iter()
            .map(|b| b.num_rows())
            .sum::<usize>(),
        0
    );
}

#[test]
fn more_rows_than_the_source_allows_is_refused() {
    let mut env = Env::new("CREATE TABLE t (x);");
    env.source.max_rows = 100_000;
    let counting = |limit: u64| {
        format!(
            "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < {limit})
             SELECT n FROM c"
        )
    };
    match env.query(&counting(100_001)) {
        Err(SourceError::TooManyRows { max_rows }) => assert_eq!(max_rows, 100_000),
        other => panic!("expected too many rows, got {other:?}"),
    }
    // A full batch was written before the limit was hit; it must be gone.
    assert_eq!(env.artifacts(), 0);
    assert_eq!(env.query(&counting(100_000)).unwrap().rows, 100_000);
    assert_eq!(env.artifacts(), 1);
}

const FOREVER: &str = "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c)
                       SELECT count(*) FROM c";

#[test]
fn a_statement_past_the_timeout_is_stopped() {
    let mut env = Env::new("CREATE TABLE t (x);");
    env.source.timeout = Duration::from_millis(200);
    let started = Instant::now();
    match env.query(FOREVER) {
        Err(e @ SourceError::Timeout { .. }) => {
            assert_eq!(
                e.to_string(),
                "the query ran longer than 200 ms and was stopped"
            );
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(env.artifacts(), 0);
}

fn fetch_with_cancel(
    env: &Env,
    sql: &str,
    progress: &(dyn Fn(u64) + Sync),
    is_cancelled: &(dyn Fn() -> bool + Sync),
) -> Result<dataref_store::ArtifactMeta, SourceError> {
    let req = FetchRequest {
        source: &env.source,
        sql,
        params: Vec::new(),
        declared: &BTreeMap::new(),
        policy: SqlPolicy::Generic,
    };
    fetch(
        &req,
        &env.store,
        &env.owner,
        Lineage::new("t", serde_json::json!({})),
        progress,
        is_cancelled,
    )
}

#[test]
fn cancellation_stops_a_statement_that_returns_nothing_yet() {
    let env = Env::new("CREATE TABLE t (x);");
    let started = Instant::now();
    let cancel_at = started + Duration::from_millis(150);
    let result = fetch_with_cancel(&env, FOREVER, &|_| {}, &|| Instant::now() >= cancel_at);
    assert!(matches!(result, Err(SourceError::Cancelled)), "{result:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(env.artifacts(), 0);
}

#[test]
fn cancellation_while_streaming_removes_the_partial_artifact() {
    let env = Env::new("CREATE TABLE t (x);");
    let cancelled = AtomicBool::new(false);
    let batches = AtomicU64::new(0);
    let endless = "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c) SELECT n FROM c";
    let result = fetch_with_cancel(
        &env,
        endless,
        &|_| {
            batches.fetch_add(1, Ordering::SeqCst);
            cancelled.store(true, Ordering::SeqCst);
        },
        &|| cancelled.load(Ordering::SeqCst),
    );
    assert!(matches!(result, Err(SourceError::Cancelled)), "{result:?}");
    assert!(batches.load(Ordering::SeqCst) >= 1);
    assert_eq!(env.artifacts(), 0);
}

#[test]
fn parameters_are_bound_never_spliced() {
    let env = Env::new(
        "CREATE TABLE users (name TEXT, secret TEXT);
         INSERT INTO users VALUES ('alice', 's1'), ('bob', 's2');",
    );
    let sql = "SELECT name, secret FROM users WHERE name = :name";
    let run = |name: &str| {
        env.run(
            sql,
            vec![("name".into(), ParamValue::Text(name.into()))],
            &BTreeMap::new(),
            SqlPolicy::Configured,
        )
        .unwrap()
        .rows
    };
    assert_eq!(run("alice"), 1);
    assert_eq!(run("x' OR '1'='1"), 0);
    assert_eq!(run("alice' --"), 0);
}

#[test]
fn every_param_value_kind_binds() {
    let env = Env::new("CREATE TABLE t (x);");
    let meta = env
        .run(
            "SELECT :i AS i, :r AS r, :t AS t, :n AS n",
            vec![
                ("i".into(), ParamValue::Integer(7)),
                ("r".into(), ParamValue::Real(0.5)),
                ("t".into(), ParamValue::Text("hi".into())),
                ("n".into(), ParamValue::Null),
                ("unused".into(), ParamValue::Integer(1)),
            ],
            &BTreeMap::new(),
            SqlPolicy::Configured,
        )
        .unwrap();
    let t = env.table(&meta);
    assert_eq!(one(&t, "i").as_primitive::<Int64Type>().value(0), 7);
    assert_eq!(one(&t, "r").as_primitive::<Float64Type>().value(0), 0.5);
    assert_eq!(one(&t, "t").as_string::<i32>().value(0), "hi");
    assert!(one(&t, "n").is_null(0));
}

#[test]
fn a_placeholder_without_a_value_is_an_error() {
    let env = Env::new("CREATE TABLE t (x);");
    match env.query("SELECT x FROM t WHERE x = :missing") {
        Err(SourceError::BadParam { name, .. }) => assert_eq!(name, "missing"),
        other => panic!("expected a bad param, got {other:?}"),
    }
    match env.query("SELECT x FROM t WHERE x = ?") {
        Err(SourceError::BadParam { name, .. }) => assert_eq!(name, "?1"),
        other => panic!("expected a bad param, got {other:?}"),
    }
}

#[test]
fn sql_errors_carry_sqlites_message() {
    let env = Env::new("CREATE TABLE t (x);");
    let cases = [
        ("SELECT * FROM nope", "no such table: nope"),
        ("SELECT nope FROM t", "no such column: nope"),
        ("SELEC 1", "syntax error"),
        ("  -- nothing\n", "empty"),
    ];
    for (sql, want) in cases {
        match env.query(sql) {
            Err(e @ SourceError::Sql { .. }) => {
                assert!(e.to_string().contains(want), "{e} should mention {want}");
                assert!(e.is_caller_error());
            }
            other => panic!("{sql}: expected a SQL error, got {other:?}"),
        }
    }
}

#[test]
fn a_missing_database_cannot_be_opened() {
    let mut env = Env::new("CREATE TABLE t (x);");
    env.source.kind = dataref_config::SourceKind::Sqlite {
        path: env.dir.path().join("absent.sqlite"),
    };
    match env.query("SELECT 1") {
        Err(e @ SourceError::Open { .. }) => assert!(!e.is_caller_error()),
        other => panic!("expected an open error, got {other:?}"),
    }
    // Read-only opening never creates the file.
    assert!(!env.dir.path().join("absent.sqlite").exists());
}

#[test]
fn a_file_that_is_not_a_database_cannot_be_opened() {
    let env = Env::new("CREATE TABLE t (x);");
    std::fs::write(env.db(), vec![b'x'; 4096]).unwrap();
    let result = env.query("SELECT 1 FROM t");
    assert!(
        matches!(result, Err(SourceError::Open { .. })),
        "{result:?}"
    );
}
