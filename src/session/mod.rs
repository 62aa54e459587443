//! Sessions at run time: the per-session loop, the supervisor that owns the
//! loops of this replica, and the operations the HTTP layer calls.

mod journal;
mod lease_clock;
pub mod reflector;
pub mod runner;
pub mod service;
pub mod state;
mod supervisor;

pub use service::{CreateSession, ResumeSession, ServiceError, SessionService, UpdateSession};
pub use supervisor::{CONTROL_CHANNEL, Supervisor};
