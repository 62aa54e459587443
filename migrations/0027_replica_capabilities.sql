-- Mixed versions never run what they cannot (issue 42). Every replica says
-- what it can run (`replicas.capabilities`, written by its heartbeat), every
-- session what it needs (`sessions.needs`, derived here from its limits and
-- executor on every insert and change, whichever binary writes it), and a
-- replica takes a lease only on a session whose needs it covers.
--
-- Expand only: new columns with defaults, a function and two triggers. The
-- previous release keeps working on this schema: its INSERT into
-- `replicas` leaves `capabilities` empty, so the lease trigger below keeps
-- it off every session that needs something (its claim skips those rows,
-- as if another replica held them) and it runs the rest as before.
-- Reversible: migrations/down/0027_replica_capabilities.sql. Nothing to
-- drop later.

ALTER TABLE replicas ADD COLUMN capabilities text[] NOT NULL DEFAULT '{}';
-- The binary's version and the newest migration it knows, for operators
-- reading the fleet during a rollout (NULL: a release before this one).
ALTER TABLE replicas ADD COLUMN version text;
ALTER TABLE replicas ADD COLUMN schema_version bigint;

ALTER TABLE sessions ADD COLUMN needs text[] NOT NULL DEFAULT '{}';

-- What a session needs of the replica that runs it: the features an older
-- binary would ignore (a safety rule skipped) or fail on. The same rule as
-- `spec::needs` in Rust (a test compares the two); a release that adds a
-- capability replaces this function in its own migration.
CREATE FUNCTION warden_session_needs(limits jsonb, executor jsonb) RETURNS text[]
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN array_remove(ARRAY[
        CASE WHEN jsonb_path_exists(executor, '$.steps[*].delegate[*]')
               OR jsonb_path_exists(executor, '$.scripts.*[*].delegate[*]')
             THEN 'delegate' END,
        CASE WHEN jsonb_typeof(limits->'review_every') = 'number'
               AND (limits->>'review_every')::numeric > 0
             THEN 'review_every' END,
        CASE WHEN executor->>'kind' = 'llm' AND executor ? 'approvals'
             THEN 'approvals' END,
        CASE WHEN executor->>'kind' = 'llm'
               AND jsonb_path_exists(executor, '$.tools[*] ? (@ != "builtin")')
             THEN 'mcp_tools' END
    ], NULL);

CREATE FUNCTION warden_sessions_needs() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    NEW.needs := warden_session_needs(NEW.limits, NEW.executor);
    RETURN NEW;
END $$;

CREATE TRIGGER sessions_needs BEFORE INSERT OR UPDATE OF limits, executor ON sessions
    FOR EACH ROW EXECUTE FUNCTION warden_sessions_needs();

-- A new lease (a claim from the queue, a rescue, a resume) taken by a
-- replica whose capabilities do not cover the session's needs is not
-- written: the row is skipped, so the claim of any release, this one's or
-- an older one that knows nothing of needs, simply does not get it.
CREATE FUNCTION warden_lease_needs_capabilities() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.needs <@ coalesce((SELECT r.capabilities FROM replicas r WHERE r.id = NEW.owner), '{}') THEN
        RETURN NEW;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER sessions_lease_capabilities BEFORE UPDATE OF lease_token ON sessions
    FOR EACH ROW
    WHEN (NEW.owner IS NOT NULL AND NEW.lease_token IS NOT NULL
          AND NEW.lease_token IS DISTINCT FROM OLD.lease_token
          AND cardinality(NEW.needs) > 0)
    EXECUTE FUNCTION warden_lease_needs_capabilities();

-- Sessions written before this migration: only those that need something
-- are rewritten.
UPDATE sessions SET needs = warden_session_needs(limits, executor)
WHERE cardinality(warden_session_needs(limits, executor)) > 0;
