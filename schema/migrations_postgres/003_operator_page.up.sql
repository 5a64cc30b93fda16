-- The operator page's state that every replica must share: the key that
-- signs its session cookies and flash messages, and the sessions a logout
-- ended. See the SQLite migration 006_operator_page for why each is here.
CREATE TABLE operator_secret (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    secret     BYTEA   NOT NULL,
    created_at BIGINT  NOT NULL
);

CREATE TABLE operator_logouts (
    session_id TEXT   PRIMARY KEY,
    expires_at BIGINT NOT NULL
);
