-- Money (issue 43): what each committed step cost at the operator's price
-- table (WARDEN_MODEL_PRICES), and each session's sum.
--
-- An iteration keeps the usage it was priced from (input, output, cached
-- and reasoning tokens and the model, as JSON), its cost (exact, NULL when
-- it was not priced: no entry of the table names its model, or it was
-- committed before this migration) and the entry that priced it (pattern
-- and first day), so a price change never reprices history silently.
ALTER TABLE iterations
    ADD COLUMN usage json,
    ADD COLUMN cost_usd numeric,
    ADD COLUMN price_pattern text,
    ADD COLUMN price_valid_from date;

-- The sum of the session's step costs and the number of its steps that
-- used tokens no entry priced, both added in the statement that inserts
-- the iteration (src/store/group_commit.rs), so the sum is exact.
ALTER TABLE sessions
    ADD COLUMN cost_usd numeric NOT NULL DEFAULT 0,
    ADD COLUMN unpriced_steps bigint NOT NULL DEFAULT 0;
