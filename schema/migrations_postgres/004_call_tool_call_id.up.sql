-- calls.tool_call_id: the model's id for the tool call, '' when the host
-- sent none; see the SQLite migration 007_call_tool_call_id for what it is
-- and who writes it. Adding a column with a constant default rewrites no
-- rows (PostgreSQL 11 and later).
ALTER TABLE calls ADD COLUMN tool_call_id TEXT NOT NULL DEFAULT '';
