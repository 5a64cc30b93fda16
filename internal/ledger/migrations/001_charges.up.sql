-- The example payments ledger behind `mcp-outbox serve`.
CREATE TABLE charges (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    amount      INTEGER NOT NULL CHECK (amount > 0),  -- minor units (cents)
    currency    TEXT    NOT NULL,
    created_at  INTEGER NOT NULL,                      -- unix ms
    refunded_at INTEGER                                -- unix ms, NULL until refunded
);
