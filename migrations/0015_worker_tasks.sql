-- Workers: agents that call Warden, long-poll a queue for the steps of
-- sessions whose executor is `worker`, heartbeat while they work and report
-- the outcome. A worker key is bound to a tenant and a non-empty set of queues.
ALTER TABLE api_keys DROP CONSTRAINT api_keys_role_check;
ALTER TABLE api_keys ADD CONSTRAINT api_keys_role_check
    CHECK (role IN ('admin', 'operator', 'viewer', 'worker'));
ALTER TABLE api_keys ADD COLUMN queues text[] NOT NULL DEFAULT '{}';
ALTER TABLE api_keys ADD CONSTRAINT api_keys_worker_queues
    CHECK ((role = 'worker') = (cardinality(queues) > 0));

DROP TRIGGER api_keys_changed ON api_keys;
CREATE TRIGGER api_keys_changed
    AFTER INSERT OR DELETE OR UPDATE OF prefix, hash, tenant, role, global, revoked_at, queues
    ON api_keys FOR EACH ROW EXECUTE FUNCTION warden_keys_changed();

-- One row per step offered to workers (a resumed session offers its step
-- again as a new row with the same idempotency key). Only a digest of the
-- lease token is kept.
CREATE TABLE worker_tasks (
    id                   uuid PRIMARY KEY,
    session_id           uuid NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    tenant               text NOT NULL,
    queue                text NOT NULL,
    labels               jsonb NOT NULL DEFAULT '{}',
    iteration            bigint NOT NULL,
    attempt              integer NOT NULL DEFAULT 1,
    heartbeat_timeout_ms bigint NOT NULL,
    state                text NOT NULL
        CHECK (state IN ('pending', 'claimed', 'completed', 'failed', 'cancelled')),
    idempotency_key      text NOT NULL,
    context              jsonb NOT NULL,
    offered_at           timestamptz NOT NULL DEFAULT now(),
    created_at           timestamptz NOT NULL DEFAULT now(),
    claimed_at           timestamptz,
    lease_digest         bytea,
    lease_expires_at     timestamptz,
    worker               text,
    progress             text,
    outcome              jsonb,
    last_error           text,
    retryable            boolean NOT NULL DEFAULT true,
    cancel_reason        text,
    updated_at           timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX worker_tasks_offered ON worker_tasks (queue, offered_at, id) WHERE state = 'pending';
CREATE INDEX worker_tasks_open ON worker_tasks (session_id) WHERE state IN ('pending', 'claimed');

-- Workers seen claiming, per tenant and queue, for the queue listing.
CREATE TABLE workers_seen (
    tenant        text NOT NULL,
    queue         text NOT NULL,
    worker        text NOT NULL,
    last_seen_at  timestamptz NOT NULL DEFAULT now(),
    task_id       uuid,
    PRIMARY KEY (tenant, queue, worker)
);
