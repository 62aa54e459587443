-- Reverses migrations/0026_usage_charges.sql (`warden migrate --down-to
-- 25`). Loses the usage charged so far (`sessions.tokens_charged`,
-- `worker_tasks.charged_tokens`): the previous release neither reads nor
-- writes them.
DROP FUNCTION warden_sat_add(bigint, bigint);
ALTER TABLE worker_tasks DROP COLUMN charged_tokens;
ALTER TABLE sessions DROP COLUMN tokens_charged;
