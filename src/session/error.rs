//! The session layer's one error type, shared by the service, the
//! supervisor and rehydration; mapped once to problem+json at the HTTP edge.

use uuid::Uuid;

use crate::policy::guardrails::{Breach, CarvedBudget, LimitOutOfRange};
use crate::policy::lifecycle::IllegalTransition;
use crate::store::StoreError;

/// Why a session operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// No session has that id.
    #[error("no session with id {0}")]
    NotFound(Uuid),
    /// The state machine refuses the operation.
    #[error(transparent)]
    Conflict(#[from] IllegalTransition),
    /// A resume would stop again at once on an exhausted budget.
    #[error("cannot resume: {field} is exhausted ({used} used of {limit}); raise it in \"limits\"")]
    LimitExhausted {
        /// The guardrail that would trip.
        breach: Breach,
        /// The limit field to raise.
        field: &'static str,
        /// Amount used.
        used: String,
        /// Current limit.
        limit: String,
    },
    /// A valid money budget this server cannot keep: it prices nothing.
    #[error("{0}")]
    Unpriced(String),
    /// The request is well-formed JSON but its content is not acceptable.
    #[error("{0}")]
    Invalid(String),
    /// A client-chosen URL is refused by the outbound-request policy: a
    /// server-side decision no schema can express, so not a 422.
    #[error("{0}")]
    EgressDenied(String),
    /// A quota would be exceeded; `code` names it.
    #[error("{detail}")]
    Quota {
        /// Stable code, e.g. `tenant_running_limit`.
        code: &'static str,
        /// What the limit is and which setting raises it.
        detail: String,
    },
    /// A session's sealed secret could not be sealed or opened.
    #[error(transparent)]
    Secret(#[from] crate::secrets::SecretsError),
    /// Storage failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The `Idempotency-Key` of a create was used already (within the
    /// tenant, in the last 24 hours).
    #[error("this Idempotency-Key was used already, by the create of session {session_id}")]
    KeyUsed {
        /// The session the first request with that key created.
        session_id: Uuid,
        /// Whether that request had the same body.
        same_request: bool,
    },
    /// An archive file could not be written or read.
    #[error("archive: {0}")]
    Archive(String),
    /// No call of that name waits in that session (or the session is not
    /// the caller's): answered exactly like a missing session.
    #[error("session {session_id} has no call {call_id} waiting for approval")]
    ApprovalNotFound {
        /// The session.
        session_id: Uuid,
        /// The call named.
        call_id: String,
    },
    /// The call was decided already; a decision is never changed.
    #[error("call {call_id} was decided already ({decision})")]
    AlreadyDecided {
        /// The call.
        call_id: String,
        /// The earlier decision.
        decision: &'static str,
    },
    /// A resume while calls still wait for a decision.
    #[error(
        "{waiting} call(s) wait for approval; approve or reject them with POST /api/autonomous/{session_id}/approvals/{{call_id}} and the session continues"
    )]
    ApprovalsWaiting {
        /// The session.
        session_id: Uuid,
        /// How many.
        waiting: i64,
    },
    /// A child's carved budget was asked to change on the child itself.
    #[error(transparent)]
    CarvedBudget(#[from] CarvedBudget),
    /// The session needs capabilities no live replica of the fleet has
    /// (an upgrade in progress, or switched off): nothing was written.
    #[error(
        "this session needs {} and no live replica runs that yet (a rolling upgrade in progress, \
or WARDEN_CAPABILITIES_OFF); retry once the fleet runs a release that has it",
        needs.join(", ")
    )]
    CapabilityUnavailable {
        /// The capabilities it needs that no live replica has.
        needs: Vec<String>,
    },
    /// The service is shutting down or could not start the loop.
    #[error("{0}")]
    Unavailable(String),
    /// Something a session's history does not hold (a snapshot, a file):
    /// the session itself exists and is the caller's.
    #[error("{0}")]
    Missing(String),
    /// A workspace path that could leave the workspace or is malformed.
    #[error("{0}")]
    BadPath(String),
    /// A fork the source cannot give: it has no such checkpoint (yet), the
    /// checkpoint has no workspace snapshot, or a new model is asked for an
    /// executor that names none.
    #[error("{0}")]
    NotForkable(String),
    /// A threshold applied to a tenant is in force already: no change to
    /// log.
    #[error("{0}")]
    ThresholdUnchanged(String),
}

impl From<LimitOutOfRange> for ServiceError {
    fn from(err: LimitOutOfRange) -> Self {
        ServiceError::Invalid(format!("limits.{err}"))
    }
}

/// Shorthand for service results.
pub type Result<T, E = ServiceError> = std::result::Result<T, E>;
