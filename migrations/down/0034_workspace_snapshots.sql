-- Reverses migrations/0034_workspace_snapshots.sql (`warden migrate
-- --down-to 33`). Loses the workspace snapshots and which sessions were
-- forked from which.
ALTER TABLE sessions
    DROP COLUMN forked_from_iteration,
    DROP COLUMN forked_from_session;
DROP TABLE workspace_files;
DROP TABLE workspace_snapshots;
DROP TABLE workspace_blobs;
