-- A session's status and mode are checked when they are written, not on
-- every update of the row (issue 18).
--
-- Postgres evaluates every CHECK constraint of a table on every UPDATE,
-- whatever the SET list, and reads each one back from its stored text for
-- each statement. An iteration's commit updates the session row and never
-- sets status or mode, yet paid for both lists (the status list has eight
-- values): in a profile of one session, ExecConstraints was a tenth of
-- Postgres's CPU. Replayed with pgbench (one client, prepared, synchronous
-- commit off to see CPU alone), the commit statement took 0.280 ms with the
-- two CHECKs and 0.241 ms with this trigger instead.
--
-- The trigger fires on INSERT and on any UPDATE whose SET list names status
-- or mode, which is every write that can change them, and rejects a bad
-- value with the same error a CHECK raises (check_violation, under the
-- constraint's old name). The checks of `iterations` stay: each is a short
-- expression, measured within noise.
ALTER TABLE sessions DROP CONSTRAINT sessions_status_check;
ALTER TABLE sessions DROP CONSTRAINT sessions_mode_check;

CREATE FUNCTION warden_check_status_and_mode() RETURNS trigger
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

CREATE TRIGGER sessions_check_status_and_mode
    BEFORE INSERT OR UPDATE OF status, mode ON sessions
    FOR EACH ROW EXECUTE FUNCTION warden_check_status_and_mode();
