-- A fleet of replicas: a session created or resumed beyond a replica's
-- capacity (WARDEN_MAX_RUNNING) waits as `queued` until some replica with
-- room claims it, oldest first (FOR UPDATE SKIP LOCKED on the partial index).

ALTER TABLE sessions DROP CONSTRAINT sessions_status_check;
ALTER TABLE sessions ADD CONSTRAINT sessions_status_check
    CHECK (status IN ('awaiting_refinement', 'queued', 'running', 'paused',
                      'completed', 'stopped', 'interrupted', 'failed'));

-- When the session joined the queue: its age there, for fairness and its place.
ALTER TABLE sessions ADD COLUMN queued_at timestamptz;

CREATE INDEX sessions_queue ON sessions (queued_at, id) WHERE status = 'queued';
