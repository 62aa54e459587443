//! What a step run by workers does next, from where its task stands: wait,
//! take the outcome, offer the task again after a lapsed lease or a failed
//! attempt, fail the step once its attempts are spent, pause the session
//! when no worker claims the task in time, or give the step up for a pause.

/// A worker task's stored state (the `worker_tasks.state` column). A name
/// the column does not know is refused when read, never guessed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerTaskState {
    /// Offered; no worker holds it.
    Pending,
    /// A worker holds it under a lease.
    Claimed,
    /// A worker reported the outcome.
    Completed,
    /// A worker reported an error (or its attempts are spent).
    Failed,
    /// The step was given up.
    Cancelled,
}

impl WorkerTaskState {
    /// Every state, in the column's order.
    pub const ALL: [WorkerTaskState; 5] = [
        WorkerTaskState::Pending,
        WorkerTaskState::Claimed,
        WorkerTaskState::Completed,
        WorkerTaskState::Failed,
        WorkerTaskState::Cancelled,
    ];

    /// Its stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerTaskState::Pending => "pending",
            WorkerTaskState::Claimed => "claimed",
            WorkerTaskState::Completed => "completed",
            WorkerTaskState::Failed => "failed",
            WorkerTaskState::Cancelled => "cancelled",
        }
    }

    /// The state stored as `name`, if it is one.
    pub fn parse(name: &str) -> Option<WorkerTaskState> {
        WorkerTaskState::ALL
            .into_iter()
            .find(|s| s.as_str() == name)
    }
}

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

/// Whether a worker advertising `worker` labels may take a task whose
/// session asked for `task` labels: it has every one of them, with the same
/// value (as CI runners match `runs-on`). A task without labels goes to
/// any worker. The claim's SQL decides the same with jsonb containment
/// (`t.labels <@ worker`); this is its specification, tested.
pub fn worker_has_labels(
    task: &std::collections::BTreeMap<String, String>,
    worker: &std::collections::BTreeMap<String, String>,
) -> bool {
    task.iter().all(|(k, v)| worker.get(k) == Some(v))
}

/// What a claim waiting on this replica takes: tasks of its tenant (any,
/// for a global caller), on its queues (any, when it names none), whose
/// labels its worker has.
#[derive(Debug, Clone, Copy)]
pub struct ClaimWants<'a> {
    /// The caller's tenant; `None`: every tenant's.
    pub tenant: Option<&'a str>,
    /// The queues it takes from; `None`: every queue.
    pub queues: Option<&'a [String]>,
    /// The worker's labels.
    pub labels: &'a std::collections::BTreeMap<String, String>,
}

/// A step being offered, as a waiting claim is matched against it.
#[derive(Debug, Clone, Copy)]
pub struct OfferFacts<'a> {
    /// The session's tenant.
    pub tenant: &'a str,
    /// The queue it goes on.
    pub queue: &'a str,
    /// The labels its session asked for.
    pub labels: &'a std::collections::BTreeMap<String, String>,
}

/// Whether a waiting claim may be handed the offer: the same rule the
/// claim's SQL applies to stored tasks (tenant, queue, labels), so a task
/// handed over in memory is one the claim could have read from the queue.
pub fn claim_takes(claim: &ClaimWants<'_>, offer: &OfferFacts<'_>) -> bool {
    claim.tenant.is_none_or(|t| t == offer.tenant)
        && claim
            .queues
            .is_none_or(|qs| qs.iter().any(|q| q == offer.queue))
        && worker_has_labels(offer.labels, claim.labels)
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

/// Why a heartbeat tells a worker its step is no longer what it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BeatReason {
    /// The session was stopped or ended (a stop, its time limit): abandon.
    Stopped,
    /// The session pauses: abandon; a resume offers the step again.
    Paused,
    /// The step was offered again as a newer task: abandon; it comes back
    /// with the same idempotency key.
    Superseded,
    /// The replica running the session drains: finish and complete; the
    /// run that takes the session over collects the outcome.
    Draining,
    /// No heartbeat within the lease: abandon; the step is offered again as
    /// the next attempt.
    LeaseLost,
}

impl BeatReason {
    /// Every reason, as the protocol document lists them.
    pub const ALL: [BeatReason; 5] = [
        BeatReason::Stopped,
        BeatReason::Paused,
        BeatReason::Superseded,
        BeatReason::Draining,
        BeatReason::LeaseLost,
    ];

    /// Its name on the wire (and in `worker_tasks.cancel_reason`).
    pub fn as_str(self) -> &'static str {
        match self {
            BeatReason::Stopped => "stopped",
            BeatReason::Paused => "paused",
            BeatReason::Superseded => "superseded",
            BeatReason::Draining => "draining",
            BeatReason::LeaseLost => "lease_lost",
        }
    }

    /// The reason a task was cancelled with, as stored; a stored reason
    /// that is none of them (or none) reads as `stopped`.
    pub fn from_stored(stored: Option<&str>) -> BeatReason {
        BeatReason::ALL
            .into_iter()
            .find(|r| Some(r.as_str()) == stored)
            .unwrap_or(BeatReason::Stopped)
    }

    /// Whether the worker is to abandon the step (else: finish and complete).
    pub fn abandon(self) -> bool {
        self != BeatReason::Draining
    }
}

/// What a heartbeat is answered from: the task, and its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BeatFacts<'a> {
    /// The task's state.
    pub state: WorkerTaskState,
    /// Its stored reason (why cancelled; `draining` on a claimed task).
    pub cancel_reason: Option<&'a str>,
    /// Its lease has not lapsed.
    pub lease_live: bool,
    /// The session's status.
    pub status: &'a str,
    /// A stop of the session was asked for.
    pub stop_requested: bool,
    /// A pause of the session was asked for.
    pub pause_requested: bool,
}

/// What a heartbeat (of the token that holds the task) answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BeatVerdict {
    /// The task is done with (completed, failed, offered again): 409.
    Lost,
    /// `cancel: true` with this reason; `end_task`: the task, still
    /// claimed, is cancelled now so the waiting step ends at once.
    Cancel {
        /// Why.
        reason: BeatReason,
        /// Cancel the task now.
        end_task: bool,
    },
    /// The lease is extended; `note` is said along (`draining`).
    Extend {
        /// A reason that does not cancel.
        note: Option<BeatReason>,
    },
}

/// What a heartbeat answers: a stop or a pause cancels at once, a lapsed
/// lease is lost, a drain is said but the step goes on.
pub fn heartbeat(facts: &BeatFacts<'_>) -> BeatVerdict {
    let cancel = |reason, end_task| BeatVerdict::Cancel { reason, end_task };
    match facts.state {
        WorkerTaskState::Cancelled => cancel(BeatReason::from_stored(facts.cancel_reason), false),
        WorkerTaskState::Claimed if !facts.lease_live => cancel(BeatReason::LeaseLost, false),
        WorkerTaskState::Claimed
            if facts.stop_requested || !matches!(facts.status, "running" | "paused") =>
        {
            cancel(BeatReason::Stopped, true)
        }
        WorkerTaskState::Claimed if facts.pause_requested || facts.status == "paused" => {
            cancel(BeatReason::Paused, true)
        }
        WorkerTaskState::Claimed => BeatVerdict::Extend {
            note: (facts.cancel_reason == Some(BeatReason::Draining.as_str()))
                .then_some(BeatReason::Draining),
        },
        WorkerTaskState::Pending | WorkerTaskState::Completed | WorkerTaskState::Failed => {
            BeatVerdict::Lost
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiting_claim_takes_only_offers_its_sql_would_read() {
        let labels = |pairs: &[(&str, &str)]| -> std::collections::BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let gpu = labels(&[("gpu", "a100")]);
        let none = labels(&[]);
        let worker = labels(&[("gpu", "a100"), ("os", "linux")]);
        let queues = vec!["build".to_string(), "test".to_string()];
        let claim = ClaimWants {
            tenant: Some("acme"),
            queues: Some(&queues),
            labels: &worker,
        };
        let offer = |tenant, queue, labels| OfferFacts {
            tenant,
            queue,
            labels,
        };
        assert!(claim_takes(&claim, &offer("acme", "build", &gpu)));
        assert!(claim_takes(&claim, &offer("acme", "test", &none)));
        // Another tenant's, another queue's, labels the worker lacks: never.
        assert!(!claim_takes(&claim, &offer("other", "build", &gpu)));
        assert!(!claim_takes(&claim, &offer("acme", "deploy", &gpu)));
        let tpu = labels(&[("gpu", "tpu")]);
        assert!(!claim_takes(&claim, &offer("acme", "build", &tpu)));
        // A worker without labels takes only offers without labels.
        let bare = ClaimWants {
            labels: &none,
            ..claim
        };
        assert!(!claim_takes(&bare, &offer("acme", "build", &gpu)));
        assert!(claim_takes(&bare, &offer("acme", "build", &none)));
        // A global caller naming no queue takes any tenant's, any queue's.
        let global = ClaimWants {
            tenant: None,
            queues: None,
            labels: &worker,
        };
        assert!(claim_takes(&global, &offer("other", "deploy", &gpu)));
        // Naming no queue is not naming an empty list: an empty list takes none.
        let empty: Vec<String> = Vec::new();
        let nowhere = ClaimWants {
            queues: Some(&empty),
            ..global
        };
        assert!(!claim_takes(&nowhere, &offer("acme", "build", &none)));
    }

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

    fn beat(state: WorkerTaskState) -> BeatFacts<'static> {
        BeatFacts {
            state,
            cancel_reason: None,
            lease_live: true,
            status: "running",
            stop_requested: false,
            pause_requested: false,
        }
    }

    #[test]
    fn every_reason_has_one_name_and_reads_back() {
        let names: Vec<&str> = BeatReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(
            names,
            ["stopped", "paused", "superseded", "draining", "lease_lost"]
        );
        for reason in BeatReason::ALL {
            assert_eq!(BeatReason::from_stored(Some(reason.as_str())), reason);
            assert_eq!(reason.abandon(), reason != BeatReason::Draining);
        }
        assert_eq!(BeatReason::from_stored(None), BeatReason::Stopped);
        assert_eq!(
            BeatReason::from_stored(Some("no_worker")),
            BeatReason::Stopped
        );
    }

    #[test]
    fn a_held_lease_is_extended_and_a_drain_is_said_along() {
        assert_eq!(
            heartbeat(&beat(WorkerTaskState::Claimed)),
            BeatVerdict::Extend { note: None }
        );
        let draining = BeatFacts {
            cancel_reason: Some("draining"),
            ..beat(WorkerTaskState::Claimed)
        };
        assert_eq!(
            heartbeat(&draining),
            BeatVerdict::Extend {
                note: Some(BeatReason::Draining)
            }
        );
    }

    #[test]
    fn a_stop_or_an_end_cancels_before_a_pause() {
        let cancel = |reason| BeatVerdict::Cancel {
            reason,
            end_task: true,
        };
        let stop = BeatFacts {
            stop_requested: true,
            pause_requested: true,
            cancel_reason: Some("draining"),
            ..beat(WorkerTaskState::Claimed)
        };
        assert_eq!(heartbeat(&stop), cancel(BeatReason::Stopped));
        for ended in ["completed", "failed", "interrupted", "queued"] {
            let facts = BeatFacts {
                status: ended,
                ..beat(WorkerTaskState::Claimed)
            };
            assert_eq!(heartbeat(&facts), cancel(BeatReason::Stopped), "{ended}");
        }
        let pause = BeatFacts {
            pause_requested: true,
            ..beat(WorkerTaskState::Claimed)
        };
        assert_eq!(heartbeat(&pause), cancel(BeatReason::Paused));
        let paused = BeatFacts {
            status: "paused",
            ..beat(WorkerTaskState::Claimed)
        };
        assert_eq!(heartbeat(&paused), cancel(BeatReason::Paused));
    }

    #[test]
    fn a_lapsed_lease_is_lost_whatever_the_session_does() {
        let lapsed = BeatFacts {
            lease_live: false,
            stop_requested: true,
            ..beat(WorkerTaskState::Claimed)
        };
        assert_eq!(
            heartbeat(&lapsed),
            BeatVerdict::Cancel {
                reason: BeatReason::LeaseLost,
                end_task: false
            }
        );
    }

    #[test]
    fn a_cancelled_task_says_why_and_a_settled_one_is_lost() {
        for reason in BeatReason::ALL {
            let facts = BeatFacts {
                cancel_reason: Some(reason.as_str()),
                ..beat(WorkerTaskState::Cancelled)
            };
            assert_eq!(
                heartbeat(&facts),
                BeatVerdict::Cancel {
                    reason,
                    end_task: false
                }
            );
        }
        for settled in [
            WorkerTaskState::Pending,
            WorkerTaskState::Completed,
            WorkerTaskState::Failed,
        ] {
            assert_eq!(heartbeat(&beat(settled)), BeatVerdict::Lost, "{settled:?}");
        }
    }

    #[test]
    fn every_task_state_has_one_name_and_reads_back() {
        let names: Vec<&str> = WorkerTaskState::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            names,
            ["pending", "claimed", "completed", "failed", "cancelled"]
        );
        for state in WorkerTaskState::ALL {
            assert_eq!(WorkerTaskState::parse(state.as_str()), Some(state));
        }
        assert_eq!(WorkerTaskState::parse("Cancelled"), None);
        assert_eq!(
            WorkerTaskState::parse("lost"),
            None,
            "an unknown name is refused"
        );
    }

    #[test]
    fn a_task_goes_only_to_a_worker_with_all_its_labels() {
        let set = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        let none = set(&[]);
        let gpu = set(&[("gpu", "a100")]);
        let gpu_linux = set(&[("gpu", "a100"), ("os", "linux")]);
        let other_gpu = set(&[("gpu", "h100"), ("os", "linux")]);
        assert!(worker_has_labels(&none, &none));
        assert!(worker_has_labels(&none, &gpu_linux));
        assert!(worker_has_labels(&gpu, &gpu));
        assert!(worker_has_labels(&gpu, &gpu_linux));
        assert!(!worker_has_labels(&gpu, &none));
        assert!(!worker_has_labels(&gpu, &other_gpu));
        assert!(!worker_has_labels(&gpu_linux, &gpu));
    }
}
