-- Counts that saturate instead of overflowing (issue 40, item 5). A worker
-- that reported `tokens: 9223372036854775807` on a child overflowed
-- `bigint` when the child ended: its parent's bookkeeping failed, so the
-- child could never commit, a stop answered 500 and the parent could never
-- be deleted. Reported counts are now held to the step's allowance before
-- they are stored; the sums below stop at the largest bigint as a last line.

-- `n` clamped into bigint's range.
CREATE FUNCTION warden_saturating(n numeric) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT greatest(least(n, 9223372036854775807), -9223372036854775808)::bigint
$$;

-- As in 0020, with three changes. The parent takes back what the child
-- has left (its limit less what it spent, never more than its budget less
-- what its subtree spent), so what the child's own live children hold is
-- not given back twice (the rule is `delegation::give_back`); what the
-- parent's limit cannot pay is recorded (`forgiven_tokens`, 0022) instead
-- of lost, and a parent that ended takes nothing back but is still
-- charged; every sum saturates.
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
    spent_tokens := warden_saturating(NEW.tokens_used::numeric + NEW.children_tokens);
    spent_iterations := warden_saturating(NEW.iterations::numeric + NEW.children_iterations);
    IF warden_session_ended(NEW.status) AND NOT warden_session_ended(OLD.status) THEN
        -- Each step's count is held to its allowance before it is stored,
        -- so a child spends at most its budget; what it has left goes back
        -- (`delegation::give_back`).
        child_left := least(warden_saturating((NEW.limits ->> 'max_tokens')::numeric - NEW.tokens_used),
                            warden_saturating(NEW.budget_tokens::numeric - spent_tokens));
        UPDATE sessions p
           SET limits = jsonb_set(jsonb_set(p.limits,
                   '{max_tokens}', to_jsonb(CASE WHEN warden_session_ended(p.status)
                                                 THEN (p.limits ->> 'max_tokens')::bigint
                                                 ELSE greatest(warden_saturating((p.limits ->> 'max_tokens')::numeric
                                                                                 + child_left), 0) END)),
                   '{max_iterations}', to_jsonb(greatest(warden_saturating((p.limits ->> 'max_iterations')::numeric
                                                         + NEW.budget_iterations - spent_iterations), 0))),
               forgiven_tokens = warden_saturating(p.forgiven_tokens::numeric
                   + greatest(-(CASE WHEN warden_session_ended(p.status) THEN 0
                                     ELSE (p.limits ->> 'max_tokens')::numeric END + child_left), 0)),
               children_tokens = warden_saturating(p.children_tokens::numeric + spent_tokens),
               children_iterations = warden_saturating(p.children_iterations::numeric + spent_iterations),
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
        -- Its budget went back to the parent when it ended: running it
        -- again would spend what the parent may have given elsewhere.
        RAISE EXCEPTION 'child session % ended and cannot run again; its parent delegates anew', NEW.id
            USING ERRCODE = 'check_violation', TABLE = 'sessions', CONSTRAINT = 'sessions_child_ended';
    END IF;
    RETURN NULL;
END
$$;

