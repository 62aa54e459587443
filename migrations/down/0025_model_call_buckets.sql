-- Reverses migrations/0025_model_call_buckets.sql (`warden migrate
-- --down-to 23`). Loses the fleet's model-call buckets: they refill from
-- full when the migration is applied again.
DROP TABLE model_call_buckets;
