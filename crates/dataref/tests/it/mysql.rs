//! A MySQL source through the real binary, against a real MariaDB server: a named query
//! with a bound parameter and the model's `query` over stdio, each principal logged in as
//! its own database user; `dataref doctor` names every login and flags one that holds more
//! than reading.

use std::process::Command;

use dataref_test_support::TestMariadb;
use rmcp::ServiceExt;
use rmcp::transport::TokioChildProcess;
use serde_json::json;

use super::{BIN, Client, call, text};

const SETUP: &str = "
CREATE DATABASE shop;
CREATE TABLE shop.orders (id INT PRIMARY KEY, region CHAR(2), amount DECIMAL(10,2),
                          placed DATE, big BIGINT UNSIGNED);
INSERT INTO shop.orders VALUES
  (1, 'EU', 10.50, '2025-01-05', 18446744073709551615),
  (2, 'US', 20.00, '2025-01-06', 1),
  (3, 'EU', 30.25, '2025-02-01', 2);
CREATE TABLE shop.salaries (name TEXT, salary INT);
INSERT INTO shop.salaries VALUES ('zed-secret', 100);
CREATE USER dataref IDENTIFIED BY 'op-pw';
GRANT SELECT ON shop.* TO dataref;
CREATE USER eu IDENTIFIED BY 'eu-pw';
GRANT SELECT ON shop.orders TO eu;
CREATE USER wide IDENTIFIED BY 'wide-pw';
GRANT SELECT ON shop.orders TO wide;
GRANT FILE, PROCESS ON *.* TO wide;
";

fn config(db: &TestMariadb, principal_user: &str, password_var: &str) -> String {
    format!(
        "[server]\nprincipal = \"anna\"\n[python]\nenabled = false\n\
         [sources.shop]\nkind = \"mysql\"\nurl = \"{url}\"\nallow_sql = true\n\
         [queries.orders]\nsource = \"shop\"\ndescription = \"Orders on or after a day.\"\n\
         sql = \"SELECT id, amount, placed, big FROM orders WHERE placed >= :since ORDER BY id\"\n\
         params.since = {{ type = \"date\", required = true }}\n\
         [principals.anna]\nmysql_user = \"{principal_user}\"\n\
         mysql_password = \"${{{password_var}}}\"\n",
        url = db.url("dataref", "${OP_PW}", "shop"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_queries_and_model_sql_run_as_the_callers_own_user() {
    // With its binary log: the receipt of a fetch names the server's GTID position.
    let db = TestMariadb::start_logged().expect("start MariaDB (scripts/test installs it)");
    db.execute(SETUP).unwrap();
    let home = tempfile::tempdir().unwrap();
    let path = home.path().join("dataref.toml");
    std::fs::write(&path, config(&db, "eu", "EU_PW")).unwrap();

    let doctor = Command::new(BIN)
        .args(["doctor", "--home"])
        .arg(home.path())
        .arg("--config")
        .arg(&path)
        .env("OP_PW", "op-pw")
        .env("EU_PW", "eu-pw")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&doctor.stdout);
    let line = out
        .lines()
        .find(|l| l.contains("source shop"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("MariaDB"), "{out}");
    assert!(line.contains("anna → eu@% (reads only)"), "{out}");
    assert!(line.trim_start().starts_with("ok"), "{out}");

    let mut cmd = tokio::process::Command::new(BIN);
    cmd.arg("serve")
        .arg("--home")
        .arg(home.path())
        .arg("--config")
        .arg(&path)
        .env("OP_PW", "op-pw")
        .env("EU_PW", "eu-pw")
        .stderr(std::process::Stdio::null());
    let client: Client =
        ().serve(TokioChildProcess::new(cmd).expect("spawn dataref serve"))
            .await
            .expect("MCP handshake");

    let r = call(&client, "fetch_orders", json!({"since": "2025-01-06"})).await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    let d = r.structured_content.clone().unwrap();
    assert_eq!(d["rows"], 2, "{d}");
    let lineage = call(&client, "lineage", json!({"dataRef": d["dataRef"]})).await;
    let receipt = &lineage.structured_content.as_ref().unwrap()["receipt"];
    assert_eq!(receipt["source"]["kind"], "mysql", "{receipt}");
    let version = receipt["source"]["version"].as_str().unwrap_or_default();
    assert!(version.starts_with("gtid 0-1-"), "{receipt}");
    // The exact sum of an unsigned BIGINT column past 2^63, computed where the data is.
    let r = call(
        &client,
        "query",
        json!({"source": "shop", "sql": "SELECT SUM(amount) AS total, MAX(big) AS big FROM orders"}),
    )
    .await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    let got = call(
        &client,
        "run_sql",
        json!({"sql": "SELECT CAST(total AS VARCHAR) AS total, CAST(big AS VARCHAR) AS big FROM t",
               "inputs": {"t": r.structured_content.as_ref().unwrap()["dataRef"]},
               "store_as": "value"}),
    )
    .await;
    assert_eq!(
        got.structured_content.as_ref().unwrap()["values"],
        json!([["60.75", "18446744073709551615"]]),
        "{}",
        text(&got)
    );
    // The caller's user has no grant on salaries: the database says no.
    let r = call(
        &client,
        "query",
        json!({"source": "shop", "sql": "SELECT * FROM salaries"}),
    )
    .await;
    assert_eq!(r.is_error, Some(true), "{}", text(&r));
    assert!(text(&r).contains("MySQL user `eu`"), "{}", text(&r));
    assert!(!text(&r).contains("zed-secret"), "{}", text(&r));
    client.cancel().await.unwrap();

    // A login that can read files or other sessions' statements: doctor warns, and
    // `query` is refused before the statement runs.
    std::fs::write(&path, config(&db, "wide", "WIDE_PW")).unwrap();
    let doctor = Command::new(BIN)
        .args(["doctor", "--home"])
        .arg(home.path())
        .arg("--config")
        .arg(&path)
        .env("OP_PW", "op-pw")
        .env("WIDE_PW", "wide-pw")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&doctor.stdout);
    assert!(
        out.contains("anna → wide@% (also holds FILE, PROCESS: `query` is refused)"),
        "{out}"
    );
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.arg("serve")
        .arg("--home")
        .arg(home.path())
        .arg("--config")
        .arg(&path)
        .env("OP_PW", "op-pw")
        .env("WIDE_PW", "wide-pw")
        .stderr(std::process::Stdio::null());
    let client: Client =
        ().serve(TokioChildProcess::new(cmd).expect("spawn dataref serve"))
            .await
            .expect("MCP handshake");
    let r = call(
        &client,
        "query",
        json!({"source": "shop", "sql": "SELECT LOAD_FILE('/etc/passwd') AS f"}),
    )
    .await;
    assert_eq!(r.is_error, Some(true), "{}", text(&r));
    assert!(!text(&r).contains("root:"), "{}", text(&r));
    client.cancel().await.unwrap();
}
