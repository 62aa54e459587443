-- Trace links kept with the session (src/store/trace_links.rs), so a run
-- started on any replica links its `invoke_agent` span to the API request
-- that created or last resumed the session, and to the session's previous
-- run: W3C traceparents, written only while traces are exported.
ALTER TABLE sessions
    ADD COLUMN request_traceparent text
        CHECK (char_length(request_traceparent) <= 128),
    ADD COLUMN run_traceparent text
        CHECK (char_length(run_traceparent) <= 128);
