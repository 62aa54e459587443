-- Reverses migrations/0023_saturating_counts.sql (`warden migrate
-- --down-to 22`): the child-end trigger function as 0020 wrote it (sums
-- that do not saturate, no `forgiven_tokens`), and no `warden_saturating`.
-- Loses no data.
CREATE OR REPLACE FUNCTION warden_child_status() RETURNS trigger
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

DROP FUNCTION warden_saturating(numeric);
