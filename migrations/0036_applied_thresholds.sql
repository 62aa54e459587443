-- Thresholds learned from outcomes, applied per tenant as audited
-- decisions (issue 44): a tenant's own iteration limit, which a session of
-- the tenant created without `limits.max_iterations` gets, and the
-- append-only log of every change of it with the replay that justified it
-- (POST /api/insights/thresholds/apply).

-- NULL: the server's default (AUTONOMOUS_MAX_ITERATIONS, or
-- AUTONOMOUS_FIXED_ITERATIONS in fixed mode). The range is a create's
-- (`limits.max_iterations`, policy::guardrails::RANGES).
ALTER TABLE tenant_settings
    ADD COLUMN max_iterations bigint
        CHECK (max_iterations IS NULL OR max_iterations BETWEEN 1 AND 1000000);

-- One row per change, never updated nor deleted (the trigger below).
-- `previous_value` / `new_value` NULL: the server's default. `applied_by`
-- is who acted as the event log names it (a key's public prefix,
-- `admin-token` or `auth-off`), never a secret. `replay` is the
-- justification: the value replayed, which sessions were selected and the
-- replay's totals (src/session/api/apply_threshold.rs).
CREATE TABLE threshold_changes (
    id             bigserial PRIMARY KEY,
    tenant         text NOT NULL CHECK (length(tenant) BETWEEN 1 AND 64),
    threshold      text NOT NULL CHECK (threshold IN ('max_iterations')),
    previous_value bigint CHECK (previous_value IS NULL OR previous_value BETWEEN 1 AND 1000000),
    new_value      bigint CHECK (new_value IS NULL OR new_value BETWEEN 1 AND 1000000),
    applied_by     text NOT NULL CHECK (length(applied_by) BETWEEN 1 AND 128),
    applied_at     timestamptz NOT NULL DEFAULT now(),
    replay         jsonb NOT NULL CHECK (jsonb_typeof(replay) = 'object'),
    note           text CHECK (note IS NULL OR char_length(note) <= 500)
);

-- A tenant's log, newest first, by keyset on the id.
CREATE INDEX threshold_changes_by_tenant ON threshold_changes (tenant, id DESC);

-- An audit log is not rewritten: updates and deletes are refused.
CREATE FUNCTION warden_threshold_changes_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'threshold_changes is append-only'
        USING ERRCODE = 'restrict_violation', TABLE = 'threshold_changes';
END
$$;

CREATE TRIGGER threshold_changes_append_only
    BEFORE UPDATE OR DELETE ON threshold_changes
    FOR EACH ROW EXECUTE FUNCTION warden_threshold_changes_append_only();
