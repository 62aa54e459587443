//! The store's row types in one place: what callers hand in to be written
//! (`New*`) and what they get back (`*Record`), plus the Postgres mapping of
//! the lifecycle enums. Every other store module depends on this one and
//! this one on none of them.

use std::collections::BTreeMap;

use chrono::{DateTime, NaiveDate, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::Postgres;
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArgumentBuffer, PgTypeInfo, PgValueRef};
use sqlx::types::Json;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::event::{RefinementProposal, SessionEvent};
use crate::policy::approval::Decision;
use crate::policy::checklist::ChecklistItem;
use crate::policy::delegation::ChildPausePolicy;
use crate::policy::guardrails::{Limits, Usage};
use crate::policy::history::StepRecord;
use crate::policy::lifecycle::{Mode, Reason, Status};
use crate::policy::loop_state::{AppliedReflection, LoopState, StepEffects};
use crate::policy::pricing::StepUsage;
use crate::policy::reflection::Assessment;
use crate::policy::soft_budget::SentWarning;
use crate::policy::worker::WorkerTaskState;
use crate::spec::{ExecutorBrief, StoredExecutor};

/// Stores a lifecycle enum as its snake_case name in a `text` column. Written
/// by hand rather than derived so policy stays free of sqlx, and so binding
/// one costs no type lookup (a derived `type_name = "text"` is resolved by
/// name on each connection).
macro_rules! text_enum {
    ($ty:ty, $what:literal) => {
        impl sqlx::Type<Postgres> for $ty {
            fn type_info() -> PgTypeInfo {
                <&str as sqlx::Type<Postgres>>::type_info()
            }

            fn compatible(ty: &PgTypeInfo) -> bool {
                <&str as sqlx::Type<Postgres>>::compatible(ty)
            }
        }

        impl sqlx::Encode<'_, Postgres> for $ty {
            fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
                <&str as sqlx::Encode<Postgres>>::encode(self.as_str(), buf)
            }
        }

        impl sqlx::Decode<'_, Postgres> for $ty {
            fn decode(value: PgValueRef<'_>) -> Result<Self, BoxDynError> {
                let name = <&str as sqlx::Decode<Postgres>>::decode(value)?;
                <$ty>::parse(name).ok_or_else(|| format!("unknown {} {name:?}", $what).into())
            }
        }
    };
}

text_enum!(Status, "status");
text_enum!(Mode, "mode");
text_enum!(Reason, "reason");
text_enum!(ChildPausePolicy, "child pause policy");
text_enum!(WorkerTaskState, "worker task state");
text_enum!(Decision, "approval decision");

/// Proof that this replica runs a session; every loop write is fenced by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// Session.
    pub session_id: Uuid,
    /// Token of this acquisition; changes whenever another replica takes over.
    pub token: Uuid,
}

/// A lease that was renewed, with the durable control flags read in passing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Renewed {
    /// Session.
    pub session_id: Uuid,
    /// The token renewed (a replica may hold a stale one of the same session).
    pub token: Uuid,
    /// A stop was requested.
    pub stop_requested: bool,
    /// A pause was requested.
    pub pause_requested: bool,
    /// Until when the lease now runs.
    pub lease_expires_at: DateTime<Utc>,
    /// When it was renewed.
    pub heartbeat_at: DateTime<Utc>,
}

/// An orphaned session this replica just took over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claimed {
    /// The new lease.
    pub lease: Lease,
    /// A stop had been requested: end it instead of running it.
    pub stop_requested: bool,
    /// The replica that held it before, if any.
    pub previous_owner: Option<Uuid>,
}

/// JSON text serialized straight from a typed value, for the log's `json`
/// columns: Postgres validates it and stores it as sent, never parsing it
/// into `jsonb` (migrations/0008_lighter_commits.sql). Built without a
/// `serde_json::Value` on the way: building that tree, printing it and
/// freeing it was the largest share of the loop's CPU per iteration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonText(String);

impl JsonText {
    /// Serializes `value`; fails only when it cannot be JSON (a map with
    /// non-string keys, say).
    pub fn of<T: Serialize + ?Sized>(value: &T) -> Result<JsonText, serde_json::Error> {
        serde_json::to_string(value).map(JsonText)
    }

    /// Text that is JSON already because serde_json wrote it.
    pub(crate) fn from_serialized(text: String) -> JsonText {
        JsonText(text)
    }

    /// The text, as sent to Postgres.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Parsed back into a value (tests, and readers of what was just built).
    pub fn to_value(&self) -> Result<Value, serde_json::Error> {
        serde_json::from_str(&self.0)
    }
}

impl From<&Value> for JsonText {
    fn from(value: &Value) -> JsonText {
        JsonText(value.to_string())
    }
}

/// An event about to be appended.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    /// Event kind, e.g. `iteration_completed`.
    pub kind: &'static str,
    /// Event payload.
    pub data: JsonText,
}

impl NewEvent {
    /// Builds an event from a payload given as a value.
    pub fn new(kind: &'static str, data: Value) -> NewEvent {
        NewEvent {
            kind,
            data: JsonText::from(&data),
        }
    }
}

/// An event as stored.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct EventRecord {
    /// Per-session sequence number, from 1, without gaps.
    pub seq: i64,
    /// Kind.
    pub kind: String,
    /// Payload: the JSON of the `SessionEvent` of this `kind`
    /// (`SessionEvent::from_parts` reads it back).
    pub data: Value,
    /// When it was appended.
    pub created_at: DateTime<Utc>,
    /// The public prefix of the key whose request appended it, if any.
    pub actor: Option<String>,
}

/// What a loop write stores of the session's consumption: the guardrails'
/// usage, the reflection share of its tokens and how much of the outside
/// charges its tokens count. The one copy of the counters; the store turns
/// them into columns (saturating at the column's range) as it binds them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Iterations, tokens, tool calls, the error streak and the wall time.
    pub usage: Usage,
    /// Tokens spent on reflection (part of `usage.tokens`).
    pub reflection_tokens: u64,
    /// How much of the session's outside charges `usage.tokens` counts
    /// (`LoopState::charges_seen`): a write adds the rest.
    pub charges_seen: u64,
}

/// A count as a `bigint` column, saturating.
fn bigint(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Counters {
    /// The guardrail usage, the reflection share of its tokens and the
    /// outside charges it counts.
    pub fn from_usage(u: &Usage, reflection_tokens: u64, charges_seen: u64) -> Counters {
        Counters {
            usage: *u,
            reflection_tokens,
            charges_seen,
        }
    }

    /// The `iterations` column.
    pub(super) fn iterations(&self) -> i64 {
        bigint(self.usage.iterations)
    }

    /// The `tokens_used` column (before outside charges it does not count).
    pub(super) fn tokens_used(&self) -> i64 {
        bigint(self.usage.tokens)
    }

    /// The `tool_calls` column.
    pub(super) fn tool_calls(&self) -> i64 {
        bigint(self.usage.tool_calls)
    }

    /// The `consecutive_errors` column.
    pub(super) fn consecutive_errors(&self) -> i32 {
        i32::try_from(self.usage.consecutive_errors).unwrap_or(i32::MAX)
    }

    /// The `elapsed_ms` column.
    pub(super) fn elapsed_ms(&self) -> i64 {
        bigint(self.usage.elapsed_ms)
    }

    /// The `reflection_tokens` column.
    pub(super) fn reflection_tokens(&self) -> i64 {
        bigint(self.reflection_tokens)
    }

    /// How much of the outside charges the tokens count, as bound.
    pub(super) fn charges_seen(&self) -> i64 {
        bigint(self.charges_seen)
    }
}

/// One session as stored: the columns of `sessions` the service reads, each
/// under its column's name and typed (JSON columns through `Json<T>`), read
/// by `query_as!` (see `select_session!`), so a misspelt or mistyped column
/// fails the build.
#[derive(Debug, Clone)]
pub struct Session {
    /// Id.
    pub id: Uuid,
    /// The goal text.
    pub goal: String,
    /// Fixed or continuous.
    pub mode: Mode,
    /// Current status.
    pub status: Status,
    /// Why it waits or ended.
    pub reason: Option<Reason>,
    /// Human summary of the termination.
    pub summary: Option<String>,
    /// Detail of the reason: the agent's question, the blocker, the stuck pattern.
    pub reason_detail: Option<String>,
    /// The goal as first given, when refinement changed it.
    pub original_goal: Option<String>,
    /// The pending or last refinement proposal.
    pub refinement: Option<Json<RefinementProposal>>,
    /// Success criteria checklist.
    pub criteria: Json<Vec<ChecklistItem>>,
    /// Milestones checklist.
    pub milestones: Json<Vec<ChecklistItem>>,
    /// Current context cycle.
    pub cycle: i32,
    /// Memory carried across context cycles.
    pub memory: String,
    /// Tokens spent writing refinements and checklists (part of `tokens_used`).
    pub refinement_tokens: i64,
    /// Latest reflection (assessment and decision).
    pub last_reflection: Option<Json<ReflectionSummary>>,
    /// What to do next.
    pub next_steps: Json<Vec<String>>,
    /// Progress estimate, percent.
    pub percent_complete: Option<f64>,
    /// Estimated seconds to completion.
    pub eta_seconds: Option<f64>,
    /// Limits in force.
    pub limits: Json<Limits>,
    /// The executor as stored (`select_session!`); `None` where only its
    /// summary is read (lists) or kept (the live view).
    pub executor: Option<Json<StoredExecutor>>,
    /// What lists and the status show of it: the summary Postgres keeps.
    pub executor_summary: Json<ExecutorBrief>,
    /// Iterations committed.
    pub iterations: i64,
    /// Tokens used.
    pub tokens_used: i64,
    /// Tool calls made.
    pub tool_calls: i64,
    /// Current error streak.
    pub consecutive_errors: i32,
    /// Running wall time, ms.
    pub elapsed_ms: i64,
    /// Tokens spent on reflection (part of `tokens_used`).
    pub reflection_tokens: i64,
    /// What its committed steps cost, USD: the exact sum of theirs.
    pub cost_usd: Decimal,
    /// Its committed steps that used tokens no price entry priced.
    pub unpriced_steps: i64,
    /// Run number: 1 at creation, +1 on every resume.
    pub run: i32,
    /// Whether the latest stop saved a checkpoint.
    pub checkpoint_saved: bool,
    /// Iteration covered by the latest checkpoint.
    pub last_checkpoint_iteration: i64,
    /// A user asked to stop.
    pub stop_requested: bool,
    /// A user asked to pause.
    pub pause_requested: bool,
    /// Guidance for the next iteration.
    pub guidance: Option<String>,
    /// Sequence number of the latest event.
    pub last_event_seq: i64,
    /// Replica holding the lease.
    pub owner: Option<Uuid>,
    /// When the lease ends unless renewed.
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// Last heartbeat.
    pub heartbeat_at: Option<DateTime<Utc>>,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
    /// When it ended (terminal statuses).
    pub ended_at: Option<DateTime<Utc>>,
    /// The tenant it belongs to.
    pub tenant: String,
    /// Place among its tenant's queued sessions while `queued` (1 = its
    /// tenant's next to start).
    pub queue_position: Option<i64>,
    /// Tenants with queued sessions (its own included) while `queued`:
    /// the free places are shared among them by weight.
    pub queue_tenants: Option<i64>,
    /// Attempts at running it in a row without progress (rescues after a
    /// replica died or failed it).
    pub attempts: i32,
    /// The error the previous attempt ended on.
    pub last_error: Option<String>,
    /// When it was imported from an archive: it is read-only.
    pub imported_at: Option<DateTime<Utc>>,
    /// The session that delegated it, for a child.
    pub parent_id: Option<Uuid>,
    /// Its ancestors, root first (empty for a root).
    pub lineage: Vec<Uuid>,
    /// The ancestor whose sealed secrets its executor uses, for a child.
    pub secrets_from: Option<Uuid>,
    /// Tokens carved out of its parent for it, for a child.
    pub budget_tokens: Option<i64>,
    /// Tokens its ended children spent (their limits came out of its own).
    pub children_tokens: i64,
    /// Tokens its live children hold of what it was given.
    pub children_reserved_tokens: i64,
    /// Children it has (live or ended).
    pub children_count: i64,
    /// What a child of its tree does when it would pause for a person.
    pub on_child_pause: ChildPausePolicy,
    /// The soft-budget warnings it has logged (`budget_warning` events),
    /// oldest first.
    pub budget_warnings: Json<Vec<SentWarning>>,
    /// The session it was forked from, for a fork.
    pub forked_from_session: Option<Uuid>,
    /// The checkpoint's iteration it was forked at, for a fork.
    pub forked_from_iteration: Option<i64>,
    /// What it waits on (or waited on) for a confirmation before start:
    /// its estimate, the bounds it is over, when it expires.
    pub confirmation: Option<Json<crate::policy::confirm::Confirmation>>,
}

impl Session {
    /// What the session has used, money included: the guardrails' view.
    pub fn usage(&self) -> Usage {
        let count = |v: i64| u64::try_from(v).unwrap_or(0);
        Usage {
            iterations: count(self.iterations),
            elapsed_ms: count(self.elapsed_ms),
            tokens: count(self.tokens_used),
            consecutive_errors: u32::try_from(self.consecutive_errors).unwrap_or(0),
            tool_calls: count(self.tool_calls),
            cost_usd: self.cost_usd,
            unpriced_steps: count(self.unpriced_steps),
        }
    }

    /// Sets the usage counters, as the loop's commit writes them.
    pub fn set_counters(&mut self, c: Counters) {
        self.iterations = c.iterations();
        self.tokens_used = c.tokens_used();
        self.tool_calls = c.tool_calls();
        self.consecutive_errors = c.consecutive_errors();
        self.elapsed_ms = c.elapsed_ms();
        self.reflection_tokens = c.reflection_tokens();
    }
}

/// The latest reflection as the session row keeps it: the summary its
/// `reflection` event carries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReflectionSummary {
    /// Reflection number.
    pub number: i32,
    /// The iteration it followed.
    pub after_iteration: i64,
    /// `interval` or `agent_claimed_done`.
    pub trigger: String,
    /// Whether the model answered usably.
    pub ok: bool,
    /// The model's assessment.
    pub assessment: Option<Assessment>,
    /// Why it failed.
    pub error: Option<String>,
    /// What was decided.
    pub decision: AppliedReflection,
    /// Iterations until the next reflection.
    pub next_interval: i32,
    /// Tokens it used.
    pub tokens: i64,
}

impl ReflectionSummary {
    /// The `reflection` event that logs it.
    pub fn event(&self) -> SessionEvent {
        SessionEvent::Reflection {
            number: self.number,
            after_iteration: self.after_iteration,
            trigger: self.trigger.clone(),
            ok: self.ok,
            assessment: self.assessment.clone(),
            error: self.error.clone(),
            decision: self.decision.clone(),
            next_interval: self.next_interval,
            tokens: self.tokens,
        }
    }
}

/// A session about to be created.
#[derive(Debug, Clone)]
pub struct NewSession {
    /// Fresh id.
    pub id: Uuid,
    /// The goal.
    pub goal: String,
    /// Mode.
    pub mode: Mode,
    /// Resolved limits.
    pub limits: Limits,
    /// The executor to store (its secrets sealed apart).
    pub executor: StoredExecutor,
    /// The goal as first given, when a refinement replaced it.
    pub original_goal: Option<String>,
    /// Refinement proposal (for sessions awaiting refinement, or applied automatically).
    pub refinement: Option<RefinementProposal>,
    /// Success criteria.
    pub criteria: Vec<ChecklistItem>,
    /// Milestones.
    pub milestones: Vec<ChecklistItem>,
    /// Tokens spent on refinement and checklists before the first step.
    pub refinement_tokens: i64,
    /// The tenant of the key that created it.
    pub tenant: String,
}

/// The settings the loop re-reads after each committed iteration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SessionSettings {
    /// Mode in force.
    pub mode: Mode,
    /// Limits in force.
    pub limits: Limits,
}

/// The durable control flags and settings, as seen by the loop.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ControlFlags {
    /// Stop requested by a user.
    pub stop_requested: bool,
    /// Pause requested by a user.
    pub pause_requested: bool,
    /// Current settings.
    pub settings: SessionSettings,
    /// The session's latest event sequence number after the write.
    pub last_event_seq: i64,
    /// The session row's `updated_at` after the write.
    pub updated_at: DateTime<Utc>,
}

/// Position in the session list: the last row of the previous page, in
/// the order the list is read in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionCursor {
    /// Its sort key: creation or last update time, as the order names.
    pub at: DateTime<Utc>,
    /// Its id (tie-breaker).
    pub id: Uuid,
    /// Its cost, the sort key of the order by cost (0 in the others).
    pub cost: Decimal,
}

/// Which sessions a list or a count covers; every field narrows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionFilter {
    /// In this status.
    pub status: Option<Status>,
    /// In this mode.
    pub mode: Option<Mode>,
    /// With an executor of this kind (`scripted`, `llm`, `webhook`, `worker`).
    pub executor_kind: Option<&'static str>,
    /// Whose goal contains this text, any case.
    pub goal_contains: Option<String>,
    /// Created at or after this time.
    pub created_from: Option<DateTime<Utc>>,
    /// Created before this time.
    pub created_before: Option<DateTime<Utc>>,
    /// Only top-level sessions (no child sessions).
    pub root_only: bool,
    /// Whose steps cost at least this much, USD (lists only).
    pub min_cost_usd: Option<Decimal>,
}

impl SessionFilter {
    /// Whether counts by status under this filter are the counts of every
    /// session in scope: nothing but `status` (which counts by status set
    /// aside) and `min_cost_usd` (lists only) is set.
    pub fn counts_every_session(&self) -> bool {
        self.mode.is_none()
            && self.executor_kind.is_none()
            && self.goal_contains.is_none()
            && self.created_from.is_none()
            && self.created_before.is_none()
            && !self.root_only
    }
}

/// The time a session list is ordered by.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SessionSortKey {
    /// Creation time.
    #[default]
    Created,
    /// Last update time.
    Updated,
    /// What its steps cost (`cost_usd`).
    Cost,
}

/// The order of a session list: a time, then the id, both one way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionOrder {
    /// What it is ordered by.
    pub key: SessionSortKey,
    /// Newest first when true.
    pub descending: bool,
}

impl Default for SessionOrder {
    fn default() -> SessionOrder {
        SessionOrder {
            key: SessionSortKey::Created,
            descending: true,
        }
    }
}

impl SessionOrder {
    /// The cursor that continues after `session` in this order.
    pub fn cursor_of(self, session: &Session) -> SessionCursor {
        let at = match self.key {
            SessionSortKey::Created | SessionSortKey::Cost => session.created_at,
            SessionSortKey::Updated => session.updated_at,
        };
        let cost = match self.key {
            SessionSortKey::Cost => session.cost_usd,
            _ => Decimal::ZERO,
        };
        SessionCursor {
            at,
            id: session.id,
            cost,
        }
    }
}

/// `text` as an ILIKE pattern matching it anywhere: its own `%`, `_` and
/// `\` are escaped so they match themselves.
pub fn contains_pattern(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('%');
    for c in text.chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('%');
    out
}

/// The flags and settings a fenced update of a running session returns.
pub(super) struct ControlRow {
    pub stop_requested: bool,
    pub pause_requested: bool,
    pub mode: Mode,
    pub limits: Json<Limits>,
    pub last_event_seq: i64,
    pub updated_at: DateTime<Utc>,
}

impl From<ControlRow> for ControlFlags {
    fn from(r: ControlRow) -> ControlFlags {
        ControlFlags {
            stop_requested: r.stop_requested,
            pause_requested: r.pause_requested,
            settings: SessionSettings {
                mode: r.mode,
                limits: r.limits.0,
            },
            last_event_seq: r.last_event_seq,
            updated_at: r.updated_at,
        }
    }
}

/// A refinement as stored.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct RefinementRecord {
    /// Number, from 1.
    pub number: i32,
    /// `suggested`, `accept_suggestion`, `custom`, `proceed_with_time_limit`, `auto`, `resume`.
    pub kind: String,
    /// Goal before.
    pub goal_before: String,
    /// Goal after.
    pub goal_after: String,
    /// Details (patterns, confidence, limits): their shape depends on
    /// `kind`, and they are shown to clients as stored.
    pub data: Value,
    /// When.
    pub created_at: DateTime<Utc>,
}

/// An iteration about to be committed.
#[derive(Debug, Clone)]
pub struct NewIteration {
    /// Number, 1-based and gap-free per session.
    pub number: i64,
    /// Run it belongs to.
    pub run: i32,
    /// Action name.
    pub action: String,
    /// `success`, `failure` or `error`.
    pub outcome: &'static str,
    /// Tokens used.
    pub tokens: i64,
    /// Wall time, ms.
    pub duration_ms: i64,
    /// The full step record.
    pub record: JsonText,
    /// What the policies concluded from it.
    pub effects: JsonText,
    /// The step's conversation (model executors).
    pub transcript: Option<JsonText>,
    /// Context cycle it ran in.
    pub cycle: i32,
    /// The cycle and memory the session moves to after this step, when it changes.
    pub next_cycle: Option<(i32, String)>,
    /// An interval checkpoint of the loop state after this step, committed
    /// in the iteration's own transaction (one flush, not two).
    pub checkpoint: Option<JsonText>,
    /// Start time.
    pub started_at: DateTime<Utc>,
    /// End time.
    pub finished_at: DateTime<Utc>,
    /// The usage it was priced from (`StepUsage` as JSON).
    pub usage: Option<JsonText>,
    /// What it cost, USD; `None`: unpriced (tokens no price entry names).
    pub cost_usd: Option<Decimal>,
    /// The price entry that priced it.
    pub price_pattern: Option<String>,
    /// That entry's first day.
    pub price_valid_from: Option<NaiveDate>,
}

/// An iteration as stored.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct IterationRecord {
    /// Number.
    pub number: i64,
    /// Run.
    pub run: i32,
    /// Action name.
    pub action: String,
    /// Outcome.
    pub outcome: String,
    /// Tokens.
    pub tokens: i64,
    /// Wall time, ms.
    pub duration_ms: i64,
    /// Step record.
    pub record: Json<StepRecord>,
    /// What the policies concluded from the step.
    pub effects: Json<StepEffects>,
    /// Start.
    pub started_at: DateTime<Utc>,
    /// End.
    pub finished_at: DateTime<Utc>,
    /// The usage it was priced from (none before migration 0031).
    pub usage: Option<Json<StepUsage>>,
    /// What it cost, USD (none: unpriced, or committed before 0031).
    pub cost_usd: Option<Decimal>,
    /// The price entry that priced it.
    pub price_pattern: Option<String>,
    /// That entry's first day.
    pub price_valid_from: Option<NaiveDate>,
}

/// A checkpoint as stored.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct CheckpointRecord {
    /// Id, increasing.
    pub id: i64,
    /// Last iteration it covers.
    pub iteration: i64,
    /// Why it was taken.
    pub reason: String,
    /// Loop state snapshot.
    pub state: Json<LoopState>,
    /// When.
    pub created_at: DateTime<Utc>,
}

/// A reflection about to be stored: what the session and its event show
/// of it, and the model's raw answer, kept in its row only.
#[derive(Debug, Clone)]
pub struct NewReflection {
    /// Number, trigger, assessment, decision, next interval, tokens.
    pub summary: ReflectionSummary,
    /// The model's raw answer.
    pub raw: Option<String>,
}

/// A stored reflection.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ReflectionRecord {
    /// Number.
    pub number: i32,
    /// Iteration it followed.
    pub after_iteration: i64,
    /// Trigger.
    pub trigger: String,
    /// Valid answer?
    pub ok: bool,
    /// Assessment.
    pub assessment: Option<Json<Assessment>>,
    /// Failure.
    pub error: Option<String>,
    /// Decision.
    pub decision: Json<AppliedReflection>,
    /// Next interval.
    pub next_interval: i32,
    /// Tokens.
    pub tokens: i64,
    /// Raw answer.
    pub raw: Option<String>,
    /// When.
    pub created_at: DateTime<Utc>,
}

/// One task of the agent's own task queue (not a worker task).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow, ToSchema)]
pub struct AgentTask {
    /// Id within the session, from 1.
    pub id: i32,
    /// What to do.
    pub title: String,
    /// `pending`, `in_progress`, `done` or `blocked`.
    pub status: String,
    /// Notes.
    pub notes: String,
    /// Higher first.
    pub priority: i32,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}

/// A change to the queue: a new task (no id) or an update of given fields.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct AgentTaskWrite {
    /// The task to update; absent for a new task.
    #[serde(default)]
    pub id: Option<i32>,
    /// Title (required for a new task).
    #[serde(default)]
    pub title: Option<String>,
    /// New status.
    #[serde(default)]
    pub status: Option<String>,
    /// New notes.
    #[serde(default)]
    pub notes: Option<String>,
    /// New priority.
    #[serde(default)]
    pub priority: Option<i32>,
}

/// Statuses a task may have.
pub const TASK_STATUSES: [&str; 4] = ["pending", "in_progress", "done", "blocked"];

/// How sessions turned out.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Outcomes {
    /// Sessions by status.
    pub by_status: BTreeMap<String, i64>,
    /// Waiting or ended sessions by reason.
    pub by_reason: BTreeMap<String, i64>,
    /// Average iterations of completed sessions.
    pub average_iterations_to_completion: Option<f64>,
    /// Sessions that ever completed.
    pub ever_completed: i64,
    /// Sessions reopened by a user after completing.
    pub reopened_after_completion: i64,
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    #[test]
    fn counters_become_columns_saturating_at_their_range() {
        use crate::policy::guardrails::Usage;
        let huge = super::Counters {
            usage: Usage {
                iterations: u64::MAX,
                tokens: u64::MAX,
                tool_calls: 3,
                consecutive_errors: u32::MAX,
                elapsed_ms: 5,
                ..Usage::default()
            },
            reflection_tokens: u64::MAX,
            charges_seen: 7,
        };
        assert_eq!(huge.iterations(), i64::MAX);
        assert_eq!(huge.tokens_used(), i64::MAX);
        assert_eq!(huge.tool_calls(), 3);
        assert_eq!(huge.consecutive_errors(), i32::MAX);
        assert_eq!(huge.elapsed_ms(), 5);
        assert_eq!(huge.reflection_tokens(), i64::MAX);
        assert_eq!(huge.charges_seen(), 7);
    }

    #[test]
    fn a_contains_pattern_matches_wildcards_as_themselves() {
        assert_eq!(super::contains_pattern("report"), "%report%");
        assert_eq!(super::contains_pattern("100%_a\\b"), "%100\\%\\_a\\\\b%");
        assert_eq!(super::contains_pattern(""), "%%");
        assert_eq!(super::contains_pattern("é"), "%é%");
    }

    use crate::policy::lifecycle::{Mode, Reason, Status};

    /// Every lifecycle value binds as a name the schema's CHECK constraints
    /// accept and reads back as itself. (Runtime queries: test code is not
    /// part of the offline query data.)
    #[tokio::test]
    async fn lifecycle_enums_round_trip_through_the_schema() {
        let db = crate::store::testing::TestDb::new().await;
        let pool = db.pool.clone();
        let modes = [Mode::Fixed, Mode::Continuous];
        for (i, reason) in Reason::ALL.into_iter().enumerate() {
            let (mode, status) = (modes[i % modes.len()], Status::ALL[i % Status::ALL.len()]);
            let id = Uuid::new_v4();
            sqlx::query(
                "INSERT INTO sessions (id, goal, mode, status, reason, limits, executor)
                 VALUES ($1, 'goal', $2, $3, $4, '{}', '{}')",
            )
            .bind(id)
            .bind(mode)
            .bind(status)
            .bind(reason)
            .execute(&pool)
            .await
            .unwrap();
            let back: (Mode, Status, Option<Reason>) =
                sqlx::query_as("SELECT mode, status, reason FROM sessions WHERE id = $1")
                    .bind(id)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            assert_eq!(back, (mode, status, Some(reason)));
        }
    }

    #[tokio::test]
    async fn an_unknown_name_does_not_decode() {
        let db = crate::store::testing::TestDb::new().await;
        let pool = db.pool.clone();
        let status = sqlx::query_scalar::<_, Status>("SELECT 'runing'::text")
            .fetch_one(&pool)
            .await;
        assert!(status.is_err());
        let mode = sqlx::query_scalar::<_, Mode>("SELECT 'Fixed'::text")
            .fetch_one(&pool)
            .await;
        assert!(mode.is_err());
    }
}

/// What rebuilding a session's loop state reads: its latest checkpoint, the
/// iterations after it and the reflections that followed them.
#[derive(Debug, Clone, Default)]
pub struct RebuildInputs {
    /// Latest checkpoint.
    pub checkpoint: Option<CheckpointRecord>,
    /// Iterations committed after it, in order.
    pub iterations: Vec<IterationRecord>,
    /// Reflections from the checkpoint's iteration on, in order (one at
    /// that iteration may postdate the checkpoint that rode with its step).
    pub reflections: Vec<ReflectionRecord>,
    /// The sum of the session's charges from outside its loop.
    pub tokens_charged: u64,
}

/// An attempt at running a session, as counted when a rescue took it over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// Consecutive rescues without progress, this one included.
    pub attempts: i32,
    /// The error the previous attempt ended on, when it could record one.
    pub last_error: Option<String>,
}
