//! `dataref demo`: the canonical analysis on the built-in sample, played over MCP exactly as
//! a client would play it, printing what the model receives with its size in bytes and in
//! tokens (o200k, the tokenizer of current OpenAI models) against the rows handled.

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
// The seed's question (which product lines lost the most revenue from one quarter to the
// next?) as code: the same the agent's scripted analyst sends.
use dataref_agent::scripted::{QOQ_CODE, QOQ_SQL};
use dataref_agent::{AgentEvent, AgentHost, EventSink, NoOneToAsk, SendRequest};
use dataref_app::Sample;
use dataref_mcp::rmcp;
use dataref_mcp::{DatarefServer, connect_in_process};
use dataref_protocol::DataRef;
use dataref_store::ArtifactStore;
use dataref_tool::RunContext;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::{Common, settings};

/// Rows whose JSON is tokenized to estimate the cost of returning every row.
const NAIVE_SAMPLE_ROWS: usize = 2_000;

/// Reads a spilled `list_artifacts` result (a workspace file passed in `files`) into a
/// table: one row per artifact. `{path}` is the spill file's workspace path.
const SPILL_TO_TABLE_CODE: &str = "\
import json
listed = json.load(open('in/files/{path}'))
outputs['artifacts'] = pd.DataFrame([
    {'dataRef': a['dataRef'], 'rows': a['rows'], 'columns': ', '.join(a['columns']),
     'madeBy': a['madeBy'], 'expiresAt': a['expiresAt']} for a in listed['artifacts']])
result = len(listed['artifacts'])
";

struct Step {
    call: String,
    rows: u64,
    bytes: usize,
    tokens: usize,
}

pub fn run(common: &Common) -> Result<ExitCode> {
    if common.config.is_some() {
        bail!("`dataref demo` runs on the built-in sample; drop `--config`");
    }
    // A demo principal of its own, so the demo never lists a real user's artifacts.
    let sample = Sample::prepare(
        settings::home(common)?,
        settings::sample_rows(common)?,
        "demo",
    )?;
    let Sample {
        runtime,
        registry,
        ctx,
        store,
        rows,
        agents,
        ..
    } = sample;
    runtime.block_on(async {
        play(registry, ctx.clone(), store, rows).await?;
        agent_section(&agents, ctx).await
    })
}

/// The same question through the agent loop: the scripted analyst when no endpoint is
/// configured (it says so), the endpoint of `DATAREF_LLM_URL` otherwise; the tokens sent
/// per turn.
async fn agent_section(agents: &AgentHost, ctx: RunContext) -> Result<ExitCode> {
    let agent = agents
        .agent(None)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .clone();
    let endpoint = agents
        .model_of(&agent)
        .map(|m| m.endpoint().to_owned())
        .unwrap_or_default();
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "\nthe agent: the same question through the loop (agent `{}`, model: {endpoint})",
        agent.name
    )?;
    writeln!(out, "question: {}", dataref_agent::scripted::QUESTION)?;
    drop(out);
    let steps = StepLines::default();
    let sent = agents
        .send(SendRequest {
            ctx,
            agent: None,
            session: None,
            message: dataref_agent::scripted::QUESTION.to_owned(),
            events: &steps,
            approver: &NoOneToAsk,
            cancel: CancellationToken::new(),
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut out = std::io::stdout().lock();
    for line in steps.lines() {
        writeln!(out, "  {line}")?;
    }
    writeln!(out, "answer:\n{}\n", sent.run.answer.trim_end())?;
    writeln!(
        out,
        "| turn | tokens sent (o200k, counted here) | prompt tokens (provider) | completion tokens (provider) |"
    )?;
    writeln!(out, "|---:|---:|---:|---:|")?;
    // The scripted analyst counts nothing: its provider columns say so.
    let counted = |n: u64| {
        if sent.run.usage.total() == 0 {
            "–".to_owned()
        } else {
            n.to_string()
        }
    };
    let mut sum = 0;
    for r in &sent.run.requests {
        sum += r.context_tokens;
        writeln!(
            out,
            "| {} | {} | {} | {} |",
            r.turn,
            r.context_tokens,
            counted(r.usage.prompt_tokens),
            counted(r.usage.completion_tokens)
        )?;
    }
    writeln!(
        out,
        "| total | {sum} | {} | {} |",
        counted(sent.run.usage.prompt_tokens),
        counted(sent.run.usage.completion_tokens)
    )?;
    writeln!(
        out,
        "session {} (continue it with `dataref chat --session {}`)",
        sent.session, sent.session
    )?;
    Ok(if sent.run.stopped.is_some() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// The run's tool steps, one line each.
#[derive(Default)]
struct StepLines(std::sync::Mutex<Vec<String>>);

impl StepLines {
    fn lines(&self) -> Vec<String> {
        self.0.lock().map(|l| l.clone()).unwrap_or_default()
    }
}

impl EventSink for StepLines {
    fn event(&self, event: AgentEvent) {
        let line = match event {
            AgentEvent::ToolCallFinished {
                tool,
                outcome,
                summary,
                ms,
                ..
            } => format!("{tool} → {outcome}: {summary} ({ms} ms)"),
            AgentEvent::Error { message, .. } => format!("error: {message}"),
            _ => return,
        };
        if let Ok(mut l) = self.0.lock() {
            l.push(line);
        }
    }
}

/// Every content block as a host that passes them all shows the model: a text block by its
/// text, any other block (a resource link, an image) by its JSON as sent.
fn content_as_seen(r: &CallToolResult) -> String {
    r.content
        .iter()
        .map(|c| match c.as_text() {
            Some(t) => t.text.clone(),
            None => serde_json::to_string(c).unwrap_or_default(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

async fn play(
    registry: Arc<dataref_tool::ToolRegistry>,
    ctx: RunContext,
    store: Arc<dyn ArtifactStore>,
    sample_rows: u64,
) -> Result<()> {
    let bpe = dataref_agent::tokens::o200k_base();
    let session = connect_in_process(DatarefServer::new(registry, ctx.clone()), ())
        .await
        .context("MCP handshake with the in-process server")?;
    let client = session.client;
    let instructions = client
        .peer_info()
        .and_then(|i| i.instructions.clone())
        .unwrap_or_default();
    let tools = client.list_all_tools().await.context("tools/list")?;

    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "dataref demo: the canonical analysis on the built-in sample ({sample_rows} rows of sales)"
    )?;
    writeln!(
        out,
        "MCP session (in-process, the same protocol as stdio): {} tools: {}",
        tools.len(),
        tools
            .iter()
            .map(|t| t.name.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )?;
    writeln!(
        out,
        "server instructions: {} bytes, {} tokens\n",
        instructions.len(),
        bpe.encode_with_special_tokens(&instructions).len()
    )?;

    let mut steps = Vec::new();
    let args = json!({"since": "2025-01-01"});
    let fetched = call(&client, &mut out, bpe, "fetch_sales", args, &mut steps).await?;
    let data_ref = fetched
        .structured_content
        .as_ref()
        .and_then(|s| s.get("dataRef"))
        .and_then(Value::as_str)
        .context("fetch_sales returned no dataRef")?
        .to_owned();
    let rows = fetched
        .structured_content
        .as_ref()
        .and_then(|s| s.get("rows"))
        .and_then(Value::as_u64)
        .unwrap_or(0);
    if let Some(s) = steps.last_mut() {
        s.rows = rows;
    }
    call(
        &client,
        &mut out,
        bpe,
        "describe_data",
        json!({"dataRef": data_ref}),
        &mut steps,
    )
    .await?;
    if let Some(s) = steps.last_mut() {
        s.rows = rows;
    }

    // The arithmetic, where the data is: quarter-over-quarter revenue per product line.
    let python = call(
        &client,
        &mut out,
        bpe,
        "run_python",
        json!({"code": QOQ_CODE, "inputs": {"sales": data_ref}}),
        &mut steps,
    )
    .await?;
    if let Some(s) = steps.last_mut() {
        s.rows = rows;
    }
    let structured = python.structured_content.unwrap_or_default();
    // A run that worked has no `ok`; a failed one says `ok: false` and why.
    if structured.get("ok").is_some() || structured.get("error").is_some() {
        bail!("run_python did not succeed: {structured}");
    }
    let delta_ref = structured
        .pointer("/outputs/qoq_delta/dataRef")
        .and_then(Value::as_str)
        .context("run_python stored no `qoq_delta` table")?
        .to_owned();
    let delta_rows = structured
        .pointer("/outputs/qoq_delta/rows")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let losers_ref = structured
        .pointer("/outputs/biggest_losers/dataRef")
        .and_then(Value::as_str)
        .context("run_python stored no `biggest_losers` table")?
        .to_owned();

    // The same question in SQL, beside the sandbox: no Python start, the engine reads the
    // mapped artifact in place and only the five lines come back.
    let sql = call(
        &client,
        &mut out,
        bpe,
        "run_sql",
        json!({"sql": QOQ_SQL, "inputs": {"sales": data_ref}, "store_as": "value"}),
        &mut steps,
    )
    .await?;
    if let Some(s) = steps.last_mut() {
        s.rows = rows;
    }
    let sql_lines = sql
        .structured_content
        .as_ref()
        .and_then(|s| s.get("values"))
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    if sql_lines == 0 {
        bail!("run_sql returned no rows for the quarter-over-quarter question");
    }

    // Show the person, not the model: a chart and a file, by reference.
    let chart = call(
        &client,
        &mut out,
        bpe,
        "render_chart",
        json!({
            "dataRef": losers_ref,
            "x": "line",
            "y": ["delta"],
            "kind": "bar",
            "sort": "ascending",
            "width": 1400,
            "title": "Revenue change from the previous quarter: the ten biggest losers",
        }),
        &mut steps,
    )
    .await?;
    if let Some(s) = steps.last_mut() {
        s.rows = 10;
    }
    let export = call(
        &client,
        &mut out,
        bpe,
        "export_data",
        json!({"source": delta_ref, "format": "csv", "filename": "qoq-delta"}),
        &mut steps,
    )
    .await?;
    if let Some(s) = steps.last_mut() {
        s.rows = delta_rows;
    }

    // A file brought in: the CSV a person was just given is also what they would bring
    // back. `load_file` finds its delimiter, header and types and stores it as a table;
    // the model gets the shape, as from any producer.
    let exported = export
        .structured_content
        .as_ref()
        .and_then(|s| s.get("path"))
        .and_then(Value::as_str)
        .context("export_data returned no path")?
        .to_owned();
    let loaded = call(
        &client,
        &mut out,
        bpe,
        "load_file",
        json!({"path": exported}),
        &mut steps,
    )
    .await?;
    let loaded_rows = loaded
        .structured_content
        .as_ref()
        .and_then(|s| s.get("rows"))
        .and_then(Value::as_u64)
        .unwrap_or(0);
    if loaded_rows != delta_rows {
        bail!("load_file read {loaded_rows} rows of the {delta_rows} exported");
    }
    if let Some(s) = steps.last_mut() {
        s.rows = loaded_rows;
    }

    // A large result that is not a stored table: spilled to the workspace, and the model
    // gets the path. A person keeps it by copying it out of `.spill/` (copies are not swept).
    let listed = call(
        &client,
        &mut out,
        bpe,
        "list_artifacts",
        json!({}),
        &mut steps,
    )
    .await?;
    let spilled = listed
        .structured_content
        .as_ref()
        .filter(|s| s.get("spilled") == Some(&Value::Bool(true)))
        .and_then(|s| s.get("path"))
        .and_then(Value::as_str)
        .context("list_artifacts was expected to be spilled (over 1,000 characters)")?
        .to_owned();
    // Data from the spill file goes on by path: run_python reads it (`files`) and stores a
    // table, which export_data writes for the person. The model never copies it.
    let tabled = call(
        &client,
        &mut out,
        bpe,
        "run_python",
        json!({
            "code": SPILL_TO_TABLE_CODE.replace("{path}", &spilled),
            "files": [spilled],
        }),
        &mut steps,
    )
    .await?;
    let artifacts_ref = tabled
        .structured_content
        .as_ref()
        .and_then(|s| s.pointer("/outputs/artifacts/dataRef"))
        .and_then(Value::as_str)
        .context("run_python stored no `artifacts` table from the spill file")?
        .to_owned();
    let kept = call(
        &client,
        &mut out,
        bpe,
        "export_data",
        json!({"source": artifacts_ref, "format": "xlsx", "filename": "artifacts"}),
        &mut steps,
    )
    .await?;
    let root = ctx.workspace.host_path_for_logging().to_path_buf();
    let file = |r: &CallToolResult, key: &str| {
        r.structured_content
            .as_ref()
            .and_then(|s| s.get(key))
            .and_then(Value::as_str)
            .map(|p| root.join(p).display().to_string())
            .unwrap_or_default()
    };
    writeln!(
        out,
        "files for the person (the rows never passed through the model):"
    )?;
    let png = file(&chart, "path");
    writeln!(out, "  chart (PNG): {png}")?;
    writeln!(
        out,
        "  chart (SVG): {}",
        png.strip_suffix(".png")
            .map(|s| format!("{s}.svg"))
            .unwrap_or_default()
    )?;
    writeln!(out, "  delta table (CSV): {}", file(&export, "path"))?;
    writeln!(
        out,
        "  spilled list_artifacts result: {}",
        root.join(&spilled).display()
    )?;
    writeln!(
        out,
        "  exported from the spill file (XLSX): {}\n",
        file(&kept, "path")
    )?;

    // What returning the rows as JSON (the naive pattern) would have cost.
    let data_ref = DataRef::parse(&data_ref).map_err(|e| anyhow::anyhow!("{e}"))?;
    let (naive_bytes, naive_tokens) = naive_cost(store.as_ref(), &ctx, &data_ref, bpe)?;

    writeln!(out, "summary")?;
    writeln!(out, "| step | rows handled | bytes to the model | tokens |")?;
    writeln!(out, "|---|---:|---:|---:|")?;
    let (mut tb, mut tt) = (0, 0);
    for s in &steps {
        writeln!(
            out,
            "| {} | {} | {} | {} |",
            s.call, s.rows, s.bytes, s.tokens
        )?;
        tb += s.bytes;
        tt += s.tokens;
    }
    writeln!(out, "| total | {rows} | {tb} | {tt} |")?;
    writeln!(
        out,
        "\nthe same {rows} rows returned as JSON would be ≈{naive_bytes} bytes ≈{naive_tokens} tokens \
         ({}× the bytes; estimated from the first {} rows)",
        naive_bytes / tb.max(1),
        NAIVE_SAMPLE_ROWS.min(rows as usize)
    )?;
    drop(out);
    client.cancel().await.ok();
    session.server.abort();
    Ok(())
}

async fn call(
    client: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
    out: &mut std::io::StdoutLock<'_>,
    bpe: &dataref_agent::tokens::CoreBPE,
    tool: &str,
    args: Value,
    steps: &mut Vec<Step>,
) -> Result<CallToolResult> {
    let Value::Object(map) = args.clone() else {
        bail!("arguments must be an object");
    };
    let result = client
        .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(map))
        .await
        .with_context(|| format!("tools/call {tool}"))?;
    let text = content_as_seen(&result);
    let tokens = bpe.encode_with_special_tokens(&text).len();
    writeln!(out, "▶ {tool} {args}")?;
    writeln!(
        out,
        "◀ what the model receives ({} bytes, {tokens} tokens):",
        text.len()
    )?;
    writeln!(out, "{text}\n")?;
    if result.is_error == Some(true) {
        bail!("`{tool}` failed: {text}");
    }
    steps.push(Step {
        call: tool.to_owned(),
        rows: 0,
        bytes: text.len(),
        tokens,
    });
    Ok(result)
}

fn naive_cost(
    store: &dyn ArtifactStore,
    ctx: &RunContext,
    data_ref: &DataRef,
    bpe: &dataref_agent::tokens::CoreBPE,
) -> Result<(usize, usize)> {
    let table = store.open_table(&ctx.principal, data_ref)?;
    let total = table.meta.rows as usize;
    let (text, sampled) = dataref_store::records_json(&table.batches, NAIVE_SAMPLE_ROWS);
    let n = sampled.max(1);
    let tokens = bpe.encode_with_special_tokens(&text).len();
    Ok((text.len() * total / n, tokens * total / n))
}
