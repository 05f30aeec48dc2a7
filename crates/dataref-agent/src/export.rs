//! A session as the reproducible record of its analysis: the questions, every query and
//! every piece of code the agent ran, and its answers, as a Jupyter notebook
//! ([`notebook`], nbformat 4.5) or one Python script ([`script`]).
//!
//! The record holds no rows. What it takes from the history is the person's and the
//! model's own text (questions, SQL, code, arguments, answers), the configured queries'
//! SQL, and from tool results only dataRefs, column names and types, row counts, and
//! `run_python`'s small `result` (as a comment saying what the run returned). Samples,
//! previews and spilled files are never copied. Running the record re-runs every producer
//! against the sources with the runner's own credentials: a SQLite source at the path of
//! the config, a PostgreSQL source at the URL in `DATAREF_SOURCE_<NAME>_URL` (the config's
//! URL and passwords never appear).
//!
//! Each step is one tool call, numbered in session order: `fetch_<query>` and `query` read
//! into `<query>_<step>` (`query_<step>`) with `pd.read_sql_query`; `run_python` binds its
//! inputs to the variables that produced those dataRefs, runs the code verbatim and keeps
//! `step<N>_outputs` (and `step<N>_result`); charts, tables and exports are redone with
//! pandas. What cannot be redone (a failed call, `call_tool`, file and HTTP tools, a
//! dataRef from outside the session) is a note saying so.

use dataref_protocol::truncate_chars;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use dataref_config::{ColumnType, Config, ParamType, QueryConfig, SourceConfig, SourceKind};
use dataref_protocol::{DataRef, Timestamp};
use serde_json::{Map, Value, json};

use crate::message::{AssistantToolCall, Message, Role};

/// Who and when, for the record's header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportMeta {
    /// The session id.
    pub session: String,
    /// The agent profile that ran it.
    pub agent: String,
    /// Whose session it is.
    pub principal: String,
    pub exported: Timestamp,
}

/// The session as an nbformat 4.5 notebook (`.ipynb` JSON) with a Python 3 kernel.
pub fn notebook(history: &[Message], meta: &ExportMeta, config: &Config) -> Value {
    let cells: Vec<Value> = build(history, meta, config)
        .iter()
        .enumerate()
        .map(|(i, cell)| {
            let id = format!("cell-{:03}", i + 1);
            match cell {
                Cell::Markdown(text) => json!({
                    "cell_type": "markdown",
                    "id": id,
                    "metadata": {},
                    "source": source_lines(text),
                }),
                Cell::Code(code) => json!({
                    "cell_type": "code",
                    "id": id,
                    "metadata": {},
                    "execution_count": null,
                    "outputs": [],
                    "source": source_lines(code),
                }),
            }
        })
        .collect();
    json!({
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {
            "kernelspec": {
                "display_name": "Python 3",
                "language": "python",
                "name": "python3",
            },
            "language_info": {"name": "python"},
            "dataref": {
                "session": meta.session,
                "agent": meta.agent,
                "principal": meta.principal,
                "exported": meta.exported.to_string(),
            },
        },
        "cells": cells,
    })
}

/// The same record as one Python script: markdown cells become comments, cells are
/// separated by `# %%` markers (the percent format editors and jupytext read).
pub fn script(history: &[Message], meta: &ExportMeta, config: &Config) -> String {
    let mut out = String::from("#!/usr/bin/env python3\n");
    for cell in build(history, meta, config) {
        out.push('\n');
        match cell {
            Cell::Markdown(text) => {
                out.push_str("# %% [markdown]\n");
                out.push_str(&comment(&text));
            }
            Cell::Code(code) => {
                out.push_str("# %%\n");
                out.push_str(&code);
                if !code.ends_with('\n') {
                    out.push('\n');
                }
            }
        }
    }
    out
}

enum Cell {
    Markdown(String),
    Code(String),
}

/// nbformat's `source`: the lines, each but the last with its newline.
fn source_lines(text: &str) -> Vec<String> {
    let text = text.strip_suffix('\n').unwrap_or(text);
    text.split_inclusive('\n').map(str::to_owned).collect()
}

fn build(history: &[Message], meta: &ExportMeta, config: &Config) -> Vec<Cell> {
    let mut b = Builder {
        config,
        cells: Vec::new(),
        refs: HashMap::new(),
        step: 0,
        connections: BTreeMap::new(),
    };
    for (i, m) in history.iter().enumerate() {
        match m.role {
            Role::User => b.md(format!("## Question\n\n{}", m.content.trim())),
            Role::Assistant if m.tool_calls.is_empty() => {
                if !m.content.trim().is_empty() {
                    b.md(format!("## Answer\n\n{}", m.content.trim()));
                }
            }
            Role::Assistant => {
                if !m.content.trim().is_empty() {
                    b.md(format!("*The agent:* {}", m.content.trim()));
                }
                let results = results_after(history, i);
                for call in &m.tool_calls {
                    b.call(call, results.get(call.id.as_str()).copied());
                }
            }
            Role::System | Role::Tool => {}
        }
    }
    let mut cells = vec![
        Cell::Markdown(header(meta, config, &b.connections)),
        Cell::Code(setup(config, &b.connections)),
    ];
    cells.append(&mut b.cells);
    cells
}

/// The tool messages answering the calls of the assistant message at `at`: those after it,
/// up to the next assistant or user message (ids are only unique within a turn).
fn results_after(history: &[Message], at: usize) -> HashMap<&str, &str> {
    let mut out = HashMap::new();
    for m in history.iter().skip(at + 1) {
        match m.role {
            Role::Tool => {
                if let Some(id) = m.tool_call_id.as_deref() {
                    out.entry(id).or_insert(m.content.as_str());
                }
            }
            Role::System => {}
            Role::User | Role::Assistant => break,
        }
    }
    out
}

struct Builder<'a> {
    config: &'a Config,
    cells: Vec<Cell>,
    /// dataRef → the Python expression holding that table.
    refs: HashMap<String, String>,
    step: usize,
    /// Sources read, by name → their connection variable.
    connections: BTreeMap<String, String>,
}

impl Builder<'_> {
    fn md(&mut self, text: String) {
        self.cells.push(Cell::Markdown(text));
    }

    fn code(&mut self, text: String) {
        self.cells.push(Cell::Code(text));
    }

    fn call(&mut self, call: &AssistantToolCall, result: Option<&str>) {
        self.step += 1;
        let n = self.step;
        let tool = &call.name;
        let Some(result) = result else {
            self.md(format!(
                "**Step {n}:** {} has no recorded result (the run ended before it answered); \
                 it is not reproduced.",
                tick(tool)
            ));
            return;
        };
        if result.starts_with("error:") {
            let first = result.lines().next().unwrap_or("");
            let first = first.strip_prefix("error:").unwrap_or(first).trim();
            self.md(format!(
                "**Step {n}:** {} failed, so it is not reproduced:\n\n> {}",
                tick(tool),
                one_line(first)
            ));
            return;
        }
        let args = match serde_json::from_str::<Value>(&call.arguments) {
            Ok(Value::Object(m)) => m,
            _ => {
                self.md(format!(
                    "**Step {n}:** {} was called with arguments that are not a JSON object; \
                     it is not reproduced.",
                    tick(tool)
                ));
                return;
            }
        };
        let parsed = parse_result(result);
        let query = self
            .config
            .queries
            .values()
            .find(|q| q.tool_name() == *tool);
        match (tool.as_str(), query) {
            (_, Some(q)) => self.fetch(n, q, &args, parsed.as_ref(), result),
            ("query", None) => self.query(n, &args, parsed.as_ref(), result),
            ("run_python", None) => self.run_python(n, &args, parsed.as_ref(), result),
            ("render_chart", None) => self.chart(n, &args, parsed.as_ref()),
            ("render_table", None) => self.table(n, &args),
            ("export_data", None) => self.export(n, &args, parsed.as_ref()),
            ("call_tool", None) => self.call_tool(n, &args),
            _ => self.other(n, tool, &args),
        }
    }

    /// The connection variable of `source`, recorded for the setup cell.
    fn connection(&mut self, source: &SourceConfig) -> String {
        if let Some(v) = self.connections.get(&source.name) {
            return v.clone();
        }
        let base = format!("con_{}", py_ident(&source.name));
        let mut name = base.clone();
        let mut k = 2;
        while self.connections.values().any(|v| *v == name) {
            name = format!("{base}_{k}");
            k += 1;
        }
        self.connections.insert(source.name.clone(), name.clone());
        name
    }

    fn source(&self, n: usize, name: &str) -> Result<SourceConfig, String> {
        let Some(source) = self.config.sources.get(name) else {
            return Err(format!(
                "**Step {n}:** read source {}, which this config does not have; it is not \
                 reproduced.",
                tick(name)
            ));
        };
        match source.kind {
            SourceKind::Sqlite { .. } | SourceKind::Postgres { .. } => Ok(source.clone()),
            _ => Err(format!(
                "**Step {n}:** read source {}, whose kind this export cannot connect to; it \
                 is not reproduced.",
                tick(name)
            )),
        }
    }

    fn fetch(
        &mut self,
        n: usize,
        q: &QueryConfig,
        args: &Map<String, Value>,
        parsed: Option<&Value>,
        raw: &str,
    ) {
        let source = match self.source(n, &q.source) {
            Ok(s) => s,
            Err(note) => return self.md(note),
        };
        let con = self.connection(&source);
        let var = format!("{}_{n}", py_ident(&q.name));
        let params: Vec<(String, Value)> = q
            .params
            .iter()
            .map(|p| {
                let v = match args.get(&p.name) {
                    Some(v) if !v.is_null() => v.clone(),
                    _ => p.default.clone().unwrap_or(Value::Null),
                };
                (p.name.clone(), param_value(p.ty, v))
            })
            .collect();
        let given: Vec<String> = args
            .iter()
            .map(|(k, v)| format!("{k}={}", arg_text(v)))
            .collect();
        self.md(format!(
            "### Step {n}: {}\n\nThe configured query {} on source {}{}.",
            tick(&q.tool_name()),
            tick(&q.name),
            tick(&q.source),
            if given.is_empty() {
                String::new()
            } else {
                format!(", with {}", tick(&given.join(", ")))
            }
        ));
        let sql = match (&source.kind, params.is_empty()) {
            (SourceKind::Postgres { .. }, false) => pyformat(&q.sql),
            _ => q.sql.clone(),
        };
        let mut dates = result_dates(parsed);
        if dates.is_empty() && parsed.is_none() {
            dates = q
                .columns
                .iter()
                .filter(|(_, t)| matches!(t, ColumnType::Date | ColumnType::Timestamp))
                .map(|(c, _)| c.clone())
                .collect();
        }
        let mut code = format!(
            "# Step {n}: `{}`, the configured query `{}` on source `{}`.\n",
            one_line(&q.tool_name()),
            one_line(&q.name),
            one_line(&q.source)
        );
        code.push_str(&produced_comment(parsed, raw));
        code.push_str(&read_sql(&var, &sql, &con, &params, &dates));
        self.code(code);
        self.produced(parsed, raw, var);
    }

    fn query(&mut self, n: usize, args: &Map<String, Value>, parsed: Option<&Value>, raw: &str) {
        let (Some(name), Some(sql)) = (str_arg(args, "source"), str_arg(args, "sql")) else {
            return self.md(format!(
                "**Step {n}:** `query` without a `source` and `sql`; it is not reproduced."
            ));
        };
        let source = match self.source(n, name) {
            Ok(s) => s,
            Err(note) => return self.md(note),
        };
        let con = self.connection(&source);
        let var = format!("query_{n}");
        self.md(format!(
            "### Step {n}: `query`\n\nSQL the agent wrote, on source {}.",
            tick(name)
        ));
        let mut code = format!(
            "# Step {n}: `query`, the agent's SQL on source `{}`.\n",
            one_line(name)
        );
        code.push_str(&produced_comment(parsed, raw));
        code.push_str(&read_sql(&var, sql, &con, &[], &result_dates(parsed)));
        self.code(code);
        self.produced(parsed, raw, var);
    }

    /// Maps the producer's dataRef to `var`.
    fn produced(&mut self, parsed: Option<&Value>, raw: &str, var: String) {
        let data_ref = parsed
            .and_then(|v| v.get("dataRef"))
            .and_then(Value::as_str)
            .map(str::to_owned)
            .or_else(|| scan_refs(raw).into_iter().next().map(|(_, r)| r));
        if let Some(r) = data_ref {
            self.refs.insert(r, var);
        }
    }

    fn run_python(
        &mut self,
        n: usize,
        args: &Map<String, Value>,
        parsed: Option<&Value>,
        raw: &str,
    ) {
        if let Some(v) = parsed
            && v.get("ok") == Some(&Value::Bool(false))
        {
            let kind = v
                .pointer("/error/type")
                .and_then(Value::as_str)
                .unwrap_or("error");
            let message = v
                .pointer("/error/message")
                .and_then(Value::as_str)
                .and_then(|m| m.lines().next())
                .unwrap_or("");
            return self.md(format!(
                "**Step {n}:** `run_python` failed, so it is not reproduced:\n\n> {}: {}",
                one_line(kind),
                one_line(message)
            ));
        }
        let code = str_arg(args, "code");
        let code_file = str_arg(args, "code_file");
        if code.is_none() && code_file.is_none() {
            return self.md(format!(
                "**Step {n}:** `run_python` without `code`; it is not reproduced."
            ));
        }
        self.md(format!(
            "### Step {n}: `run_python`\n\nThe agent's Python, as it ran in dataref's sandbox."
        ));
        let mut out = format!("# Step {n}: `run_python`, the agent's code verbatim.\n");
        if let Some(Value::Object(inputs)) = args.get("inputs") {
            for (name, r) in inputs {
                let r = r.as_str().unwrap_or("");
                let ident = py_ident(name);
                match self.refs.get(r) {
                    Some(expr) => {
                        let _ = writeln!(out, "{ident} = {expr}.copy()");
                    }
                    None => {
                        let _ = writeln!(
                            out,
                            "# `{}` ({}) came from outside this session: bind `{ident}` to \
                             that table before running this cell.",
                            one_line(name),
                            one_line(r)
                        );
                    }
                }
            }
        }
        if let Some(Value::Array(files)) = args.get("files")
            && !files.is_empty()
        {
            out.push_str(
                "# The code reads workspace files, which the sandbox put under `in/files/`; \
                 copy them\n# there (beside this notebook) first:\n",
            );
            for f in files {
                let _ = writeln!(out, "#   in/files/{}", one_line(f.as_str().unwrap_or("?")));
            }
        }
        let body = code.unwrap_or("");
        if body.contains("out/files") || code_file.is_some() {
            out.push_str("os.makedirs(os.path.join(\"out\", \"files\"), exist_ok=True)\n");
        }
        out.push_str("outputs = {}\nresult = None\n\n");
        match (code, code_file) {
            (Some(code), _) => {
                out.push_str(code);
                if !code.ends_with('\n') {
                    out.push('\n');
                }
            }
            (None, Some(file)) => {
                let _ = writeln!(
                    out,
                    "# The code was the workspace file `{}` (not recorded here): run it if you \
                     have it.\nwith open({}, encoding=\"utf-8\") as _f:\n    exec(_f.read())",
                    one_line(file),
                    py_str(file)
                );
            }
            (None, None) => {}
        }
        let _ = writeln!(
            out,
            "\nstep{n}_outputs = {{name: _as_table(table) for name, table in outputs.items()}}"
        );
        let defines_result = code.is_none_or(|c| c.contains("result"));
        if defines_result {
            let _ = writeln!(out, "step{n}_result = result");
            let _ = writeln!(out, "print(\"step {n} result:\", step{n}_result)");
        }
        if let Some(r) = parsed.and_then(|v| v.get("result"))
            && !r.is_null()
        {
            let _ = writeln!(
                out,
                "# In the session the run returned result = {}",
                one_line(&truncate_chars(&r.to_string(), 2000))
            );
        }
        // The outputs it stored, by name → dataRef.
        let mut outputs: Vec<(String, String, Option<&Value>)> = Vec::new();
        if let Some(v) = parsed {
            if let Some(Value::Object(o)) = v.get("outputs") {
                for (name, d) in o {
                    if let Some(r) = d.get("dataRef").and_then(Value::as_str) {
                        outputs.push((name.clone(), r.to_owned(), Some(d)));
                    }
                }
            }
            if let Some(Value::Object(o)) = v.get("moreOutputs") {
                for (name, r) in o {
                    if let Some(r) = r.as_str() {
                        outputs.push((name.clone(), r.to_owned(), None));
                    }
                }
            }
        } else {
            outputs = scan_refs(raw)
                .into_iter()
                .filter_map(|(name, r)| Some((name?, r, None)))
                .collect();
        }
        for (name, r, d) in &outputs {
            let _ = writeln!(
                out,
                "# It stored `{}` as {}{}.",
                one_line(name),
                one_line(r),
                d.map(shape).unwrap_or_default()
            );
        }
        self.code(out);
        for (name, r, _) in outputs {
            self.refs
                .insert(r, format!("step{n}_outputs[{}]", py_str(&name)));
        }
    }

    /// The Python expression of a consumer's table, or the comment saying it has none.
    fn table_of(&self, r: &str) -> Result<String, String> {
        match self.refs.get(r) {
            Some(expr) => Ok(expr.clone()),
            None if r.starts_with("data_") => Err(format!(
                "# The table ({}) came from outside this session: this step is not reproduced.\n",
                one_line(r)
            )),
            None => Err(format!(
                "# The table was the workspace file `{}`, from outside this session: this step \
                 is not reproduced.\n",
                one_line(r)
            )),
        }
    }

    fn chart(&mut self, n: usize, args: &Map<String, Value>, parsed: Option<&Value>) {
        let r = str_arg(args, "dataRef").unwrap_or("");
        let x = str_arg(args, "x").unwrap_or("");
        let ys: Vec<String> = match args.get("y") {
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect(),
            _ => Vec::new(),
        };
        let kind = str_arg(args, "kind").unwrap_or("bar");
        let group = str_arg(args, "group");
        let title = str_arg(args, "title");
        let sort = str_arg(args, "sort");
        let top = args.get("top").and_then(Value::as_u64);
        let what = if ys.is_empty() {
            "the count of rows".to_owned()
        } else {
            ys.iter().map(|y| tick(y)).collect::<Vec<_>>().join(", ")
        };
        let mut said = format!(
            "**Shown to the person** (step {n}): a {} chart of {what} by {}",
            one_line(kind),
            tick(x)
        );
        if let Some(g) = group {
            let _ = write!(said, ", one series per {}", tick(g));
        }
        match sort {
            Some("x") => said.push_str(", in the order of its x values"),
            Some("ascending") => said.push_str(", smallest total first"),
            Some("descending") => said.push_str(", largest total first"),
            _ => {}
        }
        if let Some(top) = top {
            let _ = write!(
                said,
                ", the top {top} kept and the rest summed into `other`"
            );
        }
        if let Some(t) = title {
            let _ = write!(said, ", titled “{}”", one_line(t));
        }
        let _ = write!(said, ", drawn from {}.", self.shown_from(r));
        self.md(said);
        let mut code = format!(
            "# Step {n}: the chart, drawn again with pandas (dataref's renderer drew the one the\n\
             # person saw: this is close to it, not identical).\n"
        );
        let expr = match self.table_of(r) {
            Ok(e) => e,
            Err(c) => {
                code.push_str(&c);
                return self.code(code);
            }
        };
        let _ = writeln!(code, "_table = {expr}");
        code.push_str("try:\n    import matplotlib.pyplot as plt\nexcept ImportError:\n");
        let _ = writeln!(
            code,
            "    print(\"step {n}: matplotlib is not installed, so the chart is not drawn \
             (pip install matplotlib)\")\nelse:"
        );
        let x_lit = py_str(x);
        let ys_lit = format!(
            "[{}]",
            ys.iter().map(|y| py_str(y)).collect::<Vec<_>>().join(", ")
        );
        let mut opts = String::new();
        if let Some(t) = title {
            let _ = write!(opts, ", title={}", py_str(t));
        }
        let (w, h) = (
            args.get("width").and_then(Value::as_u64),
            args.get("height").and_then(Value::as_u64),
        );
        if w.is_some() || h.is_some() {
            let _ = write!(
                opts,
                ", figsize=({:.1}, {:.1})",
                w.unwrap_or(800) as f64 / 100.0,
                h.unwrap_or(500) as f64 / 100.0
            );
        }
        match kind {
            "histogram" => {
                let _ = writeln!(code, "    _ax = _table[{x_lit}].plot(kind=\"hist\"{opts})");
            }
            "scatter" if !ys.is_empty() => {
                let _ = writeln!(
                    code,
                    "    _ax = _table.plot(kind=\"scatter\", x={x_lit}, y={}{opts})",
                    py_str(&ys[0])
                );
            }
            _ => {
                match (group, ys.is_empty()) {
                    (Some(g), false) => {
                        let _ = writeln!(
                            code,
                            "    _plot = _table.pivot_table(index={x_lit}, columns={}, \
                             values={ys_lit}, aggfunc=\"sum\", sort=False)",
                            py_str(g)
                        );
                    }
                    (Some(g), true) => {
                        let _ = writeln!(
                            code,
                            "    _plot = _table.groupby([{x_lit}, {}], sort=False).size()\
                             .unstack(fill_value=0)",
                            py_str(g)
                        );
                    }
                    (None, false) => {
                        let _ = writeln!(
                            code,
                            "    _plot = _table.groupby({x_lit}, sort=False)[{ys_lit}].sum()"
                        );
                    }
                    (None, true) => {
                        let _ = writeln!(
                            code,
                            "    _plot = _table.groupby({x_lit}, sort=False).size().to_frame(\"rows\")"
                        );
                    }
                }
                if let Some(top) = top {
                    let _ = writeln!(
                        code,
                        "    if len(_plot) > {top}:\n        _keep = _plot.index.isin(_plot.sum(axis=1).abs().nlargest({top}).index)\n        \
                         _plot = pd.concat([_plot[_keep], _plot[~_keep].sum().to_frame(\"other\").T])"
                    );
                }
                match sort {
                    Some("x") => code.push_str("    _plot = _plot.sort_index()\n"),
                    Some("ascending") => code.push_str(
                        "    _plot = _plot.loc[_plot.sum(axis=1).sort_values(ascending=True).index]\n",
                    ),
                    Some("descending") => code.push_str(
                        "    _plot = _plot.loc[_plot.sum(axis=1).sort_values(ascending=False).index]\n",
                    ),
                    _ => {}
                }
                let (kind, series) = match kind {
                    "line" => ("line", ""),
                    "area" => ("area", ""),
                    "pie" => ("pie", ".iloc[:, 0]"),
                    _ => ("bar", ""),
                };
                let _ = writeln!(code, "    _ax = _plot{series}.plot(kind=\"{kind}\"{opts})");
            }
        }
        let file = parsed
            .and_then(|v| v.get("path"))
            .and_then(Value::as_str)
            .filter(|p| safe_relative(p))
            .map_or_else(|| format!("charts/step{n}.png"), str::to_owned);
        let _ = writeln!(
            code,
            "    os.makedirs(os.path.dirname({f}) or \".\", exist_ok=True)\n    \
             _ax.figure.savefig({f}, bbox_inches=\"tight\")\n    print(\"step {n}: drew\", {f})",
            f = py_str(&file)
        );
        self.code(code);
    }

    fn shown_from(&self, r: &str) -> String {
        match self.refs.get(r) {
            Some(expr) => tick(expr),
            None => format!("{} (from outside this session)", tick(r)),
        }
    }

    fn table(&mut self, n: usize, args: &Map<String, Value>) {
        let r = str_arg(args, "dataRef").unwrap_or("");
        let columns: Option<Vec<String>> = args.get("columns").and_then(Value::as_array).map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        });
        let sort = str_arg(args, "sort");
        let descending = args
            .get("descending")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let limit = args.get("limit").and_then(Value::as_u64).unwrap_or(100);
        let mut said = format!(
            "**Shown to the person** (step {n}): a table of the first {limit} rows of {}",
            self.shown_from(r)
        );
        if let Some(c) = &columns {
            let _ = write!(
                said,
                ", columns {}",
                c.iter().map(|c| tick(c)).collect::<Vec<_>>().join(", ")
            );
        }
        if let Some(s) = sort {
            let _ = write!(
                said,
                ", sorted by {}{}",
                tick(s),
                if descending { " (largest first)" } else { "" }
            );
        }
        said.push('.');
        self.md(said);
        let mut code = format!("# Step {n}: the table the person saw.\n");
        let expr = match self.table_of(r) {
            Ok(e) => e,
            Err(c) => {
                code.push_str(&c);
                return self.code(code);
            }
        };
        let _ = writeln!(code, "_shown = {expr}");
        if let Some(c) = &columns {
            let _ = writeln!(code, "_shown = _shown[{}]", py_list(c));
        }
        if let Some(s) = sort {
            let _ = writeln!(
                code,
                "_shown = _shown.sort_values({}, ascending={})",
                py_str(s),
                if descending { "False" } else { "True" }
            );
        }
        let _ = writeln!(code, "_shown = _shown.head({limit})");
        code.push_str(
            "try:\n    display(_shown)\nexcept NameError:\n    print(_shown.to_string())\n",
        );
        self.code(code);
    }

    fn export(&mut self, n: usize, args: &Map<String, Value>, parsed: Option<&Value>) {
        let source = str_arg(args, "source").unwrap_or("");
        let format = str_arg(args, "format").unwrap_or("csv");
        let ext = match format {
            "xlsx" | "parquet" | "json" | "ndjson" => format,
            _ => "csv",
        };
        let stem = match str_arg(args, "filename") {
            Some(name) => {
                let suffix = format!(".{ext}");
                let cut = name.len().saturating_sub(suffix.len());
                if name.is_char_boundary(cut) && name[cut..].eq_ignore_ascii_case(&suffix) {
                    name[..cut].to_owned()
                } else {
                    name.to_owned()
                }
            }
            None => parsed
                .and_then(|v| v.get("path"))
                .and_then(Value::as_str)
                .and_then(|p| p.rsplit('/').next())
                .and_then(|f| f.strip_suffix(&format!(".{ext}")))
                .map_or_else(|| format!("export-step{n}"), str::to_owned),
        };
        let stem: String = stem
            .trim_start_matches('.')
            .chars()
            .map(|c| {
                if c == '/' || c == '\\' || c.is_control() {
                    '_'
                } else {
                    c
                }
            })
            .collect();
        let stem = if stem.is_empty() {
            format!("export-step{n}")
        } else {
            stem
        };
        let file = format!("exports/{stem}.{ext}");
        self.md(format!(
            "**Step {n}:** {} exported to the person as {}, from {}.",
            tick(format),
            tick(&file),
            self.shown_from(source)
        ));
        let mut code = format!("# Step {n}: the export, written again with pandas.\n");
        let expr = match self.table_of(source) {
            Ok(e) => e,
            Err(c) => {
                code.push_str(&c);
                return self.code(code);
            }
        };
        let _ = writeln!(code, "_export = {expr}");
        if let Some(cols) = args.get("columns").and_then(Value::as_array) {
            let cols: Vec<String> = cols
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect();
            let _ = writeln!(code, "_export = _export[{}]", py_list(&cols));
        }
        if let Some(by) = str_arg(args, "sort_by") {
            let desc = args
                .get("descending")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let _ = writeln!(
                code,
                "_export = _export.sort_values({}, ascending={}, kind=\"stable\")",
                py_str(by),
                if desc { "False" } else { "True" }
            );
        }
        let offset = args.get("offset").and_then(Value::as_u64).unwrap_or(0);
        let limit = args.get("limit").and_then(Value::as_u64);
        if offset > 0 || limit.is_some() {
            let end = limit.map(|l| (offset + l).to_string()).unwrap_or_default();
            let _ = writeln!(code, "_export = _export.iloc[{offset}:{end}]");
        }
        if let Some(Value::Object(h)) = args.get("headers") {
            let _ = writeln!(
                code,
                "_export = _export.rename(columns={})",
                py_value(&Value::Object(h.clone()))
            );
        }
        let bom = args.get("bom").and_then(Value::as_bool).unwrap_or(false);
        let path = py_str(&file);
        code.push_str("os.makedirs(\"exports\", exist_ok=True)\n");
        match ext {
            "xlsx" => {
                let _ = writeln!(
                    code,
                    "_export.to_excel({path}, index=False)  # needs openpyxl"
                );
            }
            "parquet" => {
                let _ = writeln!(code, "_export.to_parquet({path}, index=False)");
            }
            "json" => {
                let _ = writeln!(
                    code,
                    "_export.to_json({path}, orient=\"records\", date_format=\"iso\")"
                );
            }
            "ndjson" => {
                let _ = writeln!(
                    code,
                    "_export.to_json({path}, orient=\"records\", lines=True, date_format=\"iso\")"
                );
            }
            _ => {
                let encoding = if bom { "utf-8-sig" } else { "utf-8" };
                let _ = writeln!(
                    code,
                    "_export.to_csv({path}, index=False, encoding=\"{encoding}\")"
                );
            }
        }
        let _ = writeln!(
            code,
            "print(\"step {n}: wrote\", {path}, len(_export), \"rows\")"
        );
        self.code(code);
    }

    fn call_tool(&mut self, n: usize, args: &Map<String, Value>) {
        let target = str_arg(args, "tool").unwrap_or("?");
        let file = str_arg(args, "args_file").unwrap_or("?");
        let mut text = format!(
            "**Step {n}:** `call_tool` ran {} with arguments from the workspace file {}",
            tick(target),
            tick(file)
        );
        if let Some(o) = args.get("overrides").filter(|o| !o.is_null()) {
            text.push_str(", overridden by the agent with:\n\n");
            text.push_str(&fenced(&pretty_args(o)));
            text.push_str("\n\n");
        } else {
            text.push_str(". ");
        }
        text.push_str(
            "Those arguments were made by code and the file may be gone: this step is not \
             reproduced.",
        );
        self.md(text);
    }

    fn other(&mut self, n: usize, tool: &str, args: &Map<String, Value>) {
        let mut text = format!(
            "**Step {n}:** the agent called {}, which this record does not reproduce",
            tick(tool)
        );
        if args.is_empty() {
            text.push('.');
        } else {
            text.push_str(", with:\n\n");
            text.push_str(&fenced(&pretty_args(&Value::Object(args.clone()))));
        }
        self.md(text);
    }
}

fn header(meta: &ExportMeta, config: &Config, connections: &BTreeMap<String, String>) -> String {
    let mut h = format!(
        "# dataref session {}\n\n\
         The reproducible record of an analysis with dataref: the questions, every query and \
         every piece of code the agent ran, and its answers. It holds no rows of data: running \
         it re-runs every step against the sources with your own credentials, so it shows \
         the data as it is now and as you may see it.\n\n\
         - Session: {}\n- Agent: {}\n- Principal: {}\n- Exported: {}\n\n\
         ## How to run it\n\n\
         1. `pip install pandas pyarrow`, plus `psycopg` for PostgreSQL sources \
         (`matplotlib` draws the charts, `openpyxl` writes XLSX exports).\n",
        tick(&meta.session),
        tick(&meta.session),
        tick(&meta.agent),
        tick(&meta.principal),
        meta.exported
    );
    if connections.is_empty() {
        h.push_str("2. No source was read in this session.\n");
    } else {
        h.push_str("2. The sources it reads:\n");
        for name in connections.keys() {
            let Some(s) = config.sources.get(name) else {
                continue;
            };
            match &s.kind {
                SourceKind::Sqlite { path } => {
                    let _ = writeln!(
                        h,
                        "   - {} (SQLite), read-only from {} (set `{}` to read another copy).",
                        tick(name),
                        tick(&path.display().to_string()),
                        env_name(name, "PATH")
                    );
                }
                _ => {
                    let _ = writeln!(
                        h,
                        "   - {} (PostgreSQL): set `{}` to a `postgresql://` URL that logs in \
                         as you.",
                        tick(name),
                        env_name(name, "URL")
                    );
                }
            }
        }
    }
    h.push_str(
        "3. **Read the code first.** The `run_python` steps are code the model wrote; in \
         dataref they ran in a sandbox (no network, no files but their inputs). Here they run \
         as you, next to your database connections. Nothing runs until you set \
         `DATAREF_RUN_AGENT_CODE=1`.\n\
         4. Run it top to bottom: as a notebook in Jupyter, or the script form with `python`. \
         Charts go to `charts/` and exports to `exports/` in the working directory.\n",
    );
    h
}

fn setup(config: &Config, connections: &BTreeMap<String, String>) -> String {
    let mut s = String::from(
        "# Setup: the libraries, and a connection to each source the session read.\n\
         import os\nimport pathlib\nimport sqlite3\nimport warnings\n\n\
         # The run_python steps are the model's code, which ran in dataref's sandbox; here it\n\
         # runs as you. Read it, then run with DATAREF_RUN_AGENT_CODE=1.\n\
         if os.environ.get(\"DATAREF_RUN_AGENT_CODE\") != \"1\":\n    \
         raise SystemExit(\"read the code first (it was written by a model), then set \
         DATAREF_RUN_AGENT_CODE=1 to run it\")\n\n\
         import numpy as np\nimport pandas as pd\n\n\
         # pandas warns about plain DB-API connections (psycopg); reading through them works.\n\
         warnings.filterwarnings(\"ignore\", message=\"pandas only supports SQLAlchemy\")\n\n\n\
         def _as_table(value):\n    \
         \"\"\"An output as dataref stores it: a DataFrame, a non-default index kept as columns.\"\"\"\n    \
         if isinstance(value, pd.Series):\n        value = value.to_frame()\n    \
         index = value.index\n    \
         if not (isinstance(index, pd.RangeIndex) and index.start == 0 and index.step == 1 \
         and index.name is None):\n        value = value.reset_index()\n    \
         return value\n",
    );
    for (name, var) in connections {
        let Some(source) = config.sources.get(name) else {
            continue;
        };
        s.push('\n');
        match &source.kind {
            SourceKind::Sqlite { path } => {
                let env = env_name(name, "PATH");
                let _ = writeln!(
                    s,
                    "# Source `{n}` (SQLite), read-only at the path of dataref's config; {env}\n\
                     # overrides it.\n\
                     _path = os.environ.get({env_lit}, {path})\n\
                     if not os.path.exists(_path):\n    \
                     raise SystemExit({msg} + _path + {hint})\n\
                     {var} = sqlite3.connect(pathlib.Path(_path).resolve().as_uri() + \"?mode=ro\", uri=True)",
                    n = one_line(name),
                    env_lit = py_str(&env),
                    path = py_str(&path.display().to_string()),
                    msg = py_str(&format!("source `{name}`: no SQLite database at ")),
                    hint = py_str(&format!("; set {env} to its path")),
                );
            }
            _ => {
                let env = env_name(name, "URL");
                let _ = writeln!(
                    s,
                    "# Source `{n}` (PostgreSQL), read-only, logged in with your own credentials \
                     from {env}.\n\
                     try:\n    import psycopg\nexcept ImportError:\n    \
                     raise SystemExit({need})\n\
                     _url = os.environ.get({env_lit})\n\
                     if not _url:\n    raise SystemExit({msg})\n\
                     {var} = psycopg.connect(_url)\n\
                     {var}.read_only = True",
                    n = one_line(name),
                    need = py_str(&format!(
                        "source `{name}` is PostgreSQL: pip install psycopg"
                    )),
                    env_lit = py_str(&env),
                    msg = py_str(&format!(
                        "source `{name}`: set {env} to a postgresql:// URL that logs in as you"
                    )),
                );
            }
        }
    }
    s
}

/// `DATAREF_SOURCE_<NAME>_<WHAT>`, the name upper-cased, other characters as `_`.
fn env_name(source: &str, what: &str) -> String {
    let name: String = source
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("DATAREF_SOURCE_{name}_{what}")
}

/// `var = pd.read_sql_query(sql, con, params=…, parse_dates=…)` and a row count.
fn read_sql(
    var: &str,
    sql: &str,
    con: &str,
    params: &[(String, Value)],
    dates: &[String],
) -> String {
    let mut code = format!(
        "{var} = pd.read_sql_query(\n    {},\n    {con},\n",
        py_multiline(sql, "    ")
    );
    if !params.is_empty() {
        let items: Vec<String> = params
            .iter()
            .map(|(k, v)| format!("{}: {}", py_str(k), py_value(v)))
            .collect();
        let _ = writeln!(code, "    params={{{}}},", items.join(", "));
    }
    if !dates.is_empty() {
        let _ = writeln!(code, "    parse_dates={},", py_list(dates));
    }
    let _ = writeln!(
        code,
        ")\nprint({}, len({var}), \"rows\")",
        py_str(&format!("{var}:"))
    );
    code
}

/// What the session's run of a producer got: its dataRef, row count and columns.
fn produced_comment(parsed: Option<&Value>, raw: &str) -> String {
    let Some(v) = parsed else {
        return match scan_refs(raw).into_iter().next() {
            Some((_, r)) => format!("# In the session: {}.\n", one_line(&r)),
            None => String::new(),
        };
    };
    match v.get("dataRef").and_then(Value::as_str) {
        Some(r) => format!("# In the session: {}{}.\n", one_line(r), shape(v)),
        None => String::new(),
    }
}

/// `, 120 rows of date, line, …` from a description.
fn shape(d: &Value) -> String {
    let mut s = String::new();
    if let Some(rows) = d.get("rows").and_then(Value::as_u64) {
        let _ = write!(s, ", {rows} rows");
    }
    if let Some(Value::Object(cols)) = d.get("columns") {
        let names: Vec<&str> = cols.keys().map(String::as_str).collect();
        if !names.is_empty() {
            let _ = write!(
                s,
                " of {}",
                one_line(&truncate_chars(&names.join(", "), 400))
            );
        }
    }
    s
}

/// The date and timestamp columns of a producer's result, to parse as pandas datetimes (the
/// sandbox gave them to the code that way).
fn result_dates(parsed: Option<&Value>) -> Vec<String> {
    let Some(Value::Object(cols)) = parsed.and_then(|v| v.get("columns")) else {
        return Vec::new();
    };
    cols.iter()
        .filter(|(_, t)| {
            t.as_str()
                .is_some_and(|t| t == "date" || t.starts_with("timestamp"))
        })
        .map(|(c, _)| c.clone())
        .collect()
}

/// A parameter's value as the source binds it: timestamps in SQLite's text form.
fn param_value(ty: ParamType, v: Value) -> Value {
    match (ty, &v) {
        (ParamType::Timestamp, Value::String(s)) => {
            let t = s.strip_suffix('Z').unwrap_or(s);
            let offset = t.get(19..).is_none_or(|rest| rest.contains(['+', '-']));
            if t.as_bytes().get(10) == Some(&b'T') && !offset {
                Value::String(t.replacen('T', " ", 1))
            } else {
                v
            }
        }
        _ => v,
    }
}

/// The result JSON: the whole text, or its first line (a note may follow it).
fn parse_result(text: &str) -> Option<Value> {
    serde_json::from_str::<Value>(text)
        .ok()
        .or_else(|| serde_json::from_str(text.lines().next()?).ok())
        .filter(Value::is_object)
}

/// The dataRefs in a result too long to parse (cut for the context), each with the key of
/// the object it is in (`"qoq_delta":{"dataRef":"data_…"`).
fn scan_refs(text: &str) -> Vec<(Option<String>, String)> {
    const KEY: &str = "\"dataRef\":\"";
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = text[from..].find(KEY) {
        let key_at = from + at;
        let start = key_at + KEY.len();
        let end = text[start..].find('"').map_or(text.len(), |e| start + e);
        from = end;
        let Ok(r) = DataRef::parse(&text[start..end]) else {
            continue;
        };
        let before = &text[..key_at];
        let name = before
            .strip_suffix('{')
            .and_then(|b| b.strip_suffix("\":"))
            .and_then(|b| {
                let k = b.rfind('"')?;
                let name = &b[k + 1..];
                name.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
                    .then(|| name.to_owned())
            });
        out.push((name, r.as_str().to_owned()));
    }
    out
}

/// SQL for psycopg with parameters: `:name` placeholders as `%(name)s` (outside string
/// literals, quoted identifiers, comments and `::` casts), and every `%` doubled.
fn pyformat(sql: &str) -> String {
    let b = sql.as_bytes();
    let mut out = String::with_capacity(sql.len() + 8);
    let mut i = 0;
    // Inside: 0 code, b'\'' literal, b'"' identifier, b'-' line comment, b'*' block comment.
    let mut state = 0u8;
    let mut depth = 0u32;
    // In an `E'…'` literal, where a backslash escapes the next character.
    let mut escapes = false;
    while i < b.len() {
        let c = b[i];
        if c == b'%' {
            out.push_str("%%");
            i += 1;
            continue;
        }
        match state {
            0 => match c {
                b'\'' | b'"' => {
                    escapes = c == b'\''
                        && i > 0
                        && matches!(b[i - 1], b'E' | b'e')
                        && (i < 2 || !(b[i - 2].is_ascii_alphanumeric() || b[i - 2] == b'_'));
                    state = c;
                }
                b'-' if b.get(i + 1) == Some(&b'-') => state = b'-',
                b'/' if b.get(i + 1) == Some(&b'*') => {
                    state = b'*';
                    depth = 1;
                    out.push_str("/*");
                    i += 2;
                    continue;
                }
                b'$' => {
                    // `$tag$ … $tag$`: copied as it is (its `%` doubled).
                    let mut j = i + 1;
                    while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
                        j += 1;
                    }
                    if j < b.len() && b[j] == b'$' && !b.get(i + 1).is_some_and(u8::is_ascii_digit)
                    {
                        let tag = &sql[i..=j];
                        let end = sql[j + 1..]
                            .find(tag)
                            .map_or(sql.len(), |e| j + 1 + e + tag.len());
                        out.push_str(&sql[i..end].replace('%', "%%"));
                        i = end;
                        continue;
                    }
                }
                b':' if b.get(i + 1) == Some(&b':') => {
                    out.push_str("::");
                    i += 2;
                    continue;
                }
                b':' if b
                    .get(i + 1)
                    .is_some_and(|n| n.is_ascii_alphabetic() || *n == b'_') =>
                {
                    let mut j = i + 1;
                    while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
                        j += 1;
                    }
                    let _ = write!(out, "%({})s", &sql[i + 1..j]);
                    i = j;
                    continue;
                }
                _ => {}
            },
            b'\'' if escapes && c == b'\\' && i + 1 < b.len() && b[i + 1] != b'%' => {
                // The escaped character is copied with the backslash (a `%` is doubled above).
                let len = sql[i + 1..].chars().next().map_or(1, char::len_utf8);
                out.push_str(&sql[i..i + 1 + len]);
                i += 1 + len;
                continue;
            }
            b'\'' | b'"' if c == state => state = 0,
            b'-' if c == b'\n' => state = 0,
            b'*' if c == b'*' && b.get(i + 1) == Some(&b'/') => {
                depth -= 1;
                if depth == 0 {
                    state = 0;
                }
                out.push_str("*/");
                i += 2;
                continue;
            }
            b'*' if c == b'/' && b.get(i + 1) == Some(&b'*') => {
                depth += 1;
                out.push_str("/*");
                i += 2;
                continue;
            }
            _ => {}
        }
        // Copy the whole UTF-8 character.
        let len = sql[i..].chars().next().map_or(1, char::len_utf8);
        out.push_str(&sql[i..i + len]);
        i += len;
    }
    out
}

/// A Python string literal: JSON's escapes are Python's for every character.
fn py_str(s: &str) -> String {
    Value::String(s.to_owned()).to_string()
}

/// A string on several lines as adjacent literals in parentheses, one line each.
fn py_multiline(s: &str, indent: &str) -> String {
    let lines: Vec<&str> = s.split_inclusive('\n').collect();
    if lines.len() <= 1 {
        return py_str(s);
    }
    let mut out = String::from("(\n");
    for l in lines {
        let _ = writeln!(out, "{indent}    {}", py_str(l));
    }
    out.push_str(indent);
    out.push(')');
    out
}

fn py_list(items: &[String]) -> String {
    format!(
        "[{}]",
        items
            .iter()
            .map(|i| py_str(i))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// A JSON value as a Python literal.
fn py_value(v: &Value) -> String {
    match v {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => py_str(s),
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(py_value).collect::<Vec<_>>().join(", ")
        ),
        Value::Object(m) => format!(
            "{{{}}}",
            m.iter()
                .map(|(k, v)| format!("{}: {}", py_str(k), py_value(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

const KEYWORDS: [&str; 35] = [
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield",
];

/// A Python identifier from any name: ASCII letters, digits and `_`, not starting with a
/// digit, not a keyword.
fn py_ident(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, '_');
    }
    if KEYWORDS.contains(&s.as_str()) {
        s.push('_');
    }
    s
}

/// Text as comment lines: every line (`\r` ends one in Python too) behind `# `, control
/// characters replaced.
fn comment(text: &str) -> String {
    let mut out = String::new();
    for line in text.split('\n').flat_map(|l| l.split('\r')) {
        let line = clean(line);
        if line.is_empty() {
            out.push_str("#\n");
        } else {
            let _ = writeln!(out, "# {line}");
        }
    }
    out
}

fn clean(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() && c != '\t' { '?' } else { c })
        .collect()
}

/// Text on one line, for comments and notes.
fn one_line(s: &str) -> String {
    clean(&s.replace("\r\n", " ").replace(['\n', '\r'], " "))
}

/// A markdown code span that survives backticks in `s`.
fn tick(s: &str) -> String {
    let s = one_line(s);
    if s.contains('`') {
        format!("`` {s} ``")
    } else {
        format!("`{s}`")
    }
}

/// A fenced block longer than any run of backticks in `s`.
fn fenced(s: &str) -> String {
    let mut longest = 0;
    let mut run = 0;
    for c in s.chars() {
        run = if c == '`' { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    let fence = "`".repeat((longest + 1).max(3));
    format!("{fence}json\n{s}\n{fence}")
}

/// The model's arguments, pretty, long strings cut.
fn pretty_args(v: &Value) -> String {
    fn cut(v: &Value) -> Value {
        match v {
            Value::String(s) => Value::String(truncate_chars(s, 500)),
            Value::Array(a) => Value::Array(a.iter().map(cut).collect()),
            Value::Object(m) => Value::Object(m.iter().map(|(k, v)| (k.clone(), cut(v))).collect()),
            other => other.clone(),
        }
    }
    serde_json::to_string_pretty(&cut(v)).unwrap_or_default()
}

fn arg_text(v: &Value) -> String {
    match v {
        Value::String(s) => truncate_chars(s, 80),
        other => truncate_chars(&other.to_string(), 80),
    }
}

fn str_arg<'a>(args: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    args.get(key).and_then(Value::as_str)
}

/// A workspace-relative path without `..`, to write beneath the working directory.
fn safe_relative(p: &str) -> bool {
    !p.is_empty()
        && !p.starts_with('/')
        && !p.contains('\\')
        && p.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
        && !p.chars().any(char::is_control)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pyformat_rewrites_placeholders_only_in_code() {
        assert_eq!(
            pyformat(
                "SELECT '%:x' AS a, x::int, 5 % 2 FROM t WHERE d >= :since -- :no\n AND \"c:y\" = :y"
            ),
            "SELECT '%%:x' AS a, x::int, 5 %% 2 FROM t WHERE d >= %(since)s -- :no\n AND \"c:y\" = %(y)s"
        );
        assert_eq!(
            pyformat("SELECT $$ :a % $$, :b"),
            "SELECT $$ :a %% $$, %(b)s"
        );
        assert_eq!(
            pyformat("SELECT E'it\\' :a', :b"),
            "SELECT E'it\\' :a', %(b)s"
        );
        let ts = |s: &str| param_value(ParamType::Timestamp, json!(s));
        assert_eq!(ts("2025-01-02T03:04:05Z"), json!("2025-01-02 03:04:05"));
        assert_eq!(
            ts("2025-01-02T03:04:05+02:00"),
            json!("2025-01-02T03:04:05+02:00")
        );
        assert_eq!(ts("2025-01-02Té"), json!("2025-01-02Té"));
    }

    #[test]
    fn identifiers_and_literals() {
        assert_eq!(py_ident("sales-by region"), "sales_by_region");
        assert_eq!(py_ident("2024"), "_2024");
        assert_eq!(py_ident("class"), "class_");
        assert_eq!(py_str("a\"\"\"b\n\\"), "\"a\\\"\\\"\\\"b\\n\\\\\"");
        assert_eq!(comment("a\rb\n"), "# a\n# b\n#\n");
    }

    #[test]
    fn refs_are_found_in_a_cut_result() {
        let r = "data_AAAAAAAAAAAAAAAAAAAAAA";
        let text =
            format!("{{\"result\":1,\"outputs\":{{\"qoq\":{{\"dataRef\":\"{r}\",\"rows\":3 [… cut");
        assert_eq!(
            scan_refs(&text),
            vec![(Some("qoq".to_owned()), r.to_owned())]
        );
    }
}
