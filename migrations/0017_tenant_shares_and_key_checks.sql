-- Many tenants on one fleet (issue 34): fair shares in the queue, a quota
-- check that does not scan, and a key check value per secret key.

-- Per-tenant settings an operator sets with `warden tenants set`: the
-- tenant's weight in the queue's fair share, and a cap on its running
-- sessions across the fleet (NULL: none beyond WARDEN_TENANT_MAX_RUNNING).
-- A tenant without a row has weight 1 and no cap.
CREATE TABLE tenant_settings (
    tenant       text PRIMARY KEY,
    weight       integer NOT NULL DEFAULT 1 CHECK (weight BETWEEN 1 AND 1000),
    max_running  integer CHECK (max_running >= 0),
    updated_at   timestamptz NOT NULL DEFAULT now()
);

-- Per-tenant counts of active sessions (running, queued or awaiting
-- refinement: what the quota counts) and of running ones (what the fair
-- share weighs), kept without a hot row.
--
-- A counter row per tenant updated by a trigger would be one row that every
-- status change of a big tenant locks: the group commit changes many
-- sessions' status in one statement, so it would wait on (and, taking
-- several tenants' rows in its own order, could deadlock with) creates and
-- other replicas' commits. Instead each change of a session's activity
-- appends a delta row: an insert locks nothing anyone else waits for.
-- `tenant_counts` holds the folded base; the quota check, which already
-- holds the tenant's lock, folds that tenant's deltas into it, so the
-- deltas read at each check are only those since the tenant's last check.
CREATE TABLE tenant_counts (
    tenant   text PRIMARY KEY,
    active   bigint NOT NULL DEFAULT 0,
    running  bigint NOT NULL DEFAULT 0
);

CREATE TABLE tenant_count_deltas (
    tenant   text NOT NULL,
    active   integer NOT NULL,
    running  integer NOT NULL
);
CREATE INDEX tenant_count_deltas_by_tenant ON tenant_count_deltas (tenant);

CREATE FUNCTION warden_session_active(status text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN status IN ('running', 'awaiting_refinement', 'queued') THEN 1 ELSE 0 END
$$;

CREATE FUNCTION warden_count_session_status() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    d_active  integer := 0;
    d_running integer := 0;
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        d_active := d_active - warden_session_active(OLD.status);
        d_running := d_running - (OLD.status = 'running')::integer;
    END IF;
    IF TG_OP IN ('UPDATE', 'INSERT') THEN
        d_active := d_active + warden_session_active(NEW.status);
        d_running := d_running + (NEW.status = 'running')::integer;
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.tenant IS DISTINCT FROM NEW.tenant THEN
        RAISE EXCEPTION 'a session does not change tenant';
    END IF;
    IF d_active <> 0 OR d_running <> 0 THEN
        INSERT INTO tenant_count_deltas (tenant, active, running)
        VALUES (coalesce(NEW.tenant, OLD.tenant), d_active, d_running);
    END IF;
    RETURN NULL;
END
$$;

-- Only writes that name status (or tenant) fire it: an iteration's commit
-- does not.
CREATE TRIGGER sessions_count_status
    AFTER INSERT OR DELETE OR UPDATE OF status, tenant ON sessions
    FOR EACH ROW EXECUTE FUNCTION warden_count_session_status();

INSERT INTO tenant_counts (tenant, active, running)
SELECT tenant, sum(warden_session_active(status)), count(*) FILTER (WHERE status = 'running')
FROM sessions GROUP BY tenant;

-- The fair claim takes the oldest queued sessions of each waiting tenant.
CREATE INDEX sessions_queue_by_tenant ON sessions (tenant, queued_at, id) WHERE status = 'queued';

-- A key check value per key id: a fixed text sealed under the key. A
-- replica whose key of that id does not open it has another key under the
-- same id (or the row was damaged) and refuses to start, naming the id.
CREATE TABLE secret_key_checks (
    key_id      text PRIMARY KEY,
    nonce       bytea NOT NULL,
    ciphertext  bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
