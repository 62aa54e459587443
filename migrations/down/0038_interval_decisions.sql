-- Reverses migrations/0038_interval_decisions.sql (`warden migrate
-- --down-to 37`). Loses nothing: the index of 0001 again.
DROP INDEX events_decisions;
CREATE INDEX events_decisions ON events (session_id, seq)
    WHERE kind IN ('gate_decision', 'stuck_detected', 'guardrail_tripped', 'status_changed');
