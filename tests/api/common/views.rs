//! Typed views of the answers the tests read most: a test reads a counter
//! or a status as a field, so an answer without it fails to deserialize,
//! naming the field, instead of reading as 0 or "".

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// `doc` read as `T`; panics naming what is missing or mistyped, and the
/// document, when it does not read.
pub fn view<T: DeserializeOwned>(doc: &Value) -> T {
    serde_json::from_value(doc.clone()).unwrap_or_else(|e| {
        panic!(
            "the answer does not read as {}: {e}; it was: {doc}",
            std::any::type_name::<T>()
        )
    })
}

/// A session's status document (`GET /api/autonomous/{id}`, the items of
/// the session list): the fields the tests count and compare.
#[derive(Debug, Clone, Deserialize)]
pub struct SessionView {
    pub status: String,
    pub iterations: i64,
    pub tokens_used: i64,
    pub last_event_seq: i64,
    /// Its place in the queue, while it waits for one.
    pub queue_position: Option<i64>,
    /// The soft-budget warnings sent so far, oldest first.
    pub budget_warnings: Vec<BudgetWarningView>,
}

/// A soft-budget warning as a status lists it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct BudgetWarningView {
    pub budget: String,
    pub threshold: u8,
    pub used: String,
    pub limit: String,
    pub iteration: u64,
}

impl SessionView {
    /// Whether it still runs or waits for a place (not yet settled).
    pub fn is_live(&self) -> bool {
        ["running", "queued"].contains(&self.status.as_str())
    }
}

/// One committed iteration (`/iterations`).
#[derive(Debug, Clone, Deserialize)]
pub struct IterationView {
    pub number: i64,
    /// The step record (arguments, output, error, files…): free-form.
    pub record: Value,
}

/// One entry of a session's log (`/events`).
#[derive(Debug, Clone, Deserialize)]
pub struct EventView {
    pub seq: i64,
    pub kind: String,
}

/// A page of any list: its `items` must be there.
#[derive(Debug, Clone, Deserialize)]
pub struct ListView<T> {
    pub items: Vec<T>,
}

/// The problem document every error answers with.
#[derive(Debug, Clone, Deserialize)]
pub struct ProblemView {
    pub code: String,
    pub detail: String,
}

/// `doc` read as a problem document: fails unless it has every field one has.
pub fn problem(doc: &Value) -> ProblemView {
    view(doc)
}
