//! System prompt templates: [minijinja](https://docs.rs/minijinja) (Jinja2 syntax), strict
//! about undefined variables, with `trim_blocks` and `lstrip_blocks` on (a block tag's line
//! leaves no blank line) and no HTML escaping.
//!
//! The loop renders a profile's template with these built-in variables
//! ([`BUILTIN_VARIABLES`]):
//!
//! | variable    | value |
//! |-------------|-------|
//! | `now`       | the current time, RFC 3339 (`2025-05-01T09:30:00+02:00`) |
//! | `today`     | the current date, `YYYY-MM-DD` |
//! | `principal` | who the agent works for (the principal's name) |
//! | `agent`     | the profile's name |
//! | `tools`     | the tools offered: a list of `{name, description}` |
//! | `sources`   | the data sources: a list of `{name, kind, description}` |
//! | `queries`   | the saved queries: a list of `{name, description}` |
//!
//! and the profile's own variables by name (`department`, …). A template that uses a
//! variable that is neither is rejected when the profile is loaded
//! ([`PromptTemplate::check_variables`]); a variable that is optional can be tested with
//! `{% if department is defined %}`.

use std::collections::BTreeMap;

use minijinja::{AutoEscape, Environment, ErrorKind, UndefinedBehavior};
use serde_json::Value;

/// The variables the loop passes to every template.
pub const BUILTIN_VARIABLES: &[&str] = &[
    "now",
    "today",
    "principal",
    "agent",
    "tools",
    "sources",
    "queries",
];

/// The built-in data analyst's system prompt. The tool definitions are sent separately, so
/// it names only the tools its method depends on; every token of it is paid on each request.
pub const DEFAULT_TEMPLATE: &str = r#"You are a data analyst (profile {{ agent }}) working for {{ principal }}. Now: {{ now }} (today is {{ today }}).

Work with data by reference, never by rows:
- Never ask for raw rows, and never print them.
- Fetch data into an artifact with a fetch_* tool or `query`: you get a dataRef, the schema, the row count and a tiny sample. That is for planning, not for answering.
- Compute on dataRefs, not in your head: `run_sql` (one SELECT; the tables are its `inputs`) to filter, join, group and pivot; `run_python` (pandas DataFrames in `inputs`) for statistics and what SQL cannot say. Answer from their small results.
- Show results with `render_chart`, `render_table` or `export_data`, passing the dataRef: the person sees them; you do not need the rows.
- Large tool results are spilled to files: read the parts you need with `read_file`.
- For a tool that needs large arguments, write them to a file and use `call_tool` with `args_file`.
- When a tool fails, read the error and its hint, fix the call and try again; do not repeat a call unchanged.
- Answer briefly: the figures, what they mean, your assumptions. If the data cannot answer the question, say so.
{% if sources %}

Sources:
{% for s in sources %}
- {{ s.name }} ({{ s.kind }}){% if s.description is defined and s.description %}: {{ s.description }}{% endif %}

{% endfor %}
{% endif %}
{% if queries %}

Saved queries (each is a tool of its own):
{% for q in queries %}
- {{ q.name }}{% if q.description is defined and q.description %}: {{ q.description }}{% endif %}

{% endfor %}
{% endif %}
"#;

/// A compiled system prompt template (minijinja, strict about undefined variables).
pub struct PromptTemplate {
    name: String,
    source: String,
    env: Environment<'static>,
}

impl std::fmt::Debug for PromptTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromptTemplate")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    #[error("template `{name}`: {detail}")]
    Syntax { name: String, detail: String },
    #[error("template `{name}` uses `{variable}`, which is not defined")]
    Undefined { name: String, variable: String },
    #[error("template `{name}`: {detail}")]
    Render { name: String, detail: String },
}

impl PromptTemplate {
    /// Compiles `source`; `name` names it in errors (the profile, or the file).
    pub fn new(name: &str, source: &str) -> Result<Self, PromptError> {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.add_template_owned(name.to_string(), source.to_string())
            .map_err(|err| PromptError::Syntax {
                name: name.to_string(),
                detail: describe(&err, source),
            })?;
        Ok(Self {
            name: name.to_string(),
            source: source.to_string(),
            env,
        })
    }

    /// The template's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The variables the template reads at top level (besides minijinja's own globals such
    /// as `range`), in the order they first appear in the source.
    pub fn variables(&self) -> Vec<String> {
        let Ok(template) = self.env.get_template(&self.name) else {
            return Vec::new();
        };
        let globals: Vec<&str> = self.env.globals().map(|(name, _)| name).collect();
        let mut names: Vec<String> = template
            .undeclared_variables(false)
            .into_iter()
            .filter(|v| !globals.contains(&v.as_str()))
            .collect();
        names.sort_by_key(|v| (self.first_use(v), v.clone()));
        names
    }

    /// Checks every variable the template uses is in `known`; the first one that is not is
    /// an error naming it.
    pub fn check_variables(&self, known: &[&str]) -> Result<(), PromptError> {
        match self
            .variables()
            .into_iter()
            .find(|v| !known.contains(&v.as_str()))
        {
            Some(variable) => Err(PromptError::Undefined {
                name: self.name.clone(),
                variable,
            }),
            None => Ok(()),
        }
    }

    /// Renders with `vars` (built-in and profile variables).
    pub fn render(&self, vars: &BTreeMap<String, Value>) -> Result<String, PromptError> {
        let template = self
            .env
            .get_template(&self.name)
            .map_err(|err| PromptError::Render {
                name: self.name.clone(),
                detail: describe(&err, &self.source),
            })?;
        template.render(vars).map_err(|err| {
            if err.kind() == ErrorKind::UndefinedError {
                let variable = err
                    .range()
                    .and_then(|r| self.source.get(r))
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .or_else(|| self.variables().into_iter().find(|v| !vars.contains_key(v)));
                if let Some(variable) = variable {
                    return PromptError::Undefined {
                        name: self.name.clone(),
                        variable,
                    };
                }
            }
            PromptError::Render {
                name: self.name.clone(),
                detail: describe(&err, &self.source),
            }
        })
    }

    /// Where `variable` is first used as a whole word in the source.
    fn first_use(&self, variable: &str) -> usize {
        let bytes = self.source.as_bytes();
        let is_word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
        self.source
            .match_indices(variable)
            .map(|(at, _)| at)
            .find(|&at| {
                let before = at.checked_sub(1).map(|i| bytes[i]);
                let after = bytes.get(at + variable.len()).copied();
                !before.is_some_and(is_word) && !after.is_some_and(is_word)
            })
            .unwrap_or(usize::MAX)
    }
}

/// A minijinja error for people: what, where (line and the line's text).
fn describe(err: &minijinja::Error, source: &str) -> String {
    let what = match err.detail() {
        Some(detail) => format!("{}: {detail}", err.kind()),
        None => err.kind().to_string(),
    };
    match err.line() {
        Some(line) => {
            let text = source
                .lines()
                .nth(line.saturating_sub(1))
                .unwrap_or("")
                .trim();
            if text.is_empty() {
                format!("{what} at line {line}")
            } else {
                format!("{what} at line {line}: `{text}`")
            }
        }
        None => what,
    }
}
