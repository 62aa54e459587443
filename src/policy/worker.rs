//! What a step run by workers does next, from where its task stands: wait,
//! take the outcome, offer the task again after a lapsed lease or a failed
//! attempt, fail the step once its attempts are spent, pause the session
//! when no worker claims the task in time, or give the step up for a pause.

/// Where a task stands.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskState {
    /// Offered; no worker holds it.
    Pending,
    /// A worker holds it; its lease has this many ms left (negative: lapsed).
    Claimed {
        /// Ms until the lease lapses.
        lease_left_ms: i64,
    },
    /// A worker reported the outcome.
    Completed,
    /// A worker reported an error.
    Failed {
        /// Whether another attempt may succeed.
        retryable: bool,
    },
    /// The step was given up (a stop or pause reached the worker).
    Cancelled,
}

/// The facts the decision is made from.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskFacts {
    /// The task's state.
    pub state: TaskState,
    /// Its attempt (1-based).
    pub attempt: u32,
    /// Most attempts a step gets.
    pub max_attempts: u32,
    /// Ms since it was (last) offered.
    pub offered_ms_ago: i64,
    /// Ms a task may wait for a claim before the session pauses.
    pub worker_wait_timeout_ms: u64,
    /// A pause of the session was asked for.
    pub pause_requested: bool,
}

/// What the waiting step does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskVerdict {
    /// Wait, at most this many ms before looking again.
    Wait {
        /// Ms until something is due.
        at_most_ms: u64,
    },
    /// Take the reported outcome.
    Collect,
    /// Offer the task again as this attempt.
    Reoffer {
        /// The next attempt.
        attempt: u32,
        /// Why the last attempt ended.
        because: AttemptEnd,
    },
    /// The step fails (its last error stands).
    Fail {
        /// Why the last attempt ended.
        because: AttemptEnd,
    },
    /// Nobody claimed the task in time: the session pauses (`no_worker`).
    NoWorker,
    /// The step is given up for a pause of the session.
    Abandon,
}

/// Why an attempt ended without an outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptEnd {
    /// No heartbeat within the lease.
    LeaseLapsed,
    /// The worker reported an error.
    Failed,
}

/// The queue names [`valid_queue`] accepts, as the API document states them.
pub const QUEUE_PATTERN: &str = "^[A-Za-z0-9._-]{1,64}$";

/// Whether a queue name is acceptable: 1 to 64 letters, digits, `-`, `_` or `.`.
pub fn valid_queue(queue: &str) -> bool {
    (1..=64).contains(&queue.len())
        && queue
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Whether a lease with `lease_left_ms` left has lapsed.
pub fn lease_lapsed(lease_left_ms: i64) -> bool {
    lease_left_ms <= 0
}

/// Whether a task offered `offered_ms_ago` and not claimed should pause its session.
pub fn no_worker(offered_ms_ago: i64, worker_wait_timeout_ms: u64) -> bool {
    offered_ms_ago >= 0 && offered_ms_ago as u64 >= worker_wait_timeout_ms
}

/// The next attempt, or `None` when the attempts are spent.
pub fn next_attempt(attempt: u32, max_attempts: u32) -> Option<u32> {
    (attempt < max_attempts).then(|| attempt + 1)
}

/// What the waiting step does next.
pub fn decide(facts: &TaskFacts) -> TaskVerdict {
    let retry = |because| match next_attempt(facts.attempt, facts.max_attempts) {
        Some(attempt) => TaskVerdict::Reoffer { attempt, because },
        None => TaskVerdict::Fail { because },
    };
    match facts.state {
        TaskState::Completed => TaskVerdict::Collect,
        TaskState::Cancelled => TaskVerdict::Abandon,
        TaskState::Failed { retryable: true } => retry(AttemptEnd::Failed),
        TaskState::Failed { retryable: false } => TaskVerdict::Fail {
            because: AttemptEnd::Failed,
        },
        TaskState::Claimed { lease_left_ms } if lease_lapsed(lease_left_ms) => {
            retry(AttemptEnd::LeaseLapsed)
        }
        TaskState::Claimed { lease_left_ms } => TaskVerdict::Wait {
            at_most_ms: lease_left_ms as u64,
        },
        // A pause asked for while nobody works on the step takes effect now.
        TaskState::Pending if facts.pause_requested => TaskVerdict::Abandon,
        TaskState::Pending if no_worker(facts.offered_ms_ago, facts.worker_wait_timeout_ms) => {
            TaskVerdict::NoWorker
        }
        TaskState::Pending => TaskVerdict::Wait {
            at_most_ms: facts
                .worker_wait_timeout_ms
                .saturating_sub(facts.offered_ms_ago.max(0) as u64),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(state: TaskState) -> TaskFacts {
        TaskFacts {
            state,
            attempt: 1,
            max_attempts: 3,
            offered_ms_ago: 100,
            worker_wait_timeout_ms: 1_000,
            pause_requested: false,
        }
    }

    #[test]
    fn queue_names_are_short_and_plain() {
        for ok in ["research", "a", "gpu.a100-x_1", &"q".repeat(64)] {
            assert!(valid_queue(ok), "{ok}");
        }
        for bad in ["", "has space", "ü", "a/b", &"q".repeat(65)] {
            assert!(!valid_queue(bad), "{bad}");
        }
    }

    #[test]
    fn a_lease_lapses_at_its_end() {
        assert!(!lease_lapsed(1));
        assert!(lease_lapsed(0));
        assert!(lease_lapsed(-5));
    }

    #[test]
    fn attempts_run_out_at_the_maximum() {
        assert_eq!(next_attempt(1, 3), Some(2));
        assert_eq!(next_attempt(2, 3), Some(3));
        assert_eq!(next_attempt(3, 3), None);
        assert_eq!(next_attempt(1, 1), None);
    }

    #[test]
    fn no_worker_after_the_wait_timeout_only() {
        assert!(!no_worker(999, 1_000));
        assert!(no_worker(1_000, 1_000));
        assert!(no_worker(5_000, 1_000));
        // A clock that ran backwards never pauses.
        assert!(!no_worker(-1, 0));
    }

    #[test]
    fn an_outcome_is_collected_and_a_cancel_abandons() {
        assert_eq!(decide(&facts(TaskState::Completed)), TaskVerdict::Collect);
        assert_eq!(decide(&facts(TaskState::Cancelled)), TaskVerdict::Abandon);
    }

    #[test]
    fn a_lapsed_lease_is_offered_again_until_the_attempts_are_spent() {
        let lapsed = TaskState::Claimed { lease_left_ms: -1 };
        assert_eq!(
            decide(&facts(lapsed.clone())),
            TaskVerdict::Reoffer {
                attempt: 2,
                because: AttemptEnd::LeaseLapsed
            }
        );
        let last = TaskFacts {
            attempt: 3,
            ..facts(lapsed)
        };
        assert_eq!(
            decide(&last),
            TaskVerdict::Fail {
                because: AttemptEnd::LeaseLapsed
            }
        );
    }

    #[test]
    fn a_held_lease_waits_until_its_end() {
        assert_eq!(
            decide(&facts(TaskState::Claimed { lease_left_ms: 250 })),
            TaskVerdict::Wait { at_most_ms: 250 }
        );
        // A claimed task never pauses for lack of a worker, however old.
        let old = TaskFacts {
            offered_ms_ago: 60_000,
            pause_requested: true,
            ..facts(TaskState::Claimed { lease_left_ms: 10 })
        };
        assert_eq!(decide(&old), TaskVerdict::Wait { at_most_ms: 10 });
    }

    #[test]
    fn failures_retry_only_when_retryable_and_attempts_remain() {
        assert_eq!(
            decide(&facts(TaskState::Failed { retryable: true })),
            TaskVerdict::Reoffer {
                attempt: 2,
                because: AttemptEnd::Failed
            }
        );
        assert_eq!(
            decide(&facts(TaskState::Failed { retryable: false })),
            TaskVerdict::Fail {
                because: AttemptEnd::Failed
            }
        );
        let spent = TaskFacts {
            attempt: 3,
            ..facts(TaskState::Failed { retryable: true })
        };
        assert_eq!(
            decide(&spent),
            TaskVerdict::Fail {
                because: AttemptEnd::Failed
            }
        );
    }

    #[test]
    fn an_unclaimed_task_waits_then_pauses_for_no_worker_or_for_a_pause() {
        assert_eq!(
            decide(&facts(TaskState::Pending)),
            TaskVerdict::Wait { at_most_ms: 900 }
        );
        let late = TaskFacts {
            offered_ms_ago: 1_000,
            ..facts(TaskState::Pending)
        };
        assert_eq!(decide(&late), TaskVerdict::NoWorker);
        let paused = TaskFacts {
            pause_requested: true,
            ..facts(TaskState::Pending)
        };
        assert_eq!(decide(&paused), TaskVerdict::Abandon);
    }
}
