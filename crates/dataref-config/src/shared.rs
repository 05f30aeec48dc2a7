//! `[shared]`: several `dataref serve --http` replicas behind a load balancer, sharing
//! artifacts, workspace files, agent sessions, signed-link keys and per-principal limits
//! through an S3-compatible object store and a PostgreSQL index.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{ConfigError, invalid};
use crate::raw::RawShared;
use crate::units::{duration, size};

/// Where the replicas' shared state lives. Secrets stay `${NAME}` here and are expanded
/// from the environment when the server connects ([`crate::env::expand`]); the object
/// store's credentials come only from the environment (`AWS_ACCESS_KEY_ID`,
/// `AWS_SECRET_ACCESS_KEY`, optionally `AWS_SESSION_TOKEN`).
#[derive(Clone, PartialEq, Eq)]
pub struct SharedConfig {
    /// The bucket, from `objects = "s3://BUCKET[/PREFIX]"`.
    pub bucket: String,
    /// The key prefix inside the bucket (no leading or trailing `/`; may be empty), so
    /// several deployments can share one bucket.
    pub prefix: String,
    /// An S3-compatible server's base URL (`http://` allowed, for one on a private
    /// network); `None`: AWS S3 for `region`.
    pub endpoint: Option<String>,
    /// The S3 region; default `us-east-1` (S3-compatible servers mostly ignore it).
    pub region: String,
    /// The PostgreSQL URL of the shared index, usually `${NAME}` (it holds a password).
    /// TLS is required for a host on the network unless it says `sslmode=disable`.
    pub index: String,
    /// A PEM file of the CA certificates the index's certificate is checked against,
    /// instead of the system's trust store (a private CA). Relative to the config file.
    pub index_ca: Option<PathBuf>,
    /// Bytes this replica's cache of artifact files may hold before the least recently used
    /// are evicted. Default 10 GiB. (Its copies of workspaces are bounded by each
    /// principal's workspace quota instead.)
    pub cache_bytes: u64,
    /// Connections to the shared index from one replica. Default 8.
    pub index_pool: usize,
    /// How long one request to the object store or the index may take before it counts as
    /// the shared store being unavailable. Default 30 s.
    pub timeout: Duration,
}

impl std::fmt::Debug for SharedConfig {
    /// Everything but `index`, whose URL may hold a password when written without `${…}`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedConfig")
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("index", &"…")
            .field("index_ca", &self.index_ca)
            .field("cache_bytes", &self.cache_bytes)
            .field("index_pool", &self.index_pool)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl SharedConfig {
    pub const DEFAULT_CACHE_BYTES: u64 = 10 << 30;
    pub const DEFAULT_INDEX_POOL: usize = 8;
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
}

pub(crate) fn resolve_shared(raw: RawShared, base: &Path) -> Result<SharedConfig, ConfigError> {
    let objects = raw.objects.ok_or_else(|| {
        invalid(
            "shared.objects",
            "is missing",
            "name the bucket (and an optional prefix) the replicas share, e.g. \
             `objects = \"s3://dataref/prod\"`",
        )
    })?;
    let (bucket, prefix) = parse_objects(&objects)?;
    let index = raw.index.ok_or_else(|| {
        invalid(
            "shared.index",
            "is missing",
            "give the shared PostgreSQL's URL through the environment, e.g. \
             `index = \"${DATAREF_INDEX_URL}\"`",
        )
    })?;
    if !(index.starts_with("postgres://")
        || index.starts_with("postgresql://")
        || index.starts_with("${"))
    {
        return Err(invalid(
            "shared.index",
            "is not a PostgreSQL URL",
            "write `postgresql://USER@HOST/DB` (a password through `${NAME}`)",
        ));
    }
    if let Some(e) = &raw.endpoint
        && !(e.starts_with("http://") || e.starts_with("https://"))
    {
        return Err(invalid(
            "shared.endpoint",
            format!("`{e}` is not an http(s) URL"),
            "e.g. `endpoint = \"https://s3.example.com\"`; leave it out for AWS S3",
        ));
    }
    let index_pool = raw.index_pool.unwrap_or(SharedConfig::DEFAULT_INDEX_POOL);
    if index_pool == 0 {
        return Err(invalid(
            "shared.index_pool",
            "must be at least 1",
            "the default is 8",
        ));
    }
    let timeout = duration(
        "shared.timeout",
        &raw.timeout,
        SharedConfig::DEFAULT_TIMEOUT,
    )?;
    if timeout.is_zero() {
        return Err(invalid(
            "shared.timeout",
            "must be longer than zero",
            "the default is `30s`",
        ));
    }
    Ok(SharedConfig {
        index_ca: raw.index_ca.map(|p| base.join(p)),
        bucket,
        prefix,
        endpoint: raw.endpoint.map(|e| e.trim_end_matches('/').to_owned()),
        region: raw.region.unwrap_or_else(|| "us-east-1".into()),
        index,
        cache_bytes: size(
            "shared.cache_bytes",
            &raw.cache_bytes,
            SharedConfig::DEFAULT_CACHE_BYTES,
        )?,
        index_pool,
        timeout,
    })
}

/// `s3://BUCKET[/PREFIX]` into the bucket and the prefix.
fn parse_objects(objects: &str) -> Result<(String, String), ConfigError> {
    let bad = |why: &str| {
        invalid(
            "shared.objects",
            format!("`{objects}` {why}"),
            "write `s3://BUCKET` or `s3://BUCKET/PREFIX`",
        )
    };
    let rest = objects
        .strip_prefix("s3://")
        .ok_or_else(|| bad("is not an `s3://` URL"))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    // S3's own rules for bucket names (3–63 lower-case letters, digits, `-` and `.`).
    let bucket_ok = (3..=63).contains(&bucket.len())
        && bucket
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    if !bucket_ok {
        return Err(bad(
            "does not name a bucket (3 to 63 of `a-z`, `0-9`, `-`, `.`)",
        ));
    }
    let prefix = prefix.trim_matches('/');
    if prefix.split('/').any(|p| p == "." || p == "..")
        || prefix.contains("//")
        || prefix.bytes().any(|b| b.is_ascii_control())
    {
        return Err(bad("has a prefix that is not a plain key path"));
    }
    Ok((bucket.to_owned(), prefix.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_name_a_bucket_and_an_optional_prefix() {
        assert_eq!(
            parse_objects("s3://dataref").unwrap(),
            ("dataref".into(), String::new())
        );
        assert_eq!(
            parse_objects("s3://data-ref.eu/prod/a/").unwrap(),
            ("data-ref.eu".into(), "prod/a".into())
        );
        for bad in [
            "dataref",
            "s3://",
            "s3://A",
            "s3://x",
            "s3://ok-bucket/../other",
            "s3://ok-bucket/a//b",
            "gs://bucket",
        ] {
            assert!(parse_objects(bad).is_err(), "{bad}");
        }
    }
}
