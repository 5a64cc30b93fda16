-- data_keys: the data keys of envelope encryption; see the SQLite
-- migration 010_data_keys for what each column means.
CREATE TABLE data_keys (
    id         TEXT   PRIMARY KEY,
    principal  TEXT   NOT NULL,
    purpose    TEXT   NOT NULL CHECK (purpose IN ('seal', 'hash')),
    key_id     TEXT   NOT NULL,
    wrapped    BYTEA,
    created_at BIGINT NOT NULL,
    erased_at  BIGINT
);
CREATE INDEX data_keys_live ON data_keys (principal, purpose) WHERE erased_at IS NULL;

ALTER TABLE calls ADD COLUMN erased_at BIGINT;
