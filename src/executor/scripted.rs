//! The scripted executor: performs steps listed in the create request, so
//! every path of the loop can be exercised without a model.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;

use super::{ChildDesk, Executor, ExecutorError, StepContext, StepOutput, StepResult};
use crate::policy::history::{FileWrite, Outcome};
use crate::policy::sentinel::{Sentinel, SignalKind};
use crate::spec::{ScriptedDelegation, ScriptedStep};

/// Longest delay one scripted step may ask for (one hour).
pub const MAX_DELAY_MS: u64 = 3_600_000;
/// Longest action name, in characters (as JSON Schema's `maxLength` counts).
pub const MAX_ACTION_CHARS: usize = 200;
/// Longest step output, in characters.
pub const MAX_OUTPUT_CHARS: usize = 1_000_000;

/// Most named scripts a scripted executor may carry.
pub const MAX_SCRIPTS: usize = 16;
/// A script's name.
pub const SCRIPT_NAME_PATTERN: &str = "^[A-Za-z0-9_-]{1,64}$";

/// Whether `name` is written as [`SCRIPT_NAME_PATTERN`] says.
pub fn valid_script_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl ScriptedStep {
    /// Checks one step; the message starts with the offending field.
    pub fn validate(&self) -> Result<(), String> {
        if crate::policy::text::is_blank(&self.action)
            || self.action.chars().count() > MAX_ACTION_CHARS
        {
            return Err(format!(
                "action must be 1 to {MAX_ACTION_CHARS} characters, not only whitespace"
            ));
        }
        if self.delay_ms > MAX_DELAY_MS {
            return Err(format!(
                "delay_ms must be at most {MAX_DELAY_MS}, got {}",
                self.delay_ms
            ));
        }
        if self.output.chars().count() > MAX_OUTPUT_CHARS {
            return Err(format!(
                "output must be at most {MAX_OUTPUT_CHARS} characters"
            ));
        }
        if self.delegate.len() > crate::policy::delegation::DEFAULT_MAX_CHILDREN as usize {
            return Err(format!(
                "delegate may name at most {} tasks",
                crate::policy::delegation::DEFAULT_MAX_CHILDREN
            ));
        }
        for (i, d) in self.delegate.iter().enumerate() {
            d.request()
                .validate()
                .map_err(|e| format!("delegate[{i}]: {e}"))?;
            if let Some(name) = &d.script
                && !valid_script_name(name)
            {
                return Err(format!(
                    "delegate[{i}].script must be 1 to 64 letters, digits, '_' or '-'"
                ));
            }
        }
        Ok(())
    }
}

/// Performs the steps of a script in order.
#[derive(Clone)]
pub struct ScriptedExecutor {
    steps: Box<[KeptStep]>,
    repeat: bool,
    children: Option<Arc<dyn ChildDesk>>,
    /// The named scripts children run, as given.
    scripts: Arc<BTreeMap<String, Vec<ScriptedStep>>>,
}

/// A step as a running session keeps it. The script stays in memory for the
/// whole run, so it is kept compact: the arguments as JSON text, parsed when
/// the step runs. As a parsed object they took about 700 bytes a step (a
/// map node), most of a waiting session's memory with a 32-step script.
#[derive(Debug, Clone)]
struct KeptStep {
    action: Box<str>,
    arguments: Box<str>,
    outcome: Outcome,
    tokens: u64,
    output: Box<str>,
    delay_ms: u64,
    tool_calls: u64,
    waiting: bool,
    files: Box<[FileWrite]>,
    delegate: Box<[ScriptedDelegation]>,
}

impl From<ScriptedStep> for KeptStep {
    fn from(step: ScriptedStep) -> KeptStep {
        KeptStep {
            action: step.action.into(),
            arguments: step.arguments.to_string().into(),
            outcome: step.outcome,
            tokens: step.tokens,
            output: step.output.into(),
            delay_ms: step.delay_ms,
            tool_calls: step.tool_calls,
            waiting: step.waiting,
            files: step.files.into(),
            delegate: step.delegate.into(),
        }
    }
}

impl ScriptedExecutor {
    /// An executor over `steps`.
    pub fn new(steps: Vec<ScriptedStep>, repeat: bool) -> ScriptedExecutor {
        ScriptedExecutor {
            steps: steps.into_iter().map(KeptStep::from).collect(),
            repeat,
            children: None,
            scripts: Arc::default(),
        }
    }

    /// The same executor, delegating its steps' tasks through `desk`, the
    /// children running `scripts` by name.
    pub fn with_children(
        mut self,
        desk: Arc<dyn ChildDesk>,
        scripts: BTreeMap<String, Vec<ScriptedStep>>,
    ) -> ScriptedExecutor {
        self.children = Some(desk);
        self.scripts = Arc::new(scripts);
        self
    }

    /// Delegates the step's tasks: the step fails if one cannot be made,
    /// and waits when one of them says so.
    async fn delegate(
        &self,
        iteration: u64,
        step: &KeptStep,
    ) -> Result<(Option<Sentinel>, Vec<String>), String> {
        let Some(desk) = &self.children else {
            return Err("this session cannot delegate".into());
        };
        let mut made = Vec::new();
        let mut wait = false;
        for (index, task) in step.delegate.iter().enumerate() {
            let own = match &task.script {
                None => None,
                Some(name) => {
                    let steps = self
                        .scripts
                        .get(name)
                        .ok_or_else(|| format!("no script named {name:?} in executor.scripts"))?;
                    Some(serde_json::json!({ "kind": "scripted", "steps": steps,
                                             "scripts": &*self.scripts }))
                }
            };
            let ticket = desk
                .delegate(iteration, index as u32, &task.request(), step.tokens, own)
                .await?;
            wait |= task.wait;
            made.push(format!(
                "child {} ({} tokens, {} iterations)",
                ticket.child_id, ticket.tokens, ticket.iterations
            ));
        }
        let signal = wait.then(|| Sentinel {
            kind: SignalKind::WaitingForChildren,
            reason: Some(format!("{} delegated task(s)", made.len())),
        });
        Ok((signal, made))
    }

    /// The step for iteration `n`; the position comes from the iteration
    /// number alone, so a resumed session continues exactly where it was.
    fn step_for(&self, n: u64) -> Option<&KeptStep> {
        let index = usize::try_from(n.checked_sub(1)?).ok()?;
        if self.steps.is_empty() {
            None
        } else if self.repeat {
            self.steps.get(index % self.steps.len())
        } else {
            self.steps.get(index)
        }
    }
}

impl Executor for ScriptedExecutor {
    fn execute<'a>(
        &'a mut self,
        ctx: StepContext<'a>,
    ) -> BoxFuture<'a, Result<StepResult, ExecutorError>> {
        async move {
            let Some(step) = self.step_for(ctx.iteration) else {
                return Ok(StepResult::Exhausted);
            };
            if step.delay_ms > 0 {
                tokio::time::sleep(Duration::from_millis(step.delay_ms)).await;
            }
            let percent_complete = (!self.repeat)
                .then(|| ctx.iteration as f64 * 100.0 / self.steps.len() as f64)
                .map(|p| p.min(100.0));
            // Text this executor wrote from a parsed value: it parses back.
            let arguments =
                serde_json::from_str(&step.arguments).map_err(|e| ExecutorError::Failed {
                    action: step.action.to_string(),
                    message: format!("the step's arguments cannot be read back: {e}"),
                    tokens: 0,
                })?;
            let mut observation = step.output.to_string();
            let mut signal = None;
            if !step.delegate.is_empty() {
                let (waits, made) =
                    self.delegate(ctx.iteration, step)
                        .await
                        .map_err(|message| ExecutorError::Failed {
                            action: step.action.to_string(),
                            message: format!("cannot delegate: {message}"),
                            tokens: step.tokens,
                        })?;
                signal = waits;
                observation = format!("{observation}\ndelegated: {}", made.join(", "));
            }
            if !ctx.children.is_empty() {
                observation = format!(
                    "{observation}\n{}",
                    crate::policy::delegation::render_reports(ctx.children)
                );
            }
            let mut output = StepOutput::simple(step.action.to_string(), step.output.to_string());
            output.observation = observation;
            if signal.is_some() {
                // The step's own text may not end the session past its children.
                output.signal = signal;
            }
            Ok(StepResult::Step(Box::new(StepOutput {
                arguments,
                outcome: step.outcome,
                error: (step.outcome != Outcome::Success).then(|| step.output.to_string()),
                tokens: step.tokens,
                tool_calls: step.tool_calls,
                files_written: step.files.to_vec(),
                waiting: step.waiting,
                percent_complete,
                ..output
            })))
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    fn step(action: &str) -> ScriptedStep {
        serde_json::from_value(serde_json::json!({ "action": action })).unwrap()
    }

    async fn run(exec: &mut ScriptedExecutor, n: u64) -> StepResult {
        exec.execute(StepContext {
            session_id: Uuid::nil(),
            goal: "g",
            iteration: n,
            guidance: None,
            nudge: None,
            budget_note: None,
            history: &[],
            token_allowance: 1_000,
            children: &[],
        })
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn steps_run_in_order_then_exhaust() {
        let mut exec = ScriptedExecutor::new(vec![step("a"), step("b")], false);
        let StepResult::Step(first) = run(&mut exec, 1).await else {
            panic!("expected a step")
        };
        assert_eq!(first.action, "a");
        assert_eq!(first.percent_complete, Some(50.0));
        let StepResult::Step(second) = run(&mut exec, 2).await else {
            panic!("expected a step")
        };
        assert_eq!(second.action, "b");
        assert_eq!(run(&mut exec, 3).await, StepResult::Exhausted);
    }

    #[tokio::test]
    async fn repeat_cycles_through_steps() {
        let mut exec = ScriptedExecutor::new(vec![step("a"), step("b")], true);
        let StepResult::Step(third) = run(&mut exec, 3).await else {
            panic!("expected a step")
        };
        assert_eq!(third.action, "a");
        assert_eq!(third.percent_complete, None);
    }

    #[tokio::test]
    async fn a_kept_step_gives_back_its_arguments_and_files_unchanged() {
        let arguments = serde_json::json!({ "path": "a/b.md", "lines": [1, 2.5, null],
                                            "nested": { "z": true, "a": "ü\u{0}" } });
        let spec: ScriptedStep = serde_json::from_value(serde_json::json!({
            "action": "write", "arguments": arguments, "output": "done",
            "files": [{ "path": "a/b.md", "digest": "d1" }]
        }))
        .unwrap();
        let mut exec = ScriptedExecutor::new(vec![spec.clone()], false);
        let StepResult::Step(out) = run(&mut exec, 1).await else {
            panic!("expected a step")
        };
        assert_eq!(out.arguments, arguments);
        assert_eq!(out.files_written, spec.files);
        assert_eq!(out.action, "write");
    }

    #[test]
    fn defaults_and_unknown_fields() {
        let s = step("a");
        assert_eq!(s.outcome, Outcome::Success);
        assert_eq!(s.tokens, 0);
        let bad = serde_json::from_value::<ScriptedStep>(
            serde_json::json!({ "action": "a", "colour": "red" }),
        );
        assert!(bad.unwrap_err().to_string().contains("colour"));
    }

    #[test]
    fn failures_carry_their_output_as_error() {
        let s: ScriptedStep = serde_json::from_value(
            serde_json::json!({ "action": "a", "outcome": "error", "output": "boom" }),
        )
        .unwrap();
        assert_eq!(s.outcome, Outcome::Error);
    }

    #[test]
    fn validation_names_the_field() {
        let mut s = step("a");
        s.delay_ms = MAX_DELAY_MS + 1;
        assert!(s.validate().unwrap_err().starts_with("delay_ms"));
        let empty = step(" ");
        assert!(empty.validate().unwrap_err().starts_with("action"));
    }
}
