//! The MySQL producer against a real MariaDB server (Debian's `mariadb-server`, started
//! per test): each principal as its own database user, the attacks a principal's SQL
//! would try on another's rows, faithful types, limits and cancellation.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Decimal128Type, DurationMicrosecondType, Float32Type, Float64Type, Int8Type,
    Int16Type, Int32Type, Int64Type, TimestampMicrosecondType, UInt8Type, UInt64Type,
};
use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType, TimeUnit};
use dataref_config::{SourceConfig, SourceKind};
use dataref_protocol::Principal;
use dataref_sources::Sources;
use dataref_sources::mysql::{self, Login, MysqlSource};
use dataref_sources::{ConnectProblem, FetchRequest, Fetched, ParamValue, SourceError, SqlPolicy};
use dataref_store::{ArtifactStore, Lineage, LocalStore, StoreLimits, SystemClock};
use dataref_test_support::TestMariadb;
use tempfile::TempDir;

const SETUP: &str = r#"
CREATE DATABASE shop;
CREATE TABLE shop.orders_eu (id INT PRIMARY KEY, amount DECIMAL(12,2));
CREATE TABLE shop.orders_us (id INT PRIMARY KEY, amount DECIMAL(12,2));
INSERT INTO shop.orders_eu VALUES (1, 10.50), (2, 20.25), (3, 30.00);
INSERT INTO shop.orders_us VALUES (10, 999.99), (11, 888.88);
CREATE TABLE shop.everything (
  ti TINYINT, tiu TINYINT UNSIGNED, si SMALLINT, mi MEDIUMINT, i INT, iu INT UNSIGNED,
  bi BIGINT, biu BIGINT UNSIGNED, f FLOAT, d DOUBLE, dec12 DECIMAL(12,2),
  dec50 DECIMAL(50,10), dt DATE, dtm DATETIME(6), ts TIMESTAMP(6) NULL DEFAULT NULL,
  tm TIME(3), y YEAR, b1 BIT(1), b12 BIT(12), j JSON, vc VARCHAR(20), tx TEXT,
  e ENUM('sad','happy'), vb VARBINARY(8), bl BLOB
);
SET time_zone = '+02:00';
INSERT INTO shop.everything VALUES (
  -128, 255, -32768, -8388608, -2147483648, 4294967295,
  -9223372036854775808, 18446744073709551615, 1.5, 2.25, -1234567890.12,
  '1234567890123456789012345678901234567890.0123456789', '2024-02-29',
  '2025-03-01 12:34:56.789012', '2025-03-01 12:00:00.5', '-838:59:58.5', 2025, b'1',
  b'101010101010', '{"a": [1, 2]}', 'héllo', 'long text', 'happy', x'DEADBEEF', x'00FF'
);
INSERT INTO shop.everything () VALUES ();
CREATE TABLE shop.zero (id INT, d DATE);
INSERT INTO shop.zero VALUES (1, '2025-01-01'), (2, '0000-00-00');
CREATE TABLE shop.big (n INT);
INSERT INTO shop.big SELECT seq FROM shop.seq_1_to_5000;

CREATE USER dataref IDENTIFIED BY 'dataref-pw';
GRANT SELECT ON shop.* TO dataref;
CREATE USER eu IDENTIFIED BY 'eu-pw';
GRANT SELECT ON shop.orders_eu TO eu;
GRANT SELECT ON shop.everything TO eu;
GRANT SELECT ON shop.zero TO eu;
GRANT SELECT ON shop.big TO eu;
CREATE USER us IDENTIFIED BY 'us-pw';
GRANT SELECT ON shop.orders_us TO us;

-- A definer view and procedure that read both regions, granted to `us` only.
CREATE SQL SECURITY DEFINER VIEW shop.all_orders AS
  SELECT id, amount FROM shop.orders_eu UNION ALL SELECT id, amount FROM shop.orders_us;
GRANT SELECT ON shop.all_orders TO us;
CREATE PROCEDURE shop.every_order() SQL SECURITY DEFINER
  SELECT id, amount FROM shop.orders_us;
GRANT EXECUTE ON PROCEDURE shop.every_order TO eu;

-- A user that can read files through its default role, and one that holds FILE itself.
CREATE ROLE filer;
GRANT FILE ON *.* TO filer;
CREATE USER sneaky IDENTIFIED BY 'sneaky-pw';
GRANT SELECT ON shop.orders_eu TO sneaky;
GRANT filer TO sneaky;
SET DEFAULT ROLE filer FOR sneaky;
CREATE USER reader IDENTIFIED BY 'reader-pw';
GRANT SELECT ON *.* TO reader;
CREATE USER watcher IDENTIFIED BY 'watcher-pw';
GRANT PROCESS ON *.* TO watcher;
GRANT SELECT ON shop.orders_eu TO watcher;
"#;

struct My {
    server: TestMariadb,
    _dir: TempDir,
    store: Arc<LocalStore>,
    source: SourceConfig,
    mysql: MysqlSource,
}

fn login(principal: &str, user: Option<(&str, &str)>) -> Login {
    Login {
        principal: principal.into(),
        user: user.map(|(u, _)| u.to_owned()),
        password: user.map(|(_, p)| p.to_owned()),
    }
}

impl My {
    fn start() -> Self {
        let server = TestMariadb::start().unwrap();
        server.execute(SETUP).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(
            LocalStore::open(
                &dir.path().join("home"),
                StoreLimits::default(),
                Arc::new(SystemClock),
            )
            .unwrap(),
        );
        let url = server.url("dataref", "${SHOP_PW}", "shop");
        let source = SourceConfig {
            name: "shop".into(),
            kind: SourceKind::Mysql {
                url: url.clone(),
                allow_shared_login: false,
            },
            sample_rows: 5,
            max_value_chars: 80,
            max_rows: 1_000_000,
            timeout: Duration::from_secs(30),
            allow_sql: true,
        };
        let mysql = MysqlSource::with_env(
            "shop",
            &url,
            Arc::new(|k| (k == "SHOP_PW").then(|| "dataref-pw".to_owned())),
        );
        Self {
            server,
            _dir: dir,
            store,
            source,
            mysql,
        }
    }

    async fn run_with(
        &self,
        who: &Login,
        sql: &str,
        params: Vec<(String, ParamValue)>,
        policy: SqlPolicy,
        is_cancelled: &(dyn Fn() -> bool + Sync),
    ) -> Result<Fetched, SourceError> {
        let owner = Principal::new(&who.principal).unwrap();
        let declared = BTreeMap::new();
        let req = FetchRequest {
            source: &self.source,
            sql,
            params,
            declared: &declared,
            policy,
        };
        mysql::fetch(
            &self.mysql,
            who,
            &req,
            self.store.as_ref(),
            &owner,
            Lineage::new("test", serde_json::json!({ "sql": sql })),
            &|_| {},
            is_cancelled,
        )
        .await
    }

    async fn query(&self, who: &Login, sql: &str) -> Result<Fetched, SourceError> {
        self.run_with(who, sql, Vec::new(), SqlPolicy::Generic, &|| false)
            .await
    }

    fn batch(&self, who: &Login, f: &Fetched) -> RecordBatch {
        let owner = Principal::new(&who.principal).unwrap();
        let table = self.store.open_table(&owner, &f.meta.data_ref).unwrap();
        assert_eq!(table.batches.len(), 1, "expected one batch");
        table.batches[0].clone()
    }

    fn artifacts(&self, who: &Login) -> u64 {
        let owner = Principal::new(&who.principal).unwrap();
        self.store.list(&owner, 100).unwrap().1
    }

    /// Statements of other sessions still running (as root sees them).
    fn running(&self, like: &str) -> String {
        self.server
            .query(&format!(
                "SELECT id, info FROM information_schema.processlist \
                 WHERE info LIKE '%{like}%' AND info NOT LIKE '%processlist%'"
            ))
            .unwrap()
    }
}

fn eu() -> Login {
    login("eu_analyst", Some(("eu", "eu-pw")))
}

fn us() -> Login {
    login("us_analyst", Some(("us", "us-pw")))
}

fn ints(b: &RecordBatch, col: &str) -> Vec<i32> {
    let a = b.column_by_name(col).unwrap().as_primitive::<Int32Type>();
    a.values().to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_principal_reads_only_what_its_own_user_is_granted() {
    let my = My::start();
    let f = my
        .query(&eu(), "SELECT id FROM orders_eu ORDER BY id")
        .await
        .unwrap();
    assert_eq!(ints(&my.batch(&eu(), &f), "id"), [1, 2, 3]);

    let e = my
        .query(&eu(), "SELECT * FROM orders_us")
        .await
        .unwrap_err();
    assert!(
        matches!(&e, SourceError::MysqlDenied { user, .. } if user == "eu"),
        "{e:?}"
    );
    assert!(e.to_string().contains("MySQL user `eu`"), "{e}");
    // The definer view reads both regions; it is granted to `us` only.
    let e = my
        .query(&eu(), "SELECT * FROM all_orders")
        .await
        .unwrap_err();
    assert!(matches!(e, SourceError::MysqlDenied { .. }), "{e:?}");
    let f = my.query(&us(), "SELECT id FROM all_orders").await.unwrap();
    assert_eq!(f.meta.rows, 5);

    // The catalog shows a user only what it may read.
    let f = my
        .query(
            &eu(),
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'shop' \
             ORDER BY 1",
        )
        .await
        .unwrap();
    let b = my.batch(&eu(), &f);
    let names = b.column(0).as_string::<i32>();
    let names: Vec<&str> = (0..names.len()).map(|i| names.value(i)).collect();
    assert_eq!(names, ["big", "everything", "orders_eu", "zero"]);
    // …and no other session's statement.
    let f = my
        .query(&eu(), "SELECT user FROM information_schema.processlist")
        .await
        .unwrap();
    let b = my.batch(&eu(), &f);
    let users = b.column(0).as_string::<i32>();
    assert!((0..users.len()).all(|i| users.value(i) == "eu"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_sql_cannot_read_files_write_or_become_someone_else() {
    let my = My::start();
    let eu = eu();
    // Without FILE, LOAD_FILE reads nothing.
    let f = my
        .query(&eu, "SELECT LOAD_FILE('/etc/passwd') AS f")
        .await
        .unwrap();
    assert_eq!(my.batch(&eu, &f).column(0).null_count(), 1);

    let out = my.server.dir().join("leak.txt");
    let refused = [
        format!("SELECT * FROM orders_eu INTO OUTFILE '{}'", out.display()),
        "SET ROLE filer".to_owned(),
        "CALL every_order()".to_owned(),
        "UPDATE orders_eu SET amount = 0".to_owned(),
        "DELETE FROM orders_eu".to_owned(),
        "CREATE SQL SECURITY DEFINER VIEW v AS SELECT * FROM orders_eu".to_owned(),
        "DO SLEEP(0)".to_owned(),
        "SET SESSION max_statement_time = 0".to_owned(),
    ];
    for sql in &refused {
        let e = my.query(&eu, sql).await.unwrap_err();
        assert!(
            matches!(
                e,
                SourceError::NotAllowed { .. }
                    | SourceError::MysqlDenied { .. }
                    | SourceError::Mysql { .. }
            ),
            "{sql}: {e:?}"
        );
    }
    assert!(!out.exists(), "INTO OUTFILE wrote a file");
    // Two statements are one syntax error, never two statements.
    let e = my
        .query(&eu, "SELECT 1; DROP TABLE orders_eu")
        .await
        .unwrap_err();
    assert!(matches!(e, SourceError::Mysql { code: 1064, .. }), "{e:?}");
    assert_eq!(
        my.server
            .query("SELECT count(*) FROM shop.orders_eu")
            .unwrap()
            .trim(),
        "3"
    );
    // A locking read takes locks: the read-only transaction refuses it too.
    let e = my
        .query(&eu, "SELECT id FROM orders_eu FOR UPDATE")
        .await
        .unwrap_err();
    assert!(matches!(e, SourceError::NotAllowed { .. }), "{e:?}");
    assert_eq!(my.artifacts(&eu), 1, "refused calls stored nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_that_holds_more_than_reading_is_refused_for_model_sql() {
    let my = My::start();
    // FILE through a default role: invisible in USER_PRIVILEGES, still refused.
    let sneaky = login("sneaky", Some(("sneaky", "sneaky-pw")));
    let e = my
        .query(&sneaky, "SELECT LOAD_FILE('/etc/passwd')")
        .await
        .unwrap_err();
    match &e {
        SourceError::Connect {
            problem: ConnectProblem::MysqlPrivileges { user, .. },
            message,
            ..
        } => {
            assert_eq!(user, "sneaky");
            assert!(message.contains("FILE"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(e.hint().unwrap().contains("REVOKE"));
    let watcher = login("watcher", Some(("watcher", "watcher-pw")));
    let e = my
        .query(&watcher, "SELECT info FROM information_schema.processlist")
        .await
        .unwrap_err();
    assert!(e.to_string().contains("PROCESS"), "{e}");
    // A login that may read every table (and so the `mysql` schema, where it could see
    // other accounts' privileges) only reads: its own privileges are what count.
    let reader = login("reader", Some(("reader", "reader-pw")));
    let f = my.query(&reader, "SELECT id FROM orders_us").await.unwrap();
    assert_eq!(f.meta.rows, 2);
    // Operator SQL (a named query) runs on any login.
    let f = my
        .run_with(
            &sneaky,
            "SELECT id FROM orders_eu",
            Vec::new(),
            SqlPolicy::Configured,
            &|| false,
        )
        .await
        .unwrap();
    assert_eq!(f.meta.rows, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_type_maps_faithfully_with_nulls() {
    let my = My::start();
    let eu = eu();
    let f = my
        .query(&eu, "SELECT * FROM everything ORDER BY ti IS NULL")
        .await
        .unwrap();
    let b = my.batch(&eu, &f);
    let ty = |c: &str| b.schema().field_with_name(c).unwrap().data_type().clone();
    assert_eq!(ty("ti"), DataType::Int8);
    assert_eq!(ty("tiu"), DataType::UInt8);
    assert_eq!(ty("si"), DataType::Int16);
    assert_eq!(ty("mi"), DataType::Int32);
    assert_eq!(ty("iu"), DataType::UInt32);
    assert_eq!(ty("biu"), DataType::UInt64);
    assert_eq!(ty("dec12"), DataType::Decimal128(12, 2));
    assert_eq!(ty("dec50"), DataType::Utf8);
    assert_eq!(ty("dtm"), DataType::Timestamp(TimeUnit::Microsecond, None));
    assert_eq!(
        ty("ts"),
        DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
    );
    assert_eq!(ty("tm"), DataType::Duration(TimeUnit::Microsecond));
    assert_eq!(ty("b1"), DataType::Boolean);
    assert_eq!(ty("b12"), DataType::UInt64);
    assert_eq!(ty("j"), DataType::Utf8);
    assert_eq!(ty("vb"), DataType::Binary);
    assert_eq!(ty("bl"), DataType::Binary);
    assert!(
        f.notes.iter().any(|n| n.contains("`dec50`")),
        "{:?}",
        f.notes
    );

    let col = |c: &str| b.column_by_name(c).unwrap().clone();
    assert_eq!(col("ti").as_primitive::<Int8Type>().value(0), -128);
    assert_eq!(col("tiu").as_primitive::<UInt8Type>().value(0), 255);
    assert_eq!(col("si").as_primitive::<Int16Type>().value(0), -32768);
    assert_eq!(col("bi").as_primitive::<Int64Type>().value(0), i64::MIN);
    assert_eq!(col("biu").as_primitive::<UInt64Type>().value(0), u64::MAX);
    assert_eq!(col("f").as_primitive::<Float32Type>().value(0), 1.5);
    assert_eq!(col("d").as_primitive::<Float64Type>().value(0), 2.25);
    assert_eq!(
        col("dec12").as_primitive::<Decimal128Type>().value(0),
        -123_456_789_012
    );
    assert_eq!(
        col("dec50").as_string::<i32>().value(0),
        "1234567890123456789012345678901234567890.0123456789"
    );
    // 2024-02-29 is day 19782.
    assert_eq!(col("dt").as_primitive::<Date32Type>().value(0), 19_782);
    // DATETIME is the wall clock as stored: 2025-03-01 12:34:56.789012.
    assert_eq!(
        col("dtm")
            .as_primitive::<TimestampMicrosecondType>()
            .value(0),
        1_740_832_496_789_012
    );
    // TIMESTAMP was written at +02:00 as 12:00:00.5: 10:00:00.5 UTC.
    assert_eq!(
        col("ts")
            .as_primitive::<TimestampMicrosecondType>()
            .value(0),
        1_740_823_200_500_000
    );
    assert_eq!(
        col("tm").as_primitive::<DurationMicrosecondType>().value(0),
        -(838 * 3600 + 59 * 60 + 58) * 1_000_000 - 500_000
    );
    assert_eq!(col("y").as_primitive::<Int16Type>().value(0), 2025);
    assert!(col("b1").as_boolean().value(0));
    assert_eq!(
        col("b12").as_primitive::<UInt64Type>().value(0),
        0b1010_1010_1010
    );
    assert_eq!(col("j").as_string::<i32>().value(0), r#"{"a": [1, 2]}"#);
    assert_eq!(col("vc").as_string::<i32>().value(0), "héllo");
    assert_eq!(col("e").as_string::<i32>().value(0), "happy");
    assert_eq!(
        col("vb").as_binary::<i32>().value(0),
        [0xde, 0xad, 0xbe, 0xef]
    );
    // The second row is all NULLs, in every column.
    for c in b.columns() {
        assert!(c.is_null(1), "{:?}", c.data_type());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_date_is_refused_naming_the_column_row_and_a_fix() {
    let my = My::start();
    let eu = eu();
    let e = my
        .query(&eu, "SELECT id, d FROM zero ORDER BY id")
        .await
        .unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("`d`") && text.contains("row 2") && text.contains("0000-00-00"),
        "{text}"
    );
    assert!(text.contains("NULLIF"), "{text}");
    assert_eq!(my.artifacts(&eu), 0, "nothing half-stored");
    let f = my
        .query(
            &eu,
            "SELECT id, NULLIF(d, '0000-00-00') AS d FROM zero ORDER BY id",
        )
        .await
        .unwrap();
    assert_eq!(my.batch(&eu, &f).column(1).null_count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_parameters_are_bound_never_spliced() {
    let my = My::start();
    let eu = eu();
    let f = my
        .run_with(
            &eu,
            "SELECT id FROM orders_eu WHERE amount >= :min AND id <> :skip AND ':min' = ':min' \
             OR id = :skip ORDER BY id",
            vec![
                ("min".into(), ParamValue::Real(20.0)),
                ("skip".into(), ParamValue::Integer(3)),
            ],
            SqlPolicy::Configured,
            &|| false,
        )
        .await
        .unwrap();
    assert_eq!(ints(&my.batch(&eu, &f), "id"), [2, 3]);
    // A value is a value: SQL in it is text.
    let f = my
        .run_with(
            &eu,
            "SELECT count(*) AS n FROM orders_eu WHERE CAST(id AS CHAR) = :v",
            vec![("v".into(), ParamValue::Text("1' OR '1'='1".into()))],
            SqlPolicy::Configured,
            &|| false,
        )
        .await
        .unwrap();
    let b = my.batch(&eu, &f);
    assert_eq!(b.column(0).as_primitive::<Int64Type>().value(0), 0);
    let e = my
        .run_with(
            &eu,
            "SELECT id FROM orders_eu WHERE id = :missing",
            Vec::new(),
            SqlPolicy::Configured,
            &|| false,
        )
        .await
        .unwrap_err();
    assert!(matches!(e, SourceError::BadParam { .. }), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_and_cancellation_stop_the_statement_on_the_server() {
    let mut my = My::start();
    let eu = eu();
    my.source.max_rows = 1_000;
    let e = my.query(&eu, "SELECT n FROM big").await.unwrap_err();
    assert!(
        matches!(e, SourceError::TooManyRows { max_rows: 1_000 }),
        "{e:?}"
    );

    my.source.timeout = Duration::from_millis(800);
    let started = Instant::now();
    let e = my.query(&eu, "SELECT SLEEP(30) AS s").await.unwrap_err();
    assert!(matches!(e, SourceError::Timeout { .. }), "{e:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );

    my.source.timeout = Duration::from_secs(60);
    let cancel = AtomicBool::new(false);
    let started = Instant::now();
    let is_cancelled = || cancel.load(Ordering::Relaxed);
    let run = my.run_with(
        &eu,
        "SELECT SLEEP(30) AS s",
        Vec::new(),
        SqlPolicy::Generic,
        &is_cancelled,
    );
    let flip = async {
        tokio::time::sleep(Duration::from_millis(400)).await;
        cancel.store(true, Ordering::Relaxed);
    };
    let (r, ()) = tokio::join!(run, flip);
    assert!(matches!(r, Err(SourceError::Cancelled)), "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    // The server stopped the statement (KILL QUERY), not only the client.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !my.running("SLEEP(30)").is_empty() {
        assert!(
            Instant::now() < deadline,
            "still running: {}",
            my.running("SLEEP(30)")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(my.artifacts(&eu), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sources_log_each_principal_in_as_its_own_user() {
    let my = My::start();
    let sources = Arc::new(
        Sources::default()
            .with_mysql(MysqlSource::with_env(
                "shop",
                &my.server.url("dataref", "dataref-pw", "shop"),
                Arc::new(|_| None),
            ))
            .with_mysql_user(Principal::new("eu_analyst").unwrap(), "eu", Some("eu-pw")),
    );
    let run = |who: &str, sql: &'static str| {
        let sources = sources.clone();
        let source = my.source.clone();
        let store = my.store.clone();
        let owner = Principal::new(who).unwrap();
        tokio::task::spawn_blocking(move || {
            let declared = BTreeMap::new();
            let req = FetchRequest {
                source: &source,
                sql,
                params: Vec::new(),
                declared: &declared,
                policy: SqlPolicy::Generic,
            };
            sources.fetch(
                &req,
                store.as_ref(),
                &owner,
                Lineage::new("test", serde_json::json!({})),
                &|_| {},
                &|| false,
            )
        })
    };
    let f = run("eu_analyst", "SELECT current_user() AS u")
        .await
        .unwrap();
    let f = f.unwrap();
    let owner = Principal::new("eu_analyst").unwrap();
    let t = my.store.open_table(&owner, &f.meta.data_ref).unwrap();
    assert_eq!(t.batches[0].column(0).as_string::<i32>().value(0), "eu@%");
    // A principal with no user of its own is refused, saying how to give it one.
    let e = run("stranger", "SELECT 1").await.unwrap().unwrap_err();
    assert!(
        matches!(&e, SourceError::Connect { problem: ConnectProblem::NoMysqlUser { principal }, .. } if principal == "stranger"),
        "{e:?}"
    );
    assert!(e.hint().unwrap().contains("mysql_user"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_logins_and_urls_say_what_to_check() {
    let my = My::start();
    let e = my
        .query(&login("eu_analyst", Some(("eu", "wrong"))), "SELECT 1")
        .await
        .unwrap_err();
    assert!(
        matches!(&e, SourceError::Connect { problem: ConnectProblem::MysqlLogin { user, .. }, .. } if user == "eu"),
        "{e:?}"
    );
    let unreachable =
        MysqlSource::with_env("shop", "mysql://u:p@127.0.0.1:1/shop", Arc::new(|_| None));
    let declared = BTreeMap::new();
    let req = FetchRequest {
        source: &my.source,
        sql: "SELECT 1",
        params: Vec::new(),
        declared: &declared,
        policy: SqlPolicy::Generic,
    };
    let owner = Principal::new("local").unwrap();
    let e = mysql::fetch(
        &unreachable,
        &login("local", None),
        &req,
        my.store.as_ref(),
        &owner,
        Lineage::new("test", serde_json::json!({})),
        &|_| {},
        &|| false,
    )
    .await
    .unwrap_err();
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
    let unset = MysqlSource::with_env(
        "shop",
        "mysql://u:${NOPE}@127.0.0.1/shop",
        Arc::new(|_| None),
    );
    let e = mysql::fetch(
        &unset,
        &login("local", None),
        &req,
        my.store.as_ref(),
        &owner,
        Lineage::new("test", serde_json::json!({})),
        &|_| {},
        &|| false,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&e, SourceError::Connect { problem: ConnectProblem::Env(n), .. } if n == "NOPE"),
        "{e:?}"
    );
}
