//! `dataref bench shared`: what sharing the store across replicas costs, against the local
//! store in the same run. Real parts, started here: SeaweedFS's S3 server (`weed mini`), a
//! throwaway PostgreSQL, HAProxy, and the release `dataref` beside this binary.
//!
//! - **Fetch and read back.** The sample's `fetch_sales` into the local store and into the
//!   shared one (replica A: the upload and the index row included); then the table read
//!   back whole (`open_table`: owner check, the file, every column decoded) by a fresh
//!   store each time — locally; on replica B the first time (B downloads it into its
//!   cache); and on B again (from its cache). Beside them, the same object's GET alone
//!   (the same S3 client, its bytes counted and dropped): the floor of any first read.
//!   And two of the seven columns, as `run_sql` reads them (`map_columns`), on a replica
//!   that has never read the table: only the pieces they lie in are fetched; the bytes
//!   fetched are the file of parts' blocks on disk.
//! - **Load.** 50 clients × 100 stateless MCP calls (`describe_data` of one column of the
//!   fetched table, and `list_artifacts`, alternately) through HAProxy to 1 replica, then
//!   to 2, with the latency of every call.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use dataref_config::{Config, SharedConfig};
use dataref_protocol::Principal;
use dataref_store::{ArtifactStore, LocalStore, StoreLimits, SystemClock};
use dataref_test_support::{
    HaproxyOptions, HealthCheck, ServeHttp, TestHaproxy, TestPostgres, TestS3,
};
use serde_json::{Value, json};

use super::{group, median};

#[derive(Debug, Args)]
pub struct SharedArgs {
    /// Rows of the sample (the table is its `fetch_sales(since = "2025-01-01")`).
    #[arg(long, default_value_t = 1_000_000)]
    rows: u64,
    /// Timed runs of each fetch and read (the median is reported).
    #[arg(long, default_value_t = 5, value_name = "N")]
    runs: usize,
    /// Clients of the load test, and calls each makes.
    #[arg(long, default_value_t = 50)]
    clients: usize,
    #[arg(long, default_value_t = 100)]
    calls: usize,
    /// Where sample databases are kept between runs. Default: the top-level `--dir`, else
    /// `<data dir>/bench`.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

/// The bench's work dir, removed at the end (the stores, the replicas' homes).
struct Work(PathBuf);

impl Work {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `dataref token new bench`: the token and its `[principals.bench]` lines.
fn new_token(bin: &Path) -> Result<(String, String)> {
    let out = Command::new(bin).args(["token", "new", "bench"]).output()?;
    if !out.status.success() {
        bail!(
            "`dataref token new`: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stdout = String::from_utf8(out.stdout)?;
    let token = stdout
        .lines()
        .find_map(|l| l.strip_prefix("token: "))
        .context("a token line")?
        .to_owned();
    let lines: String = stdout
        .lines()
        .skip_while(|l| !l.starts_with("[principals."))
        .map(|l| format!("{l}\n"))
        .collect();
    Ok((token, lines))
}

pub fn run(args: &SharedArgs, dir: Option<&Path>) -> Result<()> {
    let dir = match args.dir.as_deref().or(dir) {
        Some(d) => d.to_path_buf(),
        None => dataref_app::home(None)?.join("bench"),
    };
    std::fs::create_dir_all(&dir)?;
    let config = Config::builtin_sample(dir.clone(), args.rows);
    dataref_app::ensure_sample(&config)?;
    let work = Work(dir.join(format!("shared-{}", std::process::id())));
    std::fs::create_dir_all(work.path())?;
    dataref_app::progress_line("starting SeaweedFS and PostgreSQL…");
    let s3 = TestS3::start()?;
    let pg = TestPostgres::start()?;
    let shared = SharedConfig {
        bucket: s3.bucket().to_owned(),
        prefix: "bench".into(),
        endpoint: Some(s3.endpoint()),
        region: s3.region().to_owned(),
        index: pg.url("postgres"),
        index_ca: None,
        cache_bytes: 64 << 30,
        index_pool: 8,
        timeout: Duration::from_secs(60),
    };
    let lookup = {
        let (k, s) = (s3.access_key().to_owned(), s3.secret_key().to_owned());
        move |name: &str| match name {
            "AWS_ACCESS_KEY_ID" => Some(k.clone()),
            "AWS_SECRET_ACCESS_KEY" => Some(s.clone()),
            _ => None,
        }
    };
    let limits = StoreLimits {
        max_artifact_bytes: 64 << 30,
        owner_quota_bytes: 1 << 50,
        ..StoreLimits::default()
    };
    let owner = Principal::new("bench")?;

    // Fetch into each store, then read back.
    let local_home = work.path().join("local");
    let (home_a, home_b) = (work.path().join("replica-a"), work.path().join("replica-b"));
    let local = || -> Result<Arc<dyn ArtifactStore>> {
        Ok(Arc::new(LocalStore::open(
            &local_home,
            limits.clone(),
            Arc::new(SystemClock),
        )?))
    };
    let replica = |home: &Path| -> Result<Arc<dyn ArtifactStore>> {
        let s = dataref_replica::Shared::connect(&shared, home, &lookup)?;
        Ok(Arc::new(
            s.artifact_store(limits.clone(), Arc::new(SystemClock))?,
        ))
    };
    let (mut fetch_local, mut fetch_shared) = (Vec::new(), Vec::new());
    let (mut read_local, mut read_first, mut read_cached) = (Vec::new(), Vec::new(), Vec::new());
    let mut raw_get = Vec::new();
    let (mut read_parts, mut read_parts_local, mut fetched_parts) = (Vec::new(), Vec::new(), 0);
    let (mut raw_ranges, mut fetched_ranges) = (Vec::new(), 0);
    let raw = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut bytes = 0;
    dataref_app::progress_line(&format!(
        "fetching {} rows into each store, {} runs…",
        group(args.rows),
        args.runs
    ));
    for run in 0..args.runs {
        let t = Instant::now();
        let l = fetch(&config, local()?.as_ref(), &owner)?;
        fetch_local.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let s = fetch(&config, replica(&home_a)?.as_ref(), &owner)?;
        fetch_shared.push(t.elapsed().as_secs_f64());
        bytes = s.bytes;
        let t = Instant::now();
        read_all(local()?.as_ref(), &owner, &l.data_ref)?;
        read_local.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        read_columns(local()?.as_ref(), &owner, &l.data_ref, &TWO_COLUMNS)?;
        read_parts_local.push(t.elapsed().as_secs_f64());
        // B has never read it: the download is part of this read.
        let b = replica(&home_b.join(format!("run-{run}")))?;
        let t = Instant::now();
        read_all(b.as_ref(), &owner, &s.data_ref)?;
        read_first.push(t.elapsed().as_secs_f64());
        drop(b);
        // Two of the columns on a replica that has never read the table: only their parts.
        let home_c = home_b.join(format!("columns-{run}"));
        let c = replica(&home_c)?;
        let t = Instant::now();
        read_columns(c.as_ref(), &owner, &s.data_ref, &TWO_COLUMNS)?;
        read_parts.push(t.elapsed().as_secs_f64());
        drop(c);
        let extents = part_extents(&home_c)?;
        fetched_parts = extents.iter().map(|r| r.end - r.start).sum();
        fetched_ranges = extents.len();
        // The same object through the same S3 client, counted and dropped (nothing written,
        // nothing decoded): the floor of any first read through this store.
        let key = format!("{}/artifacts/{}.arrow", shared.prefix, s.data_ref);
        let t = Instant::now();
        let got = raw.block_on(get_counted(&s3, &key))?;
        raw_get.push(t.elapsed().as_secs_f64());
        anyhow::ensure!(got == s.bytes, "{key}: {got} of {} bytes", s.bytes);
        // The bytes the columns' read fetched, as ranged GETs alone, as many at once as it
        // makes: the floor of that read through this store.
        let t = Instant::now();
        let got = raw.block_on(get_ranges_counted(&s3, &key, &extents))?;
        raw_ranges.push(t.elapsed().as_secs_f64());
        anyhow::ensure!(
            got == fetched_parts,
            "{key}: {got} of {fetched_parts} bytes"
        );
        // A fresh store on the same replica home: the file is in its cache.
        let b = replica(&home_b.join(format!("run-{run}")))?;
        let t = Instant::now();
        read_all(b.as_ref(), &owner, &s.data_ref)?;
        read_cached.push(t.elapsed().as_secs_f64());
    }
    let mut out = std::io::stdout().lock();
    let (fl, fs) = (median(&mut fetch_local), median(&mut fetch_shared));
    let (rl, rf, rc, rg) = (
        median(&mut read_local),
        median(&mut read_first),
        median(&mut read_cached),
        median(&mut raw_get),
    );
    let (rp, rpl, rr) = (
        median(&mut read_parts),
        median(&mut read_parts_local),
        median(&mut raw_ranges),
    );
    writeln!(
        out,
        "\n### Shared store: fetch {} rows ({:.0} MB) and read them back, median of {}\n",
        group(args.rows),
        bytes as f64 / 1e6,
        args.runs
    )?;
    writeln!(
        out,
        "| step | local store | shared store | ÷ local | goal |"
    )?;
    writeln!(out, "|---|---:|---:|---:|---:|")?;
    writeln!(
        out,
        "| fetch → artifact (upload and index row on A) | {} | {} | {:.2}× | |",
        ms(fl),
        ms(fs),
        fs / fl
    )?;
    writeln!(
        out,
        "| read back on B, first time (download into B's cache) | {} | {} | {:.2}× | ≤ 3× |",
        ms(rl),
        ms(rf),
        rf / rl
    )?;
    writeln!(
        out,
        "| read back on B, cached | {} | {} | {:.2}× | ≤ 1.5× |",
        ms(rl),
        ms(rc),
        rc / rl
    )?;
    writeln!(
        out,
        "| 2 of 7 columns on a replica without the table (`{}`, `{}`; their parts only) | {} | {} | {:.2}× | |",
        TWO_COLUMNS[0],
        TWO_COLUMNS[1],
        ms(rpl),
        ms(rp),
        rp / rpl
    )?;
    writeln!(
        out,
        "| the same file's GET alone (S3 client, bytes dropped) | | {} | {:.2}× | |",
        ms(rg),
        rg / rl
    )?;
    writeln!(
        out,
        "| the ranges those 2 columns fetched, GETs alone ({RANGES_IN_FLIGHT} at once, bytes dropped) | | {} | {:.2}× | |",
        ms(rr),
        rr / rpl
    )?;
    writeln!(
        out,
        "\nThe first read on B (download, checksum, decode) against its floor, the GET alone: \
         {:.2}× (goal ≤ 1.2×, issue #29: {}).",
        rf / rg,
        if rf / rg <= 1.2 { "met" } else { "NOT met" }
    )?;
    writeln!(
        out,
        "Two of seven columns read on a replica without the table fetched {:.1} MB of {:.1} MB \
         ({:.0}%, {fetched_ranges} ranges), in {:.2}× the whole GET's time (goal ≤ 0.5×, issue #29: {}), and {:.2}× \
         the time of the same ranges' GETs alone.",
        fetched_parts as f64 / 1e6,
        bytes as f64 / 1e6,
        100.0 * fetched_parts as f64 / bytes.max(1) as f64,
        rp / rg,
        if rp / rg <= 0.5 { "met" } else { "NOT met" },
        rp / rr
    )?;

    // The load test, through HAProxy, one replica then two.
    let exe = std::env::current_exe()?;
    let bin = exe
        .parent()
        .map(|d| d.join("dataref"))
        .filter(|p| p.exists())
        .context("no `dataref` beside `dataref-bench`: build both (`scripts/bench` does)")?;
    let (token, principal) = new_token(&bin)?;
    let config_path = write_config(work.path(), &config, &s3, &shared, &principal)?;
    let mut rows_out = Vec::new();
    for replicas in [1, 2] {
        let mut children = Vec::new();
        let mut addrs = Vec::new();
        for i in 0..replicas {
            let home = work.path().join(format!("load-{replicas}-{i}"));
            let served = spawn(&bin, &home, &config_path, &s3, &pg)?;
            addrs.push(served.addr().parse()?);
            children.push(served);
        }
        let lb = TestHaproxy::start(
            &addrs,
            HaproxyOptions {
                health_check: HealthCheck::Http { path: "/".into() },
                ..HaproxyOptions::default()
            },
        )?;
        let (p50, p95, total, errors) = load(&lb.url(), &token, args.clients, args.calls)?;
        rows_out.push((replicas, p50, p95, total, errors));
        drop(lb);
        drop(children);
    }
    writeln!(
        out,
        "\n### {} clients × {} calls through HAProxy (`describe_data` of one column and \
         `list_artifacts`, alternately)\n",
        args.clients, args.calls
    )?;
    writeln!(out, "| replicas | p50 | p95 | calls/s | errors |")?;
    writeln!(out, "|---:|---:|---:|---:|---:|")?;
    for (replicas, p50, p95, total, errors) in rows_out {
        let calls = (args.clients * args.calls) as f64;
        writeln!(
            out,
            "| {replicas} | {} | {} | {:.0} | {errors} |",
            ms(p50),
            ms(p95),
            calls / total
        )?;
    }
    Ok(())
}

struct Fetched {
    data_ref: dataref_protocol::DataRef,
    bytes: u64,
}

fn fetch(config: &Config, store: &dyn ArtifactStore, owner: &Principal) -> Result<Fetched> {
    let meta = super::fetch_into(config, store, owner)?;
    Ok(Fetched {
        data_ref: meta.data_ref,
        bytes: meta.bytes,
    })
}

/// The whole table: owner check, the file (downloaded if needed), every column decoded and
/// every value touched once.
fn read_all(
    store: &dyn ArtifactStore,
    owner: &Principal,
    r: &dataref_protocol::DataRef,
) -> Result<()> {
    let table = store.open_table(owner, r)?;
    let mut nulls = 0usize;
    for b in &table.batches {
        for c in b.columns() {
            nulls += arrow_array::Array::logical_null_count(c.as_ref());
        }
    }
    std::hint::black_box(nulls);
    Ok(())
}

/// The two columns a query of a few columns reads (of the sample's seven).
const TWO_COLUMNS: [&str; 2] = ["region", "revenue"];

/// `columns` of the table, as `run_sql` reads them: the owner check, only their bytes
/// (fetched in parts when the table is kept elsewhere), decoded, every value touched once.
fn read_columns(
    store: &dyn ArtifactStore,
    owner: &Principal,
    r: &dataref_protocol::DataRef,
    columns: &[&str],
) -> Result<()> {
    let table = store.map_columns(owner, r)?;
    let projection = columns
        .iter()
        .map(|c| table.meta.schema.index_of(c))
        .collect::<Result<Vec<_>, _>>()?;
    let mut nulls = 0usize;
    for b in table.batches(Some(&projection))? {
        for c in b.columns() {
            nulls += arrow_array::Array::logical_null_count(c.as_ref());
        }
    }
    std::hint::black_box(nulls);
    Ok(())
}

/// The byte ranges holding data (not holes) in the file of parts under `home`: what a
/// replica fetched for a query's columns.
fn part_extents(home: &Path) -> Result<Vec<std::ops::Range<u64>>> {
    let mut todo = vec![home.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for e in std::fs::read_dir(&dir)?.flatten() {
            let path = e.path();
            if path.is_dir() {
                todo.push(path);
            } else if path.to_string_lossy().ends_with(".part") {
                return data_extents(&std::fs::File::open(&path)?);
            }
        }
    }
    bail!("no file of parts under {}", home.display())
}

fn data_extents(file: &std::fs::File) -> Result<Vec<std::ops::Range<u64>>> {
    use rustix::fs::{SeekFrom, seek};
    let len = file.metadata()?.len();
    let mut out = Vec::new();
    let mut at = 0;
    while at < len {
        let start = match seek(file, SeekFrom::Data(at)) {
            Ok(start) => start,
            // No data past `at`.
            Err(rustix::io::Errno::NXIO) => break,
            Err(e) => return Err(e.into()),
        };
        let end = seek(file, SeekFrom::Hole(start))?;
        out.push(start..end);
        at = end;
    }
    Ok(out)
}

/// As many ranged GETs at once as a replica makes for a table's parts.
const RANGES_IN_FLIGHT: usize = 4;

/// `ranges` of the object `key`, [`RANGES_IN_FLIGHT`] at a time, counted and dropped.
async fn get_ranges_counted(
    s3: &TestS3,
    key: &str,
    ranges: &[std::ops::Range<u64>],
) -> Result<u64> {
    use futures_util::StreamExt;
    use object_store::ObjectStoreExt;
    let store = s3_client(s3)?;
    let key = object_store::path::Path::from(key);
    let sizes: Vec<Result<u64>> = futures_util::stream::iter(ranges.iter().cloned())
        .map(|r| {
            let (store, key) = (&store, &key);
            async move { Ok(store.get_range(key, r).await?.len() as u64) }
        })
        .buffer_unordered(RANGES_IN_FLIGHT)
        .collect()
        .await;
    sizes.into_iter().sum()
}

fn ms(secs: f64) -> String {
    format!("{:.1} ms", secs * 1000.0)
}

fn write_config(
    dir: &Path,
    sample: &Config,
    s3: &TestS3,
    shared: &SharedConfig,
    principal: &str,
) -> Result<PathBuf> {
    let db = &sample.sample.as_ref().context("the sample")?.path;
    let path = dir.join("dataref.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[python]
enabled = false

[http]
rate_per_minute = 100000000
max_concurrent = 1000

[shared]
objects = "s3://{bucket}/bench-load"
endpoint = "{endpoint}"
index = "${{DATAREF_INDEX_URL}}"

[sources.sample]
kind = "sqlite"
path = "{db}"

[queries.sales]
source = "sample"
description = "Load sales on or after a date."
sql = "SELECT date, line, region, channel, units, revenue, discount FROM sales WHERE date >= :since ORDER BY date, id"
params.since = {{ type = "date", required = true }}

{principal}
"#,
            bucket = shared.bucket,
            endpoint = s3.endpoint(),
            db = db.display(),
        ),
    )?;
    Ok(path)
}

/// A replica of the load test: `dataref serve --http` on its own data dir.
fn spawn(
    bin: &Path,
    home: &Path,
    config: &Path,
    s3: &TestS3,
    pg: &TestPostgres,
) -> Result<ServeHttp> {
    ServeHttp::start(
        ServeHttp::command(bin, home, config)
            .env("DATAREF_INDEX_URL", pg.url("postgres"))
            .env("AWS_ACCESS_KEY_ID", s3.access_key())
            .env("AWS_SECRET_ACCESS_KEY", s3.secret_key())
            .env("DATAREF_LOG", "warn"),
        Duration::from_secs(120),
    )
}

/// `clients` × `calls` through `base`: p50 and p95 of a call, the wall time, the errors.
fn load(base: &str, token: &str, clients: usize, calls: usize) -> Result<(f64, f64, f64, usize)> {
    let token = token.to_owned();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let http = reqwest_client()?;
        let first = call(
            &http,
            base,
            &token,
            "fetch_sales",
            json!({"since": "2025-06-01"}),
        )
        .await?;
        let r = first["result"]["structuredContent"]["dataRef"]
            .as_str()
            .context("a dataRef")?
            .to_owned();
        let started = Instant::now();
        let mut tasks = Vec::new();
        for i in 0..clients {
            let (http, base, r, token) = (http.clone(), base.to_owned(), r.clone(), token.clone());
            tasks.push(tokio::spawn(async move {
                let mut lat = Vec::with_capacity(calls);
                let mut errors = 0;
                for j in 0..calls {
                    let t = Instant::now();
                    let answer = if (i + j) % 2 == 0 {
                        call(
                            &http,
                            &base,
                            &token,
                            "describe_data",
                            json!({"dataRef": r, "columns": ["revenue"]}),
                        )
                        .await
                    } else {
                        call(&http, &base, &token, "list_artifacts", json!({})).await
                    };
                    lat.push(t.elapsed().as_secs_f64());
                    if !matches!(&answer, Ok(v) if v["result"]["isError"] != json!(true)) {
                        errors += 1;
                    }
                }
                (lat, errors)
            }));
        }
        let mut all = Vec::new();
        let mut errors = 0;
        for t in tasks {
            let (lat, e) = t.await?;
            all.extend(lat);
            errors += e;
        }
        let total = started.elapsed().as_secs_f64();
        all.sort_by(f64::total_cmp);
        let p95 = all[(all.len() * 95 / 100).min(all.len() - 1)];
        Ok((median(&mut all), p95, total, errors))
    })
}

/// An S3 client of `s3`'s bucket: what the GETs alone go through.
fn s3_client(s3: &TestS3) -> Result<object_store::aws::AmazonS3> {
    use object_store::{ClientOptions, aws::AmazonS3Builder};
    Ok(AmazonS3Builder::new()
        .with_bucket_name(s3.bucket())
        .with_region(s3.region())
        .with_endpoint(s3.endpoint())
        .with_access_key_id(s3.access_key())
        .with_secret_access_key(s3.secret_key())
        .with_client_options(ClientOptions::new().with_allow_http(true))
        .build()?)
}

/// The bytes of the object under `key` in `s3`'s bucket, read as they come and dropped.
async fn get_counted(s3: &TestS3, key: &str) -> Result<u64> {
    use futures_util::StreamExt;
    use object_store::ObjectStoreExt;
    let store = s3_client(s3)?;
    let mut body = store
        .get(&object_store::path::Path::from(key))
        .await?
        .into_stream();
    let mut n = 0u64;
    while let Some(part) = body.next().await {
        n += part?.len() as u64;
    }
    Ok(n)
}

fn reqwest_client() -> Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()?)
}

async fn call(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    tool: &str,
    args: Value,
) -> Result<Value> {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": tool, "arguments": args, "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "0"},
            "io.modelcontextprotocol/clientCapabilities": {}}}});
    let text = http
        .post(format!("{base}/mcp"))
        .bearer_auth(token)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", "tools/call")
        .header("Mcp-Name", tool)
        .body(serde_json::to_vec(&body)?)
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?;
    if text.trim_start().starts_with('{') {
        return Ok(serde_json::from_str(&text)?);
    }
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|m| m["id"] == 1)
        .context("no answer in the stream")
}
