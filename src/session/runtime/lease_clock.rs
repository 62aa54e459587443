//! How long this replica may trust a lease, by its own monotonic clock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The instant until which a lease is trusted: renewal start + TTL − margin.
#[derive(Debug)]
pub struct LeaseClock {
    epoch: Instant,
    valid_until_ms: AtomicU64,
}

impl LeaseClock {
    /// A lease acquired at `acquired` (before the acquiring query was sent).
    pub fn new(acquired: Instant, ttl: Duration, margin: Duration) -> LeaseClock {
        let clock = LeaseClock {
            epoch: acquired,
            valid_until_ms: AtomicU64::new(0),
        };
        clock.renewed(acquired, ttl, margin);
        clock
    }

    /// Records a renewal whose query was sent at `renewal_started`.
    pub fn renewed(&self, renewal_started: Instant, ttl: Duration, margin: Duration) {
        let since_epoch = renewal_started.saturating_duration_since(self.epoch);
        let until = since_epoch + ttl.saturating_sub(margin);
        self.valid_until_ms
            .fetch_max(until.as_millis() as u64, Ordering::SeqCst);
    }

    /// Whether the lease may still be trusted now.
    pub fn is_valid(&self) -> bool {
        self.is_valid_at(Instant::now())
    }

    /// Whether the lease may be trusted at `now`.
    pub fn is_valid_at(&self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.epoch).as_millis() as u64;
        elapsed < self.valid_until_ms.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trusted_until_ttl_minus_margin() {
        let t0 = Instant::now();
        let c = LeaseClock::new(t0, Duration::from_secs(10), Duration::from_secs(2));
        assert!(c.is_valid_at(t0 + Duration::from_millis(7_999)));
        assert!(!c.is_valid_at(t0 + Duration::from_secs(8)));
        c.renewed(
            t0 + Duration::from_secs(5),
            Duration::from_secs(10),
            Duration::from_secs(2),
        );
        assert!(c.is_valid_at(t0 + Duration::from_secs(12)));
        assert!(!c.is_valid_at(t0 + Duration::from_secs(13)));
    }

    #[test]
    fn an_older_renewal_never_shortens_the_lease() {
        let t0 = Instant::now();
        let c = LeaseClock::new(
            t0 + Duration::from_secs(5),
            Duration::from_secs(10),
            Duration::ZERO,
        );
        c.renewed(t0, Duration::from_secs(10), Duration::ZERO);
        assert!(c.is_valid_at(t0 + Duration::from_secs(14)));
    }
}
