-- data_keys: the data keys of envelope encryption (package outbox/seal).
-- With a key file (--encryption-key-file) the layer seals every recorded
-- result, task's arguments, effect body and headers with AES-256-GCM under
-- a data key of the call's principal; the data key is stored here wrapped
-- (encrypted) by a key of the key file, named by key_id.
--
--   purpose  'seal': a principal's key for values; 'hash': the one key
--            (principal '') of the keyed args_hash and fingerprints
--   wrapped  NULL once erased: forgetting a principal deletes its data key,
--            which makes everything sealed under it unreadable for good
--            (crypto-erasure); the row stays, so that a value under it
--            reads as erased rather than as tampered
--
-- A principal has one live key of each purpose, or a few: two processes
-- that seal its first value at once both create one, and a key wrapped by
-- a key the key file lacks is passed over for a new one. A principal
-- forgotten and seen again gets a new one.
CREATE TABLE data_keys (
    id         TEXT    PRIMARY KEY,
    principal  TEXT    NOT NULL,
    purpose    TEXT    NOT NULL CHECK (purpose IN ('seal', 'hash')),
    key_id     TEXT    NOT NULL,
    wrapped    BLOB,
    created_at INTEGER NOT NULL,  -- unix ms
    erased_at  INTEGER            -- unix ms of the erase
);
CREATE INDEX data_keys_live ON data_keys (principal, purpose) WHERE erased_at IS NULL;

-- calls.erased_at: when the call's principal was forgotten. The row keeps
-- its key, tool, state and times, so a retry replays nothing and runs
-- nothing; its result and task arguments are gone.
ALTER TABLE calls ADD COLUMN erased_at INTEGER;
