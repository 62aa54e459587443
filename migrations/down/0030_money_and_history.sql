-- Reverses migrations/0030_money_and_history.sql (`warden migrate
-- --down-to 29`). Loses nothing: an index only.
DROP INDEX sessions_completed_by_kind;
