-- Lighter iteration commits (issue 18). Measured with pgbench on a session
-- row of the benchmark (synchronous_commit off, to see CPU alone):
--
-- 1. The generated `executor_summary` was recomputed on every UPDATE of a
--    session (Postgres 15 re-evaluates stored generated columns whatever the
--    SET list), and an iteration's commit, a lease renewal and every control
--    change all update the row: 0.165 ms per UPDATE against 0.102 ms without.
--    It becomes a plain column kept by a trigger that fires only when the
--    executor itself is written.
ALTER TABLE sessions ALTER COLUMN executor_summary DROP EXPRESSION;

CREATE FUNCTION warden_keep_executor_summary() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.executor_summary := warden_executor_summary(NEW.executor);
    RETURN NEW;
END
$$;

CREATE TRIGGER sessions_executor_summary
    BEFORE INSERT OR UPDATE OF executor ON sessions
    FOR EACH ROW EXECUTE FUNCTION warden_keep_executor_summary();

-- 2. The foreign keys of the three tables every iteration appends to
--    (iterations, events, checkpoints) cost a lookup and a row lock on the
--    session per appended row: 0.133 ms per event insert against 0.107 ms
--    without, three or four rows per iteration. Every statement that appends
--    to them updates the session row in the same transaction, fenced on its
--    lease, so the session is known to exist; the check proved nothing.
--    Deleting a session (by hand: Warden never does) still removes its rows.
ALTER TABLE iterations DROP CONSTRAINT iterations_session_id_fkey;
ALTER TABLE events DROP CONSTRAINT events_session_id_fkey;
ALTER TABLE checkpoints DROP CONSTRAINT checkpoints_session_id_fkey;

CREATE FUNCTION warden_delete_session_log() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM iterations WHERE session_id = OLD.id;
    DELETE FROM events WHERE session_id = OLD.id;
    DELETE FROM checkpoints WHERE session_id = OLD.id;
    RETURN OLD;
END
$$;

CREATE TRIGGER sessions_delete_log
    AFTER DELETE ON sessions
    FOR EACH ROW EXECUTE FUNCTION warden_delete_session_log();

-- 3. The JSON an iteration appends (its record and effects, its events'
--    payloads, interval checkpoints) was `jsonb`: Postgres parsed it and
--    built the binary form for every row, the largest single item of a
--    commit's CPU in a profile of 32 sessions (jsonb_recv, 11 % of both
--    cores). Warden only writes these and reads them back whole, so they
--    become `json`: validated and stored as sent. The operators Warden uses
--    on them (`->`, `->>`) work on `json` alike.
ALTER TABLE iterations
    ALTER COLUMN record TYPE json USING record::json,
    ALTER COLUMN effects TYPE json USING effects::json,
    ALTER COLUMN transcript TYPE json USING transcript::json;
ALTER TABLE events ALTER COLUMN data TYPE json USING data::json;
ALTER TABLE checkpoints ALTER COLUMN state TYPE json USING state::json;
