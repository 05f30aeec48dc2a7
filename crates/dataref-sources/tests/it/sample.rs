//! The built-in sample database: size, determinism, content, and the sample query.

use std::path::Path;
use std::sync::Mutex;

use arrow_array::cast::AsArray;
use arrow_array::types::Date32Type;
use arrow_schema::DataType;
use dataref_config::Config;
use dataref_sources::{
    FetchRequest, SAMPLE_ROWS_DEFAULT, SAMPLE_ROWS_MAX, SourceError, SqlPolicy, bind_params,
    ensure_sample, fetch, generate_sample,
};
use dataref_store::Lineage;
use rusqlite::Connection;

use crate::Env;

fn summary(path: &Path) -> (f64, i64, i64, String, String, i64, i64, i64) {
    let conn = Connection::open(path).unwrap();
    conn.query_row(
        "SELECT sum(revenue), count(DISTINCT line), count(*), min(date), max(date),
                count(*) - count(discount), count(DISTINCT region), count(DISTINCT channel)
         FROM sales",
        [],
        |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
                r.get(6)?,
                r.get(7)?,
            ))
        },
    )
    .unwrap()
}

#[test]
fn the_default_sample_is_deterministic_and_plausible() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.sqlite");
    let b = dir.path().join("b").join("b.sqlite");
    std::fs::create_dir_all(b.parent().unwrap()).unwrap();
    let calls = Mutex::new(Vec::new());
    generate_sample(&a, SAMPLE_ROWS_DEFAULT, &|n| calls.lock().unwrap().push(n)).unwrap();
    generate_sample(&b, SAMPLE_ROWS_DEFAULT, &|_| {}).unwrap();
    assert_eq!(calls.lock().unwrap().last(), Some(&SAMPLE_ROWS_DEFAULT));

    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    let s = summary(&a);
    assert_eq!(s, summary(&b));
    let (revenue, lines, rows, first, last, null_discounts, regions, channels) = s;
    assert_eq!(rows, 48_210);
    assert_eq!(lines, 300);
    assert_eq!((regions, channels), (5, 4));
    assert_eq!(
        (first.as_str(), last.as_str()),
        ("2025-01-01", "2025-12-31")
    );
    let null_share = null_discounts as f64 / rows as f64;
    assert!((0.05..0.09).contains(&null_share), "{null_share}");
    assert!(revenue > 1e6, "{revenue}");
    // No temp files are left beside the database.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
}

#[test]
fn values_are_in_range() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sqlite");
    generate_sample(&path, 5_000, &|_| {}).unwrap();
    let conn = Connection::open(&path).unwrap();
    let bad: i64 = conn
        .query_row(
            "SELECT count(*) FROM sales WHERE units NOT BETWEEN 1 AND 40
                OR discount NOT IN (0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3)
                OR revenue <= 0 OR round(revenue, 2) != revenue
                OR date NOT GLOB '2025-[01][0-9]-[0-3][0-9]'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(bad, 0);
    let ids: (i64, i64, i64) = conn
        .query_row("SELECT min(id), max(id), count(*) FROM sales", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .unwrap();
    assert_eq!(ids, (1, 5_000, 5_000));
    let line: String = conn
        .query_row("SELECT line FROM sales WHERE id = 1", [], |r| r.get(0))
        .unwrap();
    assert!(line.split(' ').count() >= 2, "{line}");
}

#[test]
fn quarter_over_quarter_has_a_clear_story() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sqlite");
    generate_sample(&path, SAMPLE_ROWS_DEFAULT, &|_| {}).unwrap();
    let conn = Connection::open(&path).unwrap();
    let mut stmt = conn
        .prepare(
            "SELECT line,
                    sum(CASE WHEN date >= '2025-07-01' AND date < '2025-10-01' THEN revenue END),
                    sum(CASE WHEN date >= '2025-10-01' THEN revenue END)
             FROM sales GROUP BY line",
        )
        .unwrap();
    let changes: Vec<(String, f64, f64)> = stmt
        .query_map([], |r| {
            Ok((
                r.get(0)?,
                r.get::<_, Option<f64>>(1)?.unwrap_or(0.0),
                r.get::<_, Option<f64>>(2)?.unwrap_or(0.0),
            ))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let collapsed = changes.iter().filter(|(_, q3, q4)| *q4 < 0.5 * q3).count();
    let grew = changes.iter().filter(|(_, q3, q4)| *q4 > 1.1 * q3).count();
    assert!((8..=30).contains(&collapsed), "{collapsed} lines collapsed");
    assert!(grew >= 30, "only {grew} lines grew");
    // The biggest absolute losers are the lines that collapsed.
    let mut by_loss: Vec<_> = changes
        .iter()
        .map(|(l, q3, q4)| (q4 - q3, q4 / q3, l))
        .collect();
    by_loss.sort_by(|a, b| a.0.total_cmp(&b.0));
    assert!(
        by_loss[..5].iter().all(|(_, ratio, _)| *ratio < 0.5),
        "{:?}",
        &by_loss[..5]
    );
}

#[test]
fn the_builtin_sales_query_returns_every_row() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config::builtin_sample(dir.path().join("home"), SAMPLE_ROWS_DEFAULT);
    let spec = config.sample.clone().unwrap();
    ensure_sample(&spec, &|_| {}).unwrap();
    assert!(spec.path.exists());
    // A second call finds the file and generates nothing.
    let calls = Mutex::new(0);
    ensure_sample(&spec, &|_| *calls.lock().unwrap() += 1).unwrap();
    assert_eq!(*calls.lock().unwrap(), 0);

    let query = &config.queries["sales"];
    let source = &config.sources[&query.source];
    let env = Env::with_database(tempfile::tempdir().unwrap(), spec.path.clone());
    let params = bind_params(
        query,
        &serde_json::json!({ "since": "2025-01-01" })
            .as_object()
            .unwrap()
            .clone(),
    )
    .unwrap();
    let req = FetchRequest {
        source,
        sql: &query.sql,
        params,
        declared: &query.columns,
        policy: SqlPolicy::Configured,
    };
    let meta = fetch(
        &req,
        &env.store,
        &env.owner,
        Lineage::new(
            query.tool_name(),
            serde_json::json!({ "since": "2025-01-01" }),
        ),
        &|_| {},
        &|| false,
    )
    .unwrap();
    assert_eq!(meta.rows, SAMPLE_ROWS_DEFAULT);
    let types: Vec<(&str, &DataType)> = meta
        .schema
        .fields()
        .iter()
        .map(|f| (f.name().as_str(), f.data_type()))
        .collect();
    assert_eq!(
        types,
        [
            ("date", &DataType::Date32),
            ("line", &DataType::Utf8),
            ("region", &DataType::Utf8),
            ("channel", &DataType::Utf8),
            ("units", &DataType::Int64),
            ("revenue", &DataType::Float64),
            ("discount", &DataType::Float64),
        ]
    );
    assert!(meta.null_counts[6] > 0, "no NULL discounts");
    assert_eq!(&meta.null_counts[..6], &[0; 6]);
    let table = env.table(&meta);
    let first = table.batches[0]
        .column(0)
        .as_primitive::<Date32Type>()
        .value(0);
    assert_eq!(first, 20_089); // 2025-01-01
}

#[test]
fn sizes_out_of_range_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sqlite");
    for rows in [0, SAMPLE_ROWS_MAX + 1] {
        match generate_sample(&path, rows, &|_| {}) {
            Err(SourceError::BadParam { name, message }) => {
                assert_eq!(name, "rows");
                assert!(message.contains("10000000"), "{message}");
            }
            other => panic!("{rows}: {other:?}"),
        }
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn the_catalogue_joins_every_sale_and_is_added_to_an_older_sample() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config::builtin_sample(dir.path().join("home"), 5_000);
    let spec = config.sample.clone().unwrap();
    ensure_sample(&spec, &|_| {}).unwrap();
    let conn = Connection::open(&spec.path).unwrap();
    let catalogue = |conn: &Connection| -> (i64, i64, i64, f64) {
        conn.query_row(
            "SELECT count(*), count(DISTINCT category), count(DISTINCT collection),
                    round(sum(list_price), 2) FROM lines",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .unwrap()
    };
    let made = catalogue(&conn);
    assert_eq!((made.0, made.1, made.2), (300, 5, 20));
    let unjoined: i64 = conn
        .query_row(
            "SELECT count(*) FROM sales s LEFT JOIN lines l ON l.line = s.line
             WHERE l.line IS NULL",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(unjoined, 0, "every sale's line is in the catalogue");
    // Revenue is the list price, discounted, with a little noise.
    let off: i64 = conn
        .query_row(
            "SELECT count(*) FROM sales s JOIN lines l USING (line)
             WHERE s.revenue > s.units * l.list_price * 1.031
                OR s.revenue < s.units * l.list_price * (1 - coalesce(s.discount, 0)) * 0.969",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(off, 0);
    let sales = |conn: &Connection| -> (f64, i64, String) {
        conn.query_row(
            "SELECT sum(revenue * id), count(*), group_concat(line, '|') FROM sales",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap()
    };
    let before = sales(&conn);

    // A sample made before `lines` existed gets it, the same, and its sales stay as they are.
    conn.execute_batch("DROP TABLE lines").unwrap();
    drop(conn);
    ensure_sample(&spec, &|_| {}).unwrap();
    let conn = Connection::open(&spec.path).unwrap();
    assert_eq!(catalogue(&conn), made);
    assert_eq!(sales(&conn), before);
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(tables, ["lines", "sales"]);
}
