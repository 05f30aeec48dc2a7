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
use futures_util::StreamExt;
use object_store::aws::{AmazonS3Builder, S3ConditionalPut};
use object_store::path::Path;
use object_store::{
    BackoffConfig, ClientOptions, ObjectMeta, ObjectStore, ObjectStoreExt, PutMode, PutOptions,
    RetryConfig,
};

use crate::error::SharedError;
use dataref_store::{Checksum, Hashing};

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
        crate::ensure_crypto_provider();
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

    /// The object under `key` written into the new file `dest` (which the caller renames
    /// into place), and its content hash, computed as it was written; `Ok(None)` when
    /// there is no such object. The answer must start within
    /// `pause`, and each part of the body must follow the one before within `pause`.
    ///
    /// A thread of its own writes the body, the parts that arrived meanwhile in one
    /// vectored write: a write per part through tokio's file (a hop to the blocking pool
    /// each) made a download a third slower than the network.
    pub(crate) async fn get_into(
        &self,
        key: &Path,
        dest: &FsPath,
        pause: Duration,
    ) -> Result<Option<Checksum>, SharedError> {
        let stalled = |what| SharedError::TimedOut { what, after: pause };
        let got = match tokio::time::timeout(pause, self.store.get(key)).await {
            Err(_) => return Err(stalled("an object store answer")),
            Ok(Ok(got)) => got,
            Ok(Err(object_store::Error::NotFound { .. })) => return Ok(None),
            Ok(Err(e)) => return Err(e.into()),
        };
        let expected = got.meta.size;
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(WRITE_QUEUE);
        let path = dest.to_owned();
        let writer = tokio::task::spawn_blocking(move || write_parts(&path, rx));
        let mut stream = got.into_stream();
        let received = async {
            loop {
                let part = match tokio::time::timeout(pause, stream.next()).await {
                    Err(_) => return Err(stalled("a pause in an object's body")),
                    Ok(None) => return Ok(()),
                    Ok(Some(part)) => part?,
                };
                if tx.send(part).await.is_err() {
                    // The writer stopped: its error says why.
                    return Ok(());
                }
            }
        }
        .await;
        drop(tx);
        let (written, checksum) = writer
            .await
            .map_err(|e| SharedError::Runtime(format!("writing a download: {e}")))??;
        received?;
        if written != expected {
            return Err(SharedError::Objects(format!(
                "`{key}` ended after {written} of {expected} bytes"
            )));
        }
        Ok(Some(checksum))
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

/// Parts of a body waiting for the writer (a part is what one read of the socket gave,
/// tens to hundreds of KiB).
const WRITE_QUEUE: usize = 64;

/// Creates `path` and writes into it every part `rx` gives, each batch that waits in one
/// vectored write; the bytes written and their hash.
#[expect(
    clippy::disallowed_methods,
    reason = "a download goes to the cache's own `.tmp/`, outside every workspace"
)]
fn write_parts(
    path: &FsPath,
    mut rx: tokio::sync::mpsc::Receiver<Bytes>,
) -> Result<(u64, Checksum), SharedError> {
    use std::io::{IoSlice, Write};
    let cannot_write = |e| SharedError::local("cannot write", path, e);
    let mut file = std::fs::File::create_new(path)
        .map_err(|e| SharedError::local("cannot create", path, e))?;
    let mut written = 0u64;
    let mut hash = Hashing::new();
    let mut batch: Vec<Bytes> = Vec::with_capacity(WRITE_QUEUE);
    while let Some(first) = rx.blocking_recv() {
        batch.push(first);
        while batch.len() < WRITE_QUEUE
            && let Ok(more) = rx.try_recv()
        {
            batch.push(more);
        }
        {
            let mut slices: Vec<IoSlice<'_>> = batch.iter().map(|b| IoSlice::new(b)).collect();
            let mut rest = &mut slices[..];
            while !rest.is_empty() {
                let n = file.write_vectored(rest).map_err(cannot_write)?;
                if n == 0 {
                    return Err(cannot_write(std::io::ErrorKind::WriteZero.into()));
                }
                written += n as u64;
                IoSlice::advance_slices(&mut rest, n);
            }
        }
        for part in &batch {
            hash.update(part);
        }
        batch.clear();
    }
    Ok((written, hash.finish()))
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

#[cfg(test)]
#[expect(
    clippy::disallowed_methods,
    reason = "the tests' files are in a temp dir of their own"
)]
mod tests {
    use super::*;

    #[test]
    fn a_body_written_in_batches_keeps_every_part_in_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("download");
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(WRITE_QUEUE);
        let writer = std::thread::spawn({
            let path = path.clone();
            move || write_parts(&path, rx)
        });
        // More parts than one batch holds, of sizes that do not line up.
        let mut expected = Vec::new();
        for i in 0..3 * WRITE_QUEUE {
            let part: Vec<u8> = (0..(i * 37 % 5000) + 1).map(|j| (i + j) as u8).collect();
            expected.extend_from_slice(&part);
            tx.blocking_send(Bytes::from(part))
                .expect("the writer is there");
        }
        drop(tx);
        let (written, checksum) = writer.join().expect("no panic").expect("written");
        assert_eq!(written, expected.len() as u64);
        assert_eq!(checksum, Checksum::of(&expected));
        assert_eq!(std::fs::read(&path).expect("read"), expected);
    }

    #[test]
    fn a_writer_that_cannot_create_its_file_says_so_and_takes_nothing_more() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("taken");
        std::fs::write(&path, b"another reader's").expect("write");
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(1);
        let e = write_parts(&path, rx).expect_err("the file is there");
        assert!(e.to_string().contains("cannot create"), "{e}");
        // The receiver is gone: the download loop stops instead of waiting on it.
        assert!(tx.blocking_send(Bytes::from_static(b"x")).is_err());
        assert_eq!(std::fs::read(&path).expect("read"), b"another reader's");
    }
}
