-- Model-backed sessions: the conversation of each iteration, a journal of
-- tool calls (intent before, result after), reflections, token attribution
-- and the detail of a waiting reason (the agent's question).

ALTER TABLE sessions
    ADD COLUMN reason_detail      text,
    ADD COLUMN agent_tokens       bigint NOT NULL DEFAULT 0,
    ADD COLUMN reflection_tokens  bigint NOT NULL DEFAULT 0,
    ADD COLUMN refinement_tokens  bigint NOT NULL DEFAULT 0,
    ADD COLUMN last_reflection    jsonb;

ALTER TABLE iterations
    ADD COLUMN transcript jsonb;

CREATE TABLE tool_calls (
    session_id   uuid NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    iteration    bigint NOT NULL,
    call_index   integer NOT NULL,
    tool         text NOT NULL,
    arguments    jsonb NOT NULL,
    status       text NOT NULL CHECK (status IN ('started', 'finished')),
    result       jsonb,
    started_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    PRIMARY KEY (session_id, iteration, call_index)
);

CREATE TABLE reflections (
    session_id       uuid NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    number           integer NOT NULL,
    after_iteration  bigint NOT NULL,
    trigger          text NOT NULL,
    ok               boolean NOT NULL,
    assessment       jsonb,
    error            text,
    decision         jsonb NOT NULL,
    next_interval    integer NOT NULL,
    tokens           bigint NOT NULL DEFAULT 0,
    raw              text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, number)
);
