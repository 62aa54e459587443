-- Soft budgets: a session's status lists the `budget_warning` events it
-- logged (src/store/sessions.rs, select_session_with). A session logs at
-- most a few, among thousands of other events: a partial index finds them
-- without reading the rest.
CREATE INDEX events_budget_warnings ON events (session_id, seq)
    WHERE kind = 'budget_warning';
