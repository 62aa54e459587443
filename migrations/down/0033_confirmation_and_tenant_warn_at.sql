-- Reverses migrations/0033_confirmation_and_tenant_warn_at.sql (`warden
-- migrate --down-to 32`). The previous release knows neither the status
-- `awaiting_confirmation` nor the reason `confirmation_expired`: sessions
-- still awaiting confirmation end `interrupted / user_stop` (they never
-- started), and those that expired read `stopped / user_stop`. Loses the
-- confirmations' estimates and the tenants' own `warn_at` (sessions
-- created already keep the thresholds they were given).
UPDATE sessions
   SET status = 'interrupted', reason = 'user_stop', ended_at = coalesce(ended_at, now()),
       updated_at = now()
 WHERE status = 'awaiting_confirmation';
UPDATE sessions SET reason = 'user_stop' WHERE reason = 'confirmation_expired';

ALTER TABLE tenant_settings DROP COLUMN warn_at;

DROP INDEX sessions_awaiting_confirmation;
ALTER TABLE sessions
    DROP COLUMN confirm_by,
    DROP COLUMN confirmation;

CREATE OR REPLACE FUNCTION warden_notify_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT (NEW.kind IN ('approval_requested', 'budget_warning', 'awaiting_confirmation')
            OR (NEW.kind = 'status_changed'
                AND NEW.data ->> 'to' IN ('completed', 'stopped', 'interrupted', 'failed',
                                          'paused', 'awaiting_confirmation')
                AND NOT (NEW.data ->> 'to' = 'paused'
                         AND coalesce(NEW.data ->> 'reason', '') IN ('user_pause', 'waiting_for_children'))))
    THEN
        RETURN NULL;
    END IF;
    INSERT INTO notifications (tenant, session_id, seq, kind, target_id)
    SELECT s.tenant, NEW.session_id, NEW.seq, NEW.kind, t.id
      FROM sessions s
      JOIN notify_targets t
        ON t.tenant = s.tenant AND (t.session_id IS NULL OR t.session_id = s.id)
     WHERE s.id = NEW.session_id AND t.disabled_at IS NULL
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION warden_check_status_and_mode() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status NOT IN ('awaiting_refinement', 'queued', 'running', 'paused',
                          'completed', 'stopped', 'interrupted', 'failed') THEN
        RAISE EXCEPTION 'invalid session status "%"', NEW.status
            USING ERRCODE = 'check_violation', TABLE = 'sessions', COLUMN = 'status',
                  CONSTRAINT = 'sessions_status_check';
    END IF;
    IF NEW.mode NOT IN ('fixed', 'continuous') THEN
        RAISE EXCEPTION 'invalid session mode "%"', NEW.mode
            USING ERRCODE = 'check_violation', TABLE = 'sessions', COLUMN = 'mode',
                  CONSTRAINT = 'sessions_mode_check';
    END IF;
    RETURN NEW;
END
$$;
