-- Lists sorted by `updated` or `cost` (`GET /api/autonomous?sort=…`) read
-- the page, not every matching session: at 1,100,000 stored, such a page
-- sorted them all (1.8 s for the admin's unfiltered list; BENCHMARKS.md,
-- SCALING.md).
--
-- An index on `updated_at` or `cost_usd` would cost every iteration's
-- commit, which writes both, its HOT update (an entry in each of the
-- table's indexes). So the two are kept again, in columns no commit
-- changes, only while a session is not running: a running session's are
-- NULL and stay NULL until it stops running, when they take its
-- `updated_at` and `cost_usd` and follow any later change. A list in
-- either order merges the running sessions (at most the fleet's places,
-- found through their status) with a page of the others read in index
-- order (src/store/sessions.rs `changing_key_page!`).
ALTER TABLE sessions
    ADD COLUMN settled_updated_at timestamptz,
    ADD COLUMN settled_cost_usd numeric;

CREATE FUNCTION warden_settle_sort_keys() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'running' THEN
        NEW.settled_updated_at := NULL;
        NEW.settled_cost_usd := NULL;
    ELSE
        NEW.settled_updated_at := NEW.updated_at;
        NEW.settled_cost_usd := NEW.cost_usd;
    END IF;
    RETURN NEW;
END
$$;

-- BEFORE triggers fire in name order: `zz` puts these after every other,
-- so they see the status a trigger before them may set (0020's
-- `sessions_wait_for_children` queues a paused parent). The WHENs keep a
-- running session's commits (running before and after) from calling the
-- function at all.
CREATE TRIGGER sessions_zz_settled_insert
    BEFORE INSERT ON sessions
    FOR EACH ROW WHEN (NEW.status <> 'running')
    EXECUTE FUNCTION warden_settle_sort_keys();
CREATE TRIGGER sessions_zz_settled_update
    BEFORE UPDATE OF status, updated_at, cost_usd, settled_updated_at, settled_cost_usd ON sessions
    FOR EACH ROW WHEN (NEW.status <> 'running' OR OLD.status <> 'running')
    EXECUTE FUNCTION warden_settle_sort_keys();

-- Rewrites every session that is not running (each row once), under the
-- lock the triggers above took.
UPDATE sessions SET settled_updated_at = updated_at, settled_cost_usd = cost_usd
WHERE status <> 'running';

-- Everything, a tenant's, one status, a tenant's of one status: the
-- lists' four scopes (as `sessions_by_created`, `sessions_tenant_created`,
-- `sessions_by_status`, `sessions_tenant_status_created` for creation
-- order). By cost, only the first two: a list by cost filtered by status
-- sorts that status's sessions (SCALING.md).
CREATE INDEX sessions_settled_by_updated
    ON sessions (settled_updated_at DESC, id DESC) WHERE settled_updated_at IS NOT NULL;
CREATE INDEX sessions_tenant_settled_by_updated
    ON sessions (tenant, settled_updated_at DESC, id DESC) WHERE settled_updated_at IS NOT NULL;
CREATE INDEX sessions_status_settled_by_updated
    ON sessions (status, settled_updated_at DESC, id DESC) WHERE settled_updated_at IS NOT NULL;
CREATE INDEX sessions_tenant_status_settled_by_updated
    ON sessions (tenant, status, settled_updated_at DESC, id DESC)
    WHERE settled_updated_at IS NOT NULL;
CREATE INDEX sessions_settled_by_cost
    ON sessions (settled_cost_usd DESC, id DESC) WHERE settled_cost_usd IS NOT NULL;
CREATE INDEX sessions_tenant_settled_by_cost
    ON sessions (tenant, settled_cost_usd DESC, id DESC) WHERE settled_cost_usd IS NOT NULL;
