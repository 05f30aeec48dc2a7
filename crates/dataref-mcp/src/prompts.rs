//! Prompts a person picks in the host ("analyse a table"), each a user message that sets
//! the model on the by-reference workflow: fetch into an artifact, `describe_data`,
//! compute with `run_python` (or SQL), show with `render_chart`/`render_table`/`export_data`.
//!
//! - `analyse_table` (`dataRef`, `question`): a table the caller already stored;
//! - `compare_periods` (`dataRef`, `dateColumn`, `first`, `second`, `measure`);
//! - `analyse_<query>` for every named query `fetch_<query>`, with the query's parameters
//!   as arguments (and `question`).
//!
//! A prompt never embeds rows: a dataRef argument is checked to be the caller's live
//! table (the same answer for unknown, expired and someone else's), and the message names
//! the reference, its shape and nothing of its content. Steps name only tools the registry
//! has.

use std::collections::BTreeMap;

use dataref_protocol::{DataRef, Description, ToolSpec, object_schema};
use dataref_store::{ArtifactMeta, StoreError};
use dataref_tool::{RunContext, ToolRegistry};
use rmcp::ErrorData as McpError;
use rmcp::model::{
    GetPromptResult, JsonObject, ListPromptsResult, Prompt, PromptArgument, PromptMessage, Role,
};
use serde_json::{Map, Value, json};

pub(crate) const ANALYSE_TABLE: &str = "analyse_table";
pub(crate) const COMPARE_PERIODS: &str = "compare_periods";
const QUERY_PREFIX: &str = "analyse_";
const QUESTION: &str = "question";

/// The prompts of one registry, built once.
pub(crate) struct Prompts {
    listed: Vec<Prompt>,
    /// Prompt name → the named query (`fetch_*` spec) it runs.
    queries: BTreeMap<String, ToolSpec>,
    /// Tools the steps may name.
    has: Tools,
}

struct Tools {
    describe: bool,
    python: bool,
    sql: bool,
    query: bool,
    chart: bool,
    table: bool,
    export: bool,
}

impl Prompts {
    pub(crate) fn new(registry: &ToolRegistry) -> Self {
        let has_tool = |n: &str| registry.get(n).is_some();
        let has = Tools {
            describe: has_tool("describe_data"),
            python: has_tool("run_python"),
            sql: has_tool("run_sql"),
            query: has_tool("query"),
            chart: has_tool("render_chart"),
            table: has_tool("render_table"),
            export: has_tool("export_data"),
        };
        let mut listed = vec![
            Prompt::new(
                ANALYSE_TABLE,
                Some(
                    "Analyse a table you already fetched (by its dataRef): its shape, what \
                     stands out, and a chart or table for you, with the rows kept on the server.",
                ),
                Some(vec![
                    data_ref_argument(),
                    PromptArgument::new(QUESTION)
                        .with_title("Question")
                        .with_description("What you want to know (optional)")
                        .with_required(false),
                ]),
            )
            .with_title("Analyse a table"),
            Prompt::new(
                COMPARE_PERIODS,
                Some(
                    "Compare two periods of a stored table (by its dataRef): totals, changes \
                     and a chart of both, computed on the server.",
                ),
                Some(vec![
                    data_ref_argument(),
                    PromptArgument::new("dateColumn")
                        .with_title("Date column")
                        .with_description("The column that says when a row happened")
                        .with_required(true),
                    PromptArgument::new("first")
                        .with_title("First period")
                        .with_description("e.g. `2025-01-01..2025-03-31`, `2025-Q1`, `2024`")
                        .with_required(true),
                    PromptArgument::new("second")
                        .with_title("Second period")
                        .with_description("e.g. `2025-04-01..2025-06-30`, `2025-Q2`, `2025`")
                        .with_required(true),
                    PromptArgument::new("measure")
                        .with_title("Measure")
                        .with_description("The numeric column to compare (optional)")
                        .with_required(false),
                ]),
            )
            .with_title("Compare two periods"),
        ];
        let producer = Some(object_schema::<Description>());
        let mut queries = BTreeMap::new();
        for spec in registry.specs() {
            let Some(query) = spec.name.strip_prefix("fetch_") else {
                continue;
            };
            // A producer's own output schema (as listed, it is widened with the result
            // cap's truncation object).
            let own = registry.get(&spec.name).map(|t| &t.spec().output_schema);
            if own != Some(&producer) {
                continue;
            }
            let name = format!("{QUERY_PREFIX}{query}");
            if name == ANALYSE_TABLE || queries.contains_key(&name) {
                continue;
            }
            listed.push(query_prompt(&name, spec));
            queries.insert(name, spec.clone());
        }
        Self {
            listed,
            queries,
            has,
        }
    }

    pub(crate) fn list(&self) -> ListPromptsResult {
        ListPromptsResult::with_all_items(self.listed.clone())
    }

    /// The named query a prompt runs.
    pub(crate) fn query(&self, prompt: &str) -> Option<&ToolSpec> {
        self.queries.get(prompt)
    }

    pub(crate) async fn get(
        &self,
        name: &str,
        arguments: Option<JsonObject>,
        ctx: &RunContext,
    ) -> Result<GetPromptResult, McpError> {
        let args = Args(arguments.unwrap_or_default());
        let (description, text) = if name == ANALYSE_TABLE {
            let meta = owned_table(ctx, args.required(name, "dataRef")?).await?;
            (
                format!("Analyse {}", meta.data_ref),
                self.analyse_table(&meta, args.optional(QUESTION)),
            )
        } else if name == COMPARE_PERIODS {
            let meta = owned_table(ctx, args.required(name, "dataRef")?).await?;
            let date = args.required(name, "dateColumn")?;
            column(&meta, date)?;
            let measure = args.optional("measure");
            if let Some(m) = measure {
                column(&meta, m)?;
            }
            let first = args.required(name, "first")?;
            let second = args.required(name, "second")?;
            (
                format!("Compare {first} with {second} in {}", meta.data_ref),
                self.compare_periods(&meta, date, first, second, measure),
            )
        } else if let Some(spec) = self.queries.get(name) {
            let call = query_arguments(name, spec, &args)?;
            (
                format!("Fetch with `{}` and analyse", spec.name),
                self.analyse_query(spec, &call, args.optional(QUESTION)),
            )
        } else {
            let names: Vec<&str> = self.listed.iter().map(|p| p.name.as_str()).collect();
            return Err(McpError::invalid_params(
                format!("no prompt `{}`", crate::resources::echo(name)),
                Some(json!({"hint": format!("the prompts are {}", names.join(", "))})),
            ));
        };
        let mut result = GetPromptResult::new(vec![PromptMessage::new_text(Role::User, text)]);
        result.description = Some(description);
        Ok(result)
    }

    fn analyse_table(&self, meta: &ArtifactMeta, question: Option<&str>) -> String {
        let mut t = format!(
            "Analyse the stored table `{}` ({}). ",
            meta.data_ref,
            shape(meta)
        );
        match question {
            Some(q) => t.push_str(&format!("The question: {q}\n\n")),
            None => t.push_str(
                "Find what matters in it: its size and completeness, the main distributions, \
                 trends and outliers.\n\n",
            ),
        }
        t.push_str(&self.steps(&meta.data_ref.to_string(), None));
        t
    }

    fn compare_periods(
        &self,
        meta: &ArtifactMeta,
        date: &str,
        first: &str,
        second: &str,
        measure: Option<&str>,
    ) -> String {
        let what = match measure {
            Some(m) => format!("`{m}`"),
            None => "the numeric columns".to_owned(),
        };
        let mut t = format!(
            "Compare {what} of the stored table `{}` ({}) between two periods of `{date}`: \
             {first} and {second}. Give the totals of each period, the absolute and relative \
             change, and where the change comes from (break it down by the main categories).\n\n",
            meta.data_ref,
            shape(meta),
        );
        t.push_str(&self.steps(
            &meta.data_ref.to_string(),
            Some("a chart of both periods side by side"),
        ));
        t
    }

    fn analyse_query(&self, spec: &ToolSpec, call: &Value, question: Option<&str>) -> String {
        let mut t = format!(
            "Fetch the data with `{}` and these arguments: `{call}`. It stores the rows on the \
             server and returns a `dataRef` with the schema and a small sample. ",
            spec.name
        );
        match question {
            Some(q) => t.push_str(&format!("Then answer: {q}\n\n")),
            None => t.push_str("Then analyse it: what stands out, trends and outliers.\n\n"),
        }
        t.push_str(&self.steps("the dataRef it returns", None));
        t
    }

    /// The by-reference workflow, naming only the tools this server has.
    fn steps(&self, data_ref: &str, show: Option<&str>) -> String {
        let mut steps = Vec::new();
        if self.has.describe {
            steps.push(format!(
                "Look at it with `describe_data` ({data_ref}): statistics per column."
            ));
        }
        if self.has.sql {
            steps.push(format!(
                "Filter, join, group or pivot with `run_sql`, passing {data_ref} in `inputs` \
                 (it is the table of that name in the SQL)."
            ));
        }
        if self.has.python {
            steps.push(format!(
                "Compute with `run_python`, passing {data_ref} in `inputs` (it arrives as a \
                 pandas DataFrame); print only small results."
            ));
        } else if self.has.query && !self.has.sql {
            steps.push("Compute with `query` (read-only SQL on the source).".to_owned());
        }
        let mut show_tools = Vec::new();
        if self.has.chart {
            show_tools.push("`render_chart`");
        }
        if self.has.table {
            show_tools.push("`render_table`");
        }
        if self.has.export {
            show_tools.push("`export_data`");
        }
        if !show_tools.is_empty() {
            steps.push(format!(
                "Show the person {} with {}, by dataRef: the rows go to them, not through you.",
                show.unwrap_or("the result"),
                show_tools.join(", ")
            ));
        }
        let mut t = String::from(
            "Work by reference: never ask for the rows and never copy rows into messages or \
             tool arguments.\n",
        );
        for (i, s) in steps.iter().enumerate() {
            t.push_str(&format!("{}. {s}\n", i + 1));
        }
        t.push_str("Finish with a short summary of what you found, in words and numbers.");
        t
    }
}

fn data_ref_argument() -> PromptArgument {
    PromptArgument::new("dataRef")
        .with_title("Table")
        .with_description("The dataRef of a table you stored (`data_…`)")
        .with_required(true)
}

fn query_prompt(name: &str, spec: &ToolSpec) -> Prompt {
    let mut arguments: Vec<PromptArgument> = parameters(spec)
        .map(|(param, schema, required)| {
            let mut a = PromptArgument::new(param).with_required(required);
            if let Some(d) = schema.get("description").and_then(Value::as_str) {
                a = a.with_description(d);
            }
            a
        })
        .collect();
    if !arguments.iter().any(|a| a.name == QUESTION) {
        arguments.push(
            PromptArgument::new(QUESTION)
                .with_title("Question")
                .with_description("What you want to know (optional)")
                .with_required(false),
        );
    }
    let first_line = spec.description.lines().next().unwrap_or_default();
    Prompt::new(
        name,
        Some(format!(
            "Fetch with `{}` and analyse the result on the server. {first_line}",
            spec.name
        )),
        Some(arguments),
    )
    .with_title(format!(
        "Analyse {}",
        spec.name.trim_start_matches("fetch_")
    ))
}

/// `(name, schema, required)` of every parameter of a tool's input schema.
pub(crate) fn parameters(spec: &ToolSpec) -> impl Iterator<Item = (&str, &Value, bool)> {
    let required: Vec<&str> = spec
        .input_schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    spec.input_schema
        .get("properties")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(move |(k, v)| (k.as_str(), v, required.contains(&k.as_str())))
}

/// The prompt's string arguments as the tool's typed ones.
fn query_arguments(prompt: &str, spec: &ToolSpec, args: &Args) -> Result<Value, McpError> {
    let mut out = Map::new();
    for (param, schema, required) in parameters(spec) {
        let Some(raw) = args.optional(param) else {
            if required {
                args.required(prompt, param)?;
            }
            continue;
        };
        let ty = schema
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("string");
        let value = match ty {
            "integer" => raw.parse::<i64>().ok().map(Value::from),
            "number" => raw.parse::<f64>().ok().map(Value::from),
            "boolean" => raw.parse::<bool>().ok().map(Value::from),
            _ => Some(Value::from(raw)),
        };
        let Some(value) = value else {
            return Err(McpError::invalid_params(
                format!(
                    "argument `{param}` of prompt `{prompt}` must be {ty}, not `{}`",
                    crate::resources::echo(raw)
                ),
                Some(json!({"hint": format!("give `{param}` as {ty}")})),
            ));
        };
        out.insert(param.to_owned(), value);
    }
    Ok(Value::Object(out))
}

struct Args(JsonObject);

impl Args {
    /// A non-empty string argument (hosts send every argument as a string).
    fn optional(&self, name: &str) -> Option<&str> {
        self.0
            .get(name)
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|s| !s.is_empty())
    }

    fn required(&self, prompt: &str, name: &str) -> Result<&str, McpError> {
        self.optional(name).ok_or_else(|| {
            McpError::invalid_params(
                format!("prompt `{prompt}` needs the argument `{name}`"),
                Some(json!({"hint": format!("fill in `{name}`; `completion/complete` suggests values")})),
            )
        })
    }
}

/// The caller's live table `raw`, or the store's "not found" answer (unknown, expired and
/// someone else's alike).
pub(crate) async fn owned_table(ctx: &RunContext, raw: &str) -> Result<ArtifactMeta, McpError> {
    let not_found = |data_ref: String| {
        let e = StoreError::NotFound { data_ref };
        let hint = e.hint().map(|h| h.to_string()).unwrap_or_default();
        McpError::invalid_params(e.to_string(), Some(json!({"hint": hint})))
    };
    let Ok(data_ref) = DataRef::parse(raw) else {
        return Err(not_found(crate::resources::echo(raw)));
    };
    let store = ctx.store.clone();
    let owner = ctx.principal.clone();
    match crate::resources::blocking(move || store.meta(&owner, &data_ref)).await? {
        Ok(meta) => Ok(meta),
        Err(StoreError::NotFound { data_ref }) => Err(not_found(data_ref)),
        Err(e) => Err(crate::resources::store_fault(e)),
    }
}

fn column(meta: &ArtifactMeta, name: &str) -> Result<(), McpError> {
    if meta.schema.fields().iter().any(|f| f.name() == name) {
        return Ok(());
    }
    let names: Vec<&str> = meta
        .schema
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .collect();
    Err(McpError::invalid_params(
        format!(
            "`{}` has no column `{}`",
            meta.data_ref,
            crate::resources::echo(name)
        ),
        Some(json!({"hint": format!("the columns are {}", names.join(", "))})),
    ))
}

fn shape(meta: &ArtifactMeta) -> String {
    let columns: Vec<String> = meta
        .schema
        .fields()
        .iter()
        .map(|f| format!("{} {}", f.name(), f.data_type()))
        .collect();
    format!("{} rows; columns: {}", meta.rows, columns.join(", "))
}
