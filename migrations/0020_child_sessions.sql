-- Child sessions: a session may delegate work to children that run as full
-- sessions under it. A child's token and iteration budgets are carved out
-- of its parent's limits when it is made (the parent's `limits` shrink by
-- them) and what it did not spend goes back when it ends, so a parent and
-- all its descendants together never spend more than the parent was given.
--
-- `lineage` lists the ancestors, root first (empty for a root): the depth is
-- its length, a tree is found through its GIN index, and a child's workspace
-- lives inside its parent's (`<parent workspace>/delegated/<child id>`).
-- `parent_call` names what made the child, unique under its parent, so a
-- delegating step that is run again after a crash finds its children
-- instead of making them twice. `secrets_from` is the ancestor whose sealed
-- secrets (the executor's API key) the child uses.
ALTER TABLE sessions
    ADD COLUMN parent_id uuid REFERENCES sessions (id) ON DELETE CASCADE,
    ADD COLUMN lineage uuid[] NOT NULL DEFAULT '{}',
    ADD COLUMN parent_call text,
    ADD COLUMN secrets_from uuid,
    ADD COLUMN budget_tokens bigint,
    ADD COLUMN budget_iterations bigint,
    ADD COLUMN children_tokens bigint NOT NULL DEFAULT 0,
    ADD COLUMN children_iterations bigint NOT NULL DEFAULT 0,
    ADD COLUMN reported_iteration bigint,
    ADD CONSTRAINT sessions_child_shape CHECK (
        (parent_id IS NULL) = (parent_call IS NULL)
        AND (parent_id IS NULL) = (budget_tokens IS NULL)
        AND (parent_id IS NULL) = (cardinality(lineage) = 0));

CREATE UNIQUE INDEX sessions_parent_call ON sessions (parent_id, parent_call) WHERE parent_id IS NOT NULL;
CREATE INDEX sessions_children ON sessions (parent_id, created_at, id) WHERE parent_id IS NOT NULL;
CREATE INDEX sessions_lineage ON sessions USING gin (lineage) WHERE parent_id IS NOT NULL;
CREATE INDEX sessions_roots ON sessions (created_at, id) WHERE parent_id IS NULL;

CREATE FUNCTION warden_session_ended(status text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT status IN ('completed', 'stopped', 'interrupted', 'failed')
$$;

-- When a child ends, in the same transaction: its parent gets back the
-- budget it did not spend (and counts what it did), logs a `child_ended`
-- event, and, if it paused waiting for its children and none is left
-- running, goes to the queue to continue. A child that ended never runs
-- again (the API refuses it; this is the last line).
--
-- The parent's row is locked by the first statement, and the wake-up is a
-- later statement with a snapshot of its own: two children ending at once
-- are serialized on that lock, so the second one sees the first ended and
-- the parent is never left waiting for a child that is gone.
CREATE FUNCTION warden_child_status() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    spent_tokens     bigint;
    spent_iterations bigint;
    seq              bigint;
BEGIN
    IF NEW.parent_id IS NULL OR OLD.status = NEW.status THEN
        RETURN NULL;
    END IF;
    spent_tokens := NEW.tokens_used + NEW.children_tokens;
    spent_iterations := NEW.iterations + NEW.children_iterations;
    IF warden_session_ended(NEW.status) AND NOT warden_session_ended(OLD.status) THEN
        -- What it spent is charged whole: a step that reported more than
        -- it was allowed (only a scripted or external agent can) costs the
        -- parent the difference, never less than 0 left.
        UPDATE sessions p
           SET limits = jsonb_set(jsonb_set(p.limits,
                   '{max_tokens}', to_jsonb(greatest((p.limits ->> 'max_tokens')::bigint
                                                     + NEW.budget_tokens - spent_tokens, 0))),
                   '{max_iterations}', to_jsonb(greatest((p.limits ->> 'max_iterations')::bigint
                                                         + NEW.budget_iterations - spent_iterations, 0))),
               children_tokens = p.children_tokens + spent_tokens,
               children_iterations = p.children_iterations + spent_iterations,
               last_event_seq = p.last_event_seq + 1,
               updated_at = now()
         WHERE p.id = NEW.parent_id
        RETURNING p.last_event_seq INTO seq;
        IF seq IS NOT NULL THEN
            INSERT INTO events (session_id, seq, kind, data)
            VALUES (NEW.parent_id, seq, 'child_ended', json_build_object(
                'child_id', NEW.id, 'goal', NEW.goal, 'status', NEW.status, 'reason', NEW.reason,
                'summary', NEW.summary, 'tokens_used', spent_tokens, 'iterations', spent_iterations,
                'tokens_returned', greatest(NEW.budget_tokens - spent_tokens, 0)));
        END IF;
        UPDATE sessions p
           SET status = 'queued', reason = NULL, summary = NULL, reason_detail = NULL,
               ended_at = NULL, stop_requested = false, pause_requested = false,
               run = p.run + 1, queued_at = now(), owner = NULL, lease_token = NULL,
               lease_expires_at = NULL, heartbeat_at = NULL, updated_at = now()
         WHERE p.id = NEW.parent_id AND p.status = 'paused' AND p.reason = 'waiting_for_children'
           AND NOT EXISTS (SELECT 1 FROM sessions c
                           WHERE c.parent_id = p.id AND NOT warden_session_ended(c.status));
    ELSIF warden_session_ended(OLD.status) AND NOT warden_session_ended(NEW.status) THEN
        -- Its budget went back to the parent when it ended: running it
        -- again would spend what the parent may have given elsewhere.
        RAISE EXCEPTION 'child session % ended and cannot run again; its parent delegates anew', NEW.id
            USING ERRCODE = 'check_violation', TABLE = 'sessions', CONSTRAINT = 'sessions_child_ended';
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER sessions_child_status
    AFTER UPDATE OF status ON sessions
    FOR EACH ROW EXECUTE FUNCTION warden_child_status();

-- A parent that pauses to wait for its children when none is left running
-- (they all ended while its step ran) goes to the queue at once instead:
-- nothing would ever wake it. Its row is locked here, so a child ending
-- at the same moment either committed before (and is seen) or wakes it.
CREATE FUNCTION warden_wait_for_children() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'paused' AND NEW.reason = 'waiting_for_children'
       AND NOT EXISTS (SELECT 1 FROM sessions c
                       WHERE c.parent_id = NEW.id AND NOT warden_session_ended(c.status)) THEN
        NEW.status := 'queued';
        NEW.reason := NULL;
        NEW.summary := NULL;
        NEW.reason_detail := NULL;
        NEW.ended_at := NULL;
        NEW.run := NEW.run + 1;
        NEW.queued_at := now();
        NEW.owner := NULL;
        NEW.lease_token := NULL;
        NEW.lease_expires_at := NULL;
        NEW.heartbeat_at := NULL;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER sessions_wait_for_children
    BEFORE UPDATE OF status ON sessions
    FOR EACH ROW WHEN (NEW.status = 'paused' AND NEW.reason = 'waiting_for_children')
    EXECUTE FUNCTION warden_wait_for_children();

-- A tenant's own tree limits (NULL: the defaults, depth 3 and 8 children).
ALTER TABLE tenant_settings
    ADD COLUMN max_depth integer CHECK (max_depth BETWEEN 1 AND 64),
    ADD COLUMN max_children integer CHECK (max_children BETWEEN 1 AND 64);
