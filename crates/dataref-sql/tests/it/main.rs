//! The engine's boundary, attacked from the SQL text: every statement that is not a query,
//! every way to name a file or URL, the memory limit; and what errors say.
#![expect(clippy::unwrap_used, reason = "tests")]

mod lake;

use std::sync::Arc;

use arrow_array::{Float64Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::ArrowError;
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use dataref_sql::{Columns, Input, Query, QueryLimits, SqlError};

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
    run_with(sql, &QueryLimits::default()).await
}

async fn run_with(sql: &str, limits: &QueryLimits) -> Result<Vec<RecordBatch>, SqlError> {
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
    let mut q = Query::start(sql, vec![input], &QueryLimits::default()).await?;
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
    let limits = QueryLimits {
        memory_bytes: 64 << 10,
        threads: 2,
    };
    // A self-join's hash table and a sort over every row need far more than 64 KiB.
    let e = run_with(
        "SELECT a.id, b.id AS b_id FROM sales a JOIN sales b ON a.line = b.line ORDER BY a.revenue, b.id",
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

/// The shapes that once ended the process with a stack overflow, at sizes from a few
/// hundred terms to the longest text the engine takes: each is an error naming the limit,
/// and the engine answers the next query. (Run in this test binary's own process: a stack
/// overflow would abort it, not fail an assertion.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_shape_or_size_of_query_ends_the_process() {
    type Shape = fn(usize) -> String;
    let shapes: [(&str, Shape); 9] = [
        ("arithmetic", |n| {
            format!("SELECT 1{} AS x FROM sales", "+1".repeat(n))
        }),
        ("concat", |n| {
            format!("SELECT 'a'{} AS x FROM sales", "||'a'".repeat(n))
        }),
        ("and", |n| {
            format!(
                "SELECT id FROM sales WHERE id > 0{}",
                " AND id > 0".repeat(n)
            )
        }),
        ("case", |n| {
            format!(
                "SELECT {}0{} AS x FROM sales",
                "CASE WHEN id > 0 THEN 1 ELSE ".repeat(n),
                " END".repeat(n)
            )
        }),
        ("union all", |n| {
            format!("SELECT 1 AS x{}", " UNION ALL SELECT 1".repeat(n))
        }),
        ("cte chain", |n| {
            let mut sql = "WITH t0 AS (SELECT id FROM sales)".to_owned();
            for i in 1..=n {
                sql.push_str(&format!(", t{i} AS (SELECT id FROM t{})", i - 1));
            }
            sql.push_str(&format!(" SELECT count(*) FROM t{n}"));
            sql
        }),
        ("subquery", |n| {
            format!(
                "SELECT * FROM {}sales{}",
                "(SELECT * FROM ".repeat(n),
                ") AS s".repeat(n)
            )
        }),
        ("join", |n| {
            let mut sql = "SELECT count(*) FROM sales t0".to_owned();
            for i in 1..=n {
                sql.push_str(&format!(" JOIN sales t{i} ON t{i}.id = t0.id"));
            }
            sql
        }),
        ("in subquery", |n| {
            format!(
                "SELECT id FROM sales WHERE id IN {}(SELECT 1){}",
                "(SELECT id FROM sales WHERE id IN ".repeat(n),
                ")".repeat(n)
            )
        }),
    ];
    for (name, make) in shapes {
        for n in [300, 1_000, 3_000, 10_000, 30_000, 100_000] {
            let sql = make(n);
            let err = match run(&sql).await {
                Err(e) => e,
                Ok(_) => panic!("{name} × {n}: ran"),
            };
            let text = err.to_string();
            assert!(
                matches!(
                    err,
                    SqlError::TooComplex(_) | SqlError::TooLong { .. } | SqlError::Invalid { .. }
                ),
                "{name} × {n}: {err:?}"
            );
            assert!(text.len() < 300, "{name} × {n}: {text}");
            if sql.len() > dataref_sql::MAX_SQL_BYTES {
                assert!(
                    matches!(err, SqlError::TooLong { .. }) && text.contains("the limit is"),
                    "{name} × {n}: {text}"
                );
            }
        }
    }
    // Within the limits the same shapes run.
    let out = run(&format!(
        "SELECT 1{} AS x FROM sales LIMIT 1",
        "+1".repeat(200)
    ))
    .await
    .unwrap();
    assert_eq!(int(&out, 0, 0), 201);
    let out = run(&format!(
        "SELECT 1 AS x{}",
        " UNION ALL SELECT 1".repeat(200)
    ))
    .await
    .unwrap();
    assert_eq!(rows(&out), 201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_are_named_in_the_error() {
    let deep = format!("SELECT 1{} AS x", "+1".repeat(1_000));
    let e = run(&deep).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "the query nests more than {0} levels of expressions and subqueries; the limit is {0}",
            dataref_sql::MAX_DEPTH
        )
    );
    assert!(e.hint().unwrap().contains("flatter"), "{:?}", e.hint());
    let joins = {
        let mut sql = "SELECT count(*) FROM sales t0".to_owned();
        for i in 1..=100 {
            sql.push_str(&format!(" JOIN sales t{i} ON t{i}.id = t0.id"));
        }
        sql
    };
    let e = run(&joins).await.unwrap_err();
    assert!(
        e.to_string()
            .contains(&format!("the limit is {}", dataref_sql::MAX_TABLES)),
        "{e}"
    );
    let long = format!("SELECT '{}' AS x", "x".repeat(200_000));
    let e = run(&long).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "the query's text is 200014 bytes; the limit is 100000"
    );
}

fn int(batches: &[RecordBatch], col: usize, row: usize) -> i64 {
    let c = batches[0].column(col);
    arrow_array::cast::AsArray::as_primitive::<arrow_array::types::Int64Type>(c).value(row)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn integer_arithmetic_and_sums_are_exact_or_an_error() {
    let max = i64::MAX;
    for sql in [
        format!("SELECT CAST({max} AS BIGINT) + 1 AS x"),
        format!("SELECT CAST({max} AS BIGINT) * 2 AS x"),
        format!("SELECT CAST(-{max} AS BIGINT) - 2 AS x"),
        format!("SELECT -(CAST(-{max} AS BIGINT) - 1) AS x"),
        format!("SELECT id * {max} AS x FROM sales"),
        format!("SELECT id + {max} AS x FROM sales"),
        "SELECT CAST(2147483647 AS INT) + CAST(1 AS INT) AS x".to_owned(),
        "SELECT CAST(0 AS BIGINT UNSIGNED) - CAST(1 AS BIGINT UNSIGNED) AS x".to_owned(),
    ] {
        match run(&sql).await {
            Err(SqlError::Invalid { message, .. }) => {
                assert!(
                    message.to_lowercase().contains("overflow"),
                    "{sql}: {message}"
                )
            }
            other => panic!("{sql}: expected an overflow error, got {other:?}"),
        }
    }
    // In range: the values, and the names as written.
    let out = run("SELECT id + 1, id * 2 AS twice, -id AS neg FROM sales WHERE id = 3")
        .await
        .unwrap();
    let schema = out[0].schema();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["sales.id + Int64(1)", "twice", "neg"]);
    assert_eq!(
        (int(&out, 0, 0), int(&out, 1, 0), int(&out, 2, 0)),
        (4, 6, -3)
    );
    // A sum past 2^63 is an error, not -1; one that fits is exact and still a BIGINT.
    let e = run(&format!(
        "SELECT sum(x) AS s FROM (VALUES (CAST({max} AS BIGINT)), (CAST({max} AS BIGINT)), (CAST(1 AS BIGINT))) AS t(x)"
    ))
    .await
    .unwrap_err();
    assert!(matches!(e, SqlError::Invalid { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.starts_with("`sum(t.x)` does not fit in Int64") && text.contains("DECIMAL(38,0)"),
        "{text}"
    );
    let out = run(&format!(
        "SELECT sum(x) AS s, line FROM (SELECT CAST({max} AS BIGINT) - id AS x, line FROM sales WHERE id < 2 \
         UNION ALL SELECT -id AS x, line FROM sales WHERE id < 2) GROUP BY line ORDER BY line"
    ))
    .await
    .unwrap();
    assert_eq!(out[0].schema().field(0).data_type(), &DataType::Int64);
    assert_eq!(int(&out, 0, 0), max - 2);
    // In a window too, and as a group's sum beside other aggregates.
    let out =
        run("SELECT id, sum(id) OVER (ORDER BY id) AS running FROM sales ORDER BY id LIMIT 3")
            .await
            .unwrap();
    assert_eq!(out[0].schema().field(1).data_type(), &DataType::Int64);
    assert_eq!(int(&out, 1, 2), 3);
    let out = run("SELECT line, sum(id) AS s, count(*) AS n, sum(id) * 2 AS d FROM sales GROUP BY line HAVING sum(id) > 0 ORDER BY line NULLS LAST")
        .await
        .unwrap();
    assert_eq!(rows(&out), 4);
    // DataFusion names `sum(CAST(x AS BIGINT))` `sum(x)`: planned again with the CAST
    // named, the valid query runs, the sums exact.
    let out = run(&format!(
        "SELECT sum(x) AS a, sum(CAST(x AS BIGINT)) AS b, max(CAST(x AS DOUBLE)) AS c, \
         min(x) AS d FROM (VALUES (CAST({max} AS BIGINT)), (CAST(-1 AS BIGINT))) AS t(x)"
    ))
    .await
    .unwrap();
    assert_eq!((int(&out, 0, 0), int(&out, 1, 0)), (max - 1, max - 1));
    assert_eq!(
        out[0]
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect::<Vec<_>>(),
        ["a", "b", "c", "d"]
    );
    let out = run(&format!(
        "WITH t AS (SELECT x, CAST(x AS BIGINT) AS y FROM (VALUES (CAST({max} AS BIGINT)), (CAST(-1 AS BIGINT))) AS v(x)) \
         SELECT sum(x) AS a, sum(y) AS b FROM t"
    ))
    .await
    .unwrap();
    assert_eq!((int(&out, 0, 0), int(&out, 1, 0)), (max - 1, max - 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn intersect_and_except_all_count_copies() {
    let t = "(VALUES (1), (1), (1), (2), (NULL), (NULL)) AS l(x)";
    let u = "(VALUES (1), (2), (2), (NULL), (3)) AS r(x)";
    let sorted = |out: Vec<RecordBatch>| -> Vec<Option<i64>> {
        let mut v: Vec<Option<i64>> = out
            .iter()
            .flat_map(|b| {
                let c = arrow_array::cast::AsArray::as_primitive::<arrow_array::types::Int64Type>(
                    b.column(0),
                );
                c.iter().collect::<Vec<_>>()
            })
            .collect();
        v.sort();
        v
    };
    let q = |op: &str| format!("SELECT x FROM {t} {op} SELECT x FROM {u}");
    assert_eq!(
        sorted(run(&q("INTERSECT ALL")).await.unwrap()),
        [None, Some(1), Some(2)]
    );
    assert_eq!(
        sorted(run(&q("EXCEPT ALL")).await.unwrap()),
        [None, Some(1), Some(1)]
    );
    assert_eq!(
        sorted(run(&q("INTERSECT")).await.unwrap()),
        [None, Some(1), Some(2)]
    );
    assert_eq!(
        sorted(run(&q("EXCEPT")).await.unwrap()),
        Vec::<Option<i64>>::new()
    );
    // Over a table, and nested in a query.
    let out = run(
        "SELECT count(*) AS n FROM (SELECT line FROM sales EXCEPT ALL SELECT line FROM sales WHERE id % 2 = 0)",
    )
    .await
    .unwrap();
    assert_eq!(int(&out, 0, 0), 2000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_result_columns_of_one_name_are_refused_by_name() {
    let e = run("SELECT a.id, b.id, a.line FROM sales a JOIN sales b ON a.id = b.id")
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "the result has more than one column named `id`"
    );
    assert!(e.hint().unwrap().contains("AS"), "{:?}", e.hint());
    let out = run("SELECT a.id, b.id AS b_id FROM sales a JOIN sales b ON a.id = b.id LIMIT 1")
        .await
        .unwrap();
    assert_eq!(out[0].num_columns(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_models_mistakes_are_its_own() {
    for sql in [
        "SELECT regexp_like(line, '(') AS m FROM sales",
        "SELECT regexp_replace(line, '[', 'x') AS m FROM sales",
        "SELECT CAST(line AS INT) AS n FROM sales",
        "SELECT id / 0 AS n FROM sales",
        "SELECT to_date('not a date') AS d",
    ] {
        match run(sql).await {
            Err(e) => assert!(e.is_caller_error(), "{sql}: {e:?}"),
            Ok(_) => panic!("{sql}: ran"),
        }
    }
}

/// SQL the engine would answer wrongly without an error is refused with the way around it;
/// the way around gives the right answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shapes_the_engine_misreads_are_refused_with_the_way_around() {
    for sql in [
        "SELECT count(*) FROM sales WHERE line IS DISTINCT FROM 'line 1' AND id < 10",
        "SELECT count(*) FROM sales WHERE line IS NOT DISTINCT FROM 'line 1' OR id < 10",
        "SELECT count(*) FROM sales a JOIN sales b ON a.line IS NOT DISTINCT FROM b.line AND a.id = b.id",
        "SELECT count(*) FROM sales WHERE id = ANY (SELECT id FROM sales WHERE id > 3990)",
        "SELECT count(*) FROM sales WHERE id >= ALL (SELECT id FROM sales)",
    ] {
        match run(sql).await {
            Err(e @ SqlError::Unreliable(_)) => {
                assert!(e.hint().is_some_and(|h| !h.is_empty()), "{sql}")
            }
            other => panic!("{sql}: expected a refusal, got {other:?}"),
        }
    }
    // Parenthesised, and as IN / a scalar subquery: the answers DuckDB gives.
    let n = |out: Vec<RecordBatch>| int(&out, 0, 0);
    // Rows with id < 10 whose line is not `line 1` (1 and 4 are; NULLs count as distinct).
    let out = run("SELECT count(*) FROM sales WHERE (line IS DISTINCT FROM 'line 1') AND id < 10")
        .await
        .unwrap();
    assert_eq!(n(out), 8);
    let out = run("SELECT count(*) FROM sales WHERE id IN (SELECT id FROM sales WHERE id > 3990)")
        .await
        .unwrap();
    assert_eq!(n(out), 9);
    let out = run("SELECT count(*) FROM sales WHERE id >= (SELECT max(id) FROM sales)")
        .await
        .unwrap();
    assert_eq!(n(out), 1);
    // An arithmetic operand is read as meant.
    let out = run("SELECT count(*) FROM sales WHERE id IS DISTINCT FROM 1 + 1")
        .await
        .unwrap();
    assert_eq!(n(out), 3999);
}

/// Tables made by pandas carry schema metadata of their own; two of them in one join or
/// union failed as an engine fault.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inputs_with_different_schema_metadata_join_and_union() {
    let (schema, batches) = sales();
    let stamp = |key: &str| -> (SchemaRef, Vec<RecordBatch>) {
        let meta = std::collections::HashMap::from([("pandas".to_owned(), key.to_owned())]);
        let s = Arc::new(schema.as_ref().clone().with_metadata(meta));
        let b = batches
            .iter()
            .map(|b| RecordBatch::try_new(s.clone(), b.columns().to_vec()).unwrap())
            .collect();
        (s, b)
    };
    let (sa, ba) = stamp("a");
    let (sb, bb) = stamp("b");
    let inputs = || {
        vec![
            Input::new("a", sa.clone(), ba.clone()),
            Input::new("b", sb.clone(), bb.clone()),
        ]
    };
    for (sql, want) in [
        (
            "SELECT count(*) FROM a CROSS JOIN (SELECT * FROM b LIMIT 2) AS b",
            8000,
        ),
        (
            "SELECT count(*) FROM (SELECT line FROM a UNION ALL SELECT line FROM b) AS t",
            8000,
        ),
    ] {
        let mut q = Query::start(sql, inputs(), &QueryLimits::default())
            .await
            .unwrap();
        let b = q.next_batch().await.unwrap().unwrap();
        assert_eq!(int(&[b], 0, 0), want, "{sql}");
    }
}

/// A source that panics when the engine reads it.
#[derive(Debug)]
struct Panics;

impl Columns for Panics {
    fn batches(&self, _projection: Option<&[usize]>) -> Result<Vec<RecordBatch>, ArrowError> {
        panic!("a damaged source");
    }
}

/// A panic inside the engine is the engine's fault, reported as such; never an empty or a
/// cut result, and the engine goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_the_engine_is_an_engine_error_not_a_result() {
    let (schema, _) = sales();
    let input = Input::columns("sales", schema, Arc::new(Panics));
    match Query::start(
        "SELECT count(*) FROM sales",
        vec![input],
        &QueryLimits::default(),
    )
    .await
    {
        Err(SqlError::Engine(_)) => {}
        other => panic!("expected an engine error, got {other:?}"),
    }
    assert_eq!(rows(&run("SELECT 1 AS x").await.unwrap()), 1);
}

/// `date_trunc` of a date column is computed on days; it agrees with DataFusion's own
/// timestamp path (a cast it does not recognise: `+ INTERVAL '0 seconds'`) on every row,
/// from 1900 to 2100, for every unit, in type and value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn date_trunc_of_a_date_agrees_with_the_timestamp_path() {
    let schema: SchemaRef = Arc::new(Schema::new(vec![Field::new("d", DataType::Date32, true)]));
    let days: Vec<Option<i32>> = (-25_567..47_482)
        .step_by(3)
        .map(|d| (d % 101 != 0).then_some(d))
        .collect();
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![Arc::new(arrow_array::Date32Array::from(days))],
    )
    .unwrap();
    for unit in ["day", "week", "month", "quarter", "year", "QUARTER"] {
        let sql = format!(
            "SELECT count(*) AS n, \
             sum(CASE WHEN date_trunc('{unit}', d) IS NOT DISTINCT FROM \
                 date_trunc('{unit}', CAST(d AS TIMESTAMP) + INTERVAL '0 seconds') THEN 1 ELSE 0 END) AS same \
             FROM t"
        );
        let input = Input::new("t", schema.clone(), vec![batch.clone()]);
        let mut q = Query::start(&sql, vec![input], &QueryLimits::default())
            .await
            .unwrap();
        let b = q.next_batch().await.unwrap().unwrap();
        let b = [b];
        assert_eq!(int(&b, 0, 0), int(&b, 1, 0), "{unit}");
    }
    let input = Input::new("t", schema.clone(), vec![batch.clone()]);
    let q = Query::start(
        "SELECT date_trunc('month', d) AS m FROM t LIMIT 1",
        vec![input],
        &QueryLimits::default(),
    )
    .await
    .unwrap();
    assert_eq!(
        q.schema().field(0).data_type(),
        &DataType::Timestamp(arrow_schema::TimeUnit::Nanosecond, None)
    );
}

/// Functions that could build more than a quarter of the memory limit in one call are
/// refused before they build it; the same functions on ordinary text run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn growing_functions_are_bounded_by_what_they_could_build() {
    let limits = QueryLimits {
        memory_bytes: 64 << 20,
        threads: 2,
    };
    for sql in [
        "SELECT length(repeat('x', 100000000)) AS n",
        "SELECT max(length(lpad(line, 10000000))) AS n FROM sales",
        "SELECT max(length(replace(line, '', repeat('y', 10000)))) AS n FROM sales",
        "SELECT max(length(regexp_replace(line, '', repeat('y', 10000), 'g'))) AS n FROM sales",
    ] {
        match run_with(sql, &limits).await {
            Err(SqlError::OutOfMemory { limit_bytes }) => assert_eq!(limit_bytes, 64 << 20),
            other => panic!("{sql}: expected out of memory, got {other:?}"),
        }
    }
    // A long text replaced piece by piece: about twice its size, not refused.
    let sql = "SELECT CAST(max(length(replace(t, 'x', 'yy'))) AS BIGINT) AS n \
               FROM (SELECT repeat('x', 1000000) AS t FROM sales LIMIT 4)";
    assert_eq!(int(&run_with(sql, &limits).await.unwrap(), 0, 0), 2_000_000);
    let sql = "SELECT CAST(max(length(regexp_replace(line, 'line', 'row', 'g'))) AS BIGINT) AS n \
               FROM sales";
    assert_eq!(int(&run_with(sql, &limits).await.unwrap(), 0, 0), 5);
}

/// What a one-row side computes once gives the answer the literal gives; and what the
/// query only evaluates under a condition is not evaluated otherwise (its overflow stays
/// unreached).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn computed_once_agrees_with_the_value_written_out() {
    let once = run("SELECT count(*) FILTER (WHERE id >= m - 1000) AS recent, \
                sum(id) FILTER (WHERE id < m - 1000) AS older \
         FROM sales CROSS JOIN (SELECT max(id) AS m FROM sales) b")
    .await
    .unwrap();
    let literal = run("SELECT count(*) FILTER (WHERE id >= 2999) AS recent, \
                sum(id) FILTER (WHERE id < 2999) AS older FROM sales")
    .await
    .unwrap();
    assert_eq!(
        (int(&once, 0, 0), int(&once, 1, 0)),
        (1001, 2999 * 2998 / 2)
    );
    assert_eq!(
        (int(&once, 0, 0), int(&once, 1, 0)),
        (int(&literal, 0, 0), int(&literal, 1, 0))
    );
    let guarded = run(
        "SELECT sum(CASE WHEN id < 0 THEN m * 9223372036854775807 ELSE 1 END) AS n \
         FROM sales CROSS JOIN (SELECT max(id) AS m FROM sales) b",
    )
    .await
    .unwrap();
    assert_eq!(int(&guarded, 0, 0), 4000);
    match run(
        "SELECT sum(id) FILTER (WHERE id < m * 9223372036854775807) AS n \
         FROM sales CROSS JOIN (SELECT max(id) AS m FROM sales) b",
    )
    .await
    {
        Err(SqlError::Invalid { message, .. }) => {
            assert!(message.to_lowercase().contains("overflow"), "{message}")
        }
        other => panic!("expected an overflow, got {other:?}"),
    }
}
