-- Notifications: where a tenant or one session wants to hear about events
-- that need a person (approvals, pauses, warnings, confirmations, ends),
-- a durable outbox of deliveries, and the tenant's signing secret.

-- A target: the tenant's (session_id NULL) or one session's. Disabled when
-- a receiver answered 410 Gone; setting it again enables it.
CREATE TABLE notify_targets (
    id              bigserial PRIMARY KEY,
    tenant          text NOT NULL,
    session_id      uuid REFERENCES sessions (id) ON DELETE CASCADE,
    url             text NOT NULL,
    format          text NOT NULL DEFAULT 'standard' CHECK (format IN ('standard', 'slack')),
    disabled_at     timestamptz,
    disabled_reason text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

CREATE UNIQUE INDEX notify_targets_of_tenant ON notify_targets (tenant) WHERE session_id IS NULL;
CREATE UNIQUE INDEX notify_targets_of_session ON notify_targets (session_id) WHERE session_id IS NOT NULL;

-- A tenant's signing secret, sealed as sessions' secrets are (the store
-- keeps only ciphertext). The previous one signs too for a day after a
-- rotation, so receivers can switch without dropping a message.
CREATE TABLE notify_secrets (
    tenant          text PRIMARY KEY,
    key_id          text NOT NULL,
    nonce           bytea NOT NULL,
    ciphertext      bytea NOT NULL,
    previous_key_id text,
    previous_nonce  bytea,
    previous_ciphertext bytea,
    rotated_at      timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now()
);

-- The outbox: one row per event and target. `id` is the `webhook-id`,
-- stable across retries; `body` is the exact bytes signed and sent, fixed
-- at the first attempt. A pending row is due at `next_attempt_at`; a
-- replica that takes one moves it a lease ahead, so a replica killed
-- mid-delivery leaves it to be taken again (at least once).
CREATE TABLE notifications (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant          text NOT NULL,
    session_id      uuid NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    seq             bigint NOT NULL,
    kind            text NOT NULL,
    target_id       bigint NOT NULL REFERENCES notify_targets (id) ON DELETE CASCADE,
    status          text NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'delivered', 'failed', 'disabled')),
    body            bytea,
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_error      text,
    last_status     integer,
    created_at      timestamptz NOT NULL DEFAULT now(),
    delivered_at    timestamptz,
    UNIQUE (target_id, session_id, seq)
);

CREATE INDEX notifications_due ON notifications (next_attempt_at) WHERE status = 'pending';
CREATE INDEX notifications_of_session ON notifications (session_id, created_at, id);

-- In the transaction that logs an event: an outbox row for each enabled
-- target of its session or tenant, when the event is one a person hears
-- about (policy::notify::notifies says the same; a test checks the names).
-- A commit that logs the event has its notification too, so a kill -9
-- after it still delivers. Most events leave at the first test.
CREATE FUNCTION warden_notify_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT (NEW.kind IN ('approval_requested', 'budget_warning', 'awaiting_confirmation')
            OR (NEW.kind = 'status_changed'
                AND NEW.data ->> 'to' IN ('completed', 'stopped', 'interrupted', 'failed',
                                          'paused', 'awaiting_confirmation')
                AND NOT (NEW.data ->> 'to' = 'paused'
                         AND coalesce(NEW.data ->> 'reason', '') IN ('user_pause', 'waiting_for_children'))))
    THEN
        RETURN NULL;
    END IF;
    INSERT INTO notifications (tenant, session_id, seq, kind, target_id)
    SELECT s.tenant, NEW.session_id, NEW.seq, NEW.kind, t.id
      FROM sessions s
      JOIN notify_targets t
        ON t.tenant = s.tenant AND (t.session_id IS NULL OR t.session_id = s.id)
     WHERE s.id = NEW.session_id AND t.disabled_at IS NULL
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;

-- The WHEN spares the busy kinds (steps, usage) even the function call.
CREATE TRIGGER events_notify AFTER INSERT ON events
    FOR EACH ROW
    WHEN (NEW.kind IN ('approval_requested', 'budget_warning', 'awaiting_confirmation', 'status_changed'))
    EXECUTE FUNCTION warden_notify_event();
