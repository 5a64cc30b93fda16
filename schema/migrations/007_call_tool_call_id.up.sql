-- calls.tool_call_id: the model's id for the tool call, as the host sent it
-- in params._meta (Claude Code: "claudecode/toolUseId", e.g. toolu_…), ''
-- when it sent none. It lets an operator find a call from a transcript. It
-- is not a key and takes no part in finding a call's row: a model that
-- retries makes a new tool call with a new id. The row keeps the id of the
-- attempt that claimed it (a takeover writes its own); a replay's id is in
-- its own call event and span only. The layer stores at most 200 bytes,
-- without control characters. The default keeps existing rows, and the
-- INSERTs of older binaries and of upstreams, as they are.
ALTER TABLE calls ADD COLUMN tool_call_id TEXT NOT NULL DEFAULT '';
