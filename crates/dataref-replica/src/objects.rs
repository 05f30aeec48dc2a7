//! The object store: an S3-compatible bucket through `object_store`, every key under the
//! deployment's prefix.
//!
//! Writes are create-only (`If-None-Match: *`): an object, once there, is never replaced,
//! so two replicas can never overwrite each other's bytes, and every key names one content
//! for its whole life (which is what lets every replica cache it without asking again).

use std::path::Path as FsPath;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use dataref_config::{SharedConfig, env};
use object_store::aws::{AmazonS3Builder, S3ConditionalPut};
use object_store::path::Path;
use object_store::{
    BackoffConfig, ClientOptions, ObjectMeta, ObjectStore, ObjectStoreExt, PutMode, PutOptions,
    RetryConfig,
};

use crate::error::SharedError;
use dataref_store::{Checksum, PieceHash, Pieces};

/// What a create-only write found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Put {
    Created,
    /// An object was already there under that key (kept as it was).
    AlreadyThere,
}

#[derive(Debug)]
pub(crate) struct Objects {
    store: Arc<dyn ObjectStore>,
    /// The deployment's prefix, `""` or `a/b` (no slashes at either end).
    prefix: String,
    /// `bucket/prefix`, for messages and the log.
    shown: String,
}

impl Objects {
    pub(crate) fn new(
        config: &SharedConfig,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, SharedError> {
        dataref_config::tls::install_provider();
        let key_id = lookup(env::AWS_ACCESS_KEY_ID).filter(|k| !k.is_empty());
        let secret = lookup(env::AWS_SECRET_ACCESS_KEY).filter(|k| !k.is_empty());
        let (Some(key_id), Some(secret)) = (key_id, secret) else {
            return Err(SharedError::Config {
                message: "`[shared]` needs the object store's credentials, and \
                          `AWS_ACCESS_KEY_ID` or `AWS_SECRET_ACCESS_KEY` is not set"
                    .into(),
                hint: "set both in the server's environment (never in dataref.toml)".into(),
            });
        };
        let mut builder = AmazonS3Builder::new()
            .with_bucket_name(&config.bucket)
            .with_region(&config.region)
            .with_access_key_id(key_id)
            .with_secret_access_key(secret)
            .with_conditional_put(S3ConditionalPut::ETagMatch)
            // Every upload carries its SHA-256 (`x-amz-checksum-sha256`): the store refuses a
            // body damaged on the way. (The index keeps the BLAKE3 that reads check.)
            .with_checksum_algorithm(object_store::aws::Checksum::SHA256)
            .with_retry(RetryConfig {
                backoff: BackoffConfig {
                    init_backoff: Duration::from_millis(100),
                    max_backoff: Duration::from_secs(2),
                    base: 2.0,
                },
                // A store that is down answers quickly with a clear error: the caller (a
                // person, a model) can try again, and nothing waits minutes for it.
                max_retries: 3,
                retry_timeout: Duration::from_secs(10),
            })
            .with_client_options(
                // Whole requests are bounded by the caller (the timeout, and for a body the
                // time its bytes take at the slowest acceptable rate, or a pause of the
                // timeout between two parts of it): here only a ceiling.
                ClientOptions::new()
                    .with_connect_timeout(Duration::from_secs(5))
                    .with_timeout(Duration::from_secs(3600))
                    .with_allow_http(
                        config
                            .endpoint
                            .as_deref()
                            .is_some_and(|e| e.starts_with("http://")),
                    ),
            );
        if let Some(token) = lookup(env::AWS_SESSION_TOKEN).filter(|t| !t.is_empty()) {
            builder = builder.with_token(token);
        }
        if let Some(endpoint) = &config.endpoint {
            builder = builder.with_endpoint(endpoint);
        }
        let store = builder.build().map_err(|e| SharedError::Config {
            message: format!("the object store cannot be set up: {e}"),
            hint: "check `[shared] objects`, `endpoint` and `region`".into(),
        })?;
        let shown = if config.prefix.is_empty() {
            config.bucket.clone()
        } else {
            format!("{}/{}", config.bucket, config.prefix)
        };
        Ok(Self {
            store: Arc::new(store),
            prefix: config.prefix.clone(),
            shown,
        })
    }

    /// The store itself, for streaming reads.
    pub(crate) fn store(&self) -> Arc<dyn ObjectStore> {
        self.store.clone()
    }

    /// `bucket/prefix`, for the log.
    pub(crate) fn shown(&self) -> &str {
        &self.shown
    }

    /// The key of `rel` (`artifacts/<ref>.arrow`, `files/<version>`) under the prefix.
    pub(crate) fn key(&self, rel: &str) -> Path {
        if self.prefix.is_empty() {
            Path::from(rel)
        } else {
            Path::from(format!("{}/{rel}", self.prefix))
        }
    }

    /// `key` relative to the prefix (the inverse of [`Objects::key`]), if it is under it.
    pub(crate) fn rel<'a>(&self, key: &'a Path) -> Option<&'a str> {
        let key = key.as_ref();
        if self.prefix.is_empty() {
            Some(key)
        } else {
            key.strip_prefix(self.prefix.as_str())?.strip_prefix('/')
        }
    }

    /// Writes `bytes` under `key` unless an object is already there.
    pub(crate) async fn put_new(&self, key: &Path, bytes: Bytes) -> Result<Put, SharedError> {
        let opts = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        match self.store.put_opts(key, bytes.into(), opts).await {
            Ok(_) => Ok(Put::Created),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(Put::AlreadyThere),
            Err(e) => Err(e.into()),
        }
    }

    /// The bytes `range` of the object under `key` (fewer when it is shorter, or an error),
    /// arriving within `pause`; `None` when there is no such object.
    pub(crate) async fn get_range(
        &self,
        key: &Path,
        range: std::ops::Range<u64>,
        pause: Duration,
    ) -> Result<Option<Bytes>, SharedError> {
        match tokio::time::timeout(pause, self.store.get_range(key, range)).await {
            Err(_) => Err(SharedError::TimedOut {
                what: "a part of an object",
                after: pause,
            }),
            Ok(Err(object_store::Error::NotFound { .. })) => Ok(None),
            Ok(Err(e)) => Err(e.into()),
            Ok(Ok(bytes)) => Ok(Some(bytes)),
        }
    }

    /// The first `len` bytes of the object under `key` written into the new file `dest`
    /// (which the caller renames into place), and their content hash.
    ///
    /// Fetched as ranged GETs of [`PART`] bytes, [`PARTS_IN_FLIGHT`] at a time, each
    /// written at its place and hashed as it arrives: a part is a whole subtree of the
    /// BLAKE3 tree, so the parts' hashes merge into the file's without a second pass, and
    /// the download, the writes and the hashing overlap instead of following one another.
    /// Each part must arrive whole within `pause`.
    pub(crate) async fn get_into(
        &self,
        key: &Path,
        dest: &FsPath,
        len: u64,
        pause: Duration,
    ) -> Result<Got, SharedError> {
        let file = Arc::new(create_sized(dest, len)?);
        if len == 0 {
            return Ok(match self.size_of(key, pause).await? {
                None => Got::Missing,
                Some(_) => Got::Bytes(Checksum::of(&[])),
            });
        }
        let pieces = Pieces::plan(len, PART);
        let spans = pieces.spans().to_vec();
        let whole = spans.len() == 1;
        let mut hashes = vec![None; spans.len()];
        let mut running = tokio::task::JoinSet::new();
        let mut next = 0;
        loop {
            while running.len() < PARTS_IN_FLIGHT
                && let Some(&(offset, n)) = spans.get(next)
            {
                let (store, key, file, i) = (self.store.clone(), key.clone(), file.clone(), next);
                running.spawn(async move {
                    (
                        i,
                        get_part(store, &key, offset..offset + n, file, whole, pause).await,
                    )
                });
                next += 1;
            }
            let Some(done) = running.join_next().await else {
                break;
            };
            let (i, part) =
                done.map_err(|e| SharedError::Runtime(format!("fetching a part: {e}")))?;
            match part {
                Ok(Part::Hashed(h)) => hashes[i] = Some(h),
                Ok(Part::Whole(checksum)) => return Ok(Got::Bytes(checksum)),
                Ok(Part::Missing) => return Ok(Got::Missing),
                // A part missing or short, or refused: what the object holds says which.
                Ok(Part::Short) | Err(_) => {
                    return Ok(match self.shortfall(key, len, pause, part.err()).await? {
                        Shortfall::Missing => Got::Missing,
                        Shortfall::Short { found } => Got::Short { found },
                    });
                }
            }
        }
        let hashes: Option<Vec<PieceHash>> = hashes.into_iter().collect();
        hashes
            .and_then(|h| pieces.finish(&h))
            .map(Got::Bytes)
            .ok_or_else(|| SharedError::Runtime(format!("`{key}`: a part's hash is missing")))
    }

    /// Why a ranged GET of the object under `key` (written as `len` bytes) came short, or
    /// `failed`: the object is missing or shorter, else the GET's own error.
    pub(crate) async fn shortfall(
        &self,
        key: &Path,
        len: u64,
        pause: Duration,
        failed: Option<SharedError>,
    ) -> Result<Shortfall, SharedError> {
        match self.size_of(key, pause).await? {
            None => Ok(Shortfall::Missing),
            Some(found) if found < len => Ok(Shortfall::Short { found }),
            Some(_) => Err(failed.unwrap_or_else(|| {
                SharedError::Objects(format!(
                    "`{key}` answered a ranged GET with fewer bytes than asked for"
                ))
            })),
        }
    }

    /// The size of the object under `key`, `None` when there is none.
    async fn size_of(&self, key: &Path, pause: Duration) -> Result<Option<u64>, SharedError> {
        match tokio::time::timeout(pause, self.store.head(key)).await {
            Err(_) => Err(SharedError::TimedOut {
                what: "an object store answer",
                after: pause,
            }),
            Ok(Ok(meta)) => Ok(Some(meta.size)),
            Ok(Err(object_store::Error::NotFound { .. })) => Ok(None),
            Ok(Err(e)) => Err(e.into()),
        }
    }

    /// Whether the bucket answers with these credentials: a HEAD of a key nothing is
    /// written under (not there is the answer expected; refused or no answer is not).
    pub(crate) async fn reachable(&self) -> Result<(), SharedError> {
        match self.store.head(&self.key(".ready")).await {
            Ok(_) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Removes the object under `key`; one that is not there is fine.
    pub(crate) async fn delete(&self, key: &Path) -> Result<(), SharedError> {
        match self.store.delete(key).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// The objects under `rel`, as the listing pages in.
    pub(crate) fn list_stream(
        &self,
        rel: &str,
    ) -> futures_util::stream::BoxStream<'static, Result<ObjectMeta, object_store::Error>> {
        self.store.list(Some(&self.key(rel)))
    }
}

/// What an object that answered a ranged GET short (or not at all) holds.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Shortfall {
    Missing,
    /// Only `found` bytes, fewer than were written.
    Short {
        found: u64,
    },
}

/// What a download found.
#[derive(Debug)]
pub(crate) enum Got {
    /// No object under the key.
    Missing,
    /// The bytes asked for, written, and their hash.
    Bytes(Checksum),
    /// The object holds only `found` bytes, fewer than asked for.
    Short { found: u64 },
}

/// The bytes of one ranged GET of a download: a power of two, so that each part is a whole
/// subtree of the BLAKE3 tree.
const PART: u64 = 8 << 20;
/// The parts of one download fetched at once.
const PARTS_IN_FLIGHT: usize = 4;

/// What one part of a download came to.
enum Part {
    Hashed(PieceHash),
    /// The download's only part: the file's hash itself.
    Whole(Checksum),
    Missing,
    /// Fewer bytes came than were asked for.
    Short,
}

/// `path` created (it must not exist) at `len` bytes, opened to read and write, for parts
/// to be written at their places.
#[expect(
    clippy::disallowed_methods,
    reason = "downloads and parts go to the cache's own directory, outside every workspace"
)]
pub(crate) fn create_sized(path: &FsPath, len: u64) -> Result<std::fs::File, SharedError> {
    let file = std::fs::File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| SharedError::local("cannot create", path, e))?;
    file.set_len(len)
        .map_err(|e| SharedError::local("cannot size", path, e))?;
    Ok(file)
}

/// The bytes `range` of `key`, written into `file` at their place and hashed (as the whole
/// file when `whole`), off the async threads.
async fn get_part(
    store: Arc<dyn ObjectStore>,
    key: &Path,
    range: std::ops::Range<u64>,
    file: Arc<std::fs::File>,
    whole: bool,
    pause: Duration,
) -> Result<Part, SharedError> {
    let bytes = match tokio::time::timeout(pause, store.get_range(key, range.clone())).await {
        Err(_) => {
            return Err(SharedError::TimedOut {
                what: "a part of an object",
                after: pause,
            });
        }
        Ok(Err(object_store::Error::NotFound { .. })) => return Ok(Part::Missing),
        Ok(Err(e)) => return Err(e.into()),
        Ok(Ok(bytes)) => bytes,
    };
    if bytes.len() as u64 != range.end - range.start {
        return Ok(Part::Short);
    }
    tokio::task::spawn_blocking(move || {
        use std::os::unix::fs::FileExt;
        file.write_all_at(&bytes, range.start)
            .map_err(|e| SharedError::Runtime(format!("writing a download: {e}")))?;
        Ok(if whole {
            Part::Whole(Checksum::of(&bytes))
        } else {
            Part::Hashed(Pieces::hash(range.start, &bytes))
        })
    })
    .await
    .map_err(|e| SharedError::Runtime(format!("writing a download: {e}")))?
}

/// The whole of `file`, without reading it into memory: a read-only mapping that the
/// request body borrows.
#[expect(
    unsafe_code,
    reason = "memory-mapping a file for upload has no safe API"
)]
pub(crate) fn map_for_upload(file: &std::fs::File, path: &FsPath) -> Result<Bytes, SharedError> {
    let len = file
        .metadata()
        .map_err(|e| SharedError::local("cannot inspect", path, e))?
        .len();
    if len == 0 {
        return Ok(Bytes::new());
    }
    // SAFETY: the file is a finished artifact or workspace file in a directory only this
    // process writes, never opened for writing again (renamed into place or removed
    // afterwards), so its pages cannot change while the upload reads them.
    let map = unsafe { memmap2::Mmap::map(file) }
        .map_err(|e| SharedError::local("cannot map", path, e))?;
    Ok(Bytes::from_owner(map))
}
