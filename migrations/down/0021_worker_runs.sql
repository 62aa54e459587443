-- Reverses migrations/0021_worker_runs.sql (`warden migrate --down-to
-- 20`). Loses the run token of worker tasks in flight: the previous
-- release neither reads nor writes it.
DROP INDEX worker_tasks_session_iteration;
ALTER TABLE worker_tasks DROP COLUMN run_token;
