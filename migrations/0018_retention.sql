-- Retention (issue 33, part 3): ended sessions older than their tenant's
-- retention are exported to an archive file and deleted; long sessions'
-- events are compacted past a horizon; an archive can be imported back,
-- read-only.

-- A tenant's own retention, over `WARDEN_RETENTION_DAYS`. A row whose
-- `retention_seconds` is NULL keeps that tenant's sessions forever; no row
-- means the server's setting.
CREATE TABLE tenant_retention (
    tenant             text PRIMARY KEY,
    retention_seconds  bigint CHECK (retention_seconds IS NULL OR retention_seconds >= 0),
    updated_at         timestamptz NOT NULL DEFAULT now()
);

-- Set when the session was brought back from an archive: it is read-only
-- (resume, stop, pause, refine and update answer 409), and its retention
-- counts from this time, not from when it ended.
ALTER TABLE sessions ADD COLUMN imported_at timestamptz;

-- The pruner finds ended sessions oldest first. The predicate names only
-- `ended_at`, which an iteration's commit never writes, so commits stay
-- heap-only updates.
CREATE INDEX sessions_ended ON sessions (ended_at, id) WHERE ended_at IS NOT NULL;

-- How far each session's events were compacted, so a pass reads only the
-- events appended since the last one. Kept apart from `sessions`: the
-- pruner never writes a running session's row.
CREATE TABLE event_compaction (
    session_id   uuid PRIMARY KEY REFERENCES sessions (id) ON DELETE CASCADE,
    through_seq  bigint NOT NULL,
    dropped      bigint NOT NULL DEFAULT 0,
    compacted_at timestamptz NOT NULL DEFAULT now()
);

-- Background work that one replica of the fleet does at a time (the
-- pruner): a lease any replica takes once the holder's has run out.
CREATE TABLE maintenance_leases (
    name        text PRIMARY KEY,
    holder      uuid NOT NULL,
    expires_at  timestamptz NOT NULL
);
