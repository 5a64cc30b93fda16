CREATE TABLE tickets (
    id       INTEGER PRIMARY KEY,
    title    TEXT    NOT NULL,
    customer TEXT    NOT NULL,
    status   TEXT    NOT NULL DEFAULT 'open'
);
