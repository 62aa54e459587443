-- Goals that can be finished: refinement of ambiguous goals (with its
-- history), success criteria and milestones, context cycles with memory,
-- and the agent's persistent task queue.

ALTER TABLE sessions
    ADD COLUMN original_goal  text,
    ADD COLUMN refinement     jsonb,
    ADD COLUMN criteria       jsonb NOT NULL DEFAULT '[]',
    ADD COLUMN milestones     jsonb NOT NULL DEFAULT '[]',
    ADD COLUMN cycle          integer NOT NULL DEFAULT 1,
    ADD COLUMN memory         text NOT NULL DEFAULT '';

ALTER TABLE iterations
    ADD COLUMN cycle integer NOT NULL DEFAULT 1;

CREATE TABLE refinements (
    session_id   uuid NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    number       integer NOT NULL,
    kind         text NOT NULL,
    goal_before  text NOT NULL,
    goal_after   text NOT NULL,
    data         jsonb NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, number)
);

CREATE TABLE tasks (
    session_id   uuid NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    id           integer NOT NULL,
    title        text NOT NULL,
    status       text NOT NULL CHECK (status IN ('pending', 'in_progress', 'done', 'blocked')),
    notes        text NOT NULL DEFAULT '',
    priority     integer NOT NULL DEFAULT 0,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, id)
);
