//! Pure policy: every decision Warden takes about a session, as functions of
//! their inputs. Nothing here performs I/O or reads a clock, so each rule can
//! be tested exhaustively and replayed from stored data.

pub mod admission;
pub mod ambiguity;
pub mod approval;
pub mod budget;
pub mod capabilities;
pub mod checklist;
pub mod confirm;
pub mod delegation;
pub mod estimate;
pub mod eta;
pub mod excerpt;
pub mod fair_share;
pub mod fleet;
pub mod gate;
pub mod guardrails;
pub mod history;
pub mod insights;
pub mod lifecycle;
pub mod loop_state;
pub mod notify;
pub mod pricing;
pub mod projection;
pub mod reflection;
pub mod reflection_interval;
pub mod replay;
pub mod retention;
pub mod sentinel;
pub mod snapshot;
pub mod soft_budget;
pub mod stuck;
pub mod termination;
pub mod text;
#[cfg(test)]
mod tree_property;
pub mod worker;
