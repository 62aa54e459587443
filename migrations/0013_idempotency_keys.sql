-- Retry-safe creates: a client sends `Idempotency-Key` with a create, and a
-- retry with the same key (within the tenant, for 24 hours) gets the session
-- the first request created instead of a second one. The row is written in
-- the create's own transaction, so a create that fails leaves no key behind,
-- and it goes with its session when the session is deleted.
CREATE TABLE idempotency_keys (
    tenant         text        NOT NULL,
    key            text        NOT NULL,
    request_digest bytea       NOT NULL,
    session_id     uuid        NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, key)
);
CREATE INDEX idempotency_keys_session ON idempotency_keys (session_id);
CREATE INDEX idempotency_keys_created_at ON idempotency_keys (created_at);
