//! `tools/list` of the real binary on the built-in sample: small enough to send with every
//! request, and portable to every provider's function calling (issue #14).

use rmcp::model::Tool;
use serde_json::{Value, json};

/// o200k tokens of the part a model reads (name, description, input schema), at most: issue
/// #14's budget for every built-in tool (12 came to 2,281; `run_sql` is the 13th), plus
/// `load_file` (the 14th, 2026-12: ~270 tokens, most of them its format and type names) and
/// `lineage` (the 15th, issue #33: a table's receipt on request, ~75 tokens).
const VISIBLE_TOKENS: usize = 2_850;
/// o200k tokens of the whole `tools/list` result, at most: issue #14's budget (4,000), plus
/// `lineage` (issue #33: 148 tokens, 626 bytes; the rest came to 3,928).
const WHOLE_TOKENS: usize = 4_100;
/// Characters of one tool's description, at most.
const DESCRIPTION_CHARS: usize = 350;
/// Characters of one argument's description, at most.
const ARGUMENT_CHARS: usize = 80;

async fn listed() -> Vec<Tool> {
    let home = tempfile::tempdir().expect("tempdir");
    let client = super::connect(home.path(), "alice", &["--rows", "100"]).await;
    let tools = client.list_all_tools().await.expect("tools/list");
    client.cancel().await.ok();
    tools
}

/// Measured the way `dataref bench context` measures it: compact JSON, o200k.
#[tokio::test(flavor = "multi_thread")]
async fn tools_list_fits_the_token_budget() {
    let tools = listed().await;
    assert_eq!(tools.len(), 15, "every built-in tool is listed");
    let bpe = dataref_agent::tokens::o200k_base();
    let visible: Vec<Value> = tools
        .iter()
        .map(|t| json!({"name": t.name, "description": t.description, "inputSchema": t.input_schema}))
        .collect();
    let visible = serde_json::to_string(&visible).expect("json");
    let whole = serde_json::to_string(&json!({ "tools": tools })).expect("json");
    let visible_tokens = bpe.encode_with_special_tokens(&visible).len();
    let whole_tokens = bpe.encode_with_special_tokens(&whole).len();
    assert!(
        visible_tokens <= VISIBLE_TOKENS,
        "name + description + inputSchema: {visible_tokens} tokens ({} B), more than {VISIBLE_TOKENS}",
        visible.len()
    );
    assert!(
        whole_tokens <= WHOLE_TOKENS,
        "the whole result: {whole_tokens} tokens ({} B), more than {WHOLE_TOKENS}",
        whole.len()
    );
    for t in &tools {
        let d = t.description.as_deref().unwrap_or_default();
        assert!(
            d.chars().count() <= DESCRIPTION_CHARS,
            "{}: {} characters: {d}",
            t.name,
            d.chars().count()
        );
        let props = t.input_schema.get("properties").and_then(Value::as_object);
        for (name, p) in props.into_iter().flatten() {
            let d = p.get("description").and_then(Value::as_str).unwrap_or("");
            assert!(
                d.chars().count() <= ARGUMENT_CHARS,
                "{}.{name}: {} characters: {d}",
                t.name,
                d.chars().count()
            );
        }
    }
}

/// What the short descriptions must still teach: by reference, never rows; the two-step
/// `call_tool`; when to use each consumer; SQL or Python.
#[tokio::test(flavor = "multi_thread")]
async fn the_short_descriptions_still_teach_the_rules() {
    let tools = listed().await;
    let description = |name: &str| {
        tools
            .iter()
            .find(|t| t.name == name)
            .and_then(|t| t.description.as_deref())
            .unwrap_or_else(|| panic!("{name} listed with a description"))
            .to_owned()
    };
    for producer in ["fetch_sales", "query"] {
        let d = description(producer);
        assert!(d.contains("dataRef"), "{producer}: {d}");
        assert!(
            d.contains("not the rows") || d.contains("never ask for the rows"),
            "{producer}: {d}"
        );
    }
    for consumer in ["render_chart", "render_table", "export_data"] {
        let d = description(consumer);
        assert!(
            d.contains("never pass through you") || d.contains("not you"),
            "{consumer}: {d}"
        );
    }
    let d = description("call_tool");
    for needle in ["(1) `run_python`", "(2) `call_tool(", "overrides"] {
        assert!(d.contains(needle), "call_tool lacks {needle:?}: {d}");
    }
    // When SQL, when Python (issue #17).
    let d = description("run_sql");
    for needle in [
        "filter",
        "join",
        "group",
        "pivot",
        "window",
        "`inputs`",
        "dataRef",
        "run_python for statistics, reshaping",
        "documents, pictures",
    ] {
        assert!(d.contains(needle), "run_sql lacks {needle:?}: {d}");
    }
    for reader in ["read_file", "describe_data"] {
        assert!(
            description(reader).contains("instead of reading rows"),
            "{reader}"
        );
    }
}

/// Every schema the built-in tools list is in the portable core of JSON Schema: no
/// `format`, no `type` array, no `oneOf` of `const`s, no bare booleans where a schema
/// belongs, no `$ref`/`$defs`, and every subschema says what it admits (the MCP
/// Inspector's `--strict` findings, errors and warnings, are a subset of these).
#[tokio::test(flavor = "multi_thread")]
async fn every_listed_schema_is_portable() {
    let tools = listed().await;
    let mut found = Vec::new();
    for t in &tools {
        let input = Value::Object((*t.input_schema).clone());
        walk(&input, &format!("{}.inputSchema", t.name), None, &mut found);
        if let Some(output) = &t.output_schema {
            let output = Value::Object((**output).clone());
            walk(
                &output,
                &format!("{}.outputSchema", t.name),
                None,
                &mut found,
            );
            let noisy = serde_json::to_string(&output).expect("json");
            assert!(
                !noisy.contains("\"description\""),
                "{}: an output schema carries prose: {noisy}",
                t.name
            );
        }
    }
    assert!(found.is_empty(), "unportable schemas: {found:#?}");
}

const ONE: &[&str] = &[
    "items",
    "contains",
    "not",
    "propertyNames",
    "if",
    "then",
    "else",
    "additionalProperties",
    "unevaluatedProperties",
    "additionalItems",
    "unevaluatedItems",
];
const LIST: &[&str] = &["allOf", "anyOf", "oneOf", "prefixItems"];
const MAP: &[&str] = &["properties", "patternProperties", "dependentSchemas"];
/// Where a boolean is a flag (allowed / forbidden), not a schema.
const FLAG: &[&str] = &[
    "additionalProperties",
    "unevaluatedProperties",
    "additionalItems",
    "unevaluatedItems",
];
/// Keywords that constrain a value (what the Inspector counts as "a validation keyword").
const CONSTRAINING: &[&str] = &[
    "type",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "allOf",
    "not",
    "properties",
    "items",
    "required",
    "additionalProperties",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
];

fn walk(node: &Value, path: &str, keyword: Option<&str>, found: &mut Vec<String>) {
    let o = match node {
        Value::Bool(_) if keyword.is_some_and(|k| FLAG.contains(&k)) => return,
        Value::Object(o) => o,
        other => {
            found.push(format!("{path}: `{other}` where a schema belongs"));
            return;
        }
    };
    for banned in ["format", "$ref", "$defs", "definitions", "$schema", "title"] {
        if o.contains_key(banned) {
            found.push(format!("{path}: `{banned}`"));
        }
    }
    if o.get("type").is_some_and(Value::is_array) {
        found.push(format!("{path}: a `type` array {}", o["type"]));
    }
    for key in ["oneOf", "anyOf"] {
        let all_consts = o
            .get(key)
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty() && a.iter().all(|b| b.get("const").is_some()));
        if all_consts {
            found.push(format!("{path}: a `{key}` of consts where `enum` does"));
        }
    }
    if !o.keys().any(|k| CONSTRAINING.contains(&k.as_str())) && keyword != Some("not") {
        found.push(format!("{path}: admits anything ({node})"));
    }
    for (k, v) in o {
        let at = format!("{path}.{k}");
        if ONE.contains(&k.as_str()) {
            walk(v, &at, Some(k), found);
        } else if LIST.contains(&k.as_str()) {
            for (i, s) in v.as_array().into_iter().flatten().enumerate() {
                walk(s, &format!("{at}[{i}]"), Some(k), found);
            }
        } else if MAP.contains(&k.as_str()) {
            for (name, s) in v.as_object().into_iter().flatten() {
                walk(s, &format!("{at}.{name}"), Some(k), found);
            }
        }
    }
}

/// The tools' reference page, generated from `tools/list` on the built-in sample: what a
/// model is told, as a person can read it.
#[tokio::test(flavor = "multi_thread")]
async fn the_tools_reference_is_generated_from_tools_list() {
    let tools = listed().await;
    let mut page = String::from(
        "# Tools\n\n<!-- Generated from `tools/list` on the built-in sample by \
         crates/dataref/tests/it/tools_list.rs: edit the tools, then regenerate (see Develop). \
         -->\n\nWhat `tools/list` gives a model on the built-in sample, tool by tool: the \
         description and the arguments, as the model reads them. `fetch_sales` stands for every \
         named query of a configuration (`fetch_<name>`). The guide to using them: \
         [Tools](../tools.md).\n",
    );
    for t in &tools {
        page.push_str(&format!(
            "\n## `{}`\n\n{}\n",
            t.name,
            t.description.as_deref().unwrap_or_default()
        ));
        let schema = &t.input_schema;
        let required: Vec<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let props = schema.get("properties").and_then(Value::as_object);
        let Some(props) = props.filter(|p| !p.is_empty()) else {
            page.push_str("\nNo arguments.\n");
            continue;
        };
        page.push_str("\n| argument | type | required | description |\n|---|---|---|---|\n");
        for (name, p) in props {
            let ty = match (p.get("type"), p.get("enum")) {
                (_, Some(Value::Array(values))) => values
                    .iter()
                    .map(|v| format!("`{v}`"))
                    .collect::<Vec<_>>()
                    .join(", "),
                (Some(Value::String(t)), _) => t.clone(),
                (Some(Value::Array(ts)), _) => ts
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(" or "),
                _ if p.get("anyOf").is_some() || p.get("oneOf").is_some() => {
                    "one of several".into()
                }
                _ => "any".into(),
            };
            let description = p
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or("")
                .replace('|', "\\|")
                .replace('\n', " ");
            page.push_str(&format!(
                "| `{name}` | {ty} | {} | {description} |\n",
                if required.contains(&name.as_str()) {
                    "yes"
                } else {
                    ""
                }
            ));
        }
    }
    super::docs::check_generated("docs/src/reference/tools.md", &page);
}
