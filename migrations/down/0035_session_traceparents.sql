-- Reverses migrations/0035_session_traceparents.sql (`warden migrate
-- --down-to 34`). Loses the trace links: the next run of each session
-- starts unlinked.
ALTER TABLE sessions DROP COLUMN request_traceparent, DROP COLUMN run_traceparent;
