//! A lake: the files of one table (Parquet, CSV or NDJSON) under a local directory or glob,
//! or under an S3 prefix, as a query's table.
//!
//! The table is DataFusion's listing table, so a query reads only what it needs: the files
//! of the Hive-style `key=value` folders its filters keep, the columns it names, and (for
//! Parquet) the row groups and pages whose statistics can match. The engine's object
//! store registry holds this one store and nothing else (see [`Stores`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_schema::{DataType, SchemaRef};
use datafusion::catalog::TableProvider;
use datafusion::datasource::file_format::FileFormat;
use datafusion::datasource::file_format::csv::CsvFormat;
use datafusion::datasource::file_format::json::JsonFormat;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::{
    ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl,
};
use datafusion::error::DataFusionError;
use datafusion::execution::object_store::ObjectStoreRegistry;
use datafusion::object_store as v13;
use datafusion::prelude::SessionContext;
use futures_util::StreamExt;

use crate::SqlError;

/// The files' format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LakeFormat {
    Parquet,
    Csv,
    Ndjson,
}

impl LakeFormat {
    /// The extensions files of this format carry, the usual one first.
    fn extensions(self) -> &'static [&'static str] {
        match self {
            Self::Parquet => &[".parquet", ".parq"],
            Self::Csv => &[".csv", ".tsv"],
            Self::Ndjson => &[".ndjson", ".jsonl", ".json"],
        }
    }

    fn of_name(name: &str) -> Option<(Self, &'static str)> {
        let lower = name.to_ascii_lowercase();
        [Self::Parquet, Self::Csv, Self::Ndjson]
            .into_iter()
            .find_map(|f| {
                f.extensions()
                    .iter()
                    .find(|e| lower.ends_with(*e))
                    .map(|e| (f, *e))
            })
    }

    fn name(self) -> &'static str {
        match self {
            Self::Parquet => "Parquet",
            Self::Csv => "CSV",
            Self::Ndjson => "NDJSON",
        }
    }
}

/// One table of files.
#[derive(Debug, Clone)]
pub struct Lake {
    /// The table's name in the SQL.
    pub name: String,
    /// `s3://bucket/prefix/`, or an absolute local path (a directory or a glob).
    location: String,
    format: Option<LakeFormat>,
    store: Arc<dyn v13::ObjectStore>,
}

impl Lake {
    /// Files under a local directory or glob (an absolute path).
    pub fn local(name: impl Into<String>, path: &str, format: Option<LakeFormat>) -> Self {
        Self {
            name: name.into(),
            location: path.to_owned(),
            format,
            store: Arc::new(v13::local::LocalFileSystem::new()),
        }
    }

    /// Files under `url` (`s3://bucket/prefix/`), read through `store`, a client of that
    /// bucket.
    pub fn s3(
        name: impl Into<String>,
        url: &str,
        format: Option<LakeFormat>,
        store: Arc<dyn object_store::ObjectStore>,
    ) -> Self {
        Self {
            name: name.into(),
            location: url.to_owned(),
            format,
            store: Arc::new(crate::objects::ReadOnly::new(store)),
        }
    }

    /// Where the files are, as configured.
    pub fn location(&self) -> &str {
        &self.location
    }

    /// The table's URL and the registry entry the engine reads it through.
    pub(crate) fn url(&self) -> Result<ListingTableUrl, SqlError> {
        ListingTableUrl::parse(&self.location).map_err(|e| lake_error(self, &e))
    }

    pub(crate) fn stores(&self) -> Result<Stores, SqlError> {
        let url = self.url()?;
        let mut stores = Stores::default();
        stores
            .0
            .insert(url.object_store().as_str().to_owned(), self.store.clone());
        Ok(stores)
    }

    /// The listing table, its schema read from the files and its partition columns from
    /// the folder names.
    pub(crate) async fn table(
        &self,
        ctx: &SessionContext,
    ) -> Result<(Arc<dyn TableProvider>, SchemaRef, String), SqlError> {
        let state = ctx.state();
        let url = self.url()?;
        let fail = |e: DataFusionError| lake_error(self, &e);
        // One listing per query: the first data file (by name) gives the format when none
        // is configured, the extension its siblings are matched by, and the schema; the
        // files' ETags (or sizes and times) give the lake's version.
        let (found, version) = self.first_file(&state, &url, self.format).await?;
        let (format, extension) = LakeFormat::of_name(&found).ok_or_else(|| SqlError::Lake {
            location: self.location.clone(),
            message: format!("cannot tell the format of `{found}`"),
            hint: "set `format = \"parquet\"`, `\"csv\"` or `\"ndjson\"` on the source".into(),
        })?;
        let file_format: Arc<dyn FileFormat> = match format {
            LakeFormat::Parquet => Arc::new(ParquetFormat::default()),
            LakeFormat::Csv => Arc::new(
                CsvFormat::default()
                    .with_has_header(true)
                    .with_delimiter(if extension == ".tsv" { b'\t' } else { b',' }),
            ),
            LakeFormat::Ndjson => Arc::new(JsonFormat::default()),
        };
        let mut options = ListingOptions::new(file_format).with_file_extension(extension);
        let partitions = options.infer_partitions(&state, &url).await.map_err(fail)?;
        options = options.with_table_partition_cols(
            partitions
                .into_iter()
                .map(|p| (p, DataType::Utf8))
                .collect(),
        );
        // The schema is the first file's (by name), as DuckDB reads a glob: reading every
        // file's footer before each query would cost a request per file, and would open
        // files of folders the query's filters then prune. A file that disagrees fails
        // the query that reads it, naming the file.
        let first = ListingTableUrl::parse(format!("{}{found}", url.object_store().as_str()))
            .map_err(fail)?;
        let schema = options.infer_schema(&state, &first).await.map_err(fail)?;
        let config = ListingTableConfig::new(url)
            .with_listing_options(options)
            .with_schema(schema);
        let table = ListingTable::try_new(config).map_err(fail)?;
        let schema = table.schema();
        Ok((Arc::new(table), schema, version))
    }

    /// The name of the first data file under the location (of `format`, if given): hidden
    /// files and markers such as `_SUCCESS` are not data. And the lake's version as the
    /// listing found it: how many data files, their bytes, the newest, and a hash over
    /// each file's name, size, time and ETag (a file replaced, added or removed changes it).
    async fn first_file(
        &self,
        state: &datafusion::execution::session_state::SessionState,
        url: &ListingTableUrl,
        format: Option<LakeFormat>,
    ) -> Result<(String, String), SqlError> {
        let fail = |e: DataFusionError| lake_error(self, &e);
        let mut files = url
            .list_all_files(state, self.store.as_ref(), "")
            .await
            .map_err(fail)?;
        let mut any = None;
        let mut first: Option<String> = None;
        let mut seen: Vec<(String, u64, i64, String)> = Vec::new();
        while let Some(meta) = files.next().await {
            let meta = meta.map_err(fail)?;
            let name = meta.location.filename().unwrap_or_default().to_owned();
            if name.starts_with('.') || name.starts_with('_') {
                continue;
            }
            let fits = match (format, LakeFormat::of_name(&name)) {
                (None, Some(_)) => true,
                (Some(f), Some((g, _))) => f == g,
                _ => false,
            };
            let location = meta.location.to_string();
            if fits {
                seen.push((
                    location.clone(),
                    meta.size,
                    meta.last_modified.timestamp_micros(),
                    meta.e_tag.clone().unwrap_or_default(),
                ));
                // The first by name, whatever order the store lists in.
                if first.as_ref().is_none_or(|f| location < *f) {
                    first = Some(location);
                }
            } else {
                any.get_or_insert(location);
            }
        }
        if let Some(first) = first {
            seen.sort();
            let mut hash = blake3::Hasher::new();
            for (location, size, micros, etag) in &seen {
                hash.update(format!("{location}\n{size}\n{micros}\n{etag}\n").as_bytes());
            }
            let bytes: u64 = seen.iter().map(|f| f.1).sum();
            let newest = seen.iter().map(|f| f.2).max().unwrap_or_default();
            let newest = dataref_protocol::Timestamp(newest.div_euclid(1_000_000));
            let hex = hash.finalize().to_hex();
            let version = format!(
                "{} files, {bytes} bytes, newest {newest}, listing blake3:{}",
                seen.len(),
                &hex.as_str()[..16]
            );
            return Ok((first, version));
        }
        Err(SqlError::Lake {
            location: self.location.clone(),
            message: match (format, any) {
                (Some(f), Some(other)) => {
                    format!("no {} files are there (found `{other}`)", f.name())
                }
                (None, Some(other)) => {
                    format!("no Parquet, CSV or NDJSON files are there (found `{other}`)")
                }
                (_, None) => "no files are there".into(),
            },
            hint: "check the source's `path` or `url`, and its `format`".into(),
        })
    }
}

fn lake_error(lake: &Lake, e: &DataFusionError) -> SqlError {
    SqlError::Lake {
        location: lake.location.clone(),
        message: e.message().into_owned(),
        hint: "check the source's `path` or `url`, the files, and the server's credentials".into(),
    }
}

/// The object stores the engine may read: none for `run_sql`, a lake's own for a lake.
#[derive(Debug, Default)]
pub(crate) struct Stores(BTreeMap<String, Arc<dyn v13::ObjectStore>>);

impl ObjectStoreRegistry for Stores {
    fn register_store(
        &self,
        _url: &url::Url,
        _store: Arc<dyn v13::ObjectStore>,
    ) -> Option<Arc<dyn v13::ObjectStore>> {
        None
    }

    fn get_store(&self, url: &url::Url) -> datafusion::error::Result<Arc<dyn v13::ObjectStore>> {
        let key = &url[url::Position::BeforeScheme..url::Position::BeforePath];
        self.0
            .iter()
            .find(|(k, _)| k.trim_end_matches('/') == key.trim_end_matches('/'))
            .map(|(_, s)| s.clone())
            .ok_or_else(|| {
                DataFusionError::Plan(format!(
                    "no files or URLs can be read here (`{}`)",
                    url.scheme()
                ))
            })
    }
}
