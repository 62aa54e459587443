-- Reverses migrations/0037_session_forks_index.sql (`warden migrate
-- --down-to 36`). Loses nothing: the tree view finds forks without it, by a scan.
DROP INDEX IF EXISTS sessions_forks;
