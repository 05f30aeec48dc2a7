//! System prompt templates: strict variables, checked names, the default analyst prompt.

use std::collections::BTreeMap;

use dataref_agent::prompt::{BUILTIN_VARIABLES, DEFAULT_TEMPLATE, PromptError, PromptTemplate};
use dataref_agent::tokens::TokenCounter;
use serde_json::{Value, json};

fn builtins(tools: usize) -> BTreeMap<String, Value> {
    let names = [
        "query",
        "run_python",
        "render_chart",
        "render_table",
        "export_data",
        "read_file",
        "call_tool",
        "fetch_http",
        "fetch_sql",
        "list_sources",
    ];
    let tools: Vec<Value> = names
        .iter()
        .take(tools)
        .map(|n| json!({"name": n, "description": format!("The {n} tool.")}))
        .collect();
    let mut vars = BTreeMap::new();
    vars.insert("now".to_string(), json!("2025-05-01T09:30:00+02:00"));
    vars.insert("today".to_string(), json!("2025-05-01"));
    vars.insert("principal".to_string(), json!("alice"));
    vars.insert("agent".to_string(), json!("analyst"));
    vars.insert("tools".to_string(), Value::Array(tools));
    vars.insert(
        "sources".to_string(),
        json!([
            {"name": "sales", "kind": "postgres", "description": "orders and invoices since 2019"},
            {"name": "crm", "kind": "http", "description": ""},
            {"name": "files", "kind": "csv"},
        ]),
    );
    vars.insert(
        "queries".to_string(),
        json!([
            {"name": "monthly_revenue", "description": "revenue per month and region"},
            {"name": "churn"},
        ]),
    );
    vars
}

#[test]
fn an_undefined_variable_is_an_error_naming_it() {
    let t = PromptTemplate::new("team", "Hello {{ principal }} of {{ department }}.").unwrap();
    let err = t.render(&builtins(0)).unwrap_err();
    match &err {
        PromptError::Undefined { name, variable } => {
            assert_eq!(name, "team");
            assert_eq!(variable, "department");
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("`department`"), "{err}");

    let mut vars = builtins(0);
    vars.insert("department".to_string(), json!("finance"));
    assert_eq!(t.render(&vars).unwrap(), "Hello alice of finance.");

    // An optional variable tested with `is defined` is fine.
    let t = PromptTemplate::new(
        "opt",
        "{% if team is defined %}{{ team }}{% else %}none{% endif %}",
    )
    .unwrap();
    assert_eq!(t.render(&builtins(0)).unwrap(), "none");
}

#[test]
fn check_variables_names_an_unknown_one() {
    let t = PromptTemplate::new(
        "profile:sales",
        "{{ agent }} for {{ department }}; {% for s in sources %}{{ s.name }}{{ regoin }}{% endfor %}{{ range(3)|length }}",
    )
    .unwrap();
    let mut known: Vec<&str> = BUILTIN_VARIABLES.to_vec();
    known.push("department");
    let err = t.check_variables(&known).unwrap_err();
    match &err {
        PromptError::Undefined { name, variable } => {
            assert_eq!(name, "profile:sales");
            assert_eq!(variable, "regoin");
        }
        other => panic!("{other:?}"),
    }
    known.push("regoin");
    t.check_variables(&known).unwrap();
    // The loop variable and minijinja's globals (`range`) are not asked for.
    assert_eq!(t.variables(), ["agent", "department", "sources", "regoin"]);
}

#[test]
fn a_syntax_error_says_where() {
    let err = PromptTemplate::new(
        "broken.j2",
        "line one\n{% for s in sources %}\n{{ s.name }\n",
    )
    .unwrap_err();
    let PromptError::Syntax { name, detail } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(name, "broken.j2");
    assert!(detail.contains("line 3"), "{detail}");
    assert!(detail.contains("syntax error"), "{detail}");
    assert!(err.to_string().contains("broken.j2"), "{err}");
}

#[test]
fn the_default_template_renders_with_the_builtins() {
    let t = PromptTemplate::new("default", DEFAULT_TEMPLATE).unwrap();
    t.check_variables(BUILTIN_VARIABLES).unwrap();
    let out = t.render(&builtins(10)).unwrap();
    for needle in [
        "run_python",
        "dataRef",
        "read_file",
        "call_tool",
        "args_file",
        "render_chart",
        "export_data",
        "fetch_*",
        "2025-05-01T09:30:00+02:00",
        "alice",
        "- sales (postgres): orders and invoices since 2019\n- crm (http)\n- files (csv)\n",
        "- monthly_revenue: revenue per month and region\n- churn\n",
    ] {
        assert!(out.contains(needle), "no {needle:?} in:\n{out}");
    }
    assert!(
        !out.contains("The query tool."),
        "tool descriptions repeated:\n{out}"
    );
    assert!(!out.contains("\n\n\n"), "blank lines:\n{out}");
    let tokens = TokenCounter::for_model("gpt-4o", None)
        .unwrap()
        .count_text(&out);
    eprintln!("default prompt: {tokens} tokens\n{out}");
    assert!((150..=450).contains(&tokens), "{tokens} tokens");

    // No sources, no queries: no empty headings.
    let mut vars = builtins(10);
    vars.insert("sources".to_string(), json!([]));
    vars.insert("queries".to_string(), json!([]));
    let out = t.render(&vars).unwrap();
    assert!(
        !out.contains("Sources:") && !out.contains("Saved queries"),
        "{out}"
    );
}
