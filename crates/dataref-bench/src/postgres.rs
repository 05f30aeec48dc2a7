//! `dataref bench --pg`: a throwaway PostgreSQL server with a mixed-type table, fetched in
//! one run by dataref (the `query` tool's path: pool, read-only transaction as a role,
//! portal, binary decode into Arrow, the artifact written), by `pandas.read_sql` over
//! psycopg, and by a raw `COPY … TO STDOUT (FORMAT binary)` read and discarded (the
//! practical limit of the server and the socket).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use dataref_config::{SourceConfig, SourceKind};
use dataref_protocol::Principal;
use dataref_sources::postgres::PgPool;
use dataref_sources::{FetchRequest, Sources, SqlPolicy};
use dataref_store::Lineage;
use dataref_test_support::TestPostgres;
use futures_util::StreamExt;
use serde_json::json;

use super::{bench_store, f, run_json};

const SQL: &str = "SELECT id, amount, name, day, at, flag FROM bench";
const RUNS: usize = 3;

const PANDAS_SCRIPT: &str = r#"
import json, resource, sys, time, warnings
import pandas as pd, psycopg
conninfo, sql = sys.argv[1], sys.argv[2]
warnings.simplefilter("ignore")  # pandas asks for SQLAlchemy; a DBAPI connection works
con = psycopg.connect(conninfo)
best = None
for _ in range(2):
    t = time.perf_counter()
    df = pd.read_sql(sql, con)
    secs = time.perf_counter() - t
    best = secs if best is None else min(best, secs)
print(json.dumps({"rows": len(df), "fetch_secs": best, "pandas": pd.__version__,
                  "psycopg": psycopg.__version__,
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"#;

pub(super) fn section(
    rows: u64,
    python: &str,
    dir: &Path,
    pandas: Option<&str>,
    out: &mut impl Write,
) -> Result<()> {
    dataref_app::progress_line("starting a throwaway PostgreSQL server…");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let pg = TestPostgres::start()?;
    dataref_app::progress_line(&format!("loading {rows} rows…"));
    let load = format!(
        "CREATE ROLE dataref_login LOGIN NOINHERIT;
         CREATE ROLE bench_reader LOGIN;
         GRANT bench_reader TO dataref_login;
         CREATE TABLE bench AS SELECT g::int8 AS id,
           (random() * 100000)::numeric(12,2) AS amount,
           'customer ' || (g % 5000) AS name,
           date '2020-01-01' + (g % 2000)::int AS day,
           timestamptz '2020-01-01 00:00:00+00' + g * interval '17 seconds' AS at,
           g % 3 = 0 AS flag
         FROM generate_series(1, {rows}) g;
         GRANT SELECT ON bench TO bench_reader;"
    );
    runtime.block_on(pg.execute(&load))?;
    // VACUUM cannot share a multi-statement batch (an implicit transaction).
    runtime.block_on(pg.execute("VACUUM ANALYZE bench"))?;
    let conninfo = pg.conninfo("dataref_login");

    // The raw binary COPY, twice to warm the caches, then measured.
    dataref_app::progress_line("measuring raw COPY (binary)…");
    let client = runtime.block_on(pg.client())?;
    let copy = |client: &tokio_postgres::Client| -> Result<(Duration, u64)> {
        runtime.block_on(async {
            let t = Instant::now();
            let stream = client
                .copy_out(&format!("COPY ({SQL}) TO STDOUT (FORMAT binary)"))
                .await?;
            let mut stream = std::pin::pin!(stream);
            let mut bytes = 0u64;
            while let Some(chunk) = stream.next().await {
                bytes += chunk?.len() as u64;
            }
            Ok((t.elapsed(), bytes))
        })
    };
    copy(&client)?;
    let mut copy_best = Duration::MAX;
    let mut copy_bytes = 0;
    for _ in 0..RUNS {
        let (d, b) = copy(&client)?;
        copy_best = copy_best.min(d);
        copy_bytes = b;
    }

    // dataref: the `query` tool's path (a blocking thread, the source's pool, the role).
    dataref_app::progress_line("measuring dataref fetch → artifact…");
    let (store_dir, store) = bench_store(dir)?;
    let source = SourceConfig {
        name: "bench".into(),
        kind: SourceKind::Postgres {
            url: conninfo.clone(),
            pool_size: 1,
            allow_sql_shared_roles: false,
        },
        sample_rows: 5,
        max_value_chars: 80,
        max_rows: u64::MAX,
        timeout: Duration::from_secs(600),
        allow_sql: true,
    };
    let sources = Arc::new(Sources::default().with_pool(PgPool::new("bench", &conninfo, 1)));
    let fetch_once = || -> Result<(Duration, u64, u64)> {
        let (sources, store, source) = (sources.clone(), store.clone(), source.clone());
        runtime.block_on(async move {
            tokio::task::spawn_blocking(move || {
                let declared = BTreeMap::new();
                let req = FetchRequest {
                    source: &source,
                    sql: SQL,
                    params: Vec::new(),
                    declared: &declared,
                    policy: SqlPolicy::Generic,
                };
                let owner = Principal::new("bench_reader")?;
                let t = Instant::now();
                let fetched = sources.fetch(
                    &req,
                    store.as_ref(),
                    &owner,
                    Lineage::new("bench", json!({})),
                    &|_| {},
                    &|| false,
                )?;
                let took = t.elapsed();
                Ok((took, fetched.meta.rows, fetched.meta.bytes))
            })
            .await?
        })
    };
    fetch_once()?;
    let mut ours_best = Duration::MAX;
    let mut ours_rows = 0;
    let mut ours_bytes = 0;
    for _ in 0..RUNS {
        let (d, r, b) = fetch_once()?;
        ours_best = ours_best.min(d);
        (ours_rows, ours_bytes) = (r, b);
    }
    let _ = std::fs::remove_dir_all(&store_dir);

    let theirs = match pandas {
        Some(_) => {
            dataref_app::progress_line("measuring pandas.read_sql (psycopg)…");
            match run_json(
                Command::new(python)
                    .args(["-c", PANDAS_SCRIPT])
                    // The superuser, as the COPY: no role switch on this path.
                    .arg(pg.conninfo("postgres"))
                    .arg(SQL),
            ) {
                Ok(v) => Some(v),
                Err(e) => {
                    dataref_app::progress_line(&format!(
                        "pandas.read_sql with psycopg failed ({e:#}); the comparison is skipped\nhint: `scripts/bench` installs psycopg[binary] into its venv"
                    ));
                    None
                }
            }
        }
        None => None,
    };

    let ours = ours_best.as_secs_f64();
    let raw = copy_best.as_secs_f64();
    writeln!(
        out,
        "\nPostgreSQL ({rows} rows: int8, numeric(12,2), text, date, timestamptz, bool; best of {RUNS})"
    )?;
    writeln!(out)?;
    writeln!(out, "| path | time | rows/s | dataref vs it |")?;
    writeln!(out, "|---|---:|---:|---:|")?;
    writeln!(
        out,
        "| dataref fetch → artifact ({:.0} MB Arrow) | {ours:.3} s | {:.2} M | – |",
        ours_bytes as f64 / 1e6,
        ours_rows as f64 / ours / 1e6
    )?;
    let pandas_secs = theirs.as_ref().map(|t| f(t, "fetch_secs"));
    if let (Some(t), Some(p)) = (&theirs, pandas_secs) {
        writeln!(
            out,
            "| pandas {} `read_sql` (psycopg {}) | {p:.3} s | {:.2} M | {:.1}× faster |",
            t["pandas"].as_str().unwrap_or("?"),
            t["psycopg"].as_str().unwrap_or("?"),
            rows as f64 / p / 1e6,
            p / ours
        )?;
    }
    writeln!(
        out,
        "| raw `COPY … (FORMAT binary)`, discarded ({:.0} MB) | {raw:.3} s | {:.2} M | {:.2}× its time |",
        copy_bytes as f64 / 1e6,
        rows as f64 / raw / 1e6,
        ours / raw
    )?;
    let vs_pandas = pandas_secs.map(|p| p / ours);
    writeln!(
        out,
        "\ngoals: ≥ 3× faster than pandas ({}); ≤ 2× raw COPY ({:.2}×: {})",
        vs_pandas.map_or("not measured".into(), |v| format!(
            "{v:.1}×: {}",
            if v >= 3.0 { "met" } else { "NOT met" }
        )),
        ours / raw,
        if ours / raw <= 2.0 { "met" } else { "NOT met" }
    )?;
    Ok(())
}
