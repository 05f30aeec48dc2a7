//! A small pool of PostgreSQL connections per source.
//!
//! Invariant: a connection in `idle` is outside any transaction and carries no role or
//! setting of a previous caller. Every producer call sets its role and timeout with
//! `SET LOCAL` inside its own transaction, and a connection goes back to `idle` only
//! through [`Conn::give_back`], which the caller uses only after a ROLLBACK that the
//! server acknowledged. Every other way out (an error, a timeout, a panic, a dropped
//! future) drops the connection, which closes it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio_postgres::{Client, NoTls};

use crate::SourceError;
use crate::error::ConnectProblem;
use dataref_config::env::{ExpandError, expand};

/// How long a new connection may take before the attempt is abandoned.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where `${NAME}` in a URL is looked up: the process environment, or a map in tests.
pub type EnvLookup = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// The connections of one PostgreSQL source. Nothing connects until the first call, so a
/// server starts even when the database is briefly down.
pub struct PgPool {
    source: String,
    url: String,
    env: EnvLookup,
    idle: Mutex<Vec<Client>>,
    slots: Semaphore,
}

impl std::fmt::Debug for PgPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the URL: it may hold a password.
        f.debug_struct("PgPool")
            .field("source", &self.source)
            .field("size", &self.slots.available_permits())
            .finish_non_exhaustive()
    }
}

/// A checked-out connection. Dropping it closes the connection.
pub(crate) struct Conn<'p> {
    pool: &'p PgPool,
    client: Option<Client>,
    _slot: SemaphorePermit<'p>,
}

impl Conn<'_> {
    pub(crate) fn client(&mut self) -> Result<&mut Client, SourceError> {
        self.client.as_mut().ok_or_else(|| SourceError::Connect {
            source_name: self.pool.source.clone(),
            message: "internal: the connection was already returned".into(),
            problem: ConnectProblem::Other,
        })
    }

    /// Returns the connection to the pool. Call only after the transaction ended cleanly.
    pub(crate) fn give_back(mut self) {
        if let Some(client) = self.client.take()
            && !client.is_closed()
            && let Ok(mut idle) = self.pool.idle.lock()
        {
            idle.push(client);
        }
    }
}

impl PgPool {
    /// A pool of at most `size` connections to `url` (`${NAME}` expanded from the process
    /// environment at each connect).
    pub fn new(source: &str, url: &str, size: usize) -> Self {
        Self::with_env(
            source,
            url,
            size,
            Arc::new(|name: &str| std::env::var(name).ok()),
        )
    }

    /// [`PgPool::new`] with `${NAME}` looked up by `env`.
    pub fn with_env(source: &str, url: &str, size: usize, env: EnvLookup) -> Self {
        Self {
            source: source.to_owned(),
            url: url.to_owned(),
            env,
            idle: Mutex::new(Vec::new()),
            slots: Semaphore::new(size.max(1)),
        }
    }

    pub fn source_name(&self) -> &str {
        &self.source
    }

    /// The connection configuration, `${NAME}` expanded.
    pub(crate) fn config(&self) -> Result<tokio_postgres::Config, SourceError> {
        let fail = |problem: ConnectProblem, message: String| SourceError::Connect {
            source_name: self.source.clone(),
            message,
            problem,
        };
        let url = expand(&self.url, &*self.env).map_err(|e| match e {
            ExpandError::Unset(name) => fail(
                ConnectProblem::Env(name.clone()),
                format!("`url` uses `${{{name}}}`, which is not set"),
            ),
            ExpandError::Malformed(m) => fail(ConnectProblem::BadUrl, format!("`url`: {m}")),
        })?;
        let mut config: tokio_postgres::Config = url.parse().map_err(|e| {
            // The parser's message never repeats the URL (which may hold a password).
            fail(ConnectProblem::BadUrl, format!("`url` is not valid: {e}"))
        })?;
        if config.get_application_name().is_none() {
            config.application_name("dataref");
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        Ok(config)
    }

    /// A connection: an idle one that is still open, or a new one. Waits at most `wait`
    /// for a free slot.
    pub(crate) async fn get(&self, wait: Duration) -> Result<Conn<'_>, SourceError> {
        let slot = match tokio::time::timeout(wait, self.slots.acquire()).await {
            Ok(Ok(slot)) => slot,
            Ok(Err(_)) | Err(_) => {
                return Err(SourceError::Connect {
                    source_name: self.source.clone(),
                    message: format!(
                        "every connection of the pool was busy for {} ms",
                        wait.as_millis()
                    ),
                    problem: ConnectProblem::Busy,
                });
            }
        };
        loop {
            let Some(client) = self.idle.lock().ok().and_then(|mut idle| idle.pop()) else {
                break;
            };
            if !client.is_closed() {
                return Ok(Conn {
                    pool: self,
                    client: Some(client),
                    _slot: slot,
                });
            }
        }
        let client = self.connect().await?;
        Ok(Conn {
            pool: self,
            client: Some(client),
            _slot: slot,
        })
    }

    /// A new connection whose I/O runs as a task on the current runtime.
    pub(crate) async fn connect(&self) -> Result<Client, SourceError> {
        let config = self.config()?;
        let connecting = config.connect(NoTls);
        let (client, connection) = match tokio::time::timeout(CONNECT_TIMEOUT, connecting).await {
            Ok(Ok(pair)) => pair,
            Ok(Err(e)) => return Err(super::connect_error(&self.source, &e)),
            Err(_) => {
                return Err(SourceError::Connect {
                    source_name: self.source.clone(),
                    message: format!("no answer within {}s", CONNECT_TIMEOUT.as_secs()),
                    problem: ConnectProblem::Unreachable,
                });
            }
        };
        let source = self.source.clone();
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(source = %source, error = %e, "postgres connection closed");
            }
        });
        Ok(client)
    }

    /// Idle connections (for tests of the pool's hygiene).
    pub fn idle_count(&self) -> usize {
        self.idle.lock().map_or(0, |idle| idle.len())
    }
}
