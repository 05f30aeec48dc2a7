//! Secrets every replica must agree on, kept in the index (`dataref_keys`): the key that
//! signs download links, so a link signed on one replica verifies on every other. The first
//! replica that needs a key makes it (32 random bytes, `INSERT … ON CONFLICT DO NOTHING`);
//! every replica, that one included, then reads the one that won. It lives as long as the
//! index: links survive restarts of every replica. Never logged.

use std::sync::Arc;

use dataref_http::SigningKey;

use crate::Backend;
use crate::error::SharedError;

/// The row of the download-link key.
const DOWNLOAD_LINKS: &str = "download-links";
/// The length of a key made here.
const KEY_BYTES: usize = 32;

/// The download-link key, made by this call if no replica has made one yet.
pub(crate) async fn download_key(backend: &Arc<Backend>) -> Result<SigningKey, SharedError> {
    let bytes = read_or_make(backend).await?;
    SigningKey::new(bytes).map_err(|e| SharedError::Config {
        message: format!("the download-link key in the shared index: {e}"),
        hint: "delete the row `download-links` of `dataref_keys` and restart every replica (a \
               new key is made; links signed so far stop working), or set `[http] signing_key`"
            .into(),
    })
}

async fn read_or_make(backend: &Arc<Backend>) -> Result<Vec<u8>, SharedError> {
    let pg = backend.pg.clone();
    backend
        .io
        .run("reading the download-link key", async move {
            let mut fresh = vec![0u8; KEY_BYTES];
            getrandom::fill(&mut fresh)
                .map_err(|e| SharedError::Runtime(format!("the system's random source: {e}")))?;
            let c = pg.get().await?;
            // Two statements, not one: a row another replica inserted after this
            // statement's snapshot is invisible to a select in the same statement.
            c.execute(
                "INSERT INTO dataref_keys (name, key) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
                &[&DOWNLOAD_LINKS, &fresh],
            )
            .await?;
            let row = c
                .query_one(
                    "SELECT key FROM dataref_keys WHERE name = $1",
                    &[&DOWNLOAD_LINKS],
                )
                .await?;
            Ok(row.get::<_, Vec<u8>>(0))
        })
        .await
}
