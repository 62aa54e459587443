-- Reverses migrations/0042_unindexed_leases.sql (`warden migrate
-- --down-to 41`). Loses nothing: the index of migration 0001 again, built
-- once over the running sessions.
CREATE INDEX IF NOT EXISTS sessions_running_leases
    ON sessions (lease_expires_at) WHERE status = 'running';
