-- calls.retain_ms: a call's own outcome retention, NULL for the purge's
-- default; see the SQLite migration 011_call_retain for what it is and who
-- writes it. A nullable column without a default rewrites no rows.
ALTER TABLE calls ADD COLUMN retain_ms BIGINT;
