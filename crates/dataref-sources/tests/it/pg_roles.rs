//! The attacker's tests of the PostgreSQL role boundary: principal `us` (role
//! `us_analyst`) writes SQL for `query` and tries to read what only `eu_analyst` may read
//! (EU rows hidden by row-level security, the `salaries` table), to see or cancel
//! another principal's running statement, to outlive the source's timeout, and to leave
//! something in a pooled session for the next caller. Every call goes through
//! [`Sources::fetch`], as the tools do.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::cast::AsArray;
use arrow_array::types::Int32Type;
use arrow_array::{Array, RecordBatch};
use arrow_schema::DataType;
use dataref_config::{SourceConfig, SourceKind};
use dataref_protocol::Principal;
use dataref_sources::postgres::PgPool;
use dataref_sources::{ConnectProblem, FetchRequest, Fetched, SourceError, Sources, SqlPolicy};
use dataref_store::{ArtifactStore, Lineage, LocalStore, StoreLimits, SystemClock};
use dataref_test_support::TestPostgres;
use tempfile::TempDir;

const SETUP: &str = r#"
CREATE ROLE dataref_login LOGIN NOINHERIT;
CREATE ROLE eu_analyst LOGIN;
CREATE ROLE us_analyst LOGIN;
CREATE ROLE nosy LOGIN;
CREATE ROLE sleeper NOLOGIN;
GRANT eu_analyst, us_analyst, sleeper TO dataref_login;
GRANT eu_analyst TO nosy;

CREATE TABLE sales (id int, region text, note text);
INSERT INTO sales VALUES (1, 'EU', 'eu-secret-1'), (2, 'US', 'us-row'), (3, 'EU', 'eu-secret-3');
ALTER TABLE sales ENABLE ROW LEVEL SECURITY;
CREATE POLICY eu_rows ON sales FOR SELECT TO eu_analyst USING (region = 'EU');
CREATE POLICY us_rows ON sales FOR SELECT TO us_analyst USING (region = 'US');
GRANT SELECT ON sales TO eu_analyst, us_analyst;

CREATE TABLE salaries (name text, salary int);
INSERT INTO salaries VALUES ('ann-secret', 100);
GRANT SELECT ON salaries TO eu_analyst;
"#;

struct Pg {
    server: TestPostgres,
    _dir: TempDir,
    store: Arc<LocalStore>,
    source: SourceConfig,
    sources: Arc<Sources>,
}

impl Pg {
    async fn start(pool_size: usize) -> Self {
        Self::start_with(pool_size, |s| s).await
    }

    async fn start_with(pool_size: usize, roles: impl FnOnce(Sources) -> Sources) -> Self {
        let server = TestPostgres::start().unwrap();
        server.execute(SETUP).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(
            LocalStore::open(
                &dir.path().join("home"),
                StoreLimits::default(),
                Arc::new(SystemClock),
            )
            .unwrap(),
        );
        let url = server.conninfo("dataref_login");
        let source = SourceConfig {
            name: "warehouse".into(),
            kind: SourceKind::Postgres {
                url: url.clone(),
                pool_size,
                allow_sql_shared_roles: false,
            },
            sample_rows: 5,
            max_value_chars: 80,
            max_rows: 1_000,
            timeout: Duration::from_secs(30),
            allow_sql: true,
        };
        let p = |n: &str| Principal::new(n).unwrap();
        let sources = Sources::default()
            .with_pool(PgPool::new("warehouse", &url, pool_size))
            .with_role(p("eu"), "eu_analyst", None)
            .with_role(p("us"), "us_analyst", None);
        Self {
            server,
            _dir: dir,
            store,
            source,
            sources: Arc::new(roles(sources)),
        }
    }

    /// Runs `sql` for principal `who` through [`Sources::fetch`] on a blocking thread.
    async fn run(&self, who: &str, sql: &str, policy: SqlPolicy) -> Result<Fetched, SourceError> {
        let (sources, store, source) = (
            self.sources.clone(),
            self.store.clone(),
            self.source.clone(),
        );
        let (who, sql) = (who.to_owned(), sql.to_owned());
        tokio::task::spawn_blocking(move || {
            let declared = BTreeMap::new();
            let req = FetchRequest {
                source: &source,
                sql: &sql,
                params: Vec::new(),
                declared: &declared,
                policy,
            };
            sources.fetch(
                &req,
                store.as_ref(),
                &Principal::new(&who).unwrap(),
                Lineage::new("test", serde_json::json!({ "sql": sql })),
                &|_| {},
                &|| false,
            )
        })
        .await
        .unwrap()
    }

    async fn query(&self, who: &str, sql: &str) -> Result<Fetched, SourceError> {
        self.run(who, sql, SqlPolicy::Generic).await
    }

    fn batches(&self, who: &str, f: &Fetched) -> Vec<RecordBatch> {
        let owner = Principal::new(who).unwrap();
        self.store
            .open_table(&owner, &f.meta.data_ref)
            .unwrap()
            .batches
    }

    /// Every text cell of the result, joined.
    fn text(&self, who: &str, f: &Fetched) -> String {
        let mut out = String::new();
        for b in self.batches(who, f) {
            for col in b.columns() {
                if col.data_type() == &DataType::Utf8 {
                    let a = col.as_string::<i32>();
                    for i in 0..a.len() {
                        if a.is_valid(i) {
                            out.push_str(a.value(i));
                            out.push('\n');
                        }
                    }
                }
            }
        }
        out
    }

    /// The backend pid the call ran on (`SELECT pg_backend_pid() AS pid`).
    async fn pid(&self, who: &str) -> i32 {
        let f = self
            .query(who, "SELECT pg_backend_pid() AS pid")
            .await
            .unwrap();
        self.batches(who, &f)[0]
            .column(0)
            .as_primitive::<Int32Type>()
            .value(0)
    }

    /// Runs `sql` as `us` and fails if anything only `eu_analyst` may read came back.
    /// A refusal or an error is what the boundary should produce.
    async fn assert_no_leak(&self, sql: &str) {
        match self.query("us", sql).await {
            Err(_) => {}
            Ok(f) => {
                let text = self.text("us", &f);
                assert!(
                    !text.contains("secret"),
                    "`us` read what only `eu_analyst` may read with\n{sql}\n---\n{text}"
                );
            }
        }
        // The boundary holds afterwards too: `us` still sees only its own rows.
        let f = self
            .query(
                "us",
                "SELECT current_user::text AS r, session_user::text AS s, \
                 (SELECT string_agg(note, ',') FROM sales) AS notes",
            )
            .await
            .unwrap();
        assert_eq!(self.text("us", &f), "us_analyst\nus_analyst\nus-row\n");
    }
}

/// `set_config('role', …)` run from a string literal by `query_to_xml`, switching back to
/// the caller's role before the statement ends (so a `current_user` check afterwards sees
/// nothing): the form the issue reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_to_xml_switching_role_and_back() {
    let pg = Pg::start(1).await;
    pg.assert_no_leak(
        "SELECT query_to_xml('SELECT set_config(''role'', ''eu_analyst'', true)', true, false, '')::text AS a, \
         query_to_xml('SELECT name FROM salaries', true, false, '')::text AS b, \
         query_to_xml('SELECT string_agg(note, '','') AS n FROM sales', true, false, '')::text AS c, \
         query_to_xml('SELECT set_config(''role'', ''us_analyst'', true)', true, false, '')::text AS d",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_to_xml_and_xmlschema_reads_as_another_role() {
    let pg = Pg::start(1).await;
    pg.assert_no_leak(
        "SELECT query_to_xml('SELECT set_config(''role'', ''eu_analyst'', true)', true, false, '')::text AS a, \
         query_to_xml_and_xmlschema('SELECT name FROM salaries', true, false, '')::text AS b, \
         query_to_xml('SELECT set_config(''role'', ''us_analyst'', true)', true, false, '')::text AS c",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_to_xml_reads_as_another_role() {
    let pg = Pg::start(1).await;
    pg.assert_no_leak(
        "SELECT query_to_xml('SELECT set_config(''role'', ''eu_analyst'', true)', true, false, '')::text AS a, \
         table_to_xml('salaries', true, false, '')::text AS b, \
         table_to_xml('sales', true, false, '')::text AS c, \
         query_to_xml('SELECT set_config(''role'', ''us_analyst'', true)', true, false, '')::text AS d",
    )
    .await;
}

/// A cursor declared (from a string) while the role is switched, read by `cursor_to_xml`.
/// (The server refuses `DECLARE` inside `query_to_xml`, a non-volatile function; the case
/// stays so that a way to open one would be caught.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursor_to_xml_reads_as_another_role() {
    let pg = Pg::start(1).await;
    pg.assert_no_leak(
        "SELECT query_to_xml('SELECT set_config(''role'', ''eu_analyst'', true)', true, false, '')::text AS a, \
         query_to_xml('DECLARE c CURSOR FOR SELECT name FROM salaries', true, false, '')::text AS b, \
         cursor_to_xml('c'::refcursor, 10, true, false, '')::text AS c, \
         query_to_xml('SELECT set_config(''role'', ''us_analyst'', true)', true, false, '')::text AS d",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dollar_quoted_set_config() {
    let pg = Pg::start(1).await;
    pg.assert_no_leak(
        "SELECT query_to_xml($q$SELECT set_config('role', 'eu_analyst', true)$q$, true, false, '')::text AS a, \
         query_to_xml($$SELECT name FROM salaries$$, true, false, '')::text AS b, \
         query_to_xml($q$SELECT set_config('role', 'us_analyst', true)$q$, true, false, '')::text AS c",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_config_assembled_by_format() {
    let pg = Pg::start(1).await;
    pg.assert_no_leak(
        "SELECT query_to_xml(format('SELECT %s(%L, %L, true)', 'set' || '_config', 'role', 'eu_analyst'), true, false, '')::text AS a, \
         query_to_xml('SELECT name FROM salaries', true, false, '')::text AS b, \
         query_to_xml(format('SELECT %s(%L, %L, true)', 'set' || '_config', 'role', 'us_analyst'), true, false, '')::text AS c",
    )
    .await;
}

/// PostgreSQL ends a `--` comment at `\r`; a scanner that waits for `\n` reads the call
/// after it as comment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn line_comment_ended_by_carriage_return() {
    let pg = Pg::start(1).await;
    pg.assert_no_leak(
        "SELECT 1 AS x --\r, set_config('role', 'eu_analyst', true) AS a, \
         query_to_xml('SELECT name FROM salaries', true, false, '')::text AS b, \
         set_config('role', 'us_analyst', true) AS c",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_comments_inside_the_call() {
    let pg = Pg::start(1).await;
    pg.assert_no_leak(
        "SELECT query_to_xml('SELECT set_config/* x */(''role'', ''eu_analyst'', true)', true, false, '')::text AS a, \
         set_config /* the call */ ('role', 'eu_analyst', true) AS a2, \
         query_to_xml('SELECT name FROM salaries', true, false, '')::text AS b, \
         query_to_xml('SELECT set_config(''role'', ''us_analyst'', true) -- back', true, false, '')::text AS c",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_variants_of_set_config() {
    let pg = Pg::start(1).await;
    pg.assert_no_leak(
        "SELECT query_to_xml('SELECT Set_Config(''role'', ''eu_analyst'', TRUE)', true, false, '')::text AS a, \
         QUERY_TO_XML('SELECT name FROM salaries', TRUE, FALSE, '')::text AS b, \
         query_to_xml('SELECT PG_CATALOG.SET_CONFIG(''ROLE'', ''us_analyst'', TRUE)', true, false, '')::text AS c",
    )
    .await;
}

/// `U&"set\005fconfig"` is `set_config`, spelled with a Unicode escape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unicode_escaped_identifier() {
    let pg = Pg::start(1).await;
    pg.assert_no_leak(
        "SELECT U&\"set\\005fconfig\"('role', 'eu_analyst', true) AS a, \
         query_to_xml('SELECT name FROM salaries', true, false, '')::text AS b, \
         U&\"set\\005fconfig\"('role', 'us_analyst', true) AS c",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unicode_escaped_identifier_with_uescape() {
    let pg = Pg::start(1).await;
    pg.assert_no_leak(
        "SELECT U&\"set!005fconfig\" UESCAPE '!'('role', 'eu_analyst', true) AS a, \
         query_to_xml('SELECT name FROM salaries', true, false, '')::text AS b, \
         U&\"set!005fconfig\" UESCAPE '!'('role', 'us_analyst', true) AS c",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unicode_escaped_identifier_qualified_by_pg_catalog() {
    let pg = Pg::start(1).await;
    pg.assert_no_leak(
        "SELECT pg_catalog.U&\"set\\005fconfig\"('role', 'eu_analyst', true) AS a, \
         query_to_xml('SELECT name FROM salaries', true, false, '')::text AS b, \
         pg_catalog.U&\"set\\005fconfig\"('role', 'us_analyst', true) AS c",
    )
    .await;
}

/// Two `set_config` calls in one statement, both hidden from the scanner: into the other
/// role for a read, back before the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_config_twice_in_one_statement() {
    let pg = Pg::start(1).await;
    pg.assert_no_leak(
        "SELECT query_to_xml('SELECT set_config(''role'', ''eu_analyst'', true), set_config(''role'', ''eu_analyst'', true)', true, false, '')::text AS a, \
         query_to_xml('SELECT string_agg(note, '','') FROM sales', true, false, '')::text AS b, \
         query_to_xml('SELECT set_config(''role'', ''us_analyst'', true)', true, false, '')::text AS c",
    )
    .await;
}

/// `SET ROLE` from the string of `query_to_xml` (the utility statement runs via SPI).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_role_run_from_a_string() {
    let pg = Pg::start(1).await;
    pg.assert_no_leak(
        "SELECT query_to_xml('SET LOCAL ROLE eu_analyst', true, false, '')::text AS a, \
         query_to_xml('SELECT name FROM salaries', true, false, '')::text AS b, \
         query_to_xml('SET LOCAL ROLE us_analyst', true, false, '')::text AS c",
    )
    .await;
}

/// Role `none` was the shared login role, from which one principal read another's running
/// SQL in `pg_stat_activity` and cancelled it. The caller's own login sees neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn role_none_cannot_see_or_cancel_another_principals_statement() {
    let pg = Arc::new(Pg::start(2).await);
    let victim = {
        let pg = pg.clone();
        tokio::spawn(async move {
            pg.query(
                "eu",
                "SELECT pg_sleep(4) IS NULL AS slept, 'victim-marker' AS private_text",
            )
            .await
        })
    };
    // Wait until the victim's statement runs (seen by the superuser).
    let admin = pg.server.client().await.unwrap();
    let started = Instant::now();
    loop {
        let n: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' \
                 AND query LIKE '%victim' || '-marker%'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if n > 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "victim never ran"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let look = "SELECT query_to_xml('SELECT set_config(''role'', ''none'', true)', true, false, '')::text AS a, \
         query_to_xml('SELECT current_user AS now_running_as, query FROM pg_stat_activity \
                       WHERE pid <> pg_backend_pid() AND query LIKE ''%victim'' || ''-marker%''', \
                      true, false, '')::text AS seen";
    if let Ok(f) = pg.query("us", look).await {
        let text = pg.text("us", &f);
        assert!(
            !text.contains("pg_sleep"),
            "`us` read eu's running SQL:\n{text}"
        );
    }
    let cancel = "SELECT query_to_xml('SELECT set_config(''role'', ''none'', true)', true, false, '')::text AS a, \
         query_to_xml('SELECT pg_cancel_backend(pid) AS c FROM pg_stat_activity \
                       WHERE pid <> pg_backend_pid() AND usename IS NOT NULL \
                       AND backend_type = ''client backend''', true, false, '')::text AS cancelled";
    let _ = pg.query("us", cancel).await;
    let plain = "SELECT bool_or(pg_cancel_backend(pid)) IS TRUE AS c FROM pg_stat_activity \
                 WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'";
    let _ = pg.query("us", plain).await;
    let outcome = victim.await.unwrap();
    assert!(
        outcome.is_ok(),
        "eu's statement was cancelled by us: {outcome:?}"
    );
}

/// A session-level role change (and settings) tried by one caller: the next caller of
/// the same pooled connection, and every later call, still run as their own role with
/// the source's settings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_change_does_not_survive_into_the_next_caller() {
    let pg = Pg::start(1).await;
    let _ = pg
        .query(
            "us",
            "SELECT query_to_xml('SELECT set_config(''role'', ''eu_analyst'', false), \
             set_config(''search_path'', ''nowhere'', false), \
             set_config(''statement_timeout'', ''0'', false)', true, false, '')::text AS a",
        )
        .await;
    let probe = "SELECT current_user::text AS r, session_user::text AS s, \
                 current_setting('search_path') AS p, current_setting('statement_timeout') AS t";
    let first = pg.pid("us").await;
    let f = pg.query("us", probe).await.unwrap();
    assert_eq!(
        pg.text("us", &f),
        "us_analyst\nus_analyst\n\"$user\", public\n30s\n"
    );
    assert_eq!(pg.pid("us").await, first, "a clean connection is reused");
    let f = pg.query("eu", probe).await.unwrap();
    assert_eq!(
        pg.text("eu", &f),
        "eu_analyst\neu_analyst\n\"$user\", public\n30s\n"
    );
    // Named queries (the shared login) after it: the caller's role.
    let f = pg
        .run(
            "us",
            "SELECT current_user::text AS r, (SELECT string_agg(note, ',') FROM sales) AS n",
            SqlPolicy::Configured,
        )
        .await
        .unwrap();
    assert_eq!(pg.text("us", &f), "us_analyst\nus-row\n");
}

/// A session-level advisory lock survives ROLLBACK; it must not survive the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_advisory_lock_does_not_outlive_the_call() {
    let pg = Pg::start(1).await;
    let f = pg
        .query("us", "SELECT pg_advisory_lock(4242) IS NULL AS locked")
        .await
        .unwrap();
    assert_eq!(f.meta.rows, 1);
    let admin = pg.server.client().await.unwrap();
    let held: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(held, 0, "an idle pooled connection still holds the lock");
    let f = pg
        .query("eu", "SELECT pg_try_advisory_lock(4242)::text AS got")
        .await
        .unwrap();
    assert_eq!(pg.text("eu", &f), "true\n");
}

/// `SET statement_timeout` / `set_config('statement_timeout', '0', …)` from inside the
/// statement, then a long sleep: the source's timeout still stops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_cannot_raise_its_own_timeout() {
    let mut pg = Pg::start(1).await;
    pg.source.timeout = Duration::from_millis(500);
    for (sql, must_time_out) in [
        (
            "SELECT query_to_xml('SELECT set_config(''statement_timeout'', ''0'', false)', true, false, '')::text AS a, \
             pg_sleep(20) IS NULL AS slept",
            true,
        ),
        (
            "SELECT query_to_xml('SELECT set_config(''statement_timeout'', ''0'', true)', true, false, '')::text AS a, \
             g, pg_sleep(CASE WHEN g > 1 THEN 20 ELSE 0 END) IS NULL AS slept FROM generate_series(1, 3) g",
            true,
        ),
        // Refused by the scanner now; before, it ran.
        (
            "SELECT U&\"set\\005fconfig\"('statement_timeout', '0', false) AS a, pg_sleep(20) IS NULL AS slept",
            false,
        ),
        // `SET` cannot run from the string of a non-volatile function; it must still fail.
        (
            "SELECT query_to_xml('SET statement_timeout = 0', true, false, '')::text AS a, \
             pg_sleep(20) IS NULL AS slept",
            false,
        ),
    ] {
        let started = Instant::now();
        let e = pg.query("us", sql).await.unwrap_err();
        if must_time_out {
            assert!(matches!(e, SourceError::Timeout { .. }), "{sql}: {e:?}");
        }
        // Far below the 20 s sleep: the statement was stopped, not waited for.
        assert!(started.elapsed() < Duration::from_secs(15), "{sql}");
    }
    // Nothing of ours still runs on the server.
    let admin = pg.server.client().await.unwrap();
    let started = Instant::now();
    loop {
        let n: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(' || '20%' \
                 AND state = 'active'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if n == 0 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "still running");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// After a timeout or a refused result the connection is closed, never reused: a late
/// cancel request or anything left in the session cannot reach the next call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_timed_out_or_was_refused_is_closed() {
    let mut pg = Pg::start(1).await;
    let first = pg.pid("us").await;
    assert_eq!(pg.pid("us").await, first, "a clean connection is reused");
    pg.source.max_rows = 2;
    let e = pg
        .query("us", "SELECT g FROM generate_series(1, 10) g")
        .await
        .unwrap_err();
    assert!(matches!(e, SourceError::TooManyRows { .. }), "{e:?}");
    let second = pg.pid("us").await;
    assert_ne!(second, first, "reused after a refused result");
    pg.source.timeout = Duration::from_millis(300);
    let e = pg
        .query("us", "SELECT pg_sleep(10) IS NULL AS slept")
        .await
        .unwrap_err();
    assert!(matches!(e, SourceError::Timeout { .. }), "{e:?}");
    pg.source.timeout = Duration::from_secs(30);
    let third = pg.pid("us").await;
    assert_ne!(third, second, "reused after a timeout");
    let e = pg.query("us", "SELECT 1/0 AS boom").await.unwrap_err();
    assert!(matches!(e, SourceError::Postgres { .. }), "{e:?}");
    assert_ne!(pg.pid("us").await, third, "reused after an error");
}

/// Model SQL logs in as the caller's role: a login role that can become another
/// principal's role is refused before any statement runs, naming what it can reach.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_role_that_reaches_another_principals_role_is_refused() {
    let pg = Pg::start_with(1, |s| {
        s.with_role(Principal::new("nosy").unwrap(), "nosy", None)
    })
    .await;
    let e = pg.query("nosy", "SELECT 1 AS one").await.unwrap_err();
    let SourceError::Connect {
        problem: ConnectProblem::SharedRole { principal, role },
        message,
        ..
    } = &e
    else {
        panic!("{e:?}");
    };
    assert_eq!((principal.as_str(), role.as_str()), ("nosy", "nosy"));
    assert!(message.contains("`eu_analyst`"), "{message}");
    assert!(
        e.hint().unwrap().contains("allow_sql_shared_roles"),
        "{:?}",
        e.hint()
    );
    // A superuser can become anyone.
    let pg = Pg::start_with(1, |s| {
        s.with_role(Principal::new("boss").unwrap(), "postgres", None)
    })
    .await;
    let e = pg.query("boss", "SELECT 1 AS one").await.unwrap_err();
    assert!(
        matches!(
            &e,
            SourceError::Connect {
                problem: ConnectProblem::SharedRole { .. },
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("superuser"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_that_cannot_log_in_says_what_to_configure() {
    let pg = Pg::start_with(1, |s| {
        s.with_role(Principal::new("sleepy").unwrap(), "sleeper", None)
    })
    .await;
    let e = pg.query("sleepy", "SELECT 1 AS one").await.unwrap_err();
    assert!(
        matches!(
            &e,
            SourceError::Connect {
                problem: ConnectProblem::RoleLogin { .. },
                ..
            }
        ),
        "{e:?}"
    );
    let hint = e.hint().unwrap();
    assert!(
        hint.contains("ALTER ROLE \"sleeper\" LOGIN") && hint.contains("pg_password"),
        "{hint}"
    );
    // Its named queries still run on the shared login.
    let f = pg
        .run(
            "sleepy",
            "SELECT current_user::text AS r",
            SqlPolicy::Configured,
        )
        .await
        .unwrap();
    assert_eq!(pg.text("sleepy", &f), "sleeper\n");
    // An unset `${NAME}` in `pg_password` is named.
    let pg = Pg::start_with(1, |s| {
        s.with_role(
            Principal::new("pw").unwrap(),
            "us_analyst",
            Some("${DATAREF_TEST_SURELY_UNSET}"),
        )
    })
    .await;
    let e = pg.query("pw", "SELECT 1 AS one").await.unwrap_err();
    assert!(
        matches!(&e, SourceError::Connect { problem: ConnectProblem::Env(v), .. } if v == "DATAREF_TEST_SURELY_UNSET"),
        "{e:?}"
    );
}

/// The opt-out: the operator accepts model SQL on the shared login (here for a role that
/// cannot log in); it then runs there as the caller's role, by `SET LOCAL ROLE`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_login_runs_model_sql_only_with_the_opt_out() {
    let mut pg = Pg::start_with(1, |s| {
        s.with_role(Principal::new("sleepy").unwrap(), "sleeper", None)
    })
    .await;
    pg.source.kind = SourceKind::Postgres {
        url: pg.server.conninfo("dataref_login"),
        pool_size: 1,
        allow_sql_shared_roles: true,
    };
    let f = pg
        .query(
            "sleepy",
            "SELECT current_user::text AS r, session_user::text AS s",
        )
        .await
        .unwrap();
    assert_eq!(pg.text("sleepy", &f), "sleeper\ndataref_login\n");
}
