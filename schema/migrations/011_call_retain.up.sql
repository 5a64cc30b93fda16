-- calls.retain_ms: the least time, in ms after its completion, that a
-- finished call's row is kept, from its tool's retention
-- (outbox.ToolRetention.Outcome) when the call was claimed. NULL means
-- none of its own: the purge applies its Retention.Calls, as it did to
-- every row before this column, so existing rows, and the INSERTs of
-- older binaries, keep the server's default. The purge reads it in SQL
-- (coalesce(completed_at, created_at) + coalesce(retain_ms, Calls) <= now).
ALTER TABLE calls ADD COLUMN retain_ms INTEGER;
