//! Sessions: the use cases the HTTP layer calls (`api`) and the runtime
//! that runs the loops of this replica (`runtime`).
//!
//! Inside, dependencies point one way: `api` → `runtime` → (`archive`,
//! `retention`, `persist`, `event_codec`, `error`); a use case starts,
//! signals and reads loops through the runtime's `Supervisor`, and the
//! runtime never names a use case. The HTTP layer acts through the use
//! cases of `api`, never through the store.

pub mod api;
pub mod archive;
mod error;
pub mod event_codec;
mod persist;
pub mod retention;
pub mod runtime;
pub mod sweep;

pub use api::{
    ApplyThreshold, CreateSession, Created, IdempotencyKey, LoggedEvent, MAX_GOAL_CHARS,
    MAX_GUIDANCE_CHARS, RefinementChoice, ResumeSession, SessionReads, SessionService,
    StatusSource, StopAnswer, StopLandings, ThresholdChange, UpdateSession,
};
pub use api::{
    ClaimedStep, WorkerProtocol, approvals, confirm, estimate, notify, replay, tree, workers,
};
pub use error::{Result, ServiceError};
pub use persist::{
    RESEAL_BATCH, Resealed, reseal_in_background, reseal_under_current, seal_plaintext_keys,
};
pub use runtime::Supervisor;
// The use cases under the path the HTTP layer named before the split.
pub use api as service;
// The runtime's modules under the paths they had before the split.
pub use runtime::{live, loop_store, pruner, reflector, rehydrate, runner, storable};

// The store's row and scope types the HTTP layer shapes its answers from,
// and what it needs to map errors and record the actor: it names them here,
// never `crate::store` (handlers call use cases, not the store).
pub use crate::store::{
    ACTOR, AgentTask, ApprovalCursor, ApprovalRow, CheckpointRecord, ChildAttention, ForkRow,
    IterationRecord, KeyRecord, LeaseCheck, NewDecision, NotificationRow, NotifyTarget, Outcomes,
    RefinementRecord, ReflectionRecord, ReflectionSummary, Session, SessionCursor, SessionFilter,
    SessionOrder, SessionSortKey, Settlement, StoreError, TenantScope, TreeRow, WaitingWorkerTask,
    is_unavailable, storable_text,
};
