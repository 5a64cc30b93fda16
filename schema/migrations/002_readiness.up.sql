-- readiness: one row that readiness checks write, to prove the database
-- accepts writes (a full disk or a read-only file fails here first).
CREATE TABLE readiness (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    checked_at INTEGER NOT NULL  -- unix ms of the last successful check
);
