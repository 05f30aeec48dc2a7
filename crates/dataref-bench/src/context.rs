//! `dataref bench context`: the seed's transcript replayed word for word over the real MCP
//! server (in-process, the protocol `serve` speaks on stdio) at each sample size, and what
//! each step puts in front of the model: bytes and o200k tokens of the content (every
//! block, whatever its `audience`, since some hosts pass them all: a text block by its
//! text, any other block — a resource link, an image — by its JSON as sent), of
//! `structuredContent`, and of both; and of `tools/list`, the part the model reads (name,
//! description, input schema) and the whole.

use std::io::Write;

use anyhow::{Context, Result, bail};
use clap::Args;
use dataref_mcp::rmcp;
use dataref_mcp::{DatarefServer, connect_in_process};
use rmcp::model::{CallToolRequestParams, CallToolResult};
use serde_json::{Value, json};

use dataref_app::Sample;

use crate::result_text;

#[derive(Debug, Args)]
pub struct ContextArgs {
    /// Sample sizes to replay the transcript at, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "48210,1000000,10000000")]
    rows: Vec<u64>,
}

/// The seed's `run_python` call, character for character.
pub(crate) const SEED_QOQ_CODE: &str = r#"q = sales.assign(q=sales.date.dt.to_period("Q"))
pivot = q.pivot_table(index="line", columns="q", values="revenue", aggfunc="sum")
delta = (pivot.iloc[:, -1] - pivot.iloc[:, -2]).sort_values()
outputs["qoq"] = delta.rename("delta").reset_index()
result = delta.head(5).round(2).to_dict()"#;

/// The seed's numbers (bytes to the model), from its transcript.
const SEED_BYTES: [(&str, usize); 5] = [
    ("fetch_sales", 1_988),
    ("describe_data", 2_046),
    ("run_python", 896),
    ("render_chart", 222),
    ("export_data", 224),
];

/// Bytes and o200k tokens of one text.
#[derive(Default, Clone, Copy)]
struct Size {
    bytes: usize,
    tokens: usize,
}

impl Size {
    fn of(bpe: &dataref_agent::tokens::CoreBPE, text: &str) -> Self {
        Self {
            bytes: text.len(),
            tokens: bpe.encode_with_special_tokens(text).len(),
        }
    }
    fn add(&mut self, o: Self) {
        self.bytes += o.bytes;
        self.tokens += o.tokens;
    }
}

struct Measured {
    call: &'static str,
    content: Size,
    structured: Size,
    both: Size,
    /// Blocks that are not text (images, resource links), described.
    other: String,
}

pub fn run(args: &ContextArgs) -> Result<()> {
    let home = dataref_app::home(None)?;
    let bpe = dataref_agent::tokens::o200k_base();
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "\nwhat the model reads: the seed's transcript word for word, over MCP"
    )?;
    for &n in &args.rows {
        dataref_app::progress_line(&format!("replaying the seed's transcript on {n} rows…"));
        let sample = Sample::prepare(home.clone(), n, "bench-context")?;
        let (steps, tools) = sample
            .runtime
            .block_on(replay(&sample, bpe))
            .with_context(|| format!("replaying the transcript on {n} rows"))?;
        print_table(&mut out, n, &steps, &tools)?;
    }
    Ok(())
}

/// `tools/list`: the part the model reads, and the whole.
struct ToolsList {
    tools: usize,
    visible: Size,
    whole: Size,
}

async fn replay(
    sample: &Sample,
    bpe: &dataref_agent::tokens::CoreBPE,
) -> Result<(Vec<Measured>, ToolsList)> {
    let session = connect_in_process(
        DatarefServer::new(sample.registry.clone(), sample.ctx.clone()),
        (),
    )
    .await
    .context("MCP handshake with the in-process server")?;
    let client = &session.client;
    let tools = client.list_all_tools().await.context("tools/list")?;
    let visible: Vec<Value> = tools
        .iter()
        .map(|t| json!({"name": t.name, "description": t.description, "inputSchema": t.input_schema}))
        .collect();
    let tools_list = ToolsList {
        tools: tools.len(),
        visible: Size::of(bpe, &serde_json::to_string(&visible)?),
        whole: Size::of(bpe, &serde_json::to_string(&json!({ "tools": tools }))?),
    };

    let mut steps = Vec::new();
    let fetched = call(client, "fetch_sales", json!({"since": "2025-01-01"})).await?;
    steps.push(measure(bpe, "fetch_sales", &fetched)?);
    let sales = pointer(&fetched, "/dataRef")?;
    let described = call(client, "describe_data", json!({ "dataRef": sales })).await?;
    steps.push(measure(bpe, "describe_data", &described)?);
    let python = call(
        client,
        "run_python",
        json!({"inputs": {"sales": sales}, "code": SEED_QOQ_CODE}),
    )
    .await?;
    steps.push(measure(bpe, "run_python", &python)?);
    let qoq = pointer(&python, "/outputs/qoq/dataRef")?;
    let chart = call(
        client,
        "render_chart",
        json!({"dataRef": qoq, "x": "line", "y": "delta", "kind": "bar"}),
    )
    .await?;
    steps.push(measure(bpe, "render_chart", &chart)?);
    let export = call(
        client,
        "export_data",
        json!({"source": qoq, "format": "csv"}),
    )
    .await?;
    steps.push(measure(bpe, "export_data", &export)?);
    session.client.cancel().await.ok();
    session.server.abort();
    Ok((steps, tools_list))
}

pub(super) async fn call(
    client: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
    tool: &str,
    args: Value,
) -> Result<CallToolResult> {
    let Value::Object(map) = args else {
        bail!("arguments must be an object");
    };
    let r = client
        .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(map))
        .await
        .with_context(|| format!("tools/call {tool}"))?;
    if r.is_error == Some(true) {
        bail!(
            "`{tool}` as the seed writes it was refused: {}",
            result_text(&r)
        );
    }
    Ok(r)
}

pub(super) fn pointer(r: &CallToolResult, at: &str) -> Result<String> {
    r.structured_content
        .as_ref()
        .and_then(|s| s.pointer(at))
        .and_then(Value::as_str)
        .map(str::to_owned)
        .with_context(|| format!("no `{at}` in the result"))
}

fn measure(
    bpe: &dataref_agent::tokens::CoreBPE,
    call: &'static str,
    r: &CallToolResult,
) -> Result<Measured> {
    let structured = match &r.structured_content {
        Some(v) => serde_json::to_string(v)?,
        None => String::new(),
    };
    let mut content = String::new();
    let mut other = Vec::new();
    for c in &r.content {
        // Measured and described from the wire form, as a host sees it.
        let v = serde_json::to_value(c)?;
        let kind = v.get("type").and_then(Value::as_str).unwrap_or("?");
        if kind == "text" {
            content.push_str(v.get("text").and_then(Value::as_str).unwrap_or_default());
            continue;
        }
        content.push_str(&serde_json::to_string(&v)?);
        let mime = v
            .get("mimeType")
            .and_then(Value::as_str)
            .map(|m| format!(" {m}"))
            .unwrap_or_default();
        other.push(format!(
            "{kind}{mime} ({} B)",
            serde_json::to_string(&v)?.len()
        ));
    }
    let both = format!("{content}{structured}");
    Ok(Measured {
        call,
        content: Size::of(bpe, &content),
        structured: Size::of(bpe, &structured),
        both: Size::of(bpe, &both),
        other: other.join(", "),
    })
}

fn print_table(
    out: &mut impl Write,
    rows: u64,
    steps: &[Measured],
    tools: &ToolsList,
) -> Result<()> {
    writeln!(out, "\n{rows} rows")?;
    writeln!(
        out,
        "| step | content B | content tok | structured B | structured tok | both B | both tok | seed B | other blocks |"
    )?;
    writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---|")?;
    let (mut content, mut structured, mut both, mut seed) =
        (Size::default(), Size::default(), Size::default(), 0);
    for s in steps {
        let seed_b = SEED_BYTES
            .iter()
            .find(|(c, _)| *c == s.call)
            .map_or(0, |(_, b)| *b);
        writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {seed_b} | {} |",
            s.call,
            s.content.bytes,
            s.content.tokens,
            s.structured.bytes,
            s.structured.tokens,
            s.both.bytes,
            s.both.tokens,
            s.other
        )?;
        content.add(s.content);
        structured.add(s.structured);
        both.add(s.both);
        seed += seed_b;
    }
    writeln!(
        out,
        "| total of the five | {} | {} | {} | {} | {} | {} | {seed} | |",
        content.bytes, content.tokens, structured.bytes, structured.tokens, both.bytes, both.tokens
    )?;
    writeln!(
        out,
        "| tools/list ({} tools): name + description + inputSchema | {} | {} | | | | | 2415 (570 tok) | |",
        tools.tools, tools.visible.bytes, tools.visible.tokens
    )?;
    writeln!(
        out,
        "| tools/list: the whole result | {} | {} | | | | | | |",
        tools.whole.bytes, tools.whole.tokens
    )?;
    Ok(())
}
