//! Executors: how one iteration of work gets done. The session loop only sees
//! the `Executor` trait; a scripted list of steps, an OpenAI-compatible model
//! or a webhook to an external agent plug in behind it.

mod scripted;

pub use scripted::{ScriptedExecutor, ScriptedStep};

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::policy::history::{FileWrite, Outcome, StepRecord};

/// What an executor is told about the step it is asked to do.
#[derive(Debug, Clone, Copy)]
pub struct StepContext<'a> {
    /// Session.
    pub session_id: Uuid,
    /// The goal.
    pub goal: &'a str,
    /// Number of the iteration to perform (1-based).
    pub iteration: u64,
    /// Guidance a person gave on resume, delivered once.
    pub guidance: Option<&'a str>,
    /// A nudge from stuck detection, delivered once.
    pub nudge: Option<&'a str>,
    /// Recent committed steps, oldest first.
    pub history: &'a [StepRecord],
}

/// What one step produced.
#[derive(Debug, Clone, PartialEq)]
pub struct StepOutput {
    /// Action name.
    pub action: String,
    /// Action arguments.
    pub arguments: serde_json::Value,
    /// How it ended.
    pub outcome: Outcome,
    /// What the world answered.
    pub observation: String,
    /// The agent's own message (checked for stop sentinels).
    pub message: String,
    /// Error text for failures and errors.
    pub error: Option<String>,
    /// Tokens consumed.
    pub tokens: u64,
    /// Tool calls made.
    pub tool_calls: u64,
    /// Files written.
    pub files_written: Vec<FileWrite>,
    /// The step is waiting on something long-running.
    pub waiting: bool,
    /// Progress estimate reported by the executor, percent.
    pub percent_complete: Option<f64>,
}

/// The result of asking an executor for a step.
#[derive(Debug, Clone, PartialEq)]
pub enum StepResult {
    /// A step was performed.
    Step(StepOutput),
    /// The executor has nothing more to do (a script ran out).
    Exhausted,
}

/// An executor could not perform the step; the loop records an `error` iteration.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ExecutorError {
    /// The step failed in a way the executor could describe.
    #[error("{action}: {message}")]
    Failed {
        /// Action attempted.
        action: String,
        /// What went wrong.
        message: String,
    },
}

/// Performs iterations for one session.
pub trait Executor: Send {
    /// Performs iteration `ctx.iteration`. Dropping the future cancels the step.
    fn execute<'a>(
        &'a mut self,
        ctx: StepContext<'a>,
    ) -> BoxFuture<'a, Result<StepResult, ExecutorError>>;
}

/// How a session's iterations are performed, as given in the create request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ExecutorSpec {
    /// Steps given in the request: for demos, tests and dry runs of policy.
    Scripted {
        /// The steps, performed in order.
        steps: Vec<ScriptedStep>,
        /// Start again from the first step when the list runs out.
        #[serde(default)]
        repeat: bool,
    },
}

/// Most scripted steps one session may carry.
pub const MAX_SCRIPTED_STEPS: usize = 10_000;

impl ExecutorSpec {
    /// Checks the specification; the message names the offending field.
    pub fn validate(&self) -> Result<(), String> {
        match self {
            ExecutorSpec::Scripted { steps, .. } => {
                if steps.is_empty() {
                    return Err("executor.steps must contain at least one step".into());
                }
                if steps.len() > MAX_SCRIPTED_STEPS {
                    return Err(format!(
                        "executor.steps may contain at most {MAX_SCRIPTED_STEPS} steps, got {}",
                        steps.len()
                    ));
                }
                for (i, step) in steps.iter().enumerate() {
                    step.validate()
                        .map_err(|e| format!("executor.steps[{i}].{e}"))?;
                }
                Ok(())
            }
        }
    }

    /// The executor's kind name.
    pub fn kind(&self) -> &'static str {
        match self {
            ExecutorSpec::Scripted { .. } => "scripted",
        }
    }

    /// Builds the executor for a session.
    pub fn build(&self) -> Box<dyn Executor> {
        match self {
            ExecutorSpec::Scripted { steps, repeat } => {
                Box::new(ScriptedExecutor::new(steps.clone(), *repeat))
            }
        }
    }
}
