//! Per-principal limits: a token bucket of `rate_per_minute` (bursts up to a tenth of it,
//! at least 10) over every authenticated request, at most `max_concurrent` MCP requests
//! (tool calls) in flight, and apart from those at most `max_downloads` downloads, so a
//! download nobody reads (a signed link needs no token) can never take a tool call's slot.
//! Over any → 429 with `Retry-After`.
//!
//! Who counts is a [`Limiter`]: [`LocalLimiter`] here counts in this process's memory (one
//! server); the shared backend (`dataref-replica`) counts in its index, so several replicas
//! behind a load balancer allow a principal the limits once, not once each. Both refuse
//! with the same [`Refused`], so a client gets the same answers from either.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use async_trait::async_trait;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use dataref_config::HttpConfig;
use dataref_protocol::Principal;
use http::{Method, StatusCode, header};
use serde_json::json;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::auth::caller;
use crate::response::{holding, json_response, refused_unread};

/// The rate layer: one token from the caller's bucket.
pub(crate) async fn rate(
    State(limits): State<Arc<dyn Limiter>>,
    request: Request,
    next: Next,
) -> Response {
    let admitted = match caller(&request) {
        Ok(principal) => limits
            .admit(&principal)
            .await
            .map_err(|refused| refused.response()),
        Err(fault) => Err(fault),
    };
    match admitted {
        Ok(()) => next.run(request).await,
        Err(refused) => refused_unread(request.headers(), refused),
    }
}

/// Which of the caller's in-flight slots a route's requests hold.
#[derive(Clone)]
pub(crate) struct Slots {
    pub(crate) limits: Arc<dyn Limiter>,
    pub(crate) kind: SlotKind,
}

/// The slot layer: one of the caller's in-flight slots, held until the response's last
/// byte. Tool calls are MCP POSTs and agent runs (an MCP GET is the long-lived
/// notification stream and a DELETE ends a session, neither of which should take a slot);
/// downloads have slots of their own.
pub(crate) async fn slot(State(slots): State<Slots>, request: Request, next: Next) -> Response {
    if slots.kind == SlotKind::ToolCall && request.method() != Method::POST {
        return next.run(request).await;
    }
    let permit = match caller(&request) {
        Ok(principal) => slots
            .limits
            .slot(&principal, slots.kind)
            .await
            .map_err(|refused| refused.response()),
        Err(fault) => Err(fault),
    };
    match permit {
        Ok(permit) => holding(next.run(request).await, permit),
        Err(refused) => refused_unread(request.headers(), refused),
    }
}

/// Counts a principal's requests and in-flight slots against [`LimitConfig`].
#[async_trait]
pub trait Limiter: Send + Sync {
    /// One request by `principal`: a token from its bucket, or why not.
    async fn admit(&self, principal: &Principal) -> Result<(), Refused>;
    /// One of `principal`'s slots of `kind`, held until the [`Permit`] is dropped.
    async fn slot(&self, principal: &Principal, kind: SlotKind) -> Result<Permit, Refused>;
    /// Housekeeping, every minute: forget what a fresh start would equal. Must not block.
    fn forget_idle(&self) {}
}

/// Which of a principal's in-flight bounds a request counts against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotKind {
    /// A tool call (an MCP POST) or an agent run: `max_concurrent`.
    ToolCall,
    /// A download: `max_downloads`.
    Download,
}

impl SlotKind {
    /// A short name, for keys and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ToolCall => "call",
            Self::Download => "download",
        }
    }
}

/// A slot taken from a [`Limiter`]; dropping it gives the slot back.
pub struct Permit {
    _held: Box<dyn Send + Sync>,
}

impl Permit {
    /// A permit that gives its slot back when `held` is dropped.
    pub fn new(held: impl Send + Sync + 'static) -> Self {
        Self {
            _held: Box::new(held),
        }
    }
}

/// The limits of `[http]` as every [`Limiter`] applies them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimitConfig {
    pub max_concurrent: usize,
    pub max_downloads: usize,
    /// `u32::MAX`: no rate limit.
    pub rate_per_minute: u32,
}

impl LimitConfig {
    /// `[http]`'s limits. Auth off is one local user on loopback: a rate limit would only
    /// throttle them against themselves (a host's burst of requests, the conformance
    /// suite), there is no other principal to protect. Concurrency still applies.
    pub fn of(http: &HttpConfig) -> Self {
        Self {
            max_concurrent: http.max_concurrent,
            max_downloads: http.max_downloads,
            rate_per_minute: if http.auth {
                http.rate_per_minute
            } else {
                u32::MAX
            },
        }
    }

    /// No rate limit at all (auth off): nothing to count.
    pub fn unlimited_rate(&self) -> bool {
        self.rate_per_minute == u32::MAX
    }

    /// Tokens a bucket gains per second.
    pub fn per_second(&self) -> f64 {
        f64::from(self.rate_per_minute) / 60.0
    }

    /// Tokens a bucket holds at most (and starts with).
    pub fn burst(&self) -> f64 {
        (f64::from(self.rate_per_minute) / 10.0).max(10.0)
    }

    /// How many slots of `kind` a principal has.
    pub fn slots(&self, kind: SlotKind) -> usize {
        match kind {
            SlotKind::ToolCall => self.max_concurrent,
            SlotKind::Download => self.max_downloads,
        }
    }

    /// The refusal of a request that found `tokens` (< 1) in the bucket: come back when one
    /// has refilled.
    pub fn rate_refused(&self, tokens: f64) -> Refused {
        let per_second = self.per_second();
        let wait = (1.0 - tokens) / per_second;
        Refused::Rate {
            retry_after: (wait.ceil() as u64).max(1),
            per_minute: per_second * 60.0,
        }
    }

    /// The refusal of a request that found every slot of `kind` taken.
    pub fn slots_refused(&self, kind: SlotKind) -> Refused {
        match kind {
            SlotKind::ToolCall => Refused::Concurrency {
                max: self.max_concurrent,
            },
            SlotKind::Download => Refused::Downloads {
                max: self.max_downloads,
            },
        }
    }
}

/// The limits of one process, in its memory.
pub(crate) struct LocalLimiter {
    config: LimitConfig,
    max_concurrent: usize,
    max_downloads: usize,
    per_second: f64,
    burst: f64,
    principals: Mutex<HashMap<Principal, Arc<PerPrincipal>>>,
}

struct PerPrincipal {
    slots: Arc<Semaphore>,
    downloads: Arc<Semaphore>,
    bucket: Mutex<Bucket>,
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Why a request is not served now; `Refused::response` is the answer.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Refused {
    /// Over `rate_per_minute`: 429.
    Rate { retry_after: u64, per_minute: f64 },
    /// Every `max_concurrent` slot taken: 429.
    Concurrency { max: usize },
    /// Every `max_downloads` slot taken: 429.
    Downloads { max: usize },
    /// The counts cannot be reached (the shared index is down): 503. The request is
    /// refused rather than let through uncounted.
    Unavailable { retry_after: u64 },
}

impl LocalLimiter {
    #[cfg(test)]
    pub(crate) fn new(max_concurrent: usize, max_downloads: usize, rate_per_minute: u32) -> Self {
        Self::with(LimitConfig {
            max_concurrent,
            max_downloads,
            rate_per_minute,
        })
    }

    pub(crate) fn with(config: LimitConfig) -> Self {
        Self {
            config,
            max_concurrent: config.max_concurrent,
            max_downloads: config.max_downloads,
            per_second: config.per_second(),
            burst: config.burst(),
            principals: Mutex::new(HashMap::new()),
        }
    }

    fn of(&self, principal: &Principal) -> Arc<PerPrincipal> {
        let mut map = self
            .principals
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        map.entry(principal.clone())
            .or_insert_with(|| {
                Arc::new(PerPrincipal {
                    slots: Arc::new(Semaphore::new(self.max_concurrent)),
                    downloads: Arc::new(Semaphore::new(self.max_downloads)),
                    bucket: Mutex::new(Bucket {
                        tokens: self.burst,
                        at: Instant::now(),
                    }),
                })
            })
            .clone()
    }

    /// Takes one token from the principal's bucket.
    pub(crate) fn admit(&self, principal: &Principal) -> Result<(), Refused> {
        let p = self.of(principal);
        let mut b = p.bucket.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        let elapsed = now.duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + elapsed * self.per_second).min(self.burst);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            return Ok(());
        }
        Err(self.config.rate_refused(b.tokens))
    }

    /// One of the principal's in-flight slots, held until the permit is dropped.
    /// Forgets the principals whose state a fresh entry would equal: no request in flight
    /// and a full bucket. Nothing is lost, and the map stays as small as the set of
    /// principals active in the last minutes (JWTs may name any number of them).
    pub(crate) fn forget_idle(&self) -> usize {
        let now = Instant::now();
        let mut map = self
            .principals
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let before = map.len();
        map.retain(|_, p| {
            let in_use = Arc::strong_count(p) > 1
                || p.slots.available_permits() < self.max_concurrent
                || p.downloads.available_permits() < self.max_downloads;
            let b = p.bucket.lock().unwrap_or_else(PoisonError::into_inner);
            let refilled = b.tokens + now.duration_since(b.at).as_secs_f64() * self.per_second;
            in_use || refilled < self.burst
        });
        before - map.len()
    }

    pub(crate) fn slot(&self, principal: &Principal) -> Result<OwnedSemaphorePermit, Refused> {
        self.of(principal)
            .slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| Refused::Concurrency {
                max: self.max_concurrent,
            })
    }

    /// One of the principal's download slots (not a tool call's), held until the permit
    /// is dropped.
    pub(crate) fn download_slot(
        &self,
        principal: &Principal,
    ) -> Result<OwnedSemaphorePermit, Refused> {
        self.of(principal)
            .downloads
            .clone()
            .try_acquire_owned()
            .map_err(|_| Refused::Downloads {
                max: self.max_downloads,
            })
    }
}

#[async_trait]
impl Limiter for LocalLimiter {
    async fn admit(&self, principal: &Principal) -> Result<(), Refused> {
        Self::admit(self, principal)
    }

    async fn slot(&self, principal: &Principal, kind: SlotKind) -> Result<Permit, Refused> {
        match kind {
            SlotKind::ToolCall => Self::slot(self, principal),
            SlotKind::Download => self.download_slot(principal),
        }
        .map(Permit::new)
    }

    fn forget_idle(&self) {
        Self::forget_idle(self);
    }
}

impl Refused {
    fn response(&self) -> Response {
        dataref_ops::metrics::rate_limited(match self {
            Self::Rate { .. } => "rate",
            Self::Concurrency { .. } => "concurrency",
            Self::Downloads { .. } => "downloads",
            Self::Unavailable { .. } => "unavailable",
        });
        let (status, retry_after, body) = match self {
            Self::Rate {
                retry_after,
                per_minute,
            } => (
                StatusCode::TOO_MANY_REQUESTS,
                *retry_after,
                json!({
                    "error": "rate_limited",
                    "limit": "rate_per_minute",
                    "message": format!("more than {per_minute} requests per minute for this principal"),
                    "hint": format!("wait {retry_after} s (`Retry-After`) and try again"),
                }),
            ),
            Self::Concurrency { max } => (
                StatusCode::TOO_MANY_REQUESTS,
                1,
                json!({
                    "error": "too_many_concurrent",
                    "limit": "max_concurrent",
                    "message": format!("this principal already has {max} requests in flight"),
                    "hint": "wait for one to finish and try again",
                }),
            ),
            Self::Downloads { max } => (
                StatusCode::TOO_MANY_REQUESTS,
                1,
                json!({
                    "error": "too_many_concurrent",
                    "limit": "max_downloads",
                    "message": format!("this principal already has {max} downloads in flight"),
                    "hint": "wait for one to finish (or close a stalled one) and try again",
                }),
            ),
            Self::Unavailable { retry_after } => (
                StatusCode::SERVICE_UNAVAILABLE,
                *retry_after,
                json!({
                    "error": "limits_unavailable",
                    "message": "this server cannot count the request against its limits: the shared index (PostgreSQL) is out of reach",
                    "hint": format!("try again in {retry_after} s (`Retry-After`); the details are in the server log"),
                }),
            ),
        };
        let mut r = json_response(status, body);
        r.headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from(retry_after));
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_and_slots() {
        let limits = LocalLimiter::new(2, 1, 60);
        let p = Principal::new("a").unwrap();
        let q = Principal::new("b").unwrap();
        for _ in 0..10 {
            assert!(limits.admit(&p).is_ok());
        }
        match limits.admit(&p) {
            Err(Refused::Rate { retry_after, .. }) => assert_eq!(retry_after, 1),
            _ => panic!("the 11th request within a second should be refused"),
        }
        assert!(limits.admit(&q).is_ok(), "buckets are per principal");
        let a = limits.slot(&p).ok();
        let b = limits.slot(&p).ok();
        assert!(a.is_some() && b.is_some());
        assert!(matches!(
            limits.slot(&p),
            Err(Refused::Concurrency { max: 2 })
        ));
        drop(a);
        assert!(limits.slot(&p).is_ok());
        // Downloads have slots of their own: the tool calls' are all taken above.
        let d = limits.download_slot(&p).ok();
        assert!(d.is_some());
        assert!(matches!(
            limits.download_slot(&p),
            Err(Refused::Downloads { max: 1 })
        ));
    }

    /// The shared index out of reach: 503, `Retry-After`, a JSON body that says so. Over a
    /// limit stays 429 whoever counts.
    #[test]
    fn unreachable_counts_are_a_503() {
        let r = Refused::Unavailable { retry_after: 5 }.response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "5");
        assert_eq!(r.headers()[header::CONTENT_TYPE], "application/json");
        let config = LimitConfig {
            max_concurrent: 2,
            max_downloads: 1,
            rate_per_minute: 60,
        };
        let r = config.rate_refused(0.25).response();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        for kind in [SlotKind::ToolCall, SlotKind::Download] {
            assert_eq!(
                config.slots_refused(kind).response().status(),
                StatusCode::TOO_MANY_REQUESTS
            );
        }
    }

    #[test]
    fn only_state_a_fresh_entry_would_equal_is_forgotten() {
        let limits = LocalLimiter::new(2, 2, 60);
        let drained = Principal::new("drained").unwrap();
        let busy = Principal::new("busy").unwrap();
        let idle = Principal::new("idle").unwrap();
        assert!(limits.admit(&drained).is_ok());
        let permit = limits.slot(&busy).ok();
        // `slot` takes no token, so `busy`'s bucket is full: only its request keeps it.
        assert!(limits.slot(&idle).is_ok(), "taken and given back at once");
        assert_eq!(limits.forget_idle(), 1, "only `idle`");
        drop(permit);
        assert_eq!(limits.forget_idle(), 1, "now `busy`");
        // `drained` spent a token; it stays until the bucket has refilled.
        assert_eq!(limits.forget_idle(), 0);
        assert!(limits.admit(&drained).is_ok(), "still its own bucket");
    }
}
