-- A person may approve a call with arguments of their own in place of the
-- agent's: the call runs with `edited_arguments`, while `arguments` keeps
-- what the agent asked for, so the row shows both. NULL: it ran (or would
-- run) as asked. Only an approval carries edits.
ALTER TABLE approvals ADD COLUMN edited_arguments jsonb;
ALTER TABLE approvals ADD CONSTRAINT approvals_edits_are_approvals
    CHECK (edited_arguments IS NULL OR decision = 'approve');
