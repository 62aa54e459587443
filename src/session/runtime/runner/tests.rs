//! The loop driven end to end against [`LoopStore`] in memory: what it
//! writes, in which order, and how it ends.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::AtomicUsize;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::Value;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use chrono::Utc;
use uuid::Uuid;

use super::TreeRole;
use super::*;
use crate::event::SessionEvent;
use crate::executor::{ExecutorError, StepContext, StepOutput, StepResult};
use crate::policy::guardrails::Limits;
use crate::policy::lifecycle::{Mode, Status};
use crate::policy::termination::Termination;
use crate::session::runtime::loop_store::ReflectionCommit;
use crate::store::{Counters, NewEvent, NewIteration};

/// What the loop wrote, in order.
#[derive(Default)]
struct Written {
    events: Vec<NewEvent>,
    commits: Vec<NewIteration>,
    checkpoints: Vec<(i64, String)>,
    finished: Option<Termination>,
    released: bool,
    fail_commits: bool,
    /// What the tree grants a step (`None`: its own allowance).
    tree_grants: Option<u64>,
    /// Allowances asked of the tree.
    reserved: Vec<u64>,
}

/// The loop's storage, in memory.
#[derive(Clone)]
struct FakeStore {
    written: Arc<Mutex<Written>>,
    settings: SessionSettings,
}

impl FakeStore {
    fn new(settings: SessionSettings) -> FakeStore {
        FakeStore {
            written: Arc::default(),
            settings,
        }
    }

    fn written(&self) -> std::sync::MutexGuard<'_, Written> {
        self.written.lock().unwrap()
    }

    fn flags(&self) -> ControlFlags {
        ControlFlags {
            stop_requested: false,
            pause_requested: false,
            settings: self.settings,
            last_event_seq: 0,
            updated_at: Utc::now(),
        }
    }

    fn kinds(&self) -> Vec<&'static str> {
        self.written().events.iter().map(|e| e.kind).collect()
    }
}

impl LoopStore for FakeStore {
    async fn reserve_step(&self, _lease: &Lease, own_allowance: u64) -> Result<u64, StoreError> {
        let mut written = self.written();
        written.reserved.push(own_allowance);
        Ok(written
            .tree_grants
            .map_or(own_allowance, |g| g.min(own_allowance)))
    }

    async fn append_fenced(
        &self,
        _lease: &Lease,
        events: &[NewEvent],
    ) -> Result<ControlFlags, StoreError> {
        self.written().events.extend_from_slice(events);
        Ok(self.flags())
    }

    async fn commit_iteration(
        &self,
        lease: &Lease,
        iteration: NewIteration,
        _counters: Counters,
        _progress: (Option<f64>, Option<f64>),
        events: Vec<NewEvent>,
        _stop: &tokio_util::sync::CancellationToken,
    ) -> Result<ControlFlags, StoreError> {
        let mut written = self.written();
        if written.fail_commits {
            return Err(StoreError::LeaseLost(lease.session_id));
        }
        if iteration.checkpoint.is_some() {
            written
                .checkpoints
                .push((iteration.number, "interval".to_string()));
        }
        written.commits.push(iteration);
        written.events.extend(events);
        Ok(self.flags())
    }

    async fn insert_reflection(
        &self,
        _lease: &Lease,
        _reflection: ReflectionCommit<'_>,
    ) -> Result<(), StoreError> {
        Ok(())
    }

    async fn save_checkpoint(
        &self,
        _lease: &Lease,
        iteration: i64,
        reason: &str,
        state: &Value,
    ) -> Result<(), StoreError> {
        assert!(state.is_object(), "a checkpoint is never null");
        self.written()
            .checkpoints
            .push((iteration, reason.to_string()));
        Ok(())
    }

    async fn finish(
        &self,
        _lease: &Lease,
        termination: &Termination,
        _detail: Option<&str>,
        _counters: Counters,
        _checkpoint: (i64, &Value),
        events: &[NewEvent],
    ) -> Result<(), StoreError> {
        let mut written = self.written();
        written.finished = Some(termination.clone());
        written.events.extend_from_slice(events);
        Ok(())
    }

    async fn release(
        &self,
        _lease: &Lease,
        _counters: Counters,
        _checkpoint: (i64, &Value),
        _events: &[NewEvent],
    ) -> Result<(), StoreError> {
        self.written().released = true;
        Ok(())
    }

    async fn child_reports(
        &self,
        _lease: &Lease,
        _iteration: u64,
    ) -> Result<(Vec<crate::policy::delegation::ChildReport>, u64), StoreError> {
        Ok((Vec::new(), 0))
    }
}

/// Succeeds with a new action every step and counts its calls.
struct Counting(Arc<AtomicUsize>);

impl Executor for Counting {
    fn execute<'a>(
        &'a mut self,
        ctx: StepContext<'a>,
    ) -> BoxFuture<'a, Result<StepResult, ExecutorError>> {
        self.0.fetch_add(1, Ordering::SeqCst);
        // A new action, message and file every step, so stuck detection stays quiet.
        let out = StepOutput {
            tokens: 10,
            files_written: vec![crate::policy::history::FileWrite {
                path: format!("part_{}.md", ctx.iteration),
                digest: format!("{:x}", ctx.iteration),
            }],
            ..StepOutput::simple(
                format!("action_{}", ctx.iteration),
                format!("wrote part {}", ctx.iteration),
            )
        };
        async move { Ok(StepResult::Step(Box::new(out))) }.boxed()
    }
}

fn limits(max_iterations: u64, checkpoint_interval: u32) -> Limits {
    Limits {
        max_iterations,
        max_wall_time_ms: 600_000,
        max_tokens: 1_000_000,
        max_consecutive_errors: 3,
        reflection_interval: 100,
        reflection_adaptive: false,
        checkpoint_interval,
        max_tool_calls: None,
        max_cycles: 10,
        context_budget_tokens: 32_000,
        review_every: None,
        // No soft budgets: these tests count the events a step logs (the
        // warnings are the plan's, tested there).
        warn_at: crate::policy::soft_budget::WarnAt::NONE,
        max_cost_usd: None,
    }
}

fn config() -> Arc<Config> {
    let vars = HashMap::from([(
        "DATABASE_URL".to_string(),
        "postgres://localhost/unused".to_string(),
    )]);
    Arc::new(Config::from_vars(&vars).unwrap())
}

/// A runner over the fake store, with the executor's call counter.
fn runner(limits: Limits) -> (Runner<FakeStore>, FakeStore, Arc<AtomicUsize>) {
    let settings = SessionSettings {
        mode: Mode::Fixed,
        limits,
    };
    let store = FakeStore::new(settings);
    let calls = Arc::new(AtomicUsize::new(0));
    let clock = Arc::new(LeaseClock::new(
        Instant::now(),
        Duration::from_secs(600),
        Duration::from_secs(1),
    ));
    let runner = Runner::new(RunnerDeps {
        store: store.clone(),
        config: config(),
        lease: Lease {
            session_id: Uuid::new_v4(),
            token: Uuid::new_v4(),
        },
        goal: "write the report".into(),
        settings,
        executor: Box::new(Counting(calls.clone())),
        state: LoopState::new(limits.reflection_interval),
        guidance: None,
        control: Control::new(clock),
        reflector: None,
        tenant: "t".into(),
        model_calls: Arc::new(crate::ratelimit::TenantLimiter::new(0)),
        metrics: Arc::new(Metrics::default()),
        view: Arc::default(),
        has_children: Arc::default(),
        tree: TreeRole::default(),
    });
    (runner, store, calls)
}

fn last_status(store: &FakeStore) -> SessionEvent {
    let written = store.written();
    let last = written.events.last().expect("the run logged its end");
    SessionEvent::from_parts(last.kind, &last.data.to_value().unwrap()).unwrap()
}

#[tokio::test]
async fn a_stop_requested_before_a_step_is_honoured_before_executing() {
    let (runner, store, calls) = runner(limits(10, 5));
    runner.control.stop.cancel();
    assert_eq!(runner.run().await, Exit::Finished(Reason::UserStop));
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert!(store.written().commits.is_empty());
    assert!(matches!(
        last_status(&store),
        SessionEvent::StatusChanged {
            reason: Some(Reason::UserStop),
            ..
        }
    ));
}

#[tokio::test]
async fn a_shutdown_releases_without_finishing() {
    let (runner, store, calls) = runner(limits(10, 5));
    runner.control.shutdown.cancel();
    assert_eq!(runner.run().await, Exit::Released);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert!(store.written().released);
    assert!(store.written().finished.is_none());
}

#[tokio::test]
async fn a_guardrail_trip_ends_the_run_with_its_reason() {
    let (runner, store, calls) = runner(limits(3, 100));
    assert_eq!(runner.run().await, Exit::Finished(Reason::MaxIterations));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(store.written().commits.len(), 3);
    let kinds = store.kinds();
    assert_eq!(
        kinds[kinds.len() - 2..],
        ["guardrail_tripped", "status_changed"]
    );
    assert_eq!(
        store.written().finished.as_ref().map(|t| t.reason),
        Some(Reason::MaxIterations)
    );
}

#[tokio::test]
async fn every_commit_logs_the_gate_decision_and_the_step() {
    let (runner, store, _) = runner(limits(2, 100));
    runner.run().await;
    let kinds = store.kinds();
    assert_eq!(
        kinds[..4],
        [
            "gate_decision",
            "iteration_completed",
            "gate_decision",
            "iteration_completed"
        ]
    );
    let written = store.written();
    let first = &written.commits[0];
    assert_eq!((first.number, first.action.as_str()), (1, "action_1"));
    assert!(first.record.to_value().unwrap().is_object());
    assert!(first.effects.to_value().unwrap().is_object());
}

#[tokio::test]
async fn a_failed_commit_ends_the_loop_instead_of_being_swallowed() {
    let (runner, store, calls) = runner(limits(10, 100));
    store.written().fail_commits = true;
    assert_eq!(runner.run().await, Exit::LeaseLost);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(store.written().finished.is_none());
}

#[tokio::test]
async fn a_checkpoint_is_saved_every_interval_in_the_iterations_own_commit() {
    let (runner, store, _) = runner(limits(5, 2));
    assert_eq!(runner.run().await, Exit::Finished(Reason::MaxIterations));
    let written = store.written();
    assert_eq!(
        written.checkpoints,
        [(2, "interval".to_string()), (4, "interval".to_string())]
    );
    // Folded: carried by iterations 2 and 4, with their event in the same commit.
    let folded: Vec<i64> = written
        .commits
        .iter()
        .filter(|c| c.checkpoint.is_some())
        .map(|c| c.number)
        .collect();
    assert_eq!(folded, [2, 4]);
    let saved = written
        .events
        .iter()
        .filter(|e| e.kind == "checkpoint_saved")
        .count();
    assert_eq!(saved, 2);
}

#[tokio::test]
async fn a_pause_finishes_after_the_step_in_flight() {
    let (mut runner, store, calls) = runner(limits(10, 100));
    runner.control.pause.store(true, Ordering::SeqCst);
    assert_eq!(
        runner.run_loop().await.unwrap(),
        Exit::Finished(Reason::UserPause)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(
        store.written().finished.as_ref().map(|t| t.status),
        Some(Status::Paused)
    );
}

#[tokio::test]
async fn a_session_alone_reserves_nothing_and_a_child_reserves_each_step() {
    let (alone, store, calls) = runner(limits(2, 100));
    alone.run().await;
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert!(store.written().reserved.is_empty());

    let (mut runner, store, calls) = runner(limits(2, 100));
    runner.tree.is_child = true;
    runner.run().await;
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(store.written().reserved.len(), 2);
}

#[tokio::test]
async fn a_child_whose_tree_has_nothing_left_ends_before_its_step() {
    let (mut runner, store, calls) = runner(limits(5, 100));
    runner.tree.is_child = true;
    store.written().tree_grants = Some(0);
    assert_eq!(runner.run().await, Exit::Finished(Reason::CostLimit));
    assert_eq!(calls.load(Ordering::SeqCst), 0, "no step started");
    let finished = store.written().finished.clone().expect("ended");
    assert_eq!(finished.status, Status::Stopped);
}

#[tokio::test]
async fn a_child_of_a_fail_child_tree_fails_where_it_would_pause_for_a_person() {
    let (mut paused, store, _) = runner(limits(5, 100));
    paused.tree = TreeRole {
        is_child: true,
        on_child_pause: crate::policy::delegation::ChildPausePolicy::FailChild,
    };
    paused.control.pause.store(true, Ordering::SeqCst);
    // A user's pause is not a pause for a person: it pauses.
    assert_eq!(paused.run().await, Exit::Finished(Reason::UserPause));
    assert_eq!(
        store.written().finished.as_ref().map(|t| t.status),
        Some(Status::Paused)
    );
    let (mut runner, store, _) = runner(limits(5, 100));
    runner.tree = TreeRole {
        is_child: true,
        on_child_pause: crate::policy::delegation::ChildPausePolicy::FailChild,
    };
    runner.state.pending_end = Some(crate::policy::loop_state::PendingEnd {
        reason: Reason::AskUser,
        detail: Some("which design?".into()),
        review_pending: false,
    });
    assert_eq!(runner.run().await, Exit::Finished(Reason::AskUser));
    let finished = store.written().finished.clone().expect("ended");
    assert_eq!(finished.status, Status::Failed);
    assert!(
        finished.summary.contains("fail_child"),
        "{}",
        finished.summary
    );
}

#[test]
fn a_run_s_exit_reads_as_status_and_reason() {
    use crate::policy::lifecycle::Reason;
    assert_eq!(
        Exit::Finished(Reason::GoalAchieved).labels(),
        ("completed", "goal_achieved")
    );
    assert_eq!(
        Exit::Finished(Reason::AskUser).labels(),
        ("paused", "ask_user")
    );
    assert_eq!(Exit::Released.labels(), ("released", "shutdown"));
    assert_eq!(Exit::LeaseLost.labels(), ("released", "lease_lost"));
    assert_eq!(
        Exit::StoreFailed("x".into()).labels(),
        ("released", "store_error")
    );
}
