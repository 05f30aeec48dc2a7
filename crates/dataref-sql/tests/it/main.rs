//! The engine's boundary, attacked from the SQL text: every statement that is not a query,
//! every way to name a file or URL, the memory limit; and what errors say.
#![expect(clippy::unwrap_used, reason = "tests")]

use std::sync::Arc;

use arrow_array::{Float64Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::ArrowError;
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use dataref_sql::{Columns, Input, Limits, Query, SqlError};

fn sales() -> (SchemaRef, Vec<RecordBatch>) {
    let schema: SchemaRef = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("line", DataType::Utf8, true),
        Field::new("revenue", DataType::Float64, true),
    ]));
    let batches = (0..4)
        .map(|b| {
            let ids: Vec<i64> = (0..1000).map(|i| b * 1000 + i).collect();
            let lines: Vec<Option<String>> = ids
                .iter()
                .map(|i| (i % 7 != 0).then(|| format!("line {}", i % 3)))
                .collect();
            let revenue: Vec<Option<f64>> = ids.iter().map(|i| Some(*i as f64 / 2.0)).collect();
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(Int64Array::from(ids)),
                    Arc::new(StringArray::from(lines)),
                    Arc::new(Float64Array::from(revenue)),
                ],
            )
            .unwrap()
        })
        .collect();
    (schema, batches)
}

fn inputs() -> Vec<Input> {
    let (schema, batches) = sales();
    vec![Input::new("sales", schema, batches)]
}

async fn run(sql: &str) -> Result<Vec<RecordBatch>, SqlError> {
    run_with(sql, &Limits::default()).await
}

async fn run_with(sql: &str, limits: &Limits) -> Result<Vec<RecordBatch>, SqlError> {
    let mut q = Query::start(sql, inputs(), limits).await?;
    let mut out = Vec::new();
    while let Some(b) = q.next_batch().await? {
        out.push(b);
    }
    Ok(out)
}

fn rows(batches: &[RecordBatch]) -> usize {
    batches.iter().map(RecordBatch::num_rows).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_runs_over_the_inputs() {
    let out = run(
        "SELECT line, count(*) AS n, sum(revenue) AS revenue FROM sales \
                   GROUP BY line ORDER BY line NULLS LAST",
    )
    .await
    .unwrap();
    assert_eq!(rows(&out), 4, "three lines and NULL");
    let all = run("SELECT * FROM sales").await.unwrap();
    assert_eq!(rows(&all), 4000);
    let with = run("WITH t AS (SELECT id FROM sales WHERE id < 10) SELECT count(*) FROM t")
        .await
        .unwrap();
    assert_eq!(rows(&with), 1);
}

/// A source that records what it is asked for and cannot give `line`, the way a mapped
/// file with a damaged column could not.
#[derive(Debug, Default)]
struct Recorded {
    asked: std::sync::Mutex<Vec<Option<Vec<usize>>>>,
}

impl Columns for Recorded {
    fn batches(&self, projection: Option<&[usize]>) -> Result<Vec<RecordBatch>, ArrowError> {
        self.asked
            .lock()
            .unwrap()
            .push(projection.map(<[usize]>::to_vec));
        if projection.is_none_or(|p| p.contains(&1)) {
            return Err(ArrowError::ParseError("column `line` is damaged".into()));
        }
        let (_, batches) = sales();
        batches
            .iter()
            .map(|b| b.project(projection.unwrap_or(&[])))
            .collect()
    }
}

async fn run_columns(sql: &str, source: &Arc<Recorded>) -> Result<Vec<RecordBatch>, SqlError> {
    let (schema, _) = sales();
    let input = Input::columns("sales", schema, source.clone());
    let mut q = Query::start(sql, vec![input], &Limits::default()).await?;
    let mut out = Vec::new();
    while let Some(b) = q.next_batch().await? {
        out.push(b);
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_columns_source_is_asked_only_for_the_columns_the_query_reads() {
    let source = Arc::new(Recorded::default());
    let out = run_columns("SELECT sum(revenue) AS r FROM sales WHERE id < 10", &source)
        .await
        .unwrap();
    assert_eq!(rows(&out), 1);
    let asked = source.asked.lock().unwrap().clone();
    assert!(!asked.is_empty());
    for p in &asked {
        let mut p = p.clone().expect("a projection");
        p.sort_unstable();
        assert_eq!(p, vec![0, 2], "id and revenue only");
    }
    // No column at all, still the rows.
    let n = run_columns("SELECT count(*) AS n FROM sales", &source)
        .await
        .unwrap();
    let n = n[0]
        .column(0)
        .as_any()
        .downcast_ref::<Int64Array>()
        .unwrap();
    assert_eq!(n.value(0), 4000);
    // A column that cannot be decoded is the query's error, with the source's message.
    let err = run_columns("SELECT line FROM sales", &source)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("column `line` is damaged"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_statement_that_is_not_a_query_is_refused() {
    let attempts = [
        ("COPY sales TO '/tmp/x.csv'", "COPY"),
        ("COPY (SELECT 1) TO '/tmp/x.csv' STORED AS CSV", "COPY"),
        (
            "CREATE EXTERNAL TABLE p STORED AS CSV LOCATION '/etc/passwd'",
            "CREATE EXTERNAL TABLE",
        ),
        ("CREATE TABLE t AS SELECT * FROM sales", "CREATE TABLE"),
        ("CREATE VIEW v AS SELECT * FROM sales", "CREATE VIEW"),
        ("INSERT INTO sales VALUES (1, 'a', 1.0)", "INSERT"),
        ("DELETE FROM sales", "DELETE"),
        ("UPDATE sales SET revenue = 0", "UPDATE"),
        ("DROP TABLE sales", "DROP TABLE"),
        ("SET datafusion.execution.batch_size = 1", "SET"),
        ("RESET datafusion.execution.batch_size", "RESET"),
        ("EXPLAIN SELECT * FROM sales", "EXPLAIN"),
        ("SHOW TABLES", "SHOW TABLES"),
        ("PREPARE p AS SELECT 1", "PREPARE"),
        ("DESCRIBE sales", "DESCRIBE"),
        (
            "CREATE FUNCTION f() RETURNS INT RETURN 1",
            "CREATE FUNCTION",
        ),
        ("CREATE SCHEMA s", "CREATE SCHEMA"),
        ("SELECT * INTO copied FROM sales", "SELECT … INTO"),
    ];
    for (sql, kind) in attempts {
        match run(sql).await {
            Err(SqlError::Refused { kind: k }) => assert!(
                k.contains(kind),
                "{sql}: refused as {k:?}, expected it to name {kind}"
            ),
            Err(e) => panic!("{sql}: expected a refusal, got {e:?}"),
            Ok(_) => panic!("{sql}: ran"),
        }
    }
    // Two statements: refused whatever the second is.
    for sql in ["SELECT 1; DROP TABLE sales", "SELECT 1; SELECT 2"] {
        match run(sql).await {
            Err(SqlError::Refused { kind }) => assert_eq!(kind, "a second statement", "{sql}"),
            other => panic!("{sql}: expected a refusal, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_file_url_or_table_function_is_reachable() {
    for sql in [
        "SELECT * FROM '/etc/passwd'",
        "SELECT * FROM 'file:///etc/passwd'",
        "SELECT * FROM \"/etc/passwd\"",
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM read_parquet('/etc/passwd')",
        "SELECT * FROM generate_series(1, 10)",
        "SELECT * FROM information_schema.tables",
        "SELECT * FROM datafusion.information_schema.df_settings",
        "SELECT * FROM other_catalog.public.sales",
    ] {
        match run(sql).await {
            Err(SqlError::Invalid { .. }) => {}
            other => panic!("{sql}: expected a planning error, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_say_where_and_list_the_tables() {
    let e = run("SELECT lin FROM sales").await.unwrap_err();
    let text = e.to_string();
    assert!(text.contains("lin"), "{text}");
    assert!(text.contains("line 1, column 8"), "{text}");
    let hint = e.hint().unwrap();
    assert!(hint.contains("`sales` (id, line, revenue)"), "{hint}");

    let e = run("SELECT * FROM sale").await.unwrap_err();
    assert!(matches!(e, SqlError::Invalid { .. }), "{e:?}");
    assert!(e.to_string().contains("sale"), "{e}");

    let e = run("SELEC * FROM sales").await.unwrap_err();
    assert!(matches!(e, SqlError::Invalid { .. }), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_over_its_memory_is_a_clear_error() {
    let limits = Limits {
        memory_bytes: 64 << 10,
        threads: 2,
    };
    // A self-join's hash table and a sort over every row need far more than 64 KiB.
    let e = run_with(
        "SELECT a.id, b.id FROM sales a JOIN sales b ON a.line = b.line ORDER BY a.revenue, b.id",
        &limits,
    )
    .await
    .unwrap_err();
    match &e {
        SqlError::OutOfMemory { limit_bytes } => assert_eq!(*limit_bytes, 64 << 10),
        other => panic!("expected out of memory, got {other:?}"),
    }
    assert!(e.hint().unwrap().contains("aggregate earlier"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deeply_nested_query_is_an_error_not_a_crash() {
    let depth = 3000;
    let sql = format!(
        "SELECT {}1{} FROM sales",
        "(".repeat(depth),
        ")".repeat(depth)
    );
    assert!(run(&sql).await.is_err());
}
