//! `dataref bench load`: files into tables, and a lake queried where it lies, against the
//! tools people would otherwise use, on the same files in the same run.
//!
//! - **CSV**: the sample's rows exported as a CSV file (10M rows, about 0.9 GB by default),
//!   loaded into a stored table as `load_file` does it (`dataref_load::open`, every batch
//!   written to the store), against DuckDB's `read_csv` into Arrow and pandas' `read_csv`.
//! - **XLSX**: 100k rows as a workbook, against pandas' `read_excel` (openpyxl).
//! - **Parquet lake**: the rows as Parquet files under Hive folders (`region=…/`), one
//!   aggregate with a partition filter through a `files` source's engine path
//!   (`Query::start_with(Tables::Lake)`), against DuckDB's `read_parquet` with
//!   `hive_partitioning` on the same files.
//!
//! - **MySQL**: a throwaway MariaDB server (Debian's `mariadb-server`, started by the
//!   bench) with 1M rows of six typed columns, fetched into a stored table by the MySQL
//!   producer (`dataref_sources::mysql::fetch`, as `query` runs it), against the `mariadb`
//!   client's own `--batch --quick` output of the same statement to `/dev/null`.
//!
//! Each load runs in a process of its own, so its peak resident memory (VmHWM, or
//! `ru_maxrss` for Python) is its own. The files are kept in `<dir>/load/` between runs.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use dataref_config::Config;
use dataref_export::{ExportOptions, Format};
use dataref_store::{ArtifactStore, Lineage};
use serde_json::{Value, json};

use super::{bench_store, f, fetch_sample, group, mb, median, peak_rss_bytes, run_json};

#[derive(Debug, Args)]
pub struct LoadArgs {
    /// Rows of the CSV file and of the Parquet lake.
    #[arg(long, default_value_t = 10_000_000, value_name = "N")]
    rows: u64,
    /// Rows of the XLSX workbook.
    #[arg(long, default_value_t = 100_000, value_name = "N")]
    xlsx_rows: u64,
    /// Rows of the MySQL table (0 skips the MySQL section).
    #[arg(long, default_value_t = 1_000_000, value_name = "N")]
    mysql_rows: u64,
    /// Timed runs of each lake query (the median is reported), after one warm-up.
    #[arg(long, default_value_t = 5, value_name = "N")]
    runs: usize,
    /// Python with pandas, openpyxl and duckdb. Default: the top-level `--python`.
    #[arg(long)]
    python: Option<String>,
    /// Where the files are kept between runs. Default: the top-level `--dir`, else
    /// `<data dir>/bench`.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// The file to load.
    #[arg(long)]
    file: PathBuf,
    /// A scratch directory for the store.
    #[arg(long)]
    dir: PathBuf,
    /// Only read the file: every batch built and dropped (no receipt hash, no store).
    #[arg(long)]
    read_only: bool,
}

/// Loads one file into a fresh store, as `load_file` does, and reports its time and peak.
pub fn worker(a: &WorkerArgs) -> Result<Value> {
    let (store_dir, store) = bench_store(&a.dir)?;
    let owner = dataref_protocol::Principal::new("bench")?;
    let name = a.file.display().to_string();
    let t = Instant::now();
    let file = std::fs::File::open(&a.file).with_context(|| format!("opening `{name}`"))?;
    if a.read_only {
        let options = dataref_load::LoadOptions::default();
        let mut opened = dataref_load::open(file, &name, &options, &|| false)?;
        let mut rows = 0;
        while let Some(batch) = opened.batches.next_batch()? {
            rows += batch.num_rows();
        }
        return Ok(json!({
            "rows": rows,
            "secs": t.elapsed().as_secs_f64(),
            "peak_rss_bytes": peak_rss_bytes(),
        }));
    }
    // The receipt's hash of the file, as `load_file` takes it once the file is open.
    let hashed = file.try_clone()?;
    let mut opened =
        dataref_load::open(file, &name, &dataref_load::LoadOptions::default(), &|| {
            false
        })?;
    dataref_store::Checksum::of_file(&hashed)?;
    let meta = dataref_builtins::load_into(
        store.as_ref(),
        &owner,
        opened.batches.as_mut(),
        Lineage::new("bench", json!({})),
        &|_| {},
        &|| false,
    )
    .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let secs = t.elapsed().as_secs_f64();
    let out = json!({
        "rows": meta.rows,
        "secs": secs,
        "peak_rss_bytes": peak_rss_bytes(),
        "notes": opened.notes,
    });
    let _ = std::fs::remove_dir_all(store_dir);
    Ok(out)
}

const PY_LOAD: &str = r#"
import json, resource, sys, time
kind, path = sys.argv[1], sys.argv[2]
t = time.perf_counter()
if kind == "duckdb_csv":
    import duckdb
    rel = duckdb.sql(f"SELECT * FROM read_csv('{path}')")
    table = rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.fetch_arrow_table()
    rows, version = table.num_rows, duckdb.__version__
elif kind == "pandas_csv":
    import pandas as pd
    df = pd.read_csv(path)
    rows, version = len(df), pd.__version__
elif kind == "pandas_xlsx":
    import pandas as pd
    df = pd.read_excel(path, engine="openpyxl")
    rows, version = len(df), pd.__version__
else:
    raise SystemExit(f"unknown kind {kind}")
secs = time.perf_counter() - t
print(json.dumps({"rows": rows, "secs": secs, "version": version,
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"#;

const PY_LAKE: &str = r#"
import json, statistics, sys, time
import duckdb
path, sql, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
con = duckdb.connect()
q = sql.replace("FROM sales", f"FROM read_parquet('{path}/**/*.parquet', hive_partitioning = true)")
answer = con.execute(q).fetchall()
times = []
for _ in range(runs):
    t = time.perf_counter()
    con.execute(q).fetchall()
    times.append(time.perf_counter() - t)
print(json.dumps({"secs": statistics.median(times), "rows": len(answer),
                  "answer": [[str(v) for v in r] for r in answer], "version": duckdb.__version__}))
"#;

/// The lake query: one region's revenue per product line, the partition filter pruning
/// four of five folders.
const LAKE_SQL: &str = "SELECT line, round(sum(revenue), 2) AS revenue FROM sales \
                        WHERE region = 'EMEA' GROUP BY line ORDER BY revenue DESC, line LIMIT 5";

pub fn run(a: &LoadArgs, python: &str, dir: Option<&Path>) -> Result<()> {
    let python = a.python.as_deref().unwrap_or(python);
    let home = dataref_app::home(None)?;
    let dir = a
        .dir
        .as_deref()
        .or(dir)
        .map_or_else(|| home.join("bench"), Path::to_path_buf);
    let files = dir.join("load");
    std::fs::create_dir_all(&files).with_context(|| format!("creating `{}`", files.display()))?;
    let exe = std::env::current_exe().context("finding the dataref-bench executable")?;
    let csv = files.join(format!("sales-{}.csv", a.rows));
    let xlsx = files.join(format!("sales-{}.xlsx", a.xlsx_rows));
    let lake = files.join(format!("lake-{}", a.rows));
    prepare(&dir, a.rows, &csv, Format::Csv)?;
    prepare(&dir, a.xlsx_rows, &xlsx, Format::Xlsx)?;
    prepare_lake(&dir, a.rows, &lake)?;
    let csv_bytes = std::fs::metadata(&csv).map_or(0, |m| m.len());

    let worker = |file: &Path, read_only: bool| -> Result<Value> {
        let mut cmd = Command::new(&exe);
        cmd.args(["bench-worker", "load", "--file"])
            .arg(file)
            .arg("--dir")
            .arg(&dir);
        if read_only {
            cmd.arg("--read-only");
        }
        run_json(&mut cmd)
    };
    let ours = |file: &Path| -> Result<Value> {
        dataref_app::progress_line(&format!("loading {} with dataref…", file.display()));
        worker(file, false)
    };
    let theirs = |kind: &str, file: &Path| -> Result<Value> {
        dataref_app::progress_line(&format!("loading {} with {kind}…", file.display()));
        run_json(Command::new(python).args(["-c", PY_LOAD, kind]).arg(file))
    };
    let csv_ours = ours(&csv)?;
    dataref_app::progress_line(&format!("reading {} with dataref…", csv.display()));
    let csv_read = worker(&csv, true)?;
    let csv_duck = theirs("duckdb_csv", &csv)?;
    let csv_pandas = theirs("pandas_csv", &csv)?;
    let xlsx_ours = ours(&xlsx)?;
    let xlsx_pandas = theirs("pandas_xlsx", &xlsx)?;
    for (who, v) in [
        ("DuckDB", &csv_duck),
        ("pandas", &csv_pandas),
        ("dataref's reader", &csv_read),
    ] {
        if v["rows"] != csv_ours["rows"] {
            bail!(
                "{who} read {} rows of the CSV, dataref {}",
                v["rows"],
                csv_ours["rows"]
            );
        }
    }
    if xlsx_pandas["rows"] != xlsx_ours["rows"] {
        bail!(
            "pandas read {} rows of the workbook, dataref {}",
            xlsx_pandas["rows"],
            xlsx_ours["rows"]
        );
    }

    dataref_app::progress_line("querying the Parquet lake…");
    let (lake_secs, lake_answer) = lake_query(&lake, a.runs)?;
    let duck_lake = run_json(
        Command::new(python)
            .args(["-c", PY_LAKE])
            .arg(&lake)
            .arg(LAKE_SQL)
            .arg(a.runs.max(1).to_string()),
    )?;
    let theirs_answer: Vec<Vec<String>> =
        serde_json::from_value(duck_lake["answer"].clone()).unwrap_or_default();
    if theirs_answer != lake_answer {
        bail!("the lake query's answers differ: dataref {lake_answer:?}, DuckDB {theirs_answer:?}");
    }

    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "\ndataref bench load — {} cores; DuckDB {}, pandas {}",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        csv_duck["version"].as_str().unwrap_or("?"),
        csv_pandas["version"].as_str().unwrap_or("?"),
    )?;
    writeln!(
        out,
        "\nCSV, {} rows, {} (the sample's 7 columns) into a table",
        group(a.rows),
        mb(csv_bytes as f64)
    )?;
    writeln!(out, "| loader | time | rows/s | peak RSS | vs dataref |")?;
    writeln!(out, "|---|---:|---:|---:|---:|")?;
    let base = f(&csv_ours, "secs");
    for (name, v) in [
        ("dataref load_file (into the store, durable)", &csv_ours),
        ("dataref's reader alone (batches dropped)", &csv_read),
        ("DuckDB read_csv → Arrow", &csv_duck),
        ("pandas read_csv", &csv_pandas),
    ] {
        let secs = f(v, "secs");
        writeln!(
            out,
            "| {name} | {secs:.2} s | {} | {} | {:.2}× |",
            group((a.rows as f64 / secs) as u64),
            mb(f(v, "peak_rss_bytes")),
            secs / base
        )?;
    }
    writeln!(
        out,
        "\nXLSX, {} rows, {}",
        group(a.xlsx_rows),
        mb(std::fs::metadata(&xlsx).map_or(0, |m| m.len()) as f64)
    )?;
    writeln!(out, "| loader | time | peak RSS | vs dataref |")?;
    writeln!(out, "|---|---:|---:|---:|")?;
    let base = f(&xlsx_ours, "secs");
    for (name, v) in [
        ("dataref load_file", &xlsx_ours),
        ("pandas read_excel (openpyxl)", &xlsx_pandas),
    ] {
        let secs = f(v, "secs");
        writeln!(
            out,
            "| {name} | {secs:.2} s | {} | {:.2}× |",
            mb(f(v, "peak_rss_bytes")),
            secs / base
        )?;
    }
    writeln!(
        out,
        "\nParquet lake, {} rows in 5 `region=…` folders: `{LAKE_SQL}` (median of {})",
        group(a.rows),
        a.runs.max(1)
    )?;
    writeln!(out, "| engine | time | vs dataref |")?;
    writeln!(out, "|---|---:|---:|")?;
    let duck = f(&duck_lake, "secs");
    writeln!(
        out,
        "| dataref (`files` source, engine) | {:.1} ms | 1.00× |",
        lake_secs * 1e3
    )?;
    writeln!(
        out,
        "| DuckDB read_parquet (hive_partitioning) | {:.1} ms | {:.2}× |",
        duck * 1e3,
        duck / lake_secs
    )?;
    drop(out);
    if a.mysql_rows > 0 {
        let m = mysql_fetch(&dir, a.mysql_rows, a.runs)?;
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "\nMySQL ({}), {} rows × 6 columns: `{MYSQL_SQL}` (median of {})",
            m.version,
            group(a.mysql_rows),
            a.runs.max(1)
        )?;
        writeln!(out, "| reader | time | rows/s | vs dataref |")?;
        writeln!(out, "|---|---:|---:|---:|")?;
        writeln!(
            out,
            "| dataref (`query`, into a stored table) | {:.2} s | {} | 1.00× |",
            m.ours,
            group((a.mysql_rows as f64 / m.ours) as u64)
        )?;
        writeln!(
            out,
            "| mariadb --batch --quick > /dev/null | {:.2} s | {} | {:.2}× |",
            m.client,
            group((a.mysql_rows as f64 / m.client) as u64),
            m.client / m.ours
        )?;
    }
    Ok(())
}

const MYSQL_SQL: &str = "SELECT id, region, units, revenue, day, note FROM sales";

struct MysqlNumbers {
    version: String,
    ours: f64,
    client: f64,
}

/// A throwaway MariaDB with `rows` rows; the median of `runs` fetches each way.
fn mysql_fetch(dir: &Path, rows: u64, runs: usize) -> Result<MysqlNumbers> {
    use std::sync::Arc;

    dataref_app::progress_line("starting MariaDB and filling the MySQL table…");
    let db = dataref_test_support::TestMariadb::start()?;
    db.execute(&format!(
        "CREATE DATABASE shop;
         CREATE TABLE shop.sales (id INT PRIMARY KEY, region VARCHAR(8), units INT,
                                  revenue DECIMAL(12,2), day DATE, note VARCHAR(40));
         INSERT INTO shop.sales
           SELECT seq, ELT(1 + seq % 5, 'EU', 'US', 'APAC', 'LATAM', 'MEA'), seq % 40 + 1,
                  (seq % 100000) / 100, DATE '2024-01-01' + INTERVAL (seq % 730) DAY,
                  CONCAT('order note ', seq)
           FROM shop.seq_1_to_{rows};
         CREATE USER bench IDENTIFIED BY 'bench';
         GRANT SELECT ON shop.* TO bench;"
    ))?;
    let version = db.query("SELECT VERSION()")?.trim().to_owned();
    let (store_dir, store) = bench_store(dir)?;
    let source = dataref_config::SourceConfig {
        name: "shop".into(),
        kind: dataref_config::SourceKind::Mysql {
            url: db.url("bench", "bench", "shop"),
            allow_shared_login: false,
        },
        sample_rows: 2,
        max_value_chars: 80,
        max_rows: u64::MAX,
        timeout: std::time::Duration::from_secs(600),
        allow_sql: true,
    };
    let mysql = dataref_sources::mysql::MysqlSource::with_env(
        "shop",
        &db.url("bench", "bench", "shop"),
        Arc::new(|_| None),
    );
    let login = dataref_sources::mysql::Login {
        principal: "bench".into(),
        user: None,
        password: None,
    };
    let owner = dataref_protocol::Principal::new("bench")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let declared = std::collections::BTreeMap::new();
    let ours_once = || -> Result<f64> {
        let req = dataref_sources::FetchRequest {
            source: &source,
            sql: MYSQL_SQL,
            params: Vec::new(),
            declared: &declared,
            policy: dataref_sources::SqlPolicy::Generic,
        };
        let t = Instant::now();
        let fetched = rt.block_on(dataref_sources::mysql::fetch(
            &mysql,
            &login,
            &req,
            store.as_ref(),
            &owner,
            Lineage::new("bench", json!({})),
            &|_| {},
            &|| false,
        ))?;
        let secs = t.elapsed().as_secs_f64();
        if fetched.meta.rows != rows {
            bail!("dataref fetched {} rows of {rows}", fetched.meta.rows);
        }
        Ok(secs)
    };
    let client = ["mariadb", "mysql"]
        .into_iter()
        .find(|c| Command::new(c).arg("--version").output().is_ok())
        .context("the `mariadb` client (apt-get install mariadb-client)")?;
    let client_once = || -> Result<f64> {
        let t = Instant::now();
        let status = Command::new(client)
            .args(["--no-defaults", "--batch", "--quick", "-h127.0.0.1"])
            .arg(format!("-P{}", db.port()))
            .args(["-ubench", "-pbench", "shop", "-e", MYSQL_SQL])
            .stdout(std::process::Stdio::null())
            .status()?;
        if !status.success() {
            bail!("the mariadb client failed: {status}");
        }
        Ok(t.elapsed().as_secs_f64())
    };
    dataref_app::progress_line("fetching from MySQL, each way…");
    ours_once()?;
    client_once()?;
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    for _ in 0..runs.max(1) {
        ours.push(ours_once()?);
        theirs.push(client_once()?);
    }
    drop(store);
    let _ = std::fs::remove_dir_all(&store_dir);
    Ok(MysqlNumbers {
        version,
        ours: median(&mut ours),
        client: median(&mut theirs),
    })
}

/// The `rows`-row sample exported to `path` as `format`, unless it is there already.
fn prepare(dir: &Path, rows: u64, path: &Path, format: Format) -> Result<()> {
    if path.exists() {
        return Ok(());
    }
    dataref_app::progress_line(&format!("writing {} ({rows} rows)…", path.display()));
    let config = Config::builtin_sample(dir.to_path_buf(), rows);
    dataref_app::ensure_sample(&config)?;
    let fetched = fetch_sample(dir, rows)?;
    let table = fetched
        .store
        .open_table(&fetched.owner, &fetched.meta.data_ref)?;
    let tmp = path.with_extension("tmp");
    let file = std::fs::File::create(&tmp)?;
    dataref_export::export(
        format,
        &table.meta.schema,
        &table.batches,
        &ExportOptions::default(),
        BufWriter::with_capacity(1 << 20, file),
        &|| false,
    )?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// The sample as Parquet, one file per `region=…` folder, unless it is there already.
fn prepare_lake(dir: &Path, rows: u64, lake: &Path) -> Result<()> {
    if lake.exists() {
        return Ok(());
    }
    dataref_app::progress_line(&format!(
        "writing the lake {} ({rows} rows)…",
        lake.display()
    ));
    let config = Config::builtin_sample(dir.to_path_buf(), rows);
    dataref_app::ensure_sample(&config)?;
    let fetched = fetch_sample(dir, rows)?;
    let table = fetched
        .store
        .open_table(&fetched.owner, &fetched.meta.data_ref)?;
    let schema = table.meta.schema.clone();
    let region = schema.index_of("region")?;
    let tmp = lake.with_extension("tmp");
    let _ = std::fs::remove_dir_all(&tmp);
    let mut regions: Vec<String> = Vec::new();
    for b in &table.batches {
        let col = arrow_cast::cast(b.column(region), &arrow_schema::DataType::Utf8)?;
        let col = col
            .as_any()
            .downcast_ref::<arrow_array::StringArray>()
            .context("region is text")?;
        for v in col.iter().flatten() {
            if !regions.iter().any(|r| r == v) {
                regions.push(v.to_owned());
            }
        }
    }
    let keep: Vec<usize> = (0..schema.fields().len())
        .filter(|i| *i != region)
        .collect();
    for r in &regions {
        let folder = tmp.join(format!("region={r}"));
        std::fs::create_dir_all(&folder)?;
        let mut parts = Vec::new();
        for b in &table.batches {
            let col = arrow_cast::cast(b.column(region), &arrow_schema::DataType::Utf8)?;
            let col = col
                .as_any()
                .downcast_ref::<arrow_array::StringArray>()
                .context("region is text")?;
            let mask: arrow_array::BooleanArray =
                col.iter().map(|v| Some(v == Some(r.as_str()))).collect();
            let kept = arrow_select::filter::filter_record_batch(b, &mask)?;
            parts.push(kept.project(&keep)?);
        }
        let projected = std::sync::Arc::new(schema.project(&keep)?);
        let file = std::fs::File::create(folder.join("part-0.parquet"))?;
        dataref_export::export(
            Format::Parquet,
            &projected,
            &parts,
            &ExportOptions::default(),
            BufWriter::with_capacity(1 << 20, file),
            &|| false,
        )?;
    }
    std::fs::rename(&tmp, lake)?;
    Ok(())
}

/// The lake query through a `files` source's engine path: the median time of `runs` after
/// a warm-up, and its answer as text.
fn lake_query(lake: &Path, runs: usize) -> Result<(f64, Vec<Vec<String>>)> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let location = format!("{}/", lake.display());
    let once = || -> Result<(f64, Vec<Vec<String>>)> {
        rt.block_on(async {
            let t = Instant::now();
            let mut q = dataref_sql::Query::start_with(
                LAKE_SQL,
                dataref_sql::Tables::Lake(dataref_sql::Lake::local("sales", &location, None)),
                Vec::new(),
                &dataref_sql::QueryLimits::default(),
            )
            .await?;
            let mut batches = Vec::new();
            while let Some(b) = q.next_batch().await? {
                batches.push(b);
            }
            let secs = t.elapsed().as_secs_f64();
            let mut rows = Vec::new();
            for b in &batches {
                for i in 0..b.num_rows() {
                    let mut row = Vec::new();
                    for c in b.columns() {
                        row.push(arrow_cast::display::array_value_to_string(c, i)?);
                    }
                    rows.push(row);
                }
            }
            Ok((secs, rows))
        })
    };
    let (_, answer) = once()?;
    let mut times = Vec::new();
    for _ in 0..runs.max(1) {
        times.push(once()?.0);
    }
    Ok((median(&mut times), answer))
}
