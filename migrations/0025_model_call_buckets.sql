-- The per-tenant rate limit of model calls on the server's model
-- (WARDEN_TENANT_MODEL_CALLS_PER_MINUTE), counted once for the whole fleet:
-- one token bucket per tenant, refilled by the database's clock, taken
-- from in one statement by whichever replica makes the call.
CREATE TABLE model_call_buckets (
    tenant      text PRIMARY KEY,
    -- Calls left; refilled continuously at the limit per minute, up to it.
    tokens      double precision NOT NULL,
    refilled_at timestamptz NOT NULL,
    -- Whether the last take was admitted (it debited the bucket).
    admitted    boolean NOT NULL
);
