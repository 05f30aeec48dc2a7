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

use dataref_protocol::record::{Entry, RecordedCall};
use dataref_tool::{CALL_TOOL, CallToolArgs};
use serde::Deserialize;

use crate::builtin::{ChartArgs, ExportArgs, QueryArgs, RunPythonArgs, TableArgs};

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
pub fn notebook(record: &[Entry], meta: &ExportMeta, config: &Config) -> Value {
    let cells: Vec<Value> = build(record, meta, config)
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
pub fn script(record: &[Entry], meta: &ExportMeta, config: &Config) -> String {
    let mut out = String::from("#!/usr/bin/env python3\n");
    for cell in build(record, meta, config) {
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

fn build(record: &[Entry], meta: &ExportMeta, config: &Config) -> Vec<Cell> {
    let mut b = Replay {
        config,
        cells: Vec::new(),
        refs: HashMap::new(),
        step: 0,
        connections: BTreeMap::new(),
    };
    for entry in record {
        match entry {
            Entry::Question(text) => b.md(format!("## Question\n\n{text}")),
            Entry::Answer(text) => b.md(format!("## Answer\n\n{text}")),
            Entry::Remark(text) => b.md(format!("*The agent:* {text}")),
            Entry::Call(call) => b.call(call),
        }
    }
    let mut cells = vec![
        Cell::Markdown(header(meta, config, &b.connections)),
        Cell::Code(setup(config, &b.connections)),
    ];
    cells.append(&mut b.cells);
    cells
}

/// What a replay is building: the cells so far, and which Python expression holds each
/// table of the session. Each tool's replay (next to the tool, on its own typed arguments)
/// adds its cells here.
pub(crate) struct Replay<'a> {
    config: &'a Config,
    cells: Vec<Cell>,
    /// dataRef → the Python expression holding that table.
    pub(crate) refs: HashMap<String, String>,
    step: usize,
    /// Sources read, by name → their connection variable.
    connections: BTreeMap<String, String>,
}

/// A call's arguments as its tool reads them, or the note saying why the step is not
/// reproduced (a failed call's arguments never reach here).
fn typed<'a, T: Deserialize<'a>>(n: usize, tool: &str, args: &'a Value) -> Result<T, String> {
    T::deserialize(args).map_err(|e| {
        format!(
            "**Step {n}:** {} was called with arguments it does not take ({}); it is not \
             reproduced.",
            tick(tool),
            one_line(&e.to_string())
        )
    })
}

impl Replay<'_> {
    pub(crate) fn md(&mut self, text: String) {
        self.cells.push(Cell::Markdown(text));
    }

    pub(crate) fn code(&mut self, text: String) {
        self.cells.push(Cell::Code(text));
    }

    fn call(&mut self, call: &RecordedCall) {
        self.step += 1;
        let n = self.step;
        let tool = &call.tool;
        let Some(result) = &call.result else {
            self.md(format!(
                "**Step {n}:** {} has no recorded result (the run ended before it answered); \
                 it is not reproduced.",
                tick(tool)
            ));
            return;
        };
        let raw = result.text.as_str();
        if result.failed {
            let first = raw.lines().next().unwrap_or("");
            let first = first.strip_prefix("error:").unwrap_or(first).trim();
            self.md(format!(
                "**Step {n}:** {} failed, so it is not reproduced:\n\n> {}",
                tick(tool),
                one_line(first)
            ));
            return;
        }
        let value = serde_json::from_str::<Value>(&call.arguments).unwrap_or(Value::Null);
        let Some(args) = value.as_object() else {
            return self.md(format!(
                "**Step {n}:** {} was called with arguments that are not a JSON object; it is \
                 not reproduced.",
                tick(tool)
            ));
        };
        let parsed = parse_result(raw);
        let parsed = parsed.as_ref();
        let config = self.config;
        if let Some(q) = config.queries.values().find(|q| q.tool_name() == *tool) {
            return self.fetch(n, q, args, parsed, raw);
        }
        let done = match tool.as_str() {
            "query" => typed::<QueryArgs>(n, tool, &value).map(|a| a.replay(n, parsed, raw, self)),
            "run_python" => {
                typed::<RunPythonArgs>(n, tool, &value).map(|a| a.replay(n, parsed, raw, self))
            }
            "render_chart" => {
                typed::<ChartArgs>(n, tool, &value).map(|a| a.replay(n, parsed, self))
            }
            "render_table" => typed::<TableArgs>(n, tool, &value).map(|a| a.replay(n, self)),
            "export_data" => {
                typed::<ExportArgs>(n, tool, &value).map(|a| a.replay(n, parsed, self))
            }
            CALL_TOOL => typed::<CallToolArgs>(n, tool, &value).map(|a| self.call_tool(n, &a)),
            _ => {
                self.other(n, tool, args);
                Ok(())
            }
        };
        if let Err(note) = done {
            self.md(note);
        }
    }

    /// The connection variable of `source`, recorded for the setup cell.
    pub(crate) fn connection(&mut self, source: &SourceConfig) -> String {
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

    pub(crate) fn source(&self, n: usize, name: &str) -> Result<SourceConfig, String> {
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
            (SourceKind::Postgres { .. }, false) => {
                dataref_sources::postgres::pyformat_params(&q.sql)
            }
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

    /// Maps the producer's dataRef to `var`.
    pub(crate) fn produced(&mut self, parsed: Option<&Value>, raw: &str, var: String) {
        let data_ref = parsed
            .and_then(|v| v.get("dataRef"))
            .and_then(Value::as_str)
            .map(str::to_owned)
            .or_else(|| scan_refs(raw).into_iter().next().map(|(_, r)| r));
        if let Some(r) = data_ref {
            self.refs.insert(r, var);
        }
    }

    /// The Python expression of a consumer's table, or the comment saying it has none.
    pub(crate) fn table_of(&self, r: &str) -> Result<String, String> {
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

    pub(crate) fn shown_from(&self, r: &str) -> String {
        match self.refs.get(r) {
            Some(expr) => tick(expr),
            None => format!("{} (from outside this session)", tick(r)),
        }
    }

    fn call_tool(&mut self, n: usize, args: &CallToolArgs) {
        let mut text = format!(
            "**Step {n}:** `call_tool` ran {} with arguments from the workspace file {}",
            tick(&args.tool),
            tick(&args.args_file)
        );
        if let Some(o) = &args.overrides {
            text.push_str(", overridden by the agent with:\n\n");
            text.push_str(&fenced(&pretty_args(&Value::Object(o.clone()))));
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
pub(crate) fn read_sql(
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
pub(crate) fn produced_comment(parsed: Option<&Value>, raw: &str) -> String {
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
pub(crate) fn shape(d: &Value) -> String {
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
pub(crate) fn result_dates(parsed: Option<&Value>) -> Vec<String> {
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
pub(crate) fn param_value(ty: ParamType, v: Value) -> Value {
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
pub(crate) fn scan_refs(text: &str) -> Vec<(Option<String>, String)> {
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

/// A Python string literal: JSON's escapes are Python's for every character.
pub(crate) fn py_str(s: &str) -> String {
    Value::String(s.to_owned()).to_string()
}

/// A string on several lines as adjacent literals in parentheses, one line each.
pub(crate) fn py_multiline(s: &str, indent: &str) -> String {
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

pub(crate) fn py_list(items: &[String]) -> String {
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
pub(crate) fn py_value(v: &Value) -> String {
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
pub(crate) fn py_ident(name: &str) -> String {
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
pub(crate) fn one_line(s: &str) -> String {
    clean(&s.replace("\r\n", " ").replace(['\n', '\r'], " "))
}

/// A markdown code span that survives backticks in `s`.
pub(crate) fn tick(s: &str) -> String {
    let s = one_line(s);
    if s.contains('`') {
        format!("`` {s} ``")
    } else {
        format!("`{s}`")
    }
}

/// A fenced block longer than any run of backticks in `s`.
pub(crate) fn fenced(s: &str) -> String {
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
pub(crate) fn pretty_args(v: &Value) -> String {
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

/// A workspace-relative path without `..`, to write beneath the working directory.
pub(crate) fn safe_relative(p: &str) -> bool {
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
    fn timestamps_are_bound_as_postgres_reads_them() {
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
