-- Reverses migrations/0039_tenant_status_list_index.sql (`warden migrate
-- --down-to 38`). Loses nothing: a tenant's list by status walks
-- `sessions_tenant_created` again, dropping the other statuses' rows.
DROP INDEX IF EXISTS sessions_tenant_status_created;
