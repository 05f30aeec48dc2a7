//! `run_sql` through `execute_tool_call`: the real store, the real SQLite sample and, for
//! the answers, pandas in the real sandbox on the same artifacts.
//!
//! Results are compared cell by cell as the store holds them: both artifacts are read back
//! and every cell turned into JSON the way the model would see it (decimals as their exact
//! text). Floats agree within a relative 1e-9 (absolute under 1): SQL and pandas add in
//! different orders, so the last bits may differ; everything else must be equal.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::ArrayRef;
use arrow_array::cast::AsArray;
use arrow_array::types::Decimal128Type;
use arrow_schema::DataType;
use dataref_config::{Config, SqlConfig};
use dataref_protocol::DataRef;
use dataref_tool::{CallOutcome, OutcomeKind, ProgressSink, ToolCall, execute_tool_call};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::python::{RANDOM_REF, as_bob, fetch, python, sandbox};
use super::{Fixture, error_text, fixture_full, run};

use dataref_config::QOQ_SQL;

/// A query that runs for minutes: three copies of the sample, every row compared.
const SLOW: &str = "SELECT count(*) AS n FROM sales a, sales b, sales c \
                    WHERE a.revenue + b.revenue > c.revenue";

/// The built-in tools for `alice` with `[sql]` changed by `tweak`; with `run_python` on the
/// shared sandbox when `pandas`.
fn fixture_sql(pandas: bool, tweak: impl FnOnce(&mut SqlConfig)) -> Fixture {
    let python = pandas.then(sandbox);
    let mut f = fixture_full(
        |limits| limits.tool_timeout = Duration::from_secs(120),
        python.clone(),
    );
    let mut config = Config::builtin_sample(f.home.path().to_owned(), 2_000);
    config.limits = f.ctx.limits.clone();
    tweak(&mut config.sql);
    f.registry = dataref_builtins::builtin_registry_with(&config, python).unwrap();
    f
}

fn fixture() -> Fixture {
    fixture_sql(false, |_| {})
}

fn call(sql: &str, inputs: Value) -> ToolCall {
    ToolCall::new("run_sql", json!({"sql": sql, "inputs": inputs}))
}

/// A `run_sql` call that worked: its structured result, checked against the declared
/// output schema (clients validate it).
async fn sql_ok(f: &Fixture, args: Value) -> Value {
    let o = run(f, ToolCall::new("run_sql", args)).await;
    assert!(!o.is_error(), "{}", o.text);
    let v = o.structured.unwrap();
    assert_eq!(serde_json::to_string(&v).unwrap(), o.text);
    let spec = f.registry.get("run_sql").unwrap().spec().clone();
    let validator = jsonschema::validator_for(spec.output_schema.as_ref().unwrap()).unwrap();
    let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "output schema violated: {errors:?}\n{v}");
    v
}

/// Runs `sql` over `inputs` into a stored table; its dataRef.
async fn sql_table(f: &Fixture, sql: &str, inputs: Value) -> String {
    let v = sql_ok(f, json!({"sql": sql, "inputs": inputs})).await;
    assert!(v.get("values").is_none(), "{v}");
    v["dataRef"].as_str().unwrap().to_owned()
}

/// Runs pandas `code`; the dataRefs of the `outputs` it names, in order.
async fn pandas(f: &Fixture, code: &str, inputs: Value, names: &[&str]) -> Vec<String> {
    let out = python(f, json!({"code": code, "inputs": inputs})).await;
    assert!(out.get("error").is_none(), "{out}");
    names
        .iter()
        .map(|n| {
            out["outputs"][n]["dataRef"]
                .as_str()
                .unwrap_or_else(|| panic!("no output {n}: {out}"))
                .to_owned()
        })
        .collect()
}

/// A stored table read back: column names and types, and every cell as JSON.
struct Stored {
    columns: Vec<(String, DataType)>,
    rows: Vec<Vec<Value>>,
}

fn stored(f: &Fixture, data_ref: &str) -> Stored {
    let table = f
        .ctx
        .store
        .open_table(&f.ctx.principal, &DataRef::parse(data_ref).unwrap())
        .unwrap();
    let columns = table
        .meta
        .schema
        .fields()
        .iter()
        .map(|c| (c.name().clone(), c.data_type().clone()))
        .collect();
    let mut rows = Vec::new();
    for b in &table.batches {
        for row in 0..b.num_rows() {
            rows.push(b.columns().iter().map(|c| cell(c, row)).collect());
        }
    }
    Stored { columns, rows }
}

/// A cell as the model sees it, but a decimal as its exact text.
fn cell(array: &ArrayRef, row: usize) -> Value {
    match array.data_type() {
        DataType::Decimal128(_, scale) if !array.is_null(row) => Value::String(decimal_text(
            array.as_primitive::<Decimal128Type>().value(row),
            *scale,
        )),
        _ => dataref_store::cell_to_json(array, row, None).0,
    }
}

fn decimal_text(v: i128, scale: i8) -> String {
    let digits = v.unsigned_abs().to_string();
    let scale = usize::try_from(scale).unwrap();
    let digits = format!("{digits:0>width$}", width = scale + 1);
    let (int, frac) = digits.split_at(digits.len() - scale);
    let sign = if v < 0 { "-" } else { "" };
    if scale == 0 {
        format!("{sign}{int}")
    } else {
        format!("{sign}{int}.{frac}")
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

/// Two cells agree: the same JSON, integers exactly, floats within the tolerance.
fn same_cell(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(x), Some(y)) => x == y,
            _ => close(x.as_f64().unwrap(), y.as_f64().unwrap()),
        },
        _ => a == b,
    }
}

/// The SQL result and the pandas one hold the same table, row by row, cell by cell.
fn assert_same(what: &str, f: &Fixture, sql_ref: &str, pandas_ref: &str) -> Stored {
    let s = stored(f, sql_ref);
    let p = stored(f, pandas_ref);
    let names = |t: &Stored| t.columns.iter().map(|c| c.0.clone()).collect::<Vec<_>>();
    assert_eq!(names(&s), names(&p), "{what}: columns");
    assert!(!s.rows.is_empty(), "{what}: no rows");
    assert_eq!(s.rows.len(), p.rows.len(), "{what}: rows");
    for (i, (a, b)) in s.rows.iter().zip(&p.rows).enumerate() {
        for (c, (x, y)) in a.iter().zip(b).enumerate() {
            assert!(
                same_cell(x, y),
                "{what}: row {i}, column `{}`: SQL {x}, pandas {y}\nSQL row {a:?}\npandas row {b:?}",
                s.columns[c].0
            );
        }
    }
    s
}

fn artifacts(f: &Fixture) -> u64 {
    f.ctx.store.list(&f.ctx.principal, 1).unwrap().1
}

/// Tables being written (`artifacts/.tmp`).
fn tmp_dir(f: &Fixture) -> PathBuf {
    f.home.path().join("artifacts").join(".tmp")
}

fn files_in(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.count())
}

/// Nothing is being written: waits a little, as a writer thread may still be unwinding.
async fn assert_no_partial_file(f: &Fixture) {
    let dir = tmp_dir(f);
    let until = Instant::now() + Duration::from_secs(5);
    while files_in(&dir) > 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        files_in(&dir),
        0,
        "a partial table is left in {}",
        dir.display()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn groups_joins_windows_and_pivots_match_pandas() {
    let f = fixture_sql(true, |_| {});
    let sales = fetch(&f).await;
    let refs = pandas(
        &f,
        "import numpy as np\n\
         g = sales.groupby(['region', 'channel'], as_index=False).agg(\n\
             revenue=('revenue', 'sum'), n=('revenue', 'size'), avg_units=('units', 'mean'))\n\
         outputs['groups'] = g.sort_values(['region', 'channel'])\n\
         targets = pd.DataFrame({'region': ['North America', 'EMEA', 'APAC', 'LATAM', 'Atlantis'],\n\
                                 'target': [300000, 250000, 180000, 90000, 1]})\n\
         outputs['targets'] = targets\n\
         j = sales.merge(targets, on='region', how='left').groupby('region', as_index=False).agg(\n\
             target=('target', 'max'), revenue=('revenue', 'sum'), n=('revenue', 'size'))\n\
         j['share'] = j['revenue'] / j['target']\n\
         outputs['joined'] = j.sort_values('region')\n\
         d = sales.groupby(['region', 'date'], as_index=False)['revenue'].sum()\n\
         d = d.sort_values(['region', 'date'])\n\
         d['rnk'] = d.groupby('region')['revenue'].rank(method='min', ascending=False).astype('int64')\n\
         d['running'] = d.groupby('region')['revenue'].cumsum()\n\
         d['date'] = d['date'].dt.date\n\
         outputs['window'] = d\n\
         wide = sales.pivot_table(index='line', columns='channel', values='revenue', aggfunc='sum')\n\
         counts = sales.pivot_table(index='line', columns='channel', values='revenue',\n\
                                    aggfunc='size', fill_value=0)\n\
         outputs['pivot'] = pd.DataFrame({'line': wide.index,\n\
             'online': wide['Online'].fillna(0.0).values, 'retail': wide['Retail'].values,\n\
             'partner_n': counts['Partner'].reindex(wide.index).astype('int64').values})\n",
        json!({"sales": sales}),
        &["groups", "targets", "joined", "window", "pivot"],
    )
    .await;
    let [groups, targets, joined, window, pivot] = refs.try_into().unwrap();

    let q = sql_table(
        &f,
        "SELECT region, channel, sum(revenue) AS revenue, count(*) AS n, avg(units) AS avg_units \
         FROM sales GROUP BY region, channel ORDER BY region, channel",
        json!({"sales": sales}),
    )
    .await;
    let s = assert_same("group by", &f, &q, &groups);
    assert_eq!(s.rows.len(), 20, "5 regions × 4 channels");

    // A join of two refs: the sample and pandas' little table; a region without a target
    // keeps its rows (LEFT JOIN) and gets NULLs.
    let q = sql_table(
        &f,
        "SELECT s.region, max(t.target) AS target, sum(s.revenue) AS revenue, count(*) AS n, \
                sum(s.revenue) / max(t.target) AS share \
         FROM sales s LEFT JOIN targets t ON s.region = t.region \
         GROUP BY s.region ORDER BY s.region",
        json!({"sales": sales, "targets": targets}),
    )
    .await;
    let s = assert_same("left join", &f, &q, &joined);
    let nordics = s.rows.iter().find(|r| r[0] == json!("Nordics")).unwrap();
    assert_eq!((&nordics[1], &nordics[4]), (&Value::Null, &Value::Null));

    let q = sql_table(
        &f,
        "WITH d AS (SELECT region, date, sum(revenue) AS revenue FROM sales GROUP BY region, date) \
         SELECT region, date, revenue, \
                rank() OVER (PARTITION BY region ORDER BY revenue DESC) AS rnk, \
                sum(revenue) OVER (PARTITION BY region ORDER BY date \
                                   ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS running \
         FROM d ORDER BY region, date",
        json!({"sales": sales}),
    )
    .await;
    let s = assert_same("window", &f, &q, &window);
    assert!(s.rows.len() > 1_000, "{} region-days", s.rows.len());

    let q = sql_table(
        &f,
        "SELECT line, \
                sum(CASE WHEN channel = 'Online' THEN revenue ELSE 0 END) AS online, \
                sum(revenue) FILTER (WHERE channel = 'Retail') AS retail, \
                count(*) FILTER (WHERE channel = 'Partner') AS partner_n \
         FROM sales GROUP BY line ORDER BY line",
        json!({"sales": sales}),
    )
    .await;
    let s = assert_same("pivot", &f, &q, &pivot);
    assert!(
        s.rows.iter().any(|r| r[2].is_null()),
        "some line has no retail sale, so FILTER's NULL is compared too"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn nulls_dates_and_decimals_match_pandas() {
    let f = fixture_sql(true, |_| {});
    let sales = fetch(&f).await;
    let refs = pandas(
        &f,
        "from decimal import Decimal\n\
         nd = sales.groupby('channel', as_index=False).agg(\n\
             with_discount=('discount', 'count'), n=('revenue', 'size'),\n\
             avg_discount=('discount', 'mean'))\n\
         outputs['null_counts'] = nd.sort_values('channel')\n\
         ng = sales.groupby('discount', dropna=False, as_index=False).agg(\n\
             n=('revenue', 'size'), revenue=('revenue', 'sum'))\n\
         outputs['null_groups'] = ng.sort_values('discount', na_position='first').reset_index(drop=True)\n\
         s = sales[(sales['date'] >= '2025-04-01') & (sales['date'] < '2025-10-01')]\n\
         s = s.assign(month=s['date'].dt.to_period('M').dt.to_timestamp(),\n\
                      quarter=s['date'].dt.to_period('Q').dt.to_timestamp())\n\
         m = s.groupby(['month', 'quarter'], as_index=False).agg(\n\
             revenue=('revenue', 'sum'), n=('revenue', 'size'), first_day=('date', 'min'))\n\
         m['first_day'] = m['first_day'].dt.date\n\
         outputs['months'] = m.sort_values('month')\n\
         cents = Decimal('0.01')\n\
         dec = sales.assign(rev=[Decimal(repr(v)).quantize(cents) for v in sales['revenue']])\n\
         dec = dec.groupby('region', as_index=False).agg(total=('rev', 'sum'), smallest=('rev', 'min'))\n\
         outputs['decimals'] = dec.sort_values('region')\n",
        json!({"sales": sales}),
        &["null_counts", "null_groups", "months", "decimals"],
    )
    .await;
    let [null_counts, null_groups, months, decimals] = refs.try_into().unwrap();

    // count(column) skips NULLs, count(*) does not; avg ignores them.
    let q = sql_table(
        &f,
        "SELECT channel, count(discount) AS with_discount, count(*) AS n, \
                avg(discount) AS avg_discount \
         FROM sales GROUP BY channel ORDER BY channel",
        json!({"sales": sales}),
    )
    .await;
    let s = assert_same("count vs count(*)", &f, &q, &null_counts);
    assert!(
        s.rows.iter().all(|r| r[1].as_u64() < r[2].as_u64()),
        "every channel has NULL discounts"
    );

    // NULL is a group of its own, first here.
    let q = sql_table(
        &f,
        "SELECT discount, count(*) AS n, sum(revenue) AS revenue \
         FROM sales GROUP BY discount ORDER BY discount NULLS FIRST",
        json!({"sales": sales}),
    )
    .await;
    let s = assert_same("NULL group", &f, &q, &null_groups);
    assert!(s.rows[0][0].is_null(), "{:?}", s.rows[0]);

    // date_trunc to month and quarter, compared with a date literal and a string.
    let q = sql_table(
        &f,
        "SELECT date_trunc('month', date) AS month, date_trunc('quarter', date) AS quarter, \
                sum(revenue) AS revenue, count(*) AS n, min(date) AS first_day \
         FROM sales WHERE date >= DATE '2025-04-01' AND date < '2025-10-01' \
         GROUP BY 1, 2 ORDER BY 1",
        json!({"sales": sales}),
    )
    .await;
    let s = assert_same("dates", &f, &q, &months);
    assert_eq!(s.rows.len(), 6, "April to September");
    assert_eq!(
        s.rows[3][1], s.rows[5][1],
        "July to September are one quarter"
    );

    // Decimals: exact on both sides (the revenue is whole cents), so equal to the digit.
    let q = sql_table(
        &f,
        "SELECT region, sum(CAST(revenue AS DECIMAL(12,2))) AS total, \
                min(CAST(revenue AS DECIMAL(12,2))) AS smallest \
         FROM sales GROUP BY region ORDER BY region",
        json!({"sales": sales}),
    )
    .await;
    let s = assert_same("decimals", &f, &q, &decimals);
    let p = stored(&f, &decimals);
    for t in [&s, &p] {
        for (name, ty) in &t.columns[1..] {
            assert!(matches!(ty, DataType::Decimal128(_, 2)), "{name}: {ty}");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn unicode_text_groups_filters_and_orders_like_pandas() {
    let f = fixture_sql(true, |_| {});
    let refs = pandas(
        &f,
        "cities = ['Zürich', 'São Paulo', 'København', '東京', 'Straße', 'Łódź', 'naïve café',\n\
                   '🚀 Launch', 'Ängelholm', 'Zurich', 'Ωmega']\n\
         rows = [(cities[i % len(cities)], i % 4 + 1, i * 1.25) for i in range(77)]\n\
         places = pd.DataFrame(rows, columns=['city', 'Größe', 'amount'])\n\
         outputs['places'] = places\n\
         g = places[(places['Größe'] >= 2) & (places['city'] != 'Zurich')]\n\
         g = g.groupby('city', as_index=False).agg(\n\
             n=('amount', 'size'), total=('amount', 'sum'), biggest=('Größe', 'max'))\n\
         g['chars'] = g['city'].str.len()\n\
         g['shout'] = [c.upper() for c in g['city']]\n\
         outputs['by_city'] = g.sort_values('city')\n\
         outputs['with_o'] = places[places['city'].str.contains('ø|ö|ó', regex=True)]\\\n\
             .groupby('city', as_index=False).agg(n=('amount', 'size')).sort_values('city')\n",
        json!({}),
        &["places", "by_city", "with_o"],
    )
    .await;
    let [places, by_city, with_o] = refs.try_into().unwrap();
    let q = sql_table(
        &f,
        "WITH g AS ( \
           SELECT city, count(*) AS n, sum(amount) AS total, max(\"Größe\") AS biggest \
           FROM places WHERE \"Größe\" >= 2 AND city <> 'Zurich' GROUP BY city) \
         SELECT city, n, total, biggest, character_length(city) AS chars, upper(city) AS shout \
         FROM g ORDER BY city",
        json!({"places": places}),
    )
    .await;
    let s = assert_same("unicode", &f, &q, &by_city);
    let cities: Vec<&str> = s.rows.iter().map(|r| r[0].as_str().unwrap()).collect();
    assert_eq!(cities.len(), 10, "{cities:?}");
    assert_eq!(cities.last(), Some(&"🚀 Launch"), "{cities:?}");
    // Full case mapping, as Python's `str.upper` (the pandas side uses it: pyarrow's
    // `str.upper` maps ß to ẞ one character for one).
    let straße = s.rows.iter().find(|r| r[0] == json!("Straße")).unwrap();
    assert_eq!((&straße[4], &straße[5]), (&json!(6), &json!("STRASSE")));

    let q = sql_table(
        &f,
        "SELECT city, count(*) AS n FROM places \
         WHERE city LIKE '%ø%' OR city LIKE '%ö%' OR city LIKE '%ó%' \
         GROUP BY city ORDER BY city",
        json!({"places": places}),
    )
    .await;
    let s = assert_same("unicode LIKE", &f, &q, &with_o);
    assert_eq!(s.rows.len(), 2, "København, Łódź");
}

#[tokio::test(flavor = "multi_thread")]
async fn every_statement_that_is_not_a_query_is_refused_with_a_hint() {
    let f = fixture();
    let sales = fetch(&f).await;
    let before = artifacts(&f);
    let attempts = [
        ("COPY sales TO '/tmp/x.csv'", "COPY"),
        ("COPY (SELECT 1) TO '/tmp/x.csv' STORED AS CSV", "COPY"),
        ("CREATE TABLE t AS SELECT * FROM sales", "CREATE TABLE"),
        (
            "CREATE EXTERNAL TABLE p STORED AS CSV LOCATION '/etc/passwd'",
            "CREATE EXTERNAL TABLE",
        ),
        ("INSERT INTO sales VALUES ('2025-01-01', 'x')", "INSERT"),
        ("DROP TABLE sales", "DROP TABLE"),
        ("SET datafusion.execution.batch_size = 1", "SET"),
        ("EXPLAIN SELECT * FROM sales", "EXPLAIN"),
        ("SELECT * INTO copied FROM sales", "INTO"),
        ("SELECT 1; DROP TABLE sales", "a second statement"),
    ];
    for (sql, kind) in attempts {
        let o = run(&f, call(sql, json!({"sales": sales}))).await;
        assert_eq!(o.kind, OutcomeKind::ToolFailed, "{sql}: {}", o.text);
        let text = error_text(&o);
        let (message, hint) = text.split_once("\nhint: ").unwrap();
        assert!(message.contains(kind), "{sql}: {text}");
        assert!(message.contains("is not allowed"), "{sql}: {text}");
        assert!(hint.contains("one SELECT"), "{sql}: {text}");
    }
    // Not refused by kind, but nothing to run either: each says what is wrong and lists
    // the tables there are.
    for (sql, says) in [
        ("SELECT * FROM '/etc/passwd'", "/etc/passwd"),
        ("SELECT * FROM \"/etc/passwd\"", "/etc/passwd"),
        ("SELECT * FROM read_csv('/etc/passwd')", "read_csv"),
    ] {
        let o = run(&f, call(sql, json!({"sales": sales}))).await;
        assert_eq!(o.kind, OutcomeKind::ToolFailed, "{sql}: {}", o.text);
        let text = error_text(&o);
        let (message, hint) = text.split_once("\nhint: ").unwrap();
        assert!(message.contains(says), "{sql}: {text}");
        assert!(
            hint.contains("`sales` (date, line, region"),
            "{sql}: {text}"
        );
    }
    assert_eq!(artifacts(&f), before, "nothing stored");
}

#[tokio::test(flavor = "multi_thread")]
async fn what_the_model_reads_when_a_query_is_wrong() {
    let f = fixture();
    let sales = fetch(&f).await;
    let inputs = json!({"sales": sales});
    let refused = run(&f, call("COPY sales TO '/tmp/out.csv'", inputs.clone())).await;
    insta::assert_snapshot!("sql_refused", error_text(&refused));
    let column = run(
        &f,
        call(
            "SELECT line,\n  sum(revenu) AS total\nFROM sales GROUP BY line",
            inputs.clone(),
        ),
    )
    .await;
    insta::assert_snapshot!("sql_unknown_column", error_text(&column));
    let syntax = run(&f, call("SELECT line, FROM sales WHERE", inputs.clone())).await;
    insta::assert_snapshot!("sql_syntax_error", error_text(&syntax));
    let name = run(&f, call("SELECT 1", json!({"Sales": sales}))).await;
    let text = error_text(&name);
    assert!(text.contains("`Sales` cannot name a table"), "{text}");
    assert!(text.contains("\nhint: use lowercase"), "{text}");
}

/// What the model reads when its query is too deep, too long or its own mistake: one short
/// error naming the limit or the mistake, and the next query answered.
#[tokio::test(flavor = "multi_thread")]
async fn limits_and_mistakes_are_short_errors_and_the_next_query_runs() {
    let f = fixture();
    let sales = fetch(&f).await;
    let inputs = json!({"sales": sales});
    let deep = run(
        &f,
        call(
            &format!("SELECT 1{} AS x FROM sales", "+1".repeat(30_000)),
            inputs.clone(),
        ),
    )
    .await;
    insta::assert_snapshot!("sql_too_deep", error_text(&deep));
    let unions = run(
        &f,
        call(
            &format!("SELECT 1 AS x{}", " UNION ALL SELECT 1".repeat(700)),
            inputs.clone(),
        ),
    )
    .await;
    assert!(
        error_text(&unions).contains("SELECT blocks; the limit is"),
        "{}",
        unions.text
    );
    // A megabyte of SQL: refused by the schema, naming the limit, echoing 100 characters.
    let long = run(
        &f,
        call(
            &format!("SELECT '{}' AS x", "x".repeat(1 << 20)),
            inputs.clone(),
        ),
    )
    .await;
    let text = error_text(&long);
    assert!(text.len() < 1_000, "{} bytes: {}", text.len(), &text[..300]);
    assert!(text.contains("100000"), "{text}");
    // The model's own mistakes are reported as its own, with the engine's words.
    for sql in [
        "SELECT regexp_like(line, '(') AS m FROM sales",
        "SELECT CAST(line AS INT) AS n FROM sales",
        "SELECT units * 9223372036854775807 AS n FROM sales",
    ] {
        let o = run(&f, call(sql, inputs.clone())).await;
        assert_eq!(o.kind, OutcomeKind::ToolFailed, "{sql}: {}", o.text);
    }
    let o = run(&f, call("SELECT count(*) AS n FROM sales", inputs)).await;
    assert!(!o.is_error(), "{}", o.text);
}

/// Someone else's dataRef answers exactly like one nobody minted.
#[tokio::test(flavor = "multi_thread")]
async fn another_principals_ref_answers_like_an_unknown_one() {
    let f = fixture();
    let sales = fetch(&f).await;
    let bob = as_bob(&f);
    let ask = |inputs: Value| {
        let call = call("SELECT count(*) AS n FROM t", inputs);
        let registry = &f.registry;
        let bob = &bob;
        async move { execute_tool_call(registry, call, bob).await }
    };
    let foreign = ask(json!({"t": sales})).await;
    let unknown = ask(json!({"t": RANDOM_REF})).await;
    assert_eq!(foreign.kind, unknown.kind);
    let (foreign, unknown) = (error_text(&foreign), error_text(&unknown));
    assert_eq!(foreign, unknown);
    assert!(foreign.contains("is unknown or expired"), "{foreign}");
    assert!(foreign.contains("\nhint: "), "{foreign}");
    assert!(
        !foreign.contains("alice") && !foreign.contains("bob"),
        "{foreign}"
    );
    // The raw texts differ only in the ref itself.
    let raw = |o: &CallOutcome, r: &str| o.text.replace(r, "REF");
    let f2 = ask(json!({"t": sales})).await;
    let u2 = ask(json!({"t": RANDOM_REF})).await;
    assert_eq!(raw(&f2, &sales), raw(&u2, RANDOM_REF));
    // Mixed with one of bob's own: still the unknown answer, nothing run.
    let mine = execute_tool_call(
        &f.registry,
        ToolCall::new("fetch_sales", json!({"since": "2025-01-01"})),
        &bob,
    )
    .await;
    let mine = mine.structured.unwrap()["dataRef"].clone();
    let mixed = error_text(&ask(json!({"mine": mine, "t": sales})).await);
    assert_eq!(mixed, unknown);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_query_over_its_memory_is_a_clear_error_and_leaves_nothing() {
    let f = fixture_sql(false, |sql| sql.memory_bytes = 1 << 20);
    let sales = fetch(&f).await;
    let before = artifacts(&f);
    for sql in [
        // A sort of four million rows.
        "SELECT a.line, b.line AS other FROM sales a CROSS JOIN sales b \
         ORDER BY a.revenue + b.revenue",
        // Four million groups.
        "SELECT a.revenue, b.revenue AS other, count(*) AS n FROM sales a CROSS JOIN sales b \
         GROUP BY a.revenue, b.revenue",
        // A self-join's hash table over the product.
        "SELECT count(*) AS n FROM (SELECT a.line FROM sales a CROSS JOIN sales b) x \
         JOIN (SELECT a.line FROM sales a CROSS JOIN sales b) y ON x.line = y.line",
    ] {
        let o = run(&f, call(sql, json!({"sales": sales}))).await;
        assert_eq!(o.kind, OutcomeKind::ToolFailed, "{sql}: {}", o.text);
        let text = error_text(&o);
        assert_eq!(
            text,
            "error: the query needed more than 1.0 MiB of working memory\n\
             hint: filter or aggregate earlier, select fewer columns, or split the question",
            "{sql}"
        );
        assert_no_partial_file(&f).await;
    }
    assert_eq!(artifacts(&f), before, "nothing stored");
}

/// A table many times the memory limit, sorted for its top rows: the engine keeps only the
/// rows it needs, and a batch of a mapped table weighs its own bytes, not the whole file's
/// (each used to count the file, so the first batch kept was over any limit under it).
#[tokio::test(flavor = "multi_thread")]
async fn the_top_rows_of_a_table_larger_than_the_memory_limit() {
    let mut f = fixture();
    let sales = fetch(&f).await;
    // 2,000 × 1,000 rows of two numbers: 32 MB on disk.
    let big = sql_table(
        &f,
        "SELECT a.revenue AS r, b.revenue * a.revenue AS v FROM sales a \
         CROSS JOIN (SELECT revenue FROM sales LIMIT 1000) b",
        json!({"sales": sales}),
    )
    .await;
    let table = f
        .ctx
        .store
        .open_table(&f.ctx.principal, &DataRef::parse(&big).unwrap())
        .unwrap();
    assert_eq!(table.meta.rows, 2_000_000);
    assert!(table.batches.len() > 4, "{} batches", table.batches.len());
    let mut config = Config::builtin_sample(f.home.path().to_owned(), 2_000);
    config.limits = f.ctx.limits.clone();
    config.sql.memory_bytes = 8 << 20;
    f.registry = dataref_builtins::builtin_registry_with(&config, None).unwrap();
    let v = sql_ok(
        &f,
        json!({
            "sql": "SELECT r, v FROM big WHERE v IS NOT NULL ORDER BY v DESC, r LIMIT 100",
            "inputs": {"big": big},
            "store_as": "value",
        }),
    )
    .await;
    assert_eq!(v["rows"], 100, "{v}");
    let top: Vec<f64> = v["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row[1].as_f64().unwrap())
        .collect();
    assert!(top.windows(2).all(|w| w[0] >= w[1]), "{top:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slow_query_stops_at_the_sql_timeout_and_leaves_nothing() {
    let f = fixture_sql(false, |sql| sql.timeout = Duration::from_secs(1));
    let sales = fetch(&f).await;
    let before = artifacts(&f);
    let started = Instant::now();
    let o = run(&f, call(SLOW, json!({"sales": sales}))).await;
    let took = started.elapsed();
    assert_eq!(o.kind, OutcomeKind::ToolFailed, "{}", o.text);
    assert_eq!(
        error_text(&o),
        "error: the query ran longer than 1 s and was stopped\n\
         hint: filter or aggregate earlier, or split the question into smaller queries"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
    // A result that streams into the store when the time is up: the same, and no table. The
    // filter keeps about one row in a hundred, so a fast machine writes megabytes before the
    // second is up rather than reaching the artifact cap (CI once wrote 1 GiB in under 1 s).
    let o = run(
        &f,
        call(
            "SELECT a.revenue * b.units + c.revenue AS x FROM sales a, sales b, sales c \
             WHERE (a.units * 31 + b.units * 17 + c.units) % 101 = 0",
            json!({"sales": sales}),
        ),
    )
    .await;
    assert!(
        error_text(&o).starts_with("error: the query ran longer than 1 s"),
        "{}",
        o.text
    );
    assert_no_partial_file(&f).await;
    assert_eq!(artifacts(&f), before, "nothing stored");
}

/// Says when the writer has stored its first rows.
struct FirstProgress(tokio::sync::Notify);

impl ProgressSink for FirstProgress {
    fn report(&self, _progress: f64, _total: Option<f64>, _message: Option<String>) {
        self.0.notify_one();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn cancelling_mid_stream_removes_the_partial_table_promptly() {
    let f = fixture();
    let sales = fetch(&f).await;
    let before = artifacts(&f);
    let first = Arc::new(FirstProgress(tokio::sync::Notify::new()));
    let mut ctx = f.ctx.clone();
    ctx.progress = first.clone();
    ctx.cancel = CancellationToken::new();
    let cancel = ctx.cancel.clone();
    // Eight billion rows: it streams into the store until it is stopped.
    let big = call(
        "SELECT a.revenue * b.units + c.revenue AS x FROM sales a, sales b, sales c",
        json!({"sales": sales}),
    );
    let tmp = tmp_dir(&f);
    let watcher = async {
        first.0.notified().await;
        let writing = files_in(&tmp);
        cancel.cancel();
        (writing, Instant::now())
    };
    let (o, (writing, cancelled_at)) = tokio::time::timeout(Duration::from_secs(60), async {
        tokio::join!(execute_tool_call(&f.registry, big, &ctx), watcher)
    })
    .await
    .unwrap();
    let took = cancelled_at.elapsed();
    assert_eq!(
        writing, 1,
        "the table was being written when the call was cancelled"
    );
    assert_eq!(o.kind, OutcomeKind::Cancelled, "{}", o.text);
    assert!(took < Duration::from_secs(2), "{took:?} after the cancel");
    assert_no_partial_file(&f).await;
    assert_eq!(artifacts(&f), before, "nothing stored");
}

#[tokio::test(flavor = "multi_thread")]
async fn store_as_value_returns_a_small_result_and_stores_a_large_one() {
    let f = fixture();
    let sales = fetch(&f).await;
    let before = artifacts(&f);
    let v = sql_ok(
        &f,
        json!({
            "sql": "SELECT region, count(*) AS n, count(discount) AS with_discount \
                    FROM sales GROUP BY region ORDER BY region",
            "inputs": {"sales": sales},
            "store_as": "value",
        }),
    )
    .await;
    assert!(v.get("dataRef").is_none(), "{v}");
    assert_eq!(v["rows"], 5);
    assert_eq!(
        v["columns"],
        json!({"region": "string", "n": "integer", "with_discount": "integer"})
    );
    let values = v["values"].as_array().unwrap();
    assert_eq!(values.len(), 5);
    assert_eq!(values[0][0], "APAC");
    let total: u64 = values.iter().map(|r| r[1].as_u64().unwrap()).sum();
    assert_eq!(total, 2_000);
    assert_eq!(artifacts(&f), before, "a value is not stored");

    // Over `value_rows` rows: a table, every row of it, and a note that says why.
    let v = sql_ok(
        &f,
        json!({"sql": "SELECT * FROM sales", "inputs": {"sales": sales}, "store_as": "value"}),
    )
    .await;
    assert!(v.get("values").is_none(), "{v}");
    assert_eq!(v["rows"], 2_000);
    let notes = v["notes"].to_string();
    assert!(
        notes.contains("more than 100 rows: stored as a table"),
        "{notes}"
    );
    let stored_ref = v["dataRef"].as_str().unwrap();
    let all = stored(&f, stored_ref);
    let original = stored(&f, &sales);
    assert_eq!(
        all.rows, original.rows,
        "no row lost on the way to the table"
    );

    // Few rows but long ones: over the character budget, stored too.
    let v = sql_ok(
        &f,
        json!({
            "sql": "SELECT line, repeat(line, 8) AS long FROM sales GROUP BY line \
                    ORDER BY line LIMIT 90",
            "inputs": {"sales": sales},
            "store_as": "value",
        }),
    )
    .await;
    assert!(v.get("values").is_none(), "{v}");
    assert_eq!(v["rows"], 90);
    let notes = v["notes"].to_string();
    assert!(notes.contains("the 90 rows are more than"), "{notes}");
    assert_eq!(artifacts(&f), before + 2);
}

/// The seed's question, answered in one query: what the model reads.
#[tokio::test(flavor = "multi_thread")]
async fn the_seed_question_in_sql() {
    let f = fixture();
    let sales = fetch(&f).await;
    let o = run(
        &f,
        ToolCall::new(
            "run_sql",
            json!({"sql": QOQ_SQL, "inputs": {"sales": sales}, "store_as": "value"}),
        ),
    )
    .await;
    assert!(!o.is_error(), "{}", o.text);
    insta::assert_snapshot!("sql_seed_question", o.text);
}
