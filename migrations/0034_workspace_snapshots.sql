-- Workspace snapshots (issue 44): the files a session's agent wrote, kept in
-- Postgres (sessions move between replicas, a disk stays on one) as
-- content-addressed blobs, one per tenant and SHA-256, stored once however
-- many checkpoints hold them; a manifest per checkpoint names them by path.
-- A snapshot also keeps what a fork starts from beside the workspace: the
-- session's memory, context cycle and task queue as of the checkpoint.
CREATE TABLE workspace_blobs (
    tenant      text        NOT NULL,
    digest      bytea       NOT NULL CHECK (octet_length(digest) = 32),
    size        bigint      NOT NULL CHECK (size >= 0),
    content     bytea       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, digest)
);

CREATE TABLE workspace_snapshots (
    session_id  uuid        NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    iteration   bigint      NOT NULL CHECK (iteration >= 0),
    tenant      text        NOT NULL,
    files       bigint      NOT NULL,
    bytes       bigint      NOT NULL,
    memory      text        NOT NULL DEFAULT '',
    cycle       integer     NOT NULL DEFAULT 1,
    tasks       json        NOT NULL DEFAULT '[]',
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, iteration)
);

-- One row per file per snapshot: metadata only, the content is the blob.
CREATE TABLE workspace_files (
    session_id          uuid    NOT NULL,
    iteration           bigint  NOT NULL,
    path                text    NOT NULL,
    tenant              text    NOT NULL,
    digest              bytea   NOT NULL,
    size                bigint  NOT NULL,
    mode                integer NOT NULL,
    modified_iteration  bigint  NOT NULL,
    PRIMARY KEY (session_id, iteration, path),
    FOREIGN KEY (session_id, iteration)
        REFERENCES workspace_snapshots (session_id, iteration) ON DELETE CASCADE,
    -- A blob cannot go while a manifest names it: the sweep of unreferenced
    -- blobs and a snapshot reusing one cannot both win.
    FOREIGN KEY (tenant, digest) REFERENCES workspace_blobs (tenant, digest)
);

CREATE INDEX workspace_files_by_blob ON workspace_files (tenant, digest);

-- A fork names the session and checkpoint it started from.
ALTER TABLE sessions
    ADD COLUMN forked_from_session   uuid,
    ADD COLUMN forked_from_iteration bigint;
