-- Tool calls (and webhook or worker actions) that wait for a person. A
-- row is written while its step runs, before the step commits: a step that
-- is run again after a crash writes its rows again, and a row of a step
-- that never committed (iteration above the session's count) is not shown.
-- `call_id` is Warden's name of the call, `{iteration}.{call_index}`;
-- `tool_call_id` the model's own id of it, answered with the result.
CREATE TABLE approvals (
    session_id   uuid NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    call_id      text NOT NULL,
    iteration    bigint NOT NULL,
    call_index   integer NOT NULL,
    tool_call_id text,
    tool         text NOT NULL,
    arguments    jsonb NOT NULL,
    reason       text NOT NULL DEFAULT '',
    requested_at timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    decision     text CHECK (decision IN ('approve', 'reject', 'expired')),
    decided_by   text,
    decided_at   timestamptz,
    message      text,
    PRIMARY KEY (session_id, call_id),
    UNIQUE (session_id, iteration, call_index),
    CHECK ((decision IS NULL) = (decided_at IS NULL))
);
CREATE INDEX approvals_waiting ON approvals (requested_at, session_id, call_id) WHERE decision IS NULL;
CREATE INDEX approvals_expiring ON approvals (expires_at) WHERE decision IS NULL;
