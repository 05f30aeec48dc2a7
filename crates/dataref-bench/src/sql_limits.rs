//! `dataref bench sql-limits`: whether `run_sql`'s limits hold, measured on the real
//! `dataref serve` over stdio with `[sql] timeout = 2s` and `memory = 256MiB`.
//!
//! For each query that would run away (joins that compute for minutes, functions that
//! build gigabytes): how long until the answer, what the answer says, the server's CPU in
//! the second after it (from `/proc/PID/stat`: a stopped query leaves ~0%), how long the
//! next small query then takes, and the most anonymous memory the server grew by while the
//! call ran (`RssAnon`, sampled every 5 ms). One query is cancelled with
//! `notifications/cancelled` instead of timing out. The baseline, measured in the same run:
//! the same small query on the idle server, and its idle CPU.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use dataref_config::env::DATAREF_CONFIG;
use serde_json::{Value, json};

#[derive(Debug, Args)]
pub struct SqlLimitsArgs {
    /// Rows of the sample the queries run over.
    #[arg(long, default_value_t = 20_000)]
    rows: u64,
    /// The `dataref` executable (default: beside this one).
    #[arg(long, value_name = "FILE")]
    dataref: Option<PathBuf>,
    /// Where the sample is kept between runs (default: `<data dir>/bench`).
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

/// `(what, sql, cancel after)`: each query would run for minutes or build gigabytes.
const CASES: [(&str, &str, Option<u64>); 8] = [
    (
        "filtered cross join (nested loop)",
        "SELECT count(*) AS n FROM sales a, sales b, sales c WHERE a.revenue + b.revenue > c.revenue * 1000",
        None,
    ),
    (
        "inequality join (nested loop)",
        "SELECT count(*) AS n FROM sales a JOIN sales b ON a.revenue < b.revenue AND a.units > b.units JOIN sales c ON c.units < a.units",
        None,
    ),
    (
        "hash join on a low-cardinality key",
        "SELECT count(*) AS n, sum(a.units * b.units) AS s FROM sales a JOIN sales b ON a.channel = b.channel",
        None,
    ),
    (
        "the same, cancelled after 1 s",
        "SELECT count(*) AS n, sum(a.units * b.units) AS s FROM sales a JOIN sales b ON a.channel = b.channel",
        Some(1),
    ),
    (
        "repeat('x', 1e9)",
        "SELECT length(repeat('x', 1000000000)) AS n",
        None,
    ),
    (
        "lpad of every row to 1e7",
        "SELECT max(length(lpad(line, 10000000))) AS n FROM sales",
        None,
    ),
    (
        "replace inserting text between every character",
        "SELECT max(length(replace(line, '', repeat('y', 100000)))) AS n FROM sales",
        None,
    ),
    (
        "string_agg over a cross join",
        "SELECT length(string_agg(a.line, ',')) AS n FROM sales a, sales b",
        None,
    ),
];

const SMALL: &str = "SELECT count(*) AS n, sum(units) AS units FROM sales";

pub fn run(args: &SqlLimitsArgs) -> Result<()> {
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => dataref_app::home(None)?.join("bench"),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating `{}`", dir.display()))?;
    let dir = std::path::absolute(&dir)?;
    let dataref = crate::server::dataref_exe(args.dataref.as_deref())?;
    let (_, db) = crate::server::sample_db(&dir, args.rows)?;
    let scratch = dir.join(format!("sql-limits-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let toml = scratch.join("dataref.toml");
    std::fs::write(
        &toml,
        format!(
            "[sql]\ntimeout = \"2s\"\nmemory = \"256MiB\"\n\n[python]\nenabled = false\n\n\
             [sources.sample]\nkind = \"sqlite\"\npath = {:?}\nallow_sql = true\n",
            db.display().to_string()
        ),
    )?;
    let result = measure(&dataref, &toml, &scratch, args.rows);
    let _ = std::fs::remove_dir_all(&scratch);
    let rows = result?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "\n`run_sql` limits on `dataref serve` over stdio, {} rows, [sql] timeout 2 s, memory 256 MiB",
        args.rows
    )?;
    writeln!(
        out,
        "| query | answered after | answer | CPU until idle | server CPU in the next 1 s | next query | RssAnon grew by |"
    )?;
    writeln!(out, "|---|---:|---|---:|---:|---:|---:|")?;
    for r in rows {
        writeln!(
            out,
            "| {} | {} | {} | {} | {:.0}% | {:.1} ms | {:.0} MB |",
            r.what,
            r.answered
                .map_or("—".into(), |d| format!("{:.2} s", d.as_secs_f64())),
            r.answer,
            r.until_idle
                .map_or("—".into(), |d| format!("{:.0} ms", d.as_secs_f64() * 1e3)),
            r.cpu_after * 100.0,
            r.next.as_secs_f64() * 1e3,
            r.grew as f64 / 1e6
        )?;
    }
    Ok(())
}

struct Row {
    what: String,
    answered: Option<Duration>,
    answer: String,
    /// From the answer until the server's CPU time stops growing.
    until_idle: Option<Duration>,
    cpu_after: f64,
    next: Duration,
    grew: u64,
}

fn measure(dataref: &Path, toml: &Path, home: &Path, rows: u64) -> Result<Vec<Row>> {
    let mut server = Server::start(dataref, toml, home)?;
    server.request(
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}),
    )?;
    server.notify("notifications/initialized", json!({}))?;
    let fetched = server.call(
        "query",
        json!({"source": "sample", "sql": "SELECT date, line, region, channel, units, revenue FROM sales"}),
    )?;
    let sales = fetched["structuredContent"]["dataRef"]
        .as_str()
        .context("`query` returned no dataRef")?
        .to_owned();
    if fetched["structuredContent"]["rows"].as_u64() != Some(rows) {
        bail!("the sample has not {rows} rows: {fetched}");
    }
    let small = |server: &mut Server| -> Result<Duration> {
        let t = Instant::now();
        let r = server.call(
            "run_sql",
            json!({"sql": SMALL, "inputs": {"sales": sales}, "store_as": "value"}),
        )?;
        if r["isError"] == true {
            bail!("the small query failed: {r}");
        }
        Ok(t.elapsed())
    };
    small(&mut server)?;
    let idle_cpu = server.cpu_over(Duration::from_secs(1))?;
    let mut out = vec![Row {
        what: format!("baseline: `{SMALL}` on the idle server"),
        answered: None,
        answer: "—".into(),
        until_idle: None,
        cpu_after: idle_cpu,
        next: small(&mut server)?,
        grew: 0,
    }];
    for (what, sql, cancel_after) in CASES {
        dataref_app::progress_line(&format!("{what}…"));
        let before = server.rss_anon()?;
        let t = Instant::now();
        let id = server.send_call(
            "run_sql",
            json!({"sql": sql, "inputs": {"sales": sales}, "store_as": "value"}),
        )?;
        let mut peak = before;
        let mut cancelled: Option<Instant> = None;
        let answer = loop {
            if let Some(v) = server.poll(id, Duration::from_millis(5))? {
                break Some(v);
            }
            peak = peak.max(server.rss_anon()?);
            match (cancel_after, cancelled) {
                (Some(after), None) if t.elapsed() >= Duration::from_secs(after) => {
                    server.notify(
                        "notifications/cancelled",
                        json!({"requestId": id, "reason": "bench"}),
                    )?;
                    cancelled = Some(Instant::now());
                }
                // A cancelled request gets no response (MCP): measured from the cancel.
                (_, Some(at)) if at.elapsed() > Duration::from_millis(100) => break None,
                _ => {}
            }
            if t.elapsed() > Duration::from_secs(120) {
                bail!("{what}: no answer in 120 s");
            }
        };
        let answered = match (&answer, cancelled) {
            (None, Some(at)) => at.duration_since(t),
            _ => t.elapsed(),
        };
        let text = match &answer {
            Some(a) => answer_text(a),
            None => "cancelled: no response, as MCP says".to_owned(),
        };
        let until_idle = server.until_idle()?;
        let cpu_after = server.cpu_over(Duration::from_secs(1))?;
        let next = small(&mut server)?;
        out.push(Row {
            what: what.to_owned(),
            answered: Some(answered),
            answer: text,
            until_idle: Some(until_idle),
            cpu_after,
            next,
            grew: peak.saturating_sub(before),
        });
    }
    server.stop();
    Ok(out)
}

/// The first words of a result: its error, or "rows".
fn answer_text(v: &Value) -> String {
    if let Some(e) = v.get("error") {
        return format!("JSON-RPC error {}", e["code"]);
    }
    let r = &v["result"];
    let text = r["content"][0]["text"].as_str().unwrap_or("");
    let first = text.lines().next().unwrap_or("");
    let cut: String = first.chars().take(70).collect();
    if r["isError"] == true {
        cut.replace('|', "\\|")
    } else {
        format!("answered: {}", cut.replace('|', "\\|"))
    }
}

struct Server {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<Value>,
    held: Vec<Value>,
    next_id: u64,
    pid: u32,
}

impl Server {
    fn start(dataref: &Path, toml: &Path, home: &Path) -> Result<Self> {
        let mut child = Command::new(dataref)
            .arg("serve")
            .arg("--home")
            .arg(home)
            .arg("--principal")
            .arg("bench")
            .env(DATAREF_CONFIG, toml)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting `{}`", dataref.display()))?;
        let stdin = child.stdin.take().context("no stdin")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Ok(v) = serde_json::from_str::<Value>(&line)
                    && tx.send(v).is_err()
                {
                    break;
                }
            }
        });
        let pid = child.id();
        Ok(Self {
            child,
            stdin,
            lines,
            held: Vec::new(),
            next_id: 1,
            pid,
        })
    }

    fn send(&mut self, v: &Value) -> Result<()> {
        writeln!(self.stdin, "{v}")?;
        self.stdin.flush()?;
        Ok(())
    }

    fn notify(&mut self, method: &str, params: Value) -> Result<()> {
        self.send(&json!({"jsonrpc": "2.0", "method": method, "params": params}))
    }

    fn send_call(&mut self, tool: &str, args: Value) -> Result<u64> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                          "params": {"name": tool, "arguments": args}}))?;
        Ok(id)
    }

    fn request(&mut self, method: &str, params: Value) -> Result<Value> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))?;
        self.wait(id)
    }

    /// A tool call's `result`.
    fn call(&mut self, tool: &str, args: Value) -> Result<Value> {
        let id = self.send_call(tool, args)?;
        let v = self.wait(id)?;
        Ok(v["result"].clone())
    }

    fn wait(&mut self, id: u64) -> Result<Value> {
        let t = Instant::now();
        loop {
            if let Some(v) = self.poll(id, Duration::from_millis(50))? {
                return Ok(v);
            }
            if t.elapsed() > Duration::from_secs(120) {
                bail!("no answer to request {id} in 120 s");
            }
        }
    }

    /// The answer to `id` if it came within `wait`.
    fn poll(&mut self, id: u64, wait: Duration) -> Result<Option<Value>> {
        if let Some(i) = self.held.iter().position(|v| v["id"] == id) {
            return Ok(Some(self.held.swap_remove(i)));
        }
        match self.lines.recv_timeout(wait) {
            Ok(v) if v["id"] == id => Ok(Some(v)),
            Ok(v) => {
                if v.get("id").is_some() {
                    self.held.push(v);
                }
                Ok(None)
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Ok(None),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                bail!("the server ended (its output closed)")
            }
        }
    }

    /// The server's CPU time so far, in clock ticks (the kernel's USER_HZ, 100 on Linux).
    fn ticks(&self) -> Result<u64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid))?;
        // The fields after the command's closing parenthesis: utime is the 12th, stime
        // the 13th.
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<&str> = rest.split_whitespace().collect();
        let utime: u64 = f.get(11).context("no utime")?.parse()?;
        let stime: u64 = f.get(12).context("no stime")?.parse()?;
        Ok(utime + stime)
    }

    /// CPU the server used over `span`, in cores.
    fn cpu_over(&self, span: Duration) -> Result<f64> {
        let a = self.ticks()?;
        let t = Instant::now();
        std::thread::sleep(span);
        let b = self.ticks()?;
        Ok((b - a) as f64 / 100.0 / t.elapsed().as_secs_f64())
    }

    /// How long until the server's CPU time stops growing: the end of the last 50 ms step
    /// in which it grew by more than one tick (10 ms), looked at for 10 s at most.
    fn until_idle(&self) -> Result<Duration> {
        let t = Instant::now();
        let mut last = self.ticks()?;
        let mut busy_until = Duration::ZERO;
        let mut quiet = 0;
        while quiet < 10 && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(50));
            let now = self.ticks()?;
            if now > last + 1 {
                busy_until = t.elapsed();
                quiet = 0;
            } else {
                quiet += 1;
            }
            last = now;
        }
        Ok(busy_until)
    }

    fn rss_anon(&self) -> Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid))?;
        let kb = status
            .lines()
            .find_map(|l| l.strip_prefix("RssAnon:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .context("no RssAnon")?;
        Ok(kb * 1024)
    }

    fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
