//! The schemas our tools list: every built-in and config-declared tool's input and output
//! schema goes through here once, when the registry is built (an upstream server's tools
//! keep theirs, see [`Tool::schemas_are_ours`](crate::Tool::schemas_are_ours)).
//!
//! Input schemas are sent on to every provider's function calling (OpenAI-compatible,
//! Anthropic, Gemini's OpenAPI subset), so they keep only the portable core of JSON
//! Schema: no `format` (`uint32`, `double` are schemars' own), no `type` arrays (an
//! optional argument is one left out of `required`; a `null` it may still be sent is
//! accepted by the validator, which keeps the tool's own schema), `enum` instead of a
//! `oneOf` of `const`s, no `minimum: 0` that only says "unsigned", no `title`s, no empty
//! defaults, no bare `true` and no `$ref`s.
//!
//! Output schemas are read by clients, not models: no prose, nested objects only as deep
//! as a client checks them in practice, and the other shapes a result may take (the spill
//! synopsis, the result cap's truncation object) folded into one object schema: every
//! property of every shape, typed, and `required` only what all shapes have. So a
//! truncated or spilled result validates against the listed schema as the tool's own does.

use serde_json::{Map, Value, json};

/// Keywords no listed schema carries: names and comments for people, and `format`, whose
/// values are unportable (schemars writes `uint32`, `double`, `int64`).
const NOISE: [&str; 6] = ["$schema", "$id", "$comment", "title", "format", "examples"];

/// Keywords whose value is one subschema.
const ONE: [&str; 10] = [
    "items",
    "additionalProperties",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
];

/// Keywords whose value maps names to subschemas.
const MAP: [&str; 4] = [
    "properties",
    "patternProperties",
    "$defs",
    "dependentSchemas",
];

/// Keywords whose value is a list of subschemas.
const LIST: [&str; 4] = ["anyOf", "oneOf", "allOf", "prefixItems"];

/// Below this depth (the result object is depth 0, its properties depth 1) an output schema
/// keeps only the type of a value: a client checks the shape it reads, the model never
/// sees it.
const OUTPUT_DEPTH: usize = 1;

/// An input schema as it is listed: portable to every provider's function calling.
pub(crate) fn portable_input(mut schema: Value) -> Value {
    input_node(&mut schema);
    if let Some(o) = schema.as_object_mut() {
        // "Arguments of `x`.": the tool's description says what the arguments are for.
        o.remove("description");
        // An argument's own words are enough: those of the types inside it (a dataRef's,
        // an enum's) are not repeated.
        for arg in o
            .get_mut("properties")
            .and_then(Value::as_object_mut)
            .into_iter()
            .flat_map(|p| p.values_mut())
            .filter_map(Value::as_object_mut)
        {
            for (k, v) in arg.iter_mut() {
                if k != "description" {
                    strip_descriptions(v);
                }
            }
        }
    }
    schema
}

fn strip_descriptions(node: &mut Value) {
    match node {
        Value::Object(o) => {
            o.remove("description");
            o.values_mut().for_each(strip_descriptions);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_descriptions),
        _ => {}
    }
}

/// An output schema as it is listed: `own` (the tool's result), with the spill synopsis
/// when `spilled` and the truncation object folded in, without prose.
pub(crate) fn listed_output(
    own: Value,
    spilled: bool,
    truncation: Value,
    synopsis: Value,
) -> Value {
    let mut shapes = vec![own];
    if spilled {
        shapes.push(synopsis);
    }
    shapes.push(truncation);
    for s in &mut shapes {
        output_node(s, 0);
    }
    fold(shapes)
}

fn input_node(node: &mut Value) {
    let Value::Object(o) = node else {
        return;
    };
    for k in NOISE {
        o.remove(k);
    }
    // A declared default is worth knowing (a named query's, completions offer it);
    // schemars' `null`, `[]` and `{}` for an optional argument say nothing.
    if o.get("default")
        .is_some_and(|d| d.is_null() || d == &json!([]) || d == &json!({}))
    {
        o.remove("default");
    }
    o.remove("$defs");
    children(o, input_node);
    // `true` is the default of these; a bare `true` is not portable.
    for k in ["additionalProperties", "items", "unevaluatedProperties"] {
        if o.get(k) == Some(&Value::Bool(true)) || o.get(k) == Some(&json!({})) {
            o.remove(k);
        }
    }
    drop_null_branches(o);
    if let Some(Value::Array(types)) = o.get("type") {
        let kept: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
        match kept.as_slice() {
            [one] => {
                o.insert("type".into(), one.clone());
            }
            [] => {}
            _ => {
                let alternatives: Vec<Value> = kept.iter().map(|t| json!({ "type": t })).collect();
                o.remove("type");
                o.insert("anyOf".into(), Value::Array(alternatives));
            }
        }
    }
    if let Some(Value::Array(values)) = o.get_mut("enum") {
        values.retain(|v| !v.is_null());
    }
    consts_to_enum(o);
    let unsigned_only = o.get("type") == Some(&json!("integer"))
        && o.get("minimum").and_then(Value::as_i64) == Some(0);
    if unsigned_only {
        o.remove("minimum");
    }
    if !o.contains_key("type")
        && let Some(t) = enum_type(o.get("enum"))
    {
        o.insert("type".into(), Value::String(t.into()));
    }
}

/// `anyOf`/`oneOf` branches that only admit `null` go (an optional argument is left out);
/// one branch left is merged into its parent.
fn drop_null_branches(o: &mut Map<String, Value>) {
    for key in ["anyOf", "oneOf"] {
        let Some(Value::Array(branches)) = o.get_mut(key) else {
            continue;
        };
        branches.retain(|b| b != &json!({"type": "null"}) && b != &json!({"const": null}));
        if branches.len() == 1 {
            if let Some(Value::Object(only)) = branches.pop() {
                o.remove(key);
                for (k, v) in only {
                    // The parent's own words (its description) win.
                    o.entry(k).or_insert(v);
                }
            }
        } else if branches.is_empty() {
            o.remove(key);
        }
    }
}

/// A `oneOf`/`anyOf` of `const`s (schemars' spelling of a documented Rust enum) as one
/// `enum`, without the per-value prose.
fn consts_to_enum(o: &mut Map<String, Value>) {
    for key in ["oneOf", "anyOf"] {
        let Some(Value::Array(branches)) = o.get(key) else {
            continue;
        };
        let values: Option<Vec<Value>> = branches
            .iter()
            .map(|b| {
                let b = b.as_object()?;
                let only_const = b
                    .keys()
                    .all(|k| matches!(k.as_str(), "const" | "type" | "description"));
                if only_const {
                    b.get("const").cloned()
                } else {
                    None
                }
            })
            .collect();
        let Some(values) = values else { continue };
        if values.is_empty() {
            continue;
        }
        o.remove(key);
        let values = Value::Array(values);
        if let Some(t) = enum_type(Some(&values)) {
            o.insert("type".into(), Value::String(t.into()));
        }
        o.insert("enum".into(), values);
    }
}

/// The one JSON type every value of an `enum` has.
fn enum_type(values: Option<&Value>) -> Option<&'static str> {
    let values = values?.as_array()?;
    let kind = |v: &Value| match v {
        Value::String(_) => Some("string"),
        Value::Bool(_) => Some("boolean"),
        Value::Number(n) if n.is_i64() || n.is_u64() => Some("integer"),
        Value::Number(_) => Some("number"),
        _ => None,
    };
    let first = kind(values.first()?)?;
    values
        .iter()
        .all(|v| kind(v) == Some(first))
        .then_some(first)
}

fn output_node(node: &mut Value, depth: usize) {
    let Value::Object(o) = node else {
        if node == &Value::Bool(true) {
            *node = json!({"type": ["object", "array", "string", "number", "boolean", "null"]});
            split_type(node);
        }
        return;
    };
    for k in NOISE {
        o.remove(k);
    }
    for k in ["description", "default", "$defs", "minimum", "maximum"] {
        o.remove(k);
    }
    if depth >= OUTPUT_DEPTH {
        // What the value is (its type, its choices, nullable or not), not what is inside it.
        o.retain(|k, _| matches!(k.as_str(), "type" | "enum" | "const" | "anyOf" | "oneOf"));
        for k in ["anyOf", "oneOf"] {
            if let Some(Value::Array(a)) = o.get_mut(k) {
                for child in a.iter_mut() {
                    output_node(child, depth);
                }
                a.dedup();
            }
        }
        if o.is_empty() {
            // Nothing to say (a value of any kind): every JSON type.
            o.insert(
                "type".into(),
                json!(["object", "array", "string", "number", "boolean", "null"]),
            );
        }
    } else {
        for k in ONE {
            if let Some(child) = o.get_mut(k) {
                if child.is_boolean() {
                    continue;
                }
                // A map's values are one level down, as an object's properties are.
                output_node(child, depth + 1);
            }
        }
        for k in MAP {
            if let Some(Value::Object(m)) = o.get_mut(k) {
                // A value of any kind (`true`, `{}`, only a description) needs no listing:
                // nothing forbids other keys.
                m.retain(|_, child| constrains(child));
                for child in m.values_mut() {
                    output_node(child, depth + 1);
                }
            }
        }
        for k in LIST {
            if let Some(Value::Array(a)) = o.get_mut(k) {
                // A branch is the same value, so the same depth.
                for child in a.iter_mut() {
                    output_node(child, depth);
                }
            }
        }
        if o.get("additionalProperties") == Some(&Value::Bool(true)) {
            o.remove("additionalProperties");
        }
    }
    split_type(node);
}

/// The schema admits less than every value.
fn constrains(schema: &Value) -> bool {
    schema.as_object().is_some_and(|o| {
        o.keys().any(|k| {
            matches!(
                k.as_str(),
                "type"
                    | "enum"
                    | "const"
                    | "anyOf"
                    | "oneOf"
                    | "allOf"
                    | "not"
                    | "properties"
                    | "items"
                    | "required"
            )
        })
    })
}

fn flatten_types(types: Vec<Value>) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    for t in types {
        let each = match t {
            Value::Array(a) => a,
            one => vec![one],
        };
        for t in each {
            if !out.contains(&t) {
                out.push(t);
            }
        }
    }
    out
}

/// `type: [A, B]` as `anyOf: [{type: A}, {type: B}]`, the spelling every dialect reads;
/// the other keywords stay beside it (each applies to its own type only).
fn split_type(node: &mut Value) {
    let Some(o) = node.as_object_mut() else {
        return;
    };
    let Some(Value::Array(types)) = o.get("type").cloned() else {
        return;
    };
    o.remove("type");
    let mut types = flatten_types(types);
    if types.len() == 1 {
        if let Some(t) = types.pop() {
            o.insert("type".into(), t);
        }
        return;
    }
    let branches: Vec<Value> = types.into_iter().map(|t| json!({ "type": t })).collect();
    if o.contains_key("anyOf") {
        let existing = o.remove("anyOf").unwrap_or(Value::Null);
        o.insert(
            "allOf".into(),
            json!([{ "anyOf": existing }, { "anyOf": branches }]),
        );
    } else {
        o.insert("anyOf".into(), Value::Array(branches));
    }
}

/// One object schema admitting every shape: properties of all (a name two shapes type
/// differently admits either), `required` only what every shape requires. Shapes that are
/// not plain object schemas are listed as alternatives instead.
fn fold(shapes: Vec<Value>) -> Value {
    let plain = |s: &Value| {
        s.as_object().is_some_and(|o| {
            o.get("type") == Some(&json!("object"))
                && !["anyOf", "oneOf", "allOf", "not", "if", "$ref"]
                    .iter()
                    .any(|k| o.contains_key(*k))
        })
    };
    if !shapes.iter().all(plain) {
        return json!({"type": "object", "anyOf": shapes});
    }
    let mut properties = Map::new();
    let mut required: Option<Vec<Value>> = None;
    let mut additional: Option<Value> = None;
    for (i, shape) in shapes.iter().enumerate() {
        let props = shape.get("properties").and_then(Value::as_object);
        for (name, schema) in props.into_iter().flatten() {
            match properties.get_mut(name) {
                // The tool's own properties, and of the other shapes what tells them apart
                // (`truncated: true`, `spilled: true`); their other keys are admitted
                // without being listed (no `additionalProperties: false`).
                None if i == 0 || schema.get("const").is_some() => {
                    properties.insert(name.clone(), schema.clone());
                }
                None => {}
                Some(existing) if existing == schema || admits(existing, schema) => {}
                Some(existing) => {
                    let mut branches = match existing.take() {
                        Value::Object(mut e) if e.len() == 1 && e.contains_key("anyOf") => e
                            .remove("anyOf")
                            .and_then(|a| a.as_array().cloned())
                            .unwrap_or_default(),
                        other => vec![other],
                    };
                    if !branches.contains(schema) {
                        branches.push(schema.clone());
                    }
                    *existing = json!({ "anyOf": branches });
                }
            }
        }
        let own: Vec<Value> = shape
            .get("required")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        required = Some(match required {
            None => own,
            Some(r) => r.into_iter().filter(|n| own.contains(n)).collect(),
        });
        // A map-like result (`additionalProperties` a schema) keeps admitting its entries.
        if let Some(a) = shape.get("additionalProperties")
            && a.is_object()
        {
            additional = Some(a.clone());
        }
    }
    let mut folded = Map::new();
    folded.insert("type".into(), json!("object"));
    folded.insert("properties".into(), Value::Object(properties));
    if let Some(r) = required.filter(|r| !r.is_empty()) {
        folded.insert("required".into(), Value::Array(r));
    }
    if let Some(a) = additional {
        folded.insert("additionalProperties".into(), a);
    }
    Value::Object(folded)
}

/// `general` admits every value `narrow` does: a `const` of `general`'s own type.
fn admits(general: &Value, narrow: &Value) -> bool {
    let (Some(t), Some(c)) = (
        general.get("type").and_then(Value::as_str),
        narrow.get("const"),
    ) else {
        return false;
    };
    general.as_object().is_some_and(|g| g.len() == 1)
        && match c {
            Value::Bool(_) => t == "boolean",
            Value::String(_) => t == "string",
            Value::Number(n) => t == "number" || (t == "integer" && !n.is_f64()),
            _ => false,
        }
}

/// Applies `f` to every subschema of `o`.
fn children(o: &mut Map<String, Value>, f: fn(&mut Value)) {
    for k in ONE {
        if let Some(child) = o.get_mut(k) {
            f(child);
        }
    }
    for k in MAP {
        if let Some(Value::Object(m)) = o.get_mut(k) {
            m.values_mut().for_each(f);
        }
    }
    for k in LIST {
        if let Some(Value::Array(a)) = o.get_mut(k) {
            a.iter_mut().for_each(f);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn validator(schema: &Value) -> jsonschema::Validator {
        jsonschema::validator_for(schema).unwrap()
    }

    #[test]
    fn input_schemas_keep_only_the_portable_core() {
        let own = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "Args",
            "description": "Arguments of `x`.",
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "limit": {"type": ["integer", "null"], "format": "uint32", "minimum": 0, "default": null, "description": "At most this many."},
                "top": {"type": ["integer", "null"], "format": "uint32", "minimum": 1, "maximum": 200},
                "ratio": {"type": "number", "format": "double"},
                "kind": {"oneOf": [
                    {"const": "bar", "type": "string", "description": "Bars."},
                    {"const": "line", "type": "string", "description": "Lines."}
                ]},
                "sort": {"anyOf": [{"type": "string", "enum": ["x", "y"]}, {"type": "null"}], "description": "Order."},
                "format": {"type": "string", "enum": ["csv", "json", null]},
                "data": {"type": "string", "description": "A column.", "default": null},
                "ref": {"description": "The table.", "type": "string", "pattern": "^data_"},
                "names": {"type": "object", "additionalProperties": {"type": "string", "description": "A dataRef."}},
                "extra": {"type": ["object", "null"], "additionalProperties": true},
                "either": {"type": ["string", "array"], "items": {"type": "string"}}
            },
            "required": ["data"]
        });
        let listed = portable_input(own.clone());
        assert_eq!(
            listed,
            json!({
                "type": "object",
                "additionalProperties": false,
                "properties": {
                    "limit": {"type": "integer", "description": "At most this many."},
                    "top": {"type": "integer", "minimum": 1, "maximum": 200},
                    "ratio": {"type": "number"},
                    "kind": {"type": "string", "enum": ["bar", "line"]},
                    "sort": {"type": "string", "enum": ["x", "y"], "description": "Order."},
                    "format": {"type": "string", "enum": ["csv", "json"]},
                    "data": {"type": "string", "description": "A column."},
                    "ref": {"description": "The table.", "type": "string", "pattern": "^data_"},
                    "names": {"type": "object", "additionalProperties": {"type": "string"}},
                    "extra": {"type": "object"},
                    "either": {"anyOf": [{"type": "string"}, {"type": "array"}], "items": {"type": "string"}}
                },
                "required": ["data"]
            })
        );
        // What the model writes from the listed schema, the tool's own schema accepts.
        let call = json!({"data": "d", "kind": "bar", "limit": 3, "sort": "x", "format": "csv"});
        assert!(validator(&listed).is_valid(&call));
        assert!(validator(&own).is_valid(&call));
    }

    fn truncation() -> Value {
        json!({
            "type": "object",
            "properties": {
                "truncated": {"const": true},
                "characters": {"type": "integer"},
                "path": {"type": "string"},
                "preview": {"type": "string"}
            },
            "required": ["truncated", "characters", "preview"]
        })
    }

    fn synopsis() -> Value {
        json!({
            "type": "object",
            "properties": {
                "spilled": {"const": true},
                "path": {"type": "string"},
                "format": {"type": "string", "enum": ["json", "text"]},
                "table": {"type": "object", "properties": {"rows": {"type": "integer"}}, "required": ["rows"]}
            },
            "required": ["spilled", "path", "format"]
        })
    }

    #[test]
    fn output_schemas_fold_every_shape_into_one_object() {
        let own = json!({
            "type": "object",
            "description": "A result.",
            "properties": {
                "rows": {"type": "integer", "format": "uint64", "minimum": 0, "description": "Rows."},
                "note": {"type": ["string", "null"]},
                "path": {"type": "string"},
                "format": {"type": "string", "enum": ["csv", "xlsx"]},
                "columns": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}},
                "result": true,
                "anything": {"description": "Whatever the code set."},
                "stdout": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
            },
            "required": ["rows", "path", "format", "columns", "stdout"]
        });
        let listed = listed_output(own, true, truncation(), synopsis());
        assert_eq!(
            listed,
            json!({
                "type": "object",
                "properties": {
                    "rows": {"type": "integer"},
                    "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                    "path": {"type": "string"},
                    "format": {"anyOf": [
                        {"type": "string", "enum": ["csv", "xlsx"]},
                        {"type": "string", "enum": ["json", "text"]}
                    ]},
                    "columns": {"type": "array"},
                    "stdout": {"type": "object"},
                    "spilled": {"const": true},
                    "truncated": {"const": true}
                }
            })
        );
        let v = validator(&listed);
        let own_result = json!({"rows": 3, "note": null, "path": "exports/a.csv", "format": "csv",
            "columns": [{"name": "a"}], "result": [1, "x"], "stdout": {"text": ""}});
        assert!(v.is_valid(&own_result));
        assert!(v.is_valid(&json!({"truncated": true, "characters": 10, "preview": "{"})));
        assert!(v.is_valid(&json!({"spilled": true, "path": ".spill/a.json", "format": "json"})));
        // Still a check: a property of the wrong type is refused.
        assert!(!v.is_valid(&json!({"rows": "three"})));
        assert!(!v.is_valid(&json!({"truncated": false})));
        assert!(!v.is_valid(&json!({"format": "pdf"})));
    }

    #[test]
    fn a_result_that_is_not_a_plain_object_keeps_the_alternatives() {
        let own = json!({"oneOf": [
            {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            {"type": "object", "properties": {"b": {"type": "string"}}, "required": ["b"]}
        ]});
        let listed = listed_output(own, false, truncation(), synopsis());
        assert_eq!(listed["type"], "object");
        let v = validator(&listed);
        assert!(v.is_valid(&json!({"a": 1})));
        assert!(v.is_valid(&json!({"truncated": true, "characters": 10, "preview": ""})));
        assert!(!v.is_valid(&json!({"spilled": true, "path": "p", "format": "json"})));
    }
}
