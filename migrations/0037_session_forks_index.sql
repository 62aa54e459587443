-- The forks of a session, for the tree view (src/store/children.rs
-- `forks_of`): a session's forks are found by the session they were forked
-- from. Partial: only forks carry `forked_from_session`.
CREATE INDEX sessions_forks ON sessions (forked_from_session)
    WHERE forked_from_session IS NOT NULL;
