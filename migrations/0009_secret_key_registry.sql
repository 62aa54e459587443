-- The fleet's sealing key, by id (never the key). A replica starts only
-- when its key is this one, or when this one is among its previous keys
-- (WARDEN_SECRET_KEY_PREVIOUS: a rotation, after which its key is
-- registered here). Without the registry a replica given another key
-- started and failed every session it claimed whose secret it could not
-- open; now it refuses to start and says which key the database uses.
CREATE TABLE secret_key (
    only_row  boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    key_id    text NOT NULL,
    set_at    timestamptz NOT NULL DEFAULT now()
);

-- Start-up looks for secrets sealed under keys other than the ring's, and
-- a rotation seals again what a previous key sealed: both by key.
CREATE INDEX session_secrets_by_key ON session_secrets (key_id);
