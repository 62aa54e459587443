//! Claims waiting on this replica, handed a step the moment it is offered.
//!
//! Without it every offer woke every waiting claim, and all of them raced
//! for the one new row: with 32 workers long-polling, each step cost some
//! thirty claim transactions that found nothing (BENCHMARKS.md). Here a
//! claim that found nothing waits at the desk; the step that offers next
//! takes the oldest claim that may have it (`policy::worker::claim_takes`),
//! writes its task already claimed for that worker in the offer's own
//! transaction, and hands the claimed task over in memory. Postgres stays
//! the truth: a hand-off is a row like any claim's, and a claim that went
//! away before its answer arrived gets its task offered again.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;
use uuid::Uuid;

use super::worker_tasks::{ClaimedWorkerTask, NewWorkerTask, OpenedTask, WorkerTaskSnapshot};
use super::{Result, Store, TenantScope};
use crate::policy::worker::{ClaimWants, OfferFacts, WorkerTaskState, claim_takes};

/// Claims waiting at one replica's desk at most; past it a claim waits
/// only for change notices, as every claim did before the desk.
const MAX_WAITING: usize = 10_000;

/// What a waiting claim is handed.
#[derive(Debug)]
pub enum Handoff {
    /// A task claimed for it: answer the worker with it.
    Claimed(Box<ClaimedWorkerTask>),
    /// The offer could not be handed over (its session stopped or paused
    /// meanwhile, or it was a task a run before left): claim from the queue.
    Retry,
}

/// The claims waiting on this replica, oldest first, and the steps
/// waiting here for their task's outcome.
#[derive(Debug, Default)]
pub struct WorkerDesk {
    /// Steps handed to a waiting claim since start.
    handed: std::sync::atomic::AtomicU64,
    waiting: Mutex<Waiting>,
    steps: Mutex<std::collections::HashMap<Uuid, oneshot::Sender<serde_json::Value>>>,
}

#[derive(Debug, Default)]
struct Waiting {
    next_ticket: u64,
    claims: VecDeque<DeskClaim>,
}

/// A claim waiting at the desk: what it takes, and where its answer goes.
#[derive(Debug)]
pub struct DeskClaim {
    ticket: u64,
    tenant: Option<String>,
    queues: Option<Vec<String>>,
    labels: BTreeMap<String, String>,
    /// The worker's own name, recorded on the task.
    pub worker: String,
    reply: oneshot::Sender<Handoff>,
}

impl DeskClaim {
    /// Hands the claim its answer; gives it back when the claim is gone
    /// (its request ended), so the caller can offer the task again.
    pub fn answer(self, handoff: Handoff) -> Result<(), Handoff> {
        self.reply.send(handoff)
    }
}

/// A step's task as offered.
#[derive(Debug, Clone)]
pub struct OfferedStep {
    /// The task's id.
    pub id: Uuid,
    /// A new task as a read right after the offer would find it: pending,
    /// or claimed by the waiting claim it was handed to. `None`: read it.
    pub as_opened: Option<WorkerTaskSnapshot>,
}

/// A claim's place at the desk, left when dropped.
#[derive(Debug)]
pub struct ClaimTicket {
    desk: Arc<WorkerDesk>,
    ticket: u64,
    /// Where its hand-off arrives.
    pub handed: oneshot::Receiver<Handoff>,
}

impl ClaimTicket {
    /// Leaves the desk; `false` when an offer took the claim first (its
    /// answer is on its way in [`ClaimTicket::handed`]).
    pub fn withdraw(&self) -> bool {
        self.desk.withdraw(self.ticket)
    }
}

impl Drop for ClaimTicket {
    fn drop(&mut self) {
        self.desk.withdraw(self.ticket);
    }
}

/// A step's place at the desk while it waits for its task's outcome, left
/// when dropped.
#[derive(Debug)]
pub struct OutcomeTicket {
    desk: Arc<WorkerDesk>,
    task: Uuid,
    /// Where an outcome completed on this replica arrives.
    pub outcome: oneshot::Receiver<serde_json::Value>,
}

impl Drop for OutcomeTicket {
    fn drop(&mut self) {
        self.desk.steps().remove(&self.task);
    }
}

impl WorkerDesk {
    /// Seats a claim that found nothing, unless the desk is full.
    pub fn wait(self: &Arc<Self>, wants: &ClaimWants<'_>, worker: &str) -> Option<ClaimTicket> {
        let (reply, handed) = oneshot::channel();
        let mut waiting = self.lock();
        if waiting.claims.len() >= MAX_WAITING {
            return None;
        }
        waiting.next_ticket += 1;
        let ticket = waiting.next_ticket;
        waiting.claims.push_back(DeskClaim {
            ticket,
            tenant: wants.tenant.map(str::to_owned),
            queues: wants.queues.map(<[String]>::to_vec),
            labels: wants.labels.clone(),
            worker: worker.to_owned(),
            reply,
        });
        Some(ClaimTicket {
            desk: Arc::clone(self),
            ticket,
            handed,
        })
    }

    /// Takes the oldest waiting claim that may have `offer`, dropping the
    /// claims met on the way whose request already ended.
    pub fn take(&self, offer: &OfferFacts<'_>) -> Option<DeskClaim> {
        let mut waiting = self.lock();
        waiting.claims.retain(|c| !c.reply.is_closed());
        let at = waiting.claims.iter().position(|c| {
            let wants = ClaimWants {
                tenant: c.tenant.as_deref(),
                queues: c.queues.as_deref(),
                labels: &c.labels,
            };
            claim_takes(&wants, offer)
        })?;
        waiting.claims.remove(at)
    }

    /// Seats the step waiting on `task`: a completion of it on this replica
    /// hands it the outcome, so the step need not read it back.
    pub fn await_outcome(self: &Arc<Self>, task: Uuid) -> OutcomeTicket {
        let (tx, outcome) = oneshot::channel();
        self.steps().insert(task, tx);
        OutcomeTicket {
            desk: Arc::clone(self),
            task,
            outcome,
        }
    }

    /// Hands the outcome of `task`, committed just now, to its step if it
    /// waits here.
    pub fn completed(&self, task: Uuid, outcome: &serde_json::Value) {
        if let Some(step) = self.steps().remove(&task) {
            // A step that stopped waiting has nothing to receive it.
            let _ = step.send(outcome.clone());
        }
    }

    fn steps(
        &self,
    ) -> MutexGuard<'_, std::collections::HashMap<Uuid, oneshot::Sender<serde_json::Value>>> {
        // The map stays whole whatever panicked while holding it.
        self.steps.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a claim wanting exactly `wants` (the same tenant, queues and
    /// labels) waits here.
    pub fn twin_waits(&self, wants: &ClaimWants<'_>) -> bool {
        self.lock().claims.iter().any(|c| {
            c.tenant.as_deref() == wants.tenant
                && c.queues.as_deref() == wants.queues
                && &c.labels == wants.labels
                && !c.reply.is_closed()
        })
    }

    /// Steps handed to a waiting claim since start.
    pub fn handed(&self) -> u64 {
        self.handed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many claims wait here.
    pub fn waiting(&self) -> usize {
        self.lock().claims.len()
    }

    fn withdraw(&self, ticket: u64) -> bool {
        let mut waiting = self.lock();
        let before = waiting.claims.len();
        waiting.claims.retain(|c| c.ticket != ticket);
        waiting.claims.len() != before
    }

    fn lock(&self) -> MutexGuard<'_, Waiting> {
        // The lists stay whole whatever panicked while holding them.
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Store {
    /// Opens a step's task (see [`Store::open_worker_task`]), claimed at
    /// once for the oldest claim waiting here that may have it, which is
    /// handed the task in memory.
    pub async fn offer_worker_step(
        &self,
        task: &NewWorkerTask<'_>,
        run: Uuid,
        scope: &TenantScope,
    ) -> Result<OfferedStep> {
        let claim = scope.tenant().and_then(|tenant| {
            self.worker_desk.take(&OfferFacts {
                tenant,
                queue: task.queue,
                labels: task.labels,
            })
        });
        let to = claim.as_ref().map(|c| c.worker.as_str());
        let opened = self.open_worker_task(task, run, scope, to).await;
        let (claim, opened) = match (claim, opened) {
            (Some(claim), Err(e)) => {
                // Dropped unanswered, the claim reads the queue again.
                drop(claim);
                return Err(e);
            }
            (None, opened) => {
                let opened = opened?;
                return Ok(OfferedStep {
                    id: opened.id,
                    as_opened: opened.as_opened,
                });
            }
            (Some(claim), Ok(opened)) => (claim, opened),
        };
        let (id, mut as_opened) = (opened.id, opened.as_opened.clone());
        if !self.hand_over(claim, opened).await {
            // Given back to the queue, or not handed at all: read it.
            as_opened = as_opened.filter(|a| a.state != WorkerTaskState::Claimed);
        }
        Ok(OfferedStep { id, as_opened })
    }

    /// Answers the claim taken for an opened task: the task, when it was
    /// claimed for it; otherwise (a task a run before left, a stop or pause
    /// asked meanwhile) "read the queue again". A task whose claim left
    /// meanwhile goes back on the queue.
    /// Whether the claim took the task.
    async fn hand_over(&self, claim: DeskClaim, opened: OpenedTask) -> bool {
        let Some(handed) = opened.handed else {
            let _ = claim.answer(Handoff::Retry);
            return false;
        };
        let Err(Handoff::Claimed(handed)) = claim.answer(Handoff::Claimed(Box::new(handed))) else {
            self.worker_desk
                .handed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return true;
        };
        // Failing that, its unheld lease lapses into a new attempt.
        if let Err(e) = self.unhand_worker_task(&handed).await {
            tracing::warn!(task = %handed.id, error = %e, "a task handed to a claim that left stays claimed until its lease lapses");
        }
        false
    }

    /// This replica's desk: claims waiting here, steps handed to them since start.
    pub fn worker_desk_counts(&self) -> (usize, u64) {
        (self.worker_desk.waiting(), self.worker_desk.handed())
    }

    /// Seats the step waiting on `task` at this replica's desk: a completion
    /// of it here hands over the outcome (see [`WorkerDesk::completed`]).
    pub fn await_worker_outcome(&self, task: Uuid) -> OutcomeTicket {
        self.worker_desk.await_outcome(task)
    }

    /// Whether a claim that wants exactly `wants` waits at this replica's desk.
    pub fn claim_like_waits(&self, wants: &ClaimWants<'_>) -> bool {
        self.worker_desk.twin_waits(wants)
    }

    /// Seats a claim that found nothing at this replica's desk, where the
    /// next step offered here that it may have is handed to it; `None` when
    /// the desk is full (the claim waits for change notices alone).
    pub fn wait_at_desk(&self, wants: &ClaimWants<'_>, worker: &str) -> Option<ClaimTicket> {
        self.worker_desk.wait(wants, worker)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_oldest_claim_that_may_have_the_offer_takes_it() {
        let desk = Arc::new(WorkerDesk::default());
        let (gpu, none) = (labels(&[("gpu", "a100")]), labels(&[]));
        let queues = vec!["build".to_string()];
        let wants = |labels| ClaimWants {
            tenant: Some("acme"),
            queues: Some(&queues),
            labels,
        };
        let bare = desk.wait(&wants(&none), "bare").expect("seated");
        let big = desk.wait(&wants(&gpu), "big").expect("seated");
        let offer = |labels| OfferFacts {
            tenant: "acme",
            queue: "build",
            labels,
        };
        // The bare worker is older but lacks the label.
        let taken = desk.take(&offer(&gpu)).expect("a claim");
        assert_eq!(taken.worker, "big");
        assert!(!big.withdraw(), "taken already: its answer is coming");
        assert!(desk.take(&offer(&gpu)).is_none());
        assert_eq!(desk.take(&offer(&none)).expect("a claim").worker, "bare");
        assert_eq!(desk.waiting(), 0);
        drop(bare);
    }

    #[test]
    fn a_claim_that_left_is_never_taken() {
        let desk = Arc::new(WorkerDesk::default());
        let none = labels(&[]);
        let wants = ClaimWants {
            tenant: Some("acme"),
            queues: None,
            labels: &none,
        };
        let offer = OfferFacts {
            tenant: "acme",
            queue: "q",
            labels: &none,
        };
        let withdrawn = desk.wait(&wants, "w1").expect("seated");
        assert!(withdrawn.withdraw());
        drop(desk.wait(&wants, "w2").expect("seated"));
        assert!(desk.take(&offer).is_none());
        // A claim whose answer can no longer be received (its request was
        // cut before it withdrew) is skipped and dropped.
        let mut cut = desk.wait(&wants, "w3").expect("seated");
        drop(std::mem::replace(&mut cut.handed, oneshot::channel().1));
        assert!(desk.take(&offer).is_none());
        assert_eq!(desk.waiting(), 0);
        drop(cut);
    }

    #[test]
    fn a_claim_handed_its_answer_receives_it_and_one_gone_gives_it_back() {
        let desk = Arc::new(WorkerDesk::default());
        let none = labels(&[]);
        let wants = ClaimWants {
            tenant: None,
            queues: None,
            labels: &none,
        };
        let offer = OfferFacts {
            tenant: "t",
            queue: "q",
            labels: &none,
        };
        let mut ticket = desk.wait(&wants, "w").expect("seated");
        let claim = desk.take(&offer).expect("taken");
        assert!(claim.answer(Handoff::Retry).is_ok());
        assert!(matches!(ticket.handed.try_recv(), Ok(Handoff::Retry)));
        let ticket = desk.wait(&wants, "w").expect("seated");
        let claim = desk.take(&offer).expect("taken");
        drop(ticket);
        assert!(matches!(claim.answer(Handoff::Retry), Err(Handoff::Retry)));
    }

    #[test]
    fn a_completed_outcome_reaches_only_its_waiting_step_and_a_gone_one_is_forgotten() {
        let desk = Arc::new(WorkerDesk::default());
        let (mine, other) = (Uuid::new_v4(), Uuid::new_v4());
        let mut ticket = desk.await_outcome(mine);
        desk.completed(other, &serde_json::json!({"action": "theirs"}));
        assert!(ticket.outcome.try_recv().is_err(), "not its task");
        desk.completed(mine, &serde_json::json!({"action": "mine"}));
        assert_eq!(
            ticket.outcome.try_recv().expect("handed"),
            serde_json::json!({"action": "mine"})
        );
        let gone = desk.await_outcome(other);
        drop(gone);
        assert!(desk.steps().is_empty(), "a step that left leaves no place");
    }

    #[test]
    fn only_a_claim_wanting_exactly_the_same_is_a_twin() {
        let desk = Arc::new(WorkerDesk::default());
        let (gpu, none) = (labels(&[("gpu", "a100")]), labels(&[]));
        let (q, qr) = (
            vec!["q".to_string()],
            vec!["q".to_string(), "r".to_string()],
        );
        let wants = |tenant, queues, labels| ClaimWants {
            tenant,
            queues,
            labels,
        };
        let seated = desk
            .wait(&wants(Some("t"), Some(&q), &gpu), "w")
            .expect("seated");
        assert!(desk.twin_waits(&wants(Some("t"), Some(&q), &gpu)));
        assert!(!desk.twin_waits(&wants(Some("u"), Some(&q), &gpu)));
        assert!(!desk.twin_waits(&wants(None, Some(&q), &gpu)));
        assert!(!desk.twin_waits(&wants(Some("t"), Some(&qr), &gpu)));
        assert!(!desk.twin_waits(&wants(Some("t"), None, &gpu)));
        assert!(!desk.twin_waits(&wants(Some("t"), Some(&q), &none)));
        drop(seated);
        assert!(!desk.twin_waits(&wants(Some("t"), Some(&q), &gpu)));
    }

    #[test]
    fn a_full_desk_seats_no_one_more() {
        let desk = Arc::new(WorkerDesk::default());
        let none = labels(&[]);
        let wants = ClaimWants {
            tenant: None,
            queues: None,
            labels: &none,
        };
        let seated: Vec<_> = (0..MAX_WAITING)
            .map(|i| desk.wait(&wants, &format!("w{i}")).expect("seated"))
            .collect();
        assert!(desk.wait(&wants, "late").is_none());
        drop(seated);
        assert_eq!(desk.waiting(), 0);
    }

    mod with_a_database {
        use super::*;
        use crate::store::testing::TestDb;
        use crate::store::{Store, WorkerChange};

        /// A running session of tenant `t`; `stopping` asks a stop of it.
        async fn session(pool: &sqlx::PgPool, stopping: bool) -> Uuid {
            let id = Uuid::new_v4();
            sqlx::query(
                "INSERT INTO sessions (id, tenant, goal, mode, status, limits, executor,
                                       lease_expires_at, stop_requested)
                 VALUES ($1, 't', 'goal', 'fixed', 'running', '{}'::jsonb,
                         '{\"kind\": \"worker\", \"queue\": \"q\"}'::jsonb,
                         now() + interval '1 minute', $2)",
            )
            .bind(id)
            .bind(stopping)
            .execute(pool)
            .await
            .expect("a session");
            id
        }

        fn step<'a>(
            session: Uuid,
            none: &'a BTreeMap<String, String>,
            context: &'a serde_json::Value,
        ) -> NewWorkerTask<'a> {
            NewWorkerTask {
                id: Uuid::new_v4(),
                session_id: session,
                queue: "q",
                labels: none,
                iteration: 1,
                heartbeat_timeout_ms: 60_000,
                idempotency_key: "k",
                context,
                steady: false,
            }
        }

        async fn row(pool: &sqlx::PgPool, id: Uuid) -> (String, Option<String>, bool) {
            sqlx::query_as(
                "SELECT state, worker, lease_digest IS NOT NULL FROM worker_tasks WHERE id = $1",
            )
            .bind(id)
            .fetch_one(pool)
            .await
            .expect("the task")
        }

        /// A claim of tenant `t` waiting at a fresh store's desk, then a
        /// step of a session (being stopped, with `stopping`) offered.
        async fn offer_to_a_waiting_claim(
            stopping: bool,
            context: &serde_json::Value,
        ) -> (TestDb, Store, ClaimTicket, OfferedStep) {
            let db = TestDb::new().await;
            let store = Store::from_pool(db.pool.clone());
            let none = BTreeMap::new();
            let wants = ClaimWants {
                tenant: Some("t"),
                queues: None,
                labels: &none,
            };
            let ticket = store.wait_at_desk(&wants, "w1").expect("seated");
            let session_id = session(&db.pool, stopping).await;
            let task = step(session_id, &none, context);
            let offered = store
                .offer_worker_step(&task, Uuid::new_v4(), &TenantScope::tenant_only("t"))
                .await
                .expect("offered");
            (db, store, ticket, offered)
        }

        #[tokio::test]
        async fn a_waiting_claim_is_handed_the_step_offered_as_a_claimed_row() {
            let context = serde_json::json!({"iteration": 1});
            let (db, store, mut ticket, offered) = offer_to_a_waiting_claim(false, &context).await;
            let scope = TenantScope::tenant_only("t");
            let as_opened = offered.as_opened.expect("a new task");
            assert_eq!(as_opened.state, WorkerTaskState::Claimed);
            let id = offered.id;
            let Ok(Handoff::Claimed(handed)) = ticket.handed.try_recv() else {
                panic!("the waiting claim was not handed the step");
            };
            assert_eq!(handed.id, id);
            assert_eq!(handed.context, context);
            assert_eq!(
                row(&db.pool, id).await,
                ("claimed".into(), Some("w1".into()), true)
            );
            // The lease handed over is the row's: the worker completes with it.
            let done = store
                .settle_worker_task(
                    id,
                    &scope,
                    None,
                    &handed.lease_token,
                    crate::store::Settlement::Complete(&serde_json::json!({"action": "a"})),
                )
                .await
                .expect("settled");
            assert_eq!(done, crate::store::LeaseCheck::Held(()));
        }

        #[tokio::test]
        async fn a_step_handed_to_a_claim_that_left_goes_back_on_the_queue() {
            let db = TestDb::new().await;
            let store = Store::from_pool(db.pool.clone());
            let (none, context) = (BTreeMap::new(), serde_json::json!({}));
            let scope = TenantScope::tenant_only("t");
            let wants = ClaimWants {
                tenant: Some("t"),
                queues: None,
                labels: &none,
            };
            let offer = OfferFacts {
                tenant: "t",
                queue: "q",
                labels: &none,
            };
            let ticket = store.wait_at_desk(&wants, "w1").expect("seated");
            let claim = store.worker_desk.take(&offer).expect("taken");
            let session_id = session(&db.pool, false).await;
            let task = step(session_id, &none, &context);
            let opened = store
                .open_worker_task(&task, Uuid::new_v4(), &scope, Some(&claim.worker))
                .await
                .expect("opened");
            assert!(opened.handed.is_some());
            let mut changes = store.worker_changes();
            // The claim's request ends between the offer's commit and its answer.
            drop(ticket);
            assert!(!store.hand_over(claim, opened).await);
            assert_eq!(
                row(&db.pool, task.id).await,
                ("pending".into(), None, false)
            );
            let told = changes.try_recv().expect("waiting claims told");
            assert_eq!(
                told,
                WorkerChange {
                    task: Some(task.id),
                    offered: true
                }
            );
        }

        #[tokio::test]
        async fn a_session_being_stopped_is_not_handed_over() {
            let context = serde_json::json!({});
            let (db, _store, mut ticket, offered) = offer_to_a_waiting_claim(true, &context).await;
            let as_opened = offered.as_opened.expect("a new task");
            assert_eq!(as_opened.state, WorkerTaskState::Pending);
            assert!(matches!(ticket.handed.try_recv(), Ok(Handoff::Retry)));
            assert_eq!(
                row(&db.pool, offered.id).await,
                ("pending".into(), None, false)
            );
        }
    }
}
