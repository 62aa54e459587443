-- Reverses migrations/0036_applied_thresholds.sql (`warden migrate
-- --down-to 35`). Loses the tenants' applied iteration limits (sessions
-- created already keep theirs; new ones get the server's default) and the
-- log of their changes.
DROP TABLE threshold_changes;
DROP FUNCTION warden_threshold_changes_append_only();
ALTER TABLE tenant_settings DROP COLUMN max_iterations;
