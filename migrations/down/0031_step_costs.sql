-- Reverses migrations/0031_step_costs.sql (`warden migrate --down-to 30`).
-- Loses the step costs and the sessions' sums (the tokens stay).
ALTER TABLE sessions DROP COLUMN unpriced_steps, DROP COLUMN cost_usd;
ALTER TABLE iterations DROP COLUMN price_valid_from, DROP COLUMN price_pattern,
    DROP COLUMN cost_usd, DROP COLUMN usage;
