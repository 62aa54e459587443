-- Reverses migrations/0032_budget_warnings.sql (`warden migrate --down-to
-- 31`). Loses nothing: an index only.
DROP INDEX events_budget_warnings;
