-- The failure model: how many times in a row a running session was taken
-- over by a rescue without committing an iteration in between, and the last
-- error its loop met. A rescue counts an attempt only while the run and the
-- iteration count stay where the previous attempt left them, so any
-- progress (or a resume, which starts a new run) starts the count over.

ALTER TABLE sessions
    ADD COLUMN attempts           integer NOT NULL DEFAULT 0,
    ADD COLUMN attempt_run        integer NOT NULL DEFAULT 0,
    ADD COLUMN attempt_iteration  bigint NOT NULL DEFAULT 0,
    ADD COLUMN last_error         text;
