-- Reverses migrations/0041_settled_sort_keys.sql (`warden migrate
-- --down-to 40`). Loses nothing: the columns copy `updated_at` and
-- `cost_usd`; lists in those orders sort every matching session again.
DROP TRIGGER IF EXISTS sessions_zz_settled_insert ON sessions;
DROP TRIGGER IF EXISTS sessions_zz_settled_update ON sessions;
DROP FUNCTION IF EXISTS warden_settle_sort_keys();
DROP INDEX IF EXISTS sessions_settled_by_updated;
DROP INDEX IF EXISTS sessions_tenant_settled_by_updated;
DROP INDEX IF EXISTS sessions_status_settled_by_updated;
DROP INDEX IF EXISTS sessions_tenant_status_settled_by_updated;
DROP INDEX IF EXISTS sessions_settled_by_cost;
DROP INDEX IF EXISTS sessions_tenant_settled_by_cost;
ALTER TABLE sessions DROP COLUMN IF EXISTS settled_updated_at, DROP COLUMN IF EXISTS settled_cost_usd;
