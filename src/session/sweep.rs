//! The background sweeps' clock: each sweep (approval and confirmation
//! expiry, the tree sweep, workspace retention, pruning) runs one pass at a
//! time, at a steady period, for as long as the `Application` keeps its task.

use std::future::Future;
use std::time::Duration;

/// Runs `pass` every `period` until the task is dropped. A pass that runs
/// long delays the next tick instead of bunching the missed ones up.
pub async fn every<F, Fut>(period: Duration, mut pass: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        pass().await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;

    use super::*;

    #[tokio::test]
    async fn a_sweep_runs_again_and_again_at_its_period() {
        let passes = Arc::new(AtomicUsize::new(0));
        let counted = passes.clone();
        let started = Instant::now();
        let task = tokio::spawn(every(Duration::from_millis(20), move || {
            let counted = counted.clone();
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
            }
        }));
        let deadline = started + Duration::from_secs(5);
        while passes.load(Ordering::SeqCst) < 3 {
            assert!(Instant::now() < deadline, "three passes within 5 s");
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        task.abort();
        // The first pass runs at once, the next ones a period apart.
        assert!(started.elapsed() >= Duration::from_millis(40));
    }
}
