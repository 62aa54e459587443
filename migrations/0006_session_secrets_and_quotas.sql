-- Secrets at rest (issue 15, item 6): a session's own API key lives here,
-- sealed (XChaCha20-Poly1305) under a key kept outside the database, apart
-- from the session's public record. `key_id` names the sealing key so a
-- wrong key is reported as such and keys can be rotated later. Rows written
-- by earlier versions (the key in plaintext in sessions.executor) are moved
-- here when Warden starts, since only the process knows the key.
CREATE TABLE session_secrets (
    session_id  uuid NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    name        text NOT NULL,
    key_id      text NOT NULL,
    nonce       bytea NOT NULL,
    ciphertext  bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, name)
);

-- Lists read only summary columns (item 7): what the list view shows of the
-- executor, kept small by Postgres itself, so a page never reads the
-- executor JSON (scripted steps can make it megabytes).
-- (jsonb_build_object is only marked stable for its "any" arguments; with
-- jsonb arguments it is immutable, as a generated column needs.)
CREATE FUNCTION warden_executor_summary(executor jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT jsonb_strip_nulls(jsonb_build_object(
        'kind', executor -> 'kind',
        'steps', CASE WHEN jsonb_typeof(executor -> 'steps') = 'array'
                      THEN to_jsonb(jsonb_array_length(executor -> 'steps')) END,
        'repeat', executor -> 'repeat',
        'model', executor -> 'model',
        'url', coalesce(executor -> 'url', executor -> 'base_url')))
$$;

ALTER TABLE sessions ADD COLUMN executor_summary jsonb NOT NULL
    GENERATED ALWAYS AS (warden_executor_summary(executor)) STORED;

-- The running-sessions quota counts a tenant's active sessions.
CREATE INDEX sessions_tenant_active ON sessions (tenant)
    WHERE status IN ('running', 'awaiting_refinement', 'queued');
