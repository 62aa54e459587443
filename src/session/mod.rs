//! Sessions at run time: the per-session loop, the supervisor that owns the
//! loops of this replica, and the operations the HTTP layer calls.

pub mod control;
mod journal;
mod lease_clock;
mod planner;
pub mod reflector;
pub mod runner;
pub mod service;
pub mod state;
mod supervisor;

pub use service::{
    CreateSession, RefinementChoice, ResumeSession, ServiceError, SessionService, UpdateSession,
};
pub use supervisor::{CONTROL_CHANNEL, Supervisor};
