//! A `files` source (a lake) as a producer: a named query or the model's `query` runs in
//! DataFusion over the source's files, and the result is stored like any producer's.
//!
//! The engine reads the lake through its one store (a local directory, or the S3 bucket
//! of `url`), and nothing else: the SQL cannot name a file or URL. Credentials come from
//! the server's environment and never reach `run_python` (its sandbox starts with an empty
//! environment).

use std::sync::Arc;
use std::time::Duration;

use dataref_config::{FileFormat, SourceConfig, SourceKind, env};
use dataref_protocol::Description;
use dataref_sources::{ParamValue, SqlPolicy};
use dataref_sql::{Lake, LakeFormat, Param, Query, QueryLimits, Tables};
use dataref_store::{Lineage, SampleOptions, describe};
use dataref_tool::{RunContext, ToolError};
use object_store::aws::AmazonS3Builder;
use object_store::{BackoffConfig, ClientOptions, RetryConfig};

use super::run_sql::{sql_error, store_result, timed_out};
use crate::support::blocking;

/// Runs `sql` on the lake of `source` and stores the result for the caller, bounded by the
/// source's `timeout` and `max_rows` and by `memory_bytes` of working memory.
pub(crate) async fn produce(
    ctx: &RunContext,
    source: &SourceConfig,
    sql: String,
    params: Vec<(String, ParamValue)>,
    policy: SqlPolicy,
    lineage: Lineage,
    memory_bytes: u64,
) -> Result<Description, ToolError> {
    let lake = lake(source, &|name| env::process(name))?;
    // Operator SQL names its parameters `:name`; they are bound as `$1…$n`. The model's
    // SQL has none, and goes as written.
    let (sql, values) = match policy {
        SqlPolicy::Configured => {
            let numbered = dataref_sources::postgres::number_params(&sql);
            let mut values = Vec::with_capacity(numbered.names.len());
            for name in &numbered.names {
                let Some((_, v)) = params.iter().find(|(n, _)| n == name) else {
                    return Err(ToolError::respond(
                        format!("the query's SQL has `:{name}` but no value was given for it"),
                        None,
                    ));
                };
                values.push(match v {
                    ParamValue::Null => Param::Null,
                    ParamValue::Integer(i) => Param::Integer(*i),
                    ParamValue::Real(r) => Param::Real(*r),
                    ParamValue::Text(t) => Param::Text(t.clone()),
                });
            }
            (numbered.sql, values)
        }
        SqlPolicy::Generic => (sql, Vec::new()),
    };
    let limits = QueryLimits {
        memory_bytes: usize::try_from(memory_bytes).unwrap_or(usize::MAX),
        ..QueryLimits::default()
    };
    let work = async {
        let mut query = Query::start_with(&sql, Tables::Lake(lake), values, &limits)
            .await
            .map_err(sql_error)?;
        let mut lineage = lineage;
        lineage.set_source_version(query.source_version().map(str::to_owned));
        store_result(&mut query, Vec::new(), ctx, lineage, Some(source.max_rows)).await
    };
    let meta = tokio::select! {
        r = tokio::time::timeout(source.timeout, work) => match r {
            Ok(r) => r?,
            Err(_) => return Err(timed_out(source.timeout)),
        },
        () = ctx.cancel.cancelled() => {
            return Err(ToolError::respond("the query was cancelled", None));
        }
    };
    let store = ctx.store.clone();
    let owner = ctx.principal.clone();
    let opts = SampleOptions {
        rows: source.sample_rows,
        max_value_chars: source.max_value_chars,
    };
    blocking("query", move || {
        let table = store.map_table(&owner, &meta.data_ref)?.head(opts.rows)?;
        Ok(describe(&table, opts))
    })
    .await
}

/// Whether the files of `source` can be listed and read: its table's columns, or what is
/// wrong (`dataref doctor`).
pub async fn probe_files(source: &SourceConfig) -> Result<Vec<String>, String> {
    let lake = lake(source, &|name| env::process(name)).map_err(|e| e.to_string())?;
    let sql = format!("SELECT * FROM {} LIMIT 0", lake.name);
    let query = Query::start_with(
        &sql,
        Tables::Lake(lake),
        Vec::new(),
        &QueryLimits::default(),
    )
    .await
    .map_err(|e| match e.hint() {
        Some(h) => format!("{e} ({h})"),
        None => e.to_string(),
    })?;
    Ok(query
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect())
}

/// The engine's table for `source`: its files, and the client of their bucket.
pub(crate) fn lake(
    source: &SourceConfig,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Lake, ToolError> {
    let SourceKind::Files {
        location,
        format,
        table,
        endpoint,
        region,
    } = &source.kind
    else {
        return Err(ToolError::Fatal(format!(
            "internal: source `{}` is not a files source",
            source.name
        )));
    };
    let format = format.map(|f| match f {
        FileFormat::Parquet => LakeFormat::Parquet,
        FileFormat::Csv => LakeFormat::Csv,
        FileFormat::Ndjson => LakeFormat::Ndjson,
    });
    let Some(rest) = location.strip_prefix("s3://") else {
        return Ok(Lake::local(table.clone(), location, format));
    };
    let bucket = rest.split('/').next().unwrap_or_default();
    dataref_config::tls::install_provider();
    let mut builder = AmazonS3Builder::new()
        .with_bucket_name(bucket)
        .with_region(region)
        .with_retry(RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(2),
                base: 2.0,
            },
            max_retries: 3,
            retry_timeout: Duration::from_secs(10),
        })
        .with_client_options(
            ClientOptions::new()
                .with_connect_timeout(Duration::from_secs(5))
                .with_allow_http(
                    endpoint
                        .as_deref()
                        .is_some_and(|e| e.starts_with("http://")),
                ),
        );
    let key_id = lookup(env::AWS_ACCESS_KEY_ID).filter(|k| !k.is_empty());
    let secret = lookup(env::AWS_SECRET_ACCESS_KEY).filter(|k| !k.is_empty());
    match (key_id, secret) {
        (Some(k), Some(s)) => {
            builder = builder.with_access_key_id(k).with_secret_access_key(s);
            if let Some(token) = lookup(env::AWS_SESSION_TOKEN).filter(|t| !t.is_empty()) {
                builder = builder.with_token(token);
            }
        }
        // A public bucket: requests go unsigned.
        _ => builder = builder.with_skip_signature(true),
    }
    if let Some(endpoint) = endpoint {
        builder = builder.with_endpoint(endpoint);
    }
    let store = builder.build().map_err(|e| {
        ToolError::respond(
            format!(
                "the files of source `{}` cannot be reached: {e}",
                source.name
            ),
            Some("check the source's `url`, `endpoint` and `region`".into()),
        )
    })?;
    Ok(Lake::s3(table.clone(), location, format, Arc::new(store)))
}
