-- calls: one row per logical tool call, keyed by (principal, key).
--
-- A row is written in state 'in_flight' when an attempt claims the key, in its
-- own short transaction, so that other attempts and other processes can see
-- that the call is running. The attempt then runs the tool handler in a second
-- transaction that also writes the handler's rows, its effects and the final
-- state ('completed' or 'failed') with the result; that transaction commits
-- only while the row still names the attempt as owner (the fence).
CREATE TABLE calls (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    uid          TEXT    NOT NULL UNIQUE,  -- random name of this call; effect keys derive from it
    principal    TEXT    NOT NULL,
    key          TEXT    NOT NULL,
    key_source   TEXT    NOT NULL,         -- meta | params | header | argument | fingerprint
    tool         TEXT    NOT NULL,
    args_hash    TEXT    NOT NULL,         -- SHA-256 of the canonical arguments
    state        TEXT    NOT NULL CHECK (state IN ('in_flight', 'completed', 'failed')),
    owner        TEXT    NOT NULL DEFAULT '',  -- attempt holding an in_flight claim
    lease_until  INTEGER NOT NULL DEFAULT 0,   -- unix ms; a claim past it may be taken over
    attempts     INTEGER NOT NULL DEFAULT 1,   -- claims made on this row
    result       TEXT,                         -- protocol-neutral JSON of the tool result
    created_at   INTEGER NOT NULL,             -- unix ms of the first claim
    completed_at INTEGER,                      -- unix ms of the commit of the outcome
    expires_at   INTEGER NOT NULL,             -- unix ms after which the key may run again
    UNIQUE (principal, key)
);

-- effects: the outbox. Rows are only ever inserted by the transaction that
-- records the call's outcome, so an effect exists if and only if its call
-- committed. The dispatcher owns every column after 'idempotency_key'.
--
-- States: pending (due at next_attempt_at), in_flight (leased by a
-- dispatcher), delivered (2xx), dead (gave up: 4xx or limits), unknown (an
-- at_most_once destination may or may not have applied it; never re-sent
-- automatically), cancelled (by an operator).
CREATE TABLE effects (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    call_id         INTEGER REFERENCES calls (id) ON DELETE SET NULL,
    seq             INTEGER NOT NULL,          -- position within the call, from 1
    destination     TEXT    NOT NULL,
    method          TEXT    NOT NULL,
    path            TEXT    NOT NULL,
    headers         TEXT    NOT NULL DEFAULT '{}',  -- JSON object of string to string
    body            BLOB,
    idempotency_key TEXT    NOT NULL UNIQUE,   -- sent on every attempt
    state           TEXT    NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending', 'in_flight', 'delivered', 'dead', 'unknown', 'cancelled')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL,          -- unix ms
    lease_owner     TEXT    NOT NULL DEFAULT '',  -- dispatcher holding an in_flight effect
    lease_until     INTEGER NOT NULL DEFAULT 0,   -- unix ms; past it the effect is reclaimed
    send_started_at INTEGER,                      -- at_most_once only: the request may have left
    last_error      TEXT    NOT NULL DEFAULT '',
    last_status     INTEGER NOT NULL DEFAULT 0,
    response        TEXT,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    delivered_at    INTEGER
);

CREATE INDEX effects_due ON effects (destination, state, next_attempt_at);
CREATE INDEX effects_state ON effects (state, lease_until);
CREATE INDEX effects_call ON effects (call_id, seq);
CREATE INDEX calls_expiry ON calls (expires_at);
