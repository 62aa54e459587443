-- Estimates read a tenant's completed sessions of one executor kind, most
-- recent first (src/store/past_runs.rs): an index in that order.
CREATE INDEX sessions_completed_by_kind
    ON sessions (tenant, (executor_summary->>'kind'), ended_at DESC)
    WHERE status = 'completed';
