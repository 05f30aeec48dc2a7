//! The book's reference pages for configuration, generated from the code: every key of
//! `dataref.toml` from the doc comments of the raw structs (read through their JSON schema),
//! every environment variable from [`env::ALL`]. The committed pages are checked against
//! these functions by `crates/dataref/tests/it/docs.rs`, so a key or a variable cannot be
//! added, removed or redocumented without the page following.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use crate::env;
use crate::raw::RawConfig;

/// The section the sizes and durations are explained in, linked from every key of those
/// types.
const UNITS: &str = "Sizes and durations";

/// `docs/src/reference/config.md`: one section per table, each key with its type and its
/// doc comment.
pub fn config_markdown() -> String {
    let schema = schemars::schema_for!(RawConfig);
    let mut page = String::from(
        "# Configuration reference\n\n\
         <!-- Generated from the doc comments of crates/dataref-config/src/raw.rs by \
         dataref_config::reference: edit them, then regenerate (see Develop). -->\n\n\
         Every key `dataref.toml` accepts, table by table. A key that is not here is an error \
         that names it, and so is a value outside what its key says. The guide, with \
         examples: [Configure](../configure.md). A value may name an environment variable as \
         `${NAME}` (`$$` is a literal `$`) where its key says so; the variables dataref itself \
         reads: [Environment](environment.md).\n",
    );
    page.push_str(&Walker::new(schema.as_value()).render());
    page
}

/// `docs/src/reference/environment.md`: every variable of [`env::ALL`] with its doc comment.
pub fn environment_markdown() -> String {
    let mut page = String::from(
        "# Environment\n\n\
         <!-- Generated from crates/dataref-config/src/env.rs by dataref_config::reference: \
         edit the doc comments there, then regenerate (see Develop). -->\n\n\
         Every environment variable dataref reads. Besides these, a config value may name any \
         variable as `${NAME}` where its key says so ([Configuration \
         reference](config.md)); it is read when the value is used, so secrets stay out of \
         the file.\n",
    );
    for (name, doc) in env::ALL {
        page.push_str(&format!("\n## `{name}`\n\n{}\n", one_paragraph(doc)));
    }
    page
}

/// A doc comment's lines as one paragraph.
fn one_paragraph(doc: &str) -> String {
    doc.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// A heading's anchor as mdBook and GitHub make it.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// What a key holds, as the page shows it.
enum Kind<'a> {
    /// `[parent.key]`.
    Table(&'a Map<String, Value>),
    /// `[parent.key.NAME]`: a table of tables, with the placeholder for their names.
    Tables(String, &'a Map<String, Value>),
    /// `[[parent.key]]`.
    ArrayOfTables(&'a Map<String, Value>),
    /// Anything else: its type.
    Value(String),
}

/// One table of the file, to be rendered.
struct Table<'a> {
    /// `sources.NAME`.
    path: String,
    array: bool,
    text: String,
    schema: &'a Map<String, Value>,
}

impl Table<'_> {
    fn heading(&self) -> String {
        if self.array {
            format!("[[{}]]", self.path)
        } else {
            format!("[{}]", self.path)
        }
    }
}

/// Walks the schema of [`RawConfig`] from its root, table by table.
struct Walker<'a> {
    root: &'a Value,
    defs: Option<&'a Map<String, Value>>,
}

impl<'a> Walker<'a> {
    fn new(root: &'a Value) -> Self {
        Self {
            root,
            defs: root.get("$defs").and_then(Value::as_object),
        }
    }

    fn render(&self) -> String {
        let mut out = String::new();
        let units: Vec<(&String, &Value)> = self
            .defs
            .into_iter()
            .flatten()
            .filter(|(_, def)| !is_table(def))
            .collect();
        if !units.is_empty() {
            out.push_str(&format!("\n## {UNITS}\n\n"));
            for (name, def) in units {
                out.push_str(&format!("- **{name}**: {}\n", description(def)));
            }
        }
        let Some(root) = self.root.as_object() else {
            return out;
        };
        let (keys, tables) = self.keys(None, root);
        if !keys.is_empty() {
            out.push_str("\n## Top level\n\n");
            out.push_str(&keys);
        }
        for table in tables {
            self.table(&table, &mut out);
        }
        out
    }

    fn table(&self, table: &Table<'_>, out: &mut String) {
        out.push_str(&format!("\n## `{}`\n\n{}\n", table.heading(), table.text));
        let (keys, nested) = self.keys(Some(&table.path), table.schema);
        if !keys.is_empty() {
            out.push('\n');
            out.push_str(&keys);
        }
        for n in nested {
            self.table(&n, out);
        }
    }

    /// The list of `schema`'s keys, and the tables below it.
    fn keys(&self, path: Option<&str>, schema: &'a Map<String, Value>) -> (String, Vec<Table<'a>>) {
        let required: BTreeSet<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let mut keys = String::new();
        let mut tables = Vec::new();
        for (key, prop) in properties(schema) {
            let full = match path {
                Some(p) => format!("{p}.{key}"),
                None => key.clone(),
            };
            let text = description(prop);
            let (table, value_type) = match self.kind(prop) {
                Kind::Table(def) => (Some((full, false, def)), None),
                Kind::Tables(placeholder, def) => {
                    (Some((format!("{full}.{placeholder}"), false, def)), None)
                }
                Kind::ArrayOfTables(def) => (Some((full, true, def)), None),
                Kind::Value(ty) => (None, Some(ty)),
            };
            if let Some((path, array, schema)) = table {
                let t = Table {
                    path,
                    array,
                    text,
                    schema,
                };
                let heading = t.heading();
                keys.push_str(&format!(
                    "- `{key}`: see [`{heading}`](#{})\n",
                    anchor(&heading)
                ));
                tables.push(t);
            } else if let Some(ty) = value_type {
                let need = if required.contains(key.as_str()) {
                    ", required"
                } else {
                    ""
                };
                keys.push_str(&format!("- `{key}` ({ty}{need}): {text}\n"));
            }
        }
        (keys, tables)
    }

    fn kind(&self, prop: &'a Value) -> Kind<'a> {
        let inner = non_null(prop);
        if let Some(def) = self.table_of(inner) {
            return Kind::Table(def);
        }
        if let Some(def) = inner
            .get("additionalProperties")
            .and_then(|v| self.table_of(v))
        {
            let placeholder = prop.get("x-key").and_then(Value::as_str).unwrap_or("NAME");
            return Kind::Tables(placeholder.to_owned(), def);
        }
        if let Some(def) = inner.get("items").and_then(|v| self.table_of(v)) {
            return Kind::ArrayOfTables(def);
        }
        Kind::Value(self.type_name(prop))
    }

    /// The table `schema` is (a `$ref` to a struct), if it is one.
    fn table_of(&self, schema: &'a Value) -> Option<&'a Map<String, Value>> {
        let def = self.resolve(schema)?;
        is_table(def).then_some(def.as_object()).flatten()
    }

    /// The definition a `$ref` names.
    fn resolve(&self, schema: &'a Value) -> Option<&'a Value> {
        let name = schema.get("$ref")?.as_str()?.strip_prefix("#/$defs/")?;
        self.defs?.get(name)
    }

    /// `string`, `integer`, `array of strings`, `table of strings`, a size, …
    fn type_name(&self, schema: &Value) -> String {
        let schema = non_null(schema);
        if let Some(name) = schema
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| r.strip_prefix("#/$defs/"))
        {
            return format!("[{name}](#{})", anchor(UNITS));
        }
        if let Some(alternatives) = schema.get("anyOf").and_then(Value::as_array) {
            return alternatives
                .iter()
                .filter(|a| !is_null(a))
                .map(|a| self.type_name(a))
                .collect::<Vec<_>>()
                .join(" or ");
        }
        let types: Vec<&str> = match schema.get("type") {
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts
                .iter()
                .filter_map(Value::as_str)
                .filter(|t| *t != "null")
                .collect(),
            _ => Vec::new(),
        };
        let names: Vec<String> = types
            .iter()
            .map(|t| match *t {
                "array" => self.plural("array", schema.get("items")),
                "object" => self.plural("table", schema.get("additionalProperties")),
                other => other.to_owned(),
            })
            .collect();
        if names.is_empty() {
            "any value".to_owned()
        } else {
            names.join(" or ")
        }
    }

    /// `array of strings`; `array` when its items may be anything.
    fn plural(&self, what: &str, items: Option<&Value>) -> String {
        match items.map(|i| self.type_name(i)) {
            None => what.to_owned(),
            Some(t) if t == "any value" => what.to_owned(),
            Some(t) => format!("{what} of {t}s"),
        }
    }

    /// Every definition the page reaches, by name: for the test that no table or type is
    /// left out.
    #[cfg(test)]
    fn reached(&self) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![self.root];
        while let Some(schema) = todo.pop() {
            for (_, prop) in schema.as_object().map(properties).into_iter().flatten() {
                let inner = non_null(prop);
                for s in [
                    Some(inner),
                    inner.get("additionalProperties"),
                    inner.get("items"),
                ]
                .into_iter()
                .flatten()
                .chain(
                    inner
                        .get("anyOf")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten(),
                ) {
                    if let Some(name) = s
                        .get("$ref")
                        .and_then(Value::as_str)
                        .and_then(|r| r.strip_prefix("#/$defs/"))
                        && seen.insert(name.to_owned())
                        && let Some(def) = self.resolve(s)
                    {
                        todo.push(def);
                    }
                }
            }
        }
        seen
    }
}

/// A struct's schema: an object with named keys.
fn is_table(def: &Value) -> bool {
    def.get("properties").is_some()
}

fn is_null(schema: &Value) -> bool {
    schema.get("type").and_then(Value::as_str) == Some("null")
}

/// `Option<T>`'s schema without its `null`: `anyOf: [T, null]` becomes `T`.
fn non_null(schema: &Value) -> &Value {
    let Some(alternatives) = schema.get("anyOf").and_then(Value::as_array) else {
        return schema;
    };
    let mut rest = alternatives.iter().filter(|a| !is_null(a));
    match (rest.next(), rest.next()) {
        (Some(only), None) => only,
        _ => schema,
    }
}

fn properties(schema: &Map<String, Value>) -> impl Iterator<Item = (&String, &Value)> {
    schema
        .get("properties")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
}

fn description(schema: &Value) -> String {
    one_paragraph(
        schema
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key of every table has a doc comment, and so has every type the page explains:
    /// a new key cannot go undocumented.
    #[test]
    fn every_key_is_documented() {
        let schema = schemars::schema_for!(RawConfig);
        let root = schema.as_value();
        let mut missing = Vec::new();
        let mut tables = vec![("dataref.toml".to_owned(), root)];
        for (name, def) in root
            .get("$defs")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            if is_table(def) {
                tables.push((name.clone(), def));
            } else if description(def).is_empty() {
                missing.push(format!("the type {name}"));
            }
        }
        let mut keys = 0;
        for (table, def) in tables {
            for (key, prop) in def.as_object().map(properties).into_iter().flatten() {
                keys += 1;
                if description(prop).is_empty() {
                    missing.push(format!("{table}.{key}"));
                }
            }
        }
        assert!(
            missing.is_empty(),
            "keys of dataref.toml without a doc comment in crates/dataref-config/src/raw.rs \
             (it is their documentation on the reference page): {missing:?}"
        );
        assert!(keys > 100, "only {keys} keys found: is the walk right?");
    }

    /// The page reaches every table and type of the schema: a table nested in a way the
    /// walk does not know would otherwise be left off the page.
    #[test]
    fn the_page_reaches_every_table() {
        let schema = schemars::schema_for!(RawConfig);
        let walker = Walker::new(schema.as_value());
        let all: BTreeSet<String> = walker
            .defs
            .into_iter()
            .flatten()
            .map(|(k, _)| k.clone())
            .collect();
        assert_eq!(walker.reached(), all);
        let page = config_markdown();
        for heading in [
            "## `[server]`",
            "## `[sources.NAME]`",
            "## `[queries.NAME.params.P]`",
            "## `[spill.tools.TOOL]`",
            "## `[[upstream]]`",
            "## `[agents.NAME.limits]`",
            "## `[http.jwt]`",
            "## `[shared]`",
            "## Sizes and durations",
        ] {
            assert!(page.contains(heading), "{heading} is not on the page");
        }
        assert!(page.contains("- `ttl` ([duration](#sizes-and-durations)): "));
        assert!(page.contains("- `kind` (string, required): "));
        assert!(page.contains("- `params`: see [`[queries.NAME.params.P]`](#queriesnameparamsp)"));
    }

    #[test]
    fn every_variable_is_on_its_page() {
        let page = environment_markdown();
        for (name, doc) in env::ALL {
            assert!(!doc.trim().is_empty(), "{name} has no doc comment");
            assert!(page.contains(&format!("## `{name}`")), "{name}");
        }
        assert!(env::ALL.iter().any(|(n, _)| *n == env::DATAREF_HOME));
    }
}
