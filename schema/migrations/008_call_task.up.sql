-- Tasks (MCP 2026-07-28 extension io.modelcontextprotocol/tasks): a call
-- answered with a task keeps the task's columns in its own row, so that the
-- task is exactly as durable as the call, is found by the same key (a
-- client that lost its CreateTaskResult retries and gets the same task),
-- and goes with the call at retention.
--
--   task_id          the task's id, unguessable (random), NULL for a call
--                    that is no task; a task is looked up by principal and
--                    id, so another principal never finds it
--   task_params      the tools/call params needed to run the task again
--                    ({"name","arguments","_meta"} as JSON) while it is
--                    in_flight: a process that takes over a task whose
--                    owner died runs it from these. Sensitive like the
--                    arguments: cleared when the task ends, never logged
--   task_ttl_ms      ttlMs told to clients
--   task_poll_ms     pollIntervalMs told to clients
--   task_end         '' (the state says: in_flight is working, completed
--                    and failed are completed), 'cancelled' (cancelled
--                    before its commit: nothing of it was kept) or 'failed'
--                    (ended with an error that is no tool result); the
--                    state of such a row is 'failed', and its result an
--                    isError tool result saying so, replayed to a retry
--   task_error_code  the JSON-RPC error code of a task_end 'failed'
--   task_cancel      1 once tasks/cancel asked for the task to stop: the
--                    owner's commit refuses to record an outcome then
ALTER TABLE calls ADD COLUMN task_id TEXT;
ALTER TABLE calls ADD COLUMN task_params TEXT;
ALTER TABLE calls ADD COLUMN task_ttl_ms INTEGER;
ALTER TABLE calls ADD COLUMN task_poll_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE calls ADD COLUMN task_end TEXT NOT NULL DEFAULT '' CHECK (task_end IN ('', 'cancelled', 'failed'));
ALTER TABLE calls ADD COLUMN task_error_code INTEGER NOT NULL DEFAULT 0;
ALTER TABLE calls ADD COLUMN task_cancel INTEGER NOT NULL DEFAULT 0;
CREATE UNIQUE INDEX calls_task ON calls (task_id) WHERE task_id IS NOT NULL;
-- The task runner's scan: tasks still in flight, few at any time.
CREATE INDEX calls_task_in_flight ON calls (owner) WHERE state = 'in_flight' AND task_id IS NOT NULL;
