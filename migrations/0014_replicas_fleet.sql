-- Replicas that heartbeat, so a survivor of a crash claims its fair share of
-- the orphaned sessions rather than all of them (issue 35, item 5). Each
-- replica upserts its row on every heartbeat and deletes it when it drains;
-- a row whose heartbeat is older than two intervals is a replica gone.
CREATE TABLE replicas (
    id            uuid PRIMARY KEY,
    heartbeat_at  timestamptz NOT NULL DEFAULT now(),
    started_at    timestamptz NOT NULL DEFAULT now()
);
