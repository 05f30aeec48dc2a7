//! `bind_params`: a named query's arguments against its declared parameters.

use std::collections::BTreeMap;

use dataref_config::{ParamConfig, ParamType, QueryConfig};
use dataref_sources::{ParamValue, SourceError, bind_params};
use serde_json::{Map, Value, json};

fn param(name: &str, ty: ParamType, required: bool, default: Option<Value>) -> ParamConfig {
    ParamConfig {
        name: name.into(),
        ty,
        required,
        default,
        description: None,
    }
}

fn query() -> QueryConfig {
    QueryConfig {
        name: "orders".into(),
        source: "shop".into(),
        description: "Orders.".into(),
        sql: "SELECT 1".into(),
        params: vec![
            param("since", ParamType::Date, true, None),
            param("limit", ParamType::Integer, false, Some(json!(100))),
            param("min", ParamType::Number, false, None),
            param("paid", ParamType::Boolean, false, Some(json!(true))),
            param("region", ParamType::String, false, None),
            param("after", ParamType::Timestamp, false, None),
        ],
        columns: BTreeMap::new(),
    }
}

fn args(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => unreachable!(),
    }
}

fn bad(v: Value) -> (String, String) {
    match bind_params(&query(), &args(v)) {
        Err(SourceError::BadParam { name, message }) => (name, message),
        other => panic!("expected a bad param, got {other:?}"),
    }
}

#[test]
fn defaults_and_nulls_fill_in() {
    let bound = bind_params(&query(), &args(json!({ "since": "2025-01-01" }))).unwrap();
    assert_eq!(
        bound,
        vec![
            ("since".into(), ParamValue::Text("2025-01-01".into())),
            ("limit".into(), ParamValue::Integer(100)),
            ("min".into(), ParamValue::Null),
            ("paid".into(), ParamValue::Integer(1)),
            ("region".into(), ParamValue::Null),
            ("after".into(), ParamValue::Null),
        ]
    );
}

#[test]
fn given_values_are_typed() {
    let bound = bind_params(
        &query(),
        &args(json!({
            "since": "2024-02-29", "limit": 5, "paid": false,
            "region": "EMEA", "after": "2025-01-02T03:04:05Z", "min": 2.5
        })),
    )
    .unwrap();
    let get = |n: &str| bound.iter().find(|(k, _)| k == n).unwrap().1.clone();
    assert_eq!(get("limit"), ParamValue::Integer(5));
    assert_eq!(get("min"), ParamValue::Real(2.5));
    assert_eq!(get("paid"), ParamValue::Integer(0));
    assert_eq!(get("region"), ParamValue::Text("EMEA".into()));
    assert_eq!(get("after"), ParamValue::Text("2025-01-02 03:04:05".into()));
}

#[test]
fn an_integer_is_a_number() {
    let bound = bind_params(&query(), &args(json!({ "since": "2025-01-01", "min": 3 }))).unwrap();
    assert_eq!(bound[2].1, ParamValue::Real(3.0));
}

#[test]
fn timestamps_are_normalised() {
    let cases = [
        ("2025-01-02 03:04:05", "2025-01-02 03:04:05"),
        ("2025-01-02T03:04:05", "2025-01-02 03:04:05"),
        ("2025-01-02T03:04:05Z", "2025-01-02 03:04:05"),
        ("2025-01-02T03:04:05.5Z", "2025-01-02 03:04:05.500000"),
        ("2025-01-02 03:04:05.123456", "2025-01-02 03:04:05.123456"),
    ];
    for (given, want) in cases {
        let bound = bind_params(
            &query(),
            &args(json!({ "since": "2025-01-01", "after": given })),
        )
        .unwrap();
        assert_eq!(bound[5].1, ParamValue::Text(want.into()), "{given}");
    }
    let (name, message) = bad(json!({ "since": "2025-01-01", "after": "2025-01-02" }));
    assert_eq!(name, "after");
    assert!(message.contains("expected a timestamp"), "{message}");
}

#[test]
fn unknown_names_list_the_known_ones() {
    let (name, message) = bad(json!({ "since": "2025-01-01", "sinse": "x" }));
    assert_eq!(name, "sinse");
    assert_eq!(
        message,
        "unknown parameter; `fetch_orders` takes `since`, `limit`, `min`, `paid`, `region`, `after`"
    );
    let mut none = query();
    none.params.clear();
    match bind_params(&none, &args(json!({ "x": 1 }))) {
        Err(SourceError::BadParam { message, .. }) => {
            assert_eq!(message, "unknown parameter; `fetch_orders` takes none");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn missing_required_is_an_error() {
    let (name, message) = bad(json!({}));
    assert_eq!(name, "since");
    assert_eq!(
        message,
        "missing; this parameter is required (a date `YYYY-MM-DD`)"
    );
    let (_, message) = bad(json!({ "since": null }));
    assert_eq!(
        message,
        "required; expected a date `YYYY-MM-DD`, got `null`"
    );
}

#[test]
fn wrong_types_say_what_was_expected_and_given() {
    let cases = [
        (
            json!({ "since": "2025-13-01" }),
            "since",
            "expected a date `YYYY-MM-DD`, got `2025-13-01`",
        ),
        (
            json!({ "since": "2025-02-29" }),
            "since",
            "expected a date `YYYY-MM-DD`, got `2025-02-29`",
        ),
        (
            json!({ "since": 20250101 }),
            "since",
            "expected a date `YYYY-MM-DD`, got the number `20250101`",
        ),
        (
            json!({ "since": "2025-01-01", "limit": 2.5 }),
            "limit",
            "expected an integer, got the number `2.5`",
        ),
        (
            json!({ "since": "2025-01-01", "limit": "5" }),
            "limit",
            "expected an integer, got `5`",
        ),
        (
            json!({ "since": "2025-01-01", "min": "many" }),
            "min",
            "expected a number, got `many`",
        ),
        (
            json!({ "since": "2025-01-01", "paid": 1 }),
            "paid",
            "expected a boolean (`true` or `false`), got the number `1`",
        ),
        (
            json!({ "since": "2025-01-01", "region": ["EMEA"] }),
            "region",
            "expected a string, got an array",
        ),
    ];
    for (given, want_name, want) in cases {
        let (name, message) = bad(given.clone());
        assert_eq!(
            (name.as_str(), message.as_str()),
            (want_name, want),
            "{given}"
        );
        let e = SourceError::BadParam { name, message };
        assert!(e.is_caller_error());
    }
}

#[test]
fn an_explicit_null_takes_the_default() {
    let bound = bind_params(
        &query(),
        &args(json!({ "since": "2025-01-01", "limit": null })),
    )
    .unwrap();
    assert_eq!(bound[1].1, ParamValue::Integer(100));
}
