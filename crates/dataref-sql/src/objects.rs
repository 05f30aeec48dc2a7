//! An S3 store as the engine's object store: reads only.
//!
//! The engine speaks `object_store` 0.13 (DataFusion's); the S3 client the server already
//! builds is `object_store` 0.14 (the shared store's). Rather than compile a second S3
//! client and a second HTTP stack, this adapter forwards the reads (get, list) from one to
//! the other and refuses every write: a lake is read, never written.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::object_store as v13;
use futures_util::stream::{BoxStream, StreamExt};

/// `inner`, seen by the engine as a read-only store.
#[derive(Debug)]
pub(crate) struct ReadOnly {
    inner: Arc<dyn object_store::ObjectStore>,
}

impl ReadOnly {
    pub(crate) fn new(inner: Arc<dyn object_store::ObjectStore>) -> Self {
        Self { inner }
    }
}

impl fmt::Display for ReadOnly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ReadOnly({})", self.inner)
    }
}

const STORE: &str = "lake";

fn path_in(p: &v13::path::Path) -> object_store::path::Path {
    object_store::path::Path::from(p.as_ref())
}

fn path_out(p: &object_store::path::Path) -> v13::path::Path {
    v13::path::Path::from(p.as_ref())
}

fn error_out(e: object_store::Error) -> v13::Error {
    match e {
        object_store::Error::NotFound { path, source } => v13::Error::NotFound { path, source },
        object_store::Error::NotModified { path, source } => {
            v13::Error::NotModified { path, source }
        }
        object_store::Error::Precondition { path, source } => {
            v13::Error::Precondition { path, source }
        }
        other => v13::Error::Generic {
            store: STORE,
            source: Box::new(other),
        },
    }
}

fn meta_out(m: object_store::ObjectMeta) -> v13::ObjectMeta {
    v13::ObjectMeta {
        location: path_out(&m.location),
        last_modified: m.last_modified,
        size: m.size,
        e_tag: m.e_tag,
        version: m.version,
    }
}

fn range_in(r: v13::GetRange) -> object_store::GetRange {
    match r {
        v13::GetRange::Bounded(r) => object_store::GetRange::Bounded(r),
        v13::GetRange::Offset(o) => object_store::GetRange::Offset(o),
        v13::GetRange::Suffix(s) => object_store::GetRange::Suffix(s),
    }
}

fn read_only(what: &str) -> v13::Error {
    v13::Error::NotSupported {
        source: format!("a lake is read-only: {what} is not allowed").into(),
    }
}

#[async_trait]
impl v13::ObjectStore for ReadOnly {
    async fn put_opts(
        &self,
        _location: &v13::path::Path,
        _payload: v13::PutPayload,
        _opts: v13::PutOptions,
    ) -> v13::Result<v13::PutResult> {
        Err(read_only("writing"))
    }

    async fn put_multipart_opts(
        &self,
        _location: &v13::path::Path,
        _opts: v13::PutMultipartOptions,
    ) -> v13::Result<Box<dyn v13::MultipartUpload>> {
        Err(read_only("writing"))
    }

    async fn get_opts(
        &self,
        location: &v13::path::Path,
        options: v13::GetOptions,
    ) -> v13::Result<v13::GetResult> {
        let options = object_store::GetOptions {
            if_match: options.if_match,
            if_none_match: options.if_none_match,
            if_modified_since: options.if_modified_since,
            if_unmodified_since: options.if_unmodified_since,
            range: options.range.map(range_in),
            version: options.version,
            head: options.head,
            ..Default::default()
        };
        let got = self
            .inner
            .get_opts(&path_in(location), options)
            .await
            .map_err(error_out)?;
        let meta = meta_out(got.meta.clone());
        let range = got.range.clone();
        let payload =
            v13::GetResultPayload::Stream(got.into_stream().map(|r| r.map_err(error_out)).boxed());
        Ok(v13::GetResult {
            payload,
            meta,
            range,
            attributes: v13::Attributes::default(),
        })
    }

    async fn get_ranges(
        &self,
        location: &v13::path::Path,
        ranges: &[std::ops::Range<u64>],
    ) -> v13::Result<Vec<bytes::Bytes>> {
        self.inner
            .get_ranges(&path_in(location), ranges)
            .await
            .map_err(error_out)
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, v13::Result<v13::path::Path>>,
    ) -> BoxStream<'static, v13::Result<v13::path::Path>> {
        locations.map(|_| Err(read_only("deleting"))).boxed()
    }

    fn list(
        &self,
        prefix: Option<&v13::path::Path>,
    ) -> BoxStream<'static, v13::Result<v13::ObjectMeta>> {
        let prefix = prefix.map(path_in);
        self.inner
            .list(prefix.as_ref())
            .map(|r| r.map(meta_out).map_err(error_out))
            .boxed()
    }

    async fn list_with_delimiter(
        &self,
        prefix: Option<&v13::path::Path>,
    ) -> v13::Result<v13::ListResult> {
        let prefix = prefix.map(path_in);
        let listed = self
            .inner
            .list_with_delimiter(prefix.as_ref())
            .await
            .map_err(error_out)?;
        Ok(v13::ListResult {
            common_prefixes: listed.common_prefixes.iter().map(path_out).collect(),
            objects: listed.objects.into_iter().map(meta_out).collect(),
        })
    }

    async fn copy_opts(
        &self,
        _from: &v13::path::Path,
        _to: &v13::path::Path,
        _options: v13::CopyOptions,
    ) -> v13::Result<()> {
        Err(read_only("copying"))
    }
}
