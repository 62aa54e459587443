-- Sessions, their iterations, checkpoints and the append-only event log.
-- A session row carries the loop's counters (updated in the same transaction
-- as each iteration), the durable stop/pause flags and the replica lease.

CREATE TABLE sessions (
    id                 uuid PRIMARY KEY,
    goal               text NOT NULL,
    mode               text NOT NULL CHECK (mode IN ('fixed', 'continuous')),
    status             text NOT NULL CHECK (status IN ('awaiting_refinement', 'running', 'paused',
                                                       'completed', 'stopped', 'interrupted', 'failed')),
    reason             text,
    summary            text,
    next_steps         jsonb NOT NULL DEFAULT '[]',
    percent_complete   double precision,
    eta_seconds        double precision,
    limits             jsonb NOT NULL,
    executor           jsonb NOT NULL,
    iterations         bigint NOT NULL DEFAULT 0,
    tokens_used        bigint NOT NULL DEFAULT 0,
    tool_calls         bigint NOT NULL DEFAULT 0,
    consecutive_errors integer NOT NULL DEFAULT 0,
    elapsed_ms         bigint NOT NULL DEFAULT 0,
    run                integer NOT NULL DEFAULT 1,
    checkpoint_saved   boolean NOT NULL DEFAULT false,
    last_checkpoint_iteration bigint NOT NULL DEFAULT 0,
    -- Durable control flags: the truth for every replica; NOTIFY only makes them fast.
    stop_requested     boolean NOT NULL DEFAULT false,
    pause_requested    boolean NOT NULL DEFAULT false,
    guidance           text,
    last_event_seq     bigint NOT NULL DEFAULT 0,
    -- Ownership: one replica holds a running session through a renewed lease.
    -- lease_token changes on every acquisition and fences every write.
    owner              uuid,
    lease_token        uuid,
    lease_expires_at   timestamptz,
    heartbeat_at       timestamptz,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    ended_at           timestamptz
);

CREATE INDEX sessions_by_created ON sessions (created_at DESC, id DESC);
CREATE INDEX sessions_by_status ON sessions (status, created_at DESC, id DESC);
CREATE INDEX sessions_running_leases ON sessions (lease_expires_at) WHERE status = 'running';

CREATE TABLE iterations (
    session_id   uuid NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    number       bigint NOT NULL CHECK (number > 0),
    run          integer NOT NULL,
    action       text NOT NULL,
    outcome      text NOT NULL CHECK (outcome IN ('success', 'failure', 'error')),
    tokens       bigint NOT NULL,
    duration_ms  bigint NOT NULL,
    -- The full step record and what the policies concluded from it, so that
    -- a checkpoint plus the iterations after it rebuild the loop state exactly.
    record       jsonb NOT NULL,
    effects      jsonb NOT NULL,
    started_at   timestamptz NOT NULL,
    finished_at  timestamptz NOT NULL,
    PRIMARY KEY (session_id, number)
);

CREATE TABLE checkpoints (
    id           bigserial PRIMARY KEY,
    session_id   uuid NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    iteration    bigint NOT NULL,
    reason       text NOT NULL,
    state        jsonb NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX checkpoints_by_session ON checkpoints (session_id, id DESC);

CREATE TABLE events (
    session_id   uuid NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    seq          bigint NOT NULL,
    kind         text NOT NULL,
    data         jsonb NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, seq)
);

CREATE INDEX events_decisions ON events (session_id, seq)
    WHERE kind IN ('gate_decision', 'stuck_detected', 'guardrail_tripped', 'status_changed');
