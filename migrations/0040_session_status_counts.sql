-- Per-tenant counts of sessions in each status, so that the counts
-- `/metrics` adds on every scrape, a tenant's or the admin's outcomes and
-- the dashboard's unfiltered counts do not read every stored session: at
-- 1,100,000 stored, `SELECT status, count(*) … GROUP BY status` was an
-- index-only scan of all of them, 300 ms (BENCHMARKS.md, SCALING.md).
--
-- Kept as `tenant_counts` is (0017), without a hot row: each change
-- appends a delta row, which locks nothing another writer waits for (a
-- counter row per status would be locked by every create and every group
-- commit that ends sessions, and taken in different orders by different
-- transactions, could deadlock). The fleet's tick folds the deltas into
-- `session_status_counts` (src/store/queue.rs `fold_tenant_counts`); a
-- read sums both, in one statement, so it sees each change once.
CREATE TABLE session_status_counts (
    tenant    text NOT NULL,
    status    text NOT NULL,
    sessions  bigint NOT NULL,
    PRIMARY KEY (tenant, status)
);

CREATE TABLE session_status_count_deltas (
    tenant    text NOT NULL,
    status    text NOT NULL,
    sessions  integer NOT NULL
);
CREATE INDEX session_status_count_deltas_by_tenant ON session_status_count_deltas (tenant);

-- Inserts and deletes are counted per statement, from their transition
-- table: a bulk insert (an import, a restore) or a retention delete of
-- thousands of sessions appends one delta per tenant and status, not one
-- per session.
CREATE FUNCTION warden_count_added_sessions() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO session_status_count_deltas (tenant, status, sessions)
    SELECT tenant, status, count(*) FROM added GROUP BY tenant, status;
    RETURN NULL;
END
$$;

CREATE FUNCTION warden_count_removed_sessions() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO session_status_count_deltas (tenant, status, sessions)
    SELECT tenant, status, -count(*) FROM removed GROUP BY tenant, status;
    RETURN NULL;
END
$$;

-- A change of status moves one session from one count to the other. The
-- WHEN keeps writes that name status without changing it (and every
-- iteration's commit, which does not name it) from calling the function.
CREATE FUNCTION warden_count_status_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO session_status_count_deltas (tenant, status, sessions)
    VALUES (OLD.tenant, OLD.status, -1), (NEW.tenant, NEW.status, 1);
    RETURN NULL;
END
$$;

CREATE FUNCTION warden_clear_status_counts() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM session_status_counts;
    DELETE FROM session_status_count_deltas;
    RETURN NULL;
END
$$;

CREATE TRIGGER sessions_status_counts_insert
    AFTER INSERT ON sessions REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION warden_count_added_sessions();
CREATE TRIGGER sessions_status_counts_delete
    AFTER DELETE ON sessions REFERENCING OLD TABLE AS removed
    FOR EACH STATEMENT EXECUTE FUNCTION warden_count_removed_sessions();
CREATE TRIGGER sessions_status_counts_update
    AFTER UPDATE OF status ON sessions
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION warden_count_status_change();
CREATE TRIGGER sessions_status_counts_truncate
    AFTER TRUNCATE ON sessions
    FOR EACH STATEMENT EXECUTE FUNCTION warden_clear_status_counts();

-- The triggers above hold session writes back until this transaction
-- commits, so the count below and the deltas after it meet exactly.
INSERT INTO session_status_counts (tenant, status, sessions)
SELECT tenant, status, count(*) FROM sessions GROUP BY tenant, status;

-- How many tenants have a session queued: a skip scan of
-- `sessions_queue_by_tenant`, one probe per such tenant. A queued
-- session's view shows it beside its `queue_position` (src/store/sessions.rs);
-- a list computes it once per page, no longer once per queued row.
CREATE FUNCTION warden_queue_tenants() RETURNS bigint
LANGUAGE sql STABLE AS $$
    WITH RECURSIVE waiting AS (
        (SELECT q.tenant FROM sessions q WHERE q.status = 'queued' ORDER BY q.tenant LIMIT 1)
        UNION ALL
        SELECT (SELECT q.tenant FROM sessions q WHERE q.status = 'queued'
                AND q.tenant > w.tenant ORDER BY q.tenant LIMIT 1)
        FROM waiting w WHERE w.tenant IS NOT NULL)
    SELECT count(tenant) FROM waiting
$$;
