//! Per-principal limits: a token bucket of `rate_per_minute` (bursts up to a tenth of it,
//! at least 10) over every authenticated request, at most `max_concurrent` MCP requests
//! (tool calls) in flight, and apart from those at most `max_downloads` downloads, so a
//! download nobody reads (a signed link needs no token) can never take a tool call's slot.
//! Over any → 429 with `Retry-After`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use dataref_protocol::Principal;
use http::{Response, StatusCode, header};
use serde_json::json;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::{Body, json_response};

pub(crate) struct Limits {
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

pub(crate) enum Refused {
    Rate { retry_after: u64, per_minute: f64 },
    Concurrency { max: usize },
    Downloads { max: usize },
}

impl Limits {
    pub(crate) fn new(max_concurrent: usize, max_downloads: usize, rate_per_minute: u32) -> Self {
        let per_minute = f64::from(rate_per_minute);
        Self {
            max_concurrent,
            max_downloads,
            per_second: per_minute / 60.0,
            burst: (per_minute / 10.0).max(10.0),
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
        let wait = (1.0 - b.tokens) / self.per_second;
        Err(Refused::Rate {
            retry_after: (wait.ceil() as u64).max(1),
            per_minute: self.per_second * 60.0,
        })
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

impl Refused {
    pub(crate) fn response(&self) -> Response<Body> {
        let (retry_after, body) = match self {
            Self::Rate {
                retry_after,
                per_minute,
            } => (
                *retry_after,
                json!({
                    "error": "rate_limited",
                    "limit": "rate_per_minute",
                    "message": format!("more than {per_minute} requests per minute for this principal"),
                    "hint": format!("wait {retry_after} s (`Retry-After`) and try again"),
                }),
            ),
            Self::Concurrency { max } => (
                1,
                json!({
                    "error": "too_many_concurrent",
                    "limit": "max_concurrent",
                    "message": format!("this principal already has {max} requests in flight"),
                    "hint": "wait for one to finish and try again",
                }),
            ),
            Self::Downloads { max } => (
                1,
                json!({
                    "error": "too_many_concurrent",
                    "limit": "max_downloads",
                    "message": format!("this principal already has {max} downloads in flight"),
                    "hint": "wait for one to finish (or close a stalled one) and try again",
                }),
            ),
        };
        let mut r = json_response(StatusCode::TOO_MANY_REQUESTS, body);
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
        let limits = Limits::new(2, 1, 60);
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

    #[test]
    fn only_state_a_fresh_entry_would_equal_is_forgotten() {
        let limits = Limits::new(2, 2, 60);
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
