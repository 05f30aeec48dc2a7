//! The authorizer: what a statement may not do, and the database file left untouched.

use std::collections::BTreeMap;

use dataref_sources::{SourceError, SqlPolicy};

use crate::Env;

const SETUP: &str = "CREATE TABLE sales (id INTEGER PRIMARY KEY, region TEXT, revenue REAL);
    CREATE INDEX sales_region ON sales(region);
    INSERT INTO sales VALUES (1, 'EMEA', 10.5), (2, 'APAC', 20.0);";

#[test]
fn writes_attach_and_state_pragmas_are_refused() {
    let env = Env::new(SETUP);
    let before = std::fs::read(env.db()).unwrap();
    let other = env.dir.path().join("other.sqlite");
    let attach = format!("ATTACH '{}' AS o", other.display());
    let vacuum = format!("VACUUM INTO '{}'", other.display());
    let cases: Vec<(&str, &str)> = vec![
        (&attach, "ATTACH"),
        ("INSERT INTO sales VALUES (3, 'LATAM', 1.0)", "INSERT"),
        ("UPDATE sales SET revenue = 0", "UPDATE"),
        ("DELETE FROM sales", "DELETE"),
        ("DROP TABLE sales", "schema"),
        ("DROP INDEX sales_region", "schema"),
        ("ALTER TABLE sales ADD COLUMN x", "ALTER"),
        ("CREATE TABLE x (a)", "schema"),
        ("CREATE TEMP TABLE x (a)", "schema"),
        ("CREATE TEMP VIEW v AS SELECT 1", "schema"),
        ("CREATE INDEX i2 ON sales(revenue)", "schema"),
        ("REINDEX", "REINDEX"),
        ("ANALYZE", "ANALYZE"),
        ("ANALYZE sales", "ANALYZE"),
        ("BEGIN", "BEGIN"),
        ("SAVEPOINT s", "SAVEPOINT"),
        ("PRAGMA writable_schema=1", "writable_schema"),
        ("PRAGMA journal_mode=delete", "journal_mode"),
        ("PRAGMA user_version = 7", "user_version"),
        ("PRAGMA database_list", "database_list"),
        ("PRAGMA optimize", "optimize"),
        ("SELECT 1; SELECT 2", "more than one statement"),
        ("SELECT 1; DROP TABLE sales", "schema"),
        ("SELECT load_extension('x')", "load_extension"),
        (
            "WITH d AS (DELETE FROM sales RETURNING id) SELECT * FROM d",
            "",
        ),
        (&vacuum, "writes"),
        ("VACUUM", "writes"),
    ];
    for policy in [SqlPolicy::Generic, SqlPolicy::Configured] {
        for (sql, want) in &cases {
            match env.run(sql, Vec::new(), &BTreeMap::new(), policy) {
                Err(SourceError::NotAllowed { what }) => {
                    assert!(what.contains(want), "{sql}: `{what}` should mention {want}");
                }
                // Not every statement parses (a CTE cannot hold a DELETE); it must not run.
                Err(SourceError::Sql { message }) if want.is_empty() => {
                    assert!(!message.is_empty());
                }
                other => panic!("{sql} ({policy:?}): expected not allowed, got {other:?}"),
            }
        }
    }
    assert_eq!(
        std::fs::read(env.db()).unwrap(),
        before,
        "the database changed"
    );
    assert!(!other.exists(), "a statement created another file");
    assert_eq!(env.artifacts(), 0);
}

#[test]
fn not_allowed_names_what_and_hints() {
    let env = Env::new(SETUP);
    let e = env.query("PRAGMA journal_mode=delete").unwrap_err();
    assert_eq!(e.to_string(), "not allowed: `PRAGMA journal_mode = delete`");
    assert!(e.hint().unwrap().contains("read-only SELECT"));
    assert!(e.is_caller_error());
}

#[test]
fn reads_and_introspection_are_allowed() {
    let env = Env::new(SETUP);
    let cases = [
        ("SELECT name, sql FROM sqlite_schema", 2),
        ("PRAGMA table_info(sales)", 3),
        ("PRAGMA table_xinfo(sales)", 3),
        ("PRAGMA index_list(sales)", 1),
        ("PRAGMA index_info(sales_region)", 1),
        ("PRAGMA foreign_key_list(sales)", 0),
        ("PRAGMA table_list", 3),
        ("SELECT name FROM pragma_table_info('sales')", 3),
        ("SELECT region, sum(revenue) FROM sales GROUP BY region", 2),
        (
            "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 5) SELECT n FROM c",
            5,
        ),
        (
            "EXPLAIN QUERY PLAN SELECT * FROM sales WHERE region = 'EMEA'",
            1,
        ),
        ("SELECT 1;", 1),
    ];
    for (sql, rows) in cases {
        match env.query(sql) {
            Ok(meta) => assert_eq!(meta.rows, rows, "{sql}"),
            Err(e) => panic!("{sql}: {e}"),
        }
    }
}
