//! Per-tenant rate limit of the model calls the operator pays for (goal
//! refinement, success-criteria generation, reflection): a token bucket per
//! tenant, kept where the whole fleet takes from it ([`SharedBuckets`], the
//! database) so N replicas allow the limit once, with one in this process's
//! memory as the fallback while the shared one cannot be reached.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The setting that sets the limit, named in every refusal.
pub const MODEL_CALLS_SETTING: &str = "WARDEN_TENANT_MODEL_CALLS_PER_MINUTE";

/// A token bucket: holds up to `capacity` calls, refilled continuously at
/// `capacity` per minute, so a full minute's calls may come in a burst.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenBucket {
    capacity: f64,
    per_second: f64,
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    /// A full bucket of `per_minute` calls (at least 1) at `now`.
    pub fn new(per_minute: u32, now: Instant) -> TokenBucket {
        let capacity = f64::from(per_minute.max(1));
        TokenBucket {
            capacity,
            per_second: capacity / 60.0,
            tokens: capacity,
            at: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        // A clock that went back refills nothing.
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.capacity);
        self.at = self.at.max(now);
    }

    /// Takes one call at `now`, or answers how long until one is available.
    pub fn try_take(&mut self, now: Instant) -> Result<(), Duration> {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64(
                (1.0 - self.tokens) / self.per_second,
            ))
        }
    }

    /// Whether the bucket is full at `now` (then it is as good as absent).
    pub fn is_full(&mut self, now: Instant) -> bool {
        self.refill(now);
        self.tokens >= self.capacity
    }
}

/// Buckets kept before full ones are dropped.
const MAX_BUCKETS: usize = 10_000;

/// How long until a bucket of `per_minute` calls that holds `tokens` has a
/// whole call again.
pub fn wait_for_one(tokens: f64, per_minute: u32) -> Duration {
    let per_second = f64::from(per_minute.max(1)) / 60.0;
    let missing = (1.0 - tokens).clamp(0.0, 1.0);
    Duration::from_secs_f64(missing / per_second)
}

/// What taking from a shared bucket answers: `None` when admitted, else how
/// long until a call would be; `Err` when the buckets cannot be reached.
pub type Taken<'a> = Pin<Box<dyn Future<Output = Result<Option<Duration>, String>> + Send + 'a>>;

/// Token buckets that every replica of the fleet takes from.
pub trait SharedBuckets: Send + Sync {
    /// Takes one call from `tenant`'s bucket of `per_minute` calls.
    fn take<'a>(&'a self, tenant: &'a str, per_minute: u32) -> Taken<'a>;
}

/// One token bucket per tenant; `0` calls per minute means unlimited.
pub struct TenantLimiter {
    per_minute: u32,
    /// This process's buckets: the limit while `shared` cannot be reached
    /// (and the whole of it without `shared`).
    buckets: Mutex<HashMap<String, TokenBucket>>,
    shared: Option<Arc<dyn SharedBuckets>>,
}

impl std::fmt::Debug for TenantLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantLimiter")
            .field("per_minute", &self.per_minute)
            .field("shared", &self.shared.is_some())
            .finish()
    }
}

/// A model call refused by the tenant's rate limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limited {
    /// The limit, in calls per minute.
    pub per_minute: u32,
    /// How long until the next call is allowed.
    pub retry_after: Duration,
}

impl Limited {
    /// The refusal in words, naming the setting that raises the limit.
    pub fn detail(&self) -> String {
        format!(
            "this tenant used its {} model calls per minute on the server's model (goal refinement, \
success criteria, reflection); retry in {} s, or raise {MODEL_CALLS_SETTING} (0: unlimited)",
            self.per_minute,
            self.retry_after.as_secs().max(1)
        )
    }
}

impl TenantLimiter {
    /// A limiter allowing `per_minute` calls per tenant (`0`: unlimited),
    /// counted in this process alone.
    pub fn new(per_minute: u32) -> TenantLimiter {
        TenantLimiter {
            per_minute,
            buckets: Mutex::new(HashMap::new()),
            shared: None,
        }
    }

    /// A limiter allowing `per_minute` calls per tenant across the fleet,
    /// counted in `shared`.
    pub fn shared(per_minute: u32, shared: Arc<dyn SharedBuckets>) -> TenantLimiter {
        TenantLimiter {
            shared: Some(shared),
            ..TenantLimiter::new(per_minute)
        }
    }

    /// Takes one call for `tenant` now: from the fleet's bucket, or from
    /// this process's while the fleet's cannot be reached.
    pub async fn admit(&self, tenant: &str) -> Result<(), Limited> {
        if self.per_minute == 0 {
            return Ok(());
        }
        if let Some(shared) = &self.shared {
            match shared.take(tenant, self.per_minute).await {
                Ok(None) => return Ok(()),
                Ok(Some(retry_after)) => {
                    return Err(Limited {
                        per_minute: self.per_minute,
                        retry_after,
                    });
                }
                Err(err) => {
                    tracing::warn!(error = %err, "the fleet's model-call buckets are out of reach; this replica limits on its own meanwhile");
                }
            }
        }
        self.admit_at(tenant, Instant::now())
    }

    /// Takes one call for `tenant` at `now` from this process's bucket.
    pub fn admit_at(&self, tenant: &str, now: Instant) -> Result<(), Limited> {
        if self.per_minute == 0 {
            return Ok(());
        }
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(tenant) {
            buckets.retain(|_, b| !b.is_full(now));
        }
        buckets
            .entry(tenant.to_string())
            .or_insert_with(|| TokenBucket::new(self.per_minute, now))
            .try_take(now)
            .map_err(|retry_after| Limited {
                per_minute: self.per_minute,
                retry_after,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_bucket_allows_a_burst_then_refuses() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(3, t0);
        assert_eq!(b.try_take(t0), Ok(()));
        assert_eq!(b.try_take(t0), Ok(()));
        assert_eq!(b.try_take(t0), Ok(()));
        let wait = b.try_take(t0).unwrap_err();
        // 3 a minute: one every 20 s.
        assert!((wait.as_secs_f64() - 20.0).abs() < 1e-6, "{wait:?}");
    }

    #[test]
    fn the_bucket_refills_at_its_rate_up_to_its_capacity() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(60, t0);
        for _ in 0..60 {
            assert!(b.try_take(t0).is_ok());
        }
        assert!(b.try_take(t0).is_err());
        // One call a second.
        let half = t0 + Duration::from_millis(500);
        let wait = b.try_take(half).unwrap_err();
        assert!((wait.as_secs_f64() - 0.5).abs() < 1e-6, "{wait:?}");
        assert!(b.try_take(t0 + Duration::from_secs(1)).is_ok());
        assert!(b.try_take(t0 + Duration::from_secs(1)).is_err());
        // An hour later it holds a minute's calls, no more.
        let later = t0 + Duration::from_secs(3600);
        assert!(b.is_full(later));
        for _ in 0..60 {
            assert!(b.try_take(later).is_ok());
        }
        assert!(b.try_take(later).is_err());
    }

    #[test]
    fn a_clock_going_back_refills_nothing() {
        let t1 = Instant::now() + Duration::from_secs(10);
        let mut b = TokenBucket::new(1, t1);
        assert!(b.try_take(t1).is_ok());
        assert!(b.try_take(t1 - Duration::from_secs(5)).is_err());
        assert!(b.try_take(t1 + Duration::from_secs(59)).is_err());
        assert!(b.try_take(t1 + Duration::from_secs(60)).is_ok());
    }

    #[test]
    fn tenants_have_buckets_of_their_own() {
        let t0 = Instant::now();
        let limiter = TenantLimiter::new(2);
        assert!(limiter.admit_at("a", t0).is_ok());
        assert!(limiter.admit_at("a", t0).is_ok());
        let refused = limiter.admit_at("a", t0).unwrap_err();
        assert_eq!(refused.per_minute, 2);
        assert!(refused.detail().contains(MODEL_CALLS_SETTING));
        assert!(limiter.admit_at("b", t0).is_ok());
        assert!(limiter.admit_at("a", t0 + Duration::from_secs(30)).is_ok());
    }

    #[test]
    fn zero_is_unlimited() {
        let t0 = Instant::now();
        let limiter = TenantLimiter::new(0);
        for _ in 0..10_000 {
            assert!(limiter.admit_at("a", t0).is_ok());
        }
    }

    #[test]
    fn the_wait_for_one_call_is_what_is_missing_at_the_rate() {
        assert_eq!(wait_for_one(0.0, 60), Duration::from_secs(1));
        assert_eq!(wait_for_one(0.5, 60), Duration::from_millis(500));
        assert_eq!(
            wait_for_one(-3.0, 6),
            Duration::from_secs(10),
            "never more than one call's wait"
        );
        assert_eq!(wait_for_one(1.5, 60), Duration::ZERO);
        assert_eq!(
            wait_for_one(0.0, 0),
            Duration::from_secs(60),
            "a rate of at least one a minute"
        );
    }

    /// Buckets that answer as told, counting what was asked of them.
    struct Scripted {
        answer: Result<Option<Duration>, String>,
        asked: Mutex<Vec<(String, u32)>>,
    }

    impl SharedBuckets for Scripted {
        fn take<'a>(&'a self, tenant: &'a str, per_minute: u32) -> Taken<'a> {
            self.asked
                .lock()
                .unwrap()
                .push((tenant.to_string(), per_minute));
            let answer = self.answer.clone();
            Box::pin(async move { answer })
        }
    }

    fn scripted(answer: Result<Option<Duration>, String>) -> Arc<Scripted> {
        Arc::new(Scripted {
            answer,
            asked: Mutex::new(Vec::new()),
        })
    }

    #[tokio::test]
    async fn the_fleets_bucket_decides_when_it_answers() {
        let admits = scripted(Ok(None));
        let limiter = TenantLimiter::shared(1, admits.clone());
        for _ in 0..5 {
            assert!(
                limiter.admit("a").await.is_ok(),
                "the fleet's bucket admitted"
            );
        }
        assert_eq!(admits.asked.lock().unwrap().len(), 5);
        assert_eq!(admits.asked.lock().unwrap()[0], ("a".to_string(), 1));

        let refuses = scripted(Ok(Some(Duration::from_secs(7))));
        let limiter = TenantLimiter::shared(10, refuses);
        let refused = limiter.admit("a").await.unwrap_err();
        assert_eq!(refused.retry_after, Duration::from_secs(7));
        assert_eq!(refused.per_minute, 10);
    }

    #[tokio::test]
    async fn an_unreachable_fleet_bucket_falls_back_to_this_replicas() {
        let down = scripted(Err("connection refused".into()));
        let limiter = TenantLimiter::shared(2, down.clone());
        assert!(limiter.admit("a").await.is_ok());
        assert!(limiter.admit("a").await.is_ok());
        assert!(
            limiter.admit("a").await.is_err(),
            "the local limit holds meanwhile"
        );
        assert_eq!(
            down.asked.lock().unwrap().len(),
            3,
            "the fleet's is asked each time"
        );
    }

    #[tokio::test]
    async fn unlimited_asks_nobody() {
        let buckets = scripted(Ok(Some(Duration::from_secs(1))));
        let limiter = TenantLimiter::shared(0, buckets.clone());
        assert!(limiter.admit("a").await.is_ok());
        assert!(buckets.asked.lock().unwrap().is_empty());
    }
}
