-- A change of the adaptive reflection interval is a decision the session
-- took (issue 44): `GET /api/autonomous/{id}/decisions` lists
-- `reflection_interval_changed` events (src/store/event_log.rs `decisions`).
-- The partial index that page reads by names the decision kinds in its
-- predicate, so it is recreated with the new kind among them. (A release
-- before this one still reads by it: its kinds are a subset.)
DROP INDEX events_decisions;
CREATE INDEX events_decisions ON events (session_id, seq)
    WHERE kind IN ('gate_decision', 'stuck_detected', 'guardrail_tripped', 'status_changed',
                   'reflection_interval_changed');
