//! Sessions at run time: the per-session loop, the supervisor that owns the
//! loops of this replica, and the operations the HTTP layer calls.
//!
//! Inside, dependencies point one way: `service` → `supervisor` → `runner`;
//! both `service` and `supervisor` rebuild sessions through `rehydrate`; the
//! HTTP layer reads through `reads` and acts through `service` and the use
//! cases of `tree`, `approvals` and `workers`, never through the store.

pub mod approvals;
pub mod archive;
mod error;
pub mod event_codec;
mod journal;
mod lease_clock;
pub mod live;
pub mod loop_store;
pub mod notify;
mod persist;
mod planner;
pub mod pruner;
pub mod reads;
pub mod reflector;
pub mod rehydrate;
pub mod retention;
pub mod runner;
pub mod service;
pub mod storable;
mod supervisor;
pub mod tree;
pub mod workers;

pub use error::{Result, ServiceError};
pub use persist::{
    RESEAL_BATCH, Resealed, reseal_in_background, reseal_under_current, seal_plaintext_keys,
};
pub use reads::{LoggedEvent, SessionReads};
pub use service::{CreateSession, RefinementChoice, ResumeSession, SessionService, UpdateSession};
pub use supervisor::Supervisor;
pub use workers::{ClaimedStep, WorkerProtocol};

// The store's row and scope types the HTTP layer shapes its answers from,
// and what it needs to map errors and record the actor: it names them here,
// never `crate::store` (handlers call use cases, not the store).
pub use crate::store::{
    ACTOR, ApprovalCursor, ApprovalRow, CheckpointRecord, ChildAttention, IterationRecord,
    KeyRecord, LeaseCheck, NewDecision, NotificationRow, NotifyTarget, Outcomes, RefinementRecord,
    ReflectionRecord, ReflectionSummary, Session, SessionCursor, SessionFilter, SessionOrder,
    SessionSortKey, Settlement, StoreError, Task, TenantScope, TreeRow, is_unavailable,
    storable_text,
};
