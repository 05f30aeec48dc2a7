//! A lake as the query's table: Parquet with Hive partitions, CSV and NDJSON by glob;
//! filters that prune folders (a damaged file in a pruned folder is never opened);
//! bound parameters; and the attacker's SQL, which still opens no other file.
#![expect(
    clippy::disallowed_methods,
    reason = "the lakes are files the test writes directly, outside any workspace"
)]

use std::fs;
use std::path::Path;
use std::sync::Arc;

use arrow_array::{Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use dataref_sql::{Lake, LakeFormat, Param, Query, QueryLimits, SqlError, Tables};

fn write_parquet(path: &Path, lines: &[&str], units: &[i64]) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    let schema = Arc::new(Schema::new(vec![
        Field::new("line", DataType::Utf8, false),
        Field::new("units", DataType::Int64, false),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(StringArray::from(lines.to_vec())),
            Arc::new(Int64Array::from(units.to_vec())),
        ],
    )
    .unwrap();
    let file = fs::File::create(path).unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(file, schema, None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

/// `year=2024/` and `year=2025/` of Parquet, a `_SUCCESS` marker, and `year=2026/` whose
/// one file is not Parquet at all.
fn hive_lake(dir: &Path) {
    write_parquet(
        &dir.join("year=2024/part-0.parquet"),
        &["Bikes", "Helmets"],
        &[3, 4],
    );
    write_parquet(
        &dir.join("year=2025/part-0.parquet"),
        &["Bikes", "Bikes", "Locks"],
        &[10, 20, 5],
    );
    fs::write(dir.join("_SUCCESS"), b"").unwrap();
    fs::create_dir_all(dir.join("year=2026")).unwrap();
    fs::write(
        dir.join("year=2026/part-0.parquet"),
        b"PAR1 this is not a parquet file PAR1",
    )
    .unwrap();
}

async fn run_lake(sql: &str, lake: Lake, params: Vec<Param>) -> Result<Vec<RecordBatch>, SqlError> {
    let mut q = Query::start_with(sql, Tables::Lake(lake), params, &QueryLimits::default()).await?;
    let mut out = Vec::new();
    while let Some(b) = q.next_batch().await? {
        out.push(b);
    }
    Ok(out)
}

fn column_text(batches: &[RecordBatch], col: usize) -> Vec<String> {
    let mut out = Vec::new();
    for b in batches {
        let c = arrow_cast::cast(b.column(col), &DataType::Utf8).unwrap();
        let s = c.as_any().downcast_ref::<StringArray>().unwrap();
        for i in 0..s.len() {
            out.push(if s.is_null(i) {
                "NULL".into()
            } else {
                s.value(i).to_owned()
            });
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parquet_lake_is_queried_by_partition_and_a_filter_never_opens_pruned_folders() {
    let dir = tempfile::tempdir().unwrap();
    hive_lake(dir.path());
    let path = format!("{}/", dir.path().display());
    let lake = || Lake::local("sales", &path, None);

    let got = run_lake(
        "SELECT year, sum(units) AS units FROM sales WHERE year IN ('2024', '2025') \
         GROUP BY year ORDER BY year",
        lake(),
        Vec::new(),
    )
    .await
    .unwrap();
    assert_eq!(column_text(&got, 0), ["2024", "2025"]);
    assert_eq!(column_text(&got, 1), ["7", "35"]);

    // Bound, never spliced: the value is compared as a value.
    let got = run_lake(
        "SELECT line, units FROM sales WHERE year = $1 AND units > $2 ORDER BY units",
        lake(),
        vec![Param::Text("2025".into()), Param::Integer(5)],
    )
    .await
    .unwrap();
    assert_eq!(column_text(&got, 0), ["Bikes", "Bikes"]);
    assert_eq!(column_text(&got, 1), ["10", "20"]);

    // Without the filter the damaged file is read, and refused: an error, never a sum of
    // what could be read (parquet's reader panics on this footer; the query fails, the
    // engine goes on).
    for _ in 0..2 {
        let err = run_lake("SELECT sum(units) FROM sales", lake(), Vec::new())
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("nothing was stored")
                || err.to_string().to_lowercase().contains("parquet"),
            "{err}"
        );
    }
    let got = run_lake(
        "SELECT count(*) FROM sales WHERE year <> '2026'",
        lake(),
        Vec::new(),
    )
    .await
    .unwrap();
    assert_eq!(column_text(&got, 0), ["5"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csv_and_ndjson_lakes_are_read_by_glob_with_their_types() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("a.csv"),
        "day,amount\n2025-01-01,12.5\n2025-01-02,7\n",
    )
    .unwrap();
    fs::write(dir.path().join("b.csv"), "day,amount\n2025-01-03,0.5\n").unwrap();
    fs::write(dir.path().join("notes.txt"), "not data\n").unwrap();
    let glob = format!("{}/*.csv", dir.path().display());
    let got = run_lake(
        "SELECT count(*) AS n, sum(amount) AS total FROM t",
        Lake::local("t", &glob, Some(LakeFormat::Csv)),
        Vec::new(),
    )
    .await
    .unwrap();
    assert_eq!(column_text(&got, 0), ["3"]);
    assert_eq!(column_text(&got, 1), ["20.0"]);

    let nd = tempfile::tempdir().unwrap();
    fs::write(
        nd.path().join("events.jsonl"),
        "{\"user\":\"a\",\"n\":1}\n{\"user\":\"b\",\"n\":2}\n{\"user\":\"a\",\"n\":4}\n",
    )
    .unwrap();
    let got = run_lake(
        "SELECT user, sum(n) AS n FROM events GROUP BY user ORDER BY user",
        Lake::local("events", &format!("{}/", nd.path().display()), None),
        Vec::new(),
    )
    .await
    .unwrap();
    assert_eq!(column_text(&got, 0), ["a", "b"]);
    assert_eq!(column_text(&got, 1), ["5", "2"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lake_query_opens_no_other_file_and_an_empty_lake_says_so() {
    let dir = tempfile::tempdir().unwrap();
    hive_lake(dir.path());
    let secret = tempfile::tempdir().unwrap();
    write_parquet(&secret.path().join("s.parquet"), &["secret"], &[1]);
    let path = format!("{}/", dir.path().display());
    let secret_file = secret.path().join("s.parquet");
    for sql in [
        format!("SELECT * FROM '{}'", secret_file.display()),
        format!("SELECT * FROM 'file://{}'", secret_file.display()),
        format!(
            "CREATE EXTERNAL TABLE x STORED AS PARQUET LOCATION '{}'",
            secret_file.display()
        ),
        format!("SELECT * FROM read_parquet('{}')", secret_file.display()),
        "SELECT * FROM information_schema.tables".to_owned(),
    ] {
        let err = run_lake(&sql, Lake::local("sales", &path, None), Vec::new())
            .await
            .unwrap_err();
        assert!(!err.to_string().contains("secret"), "{sql}: {err}");
    }

    let empty = tempfile::tempdir().unwrap();
    let err = run_lake(
        "SELECT 1 FROM t",
        Lake::local("t", &format!("{}/", empty.path().display()), None),
        Vec::new(),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, SqlError::Lake { .. }) && err.to_string().contains("no files"),
        "{err}"
    );
}
