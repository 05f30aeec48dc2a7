//! The producer tools on a real PostgreSQL source (a throwaway server): principals mapped
//! to roles by config, row-level security through `fetch_*`, clear errors through
//! `query`, and every consumer (describe, export, render_table, run_python) on the Arrow
//! types PostgreSQL brings (decimal, interval, time, list, binary, int16, float32, UTC
//! timestamps).

use std::sync::Arc;
use std::time::Duration;

use dataref_config::Config;
use dataref_protocol::Principal;
use dataref_store::{LocalStore, StoreLimits, SystemClock};
use dataref_test_support::TestPostgres;
use dataref_tool::{CallOutcome, NoProgress, RunContext, ToolCall, ToolRegistry};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::error_text;

const SETUP: &str = r#"
CREATE ROLE dataref_login LOGIN NOINHERIT;
CREATE ROLE eu_analyst LOGIN;
CREATE ROLE us_analyst LOGIN;
GRANT eu_analyst, us_analyst TO dataref_login;
CREATE TABLE sales (id int, region text, amount numeric(12,2), day date);
INSERT INTO sales VALUES (1, 'EU', 10.50, '2025-01-05'), (2, 'US', 20.00, '2025-01-06'),
  (3, 'EU', 30.25, '2025-02-01'), (4, 'US', 40.75, '2024-12-31');
ALTER TABLE sales ENABLE ROW LEVEL SECURITY;
CREATE POLICY eu_rows ON sales FOR SELECT TO eu_analyst USING (region = 'EU');
CREATE POLICY us_rows ON sales FOR SELECT TO us_analyst USING (region = 'US');
GRANT SELECT ON sales TO eu_analyst, us_analyst;
CREATE TABLE salaries (name text, salary int);
GRANT SELECT ON salaries TO eu_analyst;
CREATE TABLE everything (
  i2 int2, f4 float4, n numeric(12,2), nu numeric, tstz timestamptz, tm time,
  iv interval, u uuid, jb jsonb, by bytea, arr int4[], tarr text[], ip inet
);
INSERT INTO everything VALUES
  (-2, 1.5, 12345.67, 1.25, '2025-03-01 12:00:00+02', '13:14:15.5',
   '1 year 2 mons 3 days 04:05:06.5', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
   '{"b": [1, 2]}', '\xdeadbeef', '{1,NULL,3}', '{"x","y"}', '10.0.0.1/32'),
  (7, -0.25, -0.05, 2, '1999-12-31 23:59:59.5+00', '00:00:00', '-1 day', NULL,
   '[]', '', '{}', '{NULL}', NULL);
INSERT INTO everything DEFAULT VALUES;
GRANT SELECT ON everything TO eu_analyst;
"#;

struct PgFixture {
    _server: TestPostgres,
    home: tempfile::TempDir,
    registry: ToolRegistry,
    store: Arc<LocalStore>,
    config: Config,
}

impl PgFixture {
    async fn start(python: bool) -> Self {
        let server = TestPostgres::start().unwrap();
        server.execute(SETUP).await.unwrap();
        let home = tempfile::tempdir().unwrap();
        let nowhere = home.path().join("no-server");
        let toml = format!(
            r#"
[sources.warehouse]
kind = "postgres"
url = "{url}"
pool_size = 2
allow_sql = true
timeout = "30s"

[sources.down]
kind = "postgres"
url = "host={nowhere} port=5432 user=dataref_login dbname=postgres"

[queries.sales]
source = "warehouse"
description = "Sales on or after a day."
sql = "SELECT id, region, amount, day FROM sales WHERE day >= :since ORDER BY id"
params.since = {{ type = "date", required = true }}

[queries.down]
source = "down"
description = "A source that is not running."
sql = "SELECT 1"

[principals.eu]
pg_role = "eu_analyst"
[principals.us]
pg_role = "us_analyst"
"#,
            url = server.conninfo("dataref_login"),
            nowhere = nowhere.display(),
        );
        let config = Config::from_toml_str(&toml, home.path(), home.path().to_owned()).unwrap();
        let sandbox = python.then(super::python::sandbox);
        let registry = dataref_builtins::builtin_registry_with(&config, sandbox).unwrap();
        let store = Arc::new(
            LocalStore::open(home.path(), StoreLimits::default(), Arc::new(SystemClock)).unwrap(),
        );
        Self {
            _server: server,
            home,
            registry,
            store,
            config,
        }
    }

    fn ctx(&self, who: &str) -> RunContext {
        let principal = Principal::new(who).unwrap();
        let workspace = Arc::new(
            dataref_workspace::Workspace::for_principal(self.home.path(), &principal).unwrap(),
        );
        let mut limits = self.config.limits.clone();
        limits.tool_timeout = Duration::from_secs(120);
        RunContext {
            principal,
            store: self.store.clone(),
            workspace,
            limits,
            progress: Arc::new(NoProgress),
            cancel: CancellationToken::new(),
            clock: Arc::new(SystemClock),
        }
    }

    async fn call(&self, who: &str, tool: &str, args: Value) -> CallOutcome {
        dataref_tool::execute_tool_call(&self.registry, ToolCall::new(tool, args), &self.ctx(who))
            .await
    }

    async fn ok(&self, who: &str, tool: &str, args: Value) -> Value {
        let args_shown = args.to_string();
        let o = self.call(who, tool, args).await;
        assert!(!o.is_error(), "{tool} {args_shown}: {}", o.text);
        o.structured.unwrap()
    }
}

/// A sample row (values in `columns` order) as column name → value.
fn named(d: &Value, row: &Value) -> Value {
    let names = d["columns"].as_object().unwrap().keys();
    Value::Object(
        names
            .zip(row.as_array().unwrap())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_runs_as_each_principals_role_under_row_level_security() {
    let f = PgFixture::start(false).await;
    let eu = f
        .ok("eu", "fetch_sales", json!({"since": "2025-01-01"}))
        .await;
    let us = f
        .ok("us", "fetch_sales", json!({"since": "2025-01-01"}))
        .await;
    let ids = |d: &Value| -> Vec<i64> {
        d["sample"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| named(d, r)["id"].as_i64().unwrap())
            .collect()
    };
    assert_eq!(eu["rows"], 2);
    assert_eq!(ids(&eu), [1, 3]);
    assert_eq!(us["rows"], 1);
    assert_eq!(ids(&us), [2]);
    assert_eq!(eu["columns"]["amount"], "decimal(12,2)");
    assert_eq!(named(&eu, &eu["sample"][0])["amount"], 10.5);
    assert_eq!(named(&eu, &eu["sample"][0])["day"], "2025-01-05");
    assert!(eu.get("notes").is_none(), "{eu}");

    let denied = f
        .call(
            "us",
            "query",
            json!({"source": "warehouse", "sql": "SELECT * FROM salaries"}),
        )
        .await;
    let text = error_text(&denied);
    assert!(
        text.contains("principal `us` (PostgreSQL role `us_analyst`) has no access: permission denied for table salaries"),
        "{text}"
    );
    assert!(text.contains("hint:"), "{text}");

    // A source that is down: the registry was built without connecting, and the model
    // learns it is unavailable without host names.
    let down = f.call("eu", "fetch_down", json!({})).await;
    let text = error_text(&down);
    assert!(text.contains("`down` is not available right now"), "{text}");
    assert!(!text.contains("no-server"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_types_survive_describe_export_render_and_python() {
    let python = std::env::var_os("DATAREF_SKIP_PYTHON_TESTS").is_none();
    let f = PgFixture::start(python).await;
    let d = f
        .ok(
            "eu",
            "query",
            json!({"source": "warehouse", "sql": "SELECT * FROM everything ORDER BY i2 NULLS LAST"}),
        )
        .await;
    let data_ref = d["dataRef"].as_str().unwrap().to_owned();
    assert_eq!(d["rows"], 3);
    let columns = &d["columns"];
    assert_eq!(columns["i2"], "integer");
    assert_eq!(columns["f4"], "float");
    assert_eq!(columns["n"], "decimal(12,2)");
    assert_eq!(columns["tstz"], "timestamp(UTC)");
    assert_eq!(columns["tm"], "time");
    assert_eq!(columns["iv"], "interval");
    assert_eq!(columns["by"], "binary");
    assert_eq!(columns["arr"], "list<integer>");
    let row = &named(&d, &d["sample"][0]);
    assert_eq!(row["n"], 12345.67);
    assert_eq!(row["nu"], "1.25");
    assert_eq!(row["tstz"], "2025-03-01T10:00:00");
    assert_eq!(row["tm"], "13:14:15.500000");
    assert_eq!(row["iv"], "P1Y2M3DT4H5M6.5S");
    assert_eq!(row["arr"], json!([1, null, 3]));
    assert_eq!(row["tarr"], json!(["x", "y"]));
    assert_eq!(row["by"], "deadbeef");
    assert_eq!(named(&d, &d["sample"][1])["iv"], "P-1D");
    let notes = d["notes"].as_array().unwrap();
    assert!(
        notes.iter().any(|n| n.as_str().unwrap().contains("`ip`")),
        "{d}"
    );

    let stats = f
        .ok("eu", "describe_data", json!({"dataRef": data_ref}))
        .await;
    // One row per column: type, nulls, distinct, min, max, …
    assert_eq!(stats["columns"].as_object().unwrap().len(), 13);
    let n = &stats["columns"]["n"];
    assert_eq!(n[1], 1);
    assert_eq!(n[3], -0.05);
    assert_eq!(n[4], 12345.67);
    assert_eq!(stats["columns"]["tstz"][4], "2025-03-01T10:00:00");
    assert_eq!(stats["columns"]["tm"][3], "00:00:00");

    for format in ["csv", "xlsx", "json", "ndjson", "parquet"] {
        let v = f
            .ok(
                "eu",
                "export_data",
                json!({"source": data_ref, "format": format, "filename": format!("everything-{format}")}),
            )
            .await;
        assert_eq!(v["rows"], 3, "{format}: {v}");
    }
    let csv = {
        use std::io::Read;
        let ctx = f.ctx("eu");
        let p = ctx.workspace.resolve("exports/everything-csv.csv").unwrap();
        let mut s = String::new();
        ctx.workspace
            .open_read(&p)
            .unwrap()
            .read_to_string(&mut s)
            .unwrap();
        s
    };
    let first = csv.lines().nth(1).unwrap();
    assert!(first.contains("12345.67"), "{first}");
    assert!(first.contains("2025-03-01T10:00:00Z"), "{first}");
    assert!(first.contains("13:14:15.5"), "{first}");

    // Parquet has no month-day-nano interval: that column is written as ISO 8601 text, the
    // decimal, time, list and binary columns as themselves.
    let parquet = {
        use std::io::Read;
        let ctx = f.ctx("eu");
        let p = ctx
            .workspace
            .resolve("exports/everything-parquet.parquet")
            .unwrap();
        let mut b = Vec::new();
        ctx.workspace
            .open_read(&p)
            .unwrap()
            .read_to_end(&mut b)
            .unwrap();
        b
    };
    let back: Vec<arrow_array::RecordBatch> =
        parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(bytes::Bytes::from(
            parquet,
        ))
        .unwrap()
        .build()
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let back = &back[0];
    let iv = back.column_by_name("iv").unwrap();
    assert_eq!(iv.data_type(), &arrow_schema::DataType::Utf8);
    use arrow_array::cast::AsArray;
    assert_eq!(iv.as_string::<i32>().value(0), "P1Y2M3DT4H5M6.5S");
    assert_eq!(
        back.column_by_name("n").unwrap().data_type(),
        &arrow_schema::DataType::Decimal128(12, 2)
    );
    assert!(matches!(
        back.column_by_name("arr").unwrap().data_type(),
        arrow_schema::DataType::List(_)
    ));

    let t = f
        .ok("eu", "render_table", json!({"dataRef": data_ref}))
        .await;
    assert_eq!(t["rowsShown"], 3, "{t}");

    if python {
        let out = f
            .ok(
                "eu",
                "run_python",
                json!({
                    "code": "result = {'dtypes': {c: str(t) for c, t in df.dtypes.items()}, \
                             'n': str(df['n'][0]), 'arr': [None if x != x else x for x in df['arr'][0]], \
                             'iv': str(df['iv'][0]), 'tstz': str(df['tstz'][0])}",
                    "inputs": {"df": data_ref},
                }),
            )
            .await;
        assert_eq!(out.get("ok"), None, "{out}");
        let r = &out["result"];
        assert_eq!(r["n"], "12345.67", "{r}");
        // pandas' own mapping: an int column with NULLs is float64, decimals are objects.
        assert_eq!(r["dtypes"]["i2"], "float64", "{r}");
        assert_eq!(r["dtypes"]["f4"], "float32", "{r}");
        assert_eq!(r["arr"], json!([1.0, null, 3.0]), "{r}");
        assert!(r["iv"].as_str().unwrap().contains("months=14"), "{r}");
        assert!(r["dtypes"]["tstz"].as_str().unwrap().contains("UTC"), "{r}");
        assert_eq!(r["tstz"], "2025-03-01 10:00:00+00:00", "{r}");
    }
}
