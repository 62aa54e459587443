-- Honest accounting: tokens spent by a step that was cut short (a worker
-- stopped mid-step that reports its usage after the cancel, an uncollected
-- outcome a stop won over) are charged to the session outside its loop.

-- The sum of every such charge. `tokens_used` has them too; a run's loop
-- state counts the part it has seen (`charges_seen` of its checkpoints), so
-- a run folds the rest in when it starts, and a run's own writes of
-- `tokens_used` keep the charges it has not seen yet.
ALTER TABLE sessions ADD COLUMN tokens_charged bigint NOT NULL DEFAULT 0
    CHECK (tokens_charged >= 0);

-- What a task's worker was charged after its cancel (NULL: nothing yet):
-- once per lease, so a claim starts it over.
ALTER TABLE worker_tasks ADD COLUMN charged_tokens bigint;

-- a + b, at most the largest bigint: counters saturate, never overflow.
CREATE FUNCTION warden_sat_add(a bigint, b bigint) RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN LEAST(a::numeric + b::numeric, 9223372036854775807)::bigint;
