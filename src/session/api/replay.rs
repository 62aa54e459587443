//! The replay use case (what-if): the pure policy rerun over ended sessions'
//! recorded steps and reflections under a policy override, without a model
//! call or a write (see `policy::replay`). Bounded in sessions per request
//! and in time: sessions the deadline leaves unread are named, not dropped.

use std::time::{Duration, Instant};

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use super::SessionService;
use crate::policy::lifecycle::Status;
use crate::policy::loop_state::LoopState;
use crate::policy::replay::{
    self, Policy, PolicyOverride, RecordedEnd, RecordedReflection, RecordedStep, Recording,
    ReplayOutcome, Totals,
};
use crate::session::runtime::rehydrate::initial_state;
use crate::session::{Result, ServiceError};
use crate::store::{self, ReplayRows, Session, SessionOrder, SessionSortKey, TenantScope};

/// The most sessions one request replays.
pub const MAX_REPLAY_SESSIONS: usize = 1_000;
/// The deadline when the request names none, ms.
pub const DEFAULT_DEADLINE_MS: u64 = 10_000;
/// The longest deadline a request may ask for, ms.
pub const MAX_DEADLINE_MS: u64 = 60_000;
/// Sessions read from the store at once.
const BATCH: usize = 50;

/// Which sessions to replay.
#[derive(Debug, Clone)]
pub enum Selection {
    /// These ids.
    Ids(Vec<Uuid>),
    /// The newest sessions the list's filter lets through, at most this many.
    Filter(store::SessionFilter, usize),
}

/// Why a session was not replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Skipped {
    /// No such session for the caller (another tenant's reads the same).
    NotFound,
    /// It has not ended (running, queued, awaiting refinement).
    NotEnded,
    /// The request's deadline passed before it was replayed.
    Deadline,
}

/// A session left out, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct NotReplayed {
    /// Its id.
    pub id: Uuid,
    /// Why.
    pub why: Skipped,
}

/// One session's replay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SessionReplay {
    /// The session.
    pub id: Uuid,
    /// Its replay.
    #[serde(flatten)]
    pub outcome: ReplayOutcome,
}

/// A replay's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ReplayAnswer {
    /// Each session replayed.
    pub sessions: Vec<SessionReplay>,
    /// Those left out, and why.
    pub not_replayed: Vec<NotReplayed>,
    /// What the replays add up to.
    pub totals: Totals,
    /// Time the replay took, ms.
    pub took_ms: u64,
}

/// How a replay ended: its answer but the sessions (a streamed replay's last line).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ReplayEnd {
    /// Those left out, and why.
    pub not_replayed: Vec<NotReplayed>,
    /// What the replays add up to.
    pub totals: Totals,
    /// Time the replay took, ms.
    pub took_ms: u64,
}

/// A replay under way: the ended sessions it has yet to read, batch by
/// batch, and what those read so far add up to. Holds no connection
/// between batches.
#[derive(Debug)]
pub struct ReplayRun {
    started: Instant,
    deadline: Duration,
    policy: PolicyOverride,
    scope: TenantScope,
    /// Ended sessions to replay, in order.
    ended: Vec<Uuid>,
    /// How many of `ended` have been read.
    read: usize,
    not_replayed: Vec<NotReplayed>,
    totals: Totals,
}

impl ReplayRun {
    /// What the replay adds up to, with every session it did not read
    /// named; those left when the deadline passed as `deadline`.
    pub fn finish(mut self) -> ReplayEnd {
        let left = self.ended[self.read..].iter();
        self.not_replayed.extend(left.map(|&id| NotReplayed {
            id,
            why: Skipped::Deadline,
        }));
        ReplayEnd {
            not_replayed: self.not_replayed,
            totals: self.totals,
            took_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
        }
    }
}

/// The state `session` started with: the row's checklists as none is
/// ticked yet, and the context cycle before the first recorded change of it
/// (the row holds the latest; each change moves on by one).
fn start_state(session: &Session, steps: &[crate::store::ReplayStep]) -> LoopState {
    let mut state = initial_state(session);
    for item in state.criteria.iter_mut().chain(state.milestones.iter_mut()) {
        item.done = false;
        item.done_at_iteration = None;
    }
    if let Some(first) = steps.iter().find_map(|s| s.effects.new_cycle) {
        state.cycle = first.saturating_sub(1).max(1);
    }
    state
}

impl SessionService {
    /// Replays the sessions `selection` names that `scope` reaches under
    /// `policy`, within `deadline`. Reads only.
    pub async fn replay_policy(
        &self,
        selection: Selection,
        policy: &PolicyOverride,
        deadline: Duration,
        scope: &TenantScope,
    ) -> Result<ReplayAnswer> {
        let run = self
            .begin_replay(selection, *policy, deadline, scope.clone())
            .await?;
        self.replay_rest(run).await
    }

    /// Reads and replays the rest of `run` and answers it whole.
    pub async fn replay_rest(&self, mut run: ReplayRun) -> Result<ReplayAnswer> {
        let mut sessions = Vec::new();
        while let Some(batch) = self.replay_next(&mut run).await? {
            sessions.extend(batch);
        }
        let end = run.finish();
        Ok(ReplayAnswer {
            sessions,
            not_replayed: end.not_replayed,
            totals: end.totals,
            took_ms: end.took_ms,
        })
    }

    /// Starts a replay of the sessions `selection` names that `scope`
    /// reaches under `policy`, within `deadline` from now: checks the
    /// policy, then reads which of them have ended. Reads only.
    pub async fn begin_replay(
        &self,
        selection: Selection,
        policy: PolicyOverride,
        deadline: Duration,
        scope: TenantScope,
    ) -> Result<ReplayRun> {
        let started = Instant::now();
        // Refused before anything is read: the ranges do not depend on the session.
        let defaults = self.config.defaults.limits_for(self.config.defaults.mode);
        policy.apply(&Policy::recorded(
            self.config.gate,
            self.config.stuck,
            defaults,
        ))?;
        let mut not_replayed = Vec::new();
        let ended = self.select(selection, &scope, &mut not_replayed).await?;
        Ok(ReplayRun {
            started,
            deadline,
            policy,
            scope,
            ended,
            read: 0,
            not_replayed,
            totals: Totals::default(),
        })
    }

    /// The next batch of `run`'s sessions, replayed (those deleted
    /// meanwhile are named in `run`); `None` once every session is read or
    /// the deadline has passed. The deadline is looked at before each
    /// session too, so a batch whose read ran late stops where it is. Each
    /// read takes one pooled connection and gives it back.
    pub async fn replay_next(&self, run: &mut ReplayRun) -> Result<Option<Vec<SessionReplay>>> {
        if run.read >= run.ended.len() || run.started.elapsed() >= run.deadline {
            return Ok(None);
        }
        let end = (run.read + BATCH).min(run.ended.len());
        let ids = run.ended[run.read..end].to_vec();
        let mut rows = self.store.replay_rows(&ids, &run.scope).await?;
        let mut replayed = Vec::with_capacity(ids.len());
        for id in ids {
            if run.started.elapsed() >= run.deadline {
                break;
            }
            run.read += 1;
            if let Some(session) = self.replay_one(id, &mut rows, run).await? {
                replayed.push(session);
            }
        }
        Ok(Some(replayed))
    }

    /// The ended sessions of `selection`, in order; the others go to `not_replayed`.
    async fn select(
        &self,
        selection: Selection,
        scope: &TenantScope,
        not_replayed: &mut Vec<NotReplayed>,
    ) -> Result<Vec<Uuid>> {
        let sessions: Vec<(Uuid, Option<Status>)> = match selection {
            Selection::Ids(ids) => {
                let mut found = Vec::with_capacity(ids.len());
                for id in ids {
                    let status = self.store.session(id, scope).await?.map(|s| s.status);
                    found.push((id, status));
                }
                found
            }
            Selection::Filter(filter, limit) => {
                let order = SessionOrder {
                    key: SessionSortKey::Created,
                    descending: true,
                };
                let limit = i64::try_from(limit.min(MAX_REPLAY_SESSIONS)).unwrap_or(1);
                let rows = self
                    .store
                    .list_sessions(&filter, order, None, limit, scope)
                    .await?;
                rows.into_iter().map(|s| (s.id, Some(s.status))).collect()
            }
        };
        let mut ended = Vec::with_capacity(sessions.len());
        for (id, status) in sessions {
            match status {
                None => not_replayed.push(NotReplayed {
                    id,
                    why: Skipped::NotFound,
                }),
                Some(s) if s.has_ended() || s == Status::Paused => ended.push(id),
                Some(_) => not_replayed.push(NotReplayed {
                    id,
                    why: Skipped::NotEnded,
                }),
            }
        }
        Ok(ended)
    }

    /// Replays session `id` of `run` from `rows`; `None` (and named in
    /// `run`) when it is gone.
    async fn replay_one(
        &self,
        id: Uuid,
        rows: &mut ReplayRows,
        run: &mut ReplayRun,
    ) -> Result<Option<SessionReplay>> {
        // Read again under the scope: it may have been deleted meanwhile.
        let Some(session) = self.store.session(id, &run.scope).await? else {
            run.not_replayed.push(NotReplayed {
                id,
                why: Skipped::NotFound,
            });
            return Ok(None);
        };
        let base = Policy::recorded(self.config.gate, self.config.stuck, session.limits.0);
        let over = run.policy.apply(&base).map_err(ServiceError::from)?;
        let recording = self.recording(&session, rows);
        let outcome = replay::replay(&recording, &base, &over);
        run.totals.add(&outcome);
        Ok(Some(SessionReplay { id, outcome }))
    }

    /// What a replay reads of `session`, taken out of `rows`.
    fn recording(&self, session: &Session, rows: &mut ReplayRows) -> Recording {
        let id = session.id;
        let steps = rows.steps.remove(&id).unwrap_or_default();
        let reflections = rows.reflections.remove(&id).unwrap_or_default();
        let brief = &session.executor_summary.0;
        let model = match brief.kind.as_str() {
            "llm" => brief
                .model
                .as_deref()
                .or(self.config.models.model.as_deref()),
            _ => None,
        };
        let day = session.ended_at.unwrap_or(session.updated_at).date_naive();
        let count = |v: i64| u64::try_from(v).unwrap_or(0);
        Recording {
            start: start_state(session, &steps),
            has_children: session.children_count > 0,
            mode: session.mode,
            tree: (session.parent_id.is_some(), session.on_child_pause),
            money_rate: self.config.model_prices.reservation_rate(model, day),
            steps: steps
                .into_iter()
                .map(|s| RecordedStep {
                    run: s.run,
                    cost_usd: match s.cost_usd {
                        None if s.usage_tokens == 0 => Some(Decimal::ZERO),
                        other => other,
                    },
                    record: s.record,
                    effects: s.effects,
                })
                .collect(),
            reflections: reflections
                .into_iter()
                .map(|r| RecordedReflection {
                    after_iteration: count(r.after_iteration),
                    assessment: r.assessment,
                    error: r.error,
                    tokens: count(r.tokens),
                })
                .collect(),
            tokens_charged: count(rows.tokens_charged.get(&id).copied().unwrap_or(0)),
            end: RecordedEnd {
                status: session.status,
                reason: session.reason,
                iterations: count(session.iterations),
                tokens: count(session.tokens_used),
                cost_usd: session.cost_usd,
                elapsed_ms: count(session.elapsed_ms),
                run: session.run,
            },
        }
    }
}
