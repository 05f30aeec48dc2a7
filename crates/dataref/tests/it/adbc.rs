//! `adbc` sources through the real binary with real ADBC drivers (the shared libraries of
//! the PyPI wheels `adbc-driver-sqlite` and `adbc-driver-postgresql`), loaded through the
//! C ABI in a worker process: named queries with bound parameters, the model's `query`,
//! each principal under its own database credentials, limits, and a driver that crashes
//! ending only its worker.

use std::process::Command;

use dataref_test_support::{TestPostgres, adbc_driver};
use rmcp::ServiceExt;
use rmcp::transport::TokioChildProcess;
use serde_json::json;

use super::{BIN, Client, call, text};

async fn serve(home: &std::path::Path, config: &std::path::Path) -> Client {
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.arg("serve")
        .arg("--home")
        .arg(home)
        .arg("--config")
        .arg(config)
        .env("EU_PG", "unused")
        .stderr(std::process::Stdio::null());
    ().serve(TokioChildProcess::new(cmd).expect("spawn dataref serve"))
        .await
        .expect("MCP handshake")
}

fn doctor(home: &std::path::Path, config: &std::path::Path) -> String {
    let out = Command::new(BIN)
        .arg("doctor")
        .arg("--home")
        .arg(home)
        .arg("--config")
        .arg(config)
        .output()
        .expect("run dataref doctor");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sqlite_driver_answers_named_queries_and_model_sql_in_a_worker() {
    let driver = adbc_driver("sqlite").expect("the SQLite ADBC driver (scripts/test installs it)");
    let home = tempfile::tempdir().unwrap();
    let db = home.path().join("shop.db");
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch(
        "CREATE TABLE sales (region TEXT, amount REAL, day TEXT);
         INSERT INTO sales VALUES ('EU', 10.5, '2025-01-05'), ('US', 20.0, '2025-01-06'),
                                  ('EU', 30.25, '2025-02-01'), ('US', 1.0, '2024-12-31');",
    )
    .unwrap();
    drop(conn);
    let config = home.path().join("dataref.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nprincipal = \"anna\"\n[python]\nenabled = false\n\
             [sources.shop]\nkind = \"adbc\"\ndriver = \"{driver}\"\nallow_sql = true\n\
             max_rows = 3\ntimeout = \"2s\"\n\
             options = {{ uri = \"file:{db}?mode=ro\" }}\n\
             [sources.broken]\nkind = \"adbc\"\ndriver = \"/lib/x86_64-linux-gnu/libc.so.6\"\n\
             entrypoint = \"abort\"\nallow_sql = true\n\
             [queries.totals]\nsource = \"shop\"\ndescription = \"Totals by region since a day.\"\n\
             sql = \"SELECT region, sum(amount) AS total FROM sales WHERE day >= :since GROUP BY region ORDER BY region\"\n\
             params.since = {{ type = \"string\", required = true }}\n",
            driver = driver.display(),
            db = db.display(),
        ),
    )
    .unwrap();

    let said = doctor(home.path(), &config);
    let line = said
        .lines()
        .find(|l| l.contains("source shop"))
        .unwrap_or_else(|| panic!("{said}"));
    assert!(line.contains("anna connects"), "{said}");
    assert!(line.trim_start().starts_with("ok"), "{said}");
    assert!(
        said.lines()
            .any(|l| l.contains("source broken") && l.trim_start().starts_with("FAIL")),
        "{said}"
    );

    let client = serve(home.path(), &config).await;
    let r = call(&client, "fetch_totals", json!({"since": "2025-01-01"})).await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    let d = r.structured_content.clone().unwrap();
    assert_eq!(d["rows"], 2, "{d}");
    let got = call(
        &client,
        "run_sql",
        json!({"sql": "SELECT region, total FROM t ORDER BY region", "inputs": {"t": d["dataRef"]},
               "store_as": "value"}),
    )
    .await;
    assert_eq!(
        got.structured_content.as_ref().unwrap()["values"],
        json!([["EU", 40.75], ["US", 20.0]]),
        "{}",
        text(&got)
    );

    // The model's SQL, in the database's own dialect.
    let r = call(
        &client,
        "query",
        json!({"source": "shop", "sql": "SELECT count(*) AS n, typeof(amount) AS t FROM sales"}),
    )
    .await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    // A write: the database (opened read-only) refuses it; nothing changed.
    let r = call(
        &client,
        "query",
        json!({"source": "shop", "sql": "DELETE FROM sales"}),
    )
    .await;
    assert_eq!(r.is_error, Some(true), "{}", text(&r));
    // More rows than the source's limit is an error, never a cut table.
    let r = call(
        &client,
        "query",
        json!({"source": "shop", "sql": "SELECT * FROM sales"}),
    )
    .await;
    assert_eq!(r.is_error, Some(true), "{}", text(&r));
    assert!(text(&r).contains("more than 3 rows"), "{}", text(&r));
    // A statement past the timeout: the worker is killed, the server answers.
    let r = call(
        &client,
        "query",
        json!({"source": "shop", "sql": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"}),
    )
    .await;
    assert_eq!(r.is_error, Some(true), "{}", text(&r));
    assert!(text(&r).contains("longer than 2s"), "{}", text(&r));
    // A driver that crashes takes down its worker, never the server.
    let r = call(
        &client,
        "query",
        json!({"source": "broken", "sql": "SELECT 1"}),
    )
    .await;
    assert_eq!(r.is_error, Some(true), "{}", text(&r));
    let r = call(
        &client,
        "query",
        json!({"source": "shop", "sql": "SELECT count(*) AS n FROM sales"}),
    )
    .await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    client.cancel().await.unwrap();
    let n: i64 = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row("SELECT count(*) FROM sales", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgresql_driver_reads_under_each_principals_own_credentials() {
    let driver =
        adbc_driver("postgresql").expect("the PostgreSQL ADBC driver (scripts/test installs it)");
    let pg = TestPostgres::start().unwrap();
    pg.execute(
        "CREATE ROLE eu_analyst LOGIN; CREATE ROLE operator LOGIN;
         CREATE TABLE orders_eu (id int, amount numeric(10,2));
         CREATE TABLE orders_us (id int, amount numeric(10,2));
         INSERT INTO orders_eu VALUES (1, 10.50), (2, 20.25);
         INSERT INTO orders_us VALUES (9, 999.99);
         GRANT SELECT ON orders_eu TO eu_analyst;
         CREATE TABLE scratch (id int);
         GRANT SELECT, INSERT ON scratch TO eu_analyst;
         GRANT SELECT ON orders_eu, orders_us TO operator;",
    )
    .await
    .unwrap();
    let home = tempfile::tempdir().unwrap();
    let config = home.path().join("dataref.toml");
    let uri = |user: &str| {
        format!(
            "postgresql:///postgres?host={}&port=5432&user={user}",
            pg.socket_dir().display()
        )
    };
    std::fs::write(
        &config,
        format!(
            "[server]\nprincipal = \"anna\"\n[python]\nenabled = false\n\
             [sources.pg]\nkind = \"adbc\"\ndriver = \"{driver}\"\nallow_sql = true\n\
             placeholders = \"dollar\"\noptions = {{ uri = \"{op}\" }}\n\
             [queries.orders]\nsource = \"pg\"\ndescription = \"EU orders over an amount.\"\n\
             sql = \"SELECT id FROM orders_eu WHERE amount > :min ORDER BY id\"\n\
             params.min = {{ type = \"number\", required = true }}\n\
             [sources.leaky]\nkind = \"adbc\"\ndriver = \"{driver}\"\nallow_sql = true\n\
             options = {{ uri = \"{op}\", \"adbc.made.up\" = \"s3cret-token\" }}\n\
             [principals.anna.adbc.pg]\nuri = \"{eu}\"\n\
             [principals.anna.adbc.leaky]\nuri = \"{eu}\"\n",
            driver = driver.display(),
            op = uri("operator"),
            eu = uri("eu_analyst"),
        ),
    )
    .unwrap();
    let said = doctor(home.path(), &config);
    assert!(said.contains("anna connects (own credentials)"), "{said}");

    let client = serve(home.path(), &config).await;
    let r = call(&client, "fetch_orders", json!({"min": 15})).await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    assert_eq!(r.structured_content.as_ref().unwrap()["rows"], 1);
    // anna's own role has no grant on the US table: the database says no.
    let r = call(
        &client,
        "query",
        json!({"source": "pg", "sql": "SELECT * FROM orders_us"}),
    )
    .await;
    assert_eq!(r.is_error, Some(true), "{}", text(&r));
    assert!(!text(&r).contains("999"), "{}", text(&r));
    // A write the credentials are granted: run in a transaction that is never committed.
    let _ = call(
        &client,
        "query",
        json!({"source": "pg", "sql": "INSERT INTO scratch VALUES (1) RETURNING id"}),
    )
    .await;
    let n = pg
        .client()
        .await
        .unwrap()
        .query_one("SELECT count(*) FROM scratch", &[])
        .await
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(n, 0, "the write was committed");
    // A driver's error never shows an option's value (a password, a token).
    // (Some drivers answer an option they do not know with "option name=value"; the
    // worker hides every option's value from messages: `option_values_are_hidden`.)
    let r = call(
        &client,
        "query",
        json!({"source": "leaky", "sql": "SELECT 1"}),
    )
    .await;
    assert_eq!(r.is_error, Some(true), "{}", text(&r));
    assert!(!text(&r).contains("s3cret-token"), "{}", text(&r));
    let r = call(
        &client,
        "query",
        json!({"source": "pg", "sql": "SELECT current_user AS who"}),
    )
    .await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    let got = call(
        &client,
        "run_sql",
        json!({"sql": "SELECT who FROM t", "inputs": {"t": r.structured_content.as_ref().unwrap()["dataRef"]},
               "store_as": "value"}),
    )
    .await;
    assert_eq!(
        got.structured_content.as_ref().unwrap()["values"],
        json!([["eu_analyst"]]),
        "{}",
        text(&got)
    );
    client.cancel().await.unwrap();
}
