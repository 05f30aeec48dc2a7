//! The connection pool to the shared index, on the backend's own runtime.
//!
//! Connections are made on first need and kept while they work; a broken one (the server
//! restarted, the network dropped) is never handed out again, so after an outage the next
//! request simply connects anew. The first connection of a process brings the schema up to
//! date ([`crate::schema`]), under an advisory lock so replicas starting together take
//! turns.

use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_postgres::Client;

use crate::error::SharedError;
use crate::tls::{MakeRustls, default_ssl_mode, explicit_ssl_mode};

/// A pool of connections to the shared index.
pub(crate) struct Pg {
    config: tokio_postgres::Config,
    tls: MakeRustls,
    idle: Mutex<Vec<Client>>,
    permits: Arc<Semaphore>,
}

impl std::fmt::Debug for Pg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The config holds the password: show where it connects, nothing more.
        f.debug_struct("Pg")
            .field("hosts", &self.config.get_hosts())
            .field("dbname", &self.config.get_dbname())
            .finish_non_exhaustive()
    }
}

/// One connection taken from the pool; it goes back when dropped, unless it broke.
pub(crate) struct Conn {
    client: Option<Client>,
    pool: Arc<Pg>,
    _permit: OwnedSemaphorePermit,
}

impl std::ops::Deref for Conn {
    type Target = Client;

    fn deref(&self) -> &Client {
        // Only `Drop` takes it out.
        self.client.as_ref().unwrap_or_else(|| unreachable!())
    }
}

impl std::ops::DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut Client {
        self.client.as_mut().unwrap_or_else(|| unreachable!())
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(client) = self.client.take()
            && !client.is_closed()
        {
            self.pool.idle().push(client);
        }
    }
}

impl Pg {
    /// A pool of at most `size` connections to `url` (already expanded), each statement
    /// bounded by `timeout` on the server too. Connects nothing yet: [`Pg::get`] does, on
    /// the backend's runtime.
    ///
    /// Every connection is set up so a dead peer is noticed in seconds, not hours: TCP
    /// keepalives both ways (this side's socket options; the server's `tcp_keepalives_*`,
    /// so a replica that vanished without closing its connection gives its row and advisory
    /// locks back within about half a minute), and `statement_timeout`, `lock_timeout` and
    /// `idle_in_transaction_session_timeout`, so a statement whose caller gave up ends on
    /// the server as well. TLS unless the host is local or the URL says `sslmode=disable`.
    pub(crate) fn new(
        url: &str,
        ca: Option<&std::path::Path>,
        size: usize,
        timeout: Duration,
    ) -> Result<Arc<Self>, SharedError> {
        // tokio-postgres knows `disable`, `prefer` and `require`; with rustls `require`
        // always checks the certificate and the host name, which is what libpq calls
        // `verify-full`.
        let parsed = url
            .replace("sslmode=verify-full", "sslmode=require")
            .replace("sslmode=verify-ca", "sslmode=require");
        let mut config =
            tokio_postgres::Config::from_str(&parsed).map_err(|e| SharedError::Config {
                message: format!("`[shared] index` is not a PostgreSQL URL: {e}"),
                hint: "write `postgresql://USER@HOST:PORT/DB`, the password through `${NAME}`"
                    .into(),
            })?;
        let mode = default_ssl_mode(config.get_hosts(), explicit_ssl_mode(url));
        let ms = timeout.as_millis().max(1);
        let ours = format!(
            "-c statement_timeout={ms} -c lock_timeout={ms} \
             -c idle_in_transaction_session_timeout={} \
             -c tcp_keepalives_idle=10 -c tcp_keepalives_interval=5 -c tcp_keepalives_count=3",
            ms * 2
        );
        let options = match config.get_options() {
            Some(theirs) if !theirs.is_empty() => format!("{theirs} {ours}"),
            _ => ours,
        };
        config
            .ssl_mode(mode)
            .options(options)
            // `[shared] timeout` bounds a connection as it bounds every statement.
            .connect_timeout(timeout)
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(10))
            .keepalives_interval(Duration::from_secs(5))
            .keepalives_retries(3)
            .tcp_user_timeout(timeout)
            .application_name("dataref");
        Ok(Arc::new(Self {
            config,
            tls: MakeRustls::new(ca)?,
            idle: Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(size)),
        }))
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Client>> {
        // Pushes and pops only: nothing half done to see after a panic.
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A working connection: an idle one, else a new one. Must run on the backend's
    /// runtime (a new connection's task is spawned there).
    pub(crate) async fn get(self: &Arc<Self>) -> Result<Conn, SharedError> {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| SharedError::Runtime(e.to_string()))?;
        let idle = loop {
            let Some(client) = self.idle().pop() else {
                break None;
            };
            if !client.is_closed() {
                break Some(client);
            }
        };
        let client = match idle {
            Some(client) => client,
            None => self.connect().await?,
        };
        Ok(Conn {
            client: Some(client),
            pool: self.clone(),
            _permit: permit,
        })
    }

    /// A new connection, its driver task spawned on the current (the backend's) runtime.
    pub(crate) async fn connect(&self) -> Result<Client, SharedError> {
        let (client, connection) = self.config.connect(self.tls.clone()).await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("shared index connection ended: {e}");
            }
        });
        Ok(client)
    }
}
