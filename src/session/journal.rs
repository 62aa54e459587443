//! The tool-call journal of one session, backed by Postgres and fenced by
//! the session's lease.

use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::Value;

use crate::executor::ToolJournal;
use crate::store::{Lease, Store};

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

impl ToolJournal for StoreJournal {
    fn recorded<'a>(
        &'a self,
        iteration: u64,
        call: u32,
        tool: &'a str,
        arguments: &'a Value,
    ) -> BoxFuture<'a, Result<Option<Value>, String>> {
        async move {
            self.store
                .journaled_result(&self.lease, number(iteration), index(call), tool, arguments)
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
            self.store
                .journal_intent(&self.lease, number(iteration), index(call), tool, arguments)
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
            self.store
                .journal_result(&self.lease, number(iteration), index(call), result)
                .await
                .map_err(|e| e.to_string())
        }
        .boxed()
    }
}
