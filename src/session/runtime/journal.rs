//! The tool-call journal and the task queue of one session, backed by
//! Postgres and fenced by the session's lease.

use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::Value;

use crate::executor::{
    ApprovalAsk, ApprovalDesk, ChildDesk, ChildTicket, DecidedCall, TaskQueue, ToolJournal,
};
use crate::policy::delegation::{ChildRequest, TreeLimits};
use crate::store::{AgentTask, AgentTaskWrite, DelegateError, Lease, NewApproval, Store};

/// Journals the tool calls of the session `lease` is for.
pub struct StoreJournal {
    store: Store,
    lease: Lease,
}

impl StoreJournal {
    /// A journal writing under `lease`.
    pub fn new(store: Store, lease: Lease) -> StoreJournal {
        StoreJournal { store, lease }
    }
}

fn number(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn index(i: u32) -> i32 {
    i32::try_from(i).unwrap_or(i32::MAX)
}

/// A tool call's name and arguments with NUL characters (which Postgres
/// cannot store) replaced, the same way at record and at lookup.
fn storable(tool: &str, value: &Value) -> (String, Value) {
    let mut tool = tool.to_string();
    let mut value = value.clone();
    super::storable::strip_nul(&mut tool);
    super::storable::strip_nul_value(&mut value);
    (tool, value)
}

impl ToolJournal for StoreJournal {
    fn recorded<'a>(
        &'a self,
        iteration: u64,
        call: u32,
        tool: &'a str,
        arguments: &'a Value,
    ) -> BoxFuture<'a, Result<Option<Value>, String>> {
        async move {
            let (tool, arguments) = storable(tool, arguments);
            self.store
                .journaled_result(
                    &self.lease,
                    number(iteration),
                    index(call),
                    &tool,
                    &arguments,
                )
                .await
                .map_err(|e| e.to_string())
        }
        .boxed()
    }

    fn intent<'a>(
        &'a self,
        iteration: u64,
        call: u32,
        tool: &'a str,
        arguments: &'a Value,
    ) -> BoxFuture<'a, Result<(), String>> {
        async move {
            let (tool, arguments) = storable(tool, arguments);
            self.store
                .journal_intent(
                    &self.lease,
                    number(iteration),
                    index(call),
                    &tool,
                    &arguments,
                )
                .await
                .map_err(|e| e.to_string())
        }
        .boxed()
    }

    fn result<'a>(
        &'a self,
        iteration: u64,
        call: u32,
        result: &'a Value,
    ) -> BoxFuture<'a, Result<(), String>> {
        async move {
            let (_, result) = storable("", result);
            self.store
                .journal_result(&self.lease, number(iteration), index(call), &result)
                .await
                .map_err(|e| e.to_string())
        }
        .boxed()
    }
}

/// Asks for approvals of the session `lease` is for, and reads the decisions.
pub struct StoreApprovalDesk {
    store: Store,
    lease: Lease,
    timeout_ms: u64,
}

impl StoreApprovalDesk {
    /// A desk writing under `lease`; asked calls expire after `timeout`.
    pub fn new(store: Store, lease: Lease, timeout: std::time::Duration) -> StoreApprovalDesk {
        StoreApprovalDesk {
            store,
            lease,
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        }
    }
}

impl ApprovalDesk for StoreApprovalDesk {
    fn ask<'a>(
        &'a self,
        iteration: u64,
        ask: &'a ApprovalAsk,
    ) -> BoxFuture<'a, Result<(), String>> {
        async move {
            let (mut tool, arguments) = storable(&ask.tool, &ask.arguments);
            let mut reason = ask.reason.clone();
            let mut tool_call_id = ask.tool_call_id.clone();
            for text in [&mut tool, &mut reason]
                .into_iter()
                .chain(tool_call_id.as_mut())
            {
                super::storable::strip_nul(text);
            }
            let new = NewApproval {
                iteration: number(iteration),
                call_index: index(ask.call_index),
                tool_call_id,
                tool,
                arguments,
                reason,
                timeout_ms: self.timeout_ms,
            };
            self.store
                .request_approval(&self.lease, &new)
                .await
                .map_err(|e| e.to_string())
        }
        .boxed()
    }

    fn decided(&self, iteration: u64) -> BoxFuture<'_, Result<Vec<DecidedCall>, String>> {
        async move {
            let rows = self
                .store
                .decided_calls(&self.lease, number(iteration))
                .await
                .map_err(|e| e.to_string())?;
            Ok(rows
                .into_iter()
                .filter_map(|a| {
                    Some(DecidedCall {
                        call_index: u32::try_from(a.call_index).ok()?,
                        tool_call_id: a.tool_call_id,
                        tool: a.tool,
                        edited: a.edited_arguments.is_some(),
                        arguments: a.edited_arguments.unwrap_or(a.arguments),
                        decision: a.decision?,
                        message: a.message,
                    })
                })
                .collect())
        }
        .boxed()
    }
}

/// The task queue of the session `lease` is for.
pub struct StoreTaskQueue {
    store: Store,
    lease: Lease,
}

impl StoreTaskQueue {
    /// A queue written under `lease`.
    pub fn new(store: Store, lease: Lease) -> StoreTaskQueue {
        StoreTaskQueue { store, lease }
    }
}

impl TaskQueue for StoreTaskQueue {
    fn read(&self) -> BoxFuture<'_, Result<Vec<AgentTask>, String>> {
        async move {
            self.store
                // Read under the lease: this replica runs the session.
                .tasks(self.lease.session_id, &crate::store::TenantScope::Global)
                .await
                .map_err(|e| e.to_string())
        }
        .boxed()
    }

    fn write<'a>(
        &'a self,
        writes: &'a [AgentTaskWrite],
    ) -> BoxFuture<'a, Result<Vec<AgentTask>, String>> {
        async move {
            // The model's text, made storable like every agent output.
            let mut writes = writes.to_vec();
            for w in &mut writes {
                for text in [&mut w.title, &mut w.status, &mut w.notes]
                    .into_iter()
                    .flatten()
                {
                    super::storable::strip_nul(text);
                }
            }
            match self.store.write_tasks(&self.lease, &writes).await {
                Ok(result) => result,
                Err(e) => Err(e.to_string()),
            }
        }
        .boxed()
    }
}

/// Delegates the tasks of the session `lease` is for to child sessions.
pub struct StoreChildDesk {
    store: Store,
    lease: Lease,
    tree: TreeLimits,
    /// Called when a child was made: the runner reads its children's ends
    /// from then on, and this replica's queue claim starts the child at once.
    on_delegated: Arc<dyn Fn() + Send + Sync>,
}

impl StoreChildDesk {
    /// A desk writing under `lease`, with the server's tree limits.
    pub fn new(
        store: Store,
        lease: Lease,
        tree: TreeLimits,
        on_delegated: Arc<dyn Fn() + Send + Sync>,
    ) -> StoreChildDesk {
        StoreChildDesk {
            store,
            lease,
            tree,
            on_delegated,
        }
    }
}

impl ChildDesk for StoreChildDesk {
    fn delegate<'a>(
        &'a self,
        iteration: u64,
        index: u32,
        request: &'a ChildRequest,
        pending_tokens: u64,
        executor: Option<serde_json::Value>,
    ) -> BoxFuture<'a, Result<ChildTicket, String>> {
        async move {
            let call = format!("{iteration}.{index}");
            let made = self
                .store
                .delegate_child(
                    self.lease,
                    pending_tokens,
                    &call,
                    request,
                    executor.as_ref(),
                    self.tree,
                )
                .await
                .map_err(|e| match e {
                    DelegateError::Refused(refused) => refused.to_string(),
                    DelegateError::Store(err) => format!("the child could not be stored: {err}"),
                })?;
            if !made.existed {
                (self.on_delegated)();
            }
            Ok(ChildTicket {
                child_id: made.child_id,
                tokens: made.tokens,
                iterations: made.iterations,
            })
        }
        .boxed()
    }
}
