//! What a policy replay reads of ended sessions: every committed step and
//! every reflection, from the first, for a batch of sessions at once, only
//! of those the caller's scope reaches.

use std::collections::HashMap;

use rust_decimal::Decimal;
use sqlx::types::Json;
use uuid::Uuid;

use super::{Result, Store, TenantScope};
use crate::policy::history::StepRecord;
use crate::policy::loop_state::StepEffects;
use crate::policy::pricing::StepUsage;
use crate::policy::reflection::Assessment;

/// A committed step as a replay reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayStep {
    /// Its run.
    pub run: i32,
    /// What it did.
    pub record: StepRecord,
    /// What the policies concluded from it.
    pub effects: StepEffects,
    /// Its cost; `None` when unpriced.
    pub cost_usd: Option<Decimal>,
    /// The tokens its usage reported (0 for none).
    pub usage_tokens: u64,
}

/// A reflection as a replay reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayReflection {
    /// The iteration it followed.
    pub after_iteration: i64,
    /// Its assessment; `None` when it failed.
    pub assessment: Option<Assessment>,
    /// Why it failed.
    pub error: Option<String>,
    /// Tokens it spent.
    pub tokens: i64,
}

/// The recorded steps and reflections of some sessions.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReplayRows {
    /// Steps per session, in order.
    pub steps: HashMap<Uuid, Vec<ReplayStep>>,
    /// Reflections per session, in order.
    pub reflections: HashMap<Uuid, Vec<ReplayReflection>>,
    /// Tokens charged outside each session's loop.
    pub tokens_charged: HashMap<Uuid, i64>,
}

impl Store {
    /// The steps and reflections of the sessions of `ids` that `scope`
    /// reaches (another tenant's read as none).
    pub async fn replay_rows(&self, ids: &[Uuid], scope: &TenantScope) -> Result<ReplayRows> {
        let mut rows = ReplayRows::default();
        let steps = sqlx::query!(
            r#"SELECT i.session_id, i.run, i.record AS "record!: Json<StepRecord>",
                      i.effects AS "effects!: Json<StepEffects>", i.cost_usd,
                      i.usage AS "usage: Json<StepUsage>"
               FROM iterations i JOIN sessions s ON s.id = i.session_id
               WHERE i.session_id = ANY($1) AND ($2::text IS NULL OR s.tenant = $2)
               ORDER BY i.session_id, i.number"#,
            ids,
            scope.tenant(),
        )
        .fetch_all(self.pool())
        .await?;
        for r in steps {
            rows.steps
                .entry(r.session_id)
                .or_default()
                .push(ReplayStep {
                    run: r.run,
                    record: r.record.0,
                    effects: r.effects.0,
                    cost_usd: r.cost_usd,
                    usage_tokens: r.usage.map_or(0, |u| u.total()),
                });
        }
        let reflections = sqlx::query!(
            r#"SELECT r.session_id, r.after_iteration, r.assessment AS "assessment: Json<Assessment>",
                      r.error, r.tokens
               FROM reflections r JOIN sessions s ON s.id = r.session_id
               WHERE r.session_id = ANY($1) AND ($2::text IS NULL OR s.tenant = $2)
               ORDER BY r.session_id, r.number"#,
            ids,
            scope.tenant(),
        )
        .fetch_all(self.pool())
        .await?;
        for r in reflections {
            rows.reflections
                .entry(r.session_id)
                .or_default()
                .push(ReplayReflection {
                    after_iteration: r.after_iteration,
                    assessment: r.assessment.map(|a| a.0),
                    error: r.error,
                    tokens: r.tokens,
                });
        }
        let charged = sqlx::query!(
            r#"SELECT id, tokens_charged FROM sessions
               WHERE id = ANY($1) AND ($2::text IS NULL OR tenant = $2)"#,
            ids,
            scope.tenant(),
        )
        .fetch_all(self.pool())
        .await?;
        rows.tokens_charged = charged
            .into_iter()
            .map(|r| (r.id, r.tokens_charged))
            .collect();
        Ok(rows)
    }
}
