-- Foresight, part 2 (issue 43): a session whose estimate is over its
-- create's `confirm_if_over` waits in `awaiting_confirmation` until a
-- person confirms it (POST /api/autonomous/{id}/confirm) or it expires;
-- and a tenant's own soft-budget thresholds (`warn_at`).

-- The new status, checked where statuses are written (see 0011).
CREATE OR REPLACE FUNCTION warden_check_status_and_mode() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status NOT IN ('awaiting_refinement', 'awaiting_confirmation', 'queued', 'running',
                          'paused', 'completed', 'stopped', 'interrupted', 'failed') THEN
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

-- What a session awaiting confirmation waits on: its estimate, the bounds
-- it is over and why (the `confirmation` the status shows), and when it
-- expires undecided (`confirm_by`, WARDEN_APPROVAL_TIMEOUT_MS after the
-- create). Both stay after it starts or ends, as its history.
ALTER TABLE sessions
    ADD COLUMN confirmation jsonb,
    ADD COLUMN confirm_by timestamptz;

-- The expiry sweep finds overdue ones oldest first. The predicate names
-- `status`, which an iteration's commit never writes: commits stay HOT.
CREATE INDEX sessions_awaiting_confirmation ON sessions (confirm_by, id)
    WHERE status = 'awaiting_confirmation';

-- A session waiting for confirmation notifies once, by its
-- `awaiting_confirmation` event (which carries the estimate); its
-- `status_changed` into that status does not notify a second time.
CREATE OR REPLACE FUNCTION warden_notify_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT (NEW.kind IN ('approval_requested', 'budget_warning', 'awaiting_confirmation')
            OR (NEW.kind = 'status_changed'
                AND NEW.data ->> 'to' IN ('completed', 'stopped', 'interrupted', 'failed', 'paused')
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

-- A tenant's own soft-budget thresholds (percent, 1-99, at most 10; an
-- empty array warns never): a session of the tenant created without
-- `limits.warn_at` gets them. NULL: the server's [50, 80, 95].
ALTER TABLE tenant_settings
    ADD COLUMN warn_at smallint[]
        CHECK (warn_at IS NULL OR (cardinality(warn_at) <= 10
               AND 1 <= ALL (warn_at) AND 99 >= ALL (warn_at)));
