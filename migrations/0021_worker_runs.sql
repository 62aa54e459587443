-- Exactly-once for workers across a takeover. A task belongs to the run
-- waiting on it (`run_token`: the session's lease token of that run): a new
-- run of the session takes over the task of the step it resumes (collects
-- its outcome when it is done, keeps waiting on the worker that holds it)
-- instead of offering the step again, and a run that lost the session can
-- no longer change the task.
ALTER TABLE worker_tasks ADD COLUMN run_token uuid;
-- The step a run resumes finds the session's task of that iteration, and a
-- done step whose owner went silent is found for a rescue.
CREATE INDEX worker_tasks_session_iteration ON worker_tasks (session_id, iteration);
