-- API keys and tenants. A key is stored only as the SHA-256 of its secret,
-- found by its short public prefix; every session belongs to the tenant of
-- the key that created it ('default' for sessions from before keys).

CREATE TABLE api_keys (
    id            uuid PRIMARY KEY,
    prefix        text NOT NULL UNIQUE,
    hash          bytea NOT NULL,
    tenant        text NOT NULL,
    role          text NOT NULL CHECK (role IN ('admin', 'operator', 'viewer')),
    name          text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_used_at  timestamptz,
    revoked_at    timestamptz
);

ALTER TABLE sessions ADD COLUMN tenant text NOT NULL DEFAULT 'default';

-- Which key acted: a request's transaction sets warden.actor (a key's public
-- prefix, never its secret) and every event it appends records it.
ALTER TABLE events ADD COLUMN actor text DEFAULT nullif(current_setting('warden.actor', true), '');

CREATE INDEX sessions_tenant_created ON sessions (tenant, created_at DESC, id DESC);
