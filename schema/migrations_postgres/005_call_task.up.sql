-- Tasks: the columns of SQLite's 008_call_task (see ../migrations/ for
-- what each means), in PostgreSQL's types.
ALTER TABLE calls ADD COLUMN task_id TEXT;
ALTER TABLE calls ADD COLUMN task_params TEXT;
ALTER TABLE calls ADD COLUMN task_ttl_ms BIGINT;
ALTER TABLE calls ADD COLUMN task_poll_ms BIGINT NOT NULL DEFAULT 0;
ALTER TABLE calls ADD COLUMN task_end TEXT NOT NULL DEFAULT '' CHECK (task_end IN ('', 'cancelled', 'failed'));
ALTER TABLE calls ADD COLUMN task_error_code INTEGER NOT NULL DEFAULT 0;
ALTER TABLE calls ADD COLUMN task_cancel INTEGER NOT NULL DEFAULT 0;
CREATE UNIQUE INDEX calls_task ON calls (task_id) WHERE task_id IS NOT NULL;
CREATE INDEX calls_task_in_flight ON calls (owner) WHERE state = 'in_flight' AND task_id IS NOT NULL;
