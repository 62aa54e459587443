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

-- As in 0020, with two changes (the rule is `delegation::give_back`):
-- a parent takes back what the child has left (its limit less what it
-- spent, never more than its budget less what its subtree spent), so what
-- the child's own live children hold is not given back twice; what the
-- parent's limit cannot pay is recorded (`forgiven_tokens`) instead of
-- lost; a parent that ended takes nothing back but is still charged.
CREATE OR REPLACE FUNCTION warden_child_status() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    spent_tokens     bigint;
    spent_iterations bigint;
    child_left       bigint;
    parent_over      boolean;
    seq              bigint;
BEGIN
    IF NEW.parent_id IS NULL OR OLD.status = NEW.status THEN
        RETURN NULL;
    END IF;
    spent_tokens := NEW.tokens_used + NEW.children_tokens;
    spent_iterations := NEW.iterations + NEW.children_iterations;
    IF warden_session_ended(NEW.status) AND NOT warden_session_ended(OLD.status) THEN
        child_left := least((NEW.limits ->> 'max_tokens')::bigint - NEW.tokens_used,
                            NEW.budget_tokens - spent_tokens);
        UPDATE sessions p
           SET limits = jsonb_set(jsonb_set(p.limits,
                   '{max_tokens}', to_jsonb(CASE WHEN warden_session_ended(p.status)
                                                 THEN (p.limits ->> 'max_tokens')::bigint
                                                 ELSE greatest((p.limits ->> 'max_tokens')::bigint + child_left, 0) END)),
                   '{max_iterations}', to_jsonb(greatest((p.limits ->> 'max_iterations')::bigint
                                                         + NEW.budget_iterations - spent_iterations, 0))),
               forgiven_tokens = p.forgiven_tokens
                   + greatest(-(CASE WHEN warden_session_ended(p.status) THEN 0
                                     ELSE (p.limits ->> 'max_tokens')::bigint END + child_left), 0),
               children_tokens = p.children_tokens + spent_tokens,
               children_iterations = p.children_iterations + spent_iterations,
               last_event_seq = p.last_event_seq + 1,
               updated_at = now()
         WHERE p.id = NEW.parent_id
        RETURNING p.last_event_seq, warden_session_ended(p.status) INTO seq, parent_over;
        IF seq IS NOT NULL THEN
            INSERT INTO events (session_id, seq, kind, data)
            VALUES (NEW.parent_id, seq, 'child_ended', json_build_object(
                'child_id', NEW.id, 'goal', NEW.goal, 'status', NEW.status, 'reason', NEW.reason,
                'summary', NEW.summary, 'tokens_used', spent_tokens, 'iterations', spent_iterations,
                'tokens_returned', CASE WHEN parent_over THEN 0 ELSE greatest(child_left, 0) END));
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
        RAISE EXCEPTION 'child session % ended and cannot run again; its parent delegates anew', NEW.id
            USING ERRCODE = 'check_violation', TABLE = 'sessions', CONSTRAINT = 'sessions_child_ended';
    END IF;
    RETURN NULL;
END
$$;

-- A child that pauses for a person tells every ancestor, nearest first (the
-- order the ancestors' own ends lock them in), with a
-- `child_needs_attention` event: a trigger of its own, so a later change
-- of the budget bookkeeping above leaves it alone.
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
