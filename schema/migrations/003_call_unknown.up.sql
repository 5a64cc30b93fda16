-- calls gains the state 'unknown' and the column on_lost.
--
-- unknown: the call was forwarded to a process whose work is outside the
-- call's transaction (an upstream tool server behind `mcp-outbox proxy`
-- that does not record its outcome in this database), and its outcome was
-- lost. It may or may not have run. It is never run again automatically: a
-- retry gets an "outcome unknown" error until an operator settles it
-- (`mcp-outbox outbox resolve-call`). Retention never purges it.
--
-- on_lost says what an abandoned in_flight claim (its owner gone, its lease
-- past) means:
--   rerun    nothing of the attempt committed, so the next attempt runs the
--            call (effects and the handler's writes are only written with
--            the outcome). Every claim made before this migration is one.
--   unknown  the attempt forwarded the call to a process whose work is
--            outside the call's transaction: whoever finds the claim
--            abandoned turns the call into state 'unknown' instead of
--            running it again.
--
-- SQLite cannot change a CHECK constraint in place, so the table is rebuilt
-- by SQLite's documented procedure (https://sqlite.org/lang_altertable.html,
-- "Making Other Kinds Of Table Schema Changes"): create the new table, copy
-- every row with its id, drop the old table, rename the new one, recreate
-- the index (and add one for unknown calls). schema.DB.Migrate runs migrations with foreign key enforcement
-- off and checks the foreign keys (PRAGMA foreign_key_check) before it
-- commits: with enforcement on, DROP TABLE calls would delete every row
-- first and so set effects.call_id to NULL (ON DELETE SET NULL).
-- effects.call_id keeps referring to "calls" by name, which after the
-- rename is the new table.
CREATE TABLE calls_new (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    uid          TEXT    NOT NULL UNIQUE,  -- random name of this call; effect keys derive from it
    principal    TEXT    NOT NULL,
    key          TEXT    NOT NULL,
    key_source   TEXT    NOT NULL,         -- meta | params | header | argument | fingerprint
    tool         TEXT    NOT NULL,
    args_hash    TEXT    NOT NULL,         -- SHA-256 of the canonical arguments
    state        TEXT    NOT NULL CHECK (state IN ('in_flight', 'completed', 'failed', 'unknown')),
    owner        TEXT    NOT NULL DEFAULT '',  -- attempt holding an in_flight claim
    lease_until  INTEGER NOT NULL DEFAULT 0,   -- unix ms; a claim past it may be taken over
    attempts     INTEGER NOT NULL DEFAULT 1,   -- claims made on this row
    result       TEXT,                         -- protocol-neutral JSON of the tool result
    created_at   INTEGER NOT NULL,             -- unix ms of the first claim
    completed_at INTEGER,                      -- unix ms of the commit of the outcome
    expires_at   INTEGER NOT NULL,             -- unix ms after which the key may run again
    on_lost      TEXT    NOT NULL DEFAULT 'rerun'
                 CHECK (on_lost IN ('rerun', 'unknown')),  -- what an abandoned in_flight claim means
    UNIQUE (principal, key)
);

INSERT INTO calls_new (id, uid, principal, key, key_source, tool, args_hash, state, owner, lease_until,
                       attempts, result, created_at, completed_at, expires_at)
SELECT id, uid, principal, key, key_source, tool, args_hash, state, owner, lease_until,
       attempts, result, created_at, completed_at, expires_at
FROM calls;

-- Keep the AUTOINCREMENT sequence: it may be past the largest id left (the
-- newest calls purged), and an id must never be handed out twice. The old
-- table's counter becomes the new table's; dropping calls then finds no
-- counter of its own to delete, and the rename carries it over.
DELETE FROM sqlite_sequence WHERE name = 'calls_new';
UPDATE sqlite_sequence SET name = 'calls_new' WHERE name = 'calls';

DROP TABLE calls;
ALTER TABLE calls_new RENAME TO calls;

CREATE INDEX calls_expiry ON calls (expires_at);

-- Unknown calls are few and wait for an operator; operators' listings and
-- the metrics count them on every scrape, without reading every call.
CREATE INDEX calls_unknown ON calls (created_at) WHERE state = 'unknown';
