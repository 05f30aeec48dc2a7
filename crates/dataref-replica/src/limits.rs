//! The HTTP limits of `[http]` counted once for all replicas, in the index, so a principal
//! whose requests a load balancer spreads over N replicas gets the limits once, not N
//! times. Answers are the same as one server's ([`dataref_http::Refused`]).
//!
//! - Rate: the same token bucket as one server's (a burst of `max(R/10, 10)`, refilled at
//!   `R/60` per second), kept in one row per principal (`dataref_rate`) and updated by one
//!   upsert per request, one round trip: the row lock orders every replica's requests, and
//!   the index's clock is the only clock, so replicas' clocks may disagree. Rows whose
//!   bucket has had time to refill are swept (a fresh row starts full, so nothing changes).
//! - Slots (`max_concurrent`, `max_downloads`): slot `i` of a principal is the advisory
//!   lock `<principal>/<call|download>/<i>` ([`crate::locks`]), held on the replica's lock
//!   connection while the request runs, so every replica sees it and a replica that dies
//!   gives its slots back with its connection. A request tries the slots from a random one on
//!   ([`crate::locks::Locks::try_lock_any`]).
//! - The index out of reach (or slower than [`LIMIT_TIMEOUT`]): the request is refused
//!   with 503 and `Retry-After` ([`dataref_http::Refused::Unavailable`]). Letting requests
//!   through uncounted would lift every limit exactly when the index is struggling, and
//!   nearly every tool call needs the index anyway; the detail goes to the log.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dataref_http::{LimitConfig, Limiter, Permit, Refused, SlotKind};
use dataref_protocol::{Principal, Timestamp};
use tokio_postgres::types::Type;

use crate::Backend;
use crate::error::SharedError;
use crate::locks::LockKind;

/// The longest a request waits for the limits before it is refused with 503 (less than
/// `[shared] timeout` when that is longer: a request should not hang on its admission).
pub const LIMIT_TIMEOUT: Duration = Duration::from_secs(5);
/// What a 503 asks the client to wait.
const RETRY_UNAVAILABLE: u64 = 5;
/// At most one warning about an unreachable index per this many seconds (every request
/// would log one).
const WARN_EVERY_SECS: i64 = 10;

/// One request takes a token if the bucket, refilled since its last request, has one.
/// `$1` principal, `$2` burst, `$3` tokens per second. `statement_timestamp()` is one value
/// for the whole statement; `GREATEST` keeps a request that waited for the row lock behind
/// a later-started one from counting negative time.
const ADMIT: &str = "
    INSERT INTO dataref_rate AS r (principal, tokens, at, admitted)
    VALUES ($1, $2 - 1, statement_timestamp(), true)
    ON CONFLICT (principal) DO UPDATE SET
        tokens = LEAST($2, r.tokens + GREATEST(0, EXTRACT(EPOCH FROM statement_timestamp() - r.at)::float8) * $3)
               - CASE WHEN LEAST($2, r.tokens + GREATEST(0, EXTRACT(EPOCH FROM statement_timestamp() - r.at)::float8) * $3) >= 1
                      THEN 1 ELSE 0 END,
        at = GREATEST(r.at, statement_timestamp()),
        admitted = LEAST($2, r.tokens + GREATEST(0, EXTRACT(EPOCH FROM statement_timestamp() - r.at)::float8) * $3) >= 1
    RETURNING admitted, tokens";

/// Buckets that have refilled (`$1`: the seconds an empty bucket takes to fill).
const SWEEP: &str =
    "DELETE FROM dataref_rate WHERE at < statement_timestamp() - make_interval(secs => $1)";

/// [`Limiter`] over the shared index.
pub(crate) struct PgLimiter {
    backend: Arc<Backend>,
    config: LimitConfig,
    timeout: Duration,
    /// When the last warning about the index was logged (Unix seconds).
    warned: AtomicI64,
}

impl PgLimiter {
    pub(crate) fn new(backend: Arc<Backend>, config: LimitConfig, timeout: Duration) -> Self {
        Self {
            backend,
            config,
            timeout: timeout.min(LIMIT_TIMEOUT),
            warned: AtomicI64::new(i64::MIN),
        }
    }

    /// Runs `fut` on the backend's runtime within [`Self::timeout`].
    async fn run<T, F>(&self, what: &'static str, fut: F) -> Result<T, SharedError>
    where
        T: Send + 'static,
        F: std::future::Future<Output = Result<T, SharedError>> + Send + 'static,
    {
        match tokio::time::timeout(self.timeout, self.backend.io.run(what, fut)).await {
            Ok(answer) => answer,
            // The task runs on to its own end (a slot it took is given back when its
            // answer is dropped).
            Err(_) => Err(SharedError::TimedOut {
                what,
                after: self.timeout,
            }),
        }
    }

    /// The 503 for a request whose limits could not be counted; the reason is logged.
    fn unavailable(&self, what: &str, e: &SharedError) -> Refused {
        let now = Timestamp::now().unix_seconds();
        let last = self.warned.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= WARN_EVERY_SECS
            && self
                .warned
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            if e.is_unavailable() {
                tracing::warn!("refusing requests with 503: {what}: {e}");
            } else {
                tracing::error!("refusing requests with 503: {what}: {e}");
            }
        }
        Refused::Unavailable {
            retry_after: RETRY_UNAVAILABLE,
        }
    }
}

#[async_trait]
impl Limiter for PgLimiter {
    async fn admit(&self, principal: &Principal) -> Result<(), Refused> {
        if self.config.unlimited_rate() {
            return Ok(());
        }
        let pg = self.backend.pg.clone();
        let name = principal.as_str().to_owned();
        let (burst, per_second) = (self.config.burst(), self.config.per_second());
        let counted = self
            .run("counting a request against `rate_per_minute`", async move {
                let c = pg.get().await?;
                let row = c
                    .query_typed_one(
                        ADMIT,
                        &[
                            (&name, Type::TEXT),
                            (&burst, Type::FLOAT8),
                            (&per_second, Type::FLOAT8),
                        ],
                    )
                    .await?;
                Ok((row.get::<_, bool>(0), row.get::<_, f64>(1)))
            })
            .await;
        match counted {
            Ok((true, _)) => Ok(()),
            Ok((false, tokens)) => Err(self.config.rate_refused(tokens)),
            Err(e) => Err(self.unavailable("counting a request against the rate limit", &e)),
        }
    }

    async fn slot(&self, principal: &Principal, kind: SlotKind) -> Result<Permit, Refused> {
        let slots = self.config.slots(kind);
        let backend = self.backend.clone();
        let prefix = format!("{principal}/{}", kind.as_str());
        // From a random slot on: concurrent requests seldom ask for the same slot, and a
        // nearly full set costs a round trip per slot another replica holds, on average
        // half of them, not all (the ones held here cost none).
        let start = random_below(slots);
        let texts: Vec<String> = (0..slots)
            .map(|i| format!("{prefix}/{}", (start + i) % slots))
            .collect();
        let taken = self
            .run("taking an in-flight slot", async move {
                backend.locks.try_lock_any(LockKind::Slot, texts).await
            })
            .await;
        match taken {
            // Given back when the request's permit drops.
            Ok(Some(held)) => Ok(Permit::new(held)),
            Ok(None) => Err(self.config.slots_refused(kind)),
            Err(e) => Err(self.unavailable("taking an in-flight slot", &e)),
        }
    }

    fn forget_idle(&self) {
        let per_second = self.config.per_second();
        if self.config.unlimited_rate() || per_second <= 0.0 {
            return;
        }
        let refill = self.config.burst() / per_second;
        let pg = self.backend.pg.clone();
        self.backend.io.spawn(async move {
            let swept = async {
                let c = pg.get().await?;
                c.query_typed(SWEEP, &[(&refill, Type::FLOAT8)]).await?;
                Ok::<_, SharedError>(())
            }
            .await;
            if let Err(e) = swept {
                tracing::debug!("sweeping refilled rate buckets: {e}");
            }
        });
    }
}

/// A number in `0..n` (0 when `n` is 0, or the OS has no randomness to give).
fn random_below(n: usize) -> usize {
    let mut bytes = [0u8; 8];
    if n == 0 || getrandom::fill(&mut bytes).is_err() {
        return 0;
    }
    let n64 = u64::try_from(n).unwrap_or(u64::MAX);
    usize::try_from(u64::from_le_bytes(bytes) % n64).unwrap_or(0)
}
