CREATE TABLE tickets (
    id       BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    title    TEXT   NOT NULL,
    customer TEXT   NOT NULL,
    status   TEXT   NOT NULL DEFAULT 'open'
);
