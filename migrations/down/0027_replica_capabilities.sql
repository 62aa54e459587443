-- Reverses migrations/0027_replica_capabilities.sql (`warden migrate
-- --down-to 26`). Loses nothing the previous release reads: the columns it
-- drops are derived (`sessions.needs`) or rewritten by every heartbeat.
DROP TRIGGER sessions_lease_capabilities ON sessions;
DROP FUNCTION warden_lease_needs_capabilities();
DROP TRIGGER sessions_needs ON sessions;
DROP FUNCTION warden_sessions_needs();
DROP FUNCTION warden_session_needs(jsonb, jsonb);
ALTER TABLE sessions DROP COLUMN needs;
ALTER TABLE replicas DROP COLUMN schema_version;
ALTER TABLE replicas DROP COLUMN version;
ALTER TABLE replicas DROP COLUMN capabilities;
