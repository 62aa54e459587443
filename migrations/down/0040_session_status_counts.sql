-- Reverses migrations/0040_session_status_counts.sql (`warden migrate
-- --down-to 39`). Loses nothing: the counts are derived, and the binary of
-- 0039 counts the sessions table itself.
DROP TRIGGER IF EXISTS sessions_status_counts_insert ON sessions;
DROP TRIGGER IF EXISTS sessions_status_counts_delete ON sessions;
DROP TRIGGER IF EXISTS sessions_status_counts_update ON sessions;
DROP TRIGGER IF EXISTS sessions_status_counts_truncate ON sessions;
DROP FUNCTION IF EXISTS warden_count_added_sessions();
DROP FUNCTION IF EXISTS warden_count_removed_sessions();
DROP FUNCTION IF EXISTS warden_count_status_change();
DROP FUNCTION IF EXISTS warden_clear_status_counts();
DROP FUNCTION IF EXISTS warden_queue_tenants();
DROP TABLE IF EXISTS session_status_count_deltas;
DROP TABLE IF EXISTS session_status_counts;
