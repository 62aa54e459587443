-- Reverses migrations/0022_tree_attention_and_reservations.sql (`warden
-- migrate --down-to 21`). Loses each session's `on_child_pause` choice
-- (children pause and wait again, the previous release's only way), its
-- reservation mark and the tokens its parent forgave: the previous release
-- reads none of them.
DROP TRIGGER sessions_child_parent_ended ON sessions;
DROP FUNCTION warden_child_parent_ended();
DROP TRIGGER sessions_child_needs_attention ON sessions;
DROP FUNCTION warden_child_needs_attention();
ALTER TABLE sessions
    DROP COLUMN forgiven_tokens,
    DROP COLUMN reserved_through,
    DROP COLUMN on_child_pause;
