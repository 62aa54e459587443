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
    /// The request's deadline passed before it was read.
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
        let started = Instant::now();
        // Refused before anything is read: the ranges do not depend on the session.
        let defaults = self.config.defaults.limits_for(self.config.defaults.mode);
        policy.apply(&Policy::recorded(
            self.config.gate,
            self.config.stuck,
            defaults,
        ))?;
        let mut answer = ReplayAnswer {
            sessions: Vec::new(),
            not_replayed: Vec::new(),
            totals: Totals::default(),
            took_ms: 0,
        };
        let ids = self.select(selection, scope, &mut answer).await?;
        for (n, chunk) in ids.chunks(BATCH).enumerate() {
            if started.elapsed() >= deadline {
                let left = ids[n * BATCH..].iter();
                answer.not_replayed.extend(left.map(|&id| NotReplayed {
                    id,
                    why: Skipped::Deadline,
                }));
                break;
            }
            self.replay_batch(chunk, policy, scope, &mut answer).await?;
        }
        answer.took_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        Ok(answer)
    }

    /// The ended sessions of `selection`, in order; the others go to `not_replayed`.
    async fn select(
        &self,
        selection: Selection,
        scope: &TenantScope,
        answer: &mut ReplayAnswer,
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
                None => answer.not_replayed.push(NotReplayed {
                    id,
                    why: Skipped::NotFound,
                }),
                Some(s) if s.has_ended() || s == Status::Paused => ended.push(id),
                Some(_) => answer.not_replayed.push(NotReplayed {
                    id,
                    why: Skipped::NotEnded,
                }),
            }
        }
        Ok(ended)
    }

    /// Reads and replays one batch of ended sessions.
    async fn replay_batch(
        &self,
        ids: &[Uuid],
        policy: &PolicyOverride,
        scope: &TenantScope,
        answer: &mut ReplayAnswer,
    ) -> Result<()> {
        let mut rows = self.store.replay_rows(ids, scope).await?;
        for &id in ids {
            // Read again under the scope: it may have been deleted meanwhile.
            let Some(session) = self.store.session(id, scope).await? else {
                answer.not_replayed.push(NotReplayed {
                    id,
                    why: Skipped::NotFound,
                });
                continue;
            };
            let base = Policy::recorded(self.config.gate, self.config.stuck, session.limits.0);
            let over = policy.apply(&base).map_err(ServiceError::from)?;
            let recording = self.recording(&session, &mut rows);
            let outcome = replay::replay(&recording, &base, &over);
            answer.totals.add(&outcome);
            answer.sessions.push(SessionReplay { id, outcome });
        }
        Ok(())
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
