-- Trees of sessions that neither stall in silence nor pass their budget
-- (issue 40).
--
-- `on_child_pause`: what a child of this session's tree does when it would
-- pause for a person: `wait` (it pauses; every ancestor's log and status
-- names it) or `fail_child` (it ends `failed` and its parent is told). Set
-- on a root at create, copied to each child when it is made.
--
-- `reserved_through`: a running step's allowance, reserved before the step
-- starts as the token count its session may reach (`tokens_used` +
-- allowance): what it still holds is `reserved_through - tokens_used`, so
-- the reservation shrinks by itself as the step's tokens commit and counts
-- only while the session runs.
--
-- `forgiven_tokens`: tokens this session's children spent over what they
-- had that its own budget could not pay (its limit never goes below zero).
-- The tree's remaining budget subtracts every session's, so an
-- overspending child's excess is charged to the whole tree, never lost.
ALTER TABLE sessions
    ADD COLUMN on_child_pause text NOT NULL DEFAULT 'wait'
        CONSTRAINT sessions_on_child_pause CHECK (on_child_pause IN ('wait', 'fail_child')),
    ADD COLUMN reserved_through bigint,
    ADD COLUMN forgiven_tokens bigint NOT NULL DEFAULT 0;

-- A child that pauses for a person tells every ancestor, nearest first (the
-- order the ancestors' own ends lock them in), with a
-- `child_needs_attention` event: a trigger of its own, so a later change
-- of the budget bookkeeping (warden_child_status, 0023) leaves it alone.
CREATE FUNCTION warden_child_needs_attention() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    seq bigint;
    i   integer;
BEGIN
    FOR i IN REVERSE cardinality(NEW.lineage) .. 1 LOOP
        UPDATE sessions a SET last_event_seq = a.last_event_seq + 1, updated_at = now()
         WHERE a.id = NEW.lineage[i]
        RETURNING a.last_event_seq INTO seq;
        IF seq IS NOT NULL THEN
            INSERT INTO events (session_id, seq, kind, data)
            VALUES (NEW.lineage[i], seq, 'child_needs_attention', json_build_object(
                'child_id', NEW.id, 'goal', NEW.goal, 'reason', NEW.reason,
                'summary', NEW.summary, 'depth', cardinality(NEW.lineage)));
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

CREATE TRIGGER sessions_child_needs_attention
    AFTER UPDATE OF status ON sessions
    FOR EACH ROW WHEN (NEW.parent_id IS NOT NULL AND NEW.status = 'paused'
                       AND OLD.status IS DISTINCT FROM NEW.status
                       AND NEW.reason IS NOT NULL
                       AND NEW.reason NOT IN ('user_pause', 'waiting_for_children'))
    EXECUTE FUNCTION warden_child_needs_attention();

-- A child that is stopped after its parent ended by itself (a `wait: false`
-- child its parent did not wait for; the tree sweep stops it) ended because
-- its parent did: `parent_ended`, not `user_stop`. A parent a user stopped
-- passes the user's stop on as it is.
CREATE FUNCTION warden_child_parent_ended() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM sessions p
               WHERE p.id = NEW.parent_id AND warden_session_ended(p.status)
                 AND p.reason IS DISTINCT FROM 'user_stop') THEN
        NEW.reason := 'parent_ended';
        NEW.summary := 'Interrupted: the session that delegated it ended first';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER sessions_child_parent_ended
    BEFORE UPDATE OF status ON sessions
    FOR EACH ROW WHEN (NEW.parent_id IS NOT NULL AND NEW.reason = 'user_stop'
                       AND OLD.status IS DISTINCT FROM NEW.status
                       AND NEW.status IN ('completed', 'stopped', 'interrupted', 'failed'))
    EXECUTE FUNCTION warden_child_parent_ended();
