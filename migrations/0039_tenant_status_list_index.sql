-- A tenant's list filtered by status (`GET /api/autonomous?status=…` with a
-- tenant's key, src/store/sessions.rs `list_sessions`), newest first: the
-- page is read off this index, 50 entries for 50 rows. Without it the list
-- walked `sessions_tenant_created` and dropped the other statuses' rows: at
-- 1,000,000 stored sessions of 100 tenants, a page of a status 5 % of a
-- tenant's sessions read 991 rows (1,306 buffers, 1.2 ms) for its 50, and
-- a rarer status more in proportion (BENCHMARKS.md, "Scale, round three").
-- `status` and `tenant` are in other indexes already and an iteration's
-- commit writes neither: commits stay HOT.
CREATE INDEX sessions_tenant_status_created
    ON sessions (tenant, status, created_at DESC, id DESC);
