//! A named query's JSON arguments checked against its declared parameters.
//!
//! The values are bound to `:name` placeholders later, never spliced into SQL; checking
//! them here means the model gets an error it can act on ("expected a date `YYYY-MM-DD`,
//! got `2025-13-01`") instead of a query that quietly matches nothing.

use dataref_config::{ParamConfig, ParamType, QueryConfig};
use serde_json::{Map, Value};

use super::ParamValue;
use crate::SourceError;
use crate::civil::{format_timestamp, parse_date, parse_timestamp};

/// Checks `args` against `query`'s parameters (required, types, `YYYY-MM-DD` dates,
/// timestamps) and fills in defaults. Unknown argument names are an error.
///
/// The result has one entry per declared parameter, in declaration order: an optional
/// parameter without a value or default is bound as NULL, booleans as 0/1, timestamps in
/// SQLite's own text form `YYYY-MM-DD HH:MM:SS[.ffffff]`.
pub fn bind_params(
    query: &QueryConfig,
    args: &Map<String, Value>,
) -> Result<Vec<(String, ParamValue)>, SourceError> {
    if let Some(unknown) = args
        .keys()
        .find(|k| !query.params.iter().any(|p| &p.name == *k))
    {
        let message = if query.params.is_empty() {
            format!("unknown parameter; `{}` takes none", query.tool_name())
        } else {
            let known: Vec<String> = query
                .params
                .iter()
                .map(|p| format!("`{}`", p.name))
                .collect();
            format!(
                "unknown parameter; `{}` takes {}",
                query.tool_name(),
                known.join(", ")
            )
        };
        return Err(SourceError::BadParam {
            name: unknown.clone(),
            message,
        });
    }
    query
        .params
        .iter()
        .map(|p| Ok((p.name.clone(), bind_one(p, args.get(&p.name))?)))
        .collect()
}

fn bind_one(p: &ParamConfig, given: Option<&Value>) -> Result<ParamValue, SourceError> {
    let bad = |message: String| SourceError::BadParam {
        name: p.name.clone(),
        message,
    };
    match (given, &p.default) {
        (Some(v), _) if !v.is_null() => convert(p.ty, v).map_err(bad),
        (Some(v), None) if p.required => Err(bad(format!(
            "required; expected {}, got {}",
            expected(p.ty),
            got(v)
        ))),
        (None, None) if p.required => Err(bad(format!(
            "missing; this parameter is required ({})",
            expected(p.ty)
        ))),
        // Config resolution already checked the default against the type; converting it
        // here still normalises it (dates, timestamps, booleans as 0/1).
        (_, Some(default)) => {
            convert(p.ty, default).map_err(|m| bad(format!("the configured default: {m}")))
        }
        (_, None) => Ok(ParamValue::Null),
    }
}

fn convert(ty: ParamType, v: &Value) -> Result<ParamValue, String> {
    let mismatch = || format!("expected {}, got {}", expected(ty), got(v));
    match ty {
        ParamType::String => match v {
            Value::String(s) => Ok(ParamValue::Text(s.clone())),
            _ => Err(mismatch()),
        },
        ParamType::Integer => v.as_i64().map(ParamValue::Integer).ok_or_else(mismatch),
        // Always real, so `:n / 2` divides like the number it was declared as.
        ParamType::Number => match v {
            Value::Number(n) => n.as_f64().map(ParamValue::Real).ok_or_else(mismatch),
            _ => Err(mismatch()),
        },
        ParamType::Boolean => match v {
            Value::Bool(b) => Ok(ParamValue::Integer(i64::from(*b))),
            _ => Err(mismatch()),
        },
        ParamType::Date => match v {
            Value::String(s) if parse_date(s.as_bytes()).is_some() => {
                Ok(ParamValue::Text(s.clone()))
            }
            _ => Err(mismatch()),
        },
        ParamType::Timestamp => match v {
            Value::String(s) => match parse_timestamp(s.as_bytes()) {
                Some(ts) if ts.has_seconds => Ok(ParamValue::Text(format_timestamp(
                    ts.micros,
                    ts.frac_digits > 0,
                ))),
                _ => Err(mismatch()),
            },
            _ => Err(mismatch()),
        },
    }
}

fn expected(ty: ParamType) -> &'static str {
    match ty {
        ParamType::String => "a string",
        ParamType::Integer => "an integer",
        ParamType::Number => "a number",
        ParamType::Boolean => "a boolean (`true` or `false`)",
        ParamType::Date => "a date `YYYY-MM-DD`",
        ParamType::Timestamp => "a timestamp `YYYY-MM-DD HH:MM:SS[.ffffff]`",
    }
}

fn got(v: &Value) -> String {
    const MAX_CHARS: usize = 60;
    match v {
        Value::String(s) if s.chars().count() > MAX_CHARS => {
            let cut: String = s.chars().take(MAX_CHARS).collect();
            format!("`{cut}…`")
        }
        Value::String(s) => format!("`{s}`"),
        Value::Number(n) => format!("the number `{n}`"),
        Value::Bool(b) => format!("the boolean `{b}`"),
        Value::Null => "`null`".into(),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
    }
}
