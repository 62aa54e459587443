//! Sessions at run time: the supervisor that owns this replica's loops, the
//! per-session loop (`runner`), what a loop keeps in memory (`live`,
//! `lease_clock`), how a session is rebuilt to run (`rehydrate`), the store
//! ports the loop writes through (`loop_store`, `journal`), and the pruner.
//!
//! Nothing here names the use cases of `session::api`: they drive the
//! runtime, never the reverse (checked by `src/layers.rs`).

mod journal;
mod lease_clock;
pub mod live;
pub mod loop_store;
pub mod pruner;
pub mod reflector;
pub mod rehydrate;
pub mod runner;
pub mod storable;
mod supervisor;

pub use supervisor::{Done, Slot, Supervisor};
