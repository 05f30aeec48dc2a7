//! Receipts and `dataref replay`, through the real binary on a SQLite file of the test's own:
//! a receipt for each producer and derivation, the model's `lineage` (another principal's
//! table answering as an unknown one), and replay's three verdicts — identical, changed
//! after rows are inserted, updated and deleted at the source, unavailable.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

use super::{BIN, Client, call, connect, text};

fn shop(db: &Path) {
    let conn = rusqlite::Connection::open(db).expect("open the shop");
    conn.execute_batch(
        "CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL, price REAL NOT NULL);
         INSERT INTO items VALUES (1, 'apple', 1.5), (2, 'pear', 2.0), (3, 'plum', 0.75),
                                  (4, 'fig', 3.25), (5, 'kiwi', 1.0);",
    )
    .expect("fill the shop");
}

fn config(dir: &Path, db: &Path, sql: &str) -> std::path::PathBuf {
    let path = dir.join("dataref.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[python]
enabled = false

[sources.shop]
kind = "sqlite"
path = "{}"
allow_sql = true

[queries.items]
source = "shop"
description = "Items at or above a price."
sql = "{sql}"
params.min_price = {{ type = "number", required = true }}
"#,
            db.display()
        ),
    )
    .expect("write the config");
    path
}

const ITEMS_SQL: &str = "SELECT id, name, price FROM items WHERE price >= :min_price";

async fn client(home: &Path, config: &Path, principal: &str) -> Client {
    connect(
        home,
        principal,
        &["--config", config.to_str().expect("utf-8 path")],
    )
    .await
}

fn replay(home: &Path, config: &Path, principal: &str, data_ref: &str, extra: &[&str]) -> Output {
    Command::new(BIN)
        .arg("replay")
        .arg(data_ref)
        .arg("--home")
        .arg(home)
        .arg("--config")
        .arg(config)
        .args(["--principal", principal])
        .args(extra)
        .env_remove("DATAREF_CONFIG")
        .env_remove("DATAREF_PRINCIPAL")
        .stdin(Stdio::null())
        .output()
        .expect("run dataref replay")
}

fn replay_json(home: &Path, config: &Path, principal: &str, data_ref: &str) -> (i32, Value) {
    let out = replay(home, config, principal, data_ref, &["--json"]);
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "JSON from replay ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().expect("an exit code"), v)
}

fn made(r: &rmcp::model::CallToolResult, pointer: &str) -> String {
    assert_ne!(r.is_error, Some(true), "{}", text(r));
    r.structured_content
        .as_ref()
        .and_then(|s| s.pointer(pointer))
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no `{pointer}` in {:?}", r.structured_content))
        .to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_table_has_a_receipt_and_replays_against_its_source() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let db = dir.path().join("shop.sqlite");
    shop(&db);
    let config = config(dir.path(), &db, ITEMS_SQL);
    let alice = client(&home, &config, "alice").await;

    let items = made(
        &call(&alice, "fetch_items", json!({"min_price": 1.0})).await,
        "/dataRef",
    );
    let queried = made(
        &call(
            &alice,
            "query",
            json!({"source": "shop", "sql": "SELECT name, price FROM items ORDER BY price DESC"}),
        )
        .await,
        "/dataRef",
    );
    let derived = made(
        &call(
            &alice,
            "run_sql",
            json!({"sql": "SELECT id, name, price * 2 AS doubled FROM items", "inputs": {"items": items}}),
        )
        .await,
        "/dataRef",
    );
    let workspace = home.join("workspaces/alice");
    std::fs::create_dir_all(&workspace).expect("workspace");
    std::fs::write(workspace.join("extra.csv"), "sku,qty\nA1,3\nB2,5\n").expect("csv");
    let loaded = made(
        &call(&alice, "load_file", json!({"path": "extra.csv"})).await,
        "/dataRef",
    );

    // What the model reads when it asks: the receipt of each.
    let lineage = |r: rmcp::model::CallToolResult| {
        assert_ne!(r.is_error, Some(true), "{}", text(&r));
        r.structured_content.expect("structured")
    };
    let l = lineage(call(&alice, "lineage", json!({"dataRef": items})).await);
    assert_eq!(l["madeBy"], "fetch_items");
    let receipt = &l["receipt"];
    assert_eq!(receipt["source"]["name"], "shop");
    assert_eq!(receipt["source"]["kind"], "sqlite");
    assert_eq!(receipt["sql"], ITEMS_SQL);
    assert_eq!(receipt["params"], json!({"min_price": 1.0}));
    let version = receipt["source"]["version"].as_str().expect("a version");
    assert!(
        version.contains(" bytes, modified ") && version.contains("blake3:"),
        "{version}"
    );
    assert!(receipt["ranAt"].is_string());
    assert!(receipt["engines"]["dataref"].is_string());
    assert!(
        l["checksum"]
            .as_str()
            .is_some_and(|c| c.starts_with("blake3:"))
    );

    let l = lineage(call(&alice, "lineage", json!({"dataRef": queried})).await);
    assert_eq!(l["madeBy"], "query");
    assert_eq!(
        l["receipt"]["sql"],
        "SELECT name, price FROM items ORDER BY price DESC"
    );
    assert!(l["receipt"].get("params").is_none());

    let l = lineage(call(&alice, "lineage", json!({"dataRef": derived})).await);
    assert_eq!(l["madeBy"], "run_sql");
    assert_eq!(l["receipt"]["parents"][0]["name"], "items");
    assert_eq!(l["receipt"]["parents"][0]["dataRef"], items.as_str());
    assert!(l["receipt"]["engines"]["datafusion"].is_string());
    assert!(l["receipt"].get("source").is_none());

    let l = lineage(call(&alice, "lineage", json!({"dataRef": loaded})).await);
    assert_eq!(l["madeBy"], "load_file");
    assert_eq!(l["receipt"]["file"]["path"], "extra.csv");
    assert_eq!(l["receipt"]["file"]["bytes"], 18);

    // Another principal's table answers exactly as an unknown one.
    let bob = client(&home, &config, "bob").await;
    let theirs = call(&bob, "lineage", json!({"dataRef": items})).await;
    let unknown = call(
        &bob,
        "lineage",
        json!({"dataRef": "data_AAAAAAAAAAAAAAAAAAAAAA"}),
    )
    .await;
    assert_eq!(theirs.is_error, Some(true));
    assert_eq!(
        text(&theirs).replace(&items, "data_AAAAAAAAAAAAAAAAAAAAAA"),
        text(&unknown)
    );
    bob.cancel().await.ok();

    // Nothing changed: identical, each way.
    let (code, v) = replay_json(&home, &config, "alice", &items);
    assert_eq!((code, &v["outcome"]), (0, &json!("identical")), "{v:#}");
    assert!(v["replayedAs"].is_string());
    let (code, v) = replay_json(&home, &config, "alice", &queried);
    assert_eq!((code, &v["outcome"]), (0, &json!("identical")), "{v:#}");
    let (code, v) = replay_json(&home, &config, "alice", &derived);
    assert_eq!((code, &v["outcome"]), (0, &json!("identical")), "{v:#}");
    assert_eq!(v["parents"][0]["input"], "items");
    assert_eq!(v["parents"][0]["outcome"], "identical");
    let (code, v) = replay_json(&home, &config, "alice", &loaded);
    assert_eq!((code, &v["outcome"]), (0, &json!("identical")), "{v:#}");
    let human = replay(&home, &config, "alice", &items, &[]);
    assert_eq!(human.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&human.stdout).starts_with(&format!(
            "{items} (fetch_items: items min_price=1.0): identical\n"
        )),
        "{}",
        String::from_utf8_lossy(&human.stdout)
    );

    // The source changes: one row inserted, one updated, one deleted.
    {
        let conn = rusqlite::Connection::open(&db).expect("open the shop");
        conn.execute_batch(
            "INSERT INTO items VALUES (6, 'lime', 1.25);
             UPDATE items SET price = 2.5 WHERE id = 2;
             DELETE FROM items WHERE id = 4;",
        )
        .expect("change the shop");
    }
    let (code, v) = replay_json(&home, &config, "alice", &items);
    assert_eq!((code, &v["outcome"]), (3, &json!("changed")), "{v:#}");
    let diff = &v["diff"];
    assert_eq!(diff["key"], "id");
    assert_eq!(
        (&diff["added"], &diff["removed"], &diff["changed"]),
        (&json!(1), &json!(1), &json!(1)),
        "{diff:#}"
    );
    assert!(
        diff["examples"]
            .as_array()
            .expect("examples")
            .contains(&json!({
                "kind": "changed", "key": 2,
                "values": [{"column": "price", "before": 2.0, "after": 2.5}],
            })),
        "{diff:#}"
    );
    // Derived from the replayed parent: the change shows all the way down; from the
    // stored parent, the derivation alone is checked.
    let (code, v) = replay_json(&home, &config, "alice", &derived);
    assert_eq!((code, &v["outcome"]), (3, &json!("changed")), "{v:#}");
    assert_eq!(v["parents"][0]["outcome"], "changed");
    assert_eq!(v["parents"][0]["dataRef"], items.as_str());
    let out = replay(&home, &config, "alice", &derived, &["--stored-parents"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let human =
        String::from_utf8_lossy(&replay(&home, &config, "alice", &items, &[]).stdout).into_owned();
    assert!(
        human.contains("rows 4 → 4, matched by `id`: 1 added, 1 removed, 1 changed")
            && human.contains("~ id=2: price: 2.0 → 2.5"),
        "{human}"
    );

    // Unavailable: another principal's table (as an unknown one), no ref at all, a named
    // query whose SQL the operator changed, and a source that is gone.
    let (code, theirs) = replay_json(&home, &config, "bob", &items);
    let (code2, unknown) = replay_json(&home, &config, "bob", "data_AAAAAAAAAAAAAAAAAAAAAA");
    assert_eq!((code, code2), (4, 4));
    assert_eq!(theirs["outcome"], "unavailable");
    assert_eq!(
        theirs["reason"]
            .as_str()
            .expect("reason")
            .replace(&items, "data_AAAAAAAAAAAAAAAAAAAAAA"),
        unknown["reason"].as_str().expect("reason"),
    );
    let changed_sql = self::config(
        dir.path(),
        &db,
        "SELECT id, name, price FROM items WHERE price > :min_price",
    );
    let (code, v) = replay_json(&home, &changed_sql, "alice", &items);
    assert_eq!(code, 4, "{v:#}");
    assert!(
        v["reason"]
            .as_str()
            .expect("reason")
            .contains("not the SQL this table was read with"),
        "{v:#}"
    );
    let config = self::config(dir.path(), &db, ITEMS_SQL);
    std::fs::remove_file(&db).expect("remove the shop");
    let (code, v) = replay_json(&home, &config, "alice", &items);
    assert_eq!(code, 4, "{v:#}");
    assert_eq!(v["outcome"], "unavailable");
    let (code, v) = replay_json(&home, &config, "alice", &derived);
    assert_eq!(code, 4, "{v:#}");
    assert!(
        v["reason"]
            .as_str()
            .expect("reason")
            .starts_with("its parent `items` cannot be made again"),
        "{v:#}"
    );
    alice.cancel().await.ok();
}

/// A parent two inputs share is made again once; a lineage deeper than the limit is
/// refused as unavailable, never followed without end.
#[tokio::test(flavor = "multi_thread")]
async fn a_shared_parent_replays_once_and_a_deep_lineage_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let db = dir.path().join("shop.sqlite");
    shop(&db);
    let config = config(dir.path(), &db, ITEMS_SQL);
    let alice = client(&home, &config, "alice").await;
    let items = made(
        &call(&alice, "fetch_items", json!({"min_price": 1.0})).await,
        "/dataRef",
    );
    let joined = made(
        &call(
            &alice,
            "run_sql",
            json!({"sql": "SELECT a.id, b.name FROM a JOIN b ON a.id = b.id",
                   "inputs": {"a": items, "b": items}}),
        )
        .await,
        "/dataRef",
    );
    let (code, v) = replay_json(&home, &config, "alice", &joined);
    assert_eq!(code, 0, "{v}");
    let parents = v["parents"].as_array().expect("parents");
    assert_eq!(parents.len(), 2, "{v}");
    assert_eq!(
        parents[0]["replayedAs"], parents[1]["replayedAs"],
        "one replay of the shared parent: {v}"
    );
    // A chain one table deeper than the limit.
    let mut last = items;
    for _ in 0..=dataref_builtins::rederive::MAX_REPLAY_DEPTH {
        last = made(
            &call(
                &alice,
                "run_sql",
                json!({"sql": "SELECT * FROM t", "inputs": {"t": last}}),
            )
            .await,
            "/dataRef",
        );
    }
    // (Read as text: the JSON nests each parent's replay, past a parser's default depth.)
    let out = replay(&home, &config, "alice", &last, &["--json"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(4), "{said}");
    assert!(
        said.contains("its lineage is more than 64 tables deep"),
        "{said}"
    );
    // The stored parents need no walk: the last derivation alone is checked.
    let out = replay(
        &home,
        &config,
        "alice",
        &last,
        &["--json", "--stored-parents"],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
